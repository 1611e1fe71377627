"""Finds the slurmctld address, port and ``slurm.key`` for a Metal3 metadata Secret.

The chain: Secret -> Metal3Data -> Metal3DataTemplate (owner reference, else
``spec.template.name``, since CAPM3 >= 1.14 dropped that owner) -> opt-in label -> target
cluster (local, or a CAPI workload cluster through its ``<cluster>-kubeconfig`` Secret) ->
slurmctld pod -> StatefulSet -> Slinky Controller -> key Secret (and, where the template opts
in, the JWT key Secret). The address comes from the template's conf-server policy
(``confserver.py``): the pod's ``status.hostIP`` and a NodePort Service, a LoadBalancer or
NodePort Service, or an explicit host.

Every lookup reads an informer, so a warm admission makes no API call, and nothing a review
names is used before :meth:`InjectionResolver.check_owner` found its owner Metal3Data, with the
owner reference's uid, in the cache: no live read is ever made on a review's behalf, and a
Secret is read or a workload-cluster client opened only for what a verified Metal3Data (and its
template) names. ``resolve`` has two modes. ``wait=False`` never blocks and raises
:class:`NeedsWait` when a cache is cold. The app then calls again with ``wait=True`` in a worker
thread, which starts the caches and waits for them (bounded by ``sync_timeout``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.apis import METAL3_VERSIONS, PODS, SECRETS, SERVICES, SLINKY_VERSIONS, STATEFULSETS
from common.cache import Informer, InformerSet
from common.kube import KubeClient, KubeError, ResourcePath, client_from_kubeconfig
from common.logs import redactor
from common.meta import owner_name
from common.names import (
    CAPI_SECRET_TYPE,
    CLUSTER_NAME_LABEL,
    CLUSTER_OVERRIDE_LABEL,
    CONF_SERVER_ANNOTATION,
    CONTROLLER_NAME_LABEL,
    EXTRA_JOIN_DATA_ANNOTATION,
    METAL3_GROUP,
    NODE_FEATURES_ANNOTATION,
    OPT_IN_LABEL,
    SLINKY_GROUP,
)
from injection_webhook.bindings import LOCAL_CLUSTER, WORKLOAD_PREFIX, BindingError, Bindings, controller_cluster
from injection_webhook.confserver import (
    CONTROLLER_NAME,
    HOST_IP,
    JWT_KEY,
    SERVICE,
    SLURMCTLD_PORT,
    Endpoint,
    JoinOptions,
    Policy,
    PolicyError,
    Unsatisfied,
    active_pod,
    controller_names,
    hostip_port,
    hosts_file,
    node_conf,
    parse_extras,
    parse_features,
    parse_policy,
    service_endpoint,
    shown,
)
from injection_webhook.decision import (
    TEMPLATE_OPT_IN,
    UNBOUND,
    JoinInfo,
    MetaDataSecret,
    NotOptedIn,
    Resolution,
    Unresolved,
    Withheld,
)
from injection_webhook.slinky import KeyRef, NotFound, find_slurmctld, jwt_key_ref, slurm_key_ref

log = logging.getLogger("slime.injection.resolver")


class NeedsWait(Exception):
    """A cache needed for this answer is cold; retry with ``wait=True`` off the event loop."""


# A review naming an owner the cache does not hold gets a brief wait (CAPM3 may have created the
# Metal3Data milliseconds ago); one still absent then is remembered for ABSENT_SECONDS, so a flood
# of forged reviews naming it costs a dict lookup each, not a wait.
VERIFY_WAIT_SECONDS = 0.2
ABSENT_SECONDS = 5.0
ABSENT_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class OwnerCheck:
    """What the caches say of a review's owner: the Metal3Data record when verified; ``absent``
    when the cache does not hold that name (yet) and a brief wait may still find it."""

    verified: dict[str, Any] | None = None
    absent: bool = False


# --- transforms: keep only what resolution reads, so 10k cached objects stay small ----------


def _slim_metadata(obj: dict[str, Any], *extra: str) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    keep = ("name", "namespace", "labels", "ownerReferences", "resourceVersion", "deletionTimestamp", *extra)
    return {k: metadata[k] for k in keep if k in metadata}


def _metal3data_record(obj: dict[str, Any]) -> dict[str, Any]:
    """All resolution needs of a Metal3Data: its template's name and its cluster.

    Clusters hold thousands of these, so the cache keeps two interned strings, not the object.
    The template comes from the owner reference (CAPM3 <= 1.13), else ``spec.template.name``.
    """
    template = _owner(obj, "Metal3DataTemplate", METAL3_GROUP) or ((obj.get("spec") or {}).get("template") or {}).get(
        "name"
    )
    cluster = _labels(obj).get(CLUSTER_NAME_LABEL)
    uid = (obj.get("metadata") or {}).get("uid")
    return {
        "template": sys.intern(template) if isinstance(template, str) and template else None,
        "cluster": sys.intern(cluster) if isinstance(cluster, str) and cluster else None,
        "uid": uid if isinstance(uid, str) else "",
    }


_TEMPLATE_LABELS = (OPT_IN_LABEL, CLUSTER_OVERRIDE_LABEL, CONTROLLER_NAME_LABEL)
_TEMPLATE_ANNOTATIONS = (CONF_SERVER_ANNOTATION, EXTRA_JOIN_DATA_ANNOTATION, NODE_FEATURES_ANNOTATION)


def _template_record(obj: dict[str, Any]) -> dict[str, str]:
    """A Metal3DataTemplate as resolution reads it: only SliMe's own labels and annotations
    (their names differ, so one flat map holds both)."""
    labels = _labels(obj)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    record = {k: sys.intern(labels[k]) for k in _TEMPLATE_LABELS if isinstance(labels.get(k), str)}
    record.update({k: annotations[k] for k in _TEMPLATE_ANNOTATIONS if isinstance(annotations.get(k), str)})
    return record


def _slim_statefulset(obj: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": _slim_metadata(obj)}


def _slim_service(obj: dict[str, Any]) -> dict[str, Any]:
    """What the address policies read of a Service: its type, selector, ports and ingress."""
    spec = obj.get("spec") or {}
    ingress = ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress")
    return {
        "metadata": _slim_metadata(obj),
        "spec": {k: spec[k] for k in ("type", "selector", "ports") if k in spec},
        "status": {"loadBalancer": {"ingress": ingress}} if ingress else {},
    }


def _slim_pod(obj: dict[str, Any]) -> dict[str, Any]:
    status = obj.get("status") or {}
    return {"metadata": _slim_metadata(obj), "status": {k: status[k] for k in ("phase", "hostIP") if k in status}}


def _key_secret(obj: dict[str, Any]) -> dict[str, Any]:
    """Key Secrets enter the cache through here, so every key is known to the log redactor."""
    for value in (obj.get("data") or {}).values():
        if isinstance(value, str):
            redactor.register(value)
            try:
                redactor.register(base64.b64decode(value).decode("utf-8"))
            except (binascii.Error, ValueError):
                pass
    return {"metadata": _slim_metadata(obj), "data": obj.get("data") or {}}


def _kubeconfig_record(obj: dict[str, Any]) -> dict[str, Any]:
    """A CAPI kubeconfig Secret as resolution reads it: its type, its cluster label and its ``value``
    (credentials: known to the log redactor like the keys)."""
    value = (obj.get("data") or {}).get("value")
    value = value if isinstance(value, str) else ""
    if value:
        redactor.register(value)
    return {
        "metadata": _slim_metadata(obj),
        "type": obj.get("type") or "",
        "cluster": _labels(obj).get(CLUSTER_NAME_LABEL) or "",
        "value": value,
    }


# --- helpers -------------------------------------------------------------------------------------


def _owner(obj: dict[str, Any], kind: str, group: str) -> str | None:
    return owner_name(obj.get("metadata"), kind, group)


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _b64_value(secret: dict[str, Any], key: str, what: str, cluster: str) -> str:
    """The Secret's ``key`` as canonical base64, or _Missing naming what is wrong (never the value)."""
    meta = secret.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    encoded = (secret.get("data") or {}).get(key)
    if not encoded:
        raise _Missing(f"Secret {name} has no data key {key!r} ({what}; cluster {cluster})")
    try:
        return base64.b64encode(base64.b64decode(encoded, validate=True)).decode("ascii")
    except (binascii.Error, ValueError):
        raise _Missing(f"Secret {name} key {key!r} is not valid base64 ({what}; cluster {cluster})") from None


@dataclass(frozen=True, slots=True)
class _TemplateOptions:
    """What one template chose (its annotations over the operator's defaults); ``asked``: the extra join
    data its own annotation names (checked against what templates may choose)."""

    policy: Policy
    extras: frozenset[str]
    features: tuple[str, ...] = ()
    asked: frozenset[str] = frozenset()


@dataclass
class ClusterView:
    """The caches of one cluster that runs (or may run) slurmctld."""

    client: KubeClient
    controller_selector: str
    on_change: Callable[[], None] | None = None
    informers: InformerSet = field(init=False)
    _slinky: ResourcePath | None = None

    def __post_init__(self) -> None:
        self.informers = InformerSet(self.client, self.on_change)

    @property
    def name(self) -> str:
        return self.client.name

    def pods(self, namespace: str) -> Informer:
        return self.informers.informer(
            PODS.collection(namespace),
            label_selector=self.controller_selector,
            transform=_slim_pod,
            description=f"slurmctld pods in {namespace} ({self.name})",
        )

    def statefulsets(self, namespace: str) -> Informer:
        return self.informers.informer(
            STATEFULSETS.collection(namespace),
            label_selector=self.controller_selector,
            transform=_slim_statefulset,
            description=f"slurmctld statefulsets in {namespace} ({self.name})",
        )

    def services(self, namespace: str) -> Informer:
        return self.informers.informer(
            SERVICES.collection(namespace),
            transform=_slim_service,
            description=f"services in {namespace} ({self.name})",
        )

    def secret(self, namespace: str, name: str) -> Informer:
        return self.informers.informer(
            SECRETS.collection(namespace),
            field_selector=f"metadata.name={name}",
            transform=_key_secret,
            description=f"secret {namespace}/{name} ({self.name})",
        )

    def kubeconfig(self, namespace: str, name: str) -> Informer:
        return self.informers.informer(
            SECRETS.collection(namespace),
            field_selector=f"metadata.name={name}",
            transform=_kubeconfig_record,
            description=f"kubeconfig secret {namespace}/{name} ({self.name})",
        )

    def controllers(self, namespace: str, wait: bool) -> Informer:
        """Slinky Controllers; the served version is discovered once, on first use."""
        if self._slinky is None:
            if not wait:
                raise NeedsWait
            self._slinky = self.client.resource(SLINKY_GROUP, "controllers", SLINKY_VERSIONS)
        return self.informers.informer(
            self._slinky.collection(namespace),
            description=f"controllers in {namespace} ({self.name})",
        )

    def stop(self) -> None:
        self.informers.stop()
        self.client.close()


class InjectionResolver:
    """Resolves :class:`MetaDataSecret` requests from caches of the local and workload clusters."""

    def __init__(
        self,
        local: KubeClient,
        controller_selector: str,
        sync_timeout: float = 5.0,
        workload_client: Callable[[bytes, str], KubeClient] = client_from_kubeconfig,
        options: JoinOptions | None = None,
        bindings: Bindings | None = None,
    ) -> None:
        self.options = options or JoinOptions()
        self.bindings = bindings or Bindings()
        self.local = ClusterView(local, controller_selector, self._caches_changed)
        self.controller_selector = controller_selector
        # Resolutions computed from caches alone, valid until any cache changes. Warm
        # admissions then cost a dict lookup instead of walking the whole chain again.
        self._memo: dict[tuple[str, str, str], Resolution] = {}
        self._memo_generation = 0
        self._generation = 0
        self._change_listeners: list[Callable[[], None]] = []
        self.sync_timeout = sync_timeout
        self._workload_client = workload_client
        self._workloads: dict[tuple[str, str], tuple[str, ClusterView]] = {}
        self._workloads_lock = threading.Lock()
        self._metal3data: Informer | None = None
        self._templates: Informer | None = None
        self._metal3: ResourcePath | None = None
        self._absent: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self.startup_error = ""
        self._discovered = threading.Event()  # set once the Metal3 caches exist (start-up discovery done)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Discover the Metal3 version and start the cluster-wide caches (retries until it can)."""
        threading.Thread(target=self._bootstrap, name="injection-bootstrap", daemon=True).start()

    def _bootstrap(self) -> None:
        delay = 0.2
        while self._metal3 is None:
            try:
                self._metal3 = self.local.client.resource(METAL3_GROUP, "metal3datas", METAL3_VERSIONS)
            except KubeError as exc:
                self.startup_error = str(exc)
                log.warning("Metal3 API not available yet; retrying", extra={"error": str(exc)})
                threading.Event().wait(delay)
                delay = min(delay * 2, 5.0)
        templates = ResourcePath(METAL3_GROUP, self._metal3.version, "metal3datatemplates")
        self._templates = self.local.informers.informer(
            templates.collection(),
            transform=_template_record,
            description="metal3datatemplates",
        )
        self._metal3data = self.local.informers.informer(
            self._metal3.collection(),
            transform=_metal3data_record,
            description="metal3datas",
        )
        self.startup_error = ""
        self._discovered.set()

    @property
    def metal3_version(self) -> str | None:
        """The Metal3 API version the cluster serves (discovered at start), None until known."""
        return self._metal3.version if self._metal3 is not None else None

    def not_ready_reason(self) -> str | None:
        """For /readyz: the cluster-wide caches must have synced."""
        if self._metal3data is None or self._templates is None:
            return self.startup_error or "Metal3 API discovery pending"
        for informer in (self._metal3data, self._templates):
            if not informer.synced:
                return f"cache {informer.description} not synced: {informer.last_error or 'listing'}"
        return None

    def stop(self) -> None:
        self.local.stop()
        with self._workloads_lock:
            views = [view for _, view in self._workloads.values()]
            self._workloads.clear()
        for view in views:
            view.stop()

    # --- cache access ------------------------------------------------------------------------

    def _ready(self, informer: Informer, cluster: str, wait: bool) -> Informer:
        if informer.synced:
            return informer
        if not wait:
            raise NeedsWait
        # A cache that has already failed gets a brief chance, not the full timeout per request.
        patience = self.sync_timeout if not informer.last_error else min(self.sync_timeout, 0.25)
        if not informer.wait_synced(patience):
            why = informer.last_error or f"no answer within {self.sync_timeout:g}s"
            raise _Missing(f"cannot read {informer.description} from cluster {cluster}: {why}")
        return informer

    def _metal3_informer(self, informer: Informer | None, wait: bool) -> Informer:
        if informer is None or self._metal3 is None:
            if not wait:
                raise NeedsWait
            raise _Missing(
                f"the Metal3 API is not available in the management cluster: {self.startup_error or 'starting'}"
            )
        return self._ready(informer, LOCAL_CLUSTER, wait)

    # --- verification: nothing from a review is used before it is found in the caches ---------

    def check_owner(self, secret: MetaDataSecret) -> OwnerCheck:
        """Is the review's owner a Metal3Data the cache holds, with that uid? Cache reads only.

        Raises :class:`NeedsWait` while the Metal3 caches are cold (the app waits for them in a
        worker thread, bounded by the sync timeout)."""
        informer = self._metal3_informer(self._metal3data, wait=False)
        key = (secret.namespace, secret.metal3data, secret.metal3data_uid)
        record = informer.get(secret.namespace, secret.metal3data)
        if record is not None:
            self._absent.pop(key, None)
            verified = bool(secret.metal3data_uid) and record["uid"] == secret.metal3data_uid
            return OwnerCheck(verified=record if verified else None)
        expires = self._absent.get(key)
        if expires is not None and expires > time.monotonic():
            return OwnerCheck()
        return OwnerCheck(absent=True)

    def remember_absent(self, secret: MetaDataSecret) -> None:
        """The owner stayed absent through a brief wait: answer the next reviews naming it at once.

        The cache is still read first every time, so a Metal3Data that arrives later is found."""
        key = (secret.namespace, secret.metal3data, secret.metal3data_uid)
        self._absent[key] = time.monotonic() + ABSENT_SECONDS
        self._absent.move_to_end(key)
        while len(self._absent) > ABSENT_LIMIT:
            self._absent.popitem(last=False)

    def wait_for_metal3_caches(self) -> str | None:
        """Block (in a worker thread) until the Metal3 caches have synced: None, or why they have not
        within the sync timeout (a reason that names the cache, never an object). A review that
        arrives while the start-up discovery is still running waits for it too (up to the sync timeout)."""
        self._discovered.wait(self.sync_timeout)
        try:
            self._metal3_informer(self._metal3data, wait=True)
        except _Missing as missing:
            return missing.reason
        return None

    # --- resolution --------------------------------------------------------------------------

    MEMO_LIMIT = 10_000

    def _caches_changed(self) -> None:
        self._generation += 1
        for listener in self._change_listeners:
            listener()

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on an informer thread) after every change in any cache."""
        self._change_listeners.append(listener)

    def resolve(self, secret: MetaDataSecret, metal3data: dict[str, Any], wait: bool = False) -> Resolution:
        """The join data for the verified Metal3Data ``metal3data`` (a record :meth:`check_owner` found)."""
        key = (secret.namespace, secret.metal3data, metal3data["uid"])
        generation = self._generation
        if generation != self._memo_generation or len(self._memo) >= self.MEMO_LIMIT:
            self._memo = {}
            self._memo_generation = generation
        elif not wait and (known := self._memo.get(key)) is not None:
            return known
        try:
            resolution = self._resolve(secret.namespace, secret.metal3data, metal3data, wait)
        except _Missing as missing:
            resolution = Unresolved(missing.reason)
        if not wait and generation == self._generation:  # read from caches only, none changed meanwhile
            self._memo[key] = resolution
        return resolution

    def _resolve(self, ns: str, name: str, metal3data: dict[str, Any], wait: bool) -> Resolution:
        template_name = metal3data["template"]
        if not template_name:
            raise _Missing(
                f"Metal3Data {ns}/{name} names no Metal3DataTemplate (no owner reference, no spec.template.name)"
            )
        template = self._metal3_informer(self._templates, wait).get(ns, template_name)
        if template is None:
            raise _Missing(
                f"Metal3DataTemplate {ns}/{template_name} (template of Metal3Data {ns}/{name}) does not exist"
            )
        slurm_namespace = template.get(OPT_IN_LABEL)
        if not slurm_namespace:
            return NotOptedIn()
        ref = f"{ns}/{template_name}"
        options = self._template_options(template, ref)
        # The cluster comes from the Metal3Data as CAPM3 labelled it, never from the review.
        try:
            cluster = controller_cluster(template.get(CLUSTER_OVERRIDE_LABEL, ""), metal3data["cluster"] or "")
        except BindingError as exc:
            raise _Missing(f"Metal3DataTemplate {ref} has an invalid label {CLUSTER_OVERRIDE_LABEL}: {exc}") from None
        in_cluster = f"workload cluster {ns}/{cluster}" if cluster else "the management cluster"
        where = f"namespace {slurm_namespace} of {in_cluster}"
        if not self.bindings.allows(ns, slurm_namespace, workload=bool(cluster)):
            binding = f"{ns}={WORKLOAD_PREFIX if cluster else ''}{slurm_namespace}"
            return Withheld(
                UNBOUND,
                f"Metal3DataTemplate {ref} names the Slinky Controller in {where}, and namespace {ns} is not bound "
                f"to it (the operator grants it with the binding {binding} in --slurm-bindings)",
            )
        refused = sorted(options.asked - self.options.template_may_ask)
        if refused:
            return Withheld(
                TEMPLATE_OPT_IN,
                f"Metal3DataTemplate {ref} asks for {', '.join(refused)} ({EXTRA_JOIN_DATA_ANNOTATION}), which "
                "templates may not choose (the operator allows it with --template-opt-ins)",
            )
        view = self._workload_view(ns, cluster, wait) if cluster else self.local
        return self._join_info(view, slurm_namespace, template.get(CONTROLLER_NAME_LABEL, ""), options, wait)

    def _template_options(self, template: dict[str, str], ref: str) -> _TemplateOptions:
        """The template's annotations over the operator's defaults; an invalid one is denied, naming it."""
        policy, extras = self.options.policy, self.options.extras
        features: tuple[str, ...] = ()
        asked: frozenset[str] = frozenset()
        for annotation in _TEMPLATE_ANNOTATIONS:
            value = template.get(annotation)
            if value is None:
                continue
            try:
                if annotation == CONF_SERVER_ANNOTATION:
                    policy = parse_policy(value)
                elif annotation == NODE_FEATURES_ANNOTATION:
                    features = parse_features(value)
                else:
                    extras = asked = parse_extras(value)
            except PolicyError as exc:
                raise _Missing(
                    f"Metal3DataTemplate {ref} has an invalid annotation {annotation}={shown(value)}: {exc}"
                ) from None
        return _TemplateOptions(policy, extras, features, asked)

    def _workload_view(self, namespace: str, cluster: str, wait: bool) -> ClusterView:
        """The workload cluster ``namespace/cluster``, through the kubeconfig Secret Cluster API writes for it."""
        secret_name = f"{cluster}-kubeconfig"
        kubeconfig = self._ready(self.local.kubeconfig(namespace, secret_name), LOCAL_CLUSTER, wait).get(
            namespace, secret_name
        )
        if kubeconfig is None:
            raise _Missing(
                f"Secret {namespace}/{secret_name} (the kubeconfig of Cluster {namespace}/{cluster}) does not exist"
            )
        if kubeconfig["type"] != CAPI_SECRET_TYPE or kubeconfig["cluster"] != cluster:
            raise _Missing(
                f"Secret {namespace}/{secret_name} is not the kubeconfig Cluster API writes for Cluster "
                f"{namespace}/{cluster} (it needs type {CAPI_SECRET_TYPE} and label {CLUSTER_NAME_LABEL}={cluster})"
            )
        encoded = kubeconfig["value"]
        fingerprint = hashlib.sha256(encoded.encode()).hexdigest()
        key = (namespace, cluster)
        with self._workloads_lock:
            known = self._workloads.get(key)
        if known and known[0] == fingerprint:
            return known[1]
        if not wait:
            raise NeedsWait
        try:
            client = self._workload_client(base64.b64decode(encoded, validate=True), f"{namespace}/{cluster}")
        except (binascii.Error, ValueError):
            raise _Missing(f"Secret {namespace}/{secret_name} has no valid base64 key 'value'") from None
        except KubeError as exc:
            raise _Missing(f"{exc.message} (from Secret {namespace}/{secret_name})") from None
        view = ClusterView(client, self.controller_selector, self._caches_changed)
        self._caches_changed()
        with self._workloads_lock:
            replaced = self._workloads.get(key)
            self._workloads[key] = (fingerprint, view)
        if replaced:  # the kubeconfig was rotated: drop the old client and its watches
            replaced[1].stop()
        return view

    def _join_info(
        self, view: ClusterView, namespace: str, controller_name: str, options: _TemplateOptions, wait: bool
    ) -> Resolution:
        where = f"namespace {namespace} of cluster {view.name}"
        try:
            pods = self._ready(view.pods(namespace), view.name, wait).items()
            statefulsets = self._ready(view.statefulsets(namespace), view.name, wait)
            controllers = self._ready(view.controllers(namespace, wait), view.name, wait)
            services = self._ready(view.services(namespace), view.name, wait)
        except KubeError as exc:
            if exc.status == 404:
                raise _Missing(f"no Slinky Controller API in cluster {view.name}: {exc.message}") from None
            raise _Missing(f"cannot reach cluster {view.name}: {exc.message}") from None
        try:
            found = find_slurmctld(
                pods,
                lambda sts: statefulsets.get(namespace, sts),
                lambda name: controllers.get(namespace, name),
                namespace,
                controller_name,
                self.controller_selector,
                where,
            )
            pod = active_pod(list(found.pods), f"{namespace}/{found.name}")
        except NotFound as exc:
            raise _Missing(exc.reason) from None
        except Unsatisfied as exc:
            raise _Missing(f"{exc.reason} (cluster {view.name})") from None
        pod_ref = f"{namespace}/{pod['metadata'].get('name')}"
        endpoint = self._endpoint(options.policy, pod, pod_ref, services.items(), namespace, view.name)
        key_base64 = self._key(view, namespace, found.name, slurm_key_ref(found.name, found.controller), wait)
        jwt_key_base64 = ""
        if JWT_KEY in options.extras:
            jwt = jwt_key_ref(found.name, found.controller)
            jwt_key_base64 = self._key(view, namespace, found.name, jwt, wait, f"; the template asks for {JWT_KEY}")
        # The SlurmctldHost name Slinky < 1.3 writes into slurm.conf is the StatefulSet's pod 0
        # (<controller>-controller-0): fixed by the StatefulSet, whichever node runs it.
        controller_host_name = f"{found.statefulset}-0" if CONTROLLER_NAME in options.extras else ""
        names = controller_names(list(found.pods), found.statefulset, namespace)
        return JoinInfo(
            host=endpoint.host,
            port=endpoint.port,
            key_base64=key_base64,
            source=f"Controller {namespace}/{found.name} in cluster {view.name}",
            conf_server=endpoint.conf_server,
            hosts_file=hosts_file(endpoint.host, names),
            node_conf=node_conf(options.features),
            controller_name=controller_host_name,
            jwt_key_base64=jwt_key_base64,
        )

    def _key(self, view: ClusterView, namespace: str, controller: str, ref: KeyRef, wait: bool, note: str = "") -> str:
        """A Controller's key, as canonical base64 (secret), or _Missing naming the Secret and key (never the value)."""
        what = f"{ref.what} of Controller {namespace}/{controller}{note}"
        secret = self._ready(view.secret(namespace, ref.secret), view.name, wait).get(namespace, ref.secret)
        if secret is None:
            raise _Missing(f"Secret {namespace}/{ref.secret} ({what}) does not exist in cluster {view.name}")
        return _b64_value(secret, ref.key, what, view.name)

    def _endpoint(
        self,
        policy: Policy,
        pod: dict[str, Any],
        pod_ref: str,
        services: list[dict[str, Any]],
        namespace: str,
        cluster: str,
    ) -> Endpoint:
        """Where nodes reach slurmctld under ``policy``; _Missing when it cannot be satisfied yet."""
        if policy.kind == HOST_IP:
            status = pod.get("status") or {}
            if status.get("phase") != "Running":
                raise _Missing(
                    f"slurmctld pod {pod_ref} is {status.get('phase') or 'not yet scheduled'}, not Running (cluster "
                    f"{cluster})"
                )
            host = status.get("hostIP")
            if not host:
                raise _Missing(f"slurmctld pod {pod_ref} has no status.hostIP yet (cluster {cluster})")
            return Endpoint((str(host),), hostip_port(services, _labels(pod)))
        if policy.kind == SERVICE:
            # Neither the pod's phase nor its node matter here: the Service's address does not
            # move with slurmctld, so a node may be given it while slurmctld restarts.
            try:
                return service_endpoint(policy, services, _labels(pod), pod_ref, namespace, self.options.node_addresses)
            except Unsatisfied as exc:
                raise _Missing(f"{exc.reason} (cluster {cluster})") from None
        return Endpoint((policy.host,), policy.port or SLURMCTLD_PORT)


class _Missing(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
