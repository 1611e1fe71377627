"""Kubernetes Events on MachineDeployments, recorded off the admission path.

``record`` only queues; a daemon thread posts core v1 Events. A failure is logged and counted,
never raised: an Event is a courtesy to whoever runs ``kubectl describe``, not part of the
decision.
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

from common.kube import KubeClient, KubeError, ResourcePath

log = logging.getLogger("slime.scaling.events")

COMPONENT = "slime-scaling-webhook"
EVENTS = ResourcePath("", "v1", "events")
QUEUE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    namespace: str
    name: str
    api_version: str
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"

    @classmethod
    def on(
        cls, machine_deployment: tuple[str, str], api_version: str, reason: str, message: str, warning: bool = False
    ) -> ScaleEvent:
        """An Event about the MachineDeployment ``(namespace, name)``."""
        namespace, name = machine_deployment
        return cls(namespace, name, api_version, reason, message, "Warning" if warning else "Normal")


def event_body(event: ScaleEvent, instance: str, now: datetime) -> dict[str, Any]:
    """A core v1 Event in the new style (eventTime + reporting fields), valid for the API server."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{event.name}.{time.time_ns():x}", "namespace": event.namespace},
        "involvedObject": {
            "kind": "MachineDeployment",
            "apiVersion": event.api_version,
            "namespace": event.namespace,
            "name": event.name,
        },
        "reason": event.reason,
        "message": event.message,
        "type": event.type,
        "action": "Scale",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "count": 1,
    }


class EventRecorder:
    """Posts Events from a bounded queue on one daemon thread."""

    def __init__(self, client: KubeClient, on_result: Callable[[bool], None] | None = None) -> None:
        self.client = client
        self.instance = (os.environ.get("POD_NAME") or socket.gethostname())[:128]
        self._on_result = on_result
        self._queue: queue.Queue[ScaleEvent | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None

    def start(self) -> EventRecorder:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="scaling events", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass

    def record(self, event: ScaleEvent) -> None:
        """Queue an Event; never blocks and never raises."""
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning(
                "event queue full; event dropped",
                extra={"machinedeployment": f"{event.namespace}/{event.name}", "reason": event.reason},
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

    def _send(self, event: ScaleEvent) -> None:
        body = event_body(event, self.instance, datetime.now(UTC))
        try:
            self.client.request(
                "POST", EVENTS.collection(event.namespace), body=body, content_type="application/json", timeout=5.0
            )
        except KubeError as exc:
            log.warning(
                "cannot record event",
                extra={
                    "machinedeployment": f"{event.namespace}/{event.name}",
                    "reason": event.reason,
                    "error": str(exc),
                },
            )
            self._result(False)
            return
        except Exception:
            log.exception("cannot record event", extra={"machinedeployment": f"{event.namespace}/{event.name}"})
            self._result(False)
            return
        self._result(True)

    def _result(self, ok: bool) -> None:
        if self._on_result is not None:
            self._on_result(ok)
