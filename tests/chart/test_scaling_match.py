"""What reaches the scaling webhook: exactly the mirrors the chart names, every /scale and every UPDATE of them.

The rendered ValidatingWebhookConfiguration is played by the demo's admission chain (rules,
namespaceSelector with the ``kubernetes.io/metadata.name`` label the API server sets, objectSelector,
and the CEL matchConditions evaluated by cel-python) on the requests kube-apiserver sends: a
``deployments/scale`` UPDATE carries the ``autoscaling/v1`` Scale the API server builds (name,
namespace, uid, resourceVersion: no labels), a ``deployments`` UPDATE the Deployment itself. The
same question against a real kube-apiserver: kit/tests/real_k8s/test_scaling_match.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from demo.admission_chain import AdmissionChain
from kubemu import AdmissionAttributes
from testbed.framework.chart import NAMESPACE, TWO_MAPPINGS, HelmError, by_kind, mapping, one

SCALE_KIND = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
DEPLOYMENT_KIND = {"group": "apps", "version": "v1", "kind": "Deployment"}
MIRRORS = [(NAMESPACE, "mirror-a"), ("mirrors", "mirror-b")]  # TWO_MAPPINGS' mirrors


def scale(namespace: str, name: str, resource: str = "deployments") -> AdmissionAttributes:
    """A /scale UPDATE as kube-apiserver admits it: the Scale has no labels, whatever the parent has."""

    def obj(replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace, "uid": "u", "resourceVersion": "7"},
            "spec": {"replicas": replicas},
        }

    return AdmissionAttributes(
        "UPDATE", "apps", "v1", resource, "scale", SCALE_KIND, namespace, name, obj(3), obj(2), False
    )


def update(
    namespace: str, name: str, subresource: str = "", labels: dict[str, str] | None = None
) -> AdmissionAttributes:
    """An UPDATE of a Deployment itself (kubectl patch/edit), or of its /status."""

    def obj(replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"replicas": replicas},
        }

    return AdmissionAttributes(
        "UPDATE", "apps", "v1", "deployments", subresource, DEPLOYMENT_KIND, namespace, name, obj(3), obj(2), False
    )


def chain(objects: list[dict[str, Any]]) -> AdmissionChain:
    configs = by_kind(objects, "ValidatingWebhookConfiguration")
    return AdmissionChain(configs, namespace_labels=lambda ns: {})


def reaches(objects: list[dict[str, Any]], attrs: AdmissionAttributes) -> bool:
    return [h.name for h in chain(objects).matching(attrs)] == ["scaling.webhook.slime"]


@pytest.mark.parametrize("namespace,name", MIRRORS)
def test_every_scale_and_every_update_of_a_mapped_mirror_reaches_the_webhook(render, namespace, name) -> None:
    objects = render(TWO_MAPPINGS)
    assert reaches(objects, scale(namespace, name))
    assert reaches(objects, update(namespace, name))  # the side door: kubectl patch deployment <mirror>
    # The chart's own labels on the mirror change nothing: names decide, never labels.
    assert reaches(objects, update(namespace, name, labels={}))


@pytest.mark.parametrize(
    "attrs",
    [
        scale(NAMESPACE, "some-app"),  # another Deployment beside the mirrors
        update(NAMESPACE, "some-app", labels={"slime/mirror": "mirror-a"}),  # a label is no way in
        scale("mirrors", "mirror-a"),  # a mirror's name in another mirror namespace
        scale("default", "mirror-a"),
        scale(NAMESPACE, "mirror-a", resource="statefulsets"),
        scale(NAMESPACE, "mirror-a", resource="replicasets"),
        update(NAMESPACE, "mirror-a", subresource="status"),  # the Deployment controller's status writes
        scale("kube-system", "coredns"),
    ],
    ids=[
        "other-deployment",
        "other-deployment-with-a-mirror-label",
        "mirror-name-other-mirror-namespace",
        "mirror-name-unrelated-namespace",
        "statefulset-scale",
        "replicaset-scale",
        "mirror-status",
        "kube-system",
    ],
)
def test_nothing_else_reaches_it(render, attrs) -> None:
    assert not reaches(render(TWO_MAPPINGS), attrs)


def test_without_mirrors_nothing_reaches_it(render) -> None:
    """The default install (no mappings) intercepts no Deployment scale anywhere in the cluster."""
    objects = render()
    (hook,) = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    # Every namespace carries kubernetes.io/metadata.name, so DoesNotExist selects none: the API
    # server does not even evaluate the condition.
    assert hook["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "DoesNotExist"}]
    }
    for attrs in (
        scale(NAMESPACE, "mirror-a"),
        update(NAMESPACE, "mirror-a"),
        scale("default", "web"),
        scale("kube-system", "coredns"),
        scale(NAMESPACE, "mirror-deployment"),  # the thesis form's default mirror name
    ):
        assert not reaches(objects, attrs)


def test_the_webhook_configuration_names_each_mirror_once(render) -> None:
    (hook,) = one(render(TWO_MAPPINGS), "ValidatingWebhookConfiguration")["webhooks"]
    assert [r["resources"] for r in hook["rules"]] == [["deployments/scale"], ["deployments"]]
    assert all(r["operations"] == ["UPDATE"] and r["apiGroups"] == ["apps"] for r in hook["rules"])
    assert "objectSelector" not in hook  # it would never match a /scale: see the module docstring
    assert hook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["mirrors", NAMESPACE]}
    ]
    (condition,) = hook["matchConditions"]
    assert condition["expression"] == (
        f"""(request.namespace + '/' + request.name) in ["mirrors/mirror-b","{NAMESPACE}/mirror-a"]"""
    )


def test_an_operator_managed_configmap_names_its_mirrors_in_extra_mirrors(render) -> None:
    """createConfigMap=false: the mirrors of scaling.mappings and scaling.extraMirrors, and nothing else."""
    values = {
        "scaling": {
            "createConfigMap": False,
            "extraNamespaces": ["pools"],
            "extraMirrors": [{"name": "mirror-x", "namespace": "pools"}, {"name": "mirror-y", "namespace": "other"}],
            "mappings": [mapping(f"{NAMESPACE}/mirror-a", "metal3/md-a", maxReplicas=4)],
        }
    }
    objects = render(values)
    assert not by_kind(objects, "ConfigMap") or all(
        c["metadata"]["name"] != "scaling-webhook-configmap" for c in by_kind(objects, "ConfigMap")
    )
    for attrs in (scale("pools", "mirror-x"), update("other", "mirror-y"), scale(NAMESPACE, "mirror-a")):
        assert reaches(objects, attrs)
    for attrs in (scale("pools", "app"), scale("other", "mirror-x"), scale(NAMESPACE, "mirror-x")):
        assert not reaches(objects, attrs)
    # The scaling webhook may read and adopt a named extra mirror (by name), in a namespace the
    # mappings do not otherwise name; in extraNamespaces the Role has no resourceNames already.
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(objects, "Role")}
    (rule,) = roles[("other", "slime-scaling-webhook-mirrors")]["rules"]
    assert rule["resourceNames"] == ["mirror-y"] and "patch" in rule["verbs"]
    (rule,) = roles[("pools", "slime-scaling-webhook-mirrors")]["rules"]
    assert "resourceNames" not in rule


def test_extra_mirrors_with_the_charts_configmap_is_refused(render) -> None:
    with pytest.raises(HelmError) as exc:
        render({"scaling": {"extraMirrors": [{"name": "mirror-x", "namespace": "pools"}]}})
    assert "scaling.extraMirrors names mirrors of a ConfigMap you manage yourself" in exc.value.stderr
    with pytest.raises(HelmError) as exc:
        render(
            {
                "scaling": {
                    "createConfigMap": False,
                    "extraMirrors": [{"name": "mirror-a", "namespace": NAMESPACE}],
                    "mappings": [mapping(f"{NAMESPACE}/mirror-a", "metal3/md-a", maxReplicas=4)],
                }
            }
        )
    assert f"scaling.extraMirrors names {NAMESPACE}/mirror-a, which scaling.mappings already maps" in exc.value.stderr


def test_the_removed_narrowing_values_are_refused_by_name(render) -> None:
    """0.2.0 matches only mirrors, always: the values that turned it off are gone, and saying so fails clearly."""
    for removed in ({"narrowToMirrors": False}, {"extraExemptNamespaces": ["infra"]}):
        with pytest.raises(HelmError) as exc:
            render({"scaling": removed})
        assert next(iter(removed)) in exc.value.stderr
