"""helm lint/template over value combinations, and the structure of the rendered objects."""

from __future__ import annotations

import base64

import pytest

from testbed.framework.chart import COMBOS, NAMESPACE, RELEASE, TWO_MAPPINGS, by_kind, mapping, one

INJ = f"{RELEASE}-injection-webhook"
SCL = f"{RELEASE}-scaling-webhook"
# Each component's ports (the services' own defaults): container port = Service port = clientConfig port.
PORTS = {"injection-webhook": {"https": 8443, "metrics": 8080}, "scaling-webhook": {"https": 8444, "metrics": 8081}}


@pytest.mark.parametrize("combo", list(COMBOS))
def test_lint_strict(lint, combo):
    lint(COMBOS[combo])


@pytest.mark.parametrize("combo", list(COMBOS))
def test_every_object_is_well_formed(render, combo):
    objects = render(COMBOS[combo])
    assert objects
    seen = set()
    for o in objects:
        assert o.get("apiVersion") and o.get("kind") and o["metadata"].get("name"), o
        key = (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        assert key not in seen, f"duplicate object {key}"
        seen.add(key)


def test_components_can_be_enabled_alone(render):
    inj = render(COMBOS["only-injection"])
    assert [d["metadata"]["name"] for d in by_kind(inj, "Deployment")] == [INJ]
    assert by_kind(inj, "MutatingWebhookConfiguration") and not by_kind(inj, "ValidatingWebhookConfiguration")
    assert not by_kind(inj, "ConfigMap")
    scl = render(COMBOS["only-scaling"])
    assert SCL in [d["metadata"]["name"] for d in by_kind(scl, "Deployment")]
    assert INJ not in [d["metadata"]["name"] for d in by_kind(scl, "Deployment")]
    assert by_kind(scl, "ValidatingWebhookConfiguration") and not by_kind(scl, "MutatingWebhookConfiguration")
    both_off = render({"injection": {"enabled": False}, "scaling": {"enabled": False}})
    assert not by_kind(both_off, "Deployment") and not by_kind(both_off, "Certificate")


# ---------------------------------------------------------------- webhook configurations


def test_mutating_webhook(render):
    cfg = one(render(), "MutatingWebhookConfiguration", INJ)
    (wh,) = cfg["webhooks"]
    assert wh["admissionReviewVersions"] == ["v1"]
    assert wh["sideEffects"] == "None"
    assert wh["failurePolicy"] == "Fail"
    assert wh["timeoutSeconds"] == 10
    assert wh["reinvocationPolicy"] == "Never"
    assert wh["clientConfig"]["service"] == {"name": INJ, "namespace": NAMESPACE, "path": "/mutate", "port": 8443}
    (rule,) = wh["rules"]
    assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"]
    assert rule["resources"] == ["secrets"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    (expr,) = wh["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    assert set(expr["values"]) == {"kube-system", NAMESPACE}
    assert [c["name"] for c in wh["matchConditions"]] == ["owned-by-metal3data", "has-metadata-key"]


def test_validating_webhook(render):
    cfg = one(render(TWO_MAPPINGS), "ValidatingWebhookConfiguration", SCL)
    (wh,) = cfg["webhooks"]
    assert wh["admissionReviewVersions"] == ["v1"]
    assert wh["sideEffects"] == "None"  # the admission writes nothing: the leader follows the stored mirror
    assert wh["failurePolicy"] == "Ignore"
    assert wh["timeoutSeconds"] == 5
    assert wh["clientConfig"]["service"] == {"name": SCL, "namespace": NAMESPACE, "path": "/validate", "port": 8444}
    assert wh["rules"] == [
        {
            "apiGroups": ["apps"],
            "apiVersions": ["v1"],
            "resources": [resources],
            "operations": ["UPDATE"],
            "scope": "Namespaced",
        }
        for resources in ("deployments/scale", "deployments")
    ]
    # What the match lets through: tests/chart/test_scaling_match.py.
    assert [c["name"] for c in wh["matchConditions"]] == ["is-mapped-mirror"]


def test_policies_and_exemptions_are_configurable(render):
    objs = render(
        {
            "injection": {"failurePolicy": "Ignore", "timeoutSeconds": 3, "extraExemptNamespaces": ["infra"]},
            "scaling": {"failurePolicy": "Fail", "timeoutSeconds": 2},
        }
    )
    (m,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    (v,) = one(objs, "ValidatingWebhookConfiguration")["webhooks"]
    assert (m["failurePolicy"], m["timeoutSeconds"], v["failurePolicy"], v["timeoutSeconds"]) == (
        "Ignore",
        3,
        "Fail",
        2,
    )
    assert set(m["namespaceSelector"]["matchExpressions"][0]["values"]) == {"kube-system", NAMESPACE, "infra"}


# ---------------------------------------------------------------- TLS


def test_cert_manager_chain(render):
    objs = render()
    issuers = {i["metadata"]["name"]: i for i in by_kind(objs, "Issuer")}
    certs = {c["metadata"]["name"]: c for c in by_kind(objs, "Certificate")}
    assert not by_kind(objs, "ClusterIssuer")
    selfsigned = issuers[f"{RELEASE}-selfsigned"]
    assert selfsigned["spec"] == {"selfSigned": {}}
    ca = certs[f"{RELEASE}-ca"]
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["commonName"] == f"{RELEASE}-ca"
    assert ca["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer", "name": f"{RELEASE}-selfsigned"}
    assert ca["spec"]["privateKey"]["algorithm"] == "ECDSA" and ca["spec"]["privateKey"]["size"] == 256
    ca_issuer = issuers[f"{RELEASE}-ca-issuer"]
    assert ca_issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}

    deployments = {d["metadata"]["name"]: d for d in by_kind(objs, "Deployment")}
    configs = {c["kind"]: c for c in objs if c["kind"].endswith("WebhookConfiguration")}
    for svc, cfg_kind in ((INJ, "MutatingWebhookConfiguration"), (SCL, "ValidatingWebhookConfiguration")):
        cert = certs[f"{svc}-serving"]
        spec = cert["spec"]
        assert spec["issuerRef"]["name"] == f"{RELEASE}-ca-issuer" and spec["issuerRef"]["kind"] == "Issuer"
        assert spec.get("isCA") is not True
        assert spec["dnsNames"] == [f"{svc}.{NAMESPACE}.svc", f"{svc}.{NAMESPACE}.svc.cluster.local"]
        assert "server auth" in spec["usages"]
        assert spec["privateKey"]["rotationPolicy"] == "Always"
        assert spec["duration"] == "2160h" and spec["renewBefore"] == "720h"
        # The CA injection annotation names this very Certificate.
        ann = configs[cfg_kind]["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert ann == f"{NAMESPACE}/{cert['metadata']['name']}"
        assert "caBundle" not in configs[cfg_kind]["webhooks"][0]["clientConfig"]
        # ...and the Deployment mounts the Secret the Certificate writes.
        vols = {v["name"]: v for v in deployments[svc]["spec"]["template"]["spec"]["volumes"]}
        assert vols["tls"]["secret"]["secretName"] == spec["secretName"]


HELM_TLS = {"certManager": {"enabled": False}, "selfSignedTLS": {"generator": "helm"}}


def test_self_managed_tls(render):
    """selfSignedTLS.generator=helm: Helm generates the pair and the caBundle at render (certgen: test_certgen.py)."""
    objs = render(HELM_TLS)
    assert not by_kind(objs, "Certificate") and not by_kind(objs, "Issuer")
    secrets = {s["metadata"]["name"]: s for s in by_kind(objs, "Secret")}
    configs = {c["kind"]: c for c in objs if c["kind"].endswith("WebhookConfiguration")}
    for svc, cfg_kind in ((INJ, "MutatingWebhookConfiguration"), (SCL, "ValidatingWebhookConfiguration")):
        secret = secrets[f"{svc}-tls"]
        assert secret["type"] == "kubernetes.io/tls"
        assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
        cfg = configs[cfg_kind]
        assert "cert-manager.io/inject-ca-from" not in (cfg["metadata"].get("annotations") or {})
        ca_bundle = cfg["webhooks"][0]["clientConfig"]["caBundle"]
        assert ca_bundle == secret["data"]["ca.crt"]
        assert base64.b64decode(ca_bundle).startswith(b"-----BEGIN CERTIFICATE-----")
    # One CA for both webhooks.
    assert secrets[f"{INJ}-tls"]["data"]["ca.crt"] == secrets[f"{SCL}-tls"]["data"]["ca.crt"]


def test_self_managed_cert_is_valid_for_the_service(render):
    x509 = pytest.importorskip("cryptography.x509")
    objs = render(HELM_TLS)
    secret = one(objs, "Secret", f"{INJ}-tls")
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{INJ}.{NAMESPACE}.svc" in sans and f"{INJ}.{NAMESPACE}.svc.cluster.local" in sans
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)


# ---------------------------------------------------------------- workloads

HARDENED = {"runAsNonRoot": True, "runAsUser": 65532, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}


def _check_hardened(pod_spec, container):
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    for key, value in HARDENED.items():
        assert sc[key] == value, key
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("svc,command", [(INJ, "injection-webhook"), (SCL, "scaling-webhook")])
def test_webhook_deployment(render, svc, command):
    objs = render(TWO_MAPPINGS)
    dep = one(objs, "Deployment", svc)
    spec = dep["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == [command]
    assert c["image"] == "localhost/slime:0.2.0"  # what the documented build makes (docs/install.md, "The image")
    _check_hardened(pod, c)
    assert pod["serviceAccountName"] == svc
    assert c["resources"]["requests"] and c["resources"]["limits"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == PORTS[command]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    sleep = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and 0 < int(sleep[1]) < pod["terminationGracePeriodSeconds"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/tls"]["readOnly"] is True and "/tmp" in mounts
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols[mounts["/tmp"]["name"]]
    env = {e["name"]: e for e in c["env"]}
    assert env["SLIME_CERT_FILE"]["value"] == "/tls/tls.crt" and env["SLIME_KEY_FILE"]["value"] == "/tls/tls.key"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    if command == "injection-webhook":
        assert (
            env["SLIME_CONTROLLER_SELECTOR"]["value"]
            == "app.kubernetes.io/name=slurmctld,app.kubernetes.io/component=controller"
        )
        assert (
            env["SLIME_CONF_SERVER_POLICY"]["value"],
            env["SLIME_CONF_SERVER_NODE_ADDRESSES"]["value"],
            env["SLIME_EXTRA_JOIN_DATA"]["value"],
        ) == ("hostIP", "", "")
    else:
        assert env["SLIME_CONFIG_MAP"]["value"] == "scaling-webhook-configmap"
        assert env["SLIME_RESYNC_SECONDS"]["value"] == "30"
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]

    pdb = one(objs, "PodDisruptionBudget", svc)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]

    service = one(objs, "Service", svc)
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    # Service port = container port (the named one), so an ExternalName Service reaches it too.
    exposed = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert exposed == {name: (port, name) for name, port in PORTS[command].items()}
    one(objs, "ServiceAccount", svc)


def test_conf_server_values_reach_the_process_and_it_accepts_them(render):
    from injection_webhook.settings import InjectionSettings

    objs = render(
        {
            "injection": {
                "confServer": {"policy": "service", "nodeAddresses": ["192.0.2.21", "k8s-2.example.org"]},
                "extraJoinData": ["controller-name", "jwt-key"],
                "jwtKeySecretNames": ["slurm-auth-jwths256"],
                "slurmBindings": ["metal3=slurm", "*=workload:slurm"],
                "templateOptIns": ["controller-name"],
            }
        }
    )
    (c,) = one(objs, "Deployment", INJ)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"] if e["name"].startswith("SLIME_")}
    assert env["SLIME_CONF_SERVER_POLICY"] == "service"
    assert env["SLIME_CONF_SERVER_NODE_ADDRESSES"] == "192.0.2.21,k8s-2.example.org"
    assert env["SLIME_EXTRA_JOIN_DATA"] == "controller-name,jwt-key"
    settings = InjectionSettings(
        conf_server_policy=env["SLIME_CONF_SERVER_POLICY"],
        conf_server_node_addresses=env["SLIME_CONF_SERVER_NODE_ADDRESSES"],
        extra_join_data=env["SLIME_EXTRA_JOIN_DATA"],
        slurm_bindings=env["SLIME_SLURM_BINDINGS"],
        template_opt_ins=env["SLIME_TEMPLATE_OPT_INS"],
    )
    options = settings.join_options()
    assert options.node_addresses == ("192.0.2.21", "k8s-2.example.org") and options.extras == {
        "controller-name",
        "jwt-key",
    }
    assert options.template_opt_ins == {"controller-name"}
    assert str(settings.bindings()) == "metal3=slurm,*=workload:slurm"


def test_single_replica_has_no_pdb(render):
    objs = render({"injection": {"replicas": 1}})
    assert one(objs, "Deployment", INJ)["spec"]["replicas"] == 1
    assert INJ not in [p["metadata"]["name"] for p in by_kind(objs, "PodDisruptionBudget")]


def test_scaling_configmap(render):
    import yaml

    cm = one(render(TWO_MAPPINGS), "ConfigMap", "scaling-webhook-configmap")
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert yaml.safe_load(cm["data"]["mappings"]) == [
        {"mirror": f"{NAMESPACE}/mirror-a", "machineDeployment": "metal3/md-a", "maxReplicas": 10},
        {"mirror": "mirrors/mirror-b", "machineDeployment": "metal3-b/md-b", "maxReplicas": 4},
    ]
    empty = one(render(), "ConfigMap", "scaling-webhook-configmap")
    assert yaml.safe_load(empty["data"]["mappings"]) == []
    keda = one(render(COMBOS["keda"]), "ConfigMap", "scaling-webhook-configmap")
    assert [i.get("maxReplicas") for i in yaml.safe_load(keda["data"]["mappings"])] == [10, 4]
    custom = render(
        {
            "scaling": {
                "configMapName": "my-map",
                "mappings": [mapping("a/m", "b/d", config={"capacityAware": True})],
            }
        }
    )
    cm = one(custom, "ConfigMap", "my-map")
    assert yaml.safe_load(cm["data"]["mappings"]) == [
        {"mirror": "a/m", "machineDeployment": "b/d", "capacityAware": True}
    ]
    env = {
        e["name"]: e.get("value")
        for e in one(custom, "Deployment", SCL)["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SLIME_CONFIG_MAP"] == "my-map"


def test_mirror_deployments(render):
    objs = render(TWO_MAPPINGS)
    mirrors = {
        d["metadata"]["name"]: d
        for d in by_kind(objs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "mirror"
    }
    assert set(mirrors) == {"mirror-a", "mirror-b"}
    assert mirrors["mirror-b"]["metadata"]["namespace"] == "mirrors"
    for name, dep in mirrors.items():
        assert "replicas" not in dep["spec"], "KEDA owns the mirror's replicas"
        labels = dep["metadata"]["labels"]
        assert labels["slime/mirror"] == name and labels["slime/machine-deployment"].startswith("md-")
        # The adoption mark is the scaling leader's to set, after it copied the MachineDeployment's replicas.
        assert "slime/machine-deployment" not in (dep["metadata"].get("annotations") or {})
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["image"] == "registry.k8s.io/pause:3.10"
        assert c["resources"]["requests"] == {"cpu": "1m", "memory": "4Mi"}
        _check_hardened(pod, c)
        assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert not [
        d
        for d in by_kind(render({"scaling": {**TWO_MAPPINGS["scaling"], "createMirrors": False}}), "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "mirror"
    ]


# ---------------------------------------------------------------- KEDA


def test_no_scaledobjects_by_default(render):
    assert not by_kind(render(TWO_MAPPINGS), "ScaledObject")


def test_scaledobjects(render):
    objs = render(COMBOS["keda"])
    sos = {s["metadata"]["name"]: s for s in by_kind(objs, "ScaledObject")}
    assert set(sos) == {"mirror-a", "mirror-b"}
    a, b = sos["mirror-a"], sos["mirror-b"]
    assert a["metadata"]["namespace"] == NAMESPACE and b["metadata"]["namespace"] == "mirrors"
    assert a["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "mirror-a"}
    assert (
        a["spec"]["pollingInterval"],
        a["spec"]["cooldownPeriod"],
        a["spec"]["minReplicaCount"],
        a["spec"]["maxReplicaCount"],
    ) == (30, 300, 0, 10)
    assert b["spec"]["maxReplicaCount"] == 4  # per-mapping override
    (trig,) = a["spec"]["triggers"]
    assert trig["type"] == "prometheus"
    assert trig["metadata"]["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    assert trig["metadata"]["query"] == (
        '(sum(slurm_partition_jobs_running{partition="partition-a"}) or vector(0)) + '
        '(sum(slurm_partition_jobs_pending{partition="partition-a"}) >= 1 or vector(0))'
    )
    assert trig["metadata"]["threshold"] == "1"


def test_scaledobject_knobs_and_exporter_metric_names(render):
    values = {
        "keda": {
            "enabled": True,
            "pendingThreshold": 3,
            "pollingInterval": 15,
            "cooldownPeriod": 600,
            "minReplicaCount": 1,
            "maxReplicaCount": 20,
            "serverAddress": "http://prom:9090",
            "metrics": {
                "pending": "slurm_partition_jobs_pending_total",
                "running": "slurm_partition_jobs_running_total",
            },
            "triggerMetadata": {"unsafeSsl": True},
        },
        "scaling": {
            "mappings": [
                mapping("s/m1", "d/md1", "gpu"),
                mapping("s/m2", "d/md2", "cpu", keda={"query": "sum(x)", "maxReplicaCount": 2}),
                mapping("s/m3", "d/md3", "off", keda={"enabled": False}, maxReplicas=3),
            ]
        },
    }
    sos = {s["metadata"]["name"]: s for s in by_kind(render(values), "ScaledObject")}
    assert set(sos) == {"m1", "m2"}
    m1 = sos["m1"]
    assert (
        m1["spec"]["pollingInterval"],
        m1["spec"]["cooldownPeriod"],
        m1["spec"]["minReplicaCount"],
        m1["spec"]["maxReplicaCount"],
    ) == (15, 600, 1, 20)
    meta = m1["spec"]["triggers"][0]["metadata"]
    assert meta["query"] == (
        '(sum(slurm_partition_jobs_running_total{partition="gpu"}) or vector(0)) + '
        '(sum(slurm_partition_jobs_pending_total{partition="gpu"}) >= 3 or vector(0))'
    )
    assert meta["serverAddress"] == "http://prom:9090" and meta["unsafeSsl"] == "true"
    assert sos["m2"]["spec"]["triggers"][0]["metadata"]["query"] == "sum(x)"
    assert sos["m2"]["spec"]["maxReplicaCount"] == 2


# ---------------------------------------------------------------- mappings: maxReplicas, one writer


def _items(objs):
    import yaml

    return {
        i["mirror"]: i for i in yaml.safe_load(one(objs, "ConfigMap", "scaling-webhook-configmap")["data"]["mappings"])
    }


def test_max_replicas_follows_keda_or_the_explicit_value(render):
    values = {
        "keda": {"enabled": True, "maxReplicaCount": 8},
        "scaling": {
            "mappings": [
                mapping("s/keda-default", "d/md1", "p1"),
                mapping("s/keda-override", "d/md2", "p2", keda={"maxReplicaCount": 5}),
                mapping("s/explicit-lower", "d/md3", "p3", maxReplicas=2),
                mapping("s/explicit-equal", "d/md4", "p4", maxReplicas=8),
                mapping("s/explicit-zero", "d/md5", "p5", maxReplicas=0),
                mapping("s/keda-off-capacity", "d/md6", keda={"enabled": False}, config={"capacityAware": True}),
                mapping("s/keda-off-explicit", "d/md7", keda={"enabled": False, "maxReplicaCount": 1}, maxReplicas=30),
            ]
        },
    }
    items = _items(render(values))
    assert {m: i.get("maxReplicas") for m, i in items.items()} == {
        "s/keda-default": 8,
        "s/keda-override": 5,
        "s/explicit-lower": 2,
        "s/explicit-equal": 8,
        "s/explicit-zero": 0,
        "s/keda-off-capacity": None,
        "s/keda-off-explicit": 30,
    }
    assert "maxReplicas" not in items["s/keda-off-capacity"]  # capped by the hosts that can take it
    # Without KEDA: only explicit values appear.
    plain = _items(render({"scaling": {"mappings": [mapping("s/b", "d/b", maxReplicas=3)]}}))
    assert plain["s/b"]["maxReplicas"] == 3
    # The ScaledObject's maximum is the KEDA one, untouched by an explicit lower maxReplicas.
    sos = {s["metadata"]["name"]: s for s in by_kind(render(values), "ScaledObject")}
    assert sos["explicit-lower"]["spec"]["maxReplicaCount"] == 8


def test_per_mapping_keda_overrides_win_even_when_zero(render):
    values = {
        "keda": {
            "enabled": True,
            "minReplicaCount": 1,
            "cooldownPeriod": 300,
            "triggerMetadata": {"unsafeSsl": True, "namespace": "mon"},
        },
        "scaling": {
            "mappings": [
                mapping(
                    "s/m",
                    "d/md",
                    "p",
                    keda={
                        "minReplicaCount": 0,
                        "cooldownPeriod": 0,
                        "metrics": {"pending": "x_pending"},
                        "triggerMetadata": {"unsafeSsl": False},
                    },
                )
            ]
        },
    }
    (so,) = by_kind(render(values), "ScaledObject")
    assert (so["spec"]["minReplicaCount"], so["spec"]["cooldownPeriod"]) == (0, 0)
    meta = so["spec"]["triggers"][0]["metadata"]
    assert meta["unsafeSsl"] == "false" and meta["namespace"] == "mon"  # merged one level deep
    assert "x_pending{" in meta["query"] and "slurm_partition_jobs_running{" in meta["query"]


def test_scale_down_stabilization_is_the_hpas_default_unless_set(render):
    """Empty: no `advanced` block, so the HPA keeps its 300 s window;
    set globally or per mapping: KEDA's HPA behavior."""
    values = {
        "keda": {"enabled": True},
        "scaling": {
            "mappings": [
                mapping("s/default", "d/md0", "p"),
                mapping("s/quick", "d/md1", "p", keda={"scaleDownStabilizationSeconds": 0}),
                mapping("s/minute", "d/md2", "p", keda={"scaleDownStabilizationSeconds": "60"}),
            ]
        },
    }
    sos = {s["metadata"]["name"]: s["spec"] for s in by_kind(render(values), "ScaledObject")}
    assert "advanced" not in sos["default"]
    window = {
        name: spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        for name, spec in sos.items()
        if name != "default"
    }
    assert window == {"quick": 0, "minute": 60}


# ---------------------------------------------------------------- node demand (keda.demand=nodes)

NODE_DEMAND = {
    "slurmrestd": "http://slurm-restapi.slurm:6820",
    "jwtSecret": {"name": "slurm-auth-jwths256", "namespace": "slurm"},
}


def test_node_demand_points_keda_at_the_scaling_webhook_and_the_mapping_publishes_it(render):
    import yaml

    from scaling_webhook.mappings import parse_mappings

    safe = {"safeScaleIn": {"slurmrestd": "http://restapi.other:6820", "jwtSecret": "other/jwt"}}
    values = {
        "keda": {"enabled": True, "demand": "nodes"},
        "scaling": {
            "nodeDemand": NODE_DEMAND,
            "mappings": [
                mapping("s/batch", "d/md1", "batch"),
                mapping("s/gpu", "d/md2", "gpu", config=safe),  # shares its safeScaleIn endpoint
                mapping("s/jobs", "d/md3", "debug", keda={"demand": "jobs"}),
            ],
        },
    }
    objs = render(values)
    sos = {s["metadata"]["name"]: s for s in by_kind(objs, "ScaledObject")}
    (trigger,) = sos["batch"]["spec"]["triggers"]
    assert trigger == {
        "type": "metrics-api",
        "metadata": {
            "url": f"http://{SCL}.{NAMESPACE}.svc:8081/demand/batch",
            "format": "json",
            "valueLocation": "nodes",
            "targetValue": "1",
        },
    }
    assert sos["jobs"]["spec"]["triggers"][0]["type"] == "prometheus"
    # The ConfigMap the chart renders is one the service accepts, with the partitions published.
    data = one(objs, "ConfigMap", "scaling-webhook-configmap")["data"]
    table = parse_mappings(data, NAMESPACE)
    batch, gpu, jobs = (table.get("s", n) for n in ("batch", "gpu", "jobs"))
    assert batch is not None and batch.node_demand is not None
    assert (batch.node_demand.partition, batch.node_demand.slurmrestd, batch.node_demand.jwt_secret) == (
        "batch",
        "http://slurm-restapi.slurm:6820",
        ("slurm", "slurm-auth-jwths256"),
    )
    assert gpu is not None and gpu.node_demand is not None and gpu.node_demand.slurmrestd == "http://restapi.other:6820"
    assert jobs is not None and jobs.node_demand is None
    assert "nodeDemand" not in {i["mirror"]: i for i in yaml.safe_load(data["mappings"])}["s/jobs"]
    # The scaling webhook may read the one JWT Secret node demand needs.
    role = one(objs, "Role", f"{SCL}-jwt")
    assert role["metadata"]["namespace"] == "slurm"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["slurm-auth-jwths256"], "verbs": ["get"]}
    ]


def test_no_node_demand_no_jwt_secret_access(render):
    values = {
        "keda": {"enabled": True},
        "scaling": {"nodeDemand": NODE_DEMAND, "mappings": [mapping("s/m", "d/md", "p")]},
    }
    assert not [r for r in by_kind(render(values), "Role") if r["metadata"]["name"].endswith("-jwt")]


# ---------------------------------------------------------------- NetworkPolicy

APISERVER_PEERS = [{"ipBlock": {"cidr": "192.0.2.0/28"}}, {"ipBlock": {"cidr": "2001:db8::/64"}}]
PROMETHEUS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
]


def test_no_network_policy_by_default(render):
    assert not by_kind(render(), "NetworkPolicy")


def test_network_policy_per_webhook(render):
    objs = render({"networkPolicy": {"enabled": True, "admissionFrom": APISERVER_PEERS, "metricsFrom": PROMETHEUS}})
    policies = {p["metadata"]["name"]: p for p in by_kind(objs, "NetworkPolicy")}
    assert set(policies) == {INJ, SCL}
    for svc, policy in policies.items():
        assert policy["metadata"]["namespace"] == NAMESPACE
        spec = policy["spec"]
        # Selects exactly that Deployment's pods.
        assert spec["podSelector"] == {"matchLabels": one(objs, "Deployment", svc)["spec"]["selector"]["matchLabels"]}
        assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec
        admission, metrics = spec["ingress"]
        ports = PORTS[f"{svc.removeprefix(f'{RELEASE}-')}"]
        assert admission == {"from": APISERVER_PEERS, "ports": [{"protocol": "TCP", "port": ports["https"]}]}
        assert metrics == {"from": PROMETHEUS, "ports": [{"protocol": "TCP", "port": ports["metrics"]}]}
        # ...and no other pods (not the other webhook, not the mirrors).
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == svc.removeprefix(f"{RELEASE}-")


def test_network_policy_without_metrics_peers_and_custom_ports(render):
    objs = render(
        {
            "injection": {"port": 9443, "metricsPort": 9090},
            "scaling": {"enabled": False},
            "networkPolicy": {"enabled": True, "admissionFrom": APISERVER_PEERS},
        }
    )
    (policy,) = by_kind(objs, "NetworkPolicy")
    assert policy["metadata"]["name"] == INJ
    # Only the admission rule: the metrics port answers nobody but the node (kubelet probes).
    assert policy["spec"]["ingress"] == [{"from": APISERVER_PEERS, "ports": [{"protocol": "TCP", "port": 9443}]}]


def test_custom_ports_are_one_number_end_to_end(render):
    """<component>.port is the container port, SLIME_PORT, the Service port and clientConfig.service.port at once."""
    objs = render({"injection": {"port": 9443, "metricsPort": 9090}, "scaling": {"port": 9444, "metricsPort": 9091}})
    configs = {
        **{c["metadata"]["name"]: c for c in by_kind(objs, "MutatingWebhookConfiguration")},
        **{c["metadata"]["name"]: c for c in by_kind(objs, "ValidatingWebhookConfiguration")},
    }
    for svc, (port, metrics) in ((INJ, (9443, 9090)), (SCL, (9444, 9091))):
        (c,) = one(objs, "Deployment", svc)["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert (env["SLIME_PORT"], env["SLIME_METRICS_PORT"]) == (str(port), str(metrics))
        assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"https": port, "metrics": metrics}
        exposed = {p["name"]: p["port"] for p in one(objs, "Service", svc)["spec"]["ports"]}
        assert exposed == {"https": port, "metrics": metrics}
        assert configs[svc]["webhooks"][0]["clientConfig"]["service"]["port"] == port


def test_network_policy_never_renders_an_allow_all_rule(render):
    """An ingress rule whose `from` is empty or missing admits every source: never render one."""
    for values in (
        {"networkPolicy": {"enabled": True, "admissionFrom": APISERVER_PEERS}},
        {"networkPolicy": {"enabled": True, "admissionFrom": APISERVER_PEERS, "metricsFrom": PROMETHEUS}},
    ):
        for policy in by_kind(render(values), "NetworkPolicy"):
            for rule in policy["spec"]["ingress"]:
                assert rule.get("from") and rule.get("ports"), rule


# ---------------------------------------------------------------- who may scale a mirror


def _scale_requesters(objs):
    env = one(objs, "Deployment", SCL)["spec"]["template"]["spec"]["containers"][0]["env"]
    return next(e["value"] for e in env if e["name"] == "SLIME_SCALE_REQUESTERS").split(",")


KEDA_PAIR = [
    "system:serviceaccount:keda:keda-operator",  # 0 <-> 1
    "system:serviceaccount:kube-system:horizontal-pod-autoscaler",  # 1 <-> N, --use-service-account-credentials
    "system:kube-controller-manager",  # 1 <-> N without it
]


SELF = f"system:serviceaccount:{NAMESPACE}:{SCL}"  # the leader adopts mirrors: it sets their replicas


def test_keda_scaled_mirrors_take_scales_from_keda_and_the_hpa_only(render):
    """Issue 30: KEDA's operator alone would stop every pool at 1; the HPA controller makes the 1 -> N steps."""
    assert _scale_requesters(render(COMBOS["keda"])) == [*KEDA_PAIR, SELF]
    mine = {**COMBOS["keda"], "scaling": {**COMBOS["keda"]["scaling"], "allowedRequesters": ["ci-robot"]}}
    assert _scale_requesters(render(mine)) == ["ci-robot", *KEDA_PAIR, SELF]
    elsewhere = {**COMBOS["keda"], "keda": {"enabled": True, "scaleRequesters": ["system:serviceaccount:ops:keda"]}}
    assert _scale_requesters(render(elsewhere)) == ["system:serviceaccount:ops:keda", SELF]
    rule_off = {**COMBOS["keda"], "keda": {"enabled": True, "scaleRequesters": []}}
    assert _scale_requesters(render(rule_off)) == [""]
    # Without KEDA the chart cannot know who scales: no rule unless you give one (RBAC decides).
    assert _scale_requesters(render(TWO_MAPPINGS)) == [""]
    off = {
        "keda": {"enabled": True},
        "scaling": {"mappings": [mapping("s/m", "d/md", "p", keda={"enabled": False}, maxReplicas=2)]},
    }
    assert _scale_requesters(render(off)) == [""]
