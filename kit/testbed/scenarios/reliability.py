"""What the reliability tests share: seeded clusters, in-process services, figures, timing."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kubemu import Emulator
from testbed.components.serve import RunningService, stop_all
from testbed.components.services import Scaling, start_injection, start_scaling
from testbed.framework import world
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import SLIME_NAMESPACE, config_map, machine_deployment, mirror
from testbed.framework.pki import Pki
from testbed.framework.world import SlurmCluster, seed_metal3, seed_nodeport, seed_slinky
from testbed.scenarios import summary

OPT_IN = {"slurm-controller-namespace": "slurm"}
# Figures of the run (counts, latencies, pickup times): printed at the end and written to $SLIME_RELIABILITY_FIGURES
# (testbed.scenarios.summary, from every xdist worker), quoted by docs/reliability.md.
FIGURES: dict[str, Any] = summary.figures("reliability figures", env="SLIME_RELIABILITY_FIGURES")


# --- seeding ------------------------------------------------------------------------------------


def seed_injection_cluster(emu: Emulator, nodeport: bool = True) -> tuple[SlurmCluster, dict[str, Any]]:
    """A Slinky controller in ``slurm`` and an opted-in Metal3 template with one Metal3Data."""
    slurm = seed_slinky(emu)
    if nodeport:
        seed_nodeport(emu, "slurm", "slurm")
    _, data = seed_metal3(emu, template_labels=OPT_IN)
    return slurm, data


def seed_scaling_cluster(emu: Emulator) -> Emulator:
    """``slime-system/mirror-a`` -> ``metal3/md-a`` (2 replicas each, the mirror already adopted), list form."""
    emu.create(mirror("mirror-a", replicas=2, adopted_from="metal3/md-a"))
    emu.create(machine_deployment("md-a", "metal3", replicas=2))
    emu.create(
        config_map(
            {"mappings": "- mirror: slime-system/mirror-a\n  machineDeployment: metal3/md-a\n  maxReplicas: 100\n"}
        )
    )
    return emu


def md_replicas(emu: Emulator, name: str = "md-a", namespace: str = "metal3") -> int | None:
    return world.md_replicas(emu, namespace, name)


def mirror_replicas(emu: Emulator, name: str = "mirror-a") -> int | None:
    obj = emu.get("apps/v1", "Deployment", SLIME_NAMESPACE, name)
    return None if obj is None else obj["spec"].get("replicas")


# --- services -----------------------------------------------------------------------------------


@dataclass
class Services:
    """Starts webhooks in this process; at teardown keeps their metrics pages as evidence, then stops them."""

    pki: Pki
    tmp_path: Path
    running: list[RunningService] = field(default_factory=list)

    def _kubeconfig(self, emu: Emulator) -> str:
        return emu.write_kubeconfig(self.tmp_path / f"kubeconfig-{emu.port}-{len(self.running)}")

    def injection(self, emu: Emulator, ready: bool = True, **overrides: Any) -> RunningService:
        service = start_injection(self._kubeconfig(emu), self.pki, ready=ready, **overrides)
        self.running.append(service)
        return service

    def scaling(self, emu: Emulator, **overrides: Any) -> Scaling:
        values: dict[str, Any] = {"namespace": SLIME_NAMESPACE, "resync_seconds": 3600, "patch_timeout_seconds": 1.0}
        values.update(overrides)
        scaling = start_scaling(self._kubeconfig(emu), self.pki, emulator=emu, **values)
        self.running.append(scaling.running)
        return scaling

    def close(self) -> None:
        for service in self.running:
            try:
                EVIDENCE.add_text(
                    f"metrics :{service.metrics_port}", httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
                )
            except httpx.HTTPError:
                pass
        stop_all(self.running)


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    value = call()
    return value, time.monotonic() - started
