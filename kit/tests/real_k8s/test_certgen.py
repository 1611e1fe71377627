"""GitOps on a real kube-apiserver: the chart rendered by `helm template` and applied again keeps its certificates.

What Argo CD does on every sync, played here: render with `helm template` (no cluster, no
lookup), run the pre-sync hooks (the certgen ServiceAccount and its RBAC, then the ``create``
Job), apply the manifest (``kubectl apply``: client-side as Argo CD does by default, then
server-side as Flux does), run the post-sync hook (the ``patch`` Job), delete the hook RBAC
(hook-succeeded). The Jobs' container runs as a process with the Job's own ServiceAccount token,
so the hook-scoped RBAC is what authorizes it. Three syncs: the serving certificates, the CA and
the caBundle stay byte for byte, and no apply ever takes the caBundle away (before the patch Job of
the next sync runs, it is still there).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.components.controlplane import ControlPlane
from testbed.framework.chart import NAMESPACE, YAML_LOADER, run_helm
from testbed.framework.helm import helm_binary
from testbed.framework.paths import CHART
from testbed.framework.world import ensure_namespace

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(600)]

VALUES = {"certManager": {"enabled": False}, "admissionAuth": {"enabled": True}}
CONFIGS = (
    ("mutatingwebhookconfigurations", "slime-injection-webhook"),
    ("validatingwebhookconfigurations", "slime-scaling-webhook"),
)
SECRETS = ("slime-injection-webhook-tls", "slime-scaling-webhook-tls", "slime-certgen-ca", "slime-apiserver-client")
CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}


def render(workdir: Path) -> str:
    args = ["template", "slime", str(CHART), "--namespace", NAMESPACE, "--skip-tests"]
    return run_helm(helm_binary(), args, workdir, VALUES)


def split(manifest: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[str]]]:
    """(hook RBAC objects, the rest of the manifest, the Jobs' args by step)."""
    hooks, rest, jobs = [], [], {}
    for obj in (d for d in yaml.load_all(manifest, Loader=YAML_LOADER) if d):
        if (obj["metadata"].get("annotations") or {}).get("helm.sh/hook"):
            if obj["kind"] == "Job":
                (container,) = obj["spec"]["template"]["spec"]["containers"]
                jobs[container["args"][0]] = [str(a) for a in container["args"]]
            else:
                hooks.append(obj)
        else:
            rest.append(obj)
    return hooks, rest, jobs


def apply(cp: ControlPlane, objects: list[dict[str, Any]], *flags: str) -> None:
    cp.kubectl("apply", *flags, "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def run_job(cp: ControlPlane, args: list[str], workdir: Path) -> None:
    """The Job's container, as its ServiceAccount: a TokenRequest token in a kubeconfig."""
    kubeconfig = cp.token_kubeconfig(workdir / "certgen.kubeconfig", NAMESPACE, "slime-certgen", seconds=600)
    proc = subprocess.run(
        [sys.executable, "-m", "lifecycle.certgen", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def state(cp: ControlPlane) -> dict[str, Any]:
    api = cp.api
    out: dict[str, Any] = {}
    for name in SECRETS:
        secret = api.get("v1", "Secret", NAMESPACE, name)
        assert secret is not None, name
        out[name] = secret["data"]
    for resource, name in CONFIGS:
        config = cp.api.request("GET", f"/apis/admissionregistration.k8s.io/v1/{resource}/{name}")
        out[name] = [h["clientConfig"].get("caBundle") for h in config["webhooks"]]
    return out


def sync(cp: ControlPlane, workdir: Path, apply_flags: tuple[str, ...], before_patch: list[dict[str, Any]]) -> None:
    hooks, rest, jobs = split(render(workdir))
    apply(cp, hooks)
    run_job(cp, jobs["create"], workdir)
    apply(cp, rest, *apply_flags)
    before_patch.append(state(cp))
    run_job(cp, jobs["patch"], workdir)
    for obj in hooks:  # hook-succeeded
        cp.kubectl("delete", obj["kind"], obj["metadata"]["name"], "-n", NAMESPACE, "--ignore-not-found")


def remove(cp: ControlPlane, workdir: Path) -> None:
    """Take back what the syncs made (the manifest, the hooks' objects, the Secrets the Jobs made): the session's
    control plane is shared, and the chart tests install the same release there."""
    hooks, rest, _ = split(render(workdir))
    objects = [*rest, *hooks, *({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": n}} for n in SECRETS)]
    for obj in objects:
        scope = ["-n", NAMESPACE] if obj["kind"] not in CLUSTER_KINDS else []
        cp.kubectl("delete", obj["kind"], obj["metadata"]["name"], *scope, "--ignore-not-found", "--wait=false")


def test_three_syncs_keep_every_certificate_and_the_ca_bundle(control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    ensure_namespace(cp.api, NAMESPACE)
    try:
        three_syncs(cp, tmp_path)
    finally:
        remove(cp, tmp_path)


def three_syncs(cp: ControlPlane, tmp_path: Path) -> None:
    assert render(tmp_path) == render(tmp_path)  # what a GitOps tool compares: nothing to sync
    before_patch: list[dict[str, Any]] = []
    sync(cp, tmp_path, (), before_patch)
    first = state(cp)
    for resource, name in CONFIGS:
        (bundle,) = first[name]
        secret = f"{name}-tls"
        assert bundle and base64.b64decode(bundle) == base64.b64decode(first[secret]["ca.crt"]), resource
    sync(cp, tmp_path, (), before_patch)  # Argo CD: client-side apply
    sync(cp, tmp_path, ("--server-side", "--force-conflicts"), before_patch)  # Flux: server-side apply
    assert state(cp) == first
    # The apply of the 2nd and 3rd syncs left the caBundle in place, before their patch Job ran.
    assert before_patch[1] == first and before_patch[2] == first
