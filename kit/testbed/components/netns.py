"""Network namespaces for simulated bare-metal nodes: one bridge on the host, one namespace per node.

:class:`Network` makes a Linux bridge with the first address of a /24 the caller picks (or a free
one in 10.200.0.0/13), and for each node a network namespace joined to the bridge by a veth pair,
with the address the caller names. The namespaces have **no default route**: a node reaches the
bridge subnet only (the host side, where slurmctld listens, and the other nodes), never any
other address. Node-to-node traffic goes through the bridge, so the host's ``ip_forward`` stays
as it is.

Names carry the creating process's PID (namespaces ``slime-<pid>-<n>``, bridges ``slm<pid>b<n>``), so a later
run can tell its own leftovers from a live run's: :func:`remove_stale` removes those whose
creator is gone. :meth:`Network.close` removes everything it made, even after a failure: it stops
the processes left in each namespace by PID, deletes the namespaces, the veths and the bridge.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import random
import re
import subprocess
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field

from testbed.framework.errors import ComponentFailed
from testbed.framework.processes import alive, kill_pids

NETNS_PREFIX = "slime-"
_NETNS_NAME = re.compile(r"^slime-(\d+)-(\d+)$")
_BRIDGE_NAME = re.compile(r"^slm(\d+)b(\d+)$")
_NUMBERS = itertools.count(1)  # one sequence per process: bridge, namespace and veth names never repeat
# Where free subnets are looked for: 10.200.0.0/24 .. 10.207.255.0/24.
SUBNET_POOL = ipaddress.IPv4Network("10.200.0.0/13")


class NetworkError(ComponentFailed):
    """An ``ip`` command failed; the message names the command and its error."""


def ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result.stdout


def netns_pids(netns: str) -> list[int]:
    """The PIDs of the processes in a network namespace (``ip netns pids``)."""
    out = ip("netns", "pids", netns, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for line in ip("-4", "-o", "addr", "show").splitlines() + ip("-4", "route", "show", "table", "all").splitlines():
        for word in line.split():
            with suppress(ValueError):
                if "/" in word or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", word):
                    used.append(ipaddress.IPv4Network(word, strict=False))
    return used


def free_subnet(rng: random.Random | None = None) -> ipaddress.IPv4Network:
    """A /24 in :data:`SUBNET_POOL` that no address or route of this host overlaps."""
    rng = rng or random.Random()
    used = _used_networks()
    candidates = list(SUBNET_POOL.subnets(new_prefix=24))
    for _ in range(200):
        subnet = rng.choice(candidates)
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise NetworkError(f"no free /24 in {SUBNET_POOL}")


def remove_stale() -> list[str]:
    """Remove namespaces and bridges this module made in processes that are gone; the names removed."""
    removed = []
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NETNS_NAME.match(name)
        if match and not alive(int(match.group(1))):
            kill_pids(netns_pids(name), grace=1.0)
            ip("netns", "delete", name, check=False)
            removed.append(name)
    for line in ip("-o", "link", "show", "type", "bridge", check=False).splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        match = _BRIDGE_NAME.match(name)
        if match and not alive(int(match.group(1))):
            ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


def new_namespace() -> str:
    """A network namespace of this process with only ``lo`` up (a controller manager's own); remove it with
    :func:`delete_namespace` (or a later run's :func:`remove_stale` does, once this process is gone)."""
    remove_stale()
    name = f"{NETNS_PREFIX}{os.getpid()}-{next(_NUMBERS)}"
    ip("netns", "add", name)
    ip("-n", name, "link", "set", "lo", "up")
    return name


def delete_namespace(netns: str) -> None:
    """Stop every process left in ``netns`` (by PID) and delete it."""
    kill_pids(netns_pids(netns), grace=2.0)
    ip("netns", "delete", netns, check=False)


@dataclass
class NodeNet:
    """One node's network namespace: its name, its address on the bridge, its prefix length."""

    netns: str
    address: str
    prefix: int
    veth: str

    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it in the namespace (``ip netns exec``, which also gives it a private
        mount namespace)."""
        return ["ip", "netns", "exec", self.netns]

    def pids(self) -> list[int]:
        return netns_pids(self.netns)


@dataclass
class Network:
    """A bridge on the host plus one namespace per node; a context manager that always cleans up."""

    subnet: ipaddress.IPv4Network = field(default_factory=free_subnet)
    owner: int = field(default_factory=os.getpid)
    nodes: dict[str, NodeNet] = field(default_factory=dict)
    bridge: str = ""
    _up: bool = False

    @property
    def host_address(self) -> str:
        """The host's address on the bridge: what nodes dial to reach services on the host (slurmctld)."""
        return str(self.subnet.network_address + 1)

    def hosts(self) -> Iterator[str]:
        """Node addresses, in order, after the host's."""
        for address in list(self.subnet.hosts())[10:]:
            yield str(address)

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def up(self) -> Network:
        if self._up:
            return self
        remove_stale()
        self.bridge = f"slm{self.owner}b{next(_NUMBERS)}"
        self._up = True  # from here on close() removes whatever was made
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        return self

    def add(self, address: str | None = None) -> NodeNet:
        """A new namespace on the bridge with ``address`` (default: the next free one)."""
        if not self._up:
            self.up()
        taken = {n.address for n in self.nodes.values()}
        if address is None:
            address = next(a for a in self.hosts() if a not in taken)
        if ipaddress.ip_address(address) not in self.subnet or address == self.host_address or address in taken:
            raise NetworkError(f"address {address} is not a free node address of {self.subnet}")
        number = next(_NUMBERS)
        name = f"{NETNS_PREFIX}{self.owner}-{number}"
        veth = f"sv{self.owner}x{number}"
        node = NodeNet(name, address, self.subnet.prefixlen, veth)
        self.nodes[name] = node
        ip("netns", "add", name)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("link", "set", veth, "master", self.bridge, "up")
        ip("-n", name, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        return node

    def remove(self, node: NodeNet, graceful: bool = False) -> None:
        """Stop every process left in the namespace (by PID; SIGKILL, as a power-off, unless ``graceful``) and delete
        it with its veth."""
        for _ in range(5):  # a process may fork while we stop the others
            pids = node.pids()
            if not pids:
                break
            kill_pids(pids, grace=0.5 if graceful else 0.0)
        ip("netns", "delete", node.netns, check=False)
        ip("link", "delete", node.veth, check=False)
        self.nodes.pop(node.netns, None)

    def close(self) -> None:
        if not self._up:
            return
        for node in list(self.nodes.values()):
            self.remove(node)
        ip("link", "delete", self.bridge, check=False)
        self._up = False
