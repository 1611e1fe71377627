"""Object metadata as the API server defines it: valid names, and owner references.

Both services read these from request content, which may be anything, and from cached objects.
So every check here is defensive about types.
"""

from __future__ import annotations

import re
from typing import Any

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns1123_label(value: Any) -> bool:
    """A valid namespace name (and other label-like names): at most 63 characters."""
    return isinstance(value, str) and len(value) <= 63 and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: Any) -> bool:
    """A valid object name for most kinds: at most 253 characters."""
    return isinstance(value, str) and len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


# One requirement of a label selector, as kube-apiserver parses them: key, !key, key=value,
# key==value, key!=value, key in (v1,v2), key notin (v1,v2). Keys may carry a DNS prefix.
_LABEL_KEY = (
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_REQUIREMENT = re.compile(
    rf"\s*(!?\s*{_LABEL_KEY}|{_LABEL_KEY}\s*(=|==|!=)\s*{_LABEL_VALUE}"
    rf"|{_LABEL_KEY}\s+(in|notin)\s*\(\s*{_LABEL_VALUE}(\s*,\s*{_LABEL_VALUE})*\s*\))\s*"
)


def label_selector_problem(selector: str) -> str | None:
    """Why ``selector`` is not a valid label selector, or None when it is."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(selector[start:index])
            start = index + 1
    parts.append(selector[start:])
    for part in parts:
        if not _REQUIREMENT.fullmatch(part):
            return f"{part.strip()!r} is not a valid label selector requirement"
    return None


def api_group(api_version: Any) -> str:
    """``group/version`` -> group; the core group (``v1``) is ""."""
    return api_version.split("/", 1)[0] if isinstance(api_version, str) and "/" in api_version else ""


def owner_reference(metadata: Any, kind: str, group: str) -> dict[str, Any] | None:
    """The owner reference of ``kind`` in ``group`` (matched by kind and group, never by version)
    whose name the API server would accept; None when there is none."""
    owners = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    if not isinstance(owners, list):
        return None
    for owner in owners:
        if (
            isinstance(owner, dict)
            and owner.get("kind") == kind
            and api_group(owner.get("apiVersion")) == group
            and is_dns1123_subdomain(owner.get("name"))
        ):
            return owner
    return None


def owner_name(metadata: Any, kind: str, group: str) -> str | None:
    """Name of the owner of ``kind`` in ``group``, matched by kind and group, never by version."""
    owner = owner_reference(metadata, kind, group)
    return None if owner is None else str(owner["name"])
