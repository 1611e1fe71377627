"""The console-script entry both services share: parse, configure logging, build, run.

A bad flag or environment value, or a cluster config that cannot be loaded, ends the process
with one clear line and exit code 2, not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from kubernetes.config import ConfigException
from pydantic import ValidationError

from common.logs import configure_logging
from common.serving import ServiceRunner
from common.settings import ServiceSettings

S = TypeVar("S", bound=ServiceSettings)


def run_service(settings_type: type[S], prog: str, build: Callable[[S], ServiceRunner], argv: Sequence[str] | None) -> None:
    try:
        settings = settings_type.from_args(argv, prog)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())
        print(f"{prog}: invalid configuration: {problems}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(settings.log_level)
    try:
        runner = build(settings)
    except (ConfigException, OSError) as exc:
        print(f"{prog}: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    runner.run()
