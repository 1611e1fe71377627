"""What a new node's join data depends on: the Slinky Controller, its key, its active slurmctld, the
address each template's policy gives now, and CAPM3's identity."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from common.apis import DEPLOYMENTS, PODS, SECRETS, SERVICES, SLINKY_VERSIONS, STATEFULSETS
from common.kube import KubeClient, KubeError
from common.meta import owner_name
from common.names import (
    ACTIVE_CONTROLLER_LABEL,
    CAPI_PROVIDER_LABEL,
    CAPM3_PROVIDER,
    CLUSTER_NAME_LABEL,
    CLUSTER_OVERRIDE_LABEL,
    CONF_SERVER_ANNOTATION,
    CONTROLLER_NAME_LABEL,
    EXTRA_JOIN_DATA_ANNOTATION,
    OPT_IN_LABEL,
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
    active_pod,
    controller_names,
    hostip_port,
    hosts_file,
    parse_extras,
    parse_policy,
    service_endpoint,
    shown,
)
from injection_webhook.settings import InjectionSettings
from preflight.apis import INJECTION_APIS
from preflight.context import INSTALL, LOCAL, Context, annotations_of, labels_of, metadata_of, ref_of
from preflight.install import forbidden
from preflight.report import Finding, fail, ok, skip, warn


@dataclass
class Target:
    """One Slinky Controller namespace, in one cluster, that opted-in templates point at."""

    cluster: str
    kube: KubeClient
    namespace: str
    controller_name: str
    templates: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was assumed about where slurmctld runs


@dataclass
class Slurmctld:
    """What the templates of a target resolve to now."""

    controller: dict[str, Any]
    pod: dict[str, Any]  # the active slurmctld: the one a node is pointed at
    pods: list[dict[str, Any]]  # every slurmctld of the Controller: the names a node is given
    statefulset: str
    services: list[dict[str, Any]]


def slinky(ctx: Context) -> Iterator[Finding]:
    settings = ctx.injection
    if settings is None:
        return
    try:
        templates = ctx.templates()
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
        cluster, kube, problem, note = _cluster_of(ctx, template)
        if problem is not None:
            yield problem
            continue
        assert kube is not None
        labels = labels_of(template)
        key = (cluster, labels[OPT_IN_LABEL], labels.get(CONTROLLER_NAME_LABEL, ""))
        target = targets.setdefault(key, Target(cluster, kube, key[1], key[2]))
        target.templates.append(template)
        if note and note not in target.notes:
            target.notes.append(note)
    for target in targets.values():
        found = yield from _slurmctld(ctx, target, settings)
        if found is None:
            continue
        yield from _keys(ctx, target, found, settings)
        for template in target.templates:
            yield _conf_server(template, target, found, settings)


def _cluster_of(ctx: Context, template: dict[str, Any]) -> tuple[str, KubeClient | None, Finding | None, str]:
    """Where a template's slurmctld runs, as the webhook decides: the local cluster, or a workload cluster
    through its kubeconfig Secret. Returns (cluster, its client, a problem, a note on what was assumed)."""
    labels = labels_of(template)
    override = labels.get(CLUSTER_OVERRIDE_LABEL, "")
    if override == LOCAL:
        return LOCAL, ctx.kube, None, ""
    wanted = override or labels.get(CLUSTER_NAME_LABEL) or (template.get("spec") or {}).get("clusterName") or ""
    if not wanted:
        return LOCAL, ctx.kube, None, ""
    namespace = metadata_of(template).get("namespace", "")
    name = f"{wanted}-kubeconfig"
    try:
        secret = ctx.read(SECRETS.item(namespace, name))
    except KubeError as exc:
        if not forbidden(exc):
            raise
        if override:
            skipped = skip(
                "slinky",
                f"Metal3DataTemplate {ref_of(template)}: Secret {namespace}/{name} (cluster {wanted}'s kubeconfig) "
                "not readable by this identity: that cluster's slurmctld not checked",
            )
            return wanted, None, skipped, ""
        # Without the Secret the webhook uses the management cluster: assume that, and say so.
        return LOCAL, ctx.kube, None, f"assumed: Secret {namespace}/{name}, which would name another, not readable here"
    if secret is None:
        if override:
            problem = fail(
                "slinky",
                f"Metal3DataTemplate {ref_of(template)} sets {CLUSTER_OVERRIDE_LABEL}={override}, but Secret "
                f"{namespace}/{name} does not exist",
                f"correct the label, or use {CLUSTER_OVERRIDE_LABEL}={LOCAL} for the management cluster",
            )
            return wanted, None, problem, ""
        return LOCAL, ctx.kube, None, ""  # as the webhook does: no kubeconfig Secret, the management cluster
    try:
        client = ctx.workload_client(
            base64.b64decode((secret.get("data") or {}).get("value", "")), f"{namespace}/{wanted}"
        )
    except (KubeError, binascii.Error, ValueError) as exc:
        problem = fail(
            "slinky", f"Secret {namespace}/{name} holds no usable kubeconfig: {exc}", "let CAPI re-create it"
        )
        return wanted, None, problem, ""
    ctx.opened.append(client)
    return wanted, client, None, ""


def _slurmctld(ctx: Context, target: Target, settings: InjectionSettings) -> Generator[Finding, None, Slurmctld | None]:
    """The Controller and slurmctld pod the target's templates resolve to (returned), with a line on them."""
    ns, where = target.namespace, f"namespace {target.namespace} of cluster {target.cluster}"
    names = ", ".join(ref_of(t) for t in target.templates)
    try:
        path = target.kube.resource(SLINKY_GROUP, "controllers", SLINKY_VERSIONS)
    except KubeError as exc:
        yield fail("slinky", f"cluster {target.cluster} ({names}): {exc.message}", INJECTION_APIS[1].fix)
        return None
    controllers = {metadata_of(c)["name"]: c for c in ctx.read_all(path.collection(ns), target.kube)}
    if not controllers:
        yield fail(
            "slinky",
            f"no Slinky Controller in {where}, which {names} name(s) ({OPT_IN_LABEL}={ns})",
            f"install Slinky's Controller there, or correct the label {OPT_IN_LABEL}",
        )
        return None
    selector = settings.controller_selector
    pods = [
        p
        for p in ctx.read_all(PODS.collection(ns), target.kube, selector)
        if not metadata_of(p).get("deletionTimestamp")
    ]
    if not pods:
        yield fail(
            "slinky",
            f"no slurmctld pod matches {selector} in {where}",
            "set injection.controllerSelector to your Slinky release's labels "
            f"(kubectl -n {ns} get pods --show-labels)",
        )
        return None
    statefulsets = {metadata_of(s)["name"]: s for s in ctx.read_all(STATEFULSETS.collection(ns), target.kube, selector)}
    owned: dict[str, list[dict[str, Any]]] = {}
    statefulset_of: dict[str, str] = {}
    for pod in pods:
        sts_name = owner_name(metadata_of(pod), "StatefulSet", "apps") or ""
        sts = statefulsets.get(sts_name)
        owner = owner_name(metadata_of(sts), "Controller", SLINKY_GROUP) if sts else None
        if owner in controllers and (not target.controller_name or owner == target.controller_name):
            owned.setdefault(str(owner), []).append(pod)
            statefulset_of[str(owner)] = sts_name
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
    try:
        # The webhook's own choice (injection_webhook.confserver.active_pod), so the line names the pod nodes get.
        pod = active_pod(candidates, f"{ns}/{name}")
    except Unsatisfied as exc:
        yield fail(
            "slinky",
            f"{exc.reason}: nodes provisioned now would be denied",
            f"wait for the failover to settle (kubectl -n {ns} get pods -l {selector} -L {ACTIVE_CONTROLLER_LABEL}); "
            "Slinky >= 1.3 marks exactly one slurmctld active",
        )
        return None
    if len(candidates) == 1:
        how = "its only"
    else:
        how = f"of {len(candidates)} slurmctld pods, the active ({ACTIVE_CONTROLLER_LABEL}=true)"
    status = pod.get("status") or {}
    phase, host = status.get("phase") or "Pending", status.get("hostIP")
    version = path.version
    line = (
        f"Controller {ns}/{name} ({SLINKY_GROUP}/{version}, cluster {target.cluster}, for {names}): {how} "
        f"slurmctld pod {ref_of(pod)} is {phase} on {host or 'no node yet'}"
    )
    if target.notes:
        line += f" ({'; '.join(target.notes)})"
    if phase != "Running":
        yield warn("slinky", line, f"kubectl -n {ns} describe pod {metadata_of(pod)['name']}")
    else:
        yield ok("slinky", line)
    services = ctx.read_all(SERVICES.collection(ns), target.kube)
    return Slurmctld(controller, pod, candidates, statefulset_of[name], services)


def _keys(ctx: Context, target: Target, found: Slurmctld, settings: InjectionSettings) -> Iterator[Finding]:
    controller = found.controller
    name = metadata_of(controller)["name"]
    spec = controller.get("spec") or {}
    ref = spec.get("slurmKeyRef") or {}
    refs = [("slurm key", "slurmKeyRef", ref.get("name") or f"{name}-auth-slurm", ref.get("key") or "slurm.key")]
    extras = settings.join_options().extras
    for template in target.templates:
        text = annotations_of(template).get(EXTRA_JOIN_DATA_ANNOTATION)
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
        yield _key(ctx, target, name, what, field_name, secret_name, key)


def _key(
    ctx: Context, target: Target, controller: str, what: str, field_name: str, secret_name: str, key: str
) -> Finding:
    ns = target.namespace
    subject = (
        f"Secret {ns}/{secret_name} key {key} ({what}, {field_name} of Controller {ns}/{controller}, cluster "
        f"{target.cluster})"
    )
    seen = ""
    try:
        secret = ctx.read(SECRETS.item(ns, secret_name), target.kube)
    except KubeError as exc:
        if not forbidden(exc):
            raise
        secret, seen = None, "not readable by this identity"
    if secret is None and not seen:
        return fail("key", f"{subject} does not exist", f"create it, or correct Controller.spec.{field_name}")
    if secret is not None:
        encoded = (secret.get("data") or {}).get(key)
        if not encoded:
            return fail("key", f"{subject}: the Secret has no key {key}", f"correct Controller.spec.{field_name}.key")
        try:
            size = len(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            return fail("key", f"{subject} is not valid base64", "re-create the Secret")
        seen = f"{size} bytes"
    component = ctx.install.injection
    if target.cluster != LOCAL or component is None:
        return ok("key", f"{subject}: {seen} (read by the webhook with cluster {target.cluster}'s kubeconfig)")
    allowed = [ctx.may(component.username, verb, "secrets", ns, secret_name) for verb in ("list", "watch")]
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


def _conf_server(template: dict[str, Any], target: Target, found: Slurmctld, settings: InjectionSettings) -> Finding:
    ref = ref_of(template)
    text = annotations_of(template).get(CONF_SERVER_ANNOTATION)
    try:
        policy = parse_policy(text) if text is not None else settings.join_options().policy
    except PolicyError as exc:
        return fail(
            "conf-server",
            f"Metal3DataTemplate {ref} has an invalid annotation {CONF_SERVER_ANNOTATION}={shown(text or '')}: {exc}",
            f"hostIP, service, service/<name> or host[:port] ({INSTALL}, 'Choosing a conf-server address policy')",
        )
    pod = found.pod
    pod_ref = ref_of(pod)
    try:
        if policy.kind == HOST_IP:
            status = pod.get("status") or {}
            if status.get("phase") != "Running" or not status.get("hostIP"):
                raise Unsatisfied(f"slurmctld pod {pod_ref} is {status.get('phase') or 'Pending'} with no hostIP yet")
            endpoint = Endpoint((str(status["hostIP"]),), hostip_port(found.services, labels_of(pod)))
        elif policy.kind == SERVICE:
            endpoint = service_endpoint(
                policy,
                found.services,
                labels_of(pod),
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
    line = (
        f"Metal3DataTemplate {ref} (policy {policy}): a node provisioned now gets slurm_conf_server "
        f"{endpoint.conf_server}{note}"
    )
    # As the webhook does: the names slurm.conf gives slurmctld go to the node's /etc/hosts (slurm_hosts_base64),
    # which can only map them to an IP address.
    names = controller_names(found.pods, found.statefulset, target.namespace)
    if hosts_file(endpoint.host, names):
        return ok("conf-server", f"{line}; /etc/hosts maps {', '.join(names)} to {endpoint.host}")
    return warn(
        "conf-server",
        f"{line}; {endpoint.host} is not an IP address, so the node gets no /etc/hosts lines for slurmctld's names "
        f"({', '.join(names)})",
        "your site's DNS must resolve those names from the hosts, or give the policy an IP address",
    )


def capm3_identity(ctx: Context) -> Iterator[Finding]:
    settings = ctx.injection
    if settings is None:
        return
    selector = f"{CAPI_PROVIDER_LABEL}={CAPM3_PROVIDER}"
    deployments = ctx.read_all(DEPLOYMENTS.collection(), selector=selector)
    allowed = settings.requesters()
    listed = ", ".join(sorted(allowed))
    if not deployments:
        yield warn(
            "capm3",
            f"no Deployment labelled {selector}: CAPM3's identity not compared with injection.allowedRequesters "
            f"({listed})",
            f"if CAPM3 runs under other labels, compare its ServiceAccount with injection.allowedRequesters "
            f"({INSTALL}, 'Who gets the key')",
        )
        return
    for deployment in deployments:
        spec = deployment["spec"]["template"]["spec"]
        user = (
            f"system:serviceaccount:{metadata_of(deployment)['namespace']}:"
            f"{spec.get('serviceAccountName') or 'default'}"
        )
        if user in allowed:
            yield ok(
                "capm3",
                f"CAPM3 (Deployment {ref_of(deployment)}) runs as {user}, which injection.allowedRequesters lists",
            )
        else:
            yield fail(
                "capm3",
                f"CAPM3 (Deployment {ref_of(deployment)}) runs as {user}, which injection.allowedRequesters ({listed}) "
                "does not list: its metaData Secrets get no join data",
                f"helm upgrade {ctx.install.release} <chart> -n {ctx.install.namespace} --reuse-values "
                f"--set 'injection.allowedRequesters={{{user}}}'",
            )
