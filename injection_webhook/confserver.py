"""Where new nodes find slurmctld, and what else they get: the choices, as pure functions.

A Metal3DataTemplate chooses its conf-server address policy with the annotation
``slurm-conf-server`` (the chart default, ``--conf-server-policy``, applies without it):

- ``hostIP``: the slurmctld pod's ``status.hostIP`` and the nodePort of a NodePort Service that
  selects it, else 6817. It follows slurmctld: a node provisioned before a move keeps the old
  address.
- ``service`` or ``service/<name>``: a LoadBalancer or NodePort Service that selects the
  slurmctld pod. A LoadBalancer gives its ingress IP or hostname and its port; a NodePort gives
  the configured node addresses (``--conf-server-node-addresses``) and its nodePort. Neither
  depends on where slurmctld runs.
- anything else: an explicit ``host[:port]`` (an IP address, or an RFC 1123 DNS name; an IPv6
  address with a port in brackets), port 6817 when none is given.

Annotations, not labels: a label value cannot hold ``:``, ``/`` or ``,`` and is at most 63
characters, so neither ``host:port``, ``service/<name>``, a list nor a long DNS name fits; and
nothing ever selects templates by these values, which is what labels are for.

The template may also opt in to more join data with the annotation ``slurm-extra-join-data``
(a comma list; default ``--extra-join-data``): ``controller-name`` (``slurm_controller_name``,
the SlurmctldHost name) and ``jwt-key`` (``slurm_jwt_hs256_key_base64``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from common.names import ACTIVE_CONTROLLER_LABEL

HOST_IP: Final = "hostIP"
SERVICE: Final = "service"
SLURMCTLD_PORT = 6817
CONTROLLER_NAME = "controller-name"
JWT_KEY = "jwt-key"
EXTRAS = (CONTROLLER_NAME, JWT_KEY)

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens, each at most
# 63 characters, at most 253 in all. DNS is case-insensitive, so upper case is allowed.
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")
_SERVICE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a Service name is a DNS-1035 label in practice
_PORT = re.compile(r"[0-9]{1,5}")


class PolicyError(ValueError):
    """A policy, address or option is not valid; the message says why (the caller names the value)."""


@dataclass(frozen=True, slots=True)
class Policy:
    kind: Literal["hostIP", "service", "explicit"]
    service: str = ""  # service/<name>: that Service; "" picks one
    host: str = ""  # explicit
    port: int | None = None  # explicit; None: 6817

    def __str__(self) -> str:
        if self.kind == "explicit":
            return format_address(self.host, self.port) if self.port is not None else self.host
        return f"{SERVICE}/{self.service}" if self.service else self.kind


@dataclass(frozen=True, slots=True)
class JoinOptions:
    """The operator's defaults a template may override, the node addresses for NodePort, and which extra
    join data a template annotation may add beyond ``extras`` (``template_opt_ins``; default none)."""

    policy: Policy = field(default_factory=lambda: Policy(HOST_IP))
    node_addresses: tuple[str, ...] = ()
    extras: frozenset[str] = frozenset()
    template_opt_ins: frozenset[str] = frozenset()

    @property
    def template_may_ask(self) -> frozenset[str]:
        """The extra join data a template annotation may name."""
        return self.extras | self.template_opt_ins


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_host(text: str) -> str:
    """``text`` when it is an IP address or an RFC 1123 host name, else :class:`PolicyError`."""
    if is_ip(text):
        return text
    if not text:
        raise PolicyError("the host is empty")
    if len(text) > 253:
        raise PolicyError(f"the host name has {len(text)} characters, more than 253")
    labels = text.split(".")
    if not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise PolicyError(
            "the host is neither an IP address nor an RFC 1123 host name "
            "(dot-separated labels of letters, digits and inner hyphens, at most 63 characters each)"
        )
    if all(label.isdigit() for label in labels):
        raise PolicyError("the host looks like an IPv4 address but is not one")
    return text


def _port(text: str) -> int:
    if not _PORT.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise PolicyError(f"the port {text!r} is not a number in 1-65535")
    return int(text)


def parse_address(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[ipv6]`` or ``[ipv6]:port``; a bare IPv6 address has no port."""
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or not _is_ipv6(inside):
            raise PolicyError("a bracketed host must be an IPv6 address, as in [2001:db8::1]:6817")
        if not rest:
            return inside, None
        if not rest.startswith(":"):
            raise PolicyError("after [IPv6] only :port may follow")
        return inside, _port(rest[1:])
    if text.count(":") > 1:
        if not _is_ipv6(text):
            raise PolicyError("the host is neither an IP address nor an RFC 1123 host name")
        return text, None
    host, colon, port = text.partition(":")
    return check_host(host), _port(port) if colon else None


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (RFC 3986) so the port stays unambiguous."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_policy(text: str) -> Policy:
    """The policy ``text`` names, or :class:`PolicyError` saying what is wrong with it."""
    text = text.strip()
    if text == HOST_IP:
        return Policy(HOST_IP)
    if text == SERVICE:
        return Policy(SERVICE)
    if text.startswith(f"{SERVICE}/"):
        name = text.removeprefix(f"{SERVICE}/")
        if len(name) > 63 or not _SERVICE_NAME.fullmatch(name):
            raise PolicyError("service/<name> needs a Service name (a DNS-1123 label)")
        return Policy(SERVICE, service=name)
    if not text:
        raise PolicyError(f"it is empty; use {HOST_IP}, {SERVICE}, {SERVICE}/<name> or host[:port]")
    keyword = next((k for k in (HOST_IP, SERVICE) if text.split(":")[0].lower() == k.lower()), None)
    if keyword:
        # A mistyped keyword would otherwise be a host name no node can resolve.
        raise PolicyError(
            f"it looks like the policy {keyword} but is spelled differently (policies are case-sensitive)"
        )
    host, port = parse_address(text)
    return Policy("explicit", host=host, port=port)


def parse_node_addresses(text: str) -> tuple[str, ...]:
    """A comma list of IP addresses or host names (no ports: the Service's nodePort is used)."""
    addresses = tuple(part.strip() for part in text.split(",") if part.strip())
    for address in addresses:
        try:
            check_host(address)
        except PolicyError as exc:
            raise PolicyError(f"node address {address!r}: {exc}") from None
    if len(set(addresses)) != len(addresses):
        raise PolicyError("a node address is listed twice")
    return addresses


def parse_extras(text: str) -> frozenset[str]:
    """A comma list of the extra join data to inject: ``controller-name``, ``jwt-key``."""
    items = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(items - set(EXTRAS))
    if unknown:
        raise PolicyError(f"unknown item {unknown[0]!r}; the items are {', '.join(EXTRAS)}")
    return frozenset(items)


def shown(value: str, limit: int = 120) -> str:
    """A value from an annotation, quoted and cut short, fit for a one-line message."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


# --- Services -----------------------------------------------------------------------------------


class Unsatisfied(Exception):
    """The policy cannot be satisfied yet; the reason says what is missing."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where nodes reach slurmctld: one or more hosts (tried in order) and one port."""

    hosts: tuple[str, ...]
    port: int

    @property
    def host(self) -> str:
        return self.hosts[0]

    @property
    def conf_server(self) -> str:
        # slurmd --conf-server takes a comma-separated list and fetches from the first that answers.
        return ",".join(format_address(host, self.port) for host in self.hosts)


def slurmctld_port(service: dict[str, Any]) -> dict[str, Any] | None:
    """The port entry of ``service`` that leads to slurmctld (target 6817 or named slurmctld)."""
    for port in (service.get("spec") or {}).get("ports") or ():
        if not isinstance(port, dict):
            continue
        target = port.get("targetPort", port.get("port"))
        if target in (SLURMCTLD_PORT, str(SLURMCTLD_PORT), "slurmctld") or port.get("name") == "slurmctld":
            return port
    return None


def selects(service: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    selector = (service.get("spec") or {}).get("selector") or {}
    return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())


def _name(service: dict[str, Any]) -> str:
    return str((service.get("metadata") or {}).get("name", ""))


def _type(service: dict[str, Any]) -> str:
    return str((service.get("spec") or {}).get("type") or "ClusterIP")


def service_endpoint(
    policy: Policy,
    services: list[dict[str, Any]],
    pod_labels: dict[str, str],
    pod_ref: str,
    namespace: str,
    node_addresses: tuple[str, ...],
) -> Endpoint:
    """The endpoint policy ``service`` gives, or :class:`Unsatisfied` with the reason.

    Without a name, a LoadBalancer Service wins over a NodePort one (its address depends on no
    node), each kind in name order. A pending LoadBalancer is not replaced by its nodePort: the
    address would change when the ingress arrives, and nodes keep what they booted with.
    """
    if policy.service:
        service = next((s for s in services if _name(s) == policy.service), None)
        if service is None:
            raise Unsatisfied(f"Service {namespace}/{policy.service} (policy {policy}) does not exist")
        if _type(service) not in ("LoadBalancer", "NodePort"):
            raise Unsatisfied(
                f"Service {namespace}/{policy.service} is of type {_type(service)}; policy {policy} "
                "needs a LoadBalancer or NodePort Service"
            )
        if not selects(service, pod_labels) or slurmctld_port(service) is None:
            raise Unsatisfied(
                f"Service {namespace}/{policy.service} does not select slurmctld pod {pod_ref} "
                f"or exposes no slurmctld port ({SLURMCTLD_PORT} or named slurmctld)"
            )
    else:
        usable = sorted(
            (
                s
                for s in services
                if _type(s) in ("LoadBalancer", "NodePort") and selects(s, pod_labels) and slurmctld_port(s) is not None
            ),
            key=lambda s: (_type(s) != "LoadBalancer", _name(s)),
        )
        if not usable:
            raise Unsatisfied(
                f"no LoadBalancer or NodePort Service in namespace {namespace} selects slurmctld pod "
                f"{pod_ref} and exposes its port {SLURMCTLD_PORT} (policy {policy})"
            )
        service = usable[0]
    ref = f"{namespace}/{_name(service)}"
    port = slurmctld_port(service) or {}
    if _type(service) == "LoadBalancer":
        ingress = [
            i
            for i in ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or ()
            if isinstance(i, dict)
        ]
        address = next((str(i.get("ip") or i.get("hostname")) for i in ingress if i.get("ip") or i.get("hostname")), "")
        if not address:
            raise Unsatisfied(
                f"LoadBalancer Service {ref} has no ingress address yet (pending); a node keeps the "
                "address it boots with, so it must not boot before the stable one exists"
            )
        try:
            check_host(address)
        except PolicyError as exc:
            raise Unsatisfied(f"LoadBalancer Service {ref} has an unusable ingress address: {exc}") from None
        number = port.get("port")
        if not isinstance(number, int):
            raise Unsatisfied(f"LoadBalancer Service {ref} has no port number for slurmctld")
        return Endpoint((address,), number)
    node_port = port.get("nodePort")
    if not isinstance(node_port, int):
        raise Unsatisfied(f"NodePort Service {ref} has no nodePort assigned for slurmctld yet")
    if not node_addresses:
        raise Unsatisfied(
            f"NodePort Service {ref} needs stable node addresses to point nodes at, and none are "
            "configured (--conf-server-node-addresses, chart injection.confServer.nodeAddresses)"
        )
    return Endpoint(node_addresses, node_port)


def hostip_port(services: list[dict[str, Any]], pod_labels: dict[str, str]) -> int:
    """Policy ``hostIP``: the nodePort of a NodePort Service that selects the pod and exposes slurmctld, else 6817."""
    for service in sorted(services, key=_name):
        port = slurmctld_port(service) if _type(service) == "NodePort" and selects(service, pod_labels) else None
        if port is not None and isinstance(port.get("nodePort"), int):
            return int(port["nodePort"])
    return SLURMCTLD_PORT


# --- Slinky >= 1.3: the active controller, the names slurm.conf gives it, the pool's features -----


def active_pod(pods: list[dict[str, Any]], controller: str) -> dict[str, Any]:
    """The slurmctld pod new nodes should reach: the only one, or the one Slinky marks active.

    Slinky >= 1.3 runs several slurmctld pods (high availability) and labels the active one
    ``controller.slinky.slurm.net/active=true``; earlier releases run one pod and no label.
    :class:`Unsatisfied` when several pods run and none (or more than one) is marked active, as
    during a failover: the node would otherwise be pointed at a standby."""
    if len(pods) == 1:
        return pods[0]
    active = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(ACTIVE_CONTROLLER_LABEL) == "true"]
    if len(active) == 1:
        return active[0]
    names = ", ".join(sorted(str((p.get("metadata") or {}).get("name")) for p in pods))
    state = "none is" if not active else f"{len(active)} are"
    raise Unsatisfied(
        f"Controller {controller} runs several slurmctld pods ({names}) and {state} labelled "
        f"{ACTIVE_CONTROLLER_LABEL}=true (a failover in progress?)"
    )


def controller_names(pods: list[dict[str, Any]], statefulset: str, namespace: str) -> tuple[str, ...]:
    """Every name the Controller's ``slurm.conf`` may give slurmctld, as Slinky writes them.

    Slinky >= 1.3: ``SlurmctldHost=<pod>.<statefulset>-internal.<namespace>`` for each controller
    pod (primary and backups) and ``SlurmctldAddr=<statefulset>.<namespace>`` (the Service); earlier
    releases: ``SlurmctldHost=<pod>``. A host outside the cluster resolves none of them through
    cluster DNS, and a slurmd that cannot resolve ``SlurmctldHost`` never registers, so each is
    written into the node's /etc/hosts before slurmd starts."""
    names: list[str] = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        name = str((pod.get("metadata") or {}).get("name") or "")
        if name:
            names += [f"{name}.{statefulset}-internal.{namespace}", name]
    names.append(f"{statefulset}.{namespace}")
    return tuple(dict.fromkeys(names))


def hosts_file(address: str, names: tuple[str, ...]) -> str:
    """/etc/hosts lines mapping ``names`` to ``address``; none when the address is not an IP
    (/etc/hosts cannot name a DNS name: the site's DNS must then resolve the controller's names)."""
    if not names or not is_ip(address):
        return ""
    return f"{address} {' '.join(names)}\n"


_FEATURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def parse_features(text: str) -> tuple[str, ...]:
    """A comma list of Slurm node features (a NodeSet's feature names); :class:`PolicyError` otherwise."""
    features = tuple(part.strip() for part in text.split(",") if part.strip())
    for feature in features:
        if not _FEATURE.fullmatch(feature):
            raise PolicyError(
                f"{feature!r} is not a Slurm node feature (letters, digits, '_', '.', '-', at most 63 characters)"
            )
    if len(set(features)) != len(features):
        raise PolicyError("a feature is listed twice")
    return features


def node_conf(features: tuple[str, ...]) -> str:
    """What ``slurmd -Z --conf`` gets: ``Feature=a,b``, or "" when the pool has no feature."""
    return f"Feature={','.join(features)}" if features else ""
