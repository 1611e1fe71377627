"""Editing the Metal3 ``metaData`` value: base64 of a flat YAML map of strings.

CAPM3 renders it with ``yaml.Marshal(map[string]string)``: block style, one ``key: value`` per
line. Every existing key and its text are kept. When none of our keys is present and the text
is a plain block map, the new lines are appended, so the old bytes stay exactly as they were.
Anything else (our keys with stale values, flow style, directives, an empty map) is merged and
re-rendered with a YAML dump. Either way the result is checked by tests against a full parse.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

import yaml

JOIN_KEYS = ("slurm_controller_host", "slurm_controller_port", "slurm_conf_server", "slurm_key_base64")


class MetaDataError(ValueError):
    """The metaData value cannot be edited safely; the message says why (never the content)."""


def join_entries(host: str, port: int, key_base64: str) -> dict[str, str]:
    """The four keys cloud-init reads as ``ds.meta_data.<key>``; all strings, like CAPM3's."""
    return {
        "slurm_controller_host": host,
        "slurm_controller_port": str(port),
        "slurm_conf_server": f"{host}:{port}",
        "slurm_key_base64": key_base64,
    }


def _dump(entries: Mapping[str, object]) -> str:
    # width=inf: the ~1.4 kB key must stay on one line, as cloud-init's YAML reader expects.
    return yaml.dump(dict(entries), Dumper=yaml.CSafeDumper, sort_keys=False, default_flow_style=False, width=2**31 - 1)


def _lines(entries: Mapping[str, str]) -> str:
    """``key: "value"`` lines. A JSON string is a valid YAML double-quoted scalar, and rendering
    four lines this way is several times cheaper than a YAML dump on the admission hot path."""
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in entries.items())


def _appendable(text: str) -> bool:
    """True when lines added at column 0 are certain to extend the top-level block map."""
    return (
        bool(text)
        and text[0] not in " \t{[-%#&!*|>'\"?"
        and "\n---" not in text
        and "\n..." not in text
    )


def merged_metadata(encoded: str, entries: Mapping[str, str]) -> str | None:
    """The new base64 ``metaData`` with ``entries`` set, or None when they are already there."""
    try:
        text = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise MetaDataError("data.metaData is not valid base64 of UTF-8 text") from None
    try:
        document = yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise MetaDataError(f"data.metaData is not valid YAML{where}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise MetaDataError(f"data.metaData is a YAML {type(document).__name__}, expected a map")
    if all(document.get(k) == v for k, v in entries.items()):
        return None
    if _appendable(text) and not any(k in document for k in entries):
        separator = "" if text.endswith("\n") else "\n"
        rendered = text + separator + _lines(entries)
    else:
        rendered = _dump({**document, **entries})
    return base64.b64encode(rendered.encode("utf-8")).decode("ascii")
