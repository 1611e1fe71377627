"""The admission transport over real TLS: every failure path has one exact answer."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from common.admission import AdmissionResponse, patch_response
from testbed.components.harness import echo_allow, serve_handler
from testbed.components.serve import RunningService
from testbed.framework.pki import Pki

LIMIT = 64 * 1024


@pytest.fixture
def service(pki: Pki) -> Iterator[RunningService]:
    running = serve_handler(echo_allow, pki, max_body_bytes=LIMIT)
    yield running
    running.stop()


def review(request: Any = None, api_version: str = "admission.k8s.io/v1", **extra: Any) -> bytes:
    body: dict[str, Any] = {"apiVersion": api_version, "kind": "AdmissionReview", **extra}
    if request is not None:
        body["request"] = request
    return json.dumps(body).encode()


CASES = [
    ("empty body", b"", "application/json", 400, "request body is empty", ""),
    ("no content type", review({"uid": "u"}), None, 415, "contentType=, expected application/json", ""),
    ("text/plain", review({"uid": "u"}), "text/plain", 415, "contentType=text/plain, expected application/json", ""),
    (
        "bad json",
        b"{",
        "application/json",
        400,
        "couldn't decode AdmissionReview: Expecting property name enclosed in double quotes at position 1",
        "",
    ),
    ("not utf-8", b"\x80{}", "application/json", 400, "request body is not UTF-8: invalid byte at position 0", ""),
    ("json array", b"[]", "application/json", 400, "AdmissionReview must be a JSON object", ""),
    (
        "v1beta1 review",
        review({"uid": "u1"}, api_version="admission.k8s.io/v1beta1"),
        "application/json",
        400,
        "unsupported review apiVersion='admission.k8s.io/v1beta1' kind='AdmissionReview', expected "
        "admission.k8s.io/v1 AdmissionReview",
        "u1",
    ),
    ("no request", review(), "application/json", 400, "AdmissionReview has no request object", ""),
    ("request not object", review([1]), "application/json", 400, "AdmissionReview has no request object", ""),
    ("no uid", review({"operation": "CREATE"}), "application/json", 400, "request.uid must be a non-empty string", ""),
    ("uid not string", review({"uid": 7}), "application/json", 400, "request.uid must be a non-empty string", ""),
    (
        "too large",
        review({"uid": "u", "pad": "x" * LIMIT}),
        "application/json",
        413,
        f"request entity is too large; limit is {LIMIT} bytes",
        "",
    ),
]


@pytest.mark.parametrize(("case", "body", "content_type", "code", "message", "uid"), CASES, ids=[c[0] for c in CASES])
def test_bad_requests_get_exact_errored_reviews(
    service: RunningService, case: str, body: bytes, content_type: str | None, code: int, message: str, uid: str
) -> None:
    answer = service.post("/review", body, content_type)
    assert answer.status_code == 200
    assert answer.json() == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": False, "status": {"code": code, "message": message, "status": "Failure"}},
    }


def test_content_type_with_charset_is_accepted(service: RunningService) -> None:
    answer = service.post("/review", review({"uid": "abc"}), "application/json; charset=utf-8")
    assert answer.json()["response"] == {"uid": "abc", "allowed": True}


def test_allowed_review_echoes_uid_and_envelope(service: RunningService) -> None:
    response = service.review("/review", {"uid": "the-uid", "operation": "CREATE"})
    assert response == {"uid": "the-uid", "allowed": True}


def test_other_methods_and_paths_are_not_admission(service: RunningService) -> None:
    with service.client() as client:
        assert client.get(f"{service.url}/review").status_code == 405
        assert client.post(f"{service.url}/elsewhere", content=b"{}").status_code == 404
        assert client.get(f"{service.url}/docs").status_code == 404


def test_handler_exception_becomes_errored_response_with_uid(pki: Pki, capfd: pytest.CaptureFixture[str]) -> None:
    async def broken(request: dict[str, Any]) -> AdmissionResponse:
        raise RuntimeError("boom")

    running = serve_handler(broken, pki)
    try:
        answer = running.post("/review", review({"uid": "u-42"})).json()
        assert answer["response"] == {
            "uid": "u-42",
            "allowed": False,
            "status": {
                "code": 500,
                "status": "Failure",
                "message": "internal error (RuntimeError) in test webhook; see its log for uid u-42",
            },
        }
        metrics = httpx.get(f"{running.metrics_url}/metrics").text
        assert 'slime_webhook_requests_total{outcome="errored",webhook="test"} 1.0' in metrics
    finally:
        running.stop()


def test_patch_is_base64_jsonpatch(pki: Pki) -> None:
    async def patcher(request: dict[str, Any]) -> AdmissionResponse:
        return patch_response([{"op": "add", "path": "/metadata/labels/x", "value": "y"}])

    running = serve_handler(patcher, pki)
    try:
        response = running.review("/review", {"operation": "CREATE"})
        assert response["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(response["patch"])) == [
            {"op": "add", "path": "/metadata/labels/x", "value": "y"}
        ]
    finally:
        running.stop()
