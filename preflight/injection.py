"""What a new node's join data depends on: the Slinky Controller, its key, its active slurmctld, the
address each template's policy gives now, and CAPM3's identity.

Which templates get that far and in which cluster their Controller is looked up are decided as the
webhook decides (:mod:`preflight.templates`, :mod:`preflight.clusters`); the Controller is found by the
webhook's own Slinky walk (:mod:`injection_webhook.slinky`), over live reads instead of its caches.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from common.apis import DEPLOYMENTS, PODS, SECRETS, SERVICES, SLINKY_VERSIONS, STATEFULSETS
from common.kube import KubeError
from common.names import (
    ACTIVE_CONTROLLER_LABEL,
    CAPI_PROVIDER_LABEL,
    CAPM3_PROVIDER,
    CONTROLLER_NAME_LABEL,
    OPT_IN_LABEL,
    SLINKY_GROUP,
)
from injection_webhook.confserver import (
    HOST_IP,
    JWT_KEY,
    SERVICE,
    SLURMCTLD_PORT,
    Endpoint,
    Unsatisfied,
    active_pod,
    controller_names,
    hostip_port,
    hosts_file,
    service_endpoint,
)
from injection_webhook.settings import InjectionSettings
from injection_webhook.slinky import (
    EXTERNAL,
    NO_POD,
    SEVERAL,
    KeyRef,
    NotFound,
    find_slurmctld,
    jwt_key_ref,
    slurm_key_ref,
)
from preflight.apis import INJECTION_APIS
from preflight.clusters import Target, targets
from preflight.context import INSTALL, LOCAL, Context, labels_of, metadata_of, ref_of
from preflight.install import forbidden
from preflight.report import Finding, fail, ok, skip, warn
from preflight.templates import Template, opted_in


@dataclass(frozen=True)
class Slurmctld:
    """What the templates of a target resolve to now."""

    name: str  # the Controller's
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
        templates = opted_in(ctx, settings).templates
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
    reaching: list[Template] = []
    for template in templates:
        yield from template.annotation_lines
        if template.stopped:
            yield skip(
                "slinky",
                f"Metal3DataTemplate {template.ref}: its Slinky Controller not looked up, as the webhook stops before "
                "it: its nodes get no join data (the FAIL line above says why)",
            )
        else:
            reaching.append(template)
    for target in (yield from targets(ctx, reaching)):
        try:
            found = yield from _slurmctld(ctx, target, settings)
            if found is None:
                continue
            yield from _keys(ctx, target, found)
            for template in target.templates:
                yield _conf_server(template, target, found, settings)
        except KubeError as exc:
            if target.cluster == LOCAL:
                raise  # the management cluster: the run's own identity (Checks.run says what it may not read)
            yield fail(
                "slinky",
                f"cannot read namespace {target.namespace} of cluster {target.cluster} ({target.names()}): "
                f"{exc.message}",
                "the webhook reads it with the kubeconfig Cluster API wrote: check that this cluster's API server "
                "answers (from here and from the webhook's pods) and that the kubeconfig's user may list pods, "
                f"services, statefulsets, controllers.{SLINKY_GROUP} and the key Secrets in namespace "
                f"{target.namespace}",
            )


def _slurmctld(ctx: Context, target: Target, settings: InjectionSettings) -> Generator[Finding, None, Slurmctld | None]:
    """The Controller and slurmctld pod the target's templates resolve to (returned), with a line on them."""
    ns, where = target.namespace, f"namespace {target.namespace} of cluster {target.cluster}"
    names = target.names()
    try:
        path = target.kube.resource(SLINKY_GROUP, "controllers", SLINKY_VERSIONS)
    except KubeError as exc:
        if exc.status != 404:
            raise
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
    pods = ctx.read_all(PODS.collection(ns), target.kube, selector)
    statefulsets = {metadata_of(s)["name"]: s for s in ctx.read_all(STATEFULSETS.collection(ns), target.kube, selector)}
    try:
        # The webhook's own walk and choice of the active pod, so the line names the pod nodes get.
        found = find_slurmctld(pods, statefulsets.get, controllers.get, ns, target.controller_name, selector, where)
        pod = active_pod(list(found.pods), f"{ns}/{found.name}")
    except NotFound as exc:
        yield fail("slinky", f"{exc.reason}, for {names}", _not_found_fix(exc, ns, selector))
        return None
    except Unsatisfied as exc:
        yield fail(
            "slinky",
            f"{exc.reason}: nodes provisioned now would be denied (cluster {target.cluster}, for {names})",
            f"wait for the failover to settle (kubectl -n {ns} get pods -l {selector} -L {ACTIVE_CONTROLLER_LABEL}); "
            "Slinky >= 1.3 marks exactly one slurmctld active",
        )
        return None
    if len(found.pods) == 1:
        how = "its only"
    else:
        how = f"of {len(found.pods)} slurmctld pods, the active ({ACTIVE_CONTROLLER_LABEL}=true)"
    status = pod.get("status") or {}
    phase, host = status.get("phase") or "Pending", status.get("hostIP")
    line = (
        f"Controller {ns}/{found.name} ({SLINKY_GROUP}/{path.version}, cluster {target.cluster}, for {names}): {how} "
        f"slurmctld pod {ref_of(pod)} is {phase} on {host or 'no node yet'}"
    )
    if target.notes:
        line += f" ({'; '.join(target.notes)})"
    if phase != "Running":
        yield warn("slinky", line, f"kubectl -n {ns} describe pod {metadata_of(pod)['name']}")
    else:
        yield ok("slinky", line)
    services = ctx.read_all(SERVICES.collection(ns), target.kube)
    return Slurmctld(found.name, found.controller, pod, list(found.pods), found.statefulset, services)


def _not_found_fix(exc: NotFound, ns: str, selector: str) -> str:
    if exc.cause == NO_POD:
        return (
            "set injection.controllerSelector to your Slinky release's labels "
            f"(kubectl -n {ns} get pods --show-labels; now {selector})"
        )
    if exc.cause == SEVERAL:
        return f"label the Metal3DataTemplate {CONTROLLER_NAME_LABEL}=<controller>"
    if exc.cause == EXTERNAL:
        return f"point the template's {CONTROLLER_NAME_LABEL} at a Controller Slinky runs (docs/install.md, Slinky)"
    return (
        "check that the slurmctld StatefulSet is owned by the Slinky Controller (the one the template's "
        f"{CONTROLLER_NAME_LABEL} names, if it names one) and injection.controllerSelector"
    )


def _keys(ctx: Context, target: Target, found: Slurmctld) -> Iterator[Finding]:
    """The Controller's key Secrets the target's templates get: the slurm key, and the JWT key where one asks."""
    refs = [slurm_key_ref(found.name, found.controller)]
    if any(JWT_KEY in t.extras for t in target.templates):
        refs.append(jwt_key_ref(found.name, found.controller))
    for ref in refs:
        yield _key(ctx, target, found.name, ref)


def _key(ctx: Context, target: Target, controller: str, ref: KeyRef) -> Finding:
    ns = target.namespace
    subject = (
        f"Secret {ns}/{ref.secret} key {ref.key} ({ref.what}, {ref.field} of Controller {ns}/{controller}, cluster "
        f"{target.cluster})"
    )
    seen = ""
    try:
        secret = ctx.read(SECRETS.item(ns, ref.secret), target.kube)
    except KubeError as exc:
        if not forbidden(exc) or target.cluster != LOCAL:
            raise
        secret, seen = None, "not readable by this identity"
    if secret is None and not seen:
        return fail("key", f"{subject} does not exist", f"create it, or correct Controller.spec.{ref.field}")
    if secret is not None:
        encoded = (secret.get("data") or {}).get(ref.key)
        if not encoded:
            return fail(
                "key", f"{subject}: the Secret has no key {ref.key}", f"correct Controller.spec.{ref.field}.key"
            )
        try:
            size = len(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            return fail("key", f"{subject} is not valid base64", "re-create the Secret")
        seen = f"{size} bytes"
    component = ctx.install.injection
    if target.cluster != LOCAL or component is None:
        return ok("key", f"{subject}: {seen} (read by the webhook with cluster {target.cluster}'s kubeconfig)")
    allowed = [ctx.may(component.username, verb, "secrets", ns, ref.secret) for verb in ("list", "watch")]
    if None in allowed:
        rbac = "the webhook's RBAC not checked (this identity may not create SubjectAccessReviews)"
    elif all(allowed):
        rbac = "the injection webhook's ServiceAccount may list and watch it"
    else:
        return fail(
            "key",
            f"{subject}: {seen}, but the injection webhook's ServiceAccount ({component.username}) may not list "
            "and watch it",
            _rbac_fix(target, ref),
        )
    return ok("key", f"{subject}: {seen}; {rbac}")


def _rbac_fix(target: Target, ref: KeyRef) -> str:
    """Which chart values grant the webhook a key Secret (charts/slime/templates/rbac-injection.yaml): its name,
    in a namespace the chart grants Slinky's objects in."""
    names = "injection.slurmKeySecretNames" if ref.field == "slurmKeyRef" else "injection.jwtKeySecretNames"
    ns = target.namespace
    bound = sorted({f"{t.namespace}={ns}" for t in target.templates if t.namespace != ns})
    how = f"bound by {', '.join(bound)}" if bound else "the templates' own namespace: list it there"
    return (
        f"the chart grants the webhook key Secrets by name: add {ref.secret} to {names}; in every namespace while "
        "injection.metal3Namespaces is empty, else only in the namespaces it lists and those injection.slurmBindings "
        f"binds, so namespace {ns} must be one of them ({how}); then helm upgrade"
    )


def _conf_server(template: Template, target: Target, found: Slurmctld, settings: InjectionSettings) -> Finding:
    """The address the template's policy gives a node provisioned now, from the target's slurmctld."""
    ref, policy, pod = template.ref, template.policy, found.pod
    pod_ref = ref_of(pod)
    whose = f"cluster {target.cluster}"
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
            f"Metal3DataTemplate {ref} (policy {policy}): nodes provisioned now would be denied: {exc.reason} "
            f"({whose})",
            f"{INSTALL}, 'Choosing a conf-server address policy'",
        )
    note = ""
    if policy.kind == HOST_IP:
        note = " (the node running slurmctld: a node provisioned before a move keeps the old address)"
    line = (
        f"Metal3DataTemplate {ref} (policy {policy}): a node provisioned now gets slurm_conf_server "
        f"{endpoint.conf_server}{note}, from Controller {target.namespace}/{found.name} in {whose}"
    )
    if target.metal3data:
        line += f" (Metal3Data {', '.join(target.metal3data)})"
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
