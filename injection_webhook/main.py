"""``injection-webhook``: serve the mutating webhook that adds Slurm join data to Metal3 metadata."""

from __future__ import annotations

from collections.abc import Sequence

from common.cli import run_service
from injection_webhook.app import build
from injection_webhook.settings import InjectionSettings


def main(argv: Sequence[str] | None = None) -> None:
    run_service(
        InjectionSettings,
        "injection-webhook",
        build,
        argv,
        description="Serve the mutating admission webhook that adds Slurm join data to Metal3 metaData Secrets.",
    )


if __name__ == "__main__":
    main()
