"""The admission hook: how a test or the demo plays the API server's admission chain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AdmissionAttributes:
    """What an admission webhook would see in its AdmissionReview request.

    For /scale writes, `resource` is the parent (e.g. deployments), `subresource` is "scale" and
    `kind`/`object` are the autoscaling/v1 Scale, as with the real API server.
    """

    operation: str  # CREATE | UPDATE | DELETE
    group: str
    version: str
    resource: str
    subresource: str
    kind: dict[str, str]  # {"group", "version", "kind"}
    namespace: str
    name: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool
    user_info: dict[str, Any] = field(
        default_factory=lambda: {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}
    )
    # Warnings the webhooks returned: kube-apiserver sends each to the client as a ``Warning: 299 - "..."``
    # header (kubectl prints them), on an allowed request and on a denied one alike.
    warnings: list[str] = field(default_factory=list)


class AdmissionDenied(Exception):
    """Raised by a hook to reject the request; becomes a Status with `code` and `message`."""

    def __init__(self, message: str, code: int = 403):
        super().__init__(message)
        self.message = message
        self.code = code


# Returns the object to store (possibly mutated) or None to keep it; may raise AdmissionDenied.
AdmissionHook = Callable[[AdmissionAttributes], "dict[str, Any] | None"]
