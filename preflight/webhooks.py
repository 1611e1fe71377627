"""The webhooks as the API server reaches them: registered, trusted through their caBundle, and answering
a dry run sent through the API server's admission chain."""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

from common.apis import DEPLOYMENTS, METAL3_VERSIONS, SECRETS, SERVICES
from common.kube import KubeError
from common.names import INJECT_CA_FROM_ANNOTATION, METADATA_KEY, METAL3_GROUP
from injection_webhook.decision import DRY_RUN_WARNING
from preflight import tls
from preflight.context import INSTALL, Context, annotations_of, metadata_of
from preflight.install import Component, forbidden
from preflight.report import Finding, fail, ok, skip, warn
from scaling_webhook.decision import DRY_RUN_WARNING_PREFIX, replicas_of


def webhooks(ctx: Context) -> Iterator[Finding]:
    configurations = ctx.configurations()
    for component in ctx.install.components:
        kind = "MutatingWebhookConfiguration" if component.name == "injection" else "ValidatingWebhookConfiguration"
        name = component.deployment_name
        config = configurations.get(component.name)
        if config is None:
            yield fail(
                "webhook",
                f"{kind} {name} is not registered: the API server never calls {component.name}-webhook",
                f"helm upgrade {ctx.install.release} <chart> -n {ctx.install.namespace} --reuse-values (the chart "
                "renders it)",
            )
            continue
        yield _webhook(ctx, component, kind, config)


def _webhook(ctx: Context, component: Component, kind: str, config: dict[str, Any]) -> Finding:
    name = metadata_of(config)["name"]
    hook = (config.get("webhooks") or [{}])[0]
    client_config = hook.get("clientConfig") or {}
    injected_by = annotations_of(config).get(INJECT_CA_FROM_ANNOTATION)
    tls_fix = (
        f"cert-manager's cainjector fills it from Certificate {injected_by}: kubectl -n {ctx.install.namespace} get "
        "certificates, and the cainjector's log"
        if injected_by
        else (
            f"delete the *-webhook-tls Secrets in {ctx.install.namespace} and helm upgrade "
            f"({INSTALL}, 'Install without cert-manager')"
        )
    )
    bundle = base64.b64decode(client_config.get("caBundle") or "")
    if not bundle.strip():
        return fail("webhook", f"{kind} {name} has no caBundle: the API server cannot trust the webhook", tls_fix)
    service = client_config.get("service") or {}
    if not service:
        return ok("webhook", f"{kind} {name} calls {client_config.get('url')} (a url clientConfig: not checked)")
    svc_ns, svc_name, port = service.get("namespace", ""), service.get("name", ""), int(service.get("port") or 443)
    server_name = f"{svc_name}.{svc_ns}.svc"
    svc = ctx.read(SERVICES.item(svc_ns, svc_name))
    if svc is None:
        return fail(
            "webhook",
            f"{kind} {name} calls Service {svc_ns}/{svc_name}, which does not exist",
            "helm upgrade (the chart renders it)",
        )
    spec = svc.get("spec") or {}
    host = spec.get("externalName") if spec.get("type") == "ExternalName" else server_name
    try:
        served = tls.probe(str(host), port, server_name, bundle, ctx.options.timeout)
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
            secret = ctx.read(SECRETS.item(component.namespace, secret_name))
        except KubeError as exc:
            if not forbidden(exc):
                raise
            return skip(
                "webhook",
                f"{kind} {name}: {unreachable} and Secret {component.namespace}/{secret_name} not readable by this "
                "identity: caBundle not checked",
            )
        if secret is None:
            return fail(
                "webhook",
                f"{kind} {name}: the serving certificate's Secret {component.namespace}/{secret_name} does not exist",
                tls_fix,
            )
        try:
            served = tls.verify(base64.b64decode((secret.get("data") or {}).get("tls.crt", "")), bundle, server_name)
        except ValueError as exc:
            return fail(
                "webhook",
                f"{kind} {name}: {exc} (certificate in Secret {component.namespace}/{secret_name})",
                tls_fix,
            )
        how = f"the certificate in Secret {component.namespace}/{secret_name} ({host}:{port} not reachable from here)"
    except ValueError as exc:
        return fail("webhook", f"{kind} {name}: {exc}", tls_fix)
    line = f"{kind} {name}: its caBundle verifies {how} for {server_name}, valid until {served.not_after:%Y-%m-%d}"
    if served.not_after - dt.datetime.now(dt.UTC) < tls.EXPIRY_WARNING:
        return warn("webhook", f"{line}: expires within {tls.EXPIRY_WARNING.days} days", tls_fix)
    return ok("webhook", line)


def admissions(ctx: Context) -> Iterator[Finding]:
    if ctx.install.injection is not None and ctx.injection is not None:
        yield _injection_dry_run(ctx)
    if ctx.install.scaling is not None and ctx.scaling is not None:
        yield _scaling_dry_run(ctx)


def _injection_dry_run(ctx: Context) -> Finding:
    try:
        templates = ctx.templates()
    except KubeError:
        templates = []
    exempt = {"kube-system", ctx.install.namespace}
    namespaces = sorted({metadata_of(t)["namespace"] for t in templates} - exempt)
    if not namespaces:
        return skip(
            "admission",
            "injection-webhook: no opted-in Metal3DataTemplate outside the exempt namespaces to send a dry run to",
        )
    namespace = namespaces[0]
    version = ctx.kube.resource(METAL3_GROUP, "metal3datas", METAL3_VERSIONS).version
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
        ctx.kube.request(
            "POST", SECRETS.collection(namespace), query=[("dryRun", "All")], body=secret, warnings=warnings
        )
    except KubeError as exc:
        if exc.status == 403 and "admission webhook" not in exc.message:
            return skip(
                "admission",
                f"injection-webhook: this identity may not create Secrets in {namespace}, which {what} needs (helm "
                "test's ServiceAccount may not, on purpose)",
            )
        return fail(
            "admission",
            f"injection-webhook: {what} failed: {exc.message}",
            f"the API server could not call the webhook: its Service and endpoints (kubectl -n {ctx.install.namespace} "
            f"get endpoints), the network policy ({INSTALL}) and the webhook line above",
        )
    if DRY_RUN_WARNING in warnings:
        return ok(
            "admission",
            f"injection-webhook: the API server called it for {what}; it answered (no join data on a dry run, as it "
            "must)",
        )
    return fail(
        "admission",
        f"injection-webhook: the API server admitted {what} without calling the webhook",
        "the MutatingWebhookConfiguration does not match it: check injection.extraExemptNamespaces and "
        "injection.objectSelector",
    )


def _scaling_dry_run(ctx: Context) -> Finding:
    mappings = list(ctx.table())
    for mapping in mappings:
        mirror = ctx.read(DEPLOYMENTS.item(*mapping.mirror))
        if mirror is None:
            continue
        replicas = replicas_of(mirror)
        warnings: list[str] = []
        what = f"a server-side dry-run scale of mirror {mapping.mirror_ref}"
        try:
            ctx.kube.request(
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
                    f"scaling-webhook: this identity may not scale {mapping.mirror_ref}, which {what} needs (helm "
                    "test's ServiceAccount may not, on purpose)",
                )
            if (
                "admission webhook" in exc.message
                and f"may not scale mirror Deployment {mapping.mirror_ref}" in exc.message
            ):
                # The webhook answered: scaling.allowedRequesters (and keda.scaleRequesters) do not list this identity.
                return ok(
                    "admission",
                    f"scaling-webhook: the API server called it for {what}; it refused this identity, which the "
                    "requester rule does not list, as it must",
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
            f"scaling-webhook: the API server admitted {what} without an answer from the webhook (failurePolicy Ignore "
            "hides a failed call from every client)",
            "the ValidatingWebhookConfiguration's match (the mirrors it names: scaling.mappings, extraMirrors), "
            f"its Service and endpoints, the network policy ({INSTALL}), and the webhook line above",
        )
    return skip("admission", "scaling-webhook: no mapped mirror exists to send a dry run to")
