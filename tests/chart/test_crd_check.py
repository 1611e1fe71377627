"""crdCheck honest about what it saw: it runs on a first `helm install --create-namespace`, and says when it could not.

Helm renders before it creates the release namespace, so the chart no longer decides "live" from
a lookup there (operator review 2026-11-26, doc error 14) but from the `kube-system` Namespace.
Helm talks to kubemu here (`helm install --dry-run=server`: lookups answered, nothing stored),
whose discovery serves cert-manager's group and not KEDA's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kubemu import Emulator
from testbed.framework.chart import NAMESPACE, RELEASE
from testbed.framework.paths import CHART
from tests.chart.test_admission_auth import _emulator_with_chart_kinds


def install(
    helm: Path, emulator: Emulator, tmp_path: Path, dry_run: str, *sets: str
) -> subprocess.CompletedProcess[str]:
    args = [str(helm), "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace"]
    args += [f"--dry-run={dry_run}", "--disable-openapi-validation"]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "KUBECONFIG": emulator.write_kubeconfig(tmp_path / "kubeconfig"), "HOME": str(tmp_path)}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)


KEDA = ("keda.enabled=true", "scaling.mappings[0].mirror.name=m", f"scaling.mappings[0].mirror.namespace={NAMESPACE}")
KEDA += ("scaling.mappings[0].machineDeployment.name=d", "scaling.mappings[0].machineDeployment.namespace=metal3")
KEDA += ("scaling.mappings[0].partition=batch",)


def test_a_first_install_with_create_namespace_is_checked(helm: Path, tmp_path: Path) -> None:
    emulator = _emulator_with_chart_kinds()
    try:
        assert emulator.get("v1", "Namespace", "", NAMESPACE) is None  # --create-namespace: not there yet
        proc = install(helm, emulator, tmp_path, "server", *KEDA)
        assert proc.returncode != 0
        assert (
            "keda.enabled=true needs KEDA (keda.sh/v1alpha1 ScaledObject) but the cluster does not serve it"
            in proc.stderr
        )
        # cert-manager is served there: the default install passes the check, and says nothing about it.
        ok = install(helm, emulator, tmp_path, "server")
        assert ok.returncode == 0, ok.stderr
        assert "crdCheck: NOT DONE" not in ok.stdout
    finally:
        emulator.stop()


def test_without_a_cluster_the_notes_say_the_check_was_not_done(helm: Path, tmp_path: Path) -> None:
    emulator = _emulator_with_chart_kinds()
    try:
        proc = install(helm, emulator, tmp_path, "client", *KEDA)  # --dry-run=client: no lookup
        assert proc.returncode == 0, proc.stderr
        notes = proc.stdout.split("NOTES:", 1)[1]
        assert "crdCheck: NOT DONE" in notes
        assert "cert-manager.io/v1 keda.sh/v1alpha1 was not checked" in " ".join(notes.split())
    finally:
        emulator.stop()
