"""Setting a MachineDeployment's replicas through its ``/scale`` subresource, in one call.

Only the leader's reconciler writes (never an admission): a merge patch ``{"spec":{"replicas":N}}``
on ``/apis/cluster.x-k8s.io/<v>/namespaces/<ns>/machinedeployments/<name>/scale``. It is an
absolute set taken from the mirror, so a write can never add to another. A scale-up decided
from the watch caches carries the ``resourceVersion`` it was decided on, so the API server
refuses it (409) once the MachineDeployment has moved on, and the caller decides again on fresh
reads. The served version (v1beta2 preferred, else v1beta1) is discovered once and cached. If a
404 says the path is not served (the cluster was upgraded or downgraded), we forget it and
retry once with the version served now.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from common.apis import CAPI_VERSIONS, DEPLOYMENTS
from common.kube import KubeClient, KubeError, ResourcePath
from common.names import CAPI_GROUP
from scaling_webhook.errors import ScaleError, denial_code

log = logging.getLogger("slime.scaling.machinedeployments")

MACHINEDEPLOYMENTS = "machinedeployments"
MERGE_PATCH = "application/merge-patch+json"


def _object_missing(exc: KubeError) -> bool:
    """A 404 about the object itself ("... \\"name\\" not found"), not about an unserved path."""
    return exc.status == 404 and exc.message.rstrip().endswith("not found") and '"' in exc.message


class MachineDeploymentScaler:
    """Reads and sets MachineDeployment replicas on one cluster. Thread-safe."""

    def __init__(self, client: KubeClient, timeout: float) -> None:
        self.client = client
        self.timeout = timeout
        self._path: ResourcePath | None = None
        self._lock = threading.Lock()

    # --- discovery ---------------------------------------------------------------------------

    def resource_path(self) -> ResourcePath:
        """The MachineDeployment resource at the newest supported served version (cached)."""
        path = self._path
        if path is not None:
            return path
        with self._lock:
            if self._path is None:
                try:
                    self._path = self.client.resource(CAPI_GROUP, MACHINEDEPLOYMENTS, CAPI_VERSIONS)
                except KubeError as exc:
                    raise self._error(exc, "", "", self.timeout) from None
                log.info("MachineDeployment API version discovered", extra={"api_version": self.api_version})
            return self._path

    @property
    def api_version(self) -> str:
        path = self._path
        return f"{CAPI_GROUP}/{path.version}" if path is not None else ""

    def forget_version(self) -> None:
        with self._lock:
            self._path = None
        self.client.forget_discovery(CAPI_GROUP)

    # --- calls -------------------------------------------------------------------------------

    def set_replicas(
        self,
        namespace: str,
        name: str,
        replicas: int,
        timeout: float | None = None,
        resource_version: str | None = None,
    ) -> None:
        """Set ``spec.replicas`` with one merge patch on ``/scale``; raise :class:`ScaleError`.

        With ``resource_version`` the patch carries it as a precondition: the API server refuses it
        (a ScaleError with code 409) if the MachineDeployment has changed since that version.
        """
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        body: dict[str, Any] = {"spec": {"replicas": replicas}}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        for attempt in (1, 2):
            path = self.resource_path().item(namespace, name, "scale")
            remaining = max(0.05, deadline - time.monotonic())
            try:
                self.client.request("PATCH", path, body=body, content_type=MERGE_PATCH, timeout=remaining)
                return
            except KubeError as exc:
                if exc.status == 404 and not _object_missing(exc) and attempt == 1:
                    log.warning("MachineDeployment path not served; rediscovering the version", extra={"path": path})
                    self.forget_version()
                    continue
                raise self._error(exc, namespace, name, budget) from None

    def get_replicas(self, namespace: str, name: str) -> int | None:
        """The MachineDeployment's ``spec.replicas`` (None when unset); raise :class:`ScaleError`."""
        obj = self._get(lambda: self.resource_path().item(namespace, name), namespace, name, "MachineDeployment")
        replicas = (obj.get("spec") or {}).get("replicas")
        return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None

    def read_mirror(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The mirror Deployment as stored now; None when it does not exist. Raises :class:`KubeError`."""
        try:
            return self.client.request("GET", DEPLOYMENTS.item(namespace, name), timeout=self.timeout)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def unmark(self, mirror: tuple[str, str], annotation: str) -> None:
        """Remove ``annotation`` from the mirror (a mirror that no longer exists is fine); raise :class:`ScaleError`."""
        namespace, name = mirror
        try:
            self.client.request(
                "PATCH",
                DEPLOYMENTS.item(namespace, name),
                body={"metadata": {"annotations": {annotation: None}}},
                content_type=MERGE_PATCH,
                timeout=self.timeout * 5,
            )
        except KubeError as exc:
            if exc.status != 404:
                raise self._error(exc, namespace, name, self.timeout * 5, kind="Deployment") from None

    def adopt(self, mirror: tuple[str, str], replicas: int, annotation: str, value: str) -> None:
        """Set the mirror to ``replicas`` and mark it adopted, in one merge patch; raise :class:`ScaleError`."""
        namespace, name = mirror
        body = {"metadata": {"annotations": {annotation: value}}, "spec": {"replicas": replicas}}
        try:
            self.client.request(
                "PATCH",
                DEPLOYMENTS.item(namespace, name),
                body=body,
                content_type=MERGE_PATCH,
                timeout=self.timeout * 5,
            )
        except KubeError as exc:
            raise self._error(exc, namespace, name, self.timeout * 5, kind="Deployment") from None

    def _get(self, path_of: Any, namespace: str, name: str, kind: str) -> dict[str, Any]:
        for attempt in (1, 2):
            path = path_of()
            try:
                return self.client.request("GET", path, timeout=self.timeout * 5)
            except KubeError as exc:
                if exc.status == 404 and not _object_missing(exc) and attempt == 1:
                    self.forget_version()
                    continue
                raise self._error(exc, namespace, name, self.timeout * 5, kind=kind) from None
        raise AssertionError("unreachable")

    # --- errors ------------------------------------------------------------------------------

    def _error(
        self, exc: KubeError, namespace: str, name: str, budget: float, kind: str = "MachineDeployment"
    ) -> ScaleError:
        status = exc.status
        if status == 0:
            if "timed out" in exc.message.lower() or "timeout" in exc.message.lower():
                return ScaleError(f"the API server did not answer within {budget:g}s", 503)
            return ScaleError(exc.message, 503)
        if status == 404:
            if not name:
                return ScaleError(exc.message, 404)
            detail = "" if _object_missing(exc) else f" ({exc.message})"
            return ScaleError(f"{kind} {namespace}/{name} not found{detail}", 404)
        if status == 403:
            return ScaleError(f"forbidden: {exc.message}", 403)
        return ScaleError(f"the API server answered {status} {exc.reason}: {exc.message}", denial_code(status))
