"""The chart as the tests install and render it: its release name and namespace, value combinations, and helpers
shared by the chart tests (their fixtures are in ``tests/chart/conftest.py``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testbed.framework.errors import ComponentFailed
from testbed.framework.objects import SLIME_NAMESPACE

RELEASE = "slime"  # the Helm release name of every install and render
NAMESPACE = SLIME_NAMESPACE
CRD_APIS = ("cert-manager.io/v1", "keda.sh/v1alpha1")


# ---- helpers shared by the test modules ----


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def mapping(mirror: str, md: str, partition: str | None = None, **extra: Any) -> dict[str, Any]:
    """mapping("slime-system/mirror-a", "metal3/md-a", "a") -> a scaling.mappings item."""
    mns, mname = mirror.split("/")
    dns, dname = md.split("/")
    item: dict[str, Any] = {
        "mirror": {"name": mname, "namespace": mns},
        "machineDeployment": {"name": dname, "namespace": dns},
    }
    if partition:
        item["partition"] = partition
    item.update(extra)
    return item


TWO_MAPPINGS = {
    "scaling": {
        "mappings": [
            mapping(f"{NAMESPACE}/mirror-a", "metal3/md-a", "partition-a", maxReplicas=10),
            mapping("mirrors/mirror-b", "metal3-b/md-b", "partition-b", keda={"maxReplicaCount": 4}, maxReplicas=4),
        ]
    },
}

# Value combinations every structural test runs against.
COMBOS: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "no-cert-manager": {"certManager": {"enabled": False}},
    "keda": {"keda": {"enabled": True}, **TWO_MAPPINGS},
    "only-injection": {"scaling": {"enabled": False}},
    "only-scaling": {"injection": {"enabled": False}, **TWO_MAPPINGS},
    "several-mappings": {
        "scaling": {
            "mappings": [
                mapping(f"{NAMESPACE}/mirror-{i}", f"metal3-{i % 2}/md-{i}", f"p{i}", maxReplicas=8) for i in range(4)
            ]
        }
    },
    "slurm-bindings": {
        "injection": {
            "slurmBindings": ["metal3=slurm", "metal3=workload:slurm-b", "*=slurm-site"],
            "metal3Namespaces": ["metal3"],
            "slurmKeySecretNames": ["slurm-auth-slurm"],
            "jwtKeySecretNames": ["slurm-auth-jwths256"],
            "templateOptIns": ["controller-name"],
            "confServer": {"policy": "service", "nodeAddresses": ["192.0.2.21"]},
            "extraJoinData": ["controller-name", "jwt-key"],
        }
    },
    "everything-off-cm": {"certManager": {"enabled": False}, "keda": {"enabled": True}, **TWO_MAPPINGS},
    "admission-auth": {"admissionAuth": {"enabled": True}},
    "admission-auth-helm": {
        "admissionAuth": {"enabled": True},
        "certManager": {"enabled": False},
        "selfSignedTLS": {"generator": "helm"},
        **TWO_MAPPINGS,
    },
    "admission-auth-certgen": {"admissionAuth": {"enabled": True}, "certManager": {"enabled": False}, **TWO_MAPPINGS},
    "admission-auth-own-ca": {
        "admissionAuth": {"enabled": True, "clientCA": {"source": "configMap", "name": "kube-apiserver-ca"}}
    },
    "network-policy": {
        "networkPolicy": {
            "enabled": True,
            "admissionFrom": [{"ipBlock": {"cidr": "192.0.2.0/28"}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        }
    },
}


YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, when PyYAML has it


class HelmError(ComponentFailed):
    """helm exited non-zero; ``stderr`` and ``stdout`` say why."""

    def __init__(self, cmd: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        self.stderr = proc.stderr
        self.stdout = proc.stdout


def run_helm(helm: Path, args: list[str], tmp_dir: Path, values: dict[str, Any] | None) -> str:
    cmd = [str(helm), *args]
    if values is not None:
        # JSON is YAML without ambiguity (Helm's YAML 1.1 reads a bare `n` or `on` as a bool).
        text = json.dumps(values, sort_keys=True)
        vf = tmp_dir / f"values-{abs(hash(text))}.json"
        vf.write_text(text)
        cmd += ["-f", str(vf)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise HelmError(cmd, proc)
    return proc.stdout
