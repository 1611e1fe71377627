"""The benchmarks' emulated cluster and the reviews they send: one Slinky + CAPM3 world, a mapped and an unmapped
mirror."""

from __future__ import annotations

import json
from typing import Any

from testbed.framework import objects, reviews, world


def seed_world(emu: Any) -> dict[str, Any]:
    """Slinky + an opted-in Metal3 template and Metal3Data + a mirror mapped to a MachineDeployment."""
    world.seed_slinky(emu)
    world.seed_nodeport(emu, "slurm", "slurm")
    _, data = world.seed_metal3(emu, template_labels={"slurm-controller-namespace": "slurm"})
    world.ensure_namespace(emu, objects.SLIME_NAMESPACE)
    for name in ("mirror-a", "unmapped"):
        emu.create(objects.mirror(name))
    emu.create(objects.machine_deployment("md-a", "metal3", cluster="bm-cluster"))
    emu.create(
        objects.config_map(
            {"mappings": "- mirror: slime-system/mirror-a\n  machineDeployment: metal3/md-a\n  maxReplicas: 100\n"}
        )
    )
    return objects.metadata_secret(data)


def injection_request(secret: dict[str, Any]) -> dict[str, Any]:
    return {"uid": "bench-injection", **reviews.secret_request(secret)}


def scale_request(name: str, replicas: int) -> dict[str, Any]:
    return {"uid": f"bench-{name}", **reviews.scale_request(objects.SLIME_NAMESPACE, name, replicas)}


def review(request: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()
