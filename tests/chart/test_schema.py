"""values.schema.json rejects bad values with a message naming the field; template-time checks too."""

from __future__ import annotations

import json

import pytest

from testbed.framework.chart import HelmError, mapping
from testbed.framework.paths import CHART

BAD = {
    "keda-demand-enum": ({"keda": {"demand": "pods"}}, "/keda/demand"),
    "node-demand-url": (
        {"scaling": {"nodeDemand": {"slurmrestd": "slurm-restapi:6820"}}},
        "/scaling/nodeDemand/slurmrestd",
    ),
    "failurePolicy-enum": ({"injection": {"failurePolicy": "Sometimes"}}, "/injection/failurePolicy"),
    "timeout-too-long": ({"scaling": {"timeoutSeconds": 60}}, "/scaling/timeoutSeconds"),
    "timeout-zero": ({"injection": {"timeoutSeconds": 0}}, "/injection/timeoutSeconds"),
    "replicas-zero": ({"injection": {"replicas": 0}}, "/injection/replicas"),
    "replicas-string": ({"scaling": {"replicas": "two"}}, "/scaling/replicas"),
    "mapping-without-md": (
        {"scaling": {"mappings": [{"mirror": {"name": "m", "namespace": "s"}}]}},
        "machineDeployment",
    ),
    "mapping-without-namespace": (
        {"scaling": {"mappings": [{"mirror": {"name": "m"}, "machineDeployment": {"name": "d", "namespace": "n"}}]}},
        "/scaling/mappings/0/mirror",
    ),
    "bad-dns-name": ({"scaling": {"mappings": [mapping("s/Bad_Name", "n/d")]}}, "/scaling/mappings/0/mirror/name"),
    "bad-namespace": (
        {"scaling": {"mappings": [mapping("s/m", "Not.A.Label/d")]}},
        "/scaling/mappings/0/machineDeployment/namespace",
    ),
    "bad-slurm-binding": ({"injection": {"slurmBindings": ["UPPER=slurm"]}}, "/injection/slurmBindings/0"),
    "binding-without-target": ({"injection": {"slurmBindings": ["metal3="]}}, "/injection/slurmBindings/0"),
    "template-opt-in": ({"injection": {"templateOptIns": ["munge-key"]}}, "/injection/templateOptIns/0"),
    "no-key-secret-names": ({"injection": {"slurmKeySecretNames": []}}, "/injection/slurmKeySecretNames"),
    "conf-server-policy": (
        {"injection": {"confServer": {"policy": "slurm_ctld:6817"}}},
        "/injection/confServer/policy",
    ),
    "conf-server-node-port": (
        {"injection": {"confServer": {"nodeAddresses": ["192.0.2.1:30817/x"]}}},
        "/injection/confServer/nodeAddresses/0",
    ),
    "conf-server-typo": ({"injection": {"confServer": {"nodes": []}}}, "nodes"),
    "extra-join-data": ({"injection": {"extraJoinData": ["munge-key"]}}, "/injection/extraJoinData/0"),
    "jwt-secret-name": ({"injection": {"jwtKeySecretNames": ["Bad_Name"]}}, "/injection/jwtKeySecretNames/0"),
    "typo-top-level": ({"injektion": {"enabled": True}}, "injektion"),
    "typo-nested": ({"scaling": {"mapping": []}}, "mapping"),
    "crdCheck-enum": ({"crdCheck": "sometimes"}, "/crdCheck"),
    "keda-server-url": ({"keda": {"serverAddress": "prometheus:9090"}}, "/keda/serverAddress"),
    "keda-min-negative": ({"keda": {"minReplicaCount": -1}}, "/keda/minReplicaCount"),
    "keda-stabilization-negative": (
        {"keda": {"scaleDownStabilizationSeconds": -5}},
        "/keda/scaleDownStabilizationSeconds",
    ),
    "keda-stabilization-words": (
        {"scaling": {"mappings": [mapping("s/m", "n/d", keda={"scaleDownStabilizationSeconds": "5m"})]}},
        "/scaling/mappings/0/keda/scaleDownStabilizationSeconds",
    ),
    "duration": ({"certManager": {"duration": "90 days"}}, "/certManager/duration"),
    "port-privileged": ({"injection": {"port": 443}}, "/injection/port"),
    "metrics-port-privileged": ({"scaling": {"metricsPort": 80}}, "/scaling/metricsPort"),
    "global-port-gone": ({"webhookPort": 8443}, "webhookPort"),
    "maxReplicas-negative": (
        {"scaling": {"mappings": [mapping("s/m", "n/d", maxReplicas=-1)]}},
        "/scaling/mappings/0/maxReplicas",
    ),
    "maxReplicas-string": (
        {"scaling": {"mappings": [mapping("s/m", "n/d", maxReplicas="3")]}},
        "/scaling/mappings/0/maxReplicas",
    ),
    "netpol-peer-empty": ({"networkPolicy": {"admissionFrom": [{}]}}, "/networkPolicy/admissionFrom/0"),
    "netpol-ipblock-and-selector": (
        {"networkPolicy": {"admissionFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}},
        "/networkPolicy/admissionFrom/0",
    ),
    "netpol-ipblock-no-cidr": (
        {"networkPolicy": {"metricsFrom": [{"ipBlock": {"except": ["10.0.0.0/24"]}}]}},
        "/networkPolicy/metricsFrom/0/ipBlock",
    ),
    "netpol-unknown-peer-key": (
        {"networkPolicy": {"admissionFrom": [{"namespace": "x"}]}},
        "/networkPolicy/admissionFrom/0",
    ),
    "netpol-bad-operator": (
        {
            "networkPolicy": {
                "metricsFrom": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Maybe"}]}}]
            }
        },
        "/networkPolicy/metricsFrom/0/podSelector/matchExpressions/0/operator",
    ),
    "netpol-enabled-string": ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
    "auth-source-enum": ({"admissionAuth": {"clientCA": {"source": "vault"}}}, "/admissionAuth/clientCA/source"),
    "auth-secret-without-name": (
        {"admissionAuth": {"enabled": True, "clientCA": {"source": "secret"}}},
        "/admissionAuth/clientCA/name",
    ),
    "auth-configmap-without-name": (
        {"admissionAuth": {"clientCA": {"source": "configMap", "name": ""}}},
        "/admissionAuth/clientCA/name",
    ),
    "auth-generate-with-name": (
        {"admissionAuth": {"clientCA": {"source": "generate", "name": "my-ca"}}},
        "/admissionAuth/clientCA/name",
    ),
    "auth-bad-name": (
        {"admissionAuth": {"clientCA": {"source": "secret", "name": "My_CA"}}},
        "/admissionAuth/clientCA/name",
    ),
    "auth-bad-key": (
        {"admissionAuth": {"clientCA": {"source": "secret", "name": "ca", "key": "a/b"}}},
        "/admissionAuth/clientCA/key",
    ),
    "auth-duration": (
        {"admissionAuth": {"clientCertificate": {"duration": "1 year"}}},
        "/admissionAuth/clientCertificate/duration",
    ),
    "auth-enforce-string": ({"admissionAuth": {"enforce": "yes"}}, "/admissionAuth/enforce"),
    "auth-typo": ({"admissionAuth": {"clientCa": {}}}, "clientCa"),
    "maxReplicas-in-config": (
        {"scaling": {"mappings": [mapping("s/m", "n/d", config={"maxReplicas": 3})]}},
        "/scaling/mappings/0/config",
    ),
}


def test_schema_is_draft07_json():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"


def _names_field(output: str, field: str) -> bool:
    """Helm 4 reports JSON pointers (/a/b/0), Helm 3 dotted paths (a.b.0)."""
    return field in output or field.lstrip("/").replace("/", ".") in output


@pytest.mark.parametrize("case", list(BAD))
def test_bad_values_are_rejected(render, lint, case):
    values, field = BAD[case]
    with pytest.raises(HelmError) as exc:
        render(values)
    assert _names_field(exc.value.stderr, field), exc.value.stderr
    with pytest.raises(HelmError) as exc:
        lint(values)
    assert _names_field(exc.value.stderr + exc.value.stdout, field)


@pytest.mark.parametrize(
    "values,message",
    [
        (
            {"keda": {"enabled": True}, "scaling": {"mappings": [mapping("s/m", "n/d")]}},
            "scaling.mappings[0].partition is required",
        ),
        (
            {
                "keda": {"enabled": True, "minReplicaCount": 5, "maxReplicaCount": 2},
                "scaling": {"mappings": [mapping("s/m", "n/d", "p")]},
            },
            "must not exceed keda.maxReplicaCount",
        ),
        (
            {"injection": {"preStopSleepSeconds": 30, "terminationGracePeriodSeconds": 30}},
            "injection.preStopSleepSeconds (30) must be smaller",
        ),
        ({"injection": {"metal3Namespaces": ["slime-system"]}}, "must not contain the release namespace"),
        (
            {
                "scaling": {
                    "mappings": [
                        mapping("metal3/m0", "metal3/md-a", maxReplicas=2),
                        mapping("s/m1", "metal3/md-b", maxReplicas=2),
                        mapping("s/m2", "metal3/md-a", maxReplicas=2),
                    ]
                }
            },
            "scaling.mappings[0] and scaling.mappings[2] both target MachineDeployment metal3/md-a; "
            "one MachineDeployment must have one writer",
        ),
        (
            {
                "scaling": {
                    "createConfigMap": False,
                    "mappings": [
                        mapping("s/m0", "metal3/md-a", maxReplicas=2),
                        mapping("s/m0", "metal3/md-b", maxReplicas=2),
                    ],
                }
            },
            "scaling.mappings[0] and scaling.mappings[1] both use mirror Deployment s/m0; a mirror may drive only one "
            "MachineDeployment",
        ),
        (
            {
                "keda": {"enabled": True, "maxReplicaCount": 4},
                "scaling": {"mappings": [mapping("s/m0", "d/md0", "p"), mapping("s/m1", "d/md1", "p", maxReplicas=5)]},
            },
            "scaling.mappings[1] (mirror s/m1 -> MachineDeployment d/md1): maxReplicas 5 is higher than its KEDA "
            "maxReplicaCount 4",
        ),
        ({"networkPolicy": {"enabled": True}}, "networkPolicy.enabled=true needs networkPolicy.admissionFrom"),
        (
            {"keda": {"enabled": True, "demand": "nodes"}, "scaling": {"mappings": [mapping("s/m", "n/d", "p")]}},
            "scaling.mappings[0] uses keda.demand=nodes: set scaling.nodeDemand.slurmrestd and "
            "scaling.nodeDemand.jwtSecret",
        ),
    ],
    ids=[
        "partition-missing",
        "min-over-max",
        "prestop-vs-grace",
        "metal3-in-release-ns",
        "two-mappings-one-md",
        "two-mappings-one-mirror",
        "maxReplicas-over-keda",
        "netpol-without-admission-peers",
        "node-demand-without-slurmrestd",
    ],
)
def test_template_time_checks(render, values, message):
    with pytest.raises(HelmError) as exc:
        render(values)
    assert message in exc.value.stderr


def test_crd_check_fails_early_without_the_apis(render):
    keda = {"crdCheck": "always", "keda": {"enabled": True}, "scaling": {"mappings": [mapping("s/m", "n/d", "p")]}}
    with pytest.raises(HelmError) as exc:
        render(keda, api_versions=("cert-manager.io/v1",))
    assert "keda.enabled=true needs KEDA (keda.sh/v1alpha1 ScaledObject)" in exc.value.stderr
    with pytest.raises(HelmError) as exc:
        render({"crdCheck": "always"}, api_versions=())
    assert "certManager.enabled=true needs cert-manager (cert-manager.io/v1" in exc.value.stderr
    # Served APIs, or no check offline (auto), or checks off: renders.
    render(keda)
    render({**keda, "crdCheck": "auto"}, api_versions=())
    render({**keda, "crdCheck": "never"}, api_versions=())
    render({"crdCheck": "always", "certManager": {"enabled": False}}, api_versions=())
