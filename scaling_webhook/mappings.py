"""Mirror Deployment -> MachineDeployment mappings, read from the scaling ConfigMap.

Two forms, which may be combined (docs/interfaces.md, "The scaling ConfigMap"):

* the single-mapping keys: ``machineDeploymentName``, ``machineDeploymentNamespace`` and
  ``maxReplicas``, plus optional ``mirrorDeploymentName`` (default ``mirror-deployment``) and
  ``mirrorDeploymentNamespace`` (default: the webhook's namespace);
* ``mappings``: a YAML list of ``{mirror: <ns>/<name>, machineDeployment: <ns>/<name>}``, each
  with optional ``maxReplicas`` (the most replicas the MachineDeployment is ever set to; the
  chart fills it from the KEDA ``maxReplicaCount``), ``safeScaleIn``, ``capacityAware``,
  ``nodeDemand`` and ``slurmHealth`` (docs/scaling.md).

One MachineDeployment has one writer: two mappings onto the same MachineDeployment, or from the
same mirror, are an error naming both. A pool is never uncapped: a mapping needs ``maxReplicas``
unless ``capacityAware`` caps it by the hosts that can take it; anyone allowed to scale the mirror
could otherwise ask for 2^31-1 Machines.

:func:`parse_mappings` is pure and strict: every problem raises :class:`MappingError` naming
the key and what is wrong. :class:`MappingSource` follows the ConfigMap through an informer,
keeps the last good table when a new version is invalid, and tells listeners about changes.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from collections.abc import Mapping as AnyMapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from common.apis import CONFIGMAPS
from common.cache import Informer
from common.kube import KubeClient
from common.meta import is_dns1123_label, is_dns1123_subdomain
from common.names import (
    CAPACITY_AWARE_KEY,
    MAPPINGS_KEY,
    MAX_REPLICAS_KEY,
    NODE_DEMAND_KEY,
    SAFE_SCALE_IN_KEY,
    SLURM_HEALTH_KEY,
)
from scaling_webhook.demand import NodeDemandConfig
from scaling_webhook.machine_health.config import (
    DEFAULT_MAX_UNHEALTHY,
    DEFAULT_REGISTRATION_TIMEOUT,
    DEFAULT_SLURM_USER,
    DEFAULT_UNHEALTHY_TIMEOUT,
    SlurmHealthConfig,
    parse_duration,
    parse_max_unhealthy,
)
from scaling_webhook.safe_scale_in.config import SafeScaleInConfig, parse_released_nodes
from scaling_webhook.slurm.endpoint import SLURM_API_VERSIONS, SlurmEndpoint

log = logging.getLogger("slime.scaling.mappings")

Ref = tuple[str, str]  # (namespace, name)

DEFAULT_MIRROR_NAME = "mirror-deployment"
SINGLE_MAPPING_KEYS = (
    "machineDeploymentName",
    "machineDeploymentNamespace",
    "mirrorDeploymentName",
    "mirrorDeploymentNamespace",
)
ITEM_KEYS = ("mirror", "machineDeployment")
# Per-mapping options: ``maxReplicas`` and ``safeScaleIn`` (docs/scaling.md).
OPTION_KEYS: tuple[str, ...] = (
    MAX_REPLICAS_KEY,
    SAFE_SCALE_IN_KEY,
    CAPACITY_AWARE_KEY,
    NODE_DEMAND_KEY,
    SLURM_HEALTH_KEY,
)
# Replicas are int32 in Kubernetes (autoscaling/v1 Scale, CAPI MachineDeployment).
MAX_INT32 = 2**31 - 1
OPTION_KEYS_LOWER = {k.lower() for k in OPTION_KEYS}
SLURM_ENDPOINT_KEYS = ("slurmrestd", "jwtSecret", "jwtKey", "apiVersion", "tokenUser")
SAFE_SCALE_IN_KEYS = (*SLURM_ENDPOINT_KEYS, "drainTimeoutSeconds", "releasedNodes")
NODE_DEMAND_KEYS = ("partition", *SLURM_ENDPOINT_KEYS)
SLURM_HEALTH_KEYS = (
    *SLURM_ENDPOINT_KEYS,
    "registrationTimeout",
    "unhealthyTimeout",
    "remediate",
    "maxUnhealthy",
    "slurmUser",
)
# Slurm allows more, but a partition is also a URL path segment (/demand/<partition>) and a label value.
PARTITION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class MappingError(ValueError):
    """The ConfigMap cannot be used; the message names the key and the problem."""


@dataclass(frozen=True, slots=True)
class Mapping:
    """One mirror Deployment driving one MachineDeployment."""

    mirror: Ref
    machine_deployment: Ref
    options: AnyMapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    source: str = ""  # where it was declared, for messages: "the single-mapping keys" or "mappings[0]"
    max_replicas: int | None = None  # the MachineDeployment is never set above this
    capacity_aware: bool = False  # increases are capped at the hosts that can take them (scaling_webhook.capacity)

    @property
    def safe_scale_in(self) -> SafeScaleInConfig | None:
        """The safe scale-in settings, or None when this mapping did not opt in."""
        value = self.options.get(SAFE_SCALE_IN_KEY)
        return value if isinstance(value, SafeScaleInConfig) else None

    @property
    def node_demand(self) -> NodeDemandConfig | None:
        """Where this mapping's node demand is read, or None when it did not opt in."""
        value = self.options.get(NODE_DEMAND_KEY)
        return value if isinstance(value, NodeDemandConfig) else None

    @property
    def slurm_health(self) -> SlurmHealthConfig | None:
        """The machine-health settings, or None when this mapping did not opt in."""
        value = self.options.get(SLURM_HEALTH_KEY)
        return value if isinstance(value, SlurmHealthConfig) else None

    @property
    def mirror_ref(self) -> str:
        return f"{self.mirror[0]}/{self.mirror[1]}"

    @property
    def machine_deployment_ref(self) -> str:
        return f"{self.machine_deployment[0]}/{self.machine_deployment[1]}"


class MappingTable:
    """An immutable lookup from mirror (namespace, name) to its :class:`Mapping`."""

    __slots__ = ("_by_mirror",)

    def __init__(self, mappings: tuple[Mapping, ...] = ()) -> None:
        self._by_mirror: AnyMapping[Ref, Mapping] = MappingProxyType({m.mirror: m for m in mappings})

    def get(self, namespace: str, name: str) -> Mapping | None:
        return self._by_mirror.get((namespace, name))

    def __iter__(self) -> Iterator[Mapping]:
        return iter(self._by_mirror.values())

    def __len__(self) -> int:
        return len(self._by_mirror)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MappingTable) and dict(self._by_mirror) == dict(other._by_mirror)

    def __hash__(self) -> int:
        return hash(frozenset(self._by_mirror.items()))

    def __repr__(self) -> str:
        pairs = ", ".join(f"{m.mirror_ref} -> {m.machine_deployment_ref}" for m in self)
        return f"MappingTable({pairs})"


EMPTY = MappingTable()


# --- parsing -------------------------------------------------------------------------------------


def _check_namespace(value: str, where: str) -> str:
    if not is_dns1123_label(value):
        raise MappingError(f"{where}: namespace {value!r} is not a valid DNS-1123 label")
    return value


def _check_name(value: str, where: str) -> str:
    if not is_dns1123_subdomain(value):
        raise MappingError(f"{where}: name {value!r} is not a valid DNS-1123 subdomain")
    return value


def _ref(value: Any, where: str) -> Ref:
    if not isinstance(value, str):
        raise MappingError(f"{where}: expected a string <namespace>/<name>, got {type(value).__name__}")
    parts = value.split("/")
    if len(parts) != 2 or not all(parts):
        raise MappingError(f"{where}: {value!r} is not of the form <namespace>/<name>")
    return _check_namespace(parts[0], where), _check_name(parts[1], where)


def _block(value: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MappingError(f"{where}: must be a map with keys {', '.join(allowed)}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise MappingError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    for key in ("partition", *SLURM_ENDPOINT_KEYS):
        if key in value and (not isinstance(value[key], str) or not value[key].strip()):
            raise MappingError(f"{where}.{key}: must be a non-empty string")
    return value


def _endpoint(value: dict[str, Any], where: str, shared: SlurmEndpoint | None = None) -> SlurmEndpoint:
    """The slurmrestd endpoint of a block; keys it leaves out come from ``shared`` (the mapping's safeScaleIn)."""
    if shared is None:
        for key in ("slurmrestd", "jwtSecret"):
            if key not in value:
                raise MappingError(f"{where}: missing key {key}")
    elif not any(key in value for key in SLURM_ENDPOINT_KEYS):
        return shared.endpoint
    if shared is not None and ("slurmrestd" not in value or "jwtSecret" not in value):
        raise MappingError(f"{where}: give both slurmrestd and jwtSecret, or neither (to use the safeScaleIn endpoint)")
    url = value["slurmrestd"].strip().rstrip("/")
    if not re.match(r"^https?://[^/\s:]+(:\d{1,5})?(/\S*)?$", url):
        raise MappingError(f"{where}.slurmrestd: {url!r} is not an http:// or https:// URL")
    secret = _ref(value["jwtSecret"].strip(), f"{where}.jwtSecret")
    jwt_key = value.get("jwtKey", "jwt_hs256.key").strip()
    if not re.match(r"^[-._a-zA-Z0-9]+$", jwt_key):
        raise MappingError(f"{where}.jwtKey: {jwt_key!r} is not a valid Secret key")
    version = value.get("apiVersion")
    if version is not None and version.strip() not in SLURM_API_VERSIONS:
        raise MappingError(
            f"{where}.apiVersion: {version!r} is not supported; use one of {', '.join(sorted(SLURM_API_VERSIONS))}"
        )
    return SlurmEndpoint(
        slurmrestd=url,
        jwt_secret=secret,
        jwt_key=jwt_key,
        api_version=version.strip() if version is not None else None,
        token_user=value.get("tokenUser", "slurm").strip(),
    )


def _safe_scale_in(value: Any, where: str) -> SafeScaleInConfig:
    block = _block(value, where, SAFE_SCALE_IN_KEYS)
    endpoint = _endpoint(block, where)
    timeout = block.get("drainTimeoutSeconds")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise MappingError(f"{where}.drainTimeoutSeconds: must be a positive number of seconds, got {timeout!r}")
    try:
        released = parse_released_nodes(block.get("releasedNodes"), f"{where}.releasedNodes")
    except ValueError as exc:
        raise MappingError(str(exc)) from None
    return SafeScaleInConfig(
        **_fields(endpoint),
        drain_timeout_seconds=float(timeout) if timeout is not None else None,
        released_nodes=released,
    )


def _node_demand(value: Any, where: str, shared: SlurmEndpoint | None) -> NodeDemandConfig:
    block = _block(value, where, NODE_DEMAND_KEYS)
    if "partition" not in block:
        raise MappingError(f"{where}: missing key partition")
    partition = block["partition"].strip()
    if not PARTITION_NAME.match(partition):
        raise MappingError(
            f"{where}.partition: {partition!r} is not a Slurm partition name (letters, digits, '.', '_', '-')"
        )
    if shared is None and not all(key in block for key in ("slurmrestd", "jwtSecret")):
        raise MappingError(f"{where}: needs slurmrestd and jwtSecret (here, or in the mapping's safeScaleIn block)")
    return NodeDemandConfig(**_fields(_endpoint(block, where, shared)), partition=partition)


def _slurm_health(value: Any, where: str, shared: SlurmEndpoint | None) -> SlurmHealthConfig:
    block = _block(value, where, SLURM_HEALTH_KEYS)
    if shared is None and not all(key in block for key in ("slurmrestd", "jwtSecret")):
        raise MappingError(
            f"{where}: needs slurmrestd and jwtSecret (here, or in the mapping's safeScaleIn or nodeDemand block)"
        )
    endpoint = _endpoint(block, where, shared)
    try:
        registration = parse_duration(
            block.get("registrationTimeout", DEFAULT_REGISTRATION_TIMEOUT), f"{where}.registrationTimeout"
        )
        unhealthy = parse_duration(
            block.get("unhealthyTimeout", DEFAULT_UNHEALTHY_TIMEOUT), f"{where}.unhealthyTimeout"
        )
        max_unhealthy = parse_max_unhealthy(block.get("maxUnhealthy", DEFAULT_MAX_UNHEALTHY), f"{where}.maxUnhealthy")
    except ValueError as exc:
        raise MappingError(str(exc)) from None
    remediate = _flag(block["remediate"], f"{where}.remediate") if "remediate" in block else False
    slurm_user = block.get("slurmUser", DEFAULT_SLURM_USER)
    if not isinstance(slurm_user, str) or not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", slurm_user.strip()):
        raise MappingError(f"{where}.slurmUser: {slurm_user!r} is not a user name (SlurmUser in slurm.conf)")
    return SlurmHealthConfig(
        **_fields(endpoint),
        registration_timeout_seconds=registration,
        unhealthy_timeout_seconds=unhealthy,
        remediate=remediate,
        max_unhealthy=max_unhealthy,
        slurm_user=slurm_user.strip(),
    )


def _fields(endpoint: SlurmEndpoint) -> dict[str, Any]:
    return {
        "slurmrestd": endpoint.slurmrestd,
        "jwt_secret": endpoint.jwt_secret,
        "jwt_key": endpoint.jwt_key,
        "api_version": endpoint.api_version,
        "token_user": endpoint.token_user,
    }


def _single_mapping(data: AnyMapping[str, Any], namespace: str) -> Mapping | None:
    present = [k for k in SINGLE_MAPPING_KEYS if k in data]
    if not present:
        if MAX_REPLICAS_KEY in data:
            raise MappingError(
                f"{MAX_REPLICAS_KEY}: belongs to the single-mapping keys (machineDeploymentName, ...), which are "
                f"absent; an item of {MAPPINGS_KEY} takes its own {MAX_REPLICAS_KEY}"
            )
        return None
    for key in ("machineDeploymentName", "machineDeploymentNamespace"):
        if key not in data:
            raise MappingError(f"{key}: missing (needed with {', '.join(present)})")
    values = {}
    for key in present:
        value = data[key]
        if not isinstance(value, str) or not value.strip():
            raise MappingError(f"{key}: must be a non-empty string")
        values[key] = value.strip()
    md = (
        _check_namespace(values["machineDeploymentNamespace"], "machineDeploymentNamespace"),
        _check_name(values["machineDeploymentName"], "machineDeploymentName"),
    )
    mirror = (
        _check_namespace(values.get("mirrorDeploymentNamespace", namespace), "mirrorDeploymentNamespace"),
        _check_name(values.get("mirrorDeploymentName", DEFAULT_MIRROR_NAME), "mirrorDeploymentName"),
    )
    max_replicas = None
    if MAX_REPLICAS_KEY in data:
        text = data[MAX_REPLICAS_KEY]
        if not isinstance(text, str) or not text.strip().isdigit():
            raise MappingError(f"{MAX_REPLICAS_KEY}: must be an integer from 0 to {MAX_INT32}, got {text!r}")
        max_replicas = _max_replicas(int(text), MAX_REPLICAS_KEY)
    return Mapping(mirror=mirror, machine_deployment=md, source="the single-mapping keys", max_replicas=max_replicas)


def _list_mappings(text: Any) -> list[Mapping]:
    if not isinstance(text, str):
        raise MappingError(f"{MAPPINGS_KEY}: must be a string holding a YAML list")
    try:
        items = yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise MappingError(f"{MAPPINGS_KEY}: invalid YAML{where}: {problem}") from None
    if items is None:
        return []
    if not isinstance(items, list):
        raise MappingError(f"{MAPPINGS_KEY}: must be a YAML list, got {type(items).__name__}")
    mappings = []
    for index, item in enumerate(items):
        where = f"{MAPPINGS_KEY}[{index}]"
        if not isinstance(item, dict):
            raise MappingError(f"{where}: must be a map with keys {', '.join(ITEM_KEYS)}")
        unknown = sorted(str(k) for k in item if k not in ITEM_KEYS and k not in OPTION_KEYS)
        if unknown:
            raise MappingError(
                f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(ITEM_KEYS)}"
                + (
                    f" (optional: {', '.join(OPTION_KEYS)})"
                    if any(k.lower() in OPTION_KEYS_LOWER for k in unknown)
                    else ""
                )
            )
        for key in ITEM_KEYS:
            if key not in item:
                raise MappingError(f"{where}: missing key {key}")
        parsed: dict[str, Any] = {}
        if SAFE_SCALE_IN_KEY in item:
            parsed[SAFE_SCALE_IN_KEY] = _safe_scale_in(item[SAFE_SCALE_IN_KEY], f"{where}.{SAFE_SCALE_IN_KEY}")
        if NODE_DEMAND_KEY in item:
            parsed[NODE_DEMAND_KEY] = _node_demand(
                item[NODE_DEMAND_KEY], f"{where}.{NODE_DEMAND_KEY}", parsed.get(SAFE_SCALE_IN_KEY)
            )
        if SLURM_HEALTH_KEY in item:
            shared = parsed.get(SAFE_SCALE_IN_KEY) or parsed.get(NODE_DEMAND_KEY)
            parsed[SLURM_HEALTH_KEY] = _slurm_health(item[SLURM_HEALTH_KEY], f"{where}.{SLURM_HEALTH_KEY}", shared)
        options = MappingProxyType(parsed)
        mappings.append(
            Mapping(
                mirror=_ref(item["mirror"], f"{where}.mirror"),
                machine_deployment=_ref(item["machineDeployment"], f"{where}.machineDeployment"),
                options=options,
                source=where,
                max_replicas=_max_replicas(item[MAX_REPLICAS_KEY], f"{where}.{MAX_REPLICAS_KEY}")
                if MAX_REPLICAS_KEY in item
                else None,
                capacity_aware=_flag(item[CAPACITY_AWARE_KEY], f"{where}.{CAPACITY_AWARE_KEY}")
                if CAPACITY_AWARE_KEY in item
                else False,
            )
        )
    return mappings


def _max_replicas(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT32:
        raise MappingError(f"{where}: must be an integer from 0 to {MAX_INT32}, got {value!r}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise MappingError(f"{where}: must be true or false, got {value!r}")
    return value


def uncapped_message(source: str, mirror: str) -> str:
    """Why a mapping without a ceiling is refused (the chart refuses it with the same words)."""
    return (
        f"{source} (mirror {mirror}): {MAX_REPLICAS_KEY} is required unless {CAPACITY_AWARE_KEY} caps the pool: a "
        f"mirror anyone can scale would otherwise ask for up to {MAX_INT32} Machines"
    )


def parse_mappings(data: AnyMapping[str, Any] | None, namespace: str) -> MappingTable:
    """The table described by a ConfigMap's ``data``; ``namespace`` is the webhook's own."""
    data = data or {}
    mappings: list[Mapping] = []
    single = _single_mapping(data, namespace)
    if single is not None:
        mappings.append(single)
    if MAPPINGS_KEY in data:
        mappings.extend(_list_mappings(data[MAPPINGS_KEY]))
    by_mirror: dict[Ref, Mapping] = {}
    by_machine_deployment: dict[Ref, Mapping] = {}
    by_partition: dict[str, Mapping] = {}
    for mapping in mappings:
        if mapping.max_replicas is None and not mapping.capacity_aware:
            raise MappingError(uncapped_message(mapping.source, mapping.mirror_ref))
        first = by_mirror.get(mapping.mirror)
        if first is not None:
            raise MappingError(
                f"{mapping.source}: mirror {mapping.mirror_ref} is already mapped by {first.source} "
                f"(to MachineDeployment {first.machine_deployment_ref}); a mirror may drive only one MachineDeployment"
            )
        first = by_machine_deployment.get(mapping.machine_deployment)
        if first is not None:
            raise MappingError(
                f"{first.source} and {mapping.source} both target MachineDeployment {mapping.machine_deployment_ref} "
                f"(from mirrors {first.mirror_ref} and {mapping.mirror_ref}); one MachineDeployment must have one "
                "writer"
            )
        demand = mapping.node_demand
        if demand is not None:
            first = by_partition.get(demand.partition)
            if first is not None:
                raise MappingError(
                    f"{first.source} and {mapping.source} both publish the node demand of partition "
                    f"{demand.partition!r}; one partition feeds one pool"
                )
            by_partition[demand.partition] = mapping
        by_mirror[mapping.mirror] = mapping
        by_machine_deployment[mapping.machine_deployment] = mapping
    return MappingTable(tuple(mappings))


# --- the live source -----------------------------------------------------------------------------


class MappingSource:
    """The current table, kept in step with the ConfigMap by an informer.

    ``table`` is a plain attribute read (one assignment replaces it), so the admission path
    never locks. ``on_error`` / ``on_valid`` let the app count errors and set its gauge.
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        config_map: str,
        on_status: Callable[[bool, str], None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.config_map = config_map
        self.table: MappingTable = EMPTY
        self.last_error = ""
        self._on_status = on_status
        self._listeners: list[Callable[[MappingTable], None]] = []
        self._seen: tuple[str, str] | None = None  # (uid, resourceVersion) last parsed; ("", "") = absent
        self._lock = threading.Lock()
        self._loaded = threading.Event()  # the first listing has been turned into a table
        self.informer = Informer(
            client,
            CONFIGMAPS.collection(namespace),
            field_selector=f"metadata.name={config_map}",
            description=f"configmap {namespace}/{config_map}",
        )
        self.informer.add_listener(self._refresh)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.config_map}"

    def add_listener(self, callback: Callable[[MappingTable], None]) -> None:
        """Called with the new table after every change (on the informer thread)."""
        self._listeners.append(callback)

    def start(self) -> MappingSource:
        self.informer.start()
        return self

    def stop(self) -> None:
        self.informer.stop()

    def not_ready_reason(self) -> str | None:
        """Readiness: the ConfigMap was listed once (a missing ConfigMap counts: the list succeeded)."""
        if self.loaded:
            return None
        return f"ConfigMap {self.ref} not listed yet" + (
            f": {self.informer.last_error}" if self.informer.last_error else ""
        )

    @property
    def loaded(self) -> bool:
        """True once the first listing (ConfigMap present or not) has been turned into a table."""
        return self._loaded.is_set()

    def _refresh(self) -> None:
        try:
            self._refresh_locked()
        finally:
            if self.informer.synced:
                self._loaded.set()

    def _refresh_locked(self) -> None:
        with self._lock:
            obj = self.informer.get(self.namespace, self.config_map)
            metadata = (obj or {}).get("metadata") or {}
            stamp = (str(metadata.get("uid") or ""), str(metadata.get("resourceVersion") or "")) if obj else ("", "")
            if stamp == self._seen:
                return  # a relist or an unrelated notification: nothing new to parse
            self._seen = stamp
            if obj is None:
                log.warning("scaling ConfigMap not found; no mirror is mapped", extra={"configmap": self.ref})
                self._apply(EMPTY)
                return
            try:
                table = parse_mappings(obj.get("data"), self.namespace)
            except MappingError as exc:
                self.last_error = str(exc)
                log.error(
                    "scaling ConfigMap is invalid; keeping the last good mappings",
                    extra={"configmap": self.ref, "error": self.last_error, "mappings": len(self.table)},
                )
                self._status(False)
                return
            self._apply(table)

    def _apply(self, table: MappingTable) -> None:
        self.last_error = ""
        self._status(True)
        if table == self.table:
            return
        self.table = table
        log.info(
            "scaling mappings loaded",
            extra={"configmap": self.ref, "mappings": [f"{m.mirror_ref} -> {m.machine_deployment_ref}" for m in table]},
        )
        for callback in self._listeners:
            try:
                callback(table)
            except Exception:
                log.exception("mapping listener failed", extra={"configmap": self.ref})

    def _status(self, valid: bool) -> None:
        if self._on_status is not None:
            self._on_status(valid, self.last_error)
