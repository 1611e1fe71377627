"""Deterministic generator of malformed AdmissionReview bodies.

``generate(seed, count, templates)`` yields :class:`Case` objects; the same seed gives the same
bodies, so a failure names a case index that reproduces. Categories:

- ``bad-json``: truncated reviews, garbage, trailing data, NaN, bare scalars, empty body.
- ``envelope-types``: ``apiVersion``/``kind``/``request`` as numbers, lists, null, objects.
- ``request-types``: a field of ``request`` (kind, resource, object, dryRun, operation, uid, ...)
  replaced by a value of the wrong type.
- ``nested-types``: any value at any depth of the request replaced by a wrong type.
- ``missing``: keys removed at random depths.
- ``content-type``: a valid review with a wrong or missing ``Content-Type``.
- ``non-utf8``: invalid UTF-8 bytes inside a string of an otherwise valid review.
- ``deep-nesting``: arrays/objects nested far beyond the parser's recursion limit, or moderately
  deep inside ``request.object``.
- ``huge``: bodies over the 7 MiB cap, with and without ``Content-Length`` (chunked).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 7 * 1024 * 1024

WEIRD_VALUES: list[Any] = [
    None,
    0,
    -1,
    1.5,
    2**70,
    -(2**70),
    True,
    False,
    "",
    " ",
    "x",
    "\u0000",
    "\ud800",
    "é☃",
    "null",
    [],
    [1, "a"],
    [None],
    [{}],
    {},
    {"a": 1},
    {"kind": []},
    "A" * 300,
    1e308,
    -0.0,
]
CONTENT_TYPES = [
    None,
    "",
    "text/plain",
    "application/yaml",
    "application/json-patch+json",
    "multipart/form-data",
    "application/x-www-form-urlencoded",
    "application/jsonx",
    "json",
    "application/vnd.kubernetes.protobuf",
]
REQUEST_FIELDS = [
    "uid",
    "kind",
    "resource",
    "subResource",
    "requestKind",
    "requestResource",
    "name",
    "namespace",
    "operation",
    "userInfo",
    "object",
    "oldObject",
    "dryRun",
    "options",
]
# The share of each category in a run, in 1/100ths (huge bodies are added on top, few but big).
WEIGHTS = {
    "bad-json": 13,
    "envelope-types": 12,
    "request-types": 25,
    "nested-types": 20,
    "missing": 12,
    "content-type": 7,
    "non-utf8": 7,
    "deep-nesting": 4,
}


@dataclass
class Case:
    index: int
    category: str
    body: bytes
    content_type: str | None = "application/json"
    expect_code: int | None = None  # the exact status.code expected, when the category fixes it
    chunked: bool = False  # send without Content-Length

    def describe(self, limit: int = 1500) -> str:
        shown = self.body[:limit]
        more = f"... ({len(self.body)} bytes)" if len(self.body) > limit else ""
        return f"case {self.index} [{self.category}] content-type={self.content_type!r}: {shown!r}{more}"


def _encode(value: Any) -> bytes:
    # allow_nan: Infinity/NaN are not JSON, but a sloppy client could send them
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys/indexes) to a value inside ``value``."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += _paths(child, prefix + (i,))
    return found


def _set(root: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        root = root[step]
    root[path[-1]] = value


def _delete(root: Any, path: tuple[Any, ...]) -> None:
    for step in path[:-1]:
        root = root[step]
    del root[path[-1]]


def _nested(depth: int, rng: random.Random) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"n": value}
    return value


def _case(index: int, category: str, template: dict[str, Any], rng: random.Random) -> Case:
    review = copy.deepcopy(template)
    request = review["request"]
    if category == "bad-json":
        text = _encode(review)
        choice = rng.randrange(8)
        if choice == 0:
            body = text[: rng.randrange(1, len(text))]
        elif choice == 1:
            body = text + rng.choice([b"}", b"]", b",", b" x", b"\n{}"])
        elif choice == 2:
            body = bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 200)))
        elif choice == 3:
            body = rng.choice(
                [b"", b" ", b"null", b"[]", b"123", b'"review"', b"true", b"{}", b"NaN", b'{"apiVersion":']
            )
        elif choice == 4:
            body = text.replace(b'"', b"'", rng.randrange(1, 6))
        elif choice == 5:
            body = text.replace(b":", b"=", 1)
        elif choice == 6:  # a UTF-8 byte order mark: Python's decoder accepts it, so no fixed code
            return Case(index, category, b"\xef\xbb\xbf" + text)
        else:
            body = text.replace(b"{", b"{,", 1)
        return Case(index, category, body, expect_code=400)
    if category == "envelope-types":
        key = rng.choice(["apiVersion", "kind", "request"])
        review[key] = rng.choice([v for v in WEIRD_VALUES if not isinstance(v, dict) or key != "request"])
        if key == "request" and isinstance(review[key], dict):  # still an object: not an envelope error
            return Case(index, category, _encode(review))
        return Case(index, category, _encode(review), expect_code=400)
    if category == "request-types":
        for key in rng.sample(REQUEST_FIELDS, rng.randrange(1, 4)):
            request[key] = rng.choice(WEIRD_VALUES)
        expect = 400 if not (isinstance(request["uid"], str) and request["uid"]) else None
        return Case(index, category, _encode(review), expect_code=expect)
    if category == "nested-types":
        paths = [p for p in _paths(request) if p]
        for path in rng.sample(paths, min(len(paths), rng.randrange(1, 4))):
            try:
                _set(request, path, rng.choice(WEIRD_VALUES))
            except (KeyError, IndexError, TypeError):  # an earlier change removed the parent
                pass
        expect = 400 if not (isinstance(request.get("uid"), str) and request.get("uid")) else None
        return Case(index, category, _encode(review), expect_code=expect)
    if category == "missing":
        for _ in range(rng.randrange(1, 4)):
            paths = [p for p in _paths(review) if p]
            if paths:
                _delete(review, rng.choice(paths))
        return Case(index, category, _encode(review), expect_code=_envelope_error(review))
    if category == "content-type":
        return Case(index, category, _encode(review), content_type=rng.choice(CONTENT_TYPES), expect_code=415)
    if category == "non-utf8":
        text = _encode(review)
        bad = rng.choice(
            [b"\xff", b"\xfe\xff", b"\x80", b"\xc3\x28", b"\xe9", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]
        )
        # inside the first string value after position 2, so the JSON itself stays well-formed
        quote = text.index(b'"', text.index(b":") + 1)
        return Case(index, category, text[: quote + 1] + bad + text[quote + 1 :], expect_code=400)
    if category == "deep-nesting":
        choice = rng.randrange(3)
        if choice == 0:
            depth = rng.randrange(20_000, 200_000)
            return Case(index, category, b"[" * depth + b"]" * depth, expect_code=400)
        if choice == 1:
            depth = rng.randrange(20_000, 100_000)
            inner = b'{"a":' * depth + b"1" + b"}" * depth
            body = _encode(review)[:-1] + b',"deep":' + inner + b"}"
            return Case(index, category, body, expect_code=400)
        request["object"] = {**(request.get("object") or {}), "deep": _nested(rng.randrange(50, 500), rng)}
        return Case(index, category, _encode(review))
    raise ValueError(category)


def _envelope_error(review: dict[str, Any]) -> int | None:
    request = review.get("request")
    ok = (
        review.get("apiVersion") == "admission.k8s.io/v1"
        and review.get("kind") == "AdmissionReview"
        and isinstance(request, dict)
        and isinstance(request.get("uid"), str)
        and request["uid"]
    )
    return None if ok else 400


def huge_cases(start: int, template: dict[str, Any]) -> list[Case]:
    """Bodies just over and far over the cap, declared (Content-Length) and streamed (chunked)."""
    padded = copy.deepcopy(template)
    padded["request"]["object"]["pad"] = "x" * MAX_BODY_BYTES
    body = _encode(padded)
    return [
        Case(start, "huge", body, expect_code=413),
        Case(start + 1, "huge", body, expect_code=413, chunked=True),
        Case(start + 2, "huge", body + b" " * MAX_BODY_BYTES, expect_code=413, chunked=True),
    ]


def generate(seed: int, count: int, templates: list[dict[str, Any]]) -> Iterator[Case]:
    """``count`` cases (including a few huge ones), the same for the same seed."""
    rng = random.Random(seed)
    categories = [c for c, weight in WEIGHTS.items() for _ in range(weight)]
    huge = [c for t in templates for c in huge_cases(0, t)]
    for index in range(count - len(huge)):
        template = templates[index % len(templates)]
        yield _case(index, rng.choice(categories), template, rng)
    for offset, case in enumerate(huge):
        case.index = count - len(huge) + offset
        yield case
