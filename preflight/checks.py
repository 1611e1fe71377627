"""The checks, in the order a new node needs their answers: APIs, Slinky, CAPM3, mappings, webhooks, Slurm.

Each yields :class:`~preflight.report.Finding` lines. They read the cluster with the identity
slime-check runs as; where that identity may not read something (the chart's ``helm test``
ServiceAccount reads no Secret), the check asks the API server whether the *webhook's*
ServiceAccount may (a SubjectAccessReview) and says what it could not see. Nothing here prints
a key, a token or any Secret's value: a key is checked for presence, base64 and length only.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import socket
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

import httpx

from common.kube import KubeClient, KubeError, ResourcePath, client_from_kubeconfig
from common.meta import owner_name
from common.names import (
    CAPI_GROUP,
    CAPI_PROVIDER_LABEL,
    CAPM3_PROVIDER,
    CLUSTER_NAME_LABEL,
    CLUSTER_OVERRIDE_LABEL,
    CONF_SERVER_ANNOTATION,
    CONTROLLER_NAME_LABEL,
    EXTRA_JOIN_DATA_ANNOTATION,
    METADATA_KEY,
    METAL3_GROUP,
    OPT_IN_LABEL,
    ACTIVE_CONTROLLER_LABEL,
    SLINKY_GROUP,
)
from injection_webhook.confserver import (
    HOST_IP,
    JWT_KEY,
    SERVICE,
    SLURMCTLD_PORT,
    Endpoint,
    PolicyError,
    Unsatisfied,
    hostip_port,
    parse_extras,
    parse_policy,
    service_endpoint,
    shown,
)
from injection_webhook.handler import DRY_RUN_WARNING
from injection_webhook.resolver import METAL3_VERSIONS, SLINKY_VERSIONS
from injection_webhook.settings import InjectionSettings
from preflight import tls
from preflight.install import Component, Installation, can_i, forbidden
from preflight.report import Finding, fail, ok, skip, warn
from scaling_webhook.handler import (
    DRY_RUN_WARNING_PREFIX,
    autoscaler_annotations,
    pause_reason,
    replicas_of,
    target_replicas,
)
from scaling_webhook.machinedeployments import CAPI_VERSIONS
from scaling_webhook.mappings import Mapping, MappingError, MappingTable, parse_mappings
from scaling_webhook.safe_scale_in.config import SLURM_API_VERSIONS, SlurmEndpoint
from scaling_webhook.safe_scale_in.slurmrestd import SlurmClient, SlurmUnavailable
from scaling_webhook.settings import ScalingSettings

PODS = ResourcePath("", "v1", "pods")
SERVICES = ResourcePath("", "v1", "services")
SECRETS = ResourcePath("", "v1", "secrets")
CONFIGMAPS = ResourcePath("", "v1", "configmaps")
DEPLOYMENTS = ResourcePath("apps", "v1", "deployments")
STATEFULSETS = ResourcePath("apps", "v1", "statefulsets")
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
LOCAL = "local"
INSTALL = "docs/install.md"


@dataclass(frozen=True)
class Api:
    """An API the product talks to: who needs it, and how to get it."""

    title: str
    group: str
    plurals: tuple[str, ...]
    versions: tuple[str, ...]  # what SliMe speaks, newest first
    needed_by: str
    fix: str


INJECTION_APIS = (
    Api(
        "Metal3 (CAPM3)",
        METAL3_GROUP,
        ("metal3datas", "metal3datatemplates"),
        METAL3_VERSIONS,
        "injection",
        "install CAPM3 (clusterctl init --infrastructure metal3)",
    ),
    Api(
        "Slinky",
        SLINKY_GROUP,
        ("controllers",),
        SLINKY_VERSIONS,
        "injection",
        "install Slinky's slurm-operator with its CRDs where slurmctld runs",
    ),
)
SCALING_APIS = (
    Api(
        "Cluster API",
        CAPI_GROUP,
        ("machinedeployments", "clusters"),
        CAPI_VERSIONS,
        "scaling",
        "install Cluster API (clusterctl init)",
    ),
)
MACHINES_API = Api(
    "Cluster API Machines", CAPI_GROUP, ("machines",), CAPI_VERSIONS, "safe scale-in", "install Cluster API"
)
HOSTS_API = Api(
    "Metal3 BareMetalHosts",
    "metal3.io",
    ("baremetalhosts",),
    ("v1alpha1",),
    "capacity-aware scale-up",
    "install the baremetal-operator",
)
KEDA_API = Api("KEDA", "keda.sh", ("scaledobjects",), ("v1alpha1",), "keda.enabled", "install KEDA")
CERT_MANAGER_API = Api(
    "cert-manager",
    "cert-manager.io",
    ("certificates", "issuers"),
    ("v1",),
    "certManager.enabled",
    "install cert-manager",
)


@dataclass
class Options:
    slurmrestd: dict[str, str] = field(
        default_factory=dict
    )  # a mapping's slurmrestd URL -> where to reach it from here
    timeout: float = 5.0


@dataclass
class Target:
    """One Slinky Controller namespace, in one cluster, that opted-in templates point at."""

    cluster: str
    kube: KubeClient
    namespace: str
    controller_name: str
    templates: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Slurmctld:
    """What the templates of a target resolve to now."""

    controller: dict[str, Any]
    pod: dict[str, Any]
    services: list[dict[str, Any]]


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _ref(obj: dict[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return _meta(obj).get("labels") or {}


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return _meta(obj).get("annotations") or {}


class Checks:
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
        self._opened: list[KubeClient] = []

    def close(self) -> None:
        for client in self._opened:
            client.close()

    # --- helpers -----------------------------------------------------------------------------

    def _get(self, path: str, kube: KubeClient | None = None) -> dict[str, Any] | None:
        try:
            return (kube or self.kube).request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def _list(self, path: str, kube: KubeClient | None = None, selector: str = "") -> list[dict[str, Any]]:
        query = [("labelSelector", selector)] if selector else []
        items: list[dict[str, Any]] = (kube or self.kube).request("GET", path, query=query).get("items") or []
        return sorted(items, key=_ref)

    def _may(self, user: str, verb: str, resource: str, namespace: str, name: str = "", group: str = "") -> bool | None:
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

    def run(self) -> Iterator[Finding]:
        """Every check, each guarded: an API error ends that check with a line, never the run."""
        for check, step in (
            ("release", self.release),
            ("api", self.apis),
            ("slinky", self.slinky),
            ("capm3", self.capm3_identity),
            ("mapping", self.mappings),
            ("webhook", self.webhooks),
            ("admission", self.admissions),
            ("slurmrestd", self.slurmrestd),
        ):
            try:
                yield from step()
            except KubeError as exc:
                if forbidden(exc):
                    yield skip(check, f"this identity may not read what the check needs: {exc.message}")
                else:
                    yield fail(check, f"the API server answered {exc}", "see the message; run again when it answers")

    # --- release ------------------------------------------------------------------------------

    def release(self) -> Iterator[Finding]:
        install = self.install
        if not install.components:
            yield fail(
                "release",
                f"no SliMe release {install.release} in namespace {install.namespace} (no Deployment labelled "
                f"app.kubernetes.io/instance={install.release}, app.kubernetes.io/component=injection-webhook "
                "or scaling-webhook)",
                f"install it ({INSTALL}), or name it: slime-check --namespace <namespace> --release <release>",
            )
            return
        for component in install.components:
            deployment = component.deployment
            what = f"{component.name}-webhook Deployment {_ref(deployment)}"
            if component.problem:
                yield fail(
                    "release",
                    f"{what}: its pods would exit 2 at start: {component.problem}",
                    "correct the value (docs/configuration.md) and helm upgrade",
                )
                continue
            image = component.container.get("image", "")
            wanted = int(deployment["spec"].get("replicas", 1))
            ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
            if ready < 1 <= wanted:
                yield warn(
                    "release",
                    f"{what} (image {image}): {ready}/{wanted} replicas ready",
                    f"kubectl -n {component.namespace} describe pods -l "
                    f"app.kubernetes.io/component={component.name}-webhook; its log names the problem",
                )
            else:
                yield ok("release", f"{what} (image {image}): {ready}/{wanted} replicas ready")

    # --- APIs ---------------------------------------------------------------------------------

    def apis(self) -> Iterator[Finding]:
        wanted: list[Api] = []
        if self.install.injection:
            wanted += INJECTION_APIS
        if self.install.scaling:
            wanted += SCALING_APIS
            table = self.table()
            if any(m.safe_scale_in for m in table):
                wanted.append(MACHINES_API)
            if any(m.capacity_aware for m in table):
                wanted.append(HOSTS_API)
        optional = [KEDA_API] if self.install.scaling else []
        if any("cert-manager.io/inject-ca-from" in _annotations(c) for c in self._configurations().values()):
            wanted.append(CERT_MANAGER_API)
        for api in wanted:
            yield self._api(api, required=True)
        for api in optional:
            yield self._api(api, required=False)

    def served(self, api: Api, kube: KubeClient | None = None) -> tuple[str, str]:
        """(the version SliMe will use, "") or ("", why it cannot)."""
        kube = kube or self.kube
        served = kube.served_versions(api.group)
        if not served:
            return "", f"{api.group} is not served by this cluster"
        usable = [v for v in served if v in api.versions]
        if not usable:
            return "", f"{api.group} is served at {', '.join(served)}, SliMe speaks {', '.join(api.versions)}"
        listed = kube.request("GET", f"/apis/{api.group}/{usable[0]}")
        names = {r.get("name") for r in listed.get("resources") or []}
        missing = [p for p in api.plurals if p not in names]
        if missing:
            return "", f"{api.group}/{usable[0]} does not serve {', '.join(missing)}"
        return usable[0], ""

    def _api(self, api: Api, required: bool) -> Finding:
        version, why = self.served(api)
        plurals = ", ".join(f"{p}.{api.group}" for p in api.plurals)
        if version:
            return ok("api", f"{api.title}: {plurals} served at {version} (needed by {api.needed_by})")
        if required:
            return fail("api", f"{api.title} ({plurals}, needed by {api.needed_by}): {why}", api.fix)
        return skip("api", f"{api.title} ({plurals}): {why}; {api.needed_by} needs it")

    # --- Slinky, the key, the conf-server address ----------------------------------------------

    def templates(self) -> list[dict[str, Any]]:
        """The opted-in Metal3DataTemplates (label slurm-controller-namespace), in every namespace."""
        if self._templates is None:
            path = self.kube.resource(METAL3_GROUP, "metal3datatemplates", METAL3_VERSIONS)
            self._templates = self._list(path.collection(), selector=OPT_IN_LABEL)
        return self._templates

    def slinky(self) -> Iterator[Finding]:
        settings = self.injection
        if settings is None:
            return
        try:
            templates = self.templates()
        except KubeError as exc:
            if exc.status == 404:
                return  # the api check said so
            raise
        if not templates:
            yield warn(
                "slinky",
                f"no Metal3DataTemplate carries the label {OPT_IN_LABEL}: no node will get join data",
                f"kubectl label metal3datatemplate -n <namespace> <template> {OPT_IN_LABEL}=<namespace of the Slinky "
                f"Controller> ({INSTALL}, 'Injection: opt a Metal3DataTemplate in')",
            )
            return
        targets: dict[tuple[str, str, str], Target] = {}
        for template in templates:
            cluster, kube, problem = self._cluster_of(template)
            if problem is not None:
                yield problem
                continue
            assert kube is not None
            labels = _labels(template)
            key = (cluster, labels[OPT_IN_LABEL], labels.get(CONTROLLER_NAME_LABEL, ""))
            target = targets.setdefault(key, Target(cluster, kube, key[1], key[2]))
            target.templates.append(template)
        for target in targets.values():
            found = yield from self._slurmctld(target, settings)
            if found is None:
                continue
            yield from self._keys(target, found, settings)
            for template in target.templates:
                yield self._conf_server(template, target, found, settings)

    def _cluster_of(self, template: dict[str, Any]) -> tuple[str, KubeClient | None, Finding | None]:
        """Where a template's slurmctld runs: the local cluster, or a workload cluster through its kubeconfig Secret."""
        labels = _labels(template)
        override = labels.get(CLUSTER_OVERRIDE_LABEL, "")
        if override == LOCAL:
            return LOCAL, self.kube, None
        wanted = override or labels.get(CLUSTER_NAME_LABEL) or (template.get("spec") or {}).get("clusterName") or ""
        if not wanted:
            return LOCAL, self.kube, None
        namespace = _meta(template).get("namespace", "")
        name = f"{wanted}-kubeconfig"
        try:
            secret = self._get(SECRETS.item(namespace, name))
        except KubeError as exc:
            if not forbidden(exc):
                raise
            return (
                wanted,
                None,
                skip(
                    "slinky",
                    f"Metal3DataTemplate {_ref(template)}: Secret {namespace}/{name} (cluster {wanted}'s kubeconfig) "
                    "not readable by this identity: that cluster's slurmctld not checked",
                ),
            )
        if secret is None:
            if override:
                return (
                    wanted,
                    None,
                    fail(
                        "slinky",
                        f"Metal3DataTemplate {_ref(template)} sets {CLUSTER_OVERRIDE_LABEL}={override}, but Secret "
                        f"{namespace}/{name} does not exist",
                        f"correct the label, or use {CLUSTER_OVERRIDE_LABEL}={LOCAL} for the management cluster",
                    ),
                )
            return LOCAL, self.kube, None  # as the webhook does: no kubeconfig Secret, the management cluster
        try:
            client = self.workload_client(
                base64.b64decode((secret.get("data") or {}).get("value", "")), f"{namespace}/{wanted}"
            )
        except (KubeError, binascii.Error, ValueError) as exc:
            return (
                wanted,
                None,
                fail("slinky", f"Secret {namespace}/{name} holds no usable kubeconfig: {exc}", "let CAPI re-create it"),
            )
        self._opened.append(client)
        return wanted, client, None

    def _slurmctld(self, target: Target, settings: InjectionSettings) -> Generator[Finding, None, Slurmctld | None]:
        """The Controller and slurmctld pod the target's templates resolve to (returned), with a line on them."""
        ns, where = target.namespace, f"namespace {target.namespace} of cluster {target.cluster}"
        names = ", ".join(_ref(t) for t in target.templates)
        try:
            path = target.kube.resource(SLINKY_GROUP, "controllers", SLINKY_VERSIONS)
        except KubeError as exc:
            yield fail("slinky", f"cluster {target.cluster} ({names}): {exc.message}", INJECTION_APIS[1].fix)
            return None
        controllers = {_meta(c)["name"]: c for c in self._list(path.collection(ns), target.kube)}
        if not controllers:
            yield fail(
                "slinky",
                f"no Slinky Controller in {where}, which {names} name(s) ({OPT_IN_LABEL}={ns})",
                f"install Slinky's Controller there, or correct the label {OPT_IN_LABEL}",
            )
            return None
        selector = settings.controller_selector
        pods = [
            p for p in self._list(PODS.collection(ns), target.kube, selector) if not _meta(p).get("deletionTimestamp")
        ]
        if not pods:
            yield fail(
                "slinky",
                f"no slurmctld pod matches {selector} in {where}",
                f"set injection.controllerSelector to your Slinky release's labels (kubectl -n {ns} get pods --show-labels)",
            )
            return None
        statefulsets = {_meta(s)["name"]: s for s in self._list(STATEFULSETS.collection(ns), target.kube, selector)}
        owned: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            sts = statefulsets.get(owner_name(_meta(pod), "StatefulSet", "apps") or "")
            owner = owner_name(_meta(sts), "Controller", SLINKY_GROUP) if sts else None
            if owner in controllers and (not target.controller_name or owner == target.controller_name):
                owned.setdefault(str(owner), []).append(pod)
        if not owned:
            wanted = f"Controller {target.controller_name}" if target.controller_name else "a Slinky Controller"
            yield fail(
                "slinky",
                f"no slurmctld pod in {where} belongs (through its StatefulSet) to {wanted}",
                "check the Controller's StatefulSet and injection.controllerSelector",
            )
            return None
        if len(owned) > 1:
            yield fail(
                "slinky",
                f"{where} runs several Slinky Controllers ({', '.join(sorted(owned))}) and {names} choose none",
                f"label the Metal3DataTemplate {CONTROLLER_NAME_LABEL}=<controller>",
            )
            return None
        name, candidates = next(iter(owned.items()))
        controller = controllers[name]
        active = [p for p in candidates if _labels(p).get(ACTIVE_CONTROLLER_LABEL) == "true"]
        if len(active) == 1:
            pod, how = active[0], f"active ({ACTIVE_CONTROLLER_LABEL}=true)"
        elif len(candidates) == 1 and not active:
            pod, how = candidates[0], "its only"
        else:
            yield fail(
                "slinky",
                f"Controller {ns}/{name}: {len(candidates)} slurmctld pods and {len(active)} marked {ACTIVE_CONTROLLER_LABEL}=true",
                "Slinky >= 1.3 marks exactly one active slurmctld; with an older Slinky run one",
            )
            return None
        status = pod.get("status") or {}
        phase, host = status.get("phase") or "Pending", status.get("hostIP")
        version = path.version
        line = (
            f"Controller {ns}/{name} ({SLINKY_GROUP}/{version}, cluster {target.cluster}, for {names}): {how} "
            f"slurmctld pod {_ref(pod)} is {phase} on {host or 'no node yet'}"
        )
        if phase != "Running":
            yield warn("slinky", line, f"kubectl -n {ns} describe pod {_meta(pod)['name']}")
        else:
            yield ok("slinky", line)
        services = self._list(SERVICES.collection(ns), target.kube)
        return Slurmctld(controller, pod, services)

    def _keys(self, target: Target, found: Slurmctld, settings: InjectionSettings) -> Iterator[Finding]:
        controller = found.controller
        name = _meta(controller)["name"]
        spec = controller.get("spec") or {}
        ref = spec.get("slurmKeyRef") or {}
        refs = [("slurm key", "slurmKeyRef", ref.get("name") or f"{name}-auth-slurm", ref.get("key") or "slurm.key")]
        extras = settings.join_options().extras
        for template in target.templates:
            text = _annotations(template).get(EXTRA_JOIN_DATA_ANNOTATION)
            try:
                extras = extras | (parse_extras(text) if text is not None else frozenset())
            except PolicyError:
                pass  # reported with the template's conf-server line
        if JWT_KEY in extras:
            jwt_ref = spec.get("jwtKeyRef") or spec.get("jwtHs256KeyRef") or {}
            refs.append(
                (
                    "JWT key",
                    "jwtKeyRef",
                    jwt_ref.get("name") or f"{name}-auth-jwths256",
                    jwt_ref.get("key") or "jwt_hs256.key",
                )
            )
        for what, field_name, secret_name, key in refs:
            yield self._key(target, name, what, field_name, secret_name, key)

    def _key(self, target: Target, controller: str, what: str, field_name: str, secret_name: str, key: str) -> Finding:
        ns = target.namespace
        subject = f"Secret {ns}/{secret_name} key {key} ({what}, {field_name} of Controller {ns}/{controller}, cluster {target.cluster})"
        seen = ""
        try:
            secret = self._get(SECRETS.item(ns, secret_name), target.kube)
        except KubeError as exc:
            if not forbidden(exc):
                raise
            secret, seen = None, "not readable by this identity"
        if secret is None and not seen:
            return fail("key", f"{subject} does not exist", f"create it, or correct Controller.spec.{field_name}")
        if secret is not None:
            encoded = (secret.get("data") or {}).get(key)
            if not encoded:
                return fail(
                    "key", f"{subject}: the Secret has no key {key}", f"correct Controller.spec.{field_name}.key"
                )
            try:
                size = len(base64.b64decode(encoded, validate=True))
            except (binascii.Error, ValueError):
                return fail("key", f"{subject} is not valid base64", "re-create the Secret")
            seen = f"{size} bytes"
        component = self.install.injection
        if target.cluster != LOCAL or component is None:
            return ok("key", f"{subject}: {seen} (read by the webhook with cluster {target.cluster}'s kubeconfig)")
        allowed = [self._may(component.username, verb, "secrets", ns, secret_name) for verb in ("list", "watch")]
        if None in allowed:
            rbac = "the webhook's RBAC not checked (this identity may not create SubjectAccessReviews)"
        elif all(allowed):
            rbac = "the injection webhook's ServiceAccount may list and watch it"
        else:
            return fail(
                "key",
                f"{subject}: {seen}, but the injection webhook's ServiceAccount ({component.username}) may not list "
                "and watch it",
                "add the namespace to injection.slurmNamespaces and the name to injection.slurmKeySecretNames (or "
                "injection.jwtKeySecretNames), or leave them empty",
            )
        return ok("key", f"{subject}: {seen}; {rbac}")

    def _conf_server(
        self, template: dict[str, Any], target: Target, found: Slurmctld, settings: InjectionSettings
    ) -> Finding:
        ref = _ref(template)
        text = _annotations(template).get(CONF_SERVER_ANNOTATION)
        try:
            policy = parse_policy(text) if text is not None else settings.join_options().policy
        except PolicyError as exc:
            return fail(
                "conf-server",
                f"Metal3DataTemplate {ref} has an invalid annotation {CONF_SERVER_ANNOTATION}={shown(text or '')}: {exc}",
                f"hostIP, service, service/<name> or host[:port] ({INSTALL}, 'Choosing a conf-server address policy')",
            )
        pod = found.pod
        pod_ref = _ref(pod)
        try:
            if policy.kind == HOST_IP:
                status = pod.get("status") or {}
                if status.get("phase") != "Running" or not status.get("hostIP"):
                    raise Unsatisfied(
                        f"slurmctld pod {pod_ref} is {status.get('phase') or 'Pending'} with no hostIP yet"
                    )
                endpoint = Endpoint((str(status["hostIP"]),), hostip_port(found.services, _labels(pod)))
            elif policy.kind == SERVICE:
                endpoint = service_endpoint(
                    policy,
                    found.services,
                    _labels(pod),
                    pod_ref,
                    target.namespace,
                    settings.join_options().node_addresses,
                )
            else:
                endpoint = Endpoint((policy.host,), policy.port or SLURMCTLD_PORT)
        except Unsatisfied as exc:
            return fail(
                "conf-server",
                f"Metal3DataTemplate {ref} (policy {policy}): nodes provisioned now would be denied: {exc.reason}",
                f"{INSTALL}, 'Choosing a conf-server address policy'",
            )
        note = ""
        if policy.kind == HOST_IP:
            note = " (the node running slurmctld: a node provisioned before a move keeps the old address)"
        return ok(
            "conf-server",
            f"Metal3DataTemplate {ref} (policy {policy}): a node provisioned now gets slurm_conf_server {endpoint.conf_server}{note}",
        )

    # --- CAPM3's identity ------------------------------------------------------------------------

    def capm3_identity(self) -> Iterator[Finding]:
        settings = self.injection
        if settings is None:
            return
        selector = f"{CAPI_PROVIDER_LABEL}={CAPM3_PROVIDER}"
        deployments = self._list(DEPLOYMENTS.collection(), selector=selector)
        allowed = settings.requesters()
        listed = ", ".join(sorted(allowed))
        if not deployments:
            yield warn(
                "capm3",
                f"no Deployment labelled {selector}: CAPM3's identity not compared with injection.allowedRequesters ({listed})",
                f"if CAPM3 runs under other labels, compare its ServiceAccount with injection.allowedRequesters "
                f"({INSTALL}, 'Who gets the key')",
            )
            return
        for deployment in deployments:
            spec = deployment["spec"]["template"]["spec"]
            user = (
                f"system:serviceaccount:{_meta(deployment)['namespace']}:{spec.get('serviceAccountName') or 'default'}"
            )
            if user in allowed:
                yield ok(
                    "capm3",
                    f"CAPM3 (Deployment {_ref(deployment)}) runs as {user}, which injection.allowedRequesters lists",
                )
            else:
                yield fail(
                    "capm3",
                    f"CAPM3 (Deployment {_ref(deployment)}) runs as {user}, which injection.allowedRequesters ({listed}) "
                    "does not list: its metaData Secrets get no join data",
                    f"helm upgrade {self.install.release} <chart> -n {self.install.namespace} --reuse-values "
                    f"--set 'injection.allowedRequesters={{{user}}}'",
                )

    # --- mappings -----------------------------------------------------------------------------

    def table(self) -> MappingTable:
        if self._table is None:
            settings = self.scaling
            self._table = MappingTable()
            if settings is not None:
                configmap = self._get(CONFIGMAPS.item(settings.namespace, settings.config_map))
                if configmap is not None:
                    try:
                        self._table = parse_mappings(configmap.get("data"), settings.namespace)
                    except MappingError:
                        pass  # the mapping check says so
        return self._table

    def mappings(self) -> Iterator[Finding]:
        settings = self.scaling
        if settings is None:
            return
        where = f"ConfigMap {settings.namespace}/{settings.config_map}"
        configmap = self._get(CONFIGMAPS.item(settings.namespace, settings.config_map))
        if configmap is None:
            yield fail(
                "mapping",
                f"{where} (scaling.configMapName) does not exist",
                "scaling.createConfigMap=true, or create it (docs/interfaces.md)",
            )
            return
        try:
            table = parse_mappings(configmap.get("data"), settings.namespace)
        except MappingError as exc:
            yield fail(
                "mapping",
                f"{where} is invalid (the webhook keeps its last good mappings): {exc}",
                "correct scaling.mappings (docs/interfaces.md)",
            )
            return
        if not table:
            yield warn(
                "mapping",
                f"{where} maps nothing: the scaling webhook has no pool to follow",
                "set scaling.mappings (docs/install.md)",
            )
            return
        md_path = self.kube.resource(CAPI_GROUP, "machinedeployments", CAPI_VERSIONS)
        keda = self.served(KEDA_API)[0]
        for mapping in table:
            yield from self._mapping(mapping, md_path, keda)

    def _mapping(self, mapping: Mapping, md_path: ResourcePath, keda: str) -> Iterator[Finding]:
        mirror_ref, md_ref = mapping.mirror_ref, mapping.machine_deployment_ref
        title = f"mirror {mirror_ref} -> MachineDeployment {md_ref}"
        mirror = self._get(DEPLOYMENTS.item(*mapping.mirror))
        md = self._get(md_path.item(*mapping.machine_deployment))
        if mirror is None:
            yield fail(
                "mapping", f"{title}: the mirror Deployment does not exist", "scaling.createMirrors=true, or create it"
            )
        if md is None:
            yield fail("mapping", f"{title}: the MachineDeployment does not exist", "create it, or correct the mapping")
        if mirror is None or md is None:
            return
        managed = autoscaler_annotations(md)
        if managed:
            yield fail(
                "mapping",
                f"{title}: the MachineDeployment is a cluster-autoscaler node group ({', '.join(managed)}): SliMe never writes it",
                "remove the mapping or the autoscaler's annotations: one writer per MachineDeployment",
            )
            return
        cluster_name = (md.get("spec") or {}).get("clusterName")
        cluster = (
            self._get(
                ResourcePath(CAPI_GROUP, md_path.version, "clusters").item(mapping.machine_deployment[0], cluster_name)
            )
            if cluster_name
            else None
        )
        paused = pause_reason(mapping, md, cluster)
        mirror_replicas = replicas_of(mirror)
        md_replicas = replicas_of(md)
        mirror_replicas = 1 if mirror_replicas is None else mirror_replicas
        md_replicas = 1 if md_replicas is None else md_replicas
        bound = f", maxReplicas {mapping.max_replicas}" if mapping.max_replicas is not None else ""
        state = f"{title}: mirror {mirror_replicas}, MachineDeployment {md_replicas}{bound}"
        found_problem = False
        if paused:
            found_problem = True
            yield warn("mapping", f"{state}; it waits: {paused}", "unpause it when the pool may move")
        if mapping.max_replicas is not None and md_replicas > mapping.max_replicas:
            found_problem = True
            yield fail(
                "mapping",
                f"{state}: the MachineDeployment is above maxReplicas",
                "raise maxReplicas (or keda.maxReplicaCount), or scale the mirror down: the leader will lower the pool",
            )
        elif not paused and md_replicas != target_replicas(mapping, mirror_replicas):
            found_problem = True
            yield warn(
                "mapping",
                f"{state}: the MachineDeployment has not followed the mirror (yet)",
                f"kubectl -n {self.install.namespace} get lease (one replica must hold it), and the scaling webhook's log",
            )
        if keda:
            yield from self._scaled_object(mapping, title)
        if not found_problem:
            yield ok("mapping", state)

    def _scaled_object(self, mapping: Mapping, title: str) -> Iterator[Finding]:
        path = ResourcePath(KEDA_API.group, KEDA_API.versions[0], "scaledobjects")
        namespaces = {mapping.mirror[0], mapping.machine_deployment[0]}
        objects = [o for ns in sorted(namespaces) for o in self._list(path.collection(ns))]
        on_md = [
            o
            for o in objects
            if _meta(o).get("namespace") == mapping.machine_deployment[0]
            and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == mapping.machine_deployment[1]
            and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("kind") == "MachineDeployment"
        ]
        for obj in on_md:
            yield fail(
                "mapping",
                f"{title}: ScaledObject {_ref(obj)} scales the MachineDeployment itself: two writers",
                "point the ScaledObject at the mirror (keda.enabled=true renders it)",
            )
        on_mirror = [
            o
            for o in objects
            if _meta(o).get("namespace") == mapping.mirror[0]
            and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == mapping.mirror[1]
            and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("kind", "Deployment") == "Deployment"
        ]
        if on_mirror:
            yield ok("mapping", f"{title}: ScaledObject {', '.join(_ref(o) for o in on_mirror)} scales the mirror")
        else:
            yield warn(
                "mapping",
                f"{title}: no ScaledObject targets the mirror: nothing scales it",
                "keda.enabled=true, or point your own ScaledObject or HPA at the mirror",
            )

    # --- webhook configurations -------------------------------------------------------------------

    def _configurations(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for component in self.install.components:
            kind = (
                "mutatingwebhookconfigurations" if component.name == "injection" else "validatingwebhookconfigurations"
            )
            try:
                config = self._get(f"{ADMISSION}/{kind}/{quote(component.deployment_name)}")
            except KubeError:
                continue
            if config is not None:
                found[component.name] = config
        return found

    def webhooks(self) -> Iterator[Finding]:
        configurations = self._configurations()
        for component in self.install.components:
            kind = "MutatingWebhookConfiguration" if component.name == "injection" else "ValidatingWebhookConfiguration"
            name = component.deployment_name
            config = configurations.get(component.name)
            if config is None:
                yield fail(
                    "webhook",
                    f"{kind} {name} is not registered: the API server never calls {component.name}-webhook",
                    f"helm upgrade {self.install.release} <chart> -n {self.install.namespace} --reuse-values (the chart renders it)",
                )
                continue
            yield self._webhook(component, kind, config)

    def _webhook(self, component: Component, kind: str, config: dict[str, Any]) -> Finding:
        name = _meta(config)["name"]
        hook = (config.get("webhooks") or [{}])[0]
        client_config = hook.get("clientConfig") or {}
        injected_by = _annotations(config).get("cert-manager.io/inject-ca-from")
        tls_fix = (
            f"cert-manager's cainjector fills it from Certificate {injected_by}: kubectl -n {self.install.namespace} get certificates, and the cainjector's log"
            if injected_by
            else f"delete the *-webhook-tls Secrets in {self.install.namespace} and helm upgrade ({INSTALL}, 'Install without cert-manager')"
        )
        bundle = base64.b64decode(client_config.get("caBundle") or "")
        if not bundle.strip():
            return fail("webhook", f"{kind} {name} has no caBundle: the API server cannot trust the webhook", tls_fix)
        service = client_config.get("service") or {}
        if not service:
            return ok("webhook", f"{kind} {name} calls {client_config.get('url')} (a url clientConfig: not checked)")
        svc_ns, svc_name, port = service.get("namespace", ""), service.get("name", ""), int(service.get("port") or 443)
        server_name = f"{svc_name}.{svc_ns}.svc"
        svc = self._get(SERVICES.item(svc_ns, svc_name))
        if svc is None:
            return fail(
                "webhook",
                f"{kind} {name} calls Service {svc_ns}/{svc_name}, which does not exist",
                "helm upgrade (the chart renders it)",
            )
        spec = svc.get("spec") or {}
        host = spec.get("externalName") if spec.get("type") == "ExternalName" else server_name
        try:
            served = tls.probe(str(host), port, server_name, bundle, self.options.timeout)
            how = f"the certificate served at {host}:{port}"
        except tls.NotReachable as unreachable:
            secret_name = next(
                (
                    v["secret"]["secretName"]
                    for v in component.deployment["spec"]["template"]["spec"].get("volumes") or []
                    if v.get("name") == "tls" and "secret" in v
                ),
                f"{component.deployment_name}-tls",
            )
            try:
                secret = self._get(SECRETS.item(component.namespace, secret_name))
            except KubeError as exc:
                if not forbidden(exc):
                    raise
                return skip(
                    "webhook",
                    f"{kind} {name}: {unreachable} and Secret {component.namespace}/{secret_name} not readable by this identity: caBundle not checked",
                )
            if secret is None:
                return fail(
                    "webhook",
                    f"{kind} {name}: the serving certificate's Secret {component.namespace}/{secret_name} does not exist",
                    tls_fix,
                )
            try:
                served = tls.verify(
                    base64.b64decode((secret.get("data") or {}).get("tls.crt", "")), bundle, server_name
                )
            except ValueError as exc:
                return fail(
                    "webhook",
                    f"{kind} {name}: {exc} (certificate in Secret {component.namespace}/{secret_name})",
                    tls_fix,
                )
            how = (
                f"the certificate in Secret {component.namespace}/{secret_name} ({host}:{port} not reachable from here)"
            )
        except ValueError as exc:
            return fail("webhook", f"{kind} {name}: {exc}", tls_fix)
        line = f"{kind} {name}: its caBundle verifies {how} for {server_name}, valid until {served.not_after:%Y-%m-%d}"
        if served.not_after - dt.datetime.now(dt.UTC) < tls.EXPIRY_WARNING:
            return warn("webhook", f"{line}: expires within {tls.EXPIRY_WARNING.days} days", tls_fix)
        return ok("webhook", line)

    # --- dry runs through the API server -------------------------------------------------------

    def admissions(self) -> Iterator[Finding]:
        if self.install.injection is not None and self.injection is not None:
            yield self._injection_dry_run()
        if self.install.scaling is not None and self.scaling is not None:
            yield self._scaling_dry_run()

    def _injection_dry_run(self) -> Finding:
        try:
            templates = self.templates()
        except KubeError:
            templates = []
        exempt = {"kube-system", self.install.namespace}
        namespaces = sorted({_meta(t)["namespace"] for t in templates} - exempt)
        if not namespaces:
            return skip(
                "admission",
                "injection-webhook: no opted-in Metal3DataTemplate outside the exempt namespaces to send a dry run to",
            )
        namespace = namespaces[0]
        version = self.kube.resource(METAL3_GROUP, "metal3datas", METAL3_VERSIONS).version
        probe = f"slime-check-{uuid.uuid4().hex[:8]}"
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": f"{probe}-metadata",
                "namespace": namespace,
                "ownerReferences": [
                    {
                        "apiVersion": f"{METAL3_GROUP}/{version}",
                        "kind": "Metal3Data",
                        "name": probe,
                        "uid": str(uuid.uuid4()),
                    }
                ],
            },
            "type": "Opaque",
            "data": {METADATA_KEY: base64.b64encode(b"providerid: slime-check\n").decode()},
        }
        warnings: list[str] = []
        what = f"a server-side dry run of a metaData Secret in {namespace}"
        try:
            self.kube.request(
                "POST", SECRETS.collection(namespace), query=[("dryRun", "All")], body=secret, warnings=warnings
            )
        except KubeError as exc:
            if exc.status == 403 and "admission webhook" not in exc.message:
                return skip(
                    "admission",
                    f"injection-webhook: this identity may not create Secrets in {namespace}, which {what} needs (helm test's ServiceAccount may not, on purpose)",
                )
            return fail(
                "admission",
                f"injection-webhook: {what} failed: {exc.message}",
                f"the API server could not call the webhook: its Service and endpoints (kubectl -n {self.install.namespace} get endpoints), the network policy ({INSTALL}) and the webhook line above",
            )
        if DRY_RUN_WARNING in warnings:
            return ok(
                "admission",
                f"injection-webhook: the API server called it for {what}; it answered (no join data on a dry run, as it must)",
            )
        return fail(
            "admission",
            f"injection-webhook: the API server admitted {what} without calling the webhook",
            "the MutatingWebhookConfiguration does not match it: check injection.extraExemptNamespaces and injection.objectSelector",
        )

    def _scaling_dry_run(self) -> Finding:
        mappings = list(self.table())
        for mapping in mappings:
            mirror = self._get(DEPLOYMENTS.item(*mapping.mirror))
            if mirror is None:
                continue
            replicas = replicas_of(mirror)
            warnings: list[str] = []
            what = f"a server-side dry-run scale of mirror {mapping.mirror_ref}"
            try:
                self.kube.request(
                    "PATCH",
                    DEPLOYMENTS.item(*mapping.mirror, "scale"),
                    query=[("dryRun", "All")],
                    body={"spec": {"replicas": 1 if replicas is None else replicas}},
                    content_type="application/merge-patch+json",
                    warnings=warnings,
                )
            except KubeError as exc:
                if exc.status == 403 and "admission webhook" not in exc.message:
                    return skip(
                        "admission",
                        f"scaling-webhook: this identity may not scale {mapping.mirror_ref}, which {what} needs (helm test's ServiceAccount may not, on purpose)",
                    )
                return fail(
                    "admission",
                    f"scaling-webhook: {what} failed: {exc.message}",
                    "see the message and the scaling webhook's log",
                )
            if any(w.startswith(DRY_RUN_WARNING_PREFIX) for w in warnings):
                return ok("admission", f"scaling-webhook: the API server called it for {what}; it answered")
            return fail(
                "admission",
                f"scaling-webhook: the API server admitted {what} without an answer from the webhook (failurePolicy Ignore hides a failed call from every client)",
                f"the ValidatingWebhookConfiguration's match (scaling.narrowToMirrors, scaling.extraExemptNamespaces), its Service and endpoints, the network policy ({INSTALL}), and the webhook line above",
            )
        return skip("admission", "scaling-webhook: no mapped mirror exists to send a dry run to")

    # --- slurmrestd ------------------------------------------------------------------------------

    def slurmrestd(self) -> Iterator[Finding]:
        if self.scaling is None:
            return
        endpoints: dict[SlurmEndpoint, list[str]] = {}
        for mapping in self.table():
            for block, config in (("safeScaleIn", mapping.safe_scale_in), ("nodeDemand", mapping.node_demand)):
                if config is not None:
                    endpoints.setdefault(config.endpoint, []).append(f"{mapping.source} {block}")
        for endpoint, users in endpoints.items():
            yield self._slurmrestd(endpoint, users)

    def _slurmrestd(self, endpoint: SlurmEndpoint, users: list[str]) -> Finding:
        url = self.options.slurmrestd.get(endpoint.slurmrestd, endpoint.slurmrestd)
        via = f" (reached at {url})" if url != endpoint.slurmrestd else ""
        secret = f"{endpoint.jwt_secret[0]}/{endpoint.jwt_secret[1]}"
        title = f"{endpoint.slurmrestd}{via} for {', '.join(users)}"
        client = SlurmClient(self.kube, replace(endpoint, slurmrestd=url), timeout=self.options.timeout)
        try:
            version = client.version()
            # slurmrestd answers /ping even with a token it cannot verify (pinged: DOWN): the node list proves the JWT.
            nodes = len(client.nodes())
        except SlurmUnavailable as exc:
            cause = exc.cause
            if "cannot read the JWT signing key Secret" in cause and " 403" in cause:
                return self._slurmrestd_unsigned(endpoint, url, title, secret)
            if "cannot reach" in cause or "did not answer" in cause:
                return fail(
                    "slurmrestd",
                    f"{title}: {cause}",
                    f"run slime-check where that name resolves (helm test {self.install.release} -n {self.install.namespace} runs it in the cluster), "
                    f"or through kubectl port-forward: --slurmrestd {endpoint.slurmrestd}=http://127.0.0.1:<port>",
                )
            if "refused the JWT" in cause:
                return fail(
                    "slurmrestd",
                    f"{title}: {cause}",
                    f"the key in Secret {secret} ({endpoint.jwt_key}) is not the one slurmrestd verifies with, or Slurm does not know user {endpoint.token_user}",
                )
            return fail(
                "slurmrestd", f"{title}: {cause}", "correct jwtSecret/jwtKey/tokenUser/apiVersion in the mapping"
            )
        finally:
            client.close()
        chosen = "configured" if endpoint.api_version else f"the newest of {', '.join(SLURM_API_VERSIONS)} it serves"
        return ok(
            "slurmrestd",
            f"{title}: lists {nodes} node(s) with a JWT signed by Secret {secret} as user {endpoint.token_user}; "
            f"data parser {version} ({chosen})",
        )

    def _slurmrestd_unsigned(self, endpoint: SlurmEndpoint, url: str, title: str, secret: str) -> Finding:
        """No access to the JWT key from here: is slurmrestd there at all, and may the scaling webhook read the key?"""
        component = self.install.scaling
        may = self._may(component.username, "get", "secrets", *endpoint.jwt_secret) if component else None
        rbac = {
            True: "the scaling webhook's ServiceAccount may read it",
            False: "the scaling webhook's ServiceAccount may NOT read it",
            None: "the webhook's RBAC not checked",
        }[may]
        version = endpoint.api_version or SLURM_API_VERSIONS[-1]
        try:
            answer = httpx.get(f"{url}/slurm/{version}/ping", timeout=self.options.timeout)
        except (httpx.HTTPError, socket.gaierror) as exc:
            return fail(
                "slurmrestd",
                f"{title}: cannot reach it: {type(exc).__name__}: {exc}",
                "run slime-check where that name resolves, or with --slurmrestd",
            )
        if may is False:
            return fail(
                "slurmrestd",
                f"{title}: reachable (HTTP {answer.status_code} without a token); Secret {secret}: {rbac}",
                "list the Secret in scaling.safeScaleIn.jwtSecrets or scaling.nodeDemand.jwtSecret",
            )
        return skip(
            "slurmrestd",
            f"{title}: reachable (HTTP {answer.status_code} without a token); the JWT not tried: Secret {secret} not readable by this identity ({rbac})",
        )
