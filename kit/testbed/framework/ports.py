"""The kit's one way to pick a TCP port for a listener: :func:`free_port`."""

from __future__ import annotations

import random
import socket

from testbed.framework.errors import KitError

# Ports for listeners chosen now and bound later (a chart value, a pod started a minute on): below
# the kernel's ephemeral range (32768-60999 by default), so no outgoing connection made meanwhile
# can take one as its source port, and below the NodePort range the tiers give slurmctld.
LISTEN_PORTS = range(20000, 30000)


class NoFreePort(KitError):
    """Every candidate port was taken."""


def free_port(low: int = 0, high: int = 0) -> int:
    """A TCP port nothing holds right now on any address of this host (a bind on 0.0.0.0 fails when
    127.0.0.1 or any other address has it), in ``[low, high]`` when given, else in :data:`LISTEN_PORTS`."""
    candidates = list(range(low, high + 1)) if low else list(LISTEN_PORTS)
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise NoFreePort(f"no free TCP port in {candidates and min(candidates)}-{candidates and max(candidates)}")
