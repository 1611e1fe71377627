"""The demo's admission chain: webhook selection and call semantics, as kube-apiserver has them."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from demo.admission_chain import AdmissionChain, label_selector_matches, point_to_local, resource_matches, rule_matches
from kubemu.admission import AdmissionAttributes, AdmissionDenied
from testbed.framework.httpserve import Answer, LoopbackServer, Request
from testbed.framework.pki import Pki, make_pki

SCALE_KIND = {"group": "autoscaling", "version": "v1", "kind": "Scale"}


def attrs(
    resource: str = "deployments",
    subresource: str = "scale",
    operation: str = "UPDATE",
    group: str = "apps",
    namespace: str = "slime",
    name: str = "mirror",
    obj: dict | None = None,
    kind: dict | None = None,
    dry_run: bool = False,
) -> AdmissionAttributes:
    if obj is None:
        obj = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 3},
        }
    return AdmissionAttributes(
        operation=operation,
        group=group,
        version="v1",
        resource=resource,
        subresource=subresource,
        kind=kind or SCALE_KIND,
        namespace=namespace,
        name=name,
        object=obj,
        old_object=None,
        dry_run=dry_run,
    )


def secret_attrs(namespace: str = "metal3", owned: bool = True) -> AdmissionAttributes:
    meta: dict[str, Any] = {"name": "m-metadata", "namespace": namespace}
    if owned:
        meta["ownerReferences"] = [
            {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Data", "name": "d", "uid": "u"}
        ]
    obj = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"metaData": "e30K"}}
    return attrs(
        "secrets", "", "CREATE", "", namespace, "m-metadata", obj, {"group": "", "version": "v1", "kind": "Secret"}
    )


def webhook(
    name: str,
    rules: list[dict],
    failure_policy: str = "Fail",
    url: str = "https://127.0.0.1:1/x",
    ca: bytes = b"",
    **extra: Any,
) -> dict[str, Any]:
    client: dict[str, Any] = {"url": url}
    if ca:
        client["caBundle"] = base64.b64encode(ca).decode()
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": 2,
        "clientConfig": client,
        "rules": rules,
        **extra,
    }


def configuration(kind: str, *hooks: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": f"cfg-{kind}"},
        "webhooks": list(hooks),
    }


SCALE_RULE = {
    "apiGroups": ["apps"],
    "apiVersions": ["v1"],
    "resources": ["deployments/scale"],
    "operations": ["UPDATE"],
    "scope": "Namespaced",
}
SECRET_RULE = {
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["secrets"],
    "operations": ["CREATE", "UPDATE"],
    "scope": "Namespaced",
}


# --- selection ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule_resources", "resource", "subresource", "expected"),
    [
        (["deployments/scale"], "deployments", "scale", True),
        (["deployments/scale"], "deployments", "", False),  # the main resource is not the subresource
        (["deployments"], "deployments", "scale", False),  # ... and vice versa: KEDA's /scale needs the explicit form
        (["deployments/scale"], "statefulsets", "scale", False),
        (["*"], "deployments", "scale", False),  # "*" matches no subresource
        (["*"], "deployments", "", True),
        (["*/scale"], "statefulsets", "scale", True),
        (["*/*"], "deployments", "scale", True),
        (["deployments/*"], "deployments", "scale", True),
        (["deployments/*"], "deployments", "status", True),
        (["pods", "deployments/scale"], "deployments", "scale", True),
    ],
)
def test_resources_match_like_the_api_server(
    rule_resources: list[str], resource: str, subresource: str, expected: bool
) -> None:
    assert resource_matches(rule_resources, resource, subresource) is expected


def test_rules_check_operations_groups_versions_and_scope() -> None:
    assert rule_matches(SCALE_RULE, attrs())
    assert not rule_matches(SCALE_RULE, attrs(operation="CREATE"))
    assert not rule_matches(SCALE_RULE, attrs(group="cluster.x-k8s.io", resource="machinedeployments"))
    assert not rule_matches(SCALE_RULE, attrs(resource="statefulsets"))
    assert not rule_matches(SCALE_RULE, attrs(subresource=""))
    assert not rule_matches({**SCALE_RULE, "scope": "Cluster"}, attrs())
    assert rule_matches(
        {**SCALE_RULE, "operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"]}, attrs(operation="DELETE")
    )


def test_label_selectors() -> None:
    exempt = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]
    }
    assert label_selector_matches(exempt, {"kubernetes.io/metadata.name": "metal3"})
    assert not label_selector_matches(exempt, {"kubernetes.io/metadata.name": "kube-system"})
    assert label_selector_matches(exempt, {})  # NotIn: an absent key matches
    assert label_selector_matches({}, {"a": "b"}) and label_selector_matches(None, None)
    assert label_selector_matches(
        {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "c", "operator": "Exists"}]}, {"a": "b", "c": ""}
    )
    assert not label_selector_matches({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, {"c": "x"})
    assert not label_selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {})


def test_namespace_selector_exempts_namespaces_by_their_name_label() -> None:
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "slime"]}
        ]
    }
    hook = webhook("injection.test", [SECRET_RULE], namespaceSelector=selector)
    # the namespace lookup knows no labels: the chain adds kubernetes.io/metadata.name like the API server
    chain = AdmissionChain([configuration("MutatingWebhookConfiguration", hook)], namespace_labels=lambda ns: {})
    assert [h.name for h in chain.matching(secret_attrs("metal3"))] == ["injection.test"]
    assert chain.matching(secret_attrs("slime")) == []
    assert chain.matching(secret_attrs("kube-system")) == []
    # a selector on ordinary labels uses the namespace's own labels
    labelled = webhook("labelled.test", [SECRET_RULE], namespaceSelector={"matchLabels": {"team": "hpc"}})
    chain = AdmissionChain(
        [configuration("MutatingWebhookConfiguration", labelled)],
        namespace_labels=lambda ns: {"team": "hpc"} if ns == "metal3" else {},
    )
    assert len(chain.matching(secret_attrs("metal3"))) == 1
    assert chain.matching(secret_attrs("other")) == []


def test_object_selector_and_match_conditions() -> None:
    conditions = [
        {
            "name": "owned",
            "expression": "has(object.metadata.ownerReferences) && "
            "object.metadata.ownerReferences.exists(o, o.kind == 'Metal3Data')",
        }
    ]
    hook = webhook("injection.test", [SECRET_RULE], matchConditions=conditions)
    chain = AdmissionChain([configuration("MutatingWebhookConfiguration", hook)])
    assert len(chain.matching(secret_attrs(owned=True))) == 1
    assert chain.matching(secret_attrs(owned=False)) == []
    chosen = webhook("chosen.test", [SECRET_RULE], objectSelector={"matchLabels": {"pick": "me"}})
    chain = AdmissionChain([configuration("MutatingWebhookConfiguration", chosen)])
    assert chain.matching(secret_attrs()) == []
    picked = secret_attrs()
    picked.object["metadata"]["labels"] = {"pick": "me"}
    assert len(chain.matching(picked)) == 1


def test_the_rendered_chart_selects_like_a_cluster(tmp_path) -> None:
    """The chart's own configurations: secrets for injection, deployments/scale of the mirror for scaling."""
    from demo import chart, cluster

    configs = chart.webhook_configurations(chart.render(cluster.chart_values(), cluster.SLIME_NAMESPACE))
    chain = AdmissionChain(configs, namespace_labels=lambda ns: {})
    mirror = attrs(namespace=cluster.SLIME_NAMESPACE, name=cluster.MIRROR)
    assert [h.name for h in chain.matching(mirror)] == ["scaling.webhook.slime"]
    assert chain.matching(attrs(namespace=cluster.SLIME_NAMESPACE, name="some-app")) == []  # narrowToMirrors
    assert chain.matching(attrs(namespace="kube-system", name=cluster.MIRROR)) == []
    assert chain.matching(attrs(resource="statefulsets", namespace=cluster.SLIME_NAMESPACE, name=cluster.MIRROR)) == []
    assert [h.name for h in chain.matching(secret_attrs("metal3"))] == ["injection.webhook.slime"]
    assert chain.matching(secret_attrs(cluster.SLIME_NAMESPACE)) == []  # the release namespace is exempt
    assert chain.matching(secret_attrs("metal3", owned=False)) == []


# --- calling --------------------------------------------------------------------------------------


class FakeWebhook:
    """An HTTPS admission webhook whose answer a test chooses."""

    def __init__(self, pki: Pki) -> None:
        self.answer: Callable[[dict[str, Any]], dict[str, Any]] = lambda req: {"uid": req["uid"], "allowed": True}
        self.delay = 0.0
        self.requests: list[dict[str, Any]] = []
        self.http = LoopbackServer(self._respond, name="fake-webhook", tls=pki.server_context())
        self.url = self.http.url

    def _respond(self, request: Request) -> Answer:
        review = json.loads(request.body)
        self.requests.append({"path": request.path, "content_type": request.headers["content-type"], **review})
        time.sleep(self.delay)
        return 200, {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": self.answer(review["request"]),
        }

    def stop(self) -> None:
        self.http.stop()


@pytest.fixture
def fake(pki: Pki) -> Iterator[FakeWebhook]:
    server = FakeWebhook(pki)
    yield server
    server.stop()


def test_mutating_patch_then_validating_sees_the_patched_object(fake: FakeWebhook, pki: Pki) -> None:
    ca = pki.ca.pem
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"patched": "yes"}}]

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        if request["object"]["metadata"].get("labels"):  # the validating call
            return {"uid": request["uid"], "allowed": True}
        return {
            "uid": request["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }

    fake.answer = answer
    chain = AdmissionChain(
        [
            configuration(
                "ValidatingWebhookConfiguration",
                webhook("validate.test", [SECRET_RULE], url=fake.url + "/validate", ca=ca),
            ),
            configuration(
                "MutatingWebhookConfiguration", webhook("mutate.test", [SECRET_RULE], url=fake.url + "/mutate", ca=ca)
            ),
        ]
    )
    stored = chain(secret_attrs())
    assert stored is not None and stored["metadata"]["labels"] == {"patched": "yes"}
    assert [r["path"].split("?")[0] for r in fake.requests] == ["/mutate", "/validate"]  # mutating first
    assert fake.requests[0]["path"].endswith("?timeout=2s")
    first = fake.requests[0]["request"]
    assert first["kind"] == {"group": "", "version": "v1", "kind": "Secret"}
    assert first["resource"] == {"group": "", "version": "v1", "resource": "secrets"}
    assert first["operation"] == "CREATE" and first["namespace"] == "metal3" and first["oldObject"] is None
    assert first["options"]["kind"] == "CreateOptions" and first["dryRun"] is False
    assert [c.outcome for c in chain.calls] == ["patched", "allowed"]


def test_scale_request_has_the_subresource(fake: FakeWebhook, pki: Pki) -> None:
    chain = AdmissionChain(
        [
            configuration(
                "ValidatingWebhookConfiguration", webhook("scale.test", [SCALE_RULE], url=fake.url, ca=pki.ca.pem)
            )
        ]
    )
    assert chain(attrs()) is None
    request = fake.requests[0]["request"]
    assert request["subResource"] == "scale" and request["requestSubResource"] == "scale"
    assert request["kind"] == SCALE_KIND and request["resource"]["resource"] == "deployments"


def test_denial_uses_the_api_server_message(fake: FakeWebhook, pki: Pki) -> None:
    fake.answer = lambda req: {"uid": req["uid"], "allowed": False, "status": {"code": 503, "message": "not now"}}
    chain = AdmissionChain(
        [
            configuration(
                "ValidatingWebhookConfiguration", webhook("scale.test", [SCALE_RULE], url=fake.url, ca=pki.ca.pem)
            )
        ]
    )
    with pytest.raises(AdmissionDenied) as denied:
        chain(attrs())
    assert denied.value.message == 'admission webhook "scale.test" denied the request: not now'
    assert denied.value.code == 503
    fake.answer = lambda req: {"uid": req["uid"], "allowed": False, "status": {"code": 200}}
    with pytest.raises(AdmissionDenied) as denied:
        chain(attrs())
    assert denied.value.message == 'admission webhook "scale.test" denied the request without explanation'
    assert denied.value.code == 400


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_failure_policy_on_connection_refused(policy: str, pki: Pki) -> None:
    url = f"https://127.0.0.1:{_closed_port()}/validate"
    chain = AdmissionChain(
        [
            configuration(
                "ValidatingWebhookConfiguration", webhook("scale.test", [SCALE_RULE], policy, url=url, ca=pki.ca.pem)
            )
        ]
    )
    if policy == "Ignore":
        assert chain(attrs()) is None
        assert chain.calls[-1].outcome == "ignored"
        return
    with pytest.raises(AdmissionDenied) as denied:
        chain(attrs())
    assert denied.value.code == 500
    assert denied.value.message.startswith(
        f'Internal error occurred: failed calling webhook "scale.test": failed to call webhook: Post "{url}"'
    )
    assert chain.calls[-1].outcome == "failed"


def test_failure_policy_on_timeout_wrong_uid_untrusted_ca_and_cel_error(fake: FakeWebhook, pki: Pki, tmp_path) -> None:
    def chain_with(policy: str, ca: bytes = pki.ca.pem, **extra: Any) -> AdmissionChain:
        hook = webhook("scale.test", [SCALE_RULE], policy, url=fake.url, ca=ca, **extra)
        hook["timeoutSeconds"] = 1
        return AdmissionChain([configuration("ValidatingWebhookConfiguration", hook)])

    fake.delay = 1.5  # slower than timeoutSeconds
    with pytest.raises(AdmissionDenied, match="context deadline exceeded"):
        chain_with("Fail")(attrs())
    assert chain_with("Ignore")(attrs()) is None
    fake.delay = 0.0

    fake.answer = lambda req: {"uid": "someone-else", "allowed": True}
    with pytest.raises(AdmissionDenied, match="expected response.uid="):
        chain_with("Fail")(attrs())
    fake.answer = lambda req: {"uid": req["uid"], "allowed": True}

    other_ca = make_pki(tmp_path / "other").ca.pem  # the caBundle must be the one that signed the server
    with pytest.raises(AdmissionDenied, match="CERTIFICATE_VERIFY_FAILED"):
        chain_with("Fail", ca=other_ca)(attrs())
    ignore = chain_with("Ignore", ca=other_ca)
    assert ignore(attrs()) is None and ignore.calls[-1].outcome == "ignored"

    broken = [{"name": "broken", "expression": "object.nope.deeper == 1"}]
    with pytest.raises(AdmissionDenied) as denied:
        chain_with("Fail", matchConditions=broken)(attrs())
    assert denied.value.code == 403 and "matchCondition 'broken'" in denied.value.message
    count = len(fake.requests)
    assert chain_with("Ignore", matchConditions=broken)(attrs()) is None
    assert len(fake.requests) == count  # skipped, not called


def test_validating_webhook_must_not_patch_and_dry_run_needs_no_side_effects(fake: FakeWebhook, pki: Pki) -> None:
    fake.answer = lambda req: {
        "uid": req["uid"],
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(b"[]").decode(),
    }
    chain = AdmissionChain(
        [
            configuration(
                "ValidatingWebhookConfiguration", webhook("scale.test", [SCALE_RULE], url=fake.url, ca=pki.ca.pem)
            )
        ]
    )
    with pytest.raises(AdmissionDenied, match="a validating webhook returned a patch"):
        chain(attrs())
    hook = webhook("scale.test", [SCALE_RULE], url=fake.url, ca=pki.ca.pem)
    hook["sideEffects"] = "Some"
    with pytest.raises(AdmissionDenied, match="does not support dry run"):
        AdmissionChain([configuration("ValidatingWebhookConfiguration", hook)])(attrs(dry_run=True))


def test_point_to_local_keeps_the_service_path(pki: Pki) -> None:
    config = configuration(
        "MutatingWebhookConfiguration",
        {
            "name": "injection.webhook.slime",
            "rules": [SECRET_RULE],
            "clientConfig": {
                "service": {"name": "svc", "namespace": "slime", "path": "/mutate", "port": 443},
                "caBundle": "b2xk",
            },
        },
    )
    local = point_to_local(config, {"injection.webhook.slime": "https://127.0.0.1:9443/"}, pki.ca.pem)
    client = local["webhooks"][0]["clientConfig"]
    assert client == {"url": "https://127.0.0.1:9443/mutate", "caBundle": base64.b64encode(pki.ca.pem).decode()}
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == "b2xk"  # the input is not changed
