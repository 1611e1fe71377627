"""The rendered RBAC allows every Kubernetes API call the services make, and no more than needed.

The calls below are the "Kubernetes API calls (what RBAC must allow)" section of
docs/interfaces.md, written out as authorizer attributes. The integration suite feeds the API
emulator's recorded requests through the same function, ``assert_rbac_covers`` (from
tests/support/rbac.py), so RBAC is checked against what the code really does as well.
"""

from __future__ import annotations

import re

import pytest

from testbed.framework.chart import NAMESPACE, RELEASE, mapping
from testbed.framework.paths import REPO_ROOT
from testbed.framework.rbac import ApiRequest as R
from testbed.framework.rbac import assert_rbac_covers, rbac_allows

INJ_SA = f"{RELEASE}-injection-webhook"
SCL_SA = f"{RELEASE}-scaling-webhook"
M3 = "infrastructure.cluster.x-k8s.io"
CAPI = "cluster.x-k8s.io"

# Namespaces used in the examples: Metal3 objects in metal3, the Slinky controller in slurm.
INJECTION_CALLS = [
    R("get", non_resource=f"/apis/{M3}"),
    R("get", non_resource="/apis/slinky.slurm.net"),
    *[R(v, M3, r) for r in ("metal3datas", "metal3datatemplates") for v in ("list", "watch")],
    # the CAPI kubeconfig Secrets, one watch each with fieldSelector metadata.name=<cluster>-kubeconfig
    *[R(v, "", "secrets", namespace="metal3", name="bm-cluster-kubeconfig") for v in ("list", "watch")],
    *[
        R(v, g, r, namespace="slurm")
        for v in ("list", "watch")
        for g, r in (("", "pods"), ("apps", "statefulsets"), ("slinky.slurm.net", "controllers"), ("", "services"))
    ],
    # the slurm.key Secret, fieldSelector metadata.name=<key secret>; the JWT key Secret the same way (jwt-key opt-in)
    *[
        R(v, "", "secrets", namespace="slurm", name=name)
        for v in ("list", "watch")
        for name in ("slurm-auth-slurm", "slurm-auth-jwths256")
    ],
]

SCALING_VALUES = {
    "scaling": {
        "mappings": [
            mapping(f"{NAMESPACE}/mirror-a", "metal3/md-a", "a", maxReplicas=4),
            mapping("mirrors/mirror-b", "metal3-b/md-b", "b", maxReplicas=4),
        ],
        "safeScaleIn": {"enabled": True, "jwtSecrets": [{"name": "slurm-jwt", "namespace": "slurm"}]},
        "capacityAware": {"enabled": True},
        "slurmHealth": {"enabled": True, "jwtSecrets": [{"name": "slurm-jwt", "namespace": "slurm"}]},
    }
}

SCALING_CALLS = [
    *[R(v, "", "configmaps", namespace=NAMESPACE, name="scaling-webhook-configmap") for v in ("list", "watch")],
    R("get", non_resource=f"/apis/{CAPI}"),
    *[
        R("patch", CAPI, "machinedeployments", "scale", namespace=ns, name=md)
        for ns, md in (("metal3", "md-a"), ("metal3-b", "md-b"))
    ],
    R("get", CAPI, "machinedeployments", namespace="metal3", name="md-a"),
    R("get", CAPI, "machinedeployments", namespace="metal3-b", name="md-b"),
    *[
        R(v, "apps", "deployments", namespace=ns, name=name)
        for v in ("get", "list", "watch", "patch")
        for ns, name in ((NAMESPACE, "mirror-a"), ("mirrors", "mirror-b"))
    ],
    *[
        R(v, CAPI, "machinedeployments", namespace=ns, name=name)
        for v in ("list", "watch")
        for ns, name in (("metal3", "md-a"), ("metal3-b", "md-b"))
    ],
    *[R(v, CAPI, "clusters", namespace=ns, name="c1") for v in ("list", "watch") for ns in ("metal3", "metal3-b")],
    R("create", "coordination.k8s.io", "leases", namespace=NAMESPACE),
    *[
        R(v, "coordination.k8s.io", "leases", namespace=NAMESPACE, name="slime-scaling-webhook")
        for v in ("get", "update")
    ],
    R("create", "", "events", namespace="metal3"),
    R("create", "", "events", namespace="metal3-b"),
    R("list", CAPI, "machines", namespace="metal3"),
    R("patch", CAPI, "machines", namespace="metal3", name="md-a-xyz"),
    R("get", "", "secrets", namespace="slurm", name="slurm-jwt"),
    # capacityAware: the hosts, the pool's template and its Machines, watched.
    *[R(v, "metal3.io", "baremetalhosts", namespace="metal3") for v in ("list", "watch")],
    *[
        R(v, "infrastructure.cluster.x-k8s.io", "metal3machinetemplates", namespace="metal3", name="md-a")
        for v in ("list", "watch")
    ],
    *[R(v, CAPI, "machines", namespace="metal3") for v in ("list", "watch")],
    # slurmHealth: SliMe's condition on an unhealthy Machine, and its remediation.
    R("patch", CAPI, "machines", "status", namespace="metal3", name="md-a-xyz"),
    R("delete", CAPI, "machines", namespace="metal3", name="md-a-xyz"),
]


def test_interfaces_doc_resources_are_all_in_the_lists():
    """Catch drift: every resource the doc's API-call section names appears in a list above."""
    doc = (REPO_ROOT / "docs" / "interfaces.md").read_text()
    section = doc.split("## Kubernetes API calls", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9]+(?:/[a-z]+)?)`", section))
    verbs = {"get", "list", "watch", "patch", "create", "update", "delete"}
    groups = {"apps"}
    resources = named - verbs - groups
    covered = {
        r.resource + (f"/{r.subresource}" if r.subresource else "")
        for r in INJECTION_CALLS + SCALING_CALLS
        if r.resource
    }
    assert resources, "could not read the API-call section of docs/interfaces.md"
    assert resources <= covered, (
        f"docs/interfaces.md names resources the RBAC test does not check: {resources - covered}"
    )


# The operator's values that make the calls above legitimate: the tenant namespace metal3 bound to
# the Slurm namespace slurm and to its workload cluster, jwt-key allowed and its Secret named.
INJECTION_VALUES = {
    "slurmBindings": ["metal3=slurm", "metal3=workload:slurm"],
    "templateOptIns": ["jwt-key"],
    "jwtKeySecretNames": ["slurm-auth-jwths256"],
}


@pytest.mark.parametrize(
    "values",
    [INJECTION_VALUES, {**INJECTION_VALUES, "metal3Namespaces": ["metal3"]}],
    ids=["cluster-wide", "namespaced"],
)
def test_injection_rbac_covers_its_calls(render, values):
    assert_rbac_covers(render({"injection": values}), INJ_SA, NAMESPACE, INJECTION_CALLS)


def secret_rules(objs, cluster_wide: bool) -> list[dict]:
    kinds = ("ClusterRole",) if cluster_wide else ("ClusterRole", "Role")
    return [
        rule
        for o in objs
        if o["kind"] in kinds and o["metadata"]["name"].startswith(INJ_SA)
        for rule in o["rules"]
        if "secrets" in rule["resources"]
    ]


def test_the_default_render_grants_no_secret_cluster_wide_without_names(render):
    objs = render(None)
    assert all(rule.get("resourceNames") == ["slurm-auth-slurm"] for rule in secret_rules(objs, cluster_wide=True))
    for req in (
        R("list", "", "secrets"),
        R("list", "", "secrets", namespace="metal3"),
        R("watch", "", "secrets", namespace="metal3", name="bm-cluster-kubeconfig"),
        R("watch", "", "secrets", namespace="slurm", name="slurm-auth-jwths256"),
    ):
        assert not rbac_allows(objs, INJ_SA, NAMESPACE, req), req


def test_kubeconfig_secrets_are_readable_only_where_a_workload_binding_is(render):
    kubeconfig = R("watch", "", "secrets", namespace="metal3", name="bm-cluster-kubeconfig")
    elsewhere = R("watch", "", "secrets", namespace="tenant-b", name="bm-cluster-kubeconfig")
    local_only = render({"injection": {"slurmBindings": ["metal3=slurm"]}})
    assert not rbac_allows(local_only, INJ_SA, NAMESPACE, kubeconfig)
    workload = render({"injection": {"slurmBindings": ["metal3=workload:slurm"]}})
    assert rbac_allows(workload, INJ_SA, NAMESPACE, kubeconfig)
    assert not rbac_allows(workload, INJ_SA, NAMESPACE, elsewhere)


def test_injection_roles_are_namespaced_when_namespaces_are_given(render):
    objs = render({"injection": {"slurmBindings": ["metal3=slurm"], "metal3Namespaces": ["metal3"]}})
    assert rbac_allows(objs, INJ_SA, NAMESPACE, R("watch", "", "secrets", namespace="slurm", name="slurm-auth-slurm"))
    assert rbac_allows(objs, INJ_SA, NAMESPACE, R("list", "", "pods", namespace="metal3"))
    for req in (
        R("list", "", "secrets", namespace="other"),
        R("list", "", "pods", namespace="other"),
        R("list", "", "secrets", namespace="slurm", name="another-secret"),
        R("list", "", "secrets"),
    ):
        assert not rbac_allows(objs, INJ_SA, NAMESPACE, req), req
    # Only the Metal3 informers and Events stay cluster wide (of the webhook's roles: the helm test hook has its own).
    cluster_roles = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].startswith(INJ_SA)]
    assert [c["metadata"]["name"] for c in cluster_roles] == [f"{INJ_SA}-metal3"]


def test_the_jwt_secret_is_readable_only_when_jwt_key_is_allowed_and_named(render):
    jwt = R("watch", "", "secrets", namespace="slurm", name="slurm-auth-jwths256")
    bound = {"slurmBindings": ["metal3=slurm"]}
    assert not rbac_allows(render({"injection": bound}), INJ_SA, NAMESPACE, jwt)
    named = {**bound, "jwtKeySecretNames": ["slurm-auth-jwths256"]}
    assert not rbac_allows(render({"injection": named}), INJ_SA, NAMESPACE, jwt)  # named, but jwt-key not allowed
    assert rbac_allows(render({"injection": {**named, "templateOptIns": ["jwt-key"]}}), INJ_SA, NAMESPACE, jwt)
    # ["*"]: every Secret of the Slurm namespaces, the JWT one too (an explicit widening).
    assert rbac_allows(render({"injection": {**bound, "slurmKeySecretNames": ["*"]}}), INJ_SA, NAMESPACE, jwt)


def test_scaling_rbac_covers_its_calls(render):
    assert_rbac_covers(render(SCALING_VALUES), SCL_SA, NAMESPACE, SCALING_CALLS)


def test_scaling_rbac_is_least_privilege(render):
    objs = render(SCALING_VALUES)
    assert not [
        o
        for o in objs
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding") and o["metadata"]["name"].startswith(SCL_SA)
    ]
    for req in (
        R("patch", CAPI, "machinedeployments", "scale", namespace="metal3", name="md-other"),
        R("patch", CAPI, "machinedeployments", "scale", namespace="default", name="md-a"),
        R("patch", CAPI, "machinedeployments", namespace="metal3", name="md-a"),
        R("list", "", "configmaps", namespace=NAMESPACE),
        R("get", "", "configmaps", namespace=NAMESPACE, name="other"),
        # narrowed: the service never GETs the ConfigMap (watch cache) nor the /scale it patches
        R("get", "", "configmaps", namespace=NAMESPACE, name="scaling-webhook-configmap"),
        R("get", CAPI, "machinedeployments", "scale", namespace="metal3", name="md-a"),
        R("get", "apps", "deployments", namespace=NAMESPACE, name="not-a-mirror"),
        R("update", "apps", "deployments", namespace=NAMESPACE, name="mirror-a"),
        R("get", "", "secrets", namespace="slurm", name="slurm-auth-slurm"),
        R("create", "", "events", namespace="default"),
    ):
        assert not rbac_allows(objs, SCL_SA, NAMESPACE, req), req
    # Safe scale-in is opt-in: without it, no Machine or Secret access.
    plain = render({"scaling": {"mappings": SCALING_VALUES["scaling"]["mappings"]}})
    assert not rbac_allows(plain, SCL_SA, NAMESPACE, R("list", CAPI, "machines", namespace="metal3"))
    assert not rbac_allows(plain, SCL_SA, NAMESPACE, R("get", "", "secrets", namespace="slurm", name="slurm-jwt"))
    # So is capacity-aware scale-up: no BareMetalHost access without it.
    assert not rbac_allows(plain, SCL_SA, NAMESPACE, R("list", "metal3.io", "baremetalhosts", namespace="metal3"))


def test_extra_namespaces_grant_unrestricted_names(render):
    objs = render({"scaling": {"createConfigMap": False, "extraNamespaces": ["metal3"]}})
    assert rbac_allows(
        objs, SCL_SA, NAMESPACE, R("patch", CAPI, "machinedeployments", "scale", namespace="metal3", name="anything")
    )


def test_no_wildcards_and_every_rule_commented(render):
    from testbed.framework.chart import COMBOS
    from testbed.framework.paths import CHART

    for combo in [*COMBOS.values(), SCALING_VALUES]:
        for obj in render(combo):
            if obj["kind"] not in ("Role", "ClusterRole"):
                continue
            for rule in obj["rules"]:
                for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                    assert "*" not in (rule.get(field) or []), (obj["metadata"]["name"], rule)
                    assert not any("*" in v for v in rule.get(field) or []), (obj["metadata"]["name"], rule)
    # Each rule in the RBAC templates has a `#` comment right above it.
    for tpl in sorted((CHART / "templates").glob("rbac-*.yaml")):
        lines = tpl.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                above = [ln.strip() for ln in lines[max(0, i - 3) : i]]
                assert any(ln.startswith("#") for ln in above), f"{tpl.name}:{i + 1} rule without a comment"
