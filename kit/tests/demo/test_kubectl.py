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
        for res, objects in kinds:
            full = f"{res.plural}.{res.group}" if res.group else res.plural
            names = [(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects]
            for form in (full, *res.short_names):
                scope = ["-A"] if res.namespaced else []
                table = kubectl(env, "get", form, *scope)
                wide = kubectl(env, "get", form, *scope, "-o", "wide")
                assert len(header(wide)) >= len(header(table))
                for _, name in names:  # events show their name only with -o wide, as kube-apiserver prints them
                    assert name in wide, f"kubectl get {form} -o wide does not list {name}:\n{wide}"
            listed = yaml.safe_load(kubectl(env, "get", full, *(["-A"] if res.namespaced else []), "-o", "yaml"))
            # The webhooks record Events as they go: kubectl may list some created after the first listing,
            # never one the emulator does not hold.
            after = {
                (o["metadata"].get("namespace", ""), o["metadata"]["name"])
                for o in env.emulator.list(objects[0]["apiVersion"], res.plural)
            }
            got = {(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in listed["items"]}
            assert set(names) <= got <= after, (sorted(set(names) - got), sorted(got - after))
            one_namespace, one_name = names[0]
            single = kubectl(
                env, "get", full, one_name, *(["-n", one_namespace] if one_namespace else []), "-o", "wide"
            )
            assert one_name in single
            checked[res.kind] = header(table)
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
