"""Kubernetes Events, recorded off the admission path (both services).

``record`` only queues; a daemon thread posts core v1 Events. A failure is logged and counted,
never raised: an Event is a courtesy to whoever runs ``kubectl describe``, not part of the
decision. The scaling webhook records them on MachineDeployments (and, for machine health, on
Machines), the injection webhook on the Metal3Data whose join data it withheld.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from common.apis import EVENTS
from common.kube import KubeClient, KubeError

log = logging.getLogger("slime.events")

QUEUE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class ObjectEvent:
    """An Event about one object: its kind, apiVersion, namespace and name (and uid, when known)."""

    kind: str
    api_version: str
    namespace: str
    name: str
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"
    action: str = ""
    uid: str = ""


def machine_deployment_event(
    machine_deployment: tuple[str, str], api_version: str, reason: str, message: str, warning: bool = False
) -> ObjectEvent:
    """An Event about the MachineDeployment ``(namespace, name)`` (the scaling webhook's)."""
    namespace, name = machine_deployment
    kind = "MachineDeployment"
    return ObjectEvent(kind, api_version, namespace, name, reason, message, "Warning" if warning else "Normal", "Scale")


def machine_event(
    namespace: str, name: str, uid: str, api_version: str, reason: str, message: str, warning: bool = False
) -> ObjectEvent:
    """An Event about the Cluster API Machine ``namespace/name`` (the scaling webhook's machine health)."""
    kind = "Machine"
    return ObjectEvent(
        kind, api_version, namespace, name, reason, message, "Warning" if warning else "Normal", "Judge", uid
    )


def metal3data_event(namespace: str, name: str, uid: str, api_version: str, reason: str, message: str) -> ObjectEvent:
    """A Warning Event about the Metal3Data ``namespace/name`` (the injection webhook's)."""
    return ObjectEvent("Metal3Data", api_version, namespace, name, reason, message, "Warning", "Admit", uid)


class RateLimitedEvents:
    """At most one Event per object every ``interval_seconds``, so a flood of requests about one object
    costs one Event; the memory of what was sent is bounded (``keys``), then forgotten at once."""

    def __init__(self, recorder: EventRecorder | None, interval_seconds: float = 60.0, keys: int = 1024) -> None:
        self.recorder = recorder
        self.interval_seconds = interval_seconds
        self.keys = keys
        self._last: dict[tuple[str, str, str], float] = {}

    def record(self, event: ObjectEvent) -> None:
        if self.recorder is None:
            return
        key = (event.kind, event.namespace, event.name)
        now = time.monotonic()
        if now - self._last.get(key, -self.interval_seconds) < self.interval_seconds:
            return
        if len(self._last) >= self.keys:
            self._last.clear()
        self._last[key] = now
        self.recorder.record(event)


def event_body(event: ObjectEvent, component: str, instance: str, now: datetime) -> dict[str, Any]:
    """A core v1 Event in the new style (eventTime + reporting fields), valid for the API server."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{event.name}.{time.time_ns():x}", "namespace": event.namespace},
        "involvedObject": {
            "kind": event.kind,
            "apiVersion": event.api_version,
            "namespace": event.namespace,
            "name": event.name,
            **({"uid": event.uid} if event.uid else {}),
        },
        "reason": event.reason,
        "message": event.message,
        "type": event.type,
        "action": event.action or event.reason,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "count": 1,
    }


class EventRecorder:
    """Posts Events from a bounded queue on one daemon thread."""

    def __init__(self, client: KubeClient, component: str, on_result: Callable[[bool], None] | None = None) -> None:
        self.client = client
        self.component = component
        self.instance = (os.environ.get("POD_NAME") or socket.gethostname())[:128]
        self._on_result = on_result
        self._queue: queue.Queue[ObjectEvent | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None

    def start(self) -> EventRecorder:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"{self.component} events", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass

    def record(self, event: ObjectEvent) -> None:
        """Queue an Event; never blocks and never raises."""
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning(
                "event queue full; event dropped",
                extra={"object": f"{event.kind} {event.namespace}/{event.name}", "reason": event.reason},
            )
            self._result(False)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued Event was sent or failed (for tests and shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None:
                    return
                self._send(event)
            finally:
                self._queue.task_done()

    def _send(self, event: ObjectEvent) -> None:
        body = event_body(event, self.component, self.instance, datetime.now(UTC))
        try:
            self.client.request(
                "POST", EVENTS.collection(event.namespace), body=body, content_type="application/json", timeout=5.0
            )
        except KubeError as exc:
            log.warning(
                "cannot record event",
                extra={
                    "object": f"{event.kind} {event.namespace}/{event.name}",
                    "reason": event.reason,
                    "error": str(exc),
                },
            )
            self._result(False)
            return
        except Exception:
            log.exception("cannot record event", extra={"object": f"{event.kind} {event.namespace}/{event.name}"})
            self._result(False)
            return
        self._result(True)

    def _result(self, ok: bool) -> None:
        if self._on_result is not None:
            self._on_result(ok)
