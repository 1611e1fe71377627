"""PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge.

Simplification: a strategic merge patch is applied as a JSON merge patch (lists are replaced
whole, `$patch`/`$retainKeys` directives are not interpreted). Custom resources reject it
with 415, as the real API server does. Server-side apply is not supported (415).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch

from .errors import ApiError

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unsupported(custom: bool) -> ApiError:
    accepted = [JSON_PATCH, MERGE_PATCH] + ([] if custom else [STRATEGIC_MERGE_PATCH]) + [APPLY_PATCH]
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: " + ", ".join(accepted),
    )


def apply_patch(obj: dict[str, Any], content_type: str, body: bytes, custom: bool = False) -> dict[str, Any]:
    """Return `obj` patched by `body`; `obj` itself is not modified.

    A JSON patch that cannot be applied (including a failed `test` op) is 422 Invalid, as
    the API server answers; an undecodable patch is 400 BadRequest.
    """
    media = content_type.split(";")[0].strip().lower()
    if media == APPLY_PATCH:
        raise ApiError(415, "UnsupportedMediaType", "server-side apply is not supported by kubemu")
    if media not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH) or (custom and media == STRATEGIC_MERGE_PATCH):
        raise _unsupported(custom)
    try:
        decoded = json.loads(body or b"null")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from exc
    if media == JSON_PATCH:
        if not isinstance(decoded, list):
            raise ApiError(400, "BadRequest", "json patch must be a list of operations")
        try:
            patch = jsonpatch.JsonPatch(decoded)
            return patch.apply(copy.deepcopy(obj))
        except jsonpatch.InvalidJsonPatch as exc:
            raise ApiError(400, "BadRequest", f"invalid json patch: {exc}") from exc
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(
                422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
            ) from exc
    if not isinstance(decoded, dict):
        raise ApiError(400, "BadRequest", "merge patch must be a JSON object")
    return merge_patch(obj, decoded)
