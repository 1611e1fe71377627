"""What every check shares: the API client, the release, what was already read, and small readers.

The helpers never print an object's data: checks reason about Secrets (a key's presence, its
length), never show them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import quote

from common.apis import ADMISSION_REGISTRATION, CONFIGMAPS, METAL3_VERSIONS
from common.kube import KubeClient, KubeError, client_from_kubeconfig
from common.names import METAL3_GROUP, OPT_IN_LABEL
from injection_webhook.settings import InjectionSettings
from preflight.install import Installation, can_i
from scaling_webhook.mappings import MappingError, MappingTable, parse_mappings
from scaling_webhook.settings import ScalingSettings

LOCAL = "local"
INSTALL = "docs/install.md"
T = TypeVar("T")


@dataclass
class Options:
    # a mapping's slurmrestd URL -> where slime-check reaches it (kubectl port-forward)
    slurmrestd: dict[str, str] = field(default_factory=dict)
    timeout: float = 5.0


def metadata_of(obj: dict[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("metadata") or {}


def ref_of(obj: dict[str, Any]) -> str:
    """``namespace/name``, or the name of a cluster-scoped object."""
    meta = metadata_of(obj)
    return f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return metadata_of(obj).get("labels") or {}


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    return metadata_of(obj).get("annotations") or {}


class Context:
    """The cluster as one slime-check run sees it; each object list is read once."""

    def __init__(
        self,
        kube: KubeClient,
        install: Installation,
        options: Options | None = None,
        workload_client: Callable[[bytes, str], KubeClient] = client_from_kubeconfig,
    ) -> None:
        self.kube = kube
        self.install = install
        self.options = options or Options()
        self.workload_client = workload_client
        self._table: MappingTable | None = None
        self._templates: list[dict[str, Any]] | None = None
        self._once: dict[str, object] = {}
        self.opened: list[KubeClient] = []

    def close(self) -> None:
        for client in self.opened:
            client.close()

    def once(self, key: str, make: Callable[[], T]) -> T:
        """What ``make`` returns, computed once per run (two checks read the same thing)."""
        if key not in self._once:
            self._once[key] = make()
        return cast(T, self._once[key])

    def read(self, path: str, kube: KubeClient | None = None) -> dict[str, Any] | None:
        try:
            return (kube or self.kube).request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def read_all(self, path: str, kube: KubeClient | None = None, selector: str = "") -> list[dict[str, Any]]:
        query = [("labelSelector", selector)] if selector else []
        items: list[dict[str, Any]] = (kube or self.kube).request("GET", path, query=query).get("items") or []
        return sorted(items, key=ref_of)

    def may(self, user: str, verb: str, resource: str, namespace: str, name: str = "", group: str = "") -> bool | None:
        """The API server's RBAC answer for ``user``; None when this identity may not ask."""
        try:
            return can_i(self.kube, user, verb, resource, namespace, name, group)
        except KubeError:
            return None

    @property
    def injection(self) -> InjectionSettings | None:
        component = self.install.injection
        settings = component.settings if component else None
        return settings if isinstance(settings, InjectionSettings) else None

    @property
    def scaling(self) -> ScalingSettings | None:
        component = self.install.scaling
        settings = component.settings if component else None
        return settings if isinstance(settings, ScalingSettings) else None

    def templates(self) -> list[dict[str, Any]]:
        """The opted-in Metal3DataTemplates (label slurm-controller-namespace), in every namespace."""
        if self._templates is None:
            path = self.kube.resource(METAL3_GROUP, "metal3datatemplates", METAL3_VERSIONS)
            self._templates = self.read_all(path.collection(), selector=OPT_IN_LABEL)
        return self._templates

    def table(self) -> MappingTable:
        if self._table is None:
            settings = self.scaling
            self._table = MappingTable()
            if settings is not None:
                configmap = self.read(CONFIGMAPS.item(settings.namespace, settings.config_map))
                if configmap is not None:
                    try:
                        self._table = parse_mappings(configmap.get("data"), settings.namespace)
                    except MappingError:
                        pass  # the mapping check says so
        return self._table

    def configurations(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for component in self.install.components:
            kind = (
                "mutatingwebhookconfigurations" if component.name == "injection" else "validatingwebhookconfigurations"
            )
            try:
                config = self.read(f"{ADMISSION_REGISTRATION}/{kind}/{quote(component.deployment_name)}")
            except KubeError:
                continue
            if config is not None:
                found[component.name] = config
        return found
