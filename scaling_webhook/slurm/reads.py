"""The leader's connections to slurmrestd and what one reconcile pass read from each.

Safe scale-in and machine health both decide from Slurm's node list. A pass reads it once per
slurmrestd endpoint, when a decision first needs it, and every decision of that pass (of every
mapping on that endpoint) shares it; only a release reads one node again, by name, before it
acts (:meth:`~scaling_webhook.slurm.slurmrestd.SlurmClient.node`). A 2,000-node pool costs one
list per pass, not one per Machine.
"""

from __future__ import annotations

import threading

from common.kube import KubeClient
from scaling_webhook.slurm.endpoint import SlurmEndpoint
from scaling_webhook.slurm.slurmrestd import SlurmClient, SlurmNodes, SlurmUnavailable


class SlurmReads:
    """One :class:`SlurmClient` per endpoint, and the pass's node list of each. Thread-safe."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._clients: dict[SlurmEndpoint, SlurmClient] = {}
        self._pass_nodes: dict[SlurmEndpoint, SlurmNodes | SlurmUnavailable] = {}
        self._guard = threading.Lock()

    def slurm(self, config: SlurmEndpoint) -> SlurmClient:
        """The client of ``config``'s endpoint (one per endpoint, however many blocks name it)."""
        endpoint = config.endpoint
        with self._guard:
            found = self._clients.get(endpoint)
            if found is None:
                found = self._clients[endpoint] = SlurmClient(self.client, endpoint)
            return found

    def begin_pass(self) -> None:
        """A reconcile pass starts: Slurm's node list is read again, once, when a decision first needs it."""
        with self._guard:
            self._pass_nodes.clear()

    def nodes(self, config: SlurmEndpoint, fresh: bool = False) -> SlurmNodes:
        """Slurm's nodes as this pass read them (``fresh``: read again now, and keep that); raises
        :class:`SlurmUnavailable`, and the pass remembers that too, so a down slurmrestd costs one timeout."""
        endpoint = config.endpoint
        with self._guard:
            known = self._pass_nodes.get(endpoint)
        if known is not None and not fresh:
            if isinstance(known, SlurmUnavailable):
                raise known
            return known
        try:
            nodes: SlurmNodes | SlurmUnavailable = self.slurm(config).nodes()
        except SlurmUnavailable as exc:
            nodes = exc
        with self._guard:
            self._pass_nodes[endpoint] = nodes
        if isinstance(nodes, SlurmUnavailable):
            raise nodes
        return nodes

    def close(self) -> None:
        with self._guard:
            for found in self._clients.values():
                found.close()
            self._clients.clear()
