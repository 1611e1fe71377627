"""``slime-demo --keep-running`` tells people to explore kubemu with kubectl: the real kubectl works there.

The demo runs its story; then, with everything still up, the real ``kubectl`` (``$KUBECTL``, else
``kubectl`` on PATH) reads the emulated cluster through the demo's kubeconfig: every kind the
demo created, by full name and by short name, namespaces, and ``all``, each in the default
table, ``-o wide`` and ``-o yaml``. The tables are kube-apiserver's (its built-in printers, the
CRDs' printer columns), so ``kubectl get deploy`` shows READY and UP-TO-DATE, ``get md`` the
replicas of a MachineDeployment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from demo.environment import DemoEnvironment
from demo.main import main

KUBECTL = os.environ.get("KUBECTL") or shutil.which("kubectl")


def kubectl(env: DemoEnvironment, *args: str) -> str:
    assert KUBECTL is not None
    proc = subprocess.run(
        [KUBECTL, "--kubeconfig", str(env.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(env.workdir)},
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    assert "error" not in proc.stderr.lower(), proc.stderr
    return proc.stdout


def header(output: str) -> list[str]:
    return output.splitlines()[0].split("  ") if output else []


def sections(output: str, kinds: int) -> list[str]:
    """kubectl's tables of several kinds, in the order the kinds were asked for."""
    tables = output.strip().split("\n\n")
    assert len(tables) == kinds, f"{kinds} kinds asked, {len(tables)} tables printed:\n{output}"
    return tables


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (set KUBECTL to its path)")
def test_kubectl_reads_everything_the_demo_creates(audited: Callable[[DemoEnvironment], None]) -> None:
    checked: dict[str, Any] = {}

    def explore(env: DemoEnvironment) -> None:
        assert env.emulator is not None
        kinds = []
        for res in env.emulator.registry.resources:
            for version in res.versions:
                objects = env.emulator.list(res.api_version(version), res.plural)
                if objects:
                    kinds.append((res, objects))
                    break
        assert {res.kind for res, _ in kinds} >= {
            "Namespace",
            "Pod",
            "Service",
            "Secret",
            "ConfigMap",
            "Deployment",
            "StatefulSet",
            "MachineDeployment",
            "Metal3Data",
            "Metal3DataTemplate",
            "Controller",
        }
        # One kubectl call per question, every kind in it (kubectl prints one table per kind, a blank line
        # between them, each row's name prefixed with its kind): ninety calls took ~15 s of CPU.
        fulls = [f"{res.plural}.{res.group}" if res.group else res.plural for res, _ in kinds]
        tables = sections(kubectl(env, "get", ",".join(fulls), "-A"), len(kinds))
        wides = sections(kubectl(env, "get", ",".join(fulls), "-A", "-o", "wide"), len(kinds))
        listed = yaml.safe_load(kubectl(env, "get", ",".join(fulls), "-A", "-o", "yaml"))["items"]
        shorts = [short for res, _ in kinds for short in res.short_names]
        by_short = set(kubectl(env, "get", ",".join(shorts), "-A", "-o", "name").split())
        expected_by_short: set[str] = set()
        served_shorts = {  # kubectl's own reading of discovery: kind and group -> its short names
            (row.split()[-1], row.split()[-3].rpartition("/")[0]): set(row.split()[1].split(","))
            for row in kubectl(env, "api-resources", "--no-headers").splitlines()
            if len(row.split()) == 5
        }
        singles: dict[str, list[str]] = {}  # namespace ("" cluster-wide) -> kind/name of one object per kind
        for res, objects in kinds:
            prefix = f"{res.kind.lower()}.{res.group}" if res.group else res.kind.lower()
            names = [(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects]
            table, wide = tables.pop(0), wides.pop(0)
            assert len(header(wide)) >= len(header(table))
            for _, name in names:  # events show their name only with -o wide, as kube-apiserver prints them
                assert f"{prefix}/{name}" in wide, f"kubectl get {prefix} -o wide does not list {name}:\n{wide}"
            # The webhooks record Events as they go: kubectl may list some created after the first listing,
            # never one the emulator does not hold.
            after = {
                (o["metadata"].get("namespace", ""), o["metadata"]["name"])
                for o in env.emulator.list(objects[0]["apiVersion"], res.plural)
            }
            got = {
                (i["metadata"].get("namespace", ""), i["metadata"]["name"])
                for i in listed
                if i["kind"] == res.kind and i["apiVersion"].rpartition("/")[0] == res.group  # any version
            }
            assert set(names) <= got <= after, (sorted(set(names) - got), sorted(got - after))
            if res.short_names:
                assert served_shorts.get((res.kind, res.group)) == set(res.short_names), res.kind
                expected_by_short.update(f"{prefix}/{name}" for _, name in names)
            one_namespace, one_name = names[0]
            singles.setdefault(one_namespace, []).append(f"{prefix}/{one_name}")
            checked[res.kind] = header(table)
        # The short names list what the full names list (kubectl lists a kind once however many of its names
        # are asked; Events recorded meanwhile may add to it).
        missing = expected_by_short - by_short
        assert not missing, f"short names that list less than their kinds: {sorted(missing)}"
        for namespace, wanted in singles.items():
            single = kubectl(env, "get", *wanted, *(["-n", namespace] if namespace else []), "-o", "wide")
            assert all(name.split("/", 1)[1] in single for name in wanted), single
        everything = kubectl(env, "get", "all", "-A")
        for kind in ("pod/", "service/", "deployment.apps/", "statefulset.apps/"):
            assert kind in everything, everything
        checked["all"] = everything
        checked["wide"] = kubectl(env, "get", "pods", "-A", "-o", "wide")

    assert main([], out=lambda line: None, inspect=explore, on_start=audited) == 0
    assert checked["Namespace"][:3] == ["NAME", "STATUS", "AGE"] or "STATUS" in " ".join(checked["Namespace"])
    assert [c.strip() for c in checked["Deployment"] if c.strip()][:5] == [
        "NAMESPACE",
        "NAME",
        "READY",
        "UP-TO-DATE",
        "AVAILABLE",
    ]
    assert "DESIRED" in " ".join(checked["MachineDeployment"]) and "CLUSTER" in " ".join(checked["MachineDeployment"])
    assert "NODE" in checked["wide"].splitlines()[0] and "IP" in checked["wide"].splitlines()[0]
