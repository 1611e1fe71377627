"""Kubernetes `Status` failures, shared by the store, the patch code and the HTTP layer."""

from __future__ import annotations

from typing import Any

# The reason the API server puts next to each status code.
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A failure `Status` object as the API server returns it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """An API failure carrying the HTTP code, the Status reason and message."""

    def __init__(self, code: int, reason: str | None, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason or REASONS.get(code, "Unknown")
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_body(self.code, self.message, self.reason, self.details)
