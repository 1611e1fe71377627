"""What a real kube-apiserver sends the scaling webhook: the evidence for docs/scaling.md, "What reaches the webhook".

The chart's rendered ValidatingWebhookConfiguration is registered as rendered, except that it
calls a recording webhook on 127.0.0.1 (a ``url`` clientConfig) that allows everything and keeps
each AdmissionReview. Beside it, a probe configuration with the same rules and an
``objectSelector`` on the chart's mirror label, the mechanism issue 30 first asked for. Then the
mirrors (as the chart renders them), a Deployment beside them and one that carries the mirror
label without being a mirror are scaled (``kubectl scale``: the ``/scale`` subresource) and
patched (``kubectl patch``: an UPDATE of the Deployment itself).

Found on kube-apiserver v1.36.4: the objectSelector matches the Deployment UPDATE of a labelled
Deployment, and never a ``/scale`` of it (the admitted object is an ``autoscaling/v1`` Scale with no
labels, kubernetes/kubernetes#113594); the chart's configuration gets every ``/scale`` and every
UPDATE of the mapped mirrors and nothing else, and with no mapping nothing at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.components.controlplane import ControlPlane
from testbed.framework.chart import NAMESPACE, YAML_LOADER, by_kind, mapping, run_helm
from testbed.framework.helm import helm_binary
from testbed.framework.httpserve import Answer, LoopbackServer, Request
from testbed.framework.paths import CHART
from testbed.framework.pki import Pki, make_pki
from testbed.framework.wait import wait_for
from testbed.framework.world import ensure_namespace

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(300)]

MIRRORS = [(NAMESPACE, "mirror-a"), ("mirrors", "mirror-b")]
OTHER = (NAMESPACE, "some-app")  # an ordinary Deployment beside a mirror
LOOKALIKE = (NAMESPACE, "labelled-app")  # carries the chart's mirror labels, is no mirror
VALUES = {
    "scaling": {
        "mappings": [
            mapping(f"{NAMESPACE}/mirror-a", "metal3/md-a", "a", maxReplicas=4),
            mapping("mirrors/mirror-b", "metal3/md-b", "b", maxReplicas=4),
        ]
    }
}


class Recorder:
    """An HTTPS admission webhook on 127.0.0.1 that allows every review and keeps (path, request)."""

    def __init__(self, pki: Pki) -> None:
        self.ca = pki.ca_file.read_bytes()
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.http = LoopbackServer(self._respond, name="recorder", tls=pki.server_context())
        self.url = self.http.url

    def _respond(self, request: Request) -> Answer:
        review = json.loads(request.body)
        # kube-apiserver appends ?timeout=<timeoutSeconds>s to the configured URL.
        self.seen.append((request.path.split("?")[0], review["request"]))
        response = {"uid": review["request"]["uid"], "allowed": True}
        return 200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def calls(self, path: str) -> set[tuple[str, str, str]]:
        """(namespace, name, subResource) of every review sent to ``path``."""
        return {(r["namespace"], r["name"], r.get("subResource", "")) for p, r in list(self.seen) if p == path}

    def stop(self) -> None:
        self.http.stop()


def render(values: dict[str, Any] | None, workdir: Path) -> list[dict[str, Any]]:
    args = ["template", "slime", str(CHART), "--namespace", NAMESPACE, "--set", "certManager.enabled=false"]
    out = run_helm(helm_binary(), args, workdir, values)
    return [d for d in yaml.load_all(out, Loader=YAML_LOADER) if d]


def registered(config: dict[str, Any], name: str, url: str, ca: bytes) -> dict[str, Any]:
    """The rendered configuration under another name, calling ``url`` with ``ca``: rules, selectors and conditions
    as rendered."""
    import base64

    hooks = []
    for hook in config["webhooks"]:
        hooks.append({**hook, "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()}})
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    }


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorder]:
    server = Recorder(make_pki(tmp_path_factory.mktemp("recorder-pki")))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, recorder: Recorder, tmp_path_factory: pytest.TempPathFactory) -> ControlPlane:
    workdir = tmp_path_factory.mktemp("match")
    api = control_plane.api
    for namespace in (NAMESPACE, "mirrors", "metal3"):
        ensure_namespace(api, namespace)
    ca = recorder.ca
    mapped = render(VALUES, workdir)
    (chart_config,) = by_kind(mapped, "ValidatingWebhookConfiguration")
    (empty_config,) = by_kind(render(None, workdir), "ValidatingWebhookConfiguration")
    probe = registered(chart_config, "objectselector-probe", f"{recorder.url}/probe", ca)
    for hook in probe["webhooks"]:
        del hook["matchConditions"], hook["namespaceSelector"]
        hook["objectSelector"] = {"matchExpressions": [{"key": "slime/mirror", "operator": "Exists"}]}
    for config in (
        registered(chart_config, "chart-mapped", f"{recorder.url}/mapped", ca),
        registered(empty_config, "chart-no-mapping", f"{recorder.url}/empty", ca),
        probe,
    ):
        control_plane.kubectl("create", "-f", "-", stdin=json.dumps(config))
    # The mirrors as the chart renders them (labels slime/mirror, ...), an ordinary Deployment, and a
    # lookalike: a Deployment with a mirror's labels under another name.
    mirrors = [d for d in by_kind(mapped, "Deployment") if d["metadata"]["labels"].get("slime/mirror")]
    assert len(mirrors) == 2
    lookalike = json.loads(json.dumps(mirrors[0]))
    lookalike["metadata"]["name"] = LOOKALIKE[1]
    other = json.loads(json.dumps(mirrors[0]))
    other["metadata"] = {"name": OTHER[1], "namespace": OTHER[0]}
    for deployment in (*mirrors, lookalike, other):
        control_plane.kubectl("create", "-f", "-", stdin=json.dumps(deployment))

    # The API server picks webhook configurations up from a watch: patch a mirror until both are called.
    def both_called() -> bool:
        patch_replicas(control_plane, MIRRORS[0], 1)
        return all((*MIRRORS[0], "") in recorder.calls(path) for path in ("/mapped", "/probe"))

    wait_for(both_called, timeout=30, what="the API server to call the registered webhooks", interval=0.5)
    recorder.seen.clear()
    return control_plane


def scale(cp: ControlPlane, target: tuple[str, str], replicas: int) -> None:
    cp.kubectl("-n", target[0], "scale", "deployment", target[1], f"--replicas={replicas}")


def patch_replicas(cp: ControlPlane, target: tuple[str, str], replicas: int) -> None:
    cp.kubectl("-n", target[0], "patch", "deployment", target[1], "-p", json.dumps({"spec": {"replicas": replicas}}))


def test_the_chart_sends_every_scale_and_update_of_a_mirror_and_nothing_else(
    cluster: ControlPlane, recorder: Recorder
) -> None:
    for replicas, target in enumerate((*MIRRORS, OTHER, LOOKALIKE), start=2):
        scale(cluster, target, replicas)
        patch_replicas(cluster, target, replicas + 1)
    mapped = recorder.calls("/mapped")
    for namespace, name in MIRRORS:
        assert (namespace, name, "scale") in mapped, mapped  # kubectl scale
        assert (namespace, name, "") in mapped, mapped  # kubectl patch deployment: the side door
    # Nothing else: no other Deployment, no /status (the controllers' writes may add mirror UPDATEs).
    assert {(ns, name) for ns, name, _ in mapped} <= set(MIRRORS), mapped
    assert {sub for _, _, sub in mapped} <= {"scale", ""}, mapped


def test_a_label_object_selector_never_matches_a_scale(cluster: ControlPlane, recorder: Recorder) -> None:
    """The objectSelector sees the Deployment's labels on its UPDATE, but a /scale carries a label-less Scale."""
    for replicas, target in enumerate((*MIRRORS, LOOKALIKE), start=5):
        scale(cluster, target, replicas)
        patch_replicas(cluster, target, replicas + 1)
    probe = recorder.calls("/probe")
    for namespace, name in (*MIRRORS, LOOKALIKE):
        assert (namespace, name, "") in probe, probe  # the labelled Deployment's UPDATE matches
    assert not [call for call in probe if call[2] == "scale"], probe  # no /scale, ever
    scale_reviews = [r for p, r in recorder.seen if p == "/mapped" and r.get("subResource") == "scale"]
    assert scale_reviews and all(
        r["object"]["kind"] == "Scale" and not r["object"]["metadata"].get("labels") for r in scale_reviews
    )


def test_with_no_mapping_nothing_is_sent(cluster: ControlPlane, recorder: Recorder) -> None:
    for replicas, target in enumerate((*MIRRORS, OTHER, LOOKALIKE), start=2):
        scale(cluster, target, replicas)
        patch_replicas(cluster, target, replicas)
    assert recorder.calls("/mapped")  # the same writes did reach the mapped configuration
    assert recorder.calls("/empty") == set()
