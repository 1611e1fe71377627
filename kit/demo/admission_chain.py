"""Play kube-apiserver's webhook admission chain in front of kubemu, from rendered configurations.

:class:`AdmissionChain` is a kubemu admission hook (``Emulator(admission=chain)``). Given the
``MutatingWebhookConfiguration`` and ``ValidatingWebhookConfiguration`` objects (as ``helm
template`` renders them), it does for every write what the API server does:

1. **select** the webhooks that apply: a ``rules`` entry matches (``operations``, ``apiGroups``,
   ``apiVersions``, ``resources`` with the ``resource/subresource`` form — ``deployments``
   does *not* match a ``deployments/scale`` write, ``*`` matches no subresource, ``*/*`` and
   ``deployments/*`` do — and ``scope``), the ``namespaceSelector`` matches the namespace's labels
   (plus ``kubernetes.io/metadata.name``, which the API server sets on every namespace), the
   ``objectSelector`` matches the new or the old object's labels, and every ``matchConditions``
   CEL expression is true (variables ``object``, ``oldObject``, ``request``; see ``demo.cel``);
2. **call** each one with an AdmissionReview v1 request shaped like the API server's (uid, kind,
   resource, subResource, requestKind/Resource/SubResource, name, namespace, operation,
   userInfo, object, oldObject, dryRun, options) over HTTPS, trusting only the configuration's
   ``caBundle``, bounded by ``timeoutSeconds`` (default 10 s, sent as ``?timeout=Ns``);
3. **mutating webhooks first**, in order; an allowed answer's ``JSONPatch`` is applied to the
   object, which the next webhook and the store then see; **then the validating webhooks**;
4. a denial raises :class:`kubemu.AdmissionDenied` with the API server's text
   ``admission webhook "<name>" denied the request: <message>`` (code from ``status.code``,
   at least 400); a failed call (connection, TLS, timeout, bad answer) follows
   ``failurePolicy``: ``Fail`` denies with ``failed calling webhook "<name>": ...`` (500),
   ``Ignore`` goes on. A matchCondition that errors also follows ``failurePolicy``.

A dry-run request to a webhook whose ``sideEffects`` is ``Some``/``Unknown`` is rejected, as the
API server does. Simplifications: webhooks are called one after another (the API server calls
validating webhooks in parallel), ``matchPolicy: Equivalent`` matches only the exact group and
version, ``reinvocationPolicy: IfNeeded`` is not replayed, and ``clientConfig.service`` must be
replaced by a ``url`` (:func:`point_to_local`), since there is no Service network here.

Every call is recorded in :attr:`AdmissionChain.calls` (webhook, request, outcome, message).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonpatch

from demo.cel import MatchConditionError, evaluate_match_conditions
from kubemu.admission import AdmissionAttributes, AdmissionDenied

MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DEFAULT_TIMEOUT_SECONDS = 10

NamespaceLabels = Callable[[str], "Mapping[str, str] | None"]

_OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


class WebhookCallError(Exception):
    """The webhook could not be called or gave an unusable answer (failurePolicy decides)."""


@dataclass
class Webhook:
    """One entry of a webhook configuration's ``webhooks`` list, ready to call."""

    name: str
    configuration: str
    mutating: bool
    spec: dict[str, Any]

    @property
    def failure_policy(self) -> str:
        return self.spec.get("failurePolicy") or "Fail"

    @property
    def timeout_seconds(self) -> float:
        return float(self.spec.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)

    @property
    def side_effects(self) -> str:
        return self.spec.get("sideEffects") or "Unknown"

    @property
    def url(self) -> str:
        client_config = self.spec.get("clientConfig") or {}
        url = client_config.get("url")
        if not url:
            service = client_config.get("service") or {}
            raise WebhookCallError(
                f"clientConfig.service {service.get('namespace')}/{service.get('name')} cannot be reached "
                "outside a cluster; give the webhook a clientConfig.url (point_to_local)"
            )
        return url


@dataclass
class AdmissionCall:
    """One webhook call (or skip) made by the chain, for the demo's narrative and for tests."""

    webhook: str
    operation: str
    resource: str  # "deployments/scale", "secrets", ...
    namespace: str
    name: str
    outcome: str  # allowed | patched | denied | failed (call error, Fail) | ignored (call error, Ignore)
    message: str = ""
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


# --- selection ---------------------------------------------------------------------------------


def _listed(values: Iterable[str] | None, value: str) -> bool:
    values = list(values or [])
    return "*" in values or value in values


def resource_matches(rule_resources: Iterable[str], resource: str, subresource: str) -> bool:
    """kube-apiserver's ``resources`` matching: ``res[/sub]`` with ``*`` for either part.

    ``deployments`` matches only the main resource; ``deployments/scale`` only the subresource;
    ``deployments/*`` both; ``*`` every main resource; ``*/scale`` every scale subresource.
    """
    for item in rule_resources or []:
        res, _, sub = item.partition("/")
        if (res == "*" or res == resource) and (sub == "*" or sub == subresource):
            return True
    return False


def scope_matches(scope: str | None, namespace: str, resource: str, subresource: str) -> bool:
    if scope in (None, "", "*"):
        return True
    namespaced = namespace != ""
    if scope == "Namespaced":
        return namespaced
    if scope == "Cluster":  # a namespace object itself counts as cluster scoped
        return not namespaced or (resource == "namespaces" and subresource == "")
    return False


def rule_matches(rule: Mapping[str, Any], attrs: AdmissionAttributes) -> bool:
    return (
        _listed(rule.get("operations"), attrs.operation)
        and _listed(rule.get("apiGroups"), attrs.group)
        and _listed(rule.get("apiVersions"), attrs.version)
        and resource_matches(rule.get("resources") or [], attrs.resource, attrs.subresource)
        and scope_matches(rule.get("scope"), attrs.namespace, attrs.resource, attrs.subresource)
    )


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist).

    An empty or missing selector matches everything, as in a webhook configuration.
    """
    labels = labels or {}
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, operator, values = expr["key"], expr["operator"], expr.get("values") or []
        if operator == "In":
            ok = key in labels and labels[key] in values
        elif operator == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif operator == "Exists":
            ok = key in labels
        elif operator == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError(f"unknown label selector operator {operator!r}")
        if not ok:
            return False
    return True


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


# --- configurations ------------------------------------------------------------------------------


def webhooks_from(configurations: Iterable[Mapping[str, Any]]) -> list[Webhook]:
    """The webhooks of the given configurations, mutating first (the API server's order)."""
    mutating: list[Webhook] = []
    validating: list[Webhook] = []
    for config in configurations:
        kind = config.get("kind")
        if kind not in (MUTATING, VALIDATING):
            continue
        name = (config.get("metadata") or {}).get("name", "")
        for spec in config.get("webhooks") or []:
            hook = Webhook(spec["name"], name, kind == MUTATING, deepcopy(dict(spec)))
            (mutating if hook.mutating else validating).append(hook)
    return mutating + validating


def point_to_local(configuration: Mapping[str, Any], urls: Mapping[str, str], ca_pem: bytes) -> dict[str, Any]:
    """A copy of ``configuration`` whose webhooks call ``urls[webhook name]`` (base URL) instead of
    their in-cluster Service, trusting ``ca_pem``: what cert-manager's cainjector and a Service
    would give in a cluster. The Service's ``path`` is kept."""
    config = deepcopy(dict(configuration))
    for spec in config.get("webhooks") or []:
        if spec["name"] not in urls:
            continue
        old = spec.get("clientConfig") or {}
        path = (old.get("service") or {}).get("path") or ""
        spec["clientConfig"] = {
            "url": urls[spec["name"]].rstrip("/") + path,
            "caBundle": base64.b64encode(ca_pem).decode(),
        }
    return config


# --- the chain ---------------------------------------------------------------------------------


class AdmissionChain:
    """A kubemu admission hook that calls the configured webhooks like kube-apiserver.

    ``namespace_labels(ns)`` returns the labels of namespace ``ns`` (None when it does not
    exist); ``kubernetes.io/metadata.name`` is added as the API server does.
    """

    def __init__(
        self,
        configurations: Iterable[Mapping[str, Any]],
        namespace_labels: NamespaceLabels | None = None,
    ) -> None:
        self.webhooks = webhooks_from(configurations)
        self.namespace_labels = namespace_labels or (lambda ns: None)
        self.calls: list[AdmissionCall] = []
        self._lock = threading.Lock()
        self._clients: dict[str, httpx.Client] = {}

    # -- kubemu hook --------------------------------------------------------------------------

    def __call__(self, attrs: AdmissionAttributes) -> dict[str, Any] | None:
        obj = deepcopy(attrs.object) if attrs.object is not None else None
        changed = False
        for hook in self.webhooks:
            request = self.request_for(attrs, obj)
            if not self.applies(hook, attrs, request):
                continue
            patched = self._call(hook, attrs, request)
            if patched is not None:
                obj, changed = patched, True
        return obj if changed else None

    # -- selection ----------------------------------------------------------------------------

    def matching(self, attrs: AdmissionAttributes) -> list[Webhook]:
        """The webhooks this write would be sent to (rules, selectors and matchConditions)."""
        request = self.request_for(attrs, attrs.object)
        return [h for h in self.webhooks if self.applies(h, attrs, request)]

    def applies(self, hook: Webhook, attrs: AdmissionAttributes, request: Mapping[str, Any]) -> bool:
        spec = hook.spec
        if not any(rule_matches(rule, attrs) for rule in spec.get("rules") or []):
            return False
        if not self._namespace_matches(spec.get("namespaceSelector"), attrs):
            return False
        object_selector = spec.get("objectSelector")
        if object_selector and not (
            (attrs.object is not None and label_selector_matches(object_selector, _labels(attrs.object)))
            or (attrs.old_object is not None and label_selector_matches(object_selector, _labels(attrs.old_object)))
        ):
            return False
        conditions = spec.get("matchConditions") or []
        if not conditions:
            return True
        try:
            return evaluate_match_conditions(conditions, request)
        except MatchConditionError as exc:
            if hook.failure_policy == "Ignore":
                self._record(hook, attrs, "ignored", f"matchConditions error: {exc}")
                return False
            self._record(hook, attrs, "failed", f"matchConditions error: {exc}")
            resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
            raise AdmissionDenied(f'{resource} "{attrs.name}" is forbidden: {exc}', code=403) from None

    def _namespace_matches(self, selector: Mapping[str, Any] | None, attrs: AdmissionAttributes) -> bool:
        if not selector:
            return True
        if attrs.resource == "namespaces" and attrs.group == "" and not attrs.subresource:
            labels = _labels(attrs.object if attrs.object is not None else attrs.old_object)
            labels.setdefault(NAMESPACE_NAME_LABEL, attrs.name)
        elif attrs.namespace:
            labels = dict(self.namespace_labels(attrs.namespace) or {})
            labels[NAMESPACE_NAME_LABEL] = attrs.namespace
        else:
            return True  # cluster-scoped objects are never excluded by a namespaceSelector
        return label_selector_matches(selector, labels)

    # -- the request --------------------------------------------------------------------------

    def request_for(self, attrs: AdmissionAttributes, obj: Mapping[str, Any] | None) -> dict[str, Any]:
        """The AdmissionReview ``request`` the API server would send for this write."""
        resource = {"group": attrs.group, "version": attrs.version, "resource": attrs.resource}
        request: dict[str, Any] = {
            "uid": str(uuid.uuid4()),
            "kind": dict(attrs.kind),
            "resource": resource,
            "requestKind": dict(attrs.kind),
            "requestResource": dict(resource),
            "name": attrs.name,
            "operation": attrs.operation,
            "userInfo": dict(attrs.user_info),  # who kubemu says asked (its admin, or an impersonated user)
            "object": obj,
            "oldObject": attrs.old_object,
            "dryRun": bool(attrs.dry_run),
            "options": {
                "apiVersion": "meta.k8s.io/v1",
                "kind": _OPTIONS_KIND[attrs.operation],
                **({"dryRun": ["All"]} if attrs.dry_run else {}),
            },
        }
        if attrs.subresource:
            request["subResource"] = attrs.subresource
            request["requestSubResource"] = attrs.subresource
        if attrs.namespace:
            request["namespace"] = attrs.namespace
        return request

    # -- calling ------------------------------------------------------------------------------

    def _client(self, hook: Webhook) -> httpx.Client:
        ca = (hook.spec.get("clientConfig") or {}).get("caBundle") or ""
        key = f"{hook.configuration}/{hook.name}/{ca}"
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                if ca:
                    context = ssl.create_default_context(cadata=base64.b64decode(ca).decode())
                else:  # no caBundle: the API server falls back to its system trust roots
                    context = ssl.create_default_context()
                client = httpx.Client(verify=context, http2=False)
                self._clients[key] = client
            return client

    def _post(self, hook: Webhook, request: dict[str, Any]) -> dict[str, Any]:
        """One call; the checked ``response``. Raises WebhookCallError for any failure."""
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        url = hook.url
        timeout = hook.timeout_seconds
        try:
            answer = self._client(hook).post(
                url,
                params={"timeout": f"{int(timeout)}s"},
                content=json.dumps(review).encode(),
                headers={"Content-Type": "application/json", "Accept": "application/json"},
                timeout=timeout,
            )
        except httpx.TimeoutException:
            raise WebhookCallError(f'failed to call webhook: Post "{url}": context deadline exceeded') from None
        except (httpx.HTTPError, ssl.SSLError, OSError) as exc:
            raise WebhookCallError(f'failed to call webhook: Post "{url}": {exc}') from None
        if answer.status_code != 200:
            raise WebhookCallError(f"failed to call webhook: the server responded with HTTP {answer.status_code}")
        try:
            body = answer.json()
        except ValueError:
            raise WebhookCallError("received invalid webhook response: not JSON") from None
        response = body.get("response") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or body.get("apiVersion") != "admission.k8s.io/v1"
            or body.get("kind") != "AdmissionReview"
            or not isinstance(response, dict)
        ):
            raise WebhookCallError("received invalid webhook response: not an admission.k8s.io/v1 AdmissionReview")
        if response.get("uid") != request["uid"]:
            raise WebhookCallError(
                f"received invalid webhook response: expected response.uid={request['uid']!r}, got "
                f"{response.get('uid')!r}"
            )
        if not isinstance(response.get("allowed"), bool):
            raise WebhookCallError("received invalid webhook response: response.allowed is not a bool")
        return response

    def _decode_patch(self, hook: Webhook, response: Mapping[str, Any]) -> list[dict[str, Any]]:
        if "patch" not in response or response.get("patch") in (None, ""):
            return []
        if not hook.mutating:
            raise WebhookCallError("received invalid webhook response: a validating webhook returned a patch")
        if response.get("patchType") != "JSONPatch":
            raise WebhookCallError(
                f"received invalid webhook response: patchType {response.get('patchType')!r}, want JSONPatch"
            )
        try:
            ops = json.loads(base64.b64decode(response["patch"], validate=True))
        except (ValueError, TypeError):
            raise WebhookCallError("received invalid webhook response: patch is not base64 JSON") from None
        if not isinstance(ops, list):
            raise WebhookCallError("received invalid webhook response: patch is not a JSON Patch list")
        return ops

    def _call(self, hook: Webhook, attrs: AdmissionAttributes, request: dict[str, Any]) -> dict[str, Any] | None:
        """Call one webhook; the patched object, or None when it is unchanged."""
        if attrs.dry_run and hook.side_effects not in ("None", "NoneOnDryRun"):
            self._record(hook, attrs, "failed", "dry run not supported: the webhook has side effects")
            raise AdmissionDenied(f'admission webhook "{hook.name}" does not support dry run', code=400)
        started = time.monotonic()
        try:
            response = self._post(hook, request)
            ops = self._decode_patch(hook, response) if response["allowed"] else []
            patched = None
            if ops:
                try:
                    patched = jsonpatch.apply_patch(request["object"], ops)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                    raise WebhookCallError(f"the webhook's patch cannot be applied: {exc}") from None
        except WebhookCallError as exc:
            message = f'failed calling webhook "{hook.name}": {exc}'
            if hook.failure_policy == "Ignore":
                self._record(hook, attrs, "ignored", message, seconds=time.monotonic() - started)
                return None
            self._record(hook, attrs, "failed", message, seconds=time.monotonic() - started)
            raise AdmissionDenied(f"Internal error occurred: {message}", code=500) from None
        status = response.get("status") or {}
        warnings = [str(w) for w in response.get("warnings") or []]
        attrs.warnings.extend(warnings)
        seconds = time.monotonic() - started
        if not response["allowed"]:
            message = status.get("message") or status.get("reason") or ""
            text = f'admission webhook "{hook.name}" denied the request'
            text = f"{text}: {message}" if message else f"{text} without explanation"
            raw_code = status.get("code")
            code = raw_code if isinstance(raw_code, int) else 400
            self._record(hook, attrs, "denied", text, warnings=warnings, seconds=seconds)
            raise AdmissionDenied(text, code=max(code, 400))
        self._record(
            hook,
            attrs,
            "patched" if ops else "allowed",
            status.get("message") or "",
            patch=ops,
            warnings=warnings,
            seconds=seconds,
        )
        return patched

    def _record(self, hook: Webhook, attrs: AdmissionAttributes, outcome: str, message: str, **extra: Any) -> None:
        resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
        call = AdmissionCall(
            hook.name, attrs.operation, resource, attrs.namespace, attrs.name, outcome, message, **extra
        )
        with self._lock:
            self.calls.append(call)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
