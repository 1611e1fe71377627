"""The real-Kubernetes kit the tiers and ``slime-demo --real`` share: what to build once, a control plane, the
chart's pods.

- :func:`prepare` builds or fetches, once per process, what a real tier needs: the control plane
  binaries (``stack/kube``), the upstream CRDs, ``helm``, and (for the ``pod`` runner) the image
  built from the ``Dockerfile``. A missing prerequisite is kept as :attr:`Prepared.missing` (the
  tests skip on it locally and fail under ``CI=true``), anything that ran and failed as
  :attr:`Prepared.error`.
- :func:`start_control_plane`: etcd, kube-apiserver and kube-controller-manager with the CRDs.
- :class:`Stack`: the chart installed with ``helm`` on that API server, its webhooks run as the
  chart's pods (``SLIME_REAL_RUNNER=pod``, the default) or as local processes (``process``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.errors import ComponentUnavailable
from testbed.helm import helm_binary
from testbed.real.build import ControlPlaneBinaries, control_plane_binaries, crd_files
from testbed.real.controlplane import ControlPlane, ControlPlaneError
from testbed.real.image import build_image
from testbed.real.objects import RealApi
from testbed.real.pods import Completed, Pod, run_pod, run_process, run_process_to_completion, run_to_completion
from testbed.real.release import Release
from testbed.world import SlurmCluster, seed_capm3_identity, seed_nodeport, seed_slinky

Progress = Callable[[str], None]
RUNNER = os.environ.get("SLIME_REAL_RUNNER", "pod")  # "pod": the image with podman (CI); "process": local processes


@dataclass
class Prepared:
    binaries: ControlPlaneBinaries | None = None
    crds: list[Path] = field(default_factory=list)
    image: str = ""
    missing: str = ""  # a prerequisite is missing (skip locally, fail in CI)
    error: str = ""  # something ran and failed
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.binaries is not None or bool(self.missing or self.error)


PREPARED = Prepared()


def prepare(progress: Progress) -> Prepared:
    """Build or fetch what a real tier needs (once per process); never raises, the outcome is in the result."""
    if PREPARED.done:
        return PREPARED
    started = time.monotonic()
    try:
        PREPARED.binaries = control_plane_binaries(progress)
        PREPARED.crds = crd_files(progress)
        helm_binary()
        if RUNNER == "pod":
            PREPARED.image = build_image(progress)
    except ComponentUnavailable as exc:
        PREPARED.missing = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported by every user of the tier
        PREPARED.error = f"{type(exc).__name__}: {exc}"
    PREPARED.seconds = time.monotonic() - started
    state = PREPARED.missing or PREPARED.error or "ready"
    progress(
        f"prerequisites {state} after {PREPARED.seconds:.0f} s "
        f"({PREPARED.binaries.source if PREPARED.binaries else 'no control plane'}; runner {RUNNER})"
    )
    return PREPARED


def start_control_plane(
    workdir: Path, admission_config: Path | None = None, audit_scale_steps: bool = False
) -> ControlPlane:
    """A control plane with the upstream CRDs (after :func:`prepare` succeeded)."""
    assert PREPARED.binaries is not None, "prepare() has not succeeded"
    cp = ControlPlane(
        workdir, PREPARED.binaries, admission_config=admission_config, audit_scale_steps=audit_scale_steps
    )
    try:
        cp.start()
        cp.install_crds(PREPARED.crds)
    except Exception:
        cp.stop()
        raise
    return cp


@dataclass
class Stack:
    """The chart installed on a real API server, its webhooks running as pods (or processes), the world seeded."""

    cp: ControlPlane
    release: Release
    api: RealApi
    slurm: SlurmCluster
    workdir: Path
    pods: dict[str, Pod] = field(default_factory=dict)
    contexts: dict[bool, Any] = field(default_factory=dict)  # TLS contexts, read once: the API server may be down later

    @property
    def namespace(self) -> str:
        return self.release.namespace

    def start_webhook(self, component: str, **options: Any) -> Pod:
        deployment = self.release.deployment(component)
        if RUNNER == "pod":
            pod = run_pod(self.cp, deployment, PREPARED.image, self.workdir / "pods", **options)
        else:
            pod = run_process(self.cp, deployment, self.workdir / "pods", **options)
        self.pods[component] = pod
        return pod

    def run_hook(self, pod: dict[str, Any]) -> Completed:
        """A Helm hook Pod (``helm test``) run to its end, its status reported as the kubelet would."""
        if RUNNER == "pod":
            return run_to_completion(self.cp, pod, PREPARED.image, self.workdir / "hooks")
        return run_process_to_completion(self.cp, pod, self.workdir / "hooks")

    def stop_webhooks(self) -> None:
        for pod in self.pods.values():
            pod.stop()
        self.pods.clear()

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait for ``condition``; a timeout shows the end of each webhook's log (they never hold a key)."""
        try:
            self.cp.wait_for(condition, timeout, what)
        except ControlPlaneError as exc:
            tails = "\n".join(
                f"--- {name} ---\n" + "\n".join(pod.logs().splitlines()[-12:]) for name, pod in self.pods.items()
            )
            raise ControlPlaneError(f"{exc}\n{tails}") from None


def seed_management_cluster(api: RealApi, host_ip: str = "192.0.2.10", node_port: int = 30817) -> SlurmCluster:
    """Slinky (Controller, slurmctld StatefulSet and pod with a hostIP, the key Secrets), a NodePort for slurmctld, and
    CAPM3's ServiceAccount with the Secret rights its role grants."""
    slurm = seed_slinky(api, host_ip=host_ip)
    seed_nodeport(api, slurm.namespace, slurm.controller, node_port=node_port)
    seed_capm3_identity(api)  # the tiers create metaData Secrets as CAPM3's ServiceAccount, as CAPM3 does
    return slurm
