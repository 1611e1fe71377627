"""The conf-server policy, address and option parsers, and the pure Service choice: no server, no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from injection_webhook.confserver import (
    Policy,
    PolicyError,
    Unsatisfied,
    format_address,
    hostip_port,
    parse_extras,
    parse_node_addresses,
    parse_policy,
    service_endpoint,
)
from injection_webhook.decision import JoinInfo

POD = {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": "slurm"}


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("hostIP", Policy("hostIP")),
        (" service ", Policy("service")),
        ("service/slurmctld-lb", Policy("service", service="slurmctld-lb")),
        ("slurmctld", Policy("explicit", host="slurmctld")),
        ("Slurmctld.HPC.example.org", Policy("explicit", host="Slurmctld.HPC.example.org")),
        ("10.0.0.1:1", Policy("explicit", host="10.0.0.1", port=1)),
        ("h:65535", Policy("explicit", host="h", port=65535)),
        ("[::1]", Policy("explicit", host="::1")),
        ("fe80::1", Policy("explicit", host="fe80::1")),
        ("a" * 63 + "." + "b" * 63, Policy("explicit", host="a" * 63 + "." + "b" * 63)),
    ],
)
def test_valid_policies(text: str, policy: Policy) -> None:
    assert parse_policy(text) == policy


@pytest.mark.parametrize(
    "text",
    [
        "HOSTIP",
        "hostip:",
        "Service",
        "service:6817",
        "service/",
        "service/a/b",
        "a..b",
        "a.-b",
        "a" * 64,
        ".".join(["a" * 63] * 4) + ".x",
        "h:-1",
        "h:1.5",
        "h: 6817",
        "[::1]x",
        "[10.0.0.1]:6817",
        "1.2.3",
        "::g",
        "host name",
        "h:6817:1",
    ],
)
def test_invalid_policies_say_why(text: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    assert str(caught.value)


def test_node_addresses_and_extras() -> None:
    assert parse_node_addresses(" 192.0.2.1 ,node-2.example.org,, ") == ("192.0.2.1", "node-2.example.org")
    assert parse_node_addresses("") == ()
    for bad in ("192.0.2.1:30817", "a,a", "node_2"):
        with pytest.raises(PolicyError):
            parse_node_addresses(bad)
    assert parse_extras("jwt-key , controller-name") == {"jwt-key", "controller-name"}
    assert parse_extras(" ") == frozenset()
    with pytest.raises(PolicyError):
        parse_extras("jwt-key,slurm-key")


def test_ipv6_is_bracketed_with_its_port() -> None:
    assert format_address("2001:db8::1", 6817) == "[2001:db8::1]:6817"
    assert format_address("10.0.0.1", 6817) == "10.0.0.1:6817"


def service(
    name: str,
    kind: str,
    *,
    port: int = 6817,
    node_port: int | None = 30817,
    target: Any = 6817,
    selector: dict[str, str] | None = None,
    ingress: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"port": port, "targetPort": target}
    if node_port is not None:
        entry["nodePort"] = node_port
    return {
        "metadata": {"name": name},
        "spec": {"type": kind, "selector": POD if selector is None else selector, "ports": [entry]},
        "status": {"loadBalancer": {"ingress": ingress}} if ingress else {},
    }


def endpoint(
    policy: str, services: list[dict[str, Any]], nodes: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], int, str]:
    found = service_endpoint(parse_policy(policy), services, POD, "slurm/slurm-controller-0", "slurm", nodes)
    return found.hosts, found.port, found.conf_server


def test_service_choice() -> None:
    lb = service("b-lb", "LoadBalancer", port=7817, ingress=[{"hostname": "lb.example.org"}])
    node_port = service("a-np", "NodePort", node_port=31000)
    other = service("c-other", "LoadBalancer", selector={"app": "else"}, ingress=[{"ip": "203.0.113.9"}])
    assert endpoint("service", [node_port, lb, other], ("n1",)) == (("lb.example.org",), 7817, "lb.example.org:7817")
    assert endpoint("service/a-np", [node_port, lb], ("n1", "n2")) == (("n1", "n2"), 31000, "n1:31000,n2:31000")
    assert endpoint("service", [node_port, other], ("10.0.0.1",)) == (("10.0.0.1",), 31000, "10.0.0.1:31000")
    # A LoadBalancer also has a nodePort, but a pending one is not replaced by it.
    pending = service("lb", "LoadBalancer")
    with pytest.raises(Unsatisfied, match="no ingress address yet"):
        endpoint("service", [pending, node_port], ("n1",))
    with pytest.raises(Unsatisfied, match="does not select slurmctld pod"):
        endpoint("service/c-other", [other])
    named_port = service("np", "NodePort", target="slurmctld", node_port=32000)
    assert endpoint("service", [named_port], ("n1",))[1] == 32000
    with pytest.raises(Unsatisfied, match="no LoadBalancer or NodePort Service"):
        endpoint("service", [service("np", "NodePort", target=8080)], ("n1",))
    with pytest.raises(Unsatisfied, match="unusable ingress address"):
        endpoint("service", [service("lb", "LoadBalancer", ingress=[{"hostname": "bad_name"}])])


def test_hostip_port_is_the_nodeport_of_a_selecting_nodeport_service_else_6817() -> None:
    assert hostip_port([service("np", "NodePort", node_port=30999)], POD) == 30999
    assert hostip_port([service("lb", "LoadBalancer", node_port=30999)], POD) == 6817
    assert hostip_port([service("np", "NodePort", selector={"app": "else"})], POD) == 6817
    assert hostip_port([], POD) == 6817


def test_join_info_repr_hides_both_keys() -> None:
    info = JoinInfo(
        host="h",
        port=1,
        key_base64="c2x1cm0ta2V5LXNlY3JldA==",
        source="s",
        jwt_key_base64="and4LWtleS1zZWNyZXQ=",
        controller_name="slurm-controller-0",
    )
    assert "c2x1cm0ta2V5LXNlY3JldA==" not in repr(info) and "and4LWtleS1zZWNyZXQ=" not in repr(info)
