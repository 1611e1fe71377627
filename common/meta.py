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


def api_group(api_version: Any) -> str:
    """``group/version`` -> group; the core group (``v1``) is ""."""
    return api_version.split("/", 1)[0] if isinstance(api_version, str) and "/" in api_version else ""


def owner_name(metadata: Any, kind: str, group: str) -> str | None:
    """Name of the owner of ``kind`` in ``group``, matched by kind and group, never by version."""
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
            return str(owner["name"])
    return None
