"""Property: whatever body reaches either webhook, the answer is a well-formed AdmissionReview, never a 5xx.

Generated bodies (hypothesis, fixed seed, a few hundred each, in the normal suite): random JSON
of any shape and depth (huge integers, NaN, deep nesting, odd strings), envelopes that are almost
right, and reviews of the right shape whose fields hold any of that, including metaData text of
any kind. Each answer must be HTTP 200 with ``application/json``, an AdmissionReview whose
``response`` echoes the uid when the request had a usable one, and, when refused, a 4xx or 503 in
``response.status`` (503 only for an admission past its deadline): never 500. Transport-level
rejections are counted in ``slime_webhook_malformed_requests_total``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kubemu import Emulator
from testbed.components.serve import RunningService
from testbed.components.services import Scaling, start_injection
from testbed.framework.objects import config_map, machine_deployment, metadata_secret, mirror
from testbed.framework.pki import Pki
from testbed.framework.reviews import scale_request, secret_request
from testbed.framework.world import seed_metal3, seed_slinky

SETTINGS = settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck))

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
YAMLISH = st.sampled_from(
    ["a: b\n", "a: &x b\nc: *x\n", "- x\n", "a: {b: c}\n", "!!str x", "a: 'b\n", "", "~", "k: v\n" * 50, "\ufeffa: b\n"]
) | st.text(max_size=200)


def bodies(template: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Raw noise, JSON of any shape, and ``template`` (a real review) with fields replaced."""
    raw = st.binary(max_size=200)
    any_json = JSON.map(lambda value: json.dumps(value).encode())
    huge_number = st.integers(min_value=4301, max_value=6000).map(
        lambda digits: (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","x":'
            + b"7" * digits
            + b"}}"
        )
    )

    def mutated(field: str, value: Any) -> bytes:
        request = json.loads(json.dumps(template))
        request[field] = value
        return json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", **request}}
        ).encode()

    fields = st.sampled_from(sorted(template) + ["uid", "userInfo", "dryRun", "object", "oldObject"])
    field_noise = st.builds(mutated, fields, JSON)

    def with_metadata(text: str) -> bytes:
        request = json.loads(json.dumps(template))
        if "data" in (request.get("object") or {}):
            request["object"]["data"]["metaData"] = base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()
        return json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", **request}}
        ).encode()

    return raw | any_json | huge_number | field_noise | YAMLISH.map(with_metadata)


def check(service: RunningService, path: str, body: bytes) -> None:
    answer = service.post(path, body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    review = answer.json()
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    response = review["response"]
    assert isinstance(response["allowed"], bool) and isinstance(response["uid"], str)
    if not response["allowed"]:
        assert response["status"]["code"] in (400, 403, 404, 409, 413, 415, 422, 503), response


def test_the_injection_webhook_answers_every_body(emulator: Emulator, pki: Pki, tmp_path: Path) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels={"slurm-controller-namespace": "slurm"})
    service = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki)
    template = secret_request(metadata_secret(data))
    try:

        @SETTINGS
        @seed(20261125)
        @given(bodies(template))
        def answers(body: bytes) -> None:
            check(service, "/mutate", body)

        answers()
        malformed = httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
        assert 'slime_webhook_malformed_requests_total{code="400",webhook="injection"}' in malformed
    finally:
        service.stop()


def test_the_scaling_webhook_answers_every_body(emulator: Emulator, scaling_factory: Any) -> None:
    emulator.create(mirror("mirror-a", replicas=2, adopted_from="metal3/md-a"))
    emulator.create(machine_deployment("md-a", "metal3", replicas=2))
    emulator.create(
        config_map({"mappings": "- {mirror: slime/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 100}"})
    )
    scaling: Scaling = scaling_factory(emulator)
    template = scale_request("slime", "mirror-a", 3, old_replicas=2)

    @SETTINGS
    @seed(20261125)
    @given(bodies(template))
    def answers(body: bytes) -> None:
        check(scaling.running, "/validate", body)

    answers()
    assert emulator.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", "metal3", "md-a")["spec"]["replicas"] == 2
