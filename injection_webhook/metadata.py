"""Editing the Metal3 ``metaData`` value: base64 of a flat YAML map of strings.

CAPM3 renders it with ``yaml.Marshal(map[string]string)``: block style, one ``key: value`` per
line. Every existing key and its text are kept. When none of our keys is present and the text
is a plain block map, the new lines are appended, so the old bytes stay exactly as they were.
Anything else (our keys with stale values, flow style, directives, an empty or null document)
is merged and re-rendered with a YAML dump.

Whatever the route, the result is parsed again before it is returned and must equal the
original map plus our keys (what cloud-init's ``yaml.safe_load`` will see); an edit that does
not is never sent. A value larger than a whole Secret may be (1 MiB, the API server's limit) is
refused before it is decoded or parsed.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import yaml

from common.names import CONTROLLER_NAME_KEY, JWT_KEY_KEY

JOIN_KEYS = ("slurm_controller_host", "slurm_controller_port", "slurm_conf_server", "slurm_key_base64")
# Added only where the template (or the chart default) opts in: see confserver.py.
# kube-apiserver refuses a Secret whose data exceed 1 MiB (validation.MaxSecretSize), so a
# larger metaData cannot come from a real API server and is not worth parsing.
MAX_METADATA_BYTES = 1024 * 1024


class MetaDataError(ValueError):
    """The metaData value cannot be edited safely; the message says why (never the content)."""


def join_entries(
    host: str, port: int, key_base64: str, *, conf_server: str = "", controller_name: str = "", jwt_key_base64: str = ""
) -> dict[str, str]:
    """The keys cloud-init reads as ``ds.meta_data.<key>``; all strings, like CAPM3's.

    ``conf_server`` defaults to ``host:port``; it may list several ``host:port`` (slurmd tries
    them in order). The two optional keys are added only when given."""
    entries = {
        "slurm_controller_host": host,
        "slurm_controller_port": str(port),
        "slurm_conf_server": conf_server or f"{host}:{port}",
        "slurm_key_base64": key_base64,
    }
    if controller_name:
        entries[CONTROLLER_NAME_KEY] = controller_name
    if jwt_key_base64:
        entries[JWT_KEY_KEY] = jwt_key_base64
    return entries


def _dump(entries: Mapping[str, object]) -> str:
    # width=inf: the ~1.4 kB key must stay on one line, as cloud-init's YAML reader expects.
    return yaml.dump(dict(entries), Dumper=yaml.CSafeDumper, sort_keys=False, default_flow_style=False, width=2**31 - 1)


def _lines(entries: Mapping[str, str]) -> str:
    """``key: "value"`` lines. A JSON string is a valid YAML double-quoted scalar, and rendering
    a few lines this way is several times cheaper than a YAML dump on the admission hot path."""
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in entries.items())


def _appendable(text: str) -> bool:
    """True when lines added at column 0 are likely to extend the top-level block map (checked after)."""
    return bool(text) and text[0] not in " \t\r\n{[-%#&!*|>'\"?~" and "\n---" not in text and "\n..." not in text


def _parse(text: str) -> Any:
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        if isinstance(exc, yaml.composer.ComposerError) and "single document" in str(getattr(exc, "context", "")):
            raise MetaDataError(f"data.metaData holds more than one YAML document{where}; expected one map") from None
        # The parser's own words may quote the content, so the message gives only the line.
        raise MetaDataError(f"data.metaData is not valid YAML{where}") from None


def _parses_to(rendered: str, expected: dict[Any, Any]) -> bool:
    try:
        return bool(yaml.load(rendered, Loader=yaml.CSafeLoader) == expected)
    except yaml.YAMLError:
        return False


def merged_metadata(encoded: str, entries: Mapping[str, str]) -> str | None:
    """The new base64 ``metaData`` with ``entries`` set, or None when they are already there."""
    if len(encoded) // 4 * 3 > MAX_METADATA_BYTES:
        raise MetaDataError(
            f"data.metaData holds about {len(encoded) // 4 * 3} bytes, more than a Secret may hold "
            f"({MAX_METADATA_BYTES} bytes)"
        )
    try:
        text = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise MetaDataError("data.metaData is not valid base64 of UTF-8 text") from None
    if "\ufeff" in text[1:]:
        # YAML readers disagree on a byte-order mark after the start (libyaml skips it, PyYAML
        # reads it as text), so what cloud-init would see cannot be told: refuse it.
        raise MetaDataError("data.metaData has a byte-order mark (U+FEFF) after its start")
    document = _parse(text)
    if document is None:
        document = {}  # an empty document, a comment, "~" or "null": no keys yet
    if not isinstance(document, dict):
        raise MetaDataError(f"data.metaData is a YAML {type(document).__name__}, expected a map")
    if all(document.get(k) == v for k, v in entries.items()):
        return None
    expected = {**document, **entries}
    rendered = ""
    if _appendable(text) and not any(k in document for k in entries):
        separator = "" if text.endswith("\n") else "\n"
        rendered = text + separator + _lines(entries)
    if not rendered or not _parses_to(rendered, expected):
        rendered = _dump(expected)
        if not _parses_to(rendered, expected):
            # Keys or values YAML cannot write back as they were read (e.g. a key that is itself a map).
            raise MetaDataError("data.metaData cannot be re-rendered as the same YAML map with the join data added")
    return base64.b64encode(rendered.encode("utf-8")).decode("ascii")
