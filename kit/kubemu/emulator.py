"""The Emulator: one emulated cluster served by uvicorn in a background thread.

Each Emulator has its own thread, event loop, store and port, so a test can run a management
and a workload cluster side by side. stop() closes the port and start() reopens the same
port with the same store, which lets tests simulate an API server outage.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import uvicorn
import yaml
from kubernetes import client, config

from .admission import AdmissionHook
from .errors import ApiError
from .faults import Fault, FaultHandle, FaultSet
from .patch import MERGE_PATCH, apply_patch
from .resources import Registry, Resource, default_resources
from .selectors import FieldSelector, LabelSelector
from .server import KubeApp
from .store import Obj, Store
from .wire import PATCH_RETRIES, RecordedRequest

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public")


@dataclass(frozen=True)
class TlsFiles:
    """A serving pair and the CA that signed it: the emulator serves https, and its kubeconfig carries the CA."""

    cert_file: str
    key_file: str
    ca_file: str


class Emulator:
    """An in-process Kubernetes API server for tests and the local demo.

    `served` maps a group to the versions this cluster serves (default: all known versions),
    e.g. {"cluster.x-k8s.io": ["v1beta2"]}. `token` turns on bearer-token authentication.
    `admission` is called before every write (see AdmissionAttributes). `tls` serves https (as a
    Cluster API workload cluster's kubeconfig demands).
    """

    def __init__(
        self,
        resources: Iterable[Resource] | None = None,
        served: dict[str, list[str]] | None = None,
        token: str | None = None,
        admission: AdmissionHook | None = None,
        port: int = 0,
        history_size: int = 1000,
        bookmark_interval: float = 60.0,
        namespaces: Iterable[str] = DEFAULT_NAMESPACES,
        tls: TlsFiles | None = None,
    ):
        self.registry = Registry(resources if resources is not None else default_resources(), served)
        self.store = Store(history_size)
        self.faults = FaultSet()
        self.token = token
        self.tls = tls
        self._requests: list[RecordedRequest] = []
        self._requests_lock = threading.Lock()
        self.app = KubeApp(
            self.store,
            self.registry,
            self.faults,
            self._record,
            token=token,
            admission=admission,
            bookmark_interval=bookmark_interval,
        )
        self._port = port
        self._server: _PromptServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if any(r.group == "" and r.plural == "namespaces" for r in self.registry.resources):
            for name in namespaces:
                self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._port}"

    def start(self) -> Emulator:
        """Serve on 127.0.0.1 (the port chosen at the first start is kept across restarts)."""
        if self._thread is not None:
            raise RuntimeError("emulator already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted sockets inherit it. Without it a response written as headers then body meets
        # Nagle plus the client's delayed ACK: ~40 ms per call. kube-apiserver (Go) sets it too.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", self._port))
        sock.listen(128)
        self._port = sock.getsockname()[1]
        cfg = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            proxy_headers=False,
            ssl_certfile=self.tls.cert_file if self.tls else None,
            ssl_keyfile=self.tls.key_file if self.tls else None,
        )
        server = _PromptServer(cfg)
        thread = threading.Thread(
            target=asyncio.run, args=(self._serve(server, sock),), name=f"kubemu-{self._port}", daemon=True
        )
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("kubemu server thread died during startup")
            thread.join(0.005)
        self._server, self._thread = server, thread
        return self

    async def _serve(self, server: _PromptServer, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self.app.stopping = server.stopping = asyncio.Event()
        try:
            await server.serve(sockets=[sock])
        finally:
            for connection in list(server.server_state.connections):
                connection.transport.abort()  # in-flight requests see the server go away

    def stop(self) -> None:
        """End watches, close the port and join the server thread."""
        if self._thread is None or self._server is None:
            return
        self.store.close_watchers()
        self._server.should_exit = True
        self._server.force_exit = True  # do not wait for delayed (fault) requests to finish
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.app.stopping.set)
        self._thread.join(10)
        self._server, self._thread, self._loop = None, None, None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients -------------------------------------------------------------------------

    def kubeconfig(self, namespace: str = "default", name: str = "kubemu") -> dict[str, Any]:
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls:
            with open(self.tls.ca_file, "rb") as fh:
                cluster["certificate-authority-data"] = base64.b64encode(fh.read()).decode("ascii")
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": name,
            "preferences": {},
            "clusters": [{"name": name, "cluster": cluster}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        }

    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> str:
        """Write a kubeconfig for this emulator (token included when auth is on); returns the path."""
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump(self.kubeconfig(namespace), fh)
        return os.fspath(path)

    def api_client(self) -> client.ApiClient:
        """A kubernetes ApiClient built from this emulator's kubeconfig, as services build theirs."""
        with tempfile.TemporaryDirectory() as tmp:
            return config.new_client_from_config(config_file=self.write_kubeconfig(os.path.join(tmp, "kubeconfig")))

    # --- instrumentation -----------------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._requests_lock:
            self._requests.append(request)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests served so far, oldest first."""
        with self._requests_lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._requests_lock:
            self._requests.clear()

    def count_requests(self, **filters: Any) -> int:
        """How many recorded requests have all the given field values, e.g. verb="patch"."""
        unknown = set(filters) - set(RecordedRequest.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown RecordedRequest fields: {sorted(unknown)}")
        return sum(all(getattr(r, k) == v for k, v in filters.items()) for r in self.requests)

    def add_fault(self, fault: Fault) -> FaultHandle:
        return self.faults.add(fault)

    def clear_faults(self) -> None:
        self.faults.clear()

    # --- direct store access (no HTTP, no admission, same watch events) -------------------

    @staticmethod
    def _as(obj: Obj, api_version: str) -> Obj:
        obj["apiVersion"] = api_version
        return obj

    def create(self, obj: Obj, namespace: str | None = None) -> Obj:
        """Create as the API would, except that `status` is kept (handy for seeding)."""
        res = self.registry.find(obj["apiVersion"], obj["kind"])
        return self._as(self.store.create(res, obj, namespace or "", keep_status=True), obj["apiVersion"])

    def get(self, api_version: str, kind_or_plural: str, namespace: str, name: str) -> Obj | None:
        """The object, or None when it does not exist."""
        res = self.registry.find(api_version, kind_or_plural)
        try:
            return self._as(self.store.get(res, namespace, name), api_version)
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]:
        res = self.registry.find(api_version, kind_or_plural)
        items, _, _ = self.store.list(
            res, namespace, LabelSelector(label_selector), FieldSelector(field_selector, res.field_labels)
        )
        return [self._as(o, api_version) for o in items]

    def update(self, obj: Obj) -> Obj:
        """Replace spec, metadata and status at once (409 on a stale resourceVersion)."""
        res = self.registry.find(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        updated = self.store.update(res, obj, meta.get("namespace", ""), meta["name"], mode="all")
        return self._as(updated, obj["apiVersion"])

    def patch(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str,
        name: str,
        patch: Obj | builtins.list[Any],
        content_type: str = MERGE_PATCH,
    ) -> Obj:
        """Patch spec, metadata or status (merge patch by default; a list needs json-patch)."""
        res = self.registry.find(api_version, kind_or_plural)
        body = json.dumps(patch).encode()
        for attempt in range(PATCH_RETRIES):
            old = self.store.get(res, namespace, name)
            new = apply_patch(old, content_type, body)
            try:
                return self._as(self.store.update(res, new, namespace, name, mode="all"), api_version)
            except ApiError as err:
                if err.code != 409 or attempt == PATCH_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def delete(self, api_version: str, kind_or_plural: str, namespace: str, name: str) -> Obj | None:
        """Delete (or mark deleting when finalizers remain); None when it did not exist."""
        res = self.registry.find(api_version, kind_or_plural)
        try:
            obj, _ = self.store.delete(res, namespace, name)
        except ApiError as err:
            if err.code == 404:
                return None
            raise
        return self._as(obj, api_version)


class _PromptServer(uvicorn.Server):
    """uvicorn's server, stopped as soon as :meth:`Emulator.stop` asks.

    uvicorn notices ``should_exit`` at its next 0.1 s tick and then grants open connections 0.1 s more;
    kubemu aborts what is in flight anyway (``force_exit``), so those waits only added ~0.15 s to every
    test's teardown. The loop here is uvicorn's, woken by ``stopping``; the shutdown aborts connections.
    """

    stopping: asyncio.Event

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000  # on_tick refreshes the Date header every tenth tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.transport.abort()
        for server in self.servers:
            await server.wait_closed()
