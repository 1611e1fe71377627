"""Which cluster a template's Slinky Controller is looked up in, decided as the injection webhook decides it.

``slurm-controller-cluster`` absent or ``local``: the management cluster. ``workload``: each Metal3Data's
own Cluster, named by the Metal3Data's ``cluster.x-k8s.io/cluster-name`` label (CAPM3 sets it from the
owning Machine). Never the template's own labels or its ``spec.clusterName``: CAPM3 v1.14 deprecates
that field, and one template may serve Metal3Data of several Clusters. The rule is the webhook's
(:func:`injection_webhook.bindings.controller_cluster`), and so is the kubeconfig a workload cluster is
reached through: the Secret ``<cluster>-kubeconfig`` Cluster API writes (its type, its cluster label),
inline credentials only (:func:`common.kube.client_from_kubeconfig`). A Secret's mere existence never
moves the lookup, and nothing falls back: each line names the cluster it checked, or says why none was.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from common.apis import METAL3_VERSIONS, SECRETS
from common.kube import KubeClient, KubeError
from common.meta import owner_name
from common.names import CAPI_SECRET_TYPE, CLUSTER_NAME_LABEL, CLUSTER_OVERRIDE_LABEL, METAL3_GROUP
from injection_webhook.bindings import (
    LOCAL_CLUSTER,
    WORKLOAD_CLUSTER,
    WORKLOAD_PREFIX,
    BindingError,
    controller_cluster,
)
from preflight.context import LOCAL, Context, labels_of, metadata_of, ref_of
from preflight.install import forbidden
from preflight.report import Finding, fail, skip
from preflight.templates import Template


@dataclass
class Target:
    """One Slurm namespace, in one cluster, that templates (and, in a workload cluster, their Metal3Data) reach."""

    cluster: str  # "local" (the management cluster), or "<namespace>/<cluster>" as the webhook names a workload
    kube: KubeClient
    namespace: str
    controller_name: str
    templates: list[Template] = field(default_factory=list)
    metal3data: list[str] = field(default_factory=list)  # in a workload cluster: the Metal3Data it serves
    notes: list[str] = field(default_factory=list)  # how the cluster was reached

    def names(self) -> str:
        """The templates it is for (and their Metal3Data, in a workload cluster), for a line."""
        text = ", ".join(t.ref for t in self.templates)
        return f"{text}; Metal3Data {', '.join(self.metal3data)}" if self.metal3data else text


@dataclass
class _Workload:
    client: KubeClient | None  # None: not reachable from here (the line said why)
    notes: list[str]


def targets(ctx: Context, templates: list[Template]) -> Generator[Finding, None, list[Target]]:
    """The targets the templates resolve to, with a line for each template that resolves to none."""
    found: dict[tuple[str, str, str], Target] = {}
    workloads: dict[tuple[str, str], _Workload] = {}

    def add(cluster: str, kube: KubeClient, template: Template, metal3data: list[str], notes: list[str]) -> None:
        key = (cluster, template.slurm_namespace, template.controller_name)
        target = found.setdefault(key, Target(cluster, kube, template.slurm_namespace, template.controller_name))
        if template not in target.templates:
            target.templates.append(template)
        target.metal3data += metal3data
        target.notes += [n for n in notes if n not in target.notes]

    for template in templates:
        if not template.workload:
            add(LOCAL, ctx.kube, template, [], [])
            continue
        by_cluster = _metal3data(ctx, template)
        if not by_cluster:
            yield skip(
                "slinky",
                f"Metal3DataTemplate {template.ref} ({CLUSTER_OVERRIDE_LABEL}={template.cluster_label}) has no "
                "Metal3Data yet: nothing to check yet (the Controller of each Metal3Data is looked up in that "
                f"Metal3Data's own Cluster, its label {CLUSTER_NAME_LABEL}); run slime-check again once CAPM3 has "
                "made one",
            )
            continue
        for label, refs in sorted(by_cluster.items()):
            try:
                cluster = controller_cluster(template.cluster_label, label)
            except BindingError as exc:
                yield _refused(template, refs, label, exc)
                continue
            key = (template.namespace, cluster)
            if key not in workloads:
                workloads[key] = yield from _workload(ctx, template, cluster, refs)
            workload = workloads[key]
            if workload.client is not None:
                add(f"{template.namespace}/{cluster}", workload.client, template, refs, workload.notes)
    return list(found.values())


def _metal3data(ctx: Context, template: Template) -> dict[str, list[str]]:
    """The template's Metal3Data by their cluster label ("": none), as the webhook ties them to it: the template
    owner reference (CAPM3 <= 1.13), else ``spec.template.name`` (CAPM3 >= 1.14 drops that owner)."""
    path = ctx.kube.resource(METAL3_GROUP, "metal3datas", METAL3_VERSIONS)
    listed = ctx.once(f"metal3datas/{template.namespace}", lambda: ctx.read_all(path.collection(template.namespace)))
    name = metadata_of(template.obj).get("name")
    by_cluster: dict[str, list[str]] = {}
    for data in listed:
        owner = owner_name(metadata_of(data), "Metal3DataTemplate", METAL3_GROUP)
        if (owner or ((data.get("spec") or {}).get("template") or {}).get("name")) == name:
            by_cluster.setdefault(labels_of(data).get(CLUSTER_NAME_LABEL, ""), []).append(ref_of(data))
    return by_cluster


def _refused(template: Template, refs: list[str], label: str, exc: BindingError) -> Finding:
    """The webhook's own refusal of a template's cluster label for these Metal3Data."""
    if not label:
        fix = (
            f"CAPM3 labels each Metal3Data {CLUSTER_NAME_LABEL}=<its Cluster>; or label the template "
            f"{CLUSTER_OVERRIDE_LABEL}={LOCAL_CLUSTER} for the management cluster"
        )
    else:
        fix = (
            f"label the template {CLUSTER_OVERRIDE_LABEL}={WORKLOAD_CLUSTER} (each Metal3Data's own Cluster) or "
            f"{LOCAL_CLUSTER} (the management cluster)"
        )
    return fail(
        "slinky",
        f"Metal3DataTemplate {template.ref} has an invalid label {CLUSTER_OVERRIDE_LABEL}: {exc} (Metal3Data "
        f"{', '.join(refs)}): the webhook denies their metaData Secrets",
        fix,
    )


def _workload(ctx: Context, template: Template, cluster: str, refs: list[str]) -> Generator[Finding, None, _Workload]:
    """Cluster ``<namespace>/<cluster>`` through the kubeconfig Secret Cluster API writes for it, as the webhook
    reaches it (``resolver._workload_view``); a line and no client when it cannot be reached that way."""
    ns, name = template.namespace, f"{cluster}-kubeconfig"
    what = f"Secret {ns}/{name} (the kubeconfig of Cluster {ns}/{cluster})"
    whose = f"Metal3Data {', '.join(refs)} of {template.ref}"
    recreate = f"let Cluster API write it again (kubectl -n {ns} delete secret {name}; it is re-created)"
    try:
        secret = ctx.read(SECRETS.item(ns, name))
    except KubeError as exc:
        if not forbidden(exc):
            raise
        yield skip(
            "slinky",
            f"{what} is not readable by this identity: the Slinky Controller in cluster {ns}/{cluster} not checked "
            f"(for {whose})",
        )
        return _Workload(None, [])
    problem, fix = "", recreate
    if secret is None:
        problem = f"{what} does not exist"
        fix = (
            f"Cluster API writes it once Cluster {ns}/{cluster} has a control plane (kubectl -n {ns} get cluster "
            f"{cluster}); or label the template {CLUSTER_OVERRIDE_LABEL}={LOCAL_CLUSTER} for the management cluster"
        )
    elif secret.get("type") != CAPI_SECRET_TYPE or labels_of(secret).get(CLUSTER_NAME_LABEL) != cluster:
        problem = (
            f"Secret {ns}/{name} is not the kubeconfig Cluster API writes for Cluster {ns}/{cluster} (it needs type "
            f"{CAPI_SECRET_TYPE} and label {CLUSTER_NAME_LABEL}={cluster})"
        )
    else:
        client, problem = _client(ctx, secret, ns, cluster, name)
        if client is not None:
            notes = yield from _rbac(ctx, template, ns, name)
            return _Workload(client, [f"reached through Secret {ns}/{name}", *notes])
    yield fail("slinky", f"{problem}: the webhook denies the metaData Secrets of {whose}", fix)
    return _Workload(None, [])


def _client(ctx: Context, secret: dict[str, Any], ns: str, cluster: str, name: str) -> tuple[KubeClient | None, str]:
    """A client of the workload cluster from the Secret's kubeconfig (inline credentials only), or why not."""
    try:
        kubeconfig = base64.b64decode((secret.get("data") or {}).get("value") or "", validate=True)
    except (binascii.Error, ValueError):
        return None, f"Secret {ns}/{name} has no valid base64 key 'value'"
    if not kubeconfig:
        return None, f"Secret {ns}/{name} has no valid base64 key 'value'"
    try:
        client = ctx.workload_client(kubeconfig, f"{ns}/{cluster}")
    except KubeError as exc:
        return None, f"{exc.message} (from Secret {ns}/{name})"
    ctx.opened.append(client)
    return client, ""


def _rbac(ctx: Context, template: Template, ns: str, name: str) -> Generator[Finding, None, list[str]]:
    """Whether the webhook's ServiceAccount may watch the kubeconfig Secret (a SubjectAccessReview): a note for
    the slinky line, or a FAIL line when it may not."""
    component = ctx.install.injection
    if component is None:
        return []
    allowed = [ctx.may(component.username, verb, "secrets", ns, name) for verb in ("list", "watch")]
    if None in allowed:
        return ["the webhook's RBAC on it not checked (this identity may not create SubjectAccessReviews)"]
    if all(allowed):
        return ["the injection webhook's ServiceAccount may list and watch it"]
    binding = f"{ns}={WORKLOAD_PREFIX}{template.slurm_namespace}"
    yield fail(
        "slinky",
        f"Secret {ns}/{name} (the kubeconfig of Cluster {ns}/{name.removesuffix('-kubeconfig')}): the injection "
        f"webhook's ServiceAccount ({component.username}) may not list and watch it, so the webhook denies the "
        f"metaData Secrets of {template.ref}'s Metal3Data there",
        f"the chart grants kubeconfig Secrets in each namespace bound with {WORKLOAD_PREFIX} in "
        f"injection.slurmBindings (here {binding}): set the bindings there, not through extraEnv or extraArgs, "
        "and helm upgrade",
    )
    return []
