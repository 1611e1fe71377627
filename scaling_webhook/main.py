"""``scaling-webhook``: serve the validating webhook that scales MachineDeployments from mirrors."""

from __future__ import annotations

from collections.abc import Sequence

from common.cli import run_service
from scaling_webhook.app import build
from scaling_webhook.settings import ScalingSettings


def main(argv: Sequence[str] | None = None) -> None:
    run_service(
        ScalingSettings,
        "scaling-webhook",
        build,
        argv,
        description=(
            "Serve the validating admission webhook that scales Cluster API MachineDeployments from mirror Deployments."
        ),
    )


if __name__ == "__main__":
    main()
