"""The console-script entry both services share: parse, configure logging, listen, build, run.

Flags are generated from the settings model, so each one shows its environment twin and a
readable type in ``--help``. Any bad flag or variable, a serving certificate, key or client CA
that is missing, unreadable or not a pair, an unusable kubeconfig, a port already in use or an
address that cannot be bound ends the process with exit code 2 and one line that names the
setting and the reason: never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from common.certificates import CertificateFileError, check_certificate_files
from common.kube import KubeConfigError, local_client
from common.logs import configure_logging
from common.serving import Listeners, ServiceRunner
from common.settings import ServiceSettings
from common.version import build_info, version_line

S = TypeVar("S", bound=ServiceSettings)


class ConfigError(Exception):
    """A setting cannot be used; the message names it and says why (one line)."""


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _metavar(name: str, info: FieldInfo) -> str:
    """A field's own ``metavar`` (``json_schema_extra``), else one read off its name and type."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("metavar"), str):
        return str(extra["metavar"])
    kind = info.annotation
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if name.endswith("_seconds"):
        return "SECONDS"
    if name.endswith("_file") or name == "kubeconfig":
        return "FILE"
    if name.endswith("port"):
        return "PORT"
    if name.endswith("_bytes"):
        return "BYTES"
    if kind is bool:
        return "BOOL"
    if kind is int:
        return "INT"
    if kind is float:
        return "NUMBER"
    return "TEXT" if kind is str else "VALUE"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser(settings_type: type[ServiceSettings], prog: str, description: str = "") -> argparse.ArgumentParser:
    """One flag per setting, typed as text: the settings model does all conversion and checks."""
    parser = _Parser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="A flag wins over its environment variable, which wins over the default.",
    )
    parser.add_argument("--version", action="version", version=version_line(prog), help="print the version and exit")
    for name, info in settings_type.fields().items():
        default = "none" if info.default in (None, "") else info.default
        parser.add_argument(
            flag(name),
            dest=name,
            metavar=_metavar(name, info),
            default=None,
            help=f"{info.description} [env {settings_type.env_name(name)}; default {default}]",
        )
    return parser


def _problem(settings_type: type[ServiceSettings], error: Any) -> str:
    location = [str(part) for part in error["loc"]]
    message = str(error["msg"]).removeprefix("Value error, ")
    if not location:
        return message
    fields = settings_type.fields()
    name = next((n for n in fields if n == location[0] or settings_type.env_name(n) == location[0]), location[0])
    if name in fields:
        return f"{flag(name)} (env {settings_type.env_name(name)}): {message}"
    return f"{'.'.join(location)}: {message}"


def parse_settings(settings_type: type[S], argv: Sequence[str] | None, prog: str, description: str = "") -> S:
    """Flags (``None``: the process's own) over environment over defaults; :class:`ConfigError` when invalid."""
    parsed = build_parser(settings_type, prog, description).parse_args(list(argv) if argv is not None else sys.argv[1:])
    given = {name: value for name, value in vars(parsed).items() if value is not None}
    try:
        return settings_type(**given)
    except ValidationError as exc:
        raise ConfigError("; ".join(_problem(settings_type, e) for e in exc.errors())) from None


def check_certificates(settings: ServiceSettings) -> None:
    """The serving certificate, its key and the client CA can be read and go together, or a ConfigError names the
    flag."""
    try:
        check_certificate_files(settings.cert_file, settings.key_file, settings.client_ca_file)
    except CertificateFileError as exc:
        raise ConfigError(f"{flag(exc.field)} (env {settings.env_name(exc.field)}): {exc.reason}") from None


def listen(settings: ServiceSettings) -> Listeners:
    """Bind both ports now, so a clash or a bad address is a clean configuration error."""
    bound: list[socket.socket] = []
    try:
        for name, port in (("port", settings.port), ("metrics_port", settings.metrics_port)):
            try:
                bound.append(Listeners.bind(settings.host, port))
            except OSError as exc:
                raise ConfigError(
                    f"{flag(name)} (env {settings.env_name(name)}): cannot listen on "
                    f"{settings.host}:{port}: {exc.strerror or exc}"
                ) from None
    except ConfigError:
        for sock in bound:
            sock.close()
        raise
    return Listeners(*bound)


def run_service(
    settings_type: type[S],
    prog: str,
    build: Callable[[S], ServiceRunner],
    argv: Sequence[str] | None,
    description: str = "",
) -> None:
    try:
        settings = parse_settings(settings_type, argv, prog, description)
        configure_logging(settings.log_level)
        check_certificates(settings)
        listeners = listen(settings)
        try:
            local_client(settings.kubeconfig).close()  # usable, or the one line below and exit 2
            # The first log line: which SliMe this is (docs/operations.md, "Which version runs").
            logging.getLogger("slime").info("starting", extra={"service": prog, **build_info()})
            runner = build(settings)
        except KubeConfigError as exc:
            listeners.close()
            raise ConfigError(f"--kubeconfig (env KUBECONFIG): {exc}") from None
    except ConfigError as exc:
        print(f"{prog}: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    runner.run(listeners)
