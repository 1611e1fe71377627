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

CAPM3 writes a flat map of strings, so nothing else is read: before the document is loaded, its
parse events are walked with a budget (:func:`check_flat_map`), and an anchor, alias, tag, a
nested map or list, more than :data:`MAX_KEYS` keys or more than one document is refused at the
first event that shows it. Only a document that passed is loaded, so no alias is ever expanded
and the work is linear in the input (a few nested aliases can otherwise cost seconds of CPU).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import yaml

from common.names import (
    CONF_SERVER_KEY,
    CONTROLLER_HOST_KEY,
    CONTROLLER_NAME_KEY,
    CONTROLLER_PORT_KEY,
    HOSTS_KEY,
    JWT_KEY_KEY,
    NODE_CONF_KEY,
    SLURM_KEY_KEY,
)

JOIN_KEYS = (
    CONTROLLER_HOST_KEY,
    CONTROLLER_PORT_KEY,
    CONF_SERVER_KEY,
    SLURM_KEY_KEY,
    HOSTS_KEY,
    NODE_CONF_KEY,
)
# Added only where the template (or the chart default) opts in: see confserver.py.
# kube-apiserver refuses a Secret whose data exceed 1 MiB (validation.MaxSecretSize), so a
# larger metaData cannot come from a real API server and is not worth parsing.
MAX_METADATA_BYTES = 1024 * 1024
# CAPM3 renders a dozen or so keys (providerid, local-hostname, the template's entries).
MAX_KEYS = 1000


class MetaDataError(ValueError):
    """The metaData value cannot be edited safely; the message says why (never the content)."""


def join_entries(
    host: str,
    port: int,
    key_base64: str,
    *,
    conf_server: str = "",
    hosts_file: str = "",
    node_conf: str = "",
    controller_name: str = "",
    jwt_key_base64: str = "",
) -> dict[str, str]:
    """The keys cloud-init reads as ``ds.meta_data.<key>``; all strings, like CAPM3's.

    ``conf_server`` defaults to ``host:port``; it may list several ``host:port`` (slurmd tries
    them in order). ``hosts_file`` (lines for /etc/hosts) is sent base64-encoded, so it stays one
    line in the flat map and in a Jinja template; it and ``node_conf`` are always present (empty
    when there is nothing), so the documented user-data can use them unconditionally. The two
    optional keys are added only when given."""
    entries = {
        CONTROLLER_HOST_KEY: host,
        CONTROLLER_PORT_KEY: str(port),
        CONF_SERVER_KEY: conf_server or f"{host}:{port}",
        SLURM_KEY_KEY: key_base64,
        HOSTS_KEY: base64.b64encode(hosts_file.encode()).decode("ascii"),
        NODE_CONF_KEY: node_conf,
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


def check_flat_map(text: str) -> None:
    """:class:`MetaDataError` unless ``text`` is at most one YAML document holding a flat map of at
    most :data:`MAX_KEYS` plain or quoted scalars, without anchors, aliases or tags.

    Walks the parser's events and stops at the first one that breaks the rule, so the cost is
    bounded by the budget, whatever the input."""
    depth = 0  # collections open: the top-level map is depth 1
    documents = 0
    scalars = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise MetaDataError(
                    f"data.metaData uses a YAML alias{_line(event)}; CAPM3 writes a flat map of strings"
                )
            if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
                raise MetaDataError(
                    f"data.metaData uses a YAML anchor{_line(event)}; CAPM3 writes a flat map of strings"
                )
            tagged = isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)) and event.tag is not None
            if tagged and not (isinstance(event, yaml.ScalarEvent) and event.tag == "!"):  # "!": a quoted scalar
                raise MetaDataError(f"data.metaData uses a YAML tag{_line(event)}; CAPM3 writes a flat map of strings")
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise MetaDataError(
                        f"data.metaData holds more than one YAML document{_line(event)}; expected one map"
                    )
            elif isinstance(event, yaml.SequenceStartEvent) and not depth:
                raise MetaDataError("data.metaData is a YAML list, expected a map")
            elif isinstance(event, yaml.CollectionStartEvent) and depth:
                raise MetaDataError(
                    f"data.metaData has a nested value{_line(event)}; CAPM3 writes a flat map of strings"
                )
            elif isinstance(event, yaml.MappingStartEvent):
                depth = 1
            elif isinstance(event, yaml.ScalarEvent):
                scalars += 1
                if scalars > 2 * MAX_KEYS:
                    raise MetaDataError(f"data.metaData has more than {MAX_KEYS} keys")
    except yaml.YAMLError as exc:
        raise _syntax_error(exc) from None


def _line(event: yaml.Event) -> str:
    mark = event.start_mark
    return f" (line {mark.line + 1})" if mark is not None else ""


def _syntax_error(exc: yaml.YAMLError) -> MetaDataError:
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    # The parser's own words may quote the content, so the message gives only the line.
    return MetaDataError(f"data.metaData is not valid YAML{where}")


def _parse(text: str) -> Any:
    check_flat_map(text)
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as exc:
        raise _syntax_error(exc) from None


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
