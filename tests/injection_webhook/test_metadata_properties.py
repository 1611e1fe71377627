"""Property: every metaData the webhook accepts yields exactly the original map plus the join keys.

For any text (generated flat maps in many YAML spellings, odd scalars, comments, CRLF, a BOM,
leading blank lines, indentation, ``~``/``null``/empty documents, anchors, several documents, and
plain noise), :func:`merged_metadata` either

- returns None: the join keys are already there with our values;
- returns a value whose YAML equals the original map with the four keys set; or
- raises :class:`MetaDataError` whose message names the problem and quotes none of the content.

"Equals" is judged by libyaml (``yaml.CSafeLoader``): the baremetal-operator reads metaData with
``sigs.k8s.io/yaml`` (go-yaml, a port of libyaml) before Ironic writes it to the config drive
that cloud-init reads. Where PyYAML's pure-Python reader (``yaml.safe_load``) reads the original
the same way as libyaml, it must read the result the same way too.

Fixed seed, a few thousand examples, in the normal suite.
"""

from __future__ import annotations

import base64
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from injection_webhook.metadata import MetaDataError, join_entries, merged_metadata

ENTRIES = join_entries("192.0.2.10", 30817, base64.b64encode(b"k" * 64).decode())
SETTINGS = settings(max_examples=500, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

ODD_SCALARS = [
    "~",
    "null",
    "Null",
    "",
    "yes",
    "no",
    "on",
    "off",
    "true",
    "1e3",
    "0x1F",
    "0o17",
    "1_000",
    "2026-11-22",
    "2026-11-22T10:00:00Z",
    ".inf",
    "-.nan",
    "'quoted'",
    '"double"',
    "a: b",
    "- item",
    "# not a comment",
    "{x}",
    "[y]",
    "&anchor",
    "*alias",
    "!tag",
    "%directive",
    "@at",
    "`back`",
    "|",
    ">",
    "?",
    "key:",
    "multi\nline",
    "tab\there",
    "unicode é ✓",
    "\u2028sep",
    "trailing ",
    " leading",
]

keys = st.one_of(
    st.sampled_from(["providerid", "local-hostname", "local_hostname", "slurm_conf_server", "a", "b.c", "x-y"]),
    st.text(min_size=1, max_size=12),
    st.sampled_from(ODD_SCALARS),
)
values = st.one_of(st.text(max_size=30), st.sampled_from(ODD_SCALARS), st.sampled_from(list(ENTRIES.values())))
flat_maps = st.dictionaries(keys, values, max_size=6)


@st.composite
def spellings(draw: st.DrawFn) -> str:
    """A flat map written the ways people and tools write YAML, then decorated."""
    data = draw(flat_maps)
    style = draw(st.sampled_from([None, "'", '"']))
    text = yaml.safe_dump(
        data,
        default_flow_style=draw(st.booleans()),
        default_style=style,
        sort_keys=draw(st.booleans()),
        explicit_start=draw(st.booleans()),
        explicit_end=draw(st.booleans()),
        allow_unicode=draw(st.booleans()),
        width=draw(st.sampled_from([20, 80, 2**31 - 1])),
    )
    if data == {} and draw(st.booleans()):
        text = draw(st.sampled_from(["", "~", "null", "~\n", "# nothing yet\n", "---\n", "--- ~\n", "{}\n"]))
    decorations = draw(
        st.lists(
            st.sampled_from(
                [
                    "comment",
                    "crlf",
                    "bom",
                    "blank",
                    "indent",
                    "no-newline",
                    "anchor",
                    "second-document",
                    "trailing-comment",
                ]
            ),
            max_size=3,
            unique=True,
        )
    )
    for decoration in decorations:
        if decoration == "comment":
            text = "# written by hand\n" + text
        elif decoration == "trailing-comment":
            text = text + "# end\n"
        elif decoration == "crlf":
            text = text.replace("\n", "\r\n")
        elif decoration == "bom":
            text = "\ufeff" + text
        elif decoration == "blank":
            text = "\n" * draw(st.integers(1, 3)) + text
        elif decoration == "indent":
            pad = " " * draw(st.integers(1, 4))
            text = "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))
        elif decoration == "no-newline":
            text = text.rstrip("\n")
        elif decoration == "anchor":
            text = text + "anchored: &first shared\nreused: *first\n"
        elif decoration == "second-document":
            text = text + "---\nother: document\n"
    return text


def _read(text: str, loader: Any) -> tuple[bool, Any]:
    try:
        return True, yaml.load(text, Loader=loader)
    except yaml.YAMLError:
        return False, None


def check(text: str) -> None:
    readable, original = _read(text, yaml.CSafeLoader)
    python_readable, python_original = _read(text, yaml.SafeLoader)
    encoded = base64.b64encode(text.encode("utf-8")).decode()
    try:
        result = merged_metadata(encoded, ENTRIES)
    except MetaDataError as exc:
        message = str(exc)
        assert message.startswith("data.metaData "), message
        said = message.removeprefix("data.metaData ")  # our own words may contain what the text happens to say
        for line in text.splitlines():
            if len(line.strip()) >= 8 and line.strip() not in "data.metaData":
                assert line.strip() not in said, f"the denial quotes the content: {message}"
        return
    # Accepted: the original must have been one YAML map (or empty), and the result that map plus ours.
    assert readable, f"accepted text that libyaml rejects: {text!r}"
    before = {} if original is None else original
    assert isinstance(before, dict), f"accepted a YAML {type(before).__name__}: {text!r}"
    if result is None:
        assert all(before.get(k) == v for k, v in ENTRIES.items())
        return
    rendered = base64.b64decode(result).decode("utf-8")
    assert yaml.load(rendered, Loader=yaml.CSafeLoader) == {**before, **ENTRIES}, f"{text!r} became {rendered!r}"
    if python_readable and python_original == original:
        assert yaml.safe_load(rendered) == {**before, **ENTRIES}, f"PyYAML reads {rendered!r} differently"


@seed(20261122)
@SETTINGS
@given(spellings())
@example("~")
@example("null")
@example("\n  a: b\n")
@example("a: b\r\nc: d\r\n")
@example("\ufeffproviderid: x/y/z\n")
@example("a: &x v\nb: *x\n")
@example("---\na: b\n---\nc: d\n")
def test_every_spelling_of_a_map_is_merged_exactly_or_denied(text: str) -> None:
    check(text)


@seed(20261122)
@SETTINGS
@given(st.text(max_size=200))
def test_any_text_is_merged_exactly_or_denied(text: str) -> None:
    check(text)


def test_a_metadata_over_a_secrets_limit_is_refused_before_parsing() -> None:
    encoded = base64.b64encode(b"a: " + b"x" * (1024 * 1024) + b"\n").decode()
    try:
        merged_metadata(encoded, ENTRIES)
    except MetaDataError as exc:
        assert str(exc).startswith(
            "data.metaData holds about 1048"
        ) and "more than a Secret may hold (1048576 bytes)" in str(exc)
    else:
        raise AssertionError("a 1 MiB metaData was accepted")
