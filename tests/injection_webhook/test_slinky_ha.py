"""Slinky >= 1.3 (issue 24): several slurmctld pods, the active one labelled; slurm.conf names them by cluster DNS;
partitions built from NodeSets by feature. End to end: real TLS, real AdmissionReview, kubemu.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kubemu import Emulator
from testbed.components.serve import RunningService
from testbed.components.services import StartInjection
from testbed.framework.objects import decoded_metadata, metadata_secret
from testbed.framework.reviews import secret_request
from testbed.framework.wait import wait_for
from testbed.framework.world import assign_ingress, fail_over, seed_loadbalancer, seed_metal3, seed_slinky

OPT_IN = {"slurm-controller-namespace": "slurm"}
PREFIX = "cannot inject Slurm join data into Secret metal3/m3m-0-metadata: "
NAMES = (
    "slurm-controller-0.slurm-controller-internal.slurm slurm-controller-0 "
    "slurm-controller-1.slurm-controller-internal.slurm slurm-controller-1 "
    "slurm-controller-2.slurm-controller-internal.slurm slurm-controller-2 slurm-controller.slurm"
)


def review(service: RunningService, secret: dict[str, Any]) -> dict[str, Any]:
    return service.review("/mutate", secret_request(secret))


def injected(response: dict[str, Any]) -> dict[str, str]:
    assert response["allowed"] is True and response.get("patchType") == "JSONPatch", response
    return decoded_metadata(json.loads(base64.b64decode(response["patch"]))[0]["value"])


def hosts(content: dict[str, str]) -> str:
    return base64.b64decode(content["slurm_hosts_base64"]).decode()


def test_the_active_controller_is_followed_across_failovers(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    slurm = seed_slinky(emulator, standby_host_ips=("192.0.2.11", "192.0.2.12"))
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator)
    first = injected(review(service, metadata_secret(data)))
    assert first["slurm_conf_server"] == "192.0.2.10:6817"
    # Every name slurm.conf may give slurmctld maps to the address the node is given.
    assert hosts(first) == f"192.0.2.10 {NAMES}\n"
    fail_over(emulator, slurm, 2)  # the pod on 192.0.2.12 takes over: new nodes follow it
    wait_for(
        lambda: injected(review(service, metadata_secret(data)))["slurm_conf_server"] == "192.0.2.12:6817",
        5,
        "new nodes pointed at the new active slurmctld",
    )
    assert hosts(injected(review(service, metadata_secret(data)))) == f"192.0.2.12 {NAMES}\n"


def test_no_active_controller_among_several_is_denied(emulator: Emulator, start_injection: StartInjection) -> None:
    slurm = seed_slinky(emulator, standby_host_ips=("192.0.2.11",))
    for pod in emulator.list("v1", "Pod", "slurm"):  # mid-failover: nobody marked active
        pod["metadata"]["labels"].pop("controller.slinky.slurm.net/active", None)
        emulator.update(pod)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    response = review(start_injection(emulator), metadata_secret(data))
    assert response["allowed"] is False
    assert response["status"]["message"] == PREFIX + (
        f"Controller slurm/{slurm.controller} runs several slurmctld pods (slurm-controller-0, slurm-controller-1) "
        "and none is labelled controller.slinky.slurm.net/active=true (a failover in progress?) (cluster local)"
    )


def test_policy_service_uses_the_service_that_routes_to_the_active_pod(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    seed_slinky(emulator, standby_host_ips=("192.0.2.11",))
    name = seed_loadbalancer(emulator, "slurm", "slurm")
    service = emulator.get("v1", "Service", "slurm", name)
    service["spec"]["selector"]["controller.slinky.slurm.net/active"] = "true"  # routes to the active pod only
    emulator.update(service)
    assign_ingress(emulator, "slurm", name, "198.51.100.7")
    _, data = seed_metal3(emulator, template_labels=OPT_IN, template_annotations={"slurm-conf-server": "service"})
    content = injected(review(start_injection(emulator), metadata_secret(data)))
    assert content["slurm_conf_server"] == "198.51.100.7:6817"
    assert hosts(content).startswith("198.51.100.7 slurm-controller-0.slurm-controller-internal.slurm ")


def test_a_dns_name_conf_server_gets_no_hosts_entries(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(
        emulator, template_labels=OPT_IN, template_annotations={"slurm-conf-server": "slurmctld.hpc.example.org"}
    )
    content = injected(review(start_injection(emulator), metadata_secret(data)))
    assert content["slurm_hosts_base64"] == ""  # /etc/hosts cannot map to a DNS name: the site's DNS must


@pytest.mark.parametrize(
    ("annotation", "node_conf"), [("nodeset-a", "Feature=nodeset-a"), ("gpu, nodeset-b", "Feature=gpu,nodeset-b")]
)
def test_the_pool_registers_with_its_nodeset_feature(
    emulator: Emulator, start_injection: StartInjection, annotation: str, node_conf: str
) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN, template_annotations={"slurm-node-features": annotation})
    assert injected(review(start_injection(emulator), metadata_secret(data)))["slurm_node_conf"] == node_conf


def test_an_invalid_feature_is_denied_naming_the_annotation(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN, template_annotations={"slurm-node-features": "a b"})
    response = review(start_injection(emulator), metadata_secret(data))
    assert response["status"]["message"] == PREFIX + (
        "Metal3DataTemplate metal3/workers-template has an invalid annotation slurm-node-features='a b': "
        "'a b' is not a Slurm node feature (letters, digits, '_', '.', '-', at most 63 characters)"
    )
