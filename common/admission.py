"""AdmissionReview v1 in and out: the wire format, kept apart from any decision.

Modelled on controller-runtime's ``admission/http.go`` and ``response.go``. Every failure has one
exact, tested message. The transport always answers HTTP 200 with an AdmissionReview that
carries the real code in ``response.status.code``, as controller-runtime does. kube-apiserver
reads only the body, and an errored review with the uid tells it (and whoever reads its logs)
exactly what was wrong. Responses echo the request's ``apiVersion`` and ``kind`` and its uid.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Literal

REVIEW_API_VERSION = "admission.k8s.io/v1"
REVIEW_KIND = "AdmissionReview"
# The largest review SliMe reads. CAPM3's metaData Secrets are a few kilobytes and a /scale
# review about two, so a body over 1 MiB cannot be a review SliMe acts on; refusing it before it
# is read in full (on its Content-Length, or as soon as the stream passes the cap) keeps a hostile
# client from making the service hold and parse megabytes (controller-runtime's cap is 7 MiB).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MAX_WARNING_CHARS = 120  # kube-apiserver truncates longer warnings

Outcome = Literal["allowed", "patched", "denied", "errored"]


class AdmissionError(Exception):
    """A request that cannot be reviewed at all. It becomes an errored response."""

    def __init__(self, code: int, message: str, uid: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.uid = uid


@dataclass(frozen=True, slots=True)
class AdmissionResponse:
    """What a handler decided. Only the transport turns it into bytes."""

    allowed: bool
    outcome: Outcome
    code: int = 200
    message: str = ""
    reason: str = ""
    patch: list[dict[str, Any]] | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)


def allow(message: str = "") -> AdmissionResponse:
    return AdmissionResponse(allowed=True, outcome="allowed", message=message)


def patch_response(operations: list[dict[str, Any]], message: str = "") -> AdmissionResponse:
    """Allow with a JSONPatch. An empty patch is an allow: no patch is sent when nothing changes."""
    if not operations:
        return allow(message)
    return AdmissionResponse(allowed=True, outcome="patched", patch=operations, message=message)


def deny(message: str, code: int = 403, reason: str = "Forbidden") -> AdmissionResponse:
    return AdmissionResponse(allowed=False, outcome="denied", code=code, message=message, reason=reason)


def errored(code: int, message: str) -> AdmissionResponse:
    return AdmissionResponse(allowed=False, outcome="errored", code=code, message=message)


def check_content_type(content_type: str | None) -> None:
    """kube-apiserver always sends ``application/json``; anything else is not a review."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise AdmissionError(415, f"contentType={content_type or ''}, expected application/json")


def decode_review(body: bytes) -> dict[str, Any]:
    """Parse and validate the envelope; return ``review["request"]``.

    Only the envelope is checked here. What the request holds is the handler's business, so
    that one handler's assumptions never reject another's traffic.
    """
    if not body:
        raise AdmissionError(400, "request body is empty")
    try:
        review = json.loads(body, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise AdmissionError(400, f"request body is not UTF-8: invalid byte at position {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise AdmissionError(400, f"couldn't decode AdmissionReview: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise AdmissionError(400, "couldn't decode AdmissionReview: nesting too deep") from None
    except ValueError as exc:
        # A number Python will not convert (more digits than sys.get_int_max_str_digits()), or
        # NaN/Infinity, which JSON does not have and kube-apiserver never sends.
        raise AdmissionError(400, f"couldn't decode AdmissionReview: {_first_line(exc)}") from None
    if not isinstance(review, dict):
        raise AdmissionError(400, "AdmissionReview must be a JSON object")
    request = review.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    uid = uid if isinstance(uid, str) else ""
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if api_version != REVIEW_API_VERSION or kind != REVIEW_KIND:
        raise AdmissionError(
            400,
            f"unsupported review apiVersion={api_version!r} kind={kind!r}, expected {REVIEW_API_VERSION} {REVIEW_KIND}",
            uid,
        )
    if not isinstance(request, dict):
        raise AdmissionError(400, "AdmissionReview has no request object")
    if not uid:
        raise AdmissionError(400, "request.uid must be a non-empty string")
    return request


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: Exception) -> str:
    text = str(exc).split("\n", 1)[0]
    return text[:120]


def encode_review(uid: str, response: AdmissionResponse) -> bytes:
    """Serialize the AdmissionReview answer for ``uid``."""
    body: dict[str, Any] = {"uid": uid, "allowed": response.allowed}
    if not response.allowed or response.message:
        status: dict[str, Any] = {"code": response.code, "message": response.message}
        if not response.allowed:
            status["status"] = "Failure"
        if response.reason:
            status["reason"] = response.reason
        body["status"] = status
    if response.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(json.dumps(response.patch, separators=(",", ":")).encode()).decode()
    if response.warnings:
        body["warnings"] = [w[:MAX_WARNING_CHARS] for w in response.warnings]
    review = {"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "response": body}
    return json.dumps(review, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """The identifying fields of a request, for logs. Never holds object content."""

    uid: str
    kind: str
    namespace: str
    name: str
    operation: str
    dry_run: bool
    requester: str  # request.userInfo.username: who the API server says sent the write

    @classmethod
    def of(cls, request: dict[str, Any]) -> RequestSummary:
        """The fields, each cut to :data:`FIELD_LIMIT` (a forged review may carry any text in them), but the uid,
        which the answer must echo whole."""
        kind = request.get("kind")
        return cls(
            uid=_text(request.get("uid")),
            kind=bounded(_text(kind.get("kind")) if isinstance(kind, dict) else ""),
            namespace=bounded(_text(request.get("namespace"))),
            name=bounded(_text(request.get("name")) or _object_name(request.get("object"))),
            operation=bounded(_text(request.get("operation"))),
            dry_run=request.get("dryRun") is True,
            requester=bounded(requester(request)),
        )


# Text copied from a request into a log line or a message is cut to this many characters: the longest
# Kubernetes object name (a DNS-1123 subdomain) is 253, and a username is shorter in practice.
FIELD_LIMIT = 253


def bounded(text: str, limit: int = FIELD_LIMIT) -> str:
    """``text``, or its first ``limit`` characters and how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text) - limit} more characters)"


def requester(request: dict[str, Any]) -> str:
    """``request.userInfo.username``, or "" when the review names none (whole: it is compared, not shown)."""
    info = request.get("userInfo")
    return _text(info.get("username")) if isinstance(info, dict) else ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _object_name(obj: Any) -> str:
    """CREATE requests may carry only ``generateName``; the name is then in the object."""
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
        return _text(obj["metadata"].get("name"))
    return ""
