"""Conf-server address policies and the opt-in join data, end to end: real TLS, real AdmissionReview, kubemu.

Each test seeds a Slinky + CAPM3 world, starts the injection webhook as its console script builds
it, and reviews the metaData Secret CAPM3 would create. A slurmctld "move" is what a reschedule
looks like to the API: the StatefulSet's pod, same name, with another ``status.hostIP``.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import httpx
import jsonpatch
import pytest

from common.logs import REDACTED, JsonFormatter, redactor
from kubemu import Emulator
from testbed.components.services import StartInjection
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import b64, metadata_secret
from testbed.framework.reviews import denial, injected, mutate
from testbed.framework.wait import wait_for
from testbed.framework.world import (
    SlurmCluster,
    assign_ingress,
    move_slurmctld,
    seed_loadbalancer,
    seed_metal3,
    seed_nodeport,
    seed_slinky,
)

OPT_IN = {"slurm-controller-namespace": "slurm"}
PREFIX = "cannot inject Slurm join data into Secret metal3/m3m-0-metadata: "


def template(emu: Emulator, name: str = "workers-template", index: int = 0, **annotations: str) -> dict[str, Any]:
    """An opted-in template with these annotations (``_`` in a keyword is ``-``) and one Metal3Data of it."""
    _, data = seed_metal3(
        emu,
        template=name,
        index=index,
        template_labels=OPT_IN,
        template_annotations={k.replace("_", "-"): v for k, v in annotations.items()},
    )
    return data


def address(content: dict[str, str]) -> tuple[str, str, str]:
    return content["slurm_controller_host"], content["slurm_controller_port"], content["slurm_conf_server"]


# --- hostIP and service: what a slurmctld move does ---------------------------------------------


def test_a_slurmctld_move_changes_the_address_under_hostip_and_not_under_service(
    emulator: Emulator,
    start_injection: StartInjection,
) -> None:
    slurm = seed_slinky(emulator, host_ip="192.0.2.10")
    seed_nodeport(emulator, "slurm", "slurm", node_port=30817)
    lb = seed_loadbalancer(emulator, "slurm", "slurm")
    assign_ingress(emulator, "slurm", lb, ip="203.0.113.50")
    by_hostip = template(emulator, "hostip-workers")  # no annotation: the chart default, hostIP
    by_service = template(emulator, "service-workers", slurm_conf_server="service")
    service = start_injection(emulator)
    first_hostip = metadata_secret(by_hostip, machine="m3m-h")
    first_service = metadata_secret(by_service, machine="m3m-s")
    hostip_before = injected(mutate(service, first_hostip))
    service_response = mutate(service, first_service)
    service_before = injected(service_response)
    assert address(hostip_before) == ("192.0.2.10", "30817", "192.0.2.10:30817")
    assert address(service_before) == ("203.0.113.50", "6817", "203.0.113.50:6817")

    move_slurmctld(emulator, slurm, "192.0.2.77")
    # The hostIP template follows the pod, once the cache has seen the move...
    wait_for(
        lambda: (
            injected(mutate(service, metadata_secret(by_hostip, machine="m3m-h2")))["slurm_controller_host"]
            == "192.0.2.77"
        ),
        10,
        "the hostIP policy to see slurmctld on 192.0.2.77",
    )
    # ...so a node provisioned before the move holds an address that is no longer slurmctld's.
    assert address(hostip_before) != address(injected(mutate(service, first_hostip)))
    # The service template, asked after the same cache saw the move, gives the same address as before,
    # and the Secret injected before the move needs no change at all.
    assert address(injected(mutate(service, metadata_secret(by_service, machine="m3m-s2")))) == address(service_before)
    stored = jsonpatch.apply_patch(first_service, json.loads(base64.b64decode(service_response["patch"])))
    again = mutate(service, stored, "UPDATE")
    assert again["allowed"] is True and "patch" not in again


def test_service_policy_admits_while_slurmctld_is_rescheduling(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    """The Service's address does not depend on the pod's node, so a pod between nodes blocks no provisioning."""
    slurm = seed_slinky(emulator)
    lb = seed_loadbalancer(emulator, "slurm", "slurm")
    assign_ingress(emulator, "slurm", lb, ip="203.0.113.50")
    move_slurmctld(emulator, slurm, "", phase="Pending")
    by_service = template(emulator, slurm_conf_server="service")
    by_hostip = template(emulator, "hostip-workers", index=1)
    service = start_injection(emulator)
    assert address(injected(mutate(service, metadata_secret(by_service)))) == (
        "203.0.113.50",
        "6817",
        "203.0.113.50:6817",
    )
    assert denial(mutate(service, metadata_secret(by_hostip, machine="m3m-1"))).endswith(
        "slurmctld pod slurm/slurm-controller-0 is Pending, not Running (cluster local)"
    )


def test_loadbalancer_pending_is_denied_with_the_reason_then_admitted_when_the_ingress_arrives(
    emulator: Emulator,
    start_injection: StartInjection,
) -> None:
    seed_slinky(emulator)
    lb = seed_loadbalancer(emulator, "slurm", "slurm", port=6817)
    data = template(emulator, slurm_conf_server="service")
    service = start_injection(emulator)
    assert denial(mutate(service, metadata_secret(data))) == PREFIX + (
        "LoadBalancer Service slurm/slurm-controller-lb has no ingress address yet (pending); a node keeps the address "
        "it boots with, so it must not boot before the stable one exists (cluster local)"
    )
    assign_ingress(emulator, "slurm", lb, hostname="slurmctld.hpc.example.org")
    admitted = wait_for(lambda: mutate(service, metadata_secret(data))["allowed"], 10, "the ingress to reach the cache")
    assert admitted
    assert address(injected(mutate(service, metadata_secret(data)))) == (
        "slurmctld.hpc.example.org",
        "6817",
        "slurmctld.hpc.example.org:6817",
    )


def test_service_policy_nodeport_needs_configured_node_addresses(
    emulator_factory: Any, start_injection: StartInjection
) -> None:
    emu: Emulator = emulator_factory()
    seed_slinky(emu)
    seed_nodeport(emu, "slurm", "slurm", node_port=30817)
    data = template(emu, slurm_conf_server="service")
    assert denial(mutate(start_injection(emu), metadata_secret(data))) == PREFIX + (
        "NodePort Service slurm/slurm-controller-nodeport needs stable node addresses to point nodes at, and none are "
        "configured (--conf-server-node-addresses, chart injection.confServer.nodeAddresses) (cluster local)"
    )
    configured = start_injection(emu, conf_server_node_addresses="192.0.2.21, k8s-node-2.hpc.example.org")
    content = injected(mutate(configured, metadata_secret(data)))
    # slurmd --conf-server takes the list and fetches from the first that answers.
    assert address(content) == ("192.0.2.21", "30817", "192.0.2.21:30817,k8s-node-2.hpc.example.org:30817")


def test_service_policy_prefers_a_loadbalancer_and_a_name_picks_the_service(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    seed_slinky(emulator)
    seed_nodeport(emulator, "slurm", "slurm", node_port=30817)
    lb = seed_loadbalancer(emulator, "slurm", "slurm", name="slurmctld-external", port=7817)
    assign_ingress(emulator, "slurm", lb, ip="203.0.113.60")
    auto = template(emulator, "auto-workers", slurm_conf_server="service")
    named = template(emulator, "named-workers", index=1, slurm_conf_server="service/slurm-controller-nodeport")
    missing = template(emulator, "missing-workers", index=2, slurm_conf_server="service/no-such-service")
    service = start_injection(emulator, conf_server_node_addresses="192.0.2.21")
    assert address(injected(mutate(service, metadata_secret(auto)))) == ("203.0.113.60", "7817", "203.0.113.60:7817")
    assert address(injected(mutate(service, metadata_secret(named, machine="m3m-1")))) == (
        "192.0.2.21",
        "30817",
        "192.0.2.21:30817",
    )
    assert denial(mutate(service, metadata_secret(missing, machine="m3m-2"))).endswith(
        "Service slurm/no-such-service (policy service/no-such-service) does not exist (cluster local)"
    )


def test_service_policy_without_a_usable_service_is_denied(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator)
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "slurm-controller", "namespace": "slurm"},
            "spec": {
                "type": "ClusterIP",
                "selector": {"app.kubernetes.io/instance": "slurm"},
                "ports": [{"name": "slurmctld", "port": 6817}],
            },
        }
    )
    data = template(emulator, slurm_conf_server="service")
    pinned = template(emulator, "pinned-workers", index=1, slurm_conf_server="service/slurm-controller")
    service = start_injection(emulator)
    assert denial(mutate(service, metadata_secret(data))) == PREFIX + (
        "no LoadBalancer or NodePort Service in namespace slurm selects slurmctld pod slurm/slurm-controller-0 and "
        "exposes its port 6817 (policy service) (cluster local)"
    )
    assert denial(mutate(service, metadata_secret(pinned, machine="m3m-1"))).endswith(
        "Service slurm/slurm-controller is of type ClusterIP; policy service/slurm-controller needs a LoadBalancer or "
        "NodePort Service (cluster local)"
    )


# --- explicit host[:port] and DNS names ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("slurmctld.hpc.example.org", ("slurmctld.hpc.example.org", "6817", "slurmctld.hpc.example.org:6817")),
        ("slurmctld.hpc.example.org:16817", ("slurmctld.hpc.example.org", "16817", "slurmctld.hpc.example.org:16817")),
        ("198.51.100.7:7000", ("198.51.100.7", "7000", "198.51.100.7:7000")),
        ("[2001:db8::7]:6817", ("2001:db8::7", "6817", "[2001:db8::7]:6817")),
        ("2001:db8::7", ("2001:db8::7", "6817", "[2001:db8::7]:6817")),
    ],
    ids=["dns-name", "dns-name-port", "ipv4-port", "ipv6-bracketed", "ipv6-bare"],
)
def test_explicit_address_is_injected_as_given(
    emulator: Emulator, start_injection: StartInjection, value: str, expected: tuple[str, str, str]
) -> None:
    slurm = seed_slinky(emulator)
    data = template(emulator, slurm_conf_server=value)
    witness = metadata_secret(template(emulator, "witness", index=1), machine="m3m-w")  # policy hostIP
    service = start_injection(emulator)
    assert address(injected(mutate(service, metadata_secret(data)))) == expected
    # It does not depend on slurmctld's node either.
    move_slurmctld(emulator, slurm, "", phase="Pending")
    wait_for(lambda: not mutate(service, witness)["allowed"], 10, "the cache to see slurmctld Pending")
    assert address(injected(mutate(service, metadata_secret(data)))) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (
            "slurm_ctld.example.org",
            "the host is neither an IP address nor an RFC 1123 host name (dot-separated labels of "
            "letters, digits and inner hyphens, at most 63 characters each)",
        ),
        (
            "-slurmctld.example.org:6817",
            "the host is neither an IP address nor an RFC 1123 host name (dot-separated labels "
            "of letters, digits and inner hyphens, at most 63 characters each)",
        ),
        ("slurmctld.example.org:0", "the port '0' is not a number in 1-65535"),
        ("slurmctld.example.org:65536", "the port '65536' is not a number in 1-65535"),
        ("slurmctld.example.org:http", "the port 'http' is not a number in 1-65535"),
        ("999.1.1.1", "the host looks like an IPv4 address but is not one"),
        ("[slurmctld]:6817", "a bracketed host must be an IPv6 address, as in [2001:db8::1]:6817"),
        ("", "it is empty; use hostIP, service, service/<name> or host[:port]"),
        ("service/Not_A_Name", "service/<name> needs a Service name (a DNS-1123 label)"),
    ],
    ids=[
        "underscore",
        "leading-hyphen",
        "port-zero",
        "port-too-big",
        "port-name",
        "bad-ipv4",
        "bracketed-name",
        "empty",
        "bad-service-name",
    ],
)
def test_an_invalid_annotation_is_denied_naming_the_template_and_the_value(
    emulator: Emulator,
    start_injection: StartInjection,
    value: str,
    reason: str,
) -> None:
    seed_slinky(emulator)
    data = template(emulator, slurm_conf_server=value)
    assert denial(mutate(start_injection(emulator), metadata_secret(data))) == PREFIX + (
        f"Metal3DataTemplate metal3/workers-template has an invalid annotation slurm-conf-server={value!r}: {reason}"
    )


def test_the_chart_default_applies_without_an_annotation_and_an_annotation_wins(
    emulator: Emulator,
    start_injection: StartInjection,
) -> None:
    seed_slinky(emulator)
    plain = template(emulator)
    own = template(emulator, "own-workers", index=1, slurm_conf_server="hostIP")
    service = start_injection(emulator, conf_server_policy="slurmctld.hpc.example.org")
    assert injected(mutate(service, metadata_secret(plain)))["slurm_conf_server"] == "slurmctld.hpc.example.org:6817"
    assert injected(mutate(service, metadata_secret(own, machine="m3m-1")))["slurm_conf_server"] == "192.0.2.10:6817"


# --- the opt-in join data: controller name, JWT key ---------------------------------------------


def test_without_opt_in_no_extra_keys_are_injected(emulator: Emulator, start_injection: StartInjection) -> None:
    slurm = seed_slinky(emulator)
    content = injected(mutate(start_injection(emulator), metadata_secret(template(emulator))))
    assert "slurm_jwt_hs256_key_base64" not in content and "slurm_controller_name" not in content
    assert b64(slurm.jwt_key) not in content.values()


def test_controller_name_and_jwt_key_where_the_template_opts_in(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    slurm = seed_slinky(emulator)
    both = template(emulator, slurm_extra_join_data="controller-name, jwt-key")
    name_only = template(emulator, "named-workers", index=1, slurm_extra_join_data="controller-name")
    service = start_injection(emulator, template_opt_ins="controller-name,jwt-key")
    content = injected(mutate(service, metadata_secret(both)))
    assert content["slurm_controller_name"] == "slurm-controller-0"  # Slinky's SlurmctldHost: the StatefulSet's pod 0
    assert base64.b64decode(content["slurm_jwt_hs256_key_base64"]) == slurm.jwt_key
    assert base64.b64decode(content["slurm_key_base64"]) == slurm.key
    named = injected(mutate(service, metadata_secret(name_only, machine="m3m-1")))
    assert named["slurm_controller_name"] == "slurm-controller-0" and "slurm_jwt_hs256_key_base64" not in named


def test_a_template_asking_for_what_templates_may_not_choose_gets_no_join_data(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    slurm = seed_slinky(emulator)
    greedy = template(emulator, slurm_extra_join_data="controller-name,jwt-key")
    response = mutate(start_injection(emulator, template_opt_ins="controller-name"), metadata_secret(greedy))
    assert response["allowed"] is True and "patch" not in response
    assert response["warnings"] == [
        "SliMe added no Slurm join data: the template asks for join data templates may not choose"
    ]
    assert response["status"]["message"] == (
        "Slurm join data withheld from Secret metal3/m3m-0-metadata: Metal3DataTemplate metal3/workers-template asks "
        "for jwt-key (slurm-extra-join-data), which templates may not choose (the operator allows it with "
        "--template-opt-ins)"
    )
    assert b64(slurm.jwt_key) not in json.dumps(response) and b64(slurm.key) not in json.dumps(response)


def test_the_chart_default_opts_in_and_an_empty_annotation_opts_out(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    slurm = seed_slinky(emulator)
    plain = template(emulator)
    out = template(emulator, "plain-workers", index=1, slurm_extra_join_data="")
    service = start_injection(emulator, extra_join_data="jwt-key")
    assert (
        base64.b64decode(injected(mutate(service, metadata_secret(plain)))["slurm_jwt_hs256_key_base64"])
        == slurm.jwt_key
    )
    assert "slurm_jwt_hs256_key_base64" not in injected(mutate(service, metadata_secret(out, machine="m3m-1")))


@pytest.mark.parametrize("field", ["jwtKeyRef", "jwtHs256KeyRef"])
def test_the_jwt_key_comes_from_the_secret_the_controller_references(
    emulator: Emulator,
    start_injection: StartInjection,
    field: str,
) -> None:
    slurm = seed_slinky(emulator, jwt_key_ref={"name": "site-jwt", "key": "jwt.key"}, jwt_ref_field=field)
    data = template(emulator, slurm_extra_join_data="jwt-key")
    content = injected(mutate(start_injection(emulator, template_opt_ins="jwt-key"), metadata_secret(data)))
    assert base64.b64decode(content["slurm_jwt_hs256_key_base64"]) == slurm.jwt_key


def test_an_opted_in_jwt_key_that_is_missing_is_denied(emulator: Emulator, start_injection: StartInjection) -> None:
    seed_slinky(emulator, with_jwt_secret=False)
    data = template(emulator, slurm_extra_join_data="jwt-key")
    bad = template(emulator, "bad-workers", index=1, slurm_extra_join_data="munge-key")
    service = start_injection(emulator, template_opt_ins="jwt-key")
    assert denial(mutate(service, metadata_secret(data))) == PREFIX + (
        "Secret slurm/slurm-auth-jwths256 (JWT key of Controller slurm/slurm; the template asks for jwt-key) "
        "does not exist in cluster local"
    )
    assert denial(mutate(service, metadata_secret(bad, machine="m3m-1"))).endswith(
        "Metal3DataTemplate metal3/bad-workers has an invalid annotation slurm-extra-join-data='munge-key': "
        "unknown item 'munge-key'; the items are controller-name, jwt-key"
    )


def test_the_jwt_key_is_registered_with_the_redactor_and_never_logged(
    emulator: Emulator,
    start_injection: StartInjection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    slurm: SlurmCluster = seed_slinky(emulator)
    data = template(emulator, slurm_extra_join_data="jwt-key")
    service = start_injection(emulator, log_level="DEBUG", template_opt_ins="jwt-key")
    injected(mutate(service, metadata_secret(data)))
    bad = metadata_secret(data)
    bad["data"]["metaData"] = b64("[not a map")
    error = mutate(service, bad)
    # A log line that quoted the key by mistake would be scrubbed: the cache registered it.
    assert redactor.scrub(f"oops {b64(slurm.jwt_key)}") == f"oops {REDACTED}"
    formatter = JsonFormatter()
    text = "\n".join(formatter.format(r) for r in caplog.records) + json.dumps(error)
    text += httpx.get(f"{service.metrics_url}/metrics").text
    EVIDENCE.add_text("injection metrics", text)
    assert b64(slurm.jwt_key) not in text and b64(slurm.key) not in text


def test_zero_api_calls_per_warm_admission_with_every_option(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    seed_slinky(emulator)
    lb = seed_loadbalancer(emulator, "slurm", "slurm")
    assign_ingress(emulator, "slurm", lb, ip="203.0.113.50")
    data = template(emulator, slurm_conf_server="service", slurm_extra_join_data="controller-name,jwt-key")
    service = start_injection(emulator, template_opt_ins="controller-name,jwt-key")
    injected(mutate(service, metadata_secret(data)))  # warms the per-namespace caches, the JWT Secret's too
    wait_for(
        lambda: emulator.count_requests(verb="watch") >= emulator.count_requests(verb="list"),
        5,
        "every cache to open its watch",
    )  # a watch opening is the cache's work, not an admission's
    emulator.clear_requests()
    for i in range(20):
        assert (
            injected(mutate(service, metadata_secret(data, machine=f"m3m-{i}")))["slurm_conf_server"]
            == "203.0.113.50:6817"
        )
    assert emulator.requests == []
