"""Which SliMe each webhook's pods run: their ``/version`` (health port), read through the API server's pod proxy.

The pods answer what their process is (common/version.py: the package version, and the commit
the image was built from), not what the Deployment's image tag says: a tag rebuilt from another
checkout, or a rollout half done, shows. The proxy needs ``get`` on ``pods/proxy`` in the release
namespace (the chart's ``helm test`` ServiceAccount has it), and the API server must be able to
reach the pod's IP (it refuses loopback and link-local pod addresses); what could not be read is
said, never guessed.
"""

from __future__ import annotations

from common.kube import KubeClient, KubeError, ResourcePath
from common.version import version
from preflight.install import Component

PODS = ResourcePath("", "v1", "pods")


def running(kube: KubeClient, component: Component, timeout: float) -> tuple[str, bool]:
    """("running 0.2.0 (revision abc) on 2 pod(s)", consistent): what the component's Running pods answer, and
    False when they answer different builds."""
    if component.settings is None:
        return "", True
    selector = (component.deployment["spec"].get("selector") or {}).get("matchLabels") or {}
    query = [("labelSelector", ",".join(f"{k}={v}" for k, v in sorted(selector.items())))]
    pods = kube.request("GET", PODS.collection(component.namespace), query=query).get("items") or []
    names = sorted(p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running")
    if not names:
        return "version not read: no Running pod", True
    builds: dict[str, list[str]] = {}
    problems: list[str] = []
    for name in names:
        path = f"{PODS.item(component.namespace, name)}:{component.settings.metrics_port}/proxy/version"
        try:
            answer = kube.request("GET", path, timeout=timeout)
        except KubeError as exc:
            problems.append(f"{name}: {exc.message or exc.reason}"[:200])
            continue
        build = f"{answer.get('version', '?')} (revision {answer.get('revision', '?')})"
        builds.setdefault(build, []).append(name)
    parts = [f"{build} on {len(pods_)} pod(s)" for build, pods_ in sorted(builds.items())]
    text = "running " + "; ".join(parts) if parts else "version not read"
    if problems:
        text += f" (not read from {'; '.join(problems)})"
    mine = version()
    if builds and any(not build.startswith(f"{mine} ") for build in builds):
        text += f"; this slime-check is {mine}"
    return text, len(builds) <= 1
