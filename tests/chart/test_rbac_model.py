"""Unit tests of tests/support/rbac.py (the RBAC model the chart checks rely on)."""

from __future__ import annotations

import pytest

from testbed.framework.rbac import ApiRequest as R
from testbed.framework.rbac import assert_rbac_covers, rbac_allows

RBAC = "rbac.authorization.k8s.io/v1"
SA, NS = "hook", "sys"


def role(name, ns, rules, kind="Role"):
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {"apiVersion": RBAC, "kind": kind, "metadata": meta, "rules": rules}


def binding(name, ns, role_name, role_kind="Role", subject=None, kind="RoleBinding"):
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {
        "apiVersion": RBAC,
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": [subject or {"kind": "ServiceAccount", "name": SA, "namespace": NS}],
    }


OBJECTS = [
    role(
        "cm",
        "sys",
        [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"], "verbs": ["get", "list", "watch"]}],
    ),
    binding("cm", "sys", "cm"),
    role(
        "md",
        "metal3",
        [
            {"apiGroups": ["cluster.x-k8s.io"], "resources": ["machinedeployments/scale"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ],
    ),
    binding("md", "metal3", "md"),
    role("reader", None, [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}], kind="ClusterRole"),
    binding("reader", "apps-ns", "reader", role_kind="ClusterRole"),  # ClusterRole bound in one namespace
    role(
        "m3",
        None,
        [{"apiGroups": ["infrastructure.cluster.x-k8s.io"], "resources": ["metal3datas"], "verbs": ["list", "watch"]}],
        kind="ClusterRole",
    ),
    binding("m3", None, "m3", role_kind="ClusterRole", kind="ClusterRoleBinding"),
    role("wild", None, [{"apiGroups": ["x.io"], "resources": ["*/status"], "verbs": ["*"]}], kind="ClusterRole"),
    binding(
        "wild",
        None,
        "wild",
        role_kind="ClusterRole",
        kind="ClusterRoleBinding",
        subject={"kind": "Group", "name": "system:serviceaccounts:sys"},
    ),
    role("other", "metal3", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    binding("other", "metal3", "other", subject={"kind": "ServiceAccount", "name": "someone-else", "namespace": NS}),
]


@pytest.mark.parametrize(
    "req",
    [
        R("list", "", "configmaps", namespace="sys", name="cfg"),  # fieldSelector metadata.name=cfg
        R("get", "", "configmaps", namespace="sys", name="cfg"),
        R("patch", "cluster.x-k8s.io", "machinedeployments", "scale", namespace="metal3", name="md-a"),
        R("create", "", "events", namespace="metal3"),
        R("get", "apps", "deployments", namespace="apps-ns", name="x"),
        R("watch", "infrastructure.cluster.x-k8s.io", "metal3datas"),
        R("watch", "infrastructure.cluster.x-k8s.io", "metal3datas", namespace="any"),
        R("update", "x.io", "things", "status", namespace="q", name="t"),
        R("get", non_resource="/apis/cluster.x-k8s.io"),
        R("get", non_resource="/api"),
    ],
    ids=str,
)
def test_allowed(req):
    assert rbac_allows(OBJECTS, SA, NS, req)


@pytest.mark.parametrize(
    "req",
    [
        R("list", "", "configmaps", namespace="sys"),  # no name: resourceNames rule does not apply
        R("get", "", "configmaps", namespace="sys", name="other"),
        R("list", "", "configmaps", namespace="other", name="cfg"),  # Role is namespaced
        R("patch", "cluster.x-k8s.io", "machinedeployments", namespace="metal3", name="md-a"),  # not the subresource
        R("get", "cluster.x-k8s.io", "machinedeployments", "scale", namespace="metal3", name="md-a"),  # verb
        R("create", "", "events", namespace="default"),
        R("get", "apps", "deployments", namespace="other", name="x"),  # ClusterRole bound by a RoleBinding
        R("get", "apps", "deployments", name="x"),  # cluster-wide
        R("list", "", "secrets", namespace="metal3"),  # someone else's binding
        R("update", "x.io", "things", namespace="q", name="t"),  # */status does not cover the main resource
        R("get", non_resource="/metrics"),
    ],
    ids=str,
)
def test_denied(req):
    assert not rbac_allows(OBJECTS, SA, NS, req)


def test_subject_namespace_matters():
    assert not rbac_allows(OBJECTS, SA, "elsewhere", R("create", "", "events", namespace="metal3"))


def test_assert_rbac_covers_lists_every_gap():
    with pytest.raises(AssertionError) as exc:
        assert_rbac_covers(
            OBJECTS,
            SA,
            NS,
            [
                R("create", "", "events", namespace="metal3"),
                R("delete", "", "pods", namespace="a", name="p"),
                R("get", non_resource="/metrics"),
            ],
        )
    text = str(exc.value)
    assert "delete core/pods ns=a name=p" in text and "get /metrics" in text and "events" not in text


def test_duck_typed_requests():
    class Recorded:  # what an emulator's request log might hold
        verb, api_group, resource, subresource, namespace, name, non_resource = (
            "create",
            "",
            "events",
            "",
            "metal3",
            "",
            "",
        )

    assert rbac_allows(OBJECTS, SA, NS, Recorded())
