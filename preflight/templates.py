"""The opted-in Metal3DataTemplates as the injection webhook reads them, and the ``bindings`` check.

A template is a tenant's own words: its labels name a Slurm namespace and where the Controller runs,
its annotations ask for an address policy, node features and extra join data. The operator decides
what it may have (``--slurm-bindings``, ``--template-opt-ins``). Each template is read here once, with
the webhook's own parsers and rules (:mod:`injection_webhook.confserver`,
:mod:`injection_webhook.bindings`), in the webhook's order (``resolver._resolve``): its annotations
(one invalid: the webhook denies), the binding of its namespace to the Slurm namespace it names, the
extra join data it asks for. A template the webhook stops at gets no Slinky lookup from slime-check
either; the line that stopped it says why and what to change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from common.kube import KubeError
from common.names import (
    CLUSTER_OVERRIDE_LABEL,
    CONF_SERVER_ANNOTATION,
    CONTROLLER_NAME_LABEL,
    EXTRA_JOIN_DATA_ANNOTATION,
    NODE_FEATURES_ANNOTATION,
    OPT_IN_LABEL,
)
from injection_webhook.bindings import LOCAL_CLUSTER, Binding, Bindings
from injection_webhook.confserver import (
    EXTRAS,
    JWT_KEY,
    JoinOptions,
    Policy,
    PolicyError,
    parse_extras,
    parse_features,
    parse_policy,
    shown,
)
from injection_webhook.settings import InjectionSettings
from preflight.context import INSTALL, Context, annotations_of, labels_of, metadata_of, ref_of
from preflight.report import Finding, Status, fail, ok, warn


@dataclass(frozen=True)
class Template:
    """One opted-in Metal3DataTemplate, read as the webhook reads it."""

    obj: dict[str, Any]
    ref: str  # namespace/name
    namespace: str  # where it and its Metal3Data live
    slurm_namespace: str  # its slurm-controller-namespace label
    controller_name: str  # its slurm-controller-name label ("": the namespace's only Controller)
    cluster_label: str  # its slurm-controller-cluster label as written ("": absent)
    policy: Policy  # its conf-server policy (the operator's default when its annotation is absent or invalid)
    extras: frozenset[str]  # the extra join data its nodes get
    binding_lines: tuple[Finding, ...]  # the bindings check's lines for it
    annotation_lines: tuple[Finding, ...] = ()  # invalid conf-server / node-features annotations

    @property
    def workload(self) -> bool:
        """Is its Controller looked up in each Metal3Data's own workload cluster (not the management cluster)?"""
        return self.cluster_label not in ("", LOCAL_CLUSTER)

    @property
    def stopped(self) -> bool:
        """Does the webhook stop before the Slinky lookup (an invalid annotation, an unbound namespace, a refused
        opt-in)? Its nodes then get no join data, whatever the Controller."""
        return any(f.status is Status.FAIL for f in (*self.binding_lines, *self.annotation_lines))


@dataclass(frozen=True)
class Templates:
    templates: list[Template] = field(default_factory=list)
    unlabelled: list[str] = field(default_factory=list)  # refs of templates whose opt-in label is empty


def cluster_mode(label: str) -> str:
    """Where a template's ``slurm-controller-cluster`` label makes the webhook look, in words."""
    if label == "":
        return f"the management cluster ({CLUSTER_OVERRIDE_LABEL} absent)"
    if label == LOCAL_CLUSTER:
        return f"the management cluster ({CLUSTER_OVERRIDE_LABEL}={LOCAL_CLUSTER})"
    return f"each Metal3Data's own workload cluster ({CLUSTER_OVERRIDE_LABEL}={label})"


def helm_set(ctx: Context, value: str, items: Iterable[str]) -> str:
    """The ``helm upgrade`` line that sets the list ``value`` to ``items`` (all of them: --set replaces a list)."""
    listed = ",".join(dict.fromkeys(items))
    return (
        f"helm upgrade {ctx.install.release} <chart> -n {ctx.install.namespace} --reuse-values "
        f"--set '{value}={{{listed}}}'"
    )


def opted_in(ctx: Context, settings: InjectionSettings) -> Templates:
    """Every opted-in template, read once per run (the bindings and slinky checks share them)."""
    return ctx.once("templates", lambda: _read(ctx, settings))


def _read(ctx: Context, settings: InjectionSettings) -> Templates:
    found = Templates()
    for obj in ctx.templates():
        if not labels_of(obj).get(OPT_IN_LABEL):
            found.unlabelled.append(ref_of(obj))
        else:
            found.templates.append(_template(ctx, obj, settings))
    return found


def _template(ctx: Context, obj: dict[str, Any], settings: InjectionSettings) -> Template:
    labels, annotations = labels_of(obj), annotations_of(obj)
    ref, namespace = ref_of(obj), str(metadata_of(obj).get("namespace") or "")
    options = settings.join_options()
    policy, extras, asked = options.policy, options.extras, frozenset[str]()
    invalid: list[Finding] = []
    denied = "the webhook denies its nodes' metaData Secrets (CAPM3 retries; no node is provisioned)"
    text = annotations.get(CONF_SERVER_ANNOTATION)
    if text is not None:
        try:
            policy = parse_policy(text)
        except PolicyError as exc:
            invalid.append(
                fail(
                    "conf-server",
                    f"Metal3DataTemplate {ref} has an invalid annotation {CONF_SERVER_ANNOTATION}={shown(text)}: "
                    f"{exc}: {denied}",
                    f"hostIP, service, service/<name> or host[:port] ({INSTALL}, 'Choosing a conf-server address "
                    "policy')",
                )
            )
    text = annotations.get(NODE_FEATURES_ANNOTATION)
    if text is not None:
        try:
            parse_features(text)
        except PolicyError as exc:
            invalid.append(
                fail(
                    "conf-server",
                    f"Metal3DataTemplate {ref} has an invalid annotation {NODE_FEATURES_ANNOTATION}={shown(text)}: "
                    f"{exc}: {denied}",
                    "a comma list of the features of the pool's NodeSet, each once",
                )
            )
    lines: list[Finding] = []
    text = annotations.get(EXTRA_JOIN_DATA_ANNOTATION)
    if text is not None:
        try:
            extras = asked = parse_extras(text)
        except PolicyError as exc:
            lines.append(
                fail(
                    "bindings",
                    f"Metal3DataTemplate {ref} has an invalid annotation {EXTRA_JOIN_DATA_ANNOTATION}={shown(text)}: "
                    f"{exc}: {denied}",
                    f"a comma list of {', '.join(EXTRAS)}, or remove the annotation",
                )
            )
    template = Template(
        obj,
        ref,
        namespace,
        labels[OPT_IN_LABEL],
        labels.get(CONTROLLER_NAME_LABEL, ""),
        labels.get(CLUSTER_OVERRIDE_LABEL, ""),
        policy,
        extras,
        (),
        tuple(invalid),
    )
    lines += _bound(ctx, template, settings.bindings())
    lines += _opt_ins(ctx, template, asked, options)
    if not lines:
        lines.append(_granted(template, settings.bindings(), asked, options))
    return replace(template, binding_lines=tuple(lines))


def _where(template: Template, label: bool = False) -> str:
    """The Slurm namespace and cluster a template names (``label``: with its opt-in label, for a FAIL line)."""
    named = f" ({OPT_IN_LABEL}={template.slurm_namespace})" if label else ""
    return f"namespace {template.slurm_namespace}{named} of {cluster_mode(template.cluster_label)}"


def _bound(ctx: Context, template: Template, bindings: Bindings) -> list[Finding]:
    """A FAIL line when the operator's bindings do not let the template's namespace reach the one it names."""
    if bindings.allows(template.namespace, template.slurm_namespace, template.workload):
        return []
    needed = Binding(template.namespace, template.slurm_namespace, template.workload)
    return [
        fail(
            "bindings",
            f"Metal3DataTemplate {template.ref} names the Slinky Controller in {_where(template, label=True)}, and "
            f"namespace {template.namespace} is not bound to it "
            f"(the injection webhook runs with --slurm-bindings {bindings}): its nodes get no join data",
            f"if that tenant may use that Controller, bind it: "
            f"{helm_set(ctx, 'injection.slurmBindings', [*(str(b) for b in bindings.bindings), str(needed)])} "
            f"(in values: add {needed} to injection.slurmBindings); otherwise label the template "
            f"{OPT_IN_LABEL}=<a Slurm namespace bound to {template.namespace}>",
        )
    ]


def _opt_ins(ctx: Context, template: Template, asked: frozenset[str], options: JoinOptions) -> list[Finding]:
    """A FAIL line when the template's annotation asks for extra join data templates may not choose."""
    refused = sorted(asked - options.template_may_ask)
    if not refused:
        return []
    text = annotations_of(template.obj).get(EXTRA_JOIN_DATA_ANNOTATION, "")
    jwt = " (jwt-key also needs the JWT key Secrets' names in injection.jwtKeySecretNames)"
    return [
        fail(
            "bindings",
            f"Metal3DataTemplate {template.ref} asks for {', '.join(refused)} ({EXTRA_JOIN_DATA_ANNOTATION}="
            f"{shown(text)}), which templates may not choose (the injection webhook runs with --template-opt-ins "
            f"{_items(options.template_opt_ins)} and --extra-join-data {_items(options.extras)}): its nodes get no "
            "join data",
            f"if templates may ask for it, allow it: "
            f"{helm_set(ctx, 'injection.templateOptIns', sorted(options.template_opt_ins | set(refused)))}"
            f"{jwt if JWT_KEY in refused else ''}; "
            f"otherwise remove {', '.join(refused)} from the template's annotation {EXTRA_JOIN_DATA_ANNOTATION}",
        )
    ]


def _granted(template: Template, bindings: Bindings, asked: frozenset[str], options: JoinOptions) -> Finding:
    """The ok line: which binding lets the template's namespace reach the one it names, and what it asks for."""
    ns, slurm, workload = template.namespace, template.slurm_namespace, template.workload
    if Bindings().allows(ns, slurm, workload):
        grant = "its own namespace, no binding needed"
    else:
        matching = [str(b) for b in bindings.bindings if Bindings((b,)).allows(ns, slurm, workload)]
        grant = f"namespace {ns} is bound to it ({', '.join(matching)} in --slurm-bindings)"
    line = f"Metal3DataTemplate {template.ref} names the Slinky Controller in {_where(template)}: {grant}"
    if asked:
        line += f"; it asks for {', '.join(sorted(asked))}, which --template-opt-ins or --extra-join-data allow"
    return ok("bindings", line)


def _items(items: frozenset[str]) -> str:
    return ",".join(sorted(items)) or "(none)"


def bindings(ctx: Context) -> Iterator[Finding]:
    """Per opted-in template: may it have join data under the bindings and opt-ins the webhook runs with?"""
    settings = ctx.injection
    if settings is None:
        return
    try:
        found = opted_in(ctx, settings)
    except KubeError as exc:
        if exc.status == 404:
            return  # the api check said so
        raise
    for ref in found.unlabelled:
        yield warn(
            "bindings",
            f"Metal3DataTemplate {ref} carries the label {OPT_IN_LABEL} with no value: the webhook takes it as not "
            "opted in, so its nodes get no join data",
            f"set it to the namespace of the Slinky Controller ({INSTALL}, 'Injection: opt a Metal3DataTemplate in'), "
            "or remove the label",
        )
    for template in found.templates:
        yield from template.binding_lines
