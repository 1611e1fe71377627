"""One node's kubelet and kube-proxy for chosen Deployments' pods, so a ``helm upgrade`` rolls them as a cluster does.

The tier has no scheduler, kubelet or kube-proxy. The Deployment and ReplicaSet controllers of
the real kube-controller-manager do run: after ``helm upgrade`` changes a pod template they make a
new ReplicaSet and Pod objects, wait for the new pods to be available, then scale the old
ReplicaSet down, which deletes its pods gracefully. :class:`Kubelet` does the node's part for
the pods matching the given selectors, from the Pod objects alone:

- a new Pod is bound to the node :data:`NODE` (a Node object it registers; an unbound pod would be
  deleted at once, without its grace period), given a loopback address of its own as
  ``status.podIP`` (``127.42.x.y``: every pod listens on its own address, so old and new pods of
  one Deployment run side by side on the chart's ports), and run with :func:`run_pod` (podman, the
  image its spec names) or :func:`run_process`;
- its ``readinessProbe`` is run every ``periodSeconds`` with its ``successThreshold`` and
  ``failureThreshold``, and the result is written to the Pod's ``Ready`` condition, which is what
  the Deployment controller waits for before it removes an old pod (``maxUnavailable: 0``);
- a Pod with a ``deletionTimestamp`` is terminated as kubelet does (:meth:`Pod.terminate`: the
  ``preStop`` exec hook, SIGTERM, SIGKILL at the end of ``deletionGracePeriodSeconds``), then its
  object is removed (a delete with grace period 0, as kubelet's status manager does).

:class:`ServiceProxy` plays kube-proxy for one Service: it listens on ``127.0.0.1:<port>``, where
the ``ExternalName: localhost`` Service sends kube-apiserver, and hands each new connection to one
of the Service's endpoints, round robin: pods that have a ``podIP``, are ``Ready`` and are not
terminating (what the EndpointSlice controller publishes). A change reaches it
:data:`PROPAGATION_SECONDS` late, as the EndpointSlice controller and kube-proxy's sync take
time in a cluster: the window a ``preStop`` sleep exists to cover. A connection already
established stays with its pod until one side closes it (conntrack keeps it in a cluster too).
Everything listens on and dials 127.0.0.0/8 only.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.components.controlplane import ControlPlane
from testbed.components.forward import splice
from testbed.components.pods import Pod, run_pod, run_process
from testbed.framework.cluster import KubeClient
from testbed.framework.errors import ApiCallFailed, WaitTimeout
from testbed.framework.wait import wait_for

NODE = "slime-real-node"
# kube-proxy's --iptables-min-sync-period is 1 s, and the EndpointSlice controller batches updates:
# a removed endpoint keeps getting new connections about this long.
PROPAGATION_SECONDS = 1.0
_ADDRESSES = itertools.count(1)


def _next_ip() -> str:
    n = next(_ADDRESSES)
    return f"127.42.{n // 250}.{n % 250 + 1}"


class ServiceProxy:
    """kube-proxy for one Service port: ``127.0.0.1:port`` to a ready endpoint's ``ip:target_port``, per
    connection."""

    def __init__(self, port: int, target_port: int | None = None, delay: float = PROPAGATION_SECONDS) -> None:
        self.port, self.target_port, self.delay = port, target_port or port, delay
        self.connections: dict[str, int] = {}  # endpoint -> connections handed to it
        self.refused = 0  # connections that found no endpoint (closed at once, as a REJECT rule does)
        self._updates: list[tuple[float, list[str]]] = [(0.0, [])]
        self._turn = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", port))
        self._server.listen(128)
        self._server.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name=f"service-proxy-{port}", daemon=True)
        self._thread.start()

    def update(self, endpoints: list[str]) -> None:
        """The endpoints as the API shows them now; they take effect :attr:`delay` seconds later."""
        with self._lock:
            if endpoints != self._updates[-1][1]:
                self._updates.append((time.monotonic(), sorted(endpoints)))

    def endpoints(self) -> list[str]:
        """What the proxy routes to now."""
        now = time.monotonic()
        with self._lock:
            current = [e for t, e in self._updates if t <= now - self.delay]
            return current[-1] if current else []

    def _pick(self) -> str | None:
        endpoints = self.endpoints()
        if not endpoints:
            return None
        with self._lock:
            self._turn += 1
            chosen = endpoints[self._turn % len(endpoints)]
            self.connections[chosen] = self.connections.get(chosen, 0) + 1
        return chosen

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve_one, args=(connection,), daemon=True).start()

    def _serve_one(self, inside: socket.socket) -> None:
        inside.settimeout(None)
        target = self._pick()
        try:
            if target is None:
                raise OSError("no endpoint")
            outside = socket.create_connection((target, self.target_port), timeout=5)
        except OSError:
            with self._lock:
                self.refused += 1
            inside.close()
            return
        splice(inside, outside)

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(timeout=5)


def _ready_condition(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Managed:
    """A Pod object this kubelet runs."""

    component: str
    name: str
    uid: str
    ip: str
    pod: Pod | None = None
    ready: bool = False
    terminating: bool = False
    gone: bool = False  # container stopped and the Pod object removed
    error: str = ""
    times: dict[str, float] = field(default_factory=dict)  # seen, started, ready, deleted, stopped (monotonic)


@dataclass
class Kubelet:
    """Runs the Pods matching ``selectors`` (component -> label selector) in ``namespace``; see the module doc."""

    cp: ControlPlane
    namespace: str
    selectors: dict[str, str]
    workdir: Path
    runner: str = "pod"  # "pod": podman and the pod's image; "process": local processes
    proxies: dict[str, ServiceProxy] = field(default_factory=dict)  # component -> its Service's proxy
    period: float = 0.2
    pods: dict[str, Managed] = field(default_factory=dict)  # by uid
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Kubelet:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        }
        try:
            self.cp.api.create(node)
        except ApiCallFailed as exc:
            if exc.status != 409:  # registered by an earlier kubelet of this control plane
                raise
        self._spawn(self._sync_loop, "kubelet-sync")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        for managed in self.pods.values():
            if managed.pod is not None and not managed.gone:
                managed.pod.stop()
        for proxy in self.proxies.values():
            proxy.close()

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=self._guarded, args=(target, *args), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _guarded(self, target: Callable[..., None], *args: Any) -> None:
        try:
            target(*args)
        except Exception as exc:  # noqa: BLE001 - reported through errors; the test asserts there are none
            self.errors.append(f"{getattr(target, '__name__', target)}: {type(exc).__name__}: {exc}")

    def serving(self, component: str) -> list[Managed]:
        """The pods of ``component`` that run, are ready and are not terminating."""
        return [
            m
            for m in self.pods.values()
            if m.component == component and m.ready and not m.terminating and not m.gone and m.pod is not None
        ]

    # -- the sync loop: Pod objects -> containers, and endpoints -> proxies
    def _sync_loop(self) -> None:
        with self.cp.client(timeout=10) as client:
            while not self._stop.wait(self.period):
                for component, selector in self.selectors.items():
                    self._sync(client, component, selector)

    def _sync(self, client: KubeClient, component: str, selector: str) -> None:
        try:
            items = client.list("v1", "pods", self.namespace, label_selector=selector)
        except Exception as exc:  # noqa: BLE001 - the next pass lists again, as a watch would resume
            self.errors.append(f"list pods: {type(exc).__name__}: {exc}")
            return
        for obj in items:
            self._sync_pod(component, obj)
        if component in self.proxies:
            self.proxies[component].update(
                [
                    o["status"]["podIP"]
                    for o in items
                    if (o.get("status") or {}).get("podIP")
                    and _ready_condition(o)
                    and not o["metadata"].get("deletionTimestamp")
                ]
            )

    def _sync_pod(self, component: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        uid = meta["uid"]
        managed = self.pods.get(uid)
        if managed is None:
            if meta.get("deletionTimestamp"):
                return
            managed = Managed(component, meta["name"], uid, _next_ip(), times={"seen": time.monotonic()})
            self.pods[uid] = managed
            self._spawn(self._run_pod, f"kubelet-run-{managed.name}", managed, obj)
        elif meta.get("deletionTimestamp") and not managed.terminating:
            managed.terminating = True
            managed.times["deleted"] = time.monotonic()
            grace = float(meta.get("deletionGracePeriodSeconds", 30))
            self._spawn(self._kill_pod, f"kubelet-kill-{managed.name}", managed, grace)

    # -- one pod's life
    def _pod_path(self, managed: Managed) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{managed.name}"

    def _write_status(self, managed: Managed, obj: dict[str, Any], ready: bool) -> None:
        (container,) = obj["spec"]["containers"]
        ready_text = "True" if ready else "False"
        status = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": managed.ip,
            "podIPs": [{"ip": managed.ip}],
            "startTime": obj["status"].get("startTime") or _now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready_text, "lastTransitionTime": _now()},
                {"type": "Ready", "status": ready_text, "lastTransitionTime": _now()},
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": ready,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": obj["status"].get("startTime") or _now()}},
                }
            ],
        }
        self.cp.api.patch("v1", "pods", self.namespace, managed.name, {"status": status}, "status")

    def _run_pod(self, managed: Managed, obj: dict[str, Any]) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": managed.name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        self.cp.api.request("POST", f"{self._pod_path(managed)}/binding", binding)
        pods_dir = self.workdir / "pods"
        if self.runner == "pod":
            image = obj["spec"]["containers"][0]["image"]
            managed.pod = run_pod(self.cp, {}, image, pods_dir, ready_timeout=0, pod=obj, pod_ip=managed.ip)
        else:
            managed.pod = run_process(self.cp, {}, pods_dir, ready_timeout=0, pod=obj, pod_ip=managed.ip)
        managed.times["started"] = time.monotonic()
        obj.setdefault("status", {})["startTime"] = _now()
        self._write_status(managed, obj, ready=False)
        probe = obj["spec"]["containers"][0].get("readinessProbe") or {}
        period = float(probe.get("periodSeconds", 10))
        success, failure = int(probe.get("successThreshold", 1)), int(probe.get("failureThreshold", 3))
        streak = 0  # consecutive results pointing away from the current state
        time.sleep(float(probe.get("initialDelaySeconds", 0)))
        while not self._stop.is_set() and not managed.terminating:
            if not managed.pod.running():
                managed.error = f"container exited:\n{managed.pod.logs()[-2000:]}"
                self.errors.append(f"{managed.name}: {managed.error}")
                return
            result = managed.pod.ready()
            streak = streak + 1 if result != managed.ready else 0
            if streak >= (success if result else failure):
                managed.ready, streak = result, 0
                if result:
                    managed.times.setdefault("ready", time.monotonic())
                if not managed.terminating:
                    self._write_status(managed, obj, ready=result)
            self._stop.wait(period)

    def _kill_pod(self, managed: Managed, grace: float) -> None:
        with suppress(WaitTimeout):  # still starting: kill it once it runs
            wait_for(lambda: managed.pod is not None, 120, f"pod {managed.name} to start", interval=0.1)
        if managed.pod is not None:
            managed.times.update({f"terminate_{k}": v for k, v in managed.pod.terminate(grace).items()})
        managed.times["stopped"] = time.monotonic()
        self.cp.api.request(
            "DELETE",
            self._pod_path(managed),
            {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": managed.uid},
            },
        )
        managed.gone = True
