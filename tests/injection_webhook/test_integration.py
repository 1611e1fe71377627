"""The injection webhook end to end: real TLS, real kubernetes client, emulated clusters."""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

import jsonpatch
import pytest

from kubemu import Emulator
from testbed.components.services import StartInjection
from testbed.framework.objects import b64, kubeconfig_secret, metadata_secret, slinky_controller
from testbed.framework.reviews import denial, injected, mutate, secret_request
from testbed.framework.world import seed_metal3, seed_nodeport, seed_slinky

OPT_IN = {"slurm-controller-namespace": "slurm"}


@pytest.mark.parametrize(
    "template_owner", [True, False], ids=["capm3<=1.13-template-owner", "capm3>=1.14-spec-template-name"]
)
@pytest.mark.parametrize("served", [["v1beta1"], ["v1beta2"], ["v1beta1", "v1beta2"]], ids=lambda v: "+".join(v))
def test_injects_join_data_for_both_capm3_chains_and_versions(
    emulator_factory: Any, start_injection: StartInjection, template_owner: bool, served: list[str]
) -> None:
    emu: Emulator = emulator_factory(served={"infrastructure.cluster.x-k8s.io": served})
    slurm = seed_slinky(emu)
    _, data = seed_metal3(emu, template_labels=OPT_IN, version=served[-1], template_owner=template_owner)
    service = start_injection(emu)
    content = injected(mutate(service, metadata_secret(data)))
    assert content == {
        "local-hostname": "m3m-0",
        "providerid": "metal3/bmh-0/m3m-0",
        "slurm_controller_host": "192.0.2.10",
        "slurm_controller_port": "6817",
        "slurm_conf_server": "192.0.2.10:6817",
        "slurm_key_base64": b64(slurm.key),
        # the names Slinky's slurm.conf gives slurmctld, for the node's /etc/hosts
        "slurm_hosts_base64": b64(
            b"192.0.2.10 slurm-controller-0.slurm-controller-internal.slurm slurm-controller-0 slurm-controller.slurm\n"
        ),
        "slurm_node_conf": "",  # the template names no NodeSet feature
    }
    assert base64.b64decode(content["slurm_key_base64"]) == slurm.key


def test_nodeport_service_sets_the_port(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    seed_nodeport(emulator, "slurm", "slurm", node_port=31817)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    content = injected(mutate(start_injection(emulator), metadata_secret(data)))
    assert (content["slurm_controller_port"], content["slurm_conf_server"]) == ("31817", "192.0.2.10:31817")


def test_nodeport_matched_by_named_target_port(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    seed_nodeport(emulator, "slurm", "slurm", node_port=30999, target="slurmctld")
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    assert injected(mutate(start_injection(emulator), metadata_secret(data)))["slurm_controller_port"] == "30999"


def test_custom_slurm_key_ref(emulator: Emulator, start_injection: StartInjection) -> None:
    slurm = seed_slinky(emulator, key_ref={"name": "my-slurm-key", "key": "custom.key"})
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    content = injected(mutate(start_injection(emulator), metadata_secret(data)))
    assert base64.b64decode(content["slurm_key_base64"]) == slurm.key


def test_v1alpha1_controller_and_custom_selector(emulator_factory: Any, start_injection: StartInjection) -> None:
    emu = emulator_factory(served={"slinky.slurm.net": ["v1alpha1"]})
    old_labels = {
        "app.kubernetes.io/name": "slurm-ctld",
        "app.kubernetes.io/component": "controller",
        "app.kubernetes.io/instance": "slurm",
    }
    seed_slinky(emu, controller_version="v1alpha1", labels=old_labels)
    _, data = seed_metal3(emu, template_labels=OPT_IN)
    default = start_injection(emu)
    assert "no slurmctld pod matches app.kubernetes.io/name=slurmctld" in denial(mutate(default, metadata_secret(data)))
    custom = start_injection(
        emu, controller_selector="app.kubernetes.io/name=slurm-ctld,app.kubernetes.io/component=controller"
    )
    assert injected(mutate(custom, metadata_secret(data)))["slurm_controller_host"] == "192.0.2.10"


def test_not_opted_in_is_allowed_without_patch(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels={})
    response = mutate(start_injection(emulator), metadata_secret(data))
    assert response["allowed"] is True and "patch" not in response and "status" not in response


def test_already_injected_sends_no_patch(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    secret = metadata_secret(data)
    first = mutate(service, secret)
    stored = jsonpatch.apply_patch(secret, json.loads(base64.b64decode(first["patch"])))
    again = mutate(service, stored, "UPDATE")
    assert again["allowed"] is True and "patch" not in again


WORKLOAD = {**OPT_IN, "slurm-controller-cluster": "workload"}


def test_workload_cluster_through_kubeconfig_secret(emulator_factory: Any, start_injection: StartInjection) -> None:
    management: Emulator = emulator_factory()
    workload: Emulator = emulator_factory(token="workload-token", workload=True)
    seed_slinky(management, host_ip="198.51.100.1")  # a decoy: must not be used
    slurm = seed_slinky(workload, host_ip="203.0.113.7")
    seed_nodeport(workload, "slurm", "slurm", node_port=32000)
    _, data = seed_metal3(management, cluster="bm-cluster", template_labels=WORKLOAD)
    management.create(kubeconfig_secret(workload.kubeconfig()))
    service = start_injection(management, slurm_bindings="metal3=workload:slurm")
    content = injected(mutate(service, metadata_secret(data)))
    assert content["slurm_conf_server"] == "203.0.113.7:32000"
    assert base64.b64decode(content["slurm_key_base64"]) == slurm.key
    assert workload.count_requests(resource="pods") >= 1


def test_a_kubeconfig_secret_does_not_move_the_lookup_to_the_workload_cluster(
    emulator_factory: Any, start_injection: StartInjection
) -> None:
    management: Emulator = emulator_factory()
    workload: Emulator = emulator_factory(workload=True)
    seed_slinky(management, host_ip="198.51.100.1")
    seed_slinky(workload, host_ip="203.0.113.7")
    _, data = seed_metal3(management, template_labels=OPT_IN)  # no slurm-controller-cluster label
    management.create(kubeconfig_secret(workload.kubeconfig()))  # Cluster API writes one for every Cluster
    service = start_injection(management, slurm_bindings="metal3=slurm,metal3=workload:slurm")
    assert injected(mutate(service, metadata_secret(data)))["slurm_controller_host"] == "198.51.100.1"
    assert workload.count_requests() == 0


def test_cluster_label_local_ignores_the_kubeconfig(emulator_factory: Any, start_injection: StartInjection) -> None:
    management: Emulator = emulator_factory()
    seed_slinky(management, host_ip="198.51.100.1")
    _, data = seed_metal3(management, template_labels={**OPT_IN, "slurm-controller-cluster": "local"})
    management.create(kubeconfig_secret("apiVersion: v1\nkind: Config\nclusters: []\n"))
    assert (
        injected(mutate(start_injection(management), metadata_secret(data)))["slurm_controller_host"] == "198.51.100.1"
    )


def test_a_cluster_label_naming_another_cluster_is_denied(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels={**OPT_IN, "slurm-controller-cluster": "other"})
    assert denial(mutate(start_injection(emulator), metadata_secret(data))) == (
        "cannot inject Slurm join data into Secret metal3/m3m-0-metadata: Metal3DataTemplate metal3/workers-template "
        "has an invalid label slurm-controller-cluster: it names cluster 'other', but a template chooses only 'local' "
        "(the default: the management cluster) or 'workload' (each Metal3Data's own Cluster, here bm-cluster)"
    )


def test_unreachable_workload_cluster_is_denied_within_budget(
    emulator_factory: Any, start_injection: StartInjection
) -> None:
    management: Emulator = emulator_factory()
    gone: Emulator = emulator_factory(workload=True)
    kubeconfig = gone.kubeconfig()
    gone.stop()
    _, data = seed_metal3(management, template_labels=WORKLOAD)
    management.create(kubeconfig_secret(kubeconfig))
    service = start_injection(management, cache_sync_timeout_seconds=2.0, slurm_bindings="metal3=workload:slurm")
    started = time.monotonic()
    message = denial(mutate(service, metadata_secret(data)))
    assert time.monotonic() - started < 5
    assert "cannot reach cluster metal3/bm-cluster" in message or "from cluster metal3/bm-cluster" in message, message


CASES = {
    "no Controller": (
        dict(with_controller=False),
        "Controller slurm/slurm (slinky.slurm.net) does not exist (namespace slurm of cluster local)",
    ),
    "pod pending": (
        dict(phase="Pending"),
        "slurmctld pod slurm/slurm-controller-0 is Pending, not Running (cluster local)",
    ),
    "no hostIP": (dict(host_ip=""), "slurmctld pod slurm/slurm-controller-0 has no status.hostIP yet (cluster local)"),
    "no key Secret": (
        dict(with_key_secret=False),
        "Secret slurm/slurm-auth-slurm (slurm key of Controller slurm/slurm) does not exist in cluster local",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_opted_in_but_unresolvable_is_denied_naming_what_is_missing(
    emulator: Emulator, start_injection: StartInjection, case: str
) -> None:
    options, reason = CASES[case]
    seed_slinky(emulator, **options)  # type: ignore[arg-type]
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    assert (
        denial(mutate(start_injection(emulator), metadata_secret(data)))
        == f"cannot inject Slurm join data into Secret metal3/m3m-0-metadata: {reason}"
    )


def test_no_slurmctld_pod_is_denied(emulator: Emulator, start_injection: StartInjection) -> None:
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    assert denial(mutate(start_injection(emulator), metadata_secret(data))).endswith(
        "no slurmctld pod matches app.kubernetes.io/name=slurmctld,app.kubernetes.io/component=controller in "
        "namespace slurm of cluster local"
    )


def test_missing_metal3data_and_template_are_denied(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    orphan = metadata_secret(data)
    orphan["metadata"]["ownerReferences"][0]["name"] = "gone-7"
    emulator.clear_requests()
    # A name the cache does not hold gets the answer every unverified owner gets, and no API
    # request names it (no live read on a review's behalf).
    assert denial(mutate(service, orphan)).endswith(
        "its owner reference does not name a Metal3Data SliMe can verify "
        "(CAPM3 creates this Secret owned by its Metal3Data, with that Metal3Data's uid)"
    )
    assert not [r for r in emulator.requests if "gone-7" in r.path]
    _, data2 = seed_metal3(emulator, template="no-such-template", index=3, template_owner=False)
    emulator.delete("infrastructure.cluster.x-k8s.io/v1beta1", "Metal3DataTemplate", "metal3", "no-such-template")
    assert denial(mutate(service, metadata_secret(data2, machine="m3m-3"))).endswith(
        "Metal3DataTemplate metal3/no-such-template (template of Metal3Data metal3/no-such-template-3) does not exist"
    )


def test_several_controllers_need_a_name_label(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator, controller="alpha", host_ip="192.0.2.1")
    seed_slinky(emulator, controller="beta", host_ip="192.0.2.2")
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    _, named = seed_metal3(
        emulator, template="beta-workers", template_labels={**OPT_IN, "slurm-controller-name": "beta"}
    )
    service = start_injection(emulator)
    assert "runs several Slinky Controllers (alpha, beta); choose one with label slurm-controller-name" in denial(
        mutate(service, metadata_secret(data))
    )
    assert injected(mutate(service, metadata_secret(named, machine="m3m-b")))["slurm_controller_host"] == "192.0.2.2"


def test_zero_api_calls_per_warm_admission(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    seed_nodeport(emulator, "slurm", "slurm")
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    injected(mutate(service, metadata_secret(data)))  # warms the per-namespace caches
    # Each cache lists, then opens its watch from its own thread; let every watch be open
    # before counting, since a watch opening is the cache's work, not an admission's.
    deadline = time.monotonic() + 5
    while emulator.count_requests(verb="watch") < emulator.count_requests(verb="list"):
        assert time.monotonic() < deadline, "caches did not open their watches"
        time.sleep(0.01)
    emulator.clear_requests()
    for i in range(20):
        injected(mutate(service, metadata_secret(data, machine=f"m3m-{i}")))
    assert emulator.requests == []


def test_slurmctld_moving_host_is_picked_up_within_seconds(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    assert injected(mutate(service, metadata_secret(data)))["slurm_controller_host"] == "192.0.2.10"
    pod = emulator.get("v1", "Pod", "slurm", "slurm-controller-0")
    pod["status"]["hostIP"] = "192.0.2.77"
    emulator.update(pod)
    started = time.monotonic()
    while injected(mutate(service, metadata_secret(data)))["slurm_controller_host"] != "192.0.2.77":
        assert time.monotonic() - started < 2.0, "pod move not seen within 2 s"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "request_body",
    [
        {
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "object": {"data": {"metaData": "eA=="}},
        },
        {"operation": "DELETE", "kind": {"group": "", "version": "v1", "kind": "Secret"}, "object": None},
        {
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Secret"},
            "object": {"metadata": {}, "data": {}},
        },
        {"operation": "CREATE", "kind": "Secret", "object": []},
        {"operation": 7, "kind": None},
        {},
    ],
    ids=["configmap", "delete", "plain-secret", "kind-string", "wrong-types", "empty-request"],
)
def test_requests_that_are_not_ours_are_allowed_untouched(
    emulator: Emulator, start_injection: StartInjection, request_body: dict[str, Any]
) -> None:
    response = start_injection(emulator).review("/mutate", request_body)
    assert response["allowed"] is True and "patch" not in response and "status" not in response


def test_certificate_rotation_while_serving(emulator: Emulator, start_injection: StartInjection, pki: Any) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    from testbed.components.harness import fingerprint_of, served_fingerprint

    new = pki.issue()
    started = time.monotonic()
    while served_fingerprint(service) != fingerprint_of(new):
        injected(mutate(service, metadata_secret(data)))
        assert time.monotonic() - started < 15
    injected(mutate(service, metadata_secret(data)))


def test_the_key_never_reaches_logs_or_errors(
    emulator: Emulator, start_injection: StartInjection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    slurm = seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    injected(mutate(service, metadata_secret(data)))
    bad = metadata_secret(data)
    bad["data"]["metaData"] = b64("[not a map")
    error = service.review("/mutate", secret_request(bad))
    from common.logs import JsonFormatter

    formatter = JsonFormatter()
    text = "\n".join(formatter.format(r) for r in caplog.records) + json.dumps(error)
    import httpx

    text += httpx.get(f"{service.metrics_url}/metrics").text
    for needle in (slurm.key.decode(), b64(slurm.key)):
        assert needle not in text


def test_a_large_metadata_is_edited_off_the_event_loop_and_an_oversized_one_refused(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    many = {f"key_{i:04d}": "v" * 600 for i in range(500)}  # ~300 KiB: edited in a worker thread, under 1000 keys
    large = metadata_secret(data, extra=many)
    content = injected(mutate(service, large))
    assert {k: content[k] for k in many} == many and content["slurm_conf_server"] == "192.0.2.10:6817"
    oversized = metadata_secret(data)
    oversized["data"]["metaData"] = b64("a: " + "x" * (1024 * 1024) + "\n")
    # A body over --max-body-bytes (1 MiB) is refused on its Content-Length, before it is read:
    # so without the request's uid.
    body = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u-big", **secret_request(oversized)},
        }
    ).encode()
    response = service.post("/mutate", body).json()["response"]
    assert response["allowed"] is False and response["status"]["code"] == 413, response
    assert response["status"]["message"] == "request entity is too large; limit is 1048576 bytes"


def test_a_template_choosing_an_external_controller_is_told_so(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    """Slinky v1.1: a Controller with ``spec.external: true`` stands for a slurmctld outside Kubernetes. SliMe
    joins hosts only to a slurmctld Slinky runs, and says which Controller is external and where it points."""
    seed_slinky(emulator)
    external = slinky_controller(
        "outside", "slurm", "v1beta1", {"external": True, "externalConfig": {"host": "ctld.example.org", "port": 6817}}
    )
    emulator.create(external)
    _, data = seed_metal3(emulator, template_labels={**OPT_IN, "slurm-controller-name": "outside"})
    message = denial(mutate(start_injection(emulator), metadata_secret(data)))
    assert "Controller slurm/outside is external (spec.external: true, slurmctld at 'ctld.example.org:6817'" in message
    assert "SliMe joins hosts only to a slurmctld that Slinky runs in the cluster" in message
