"""One writer among the scaling service's replicas: a ``coordination.k8s.io`` Lease, as client-go elects.

Every replica serves admissions (they only read), but only the holder of the Lease writes:
MachineDeployments, mirrors (adoption) and safe scale-in. The algorithm is client-go's
``leaderelection``:

- a candidate takes the Lease when it does not exist, is empty, or its record has not changed
  for ``lease_seconds`` by this process's own clock (so no clock skew between pods matters);
- the holder renews every ``retry_seconds``; every write goes through ``resourceVersion``, so two
  candidates can never both win;
- the holder stops acting as leader ``renew_deadline_seconds`` after its last successful renewal,
  which is shorter than ``lease_seconds``: it has stopped before anyone else may take over;
- on shutdown it gives the Lease up (empty holder), so a successor need not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from common.apis import LEASES
from common.kube import KubeClient, KubeError

log = logging.getLogger("slime.scaling.leader")

LEASE_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_SECONDS = 2.0


# Called before every write: raises NotLeader when this replica may not write now (the reconciler passes
# its Lease check; a caller without an election, such as the uninstall hook, passes no_fence).
Fence = Callable[[], None]


def no_fence() -> None:
    return None


class NotLeader(Exception):
    """This replica does not hold the Lease (or can no longer be sure it does): it must not write."""


def _micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """The pod name (downward API) when there is one, plus a random suffix: unique per process."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str | None = None,
        lease_seconds: float = LEASE_SECONDS,
        renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not retry_seconds < renew_deadline_seconds < lease_seconds:
            raise ValueError("need retry_seconds < renew_deadline_seconds < lease_seconds")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_seconds = lease_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self.retry_seconds = retry_seconds
        self._on_change = on_change
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0  # monotonic time it was first seen
        self._valid_until = 0.0  # monotonic: act as leader until then
        self._was_leader = False
        self._lock = threading.Lock()
        self.holder = ""  # who holds it, as last read (for logs and messages)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def ensure(self) -> None:
        """Raise :class:`NotLeader` unless this replica may write now (call before every write)."""
        if not self.is_leader:
            raise NotLeader(f"{self.identity} does not hold Lease {self.ref} (holder: {self.holder or 'none'})")

    # --- one attempt ---------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One round of client-go's tryAcquireOrRenew; True when this replica leads afterwards."""
        with self._lock:
            started = time.monotonic()
            try:
                leader = self._attempt(started)
            except KubeError as exc:
                log.warning("cannot read or write the leader Lease", extra={"lease": self.ref, "error": str(exc)})
                leader = False
            if leader:
                self._valid_until = started + self.renew_deadline_seconds
            self._report()
            return leader

    def _attempt(self, started: float) -> bool:
        path = LEASES.item(self.namespace, self.name)
        now = datetime.now(UTC)
        try:
            lease = self.client.request("GET", path, timeout=self.renew_deadline_seconds / 2)
        except KubeError as exc:
            if exc.status != 404:
                raise
            return self._create(now)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, started
        self.holder = holder
        expired = self._observed_at + float(spec.get("leaseDurationSeconds") or self.lease_seconds) <= started
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        lease["spec"] = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_seconds),
            "acquireTime": spec.get("acquireTime") if holder == self.identity else _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }
        try:
            self.client.request(
                "PUT", path, body=lease, content_type="application/json", timeout=self.renew_deadline_seconds / 2
            )
        except KubeError as exc:
            if exc.status == 409:  # someone else wrote first: they win this round
                return False
            raise
        self.holder = self.identity
        return True

    def _create(self, now: datetime) -> bool:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_seconds),
                "acquireTime": _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": 0,
            },
        }
        try:
            self.client.request(
                "POST",
                LEASES.collection(self.namespace),
                body=body,
                content_type="application/json",
                timeout=self.renew_deadline_seconds / 2,
            )
        except KubeError as exc:
            if exc.status == 409:  # created by another candidate meanwhile
                return False
            raise
        self.holder = self.identity
        return True

    def _report(self) -> None:
        leader = self.is_leader
        if leader != self._was_leader:
            self._was_leader = leader
            log.info(
                "leadership changed",
                extra={"lease": self.ref, "identity": self.identity, "leader": leader, "holder": self.holder},
            )
            if self._on_change is not None:
                self._on_change(leader)

    def release(self) -> None:
        """Give the Lease up (shutdown), so a successor need not wait for it to expire."""
        with self._lock:
            if not self.is_leader:
                return
            self._valid_until = 0.0
            path = LEASES.item(self.namespace, self.name)
            try:
                lease = self.client.request("GET", path, timeout=2.0)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") == self.identity:
                    lease["spec"] = {
                        **spec,
                        "holderIdentity": "",
                        "leaseDurationSeconds": 1,
                        "renewTime": _micro_time(datetime.now(UTC)),
                    }
                    self.client.request("PUT", path, body=lease, content_type="application/json", timeout=2.0)
            except KubeError as exc:
                log.warning(
                    "cannot give the leader Lease up; it expires by itself",
                    extra={"lease": self.ref, "error": str(exc)},
                )
            self._report()

    # --- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """A ServiceRunner background task: try (or renew) every ``retry_seconds``; give up at stop."""
        try:
            while not stop.is_set():
                await asyncio.to_thread(self.try_acquire_or_renew)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.retry_seconds)
        finally:
            await asyncio.to_thread(self.release)
