"""Label and field selectors with the Kubernetes string syntax.

Parse errors raise ValueError; the HTTP layer turns them into 400 BadRequest, as the API
server does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")
_SET_RE = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")
_EQ_RE = re.compile(r"^([^=!\s]+)\s*(==|=|!=)\s*(.*)$")


@dataclass(frozen=True)
class Requirement:
    """One clause: op is one of =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # != and notin match absent keys


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced parentheses in selector {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise ValueError(f"unbalanced parentheses in selector {text!r}")
    parts.append("".join(current))
    return parts


def _check_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise ValueError(f"invalid label key {key!r}")
    return key


def _check_value(value: str) -> str:
    if not _VALUE_RE.match(value):
        raise ValueError(f"invalid label value {value!r}")
    return value


class LabelSelector:
    """A parsed label selector; the empty selector matches everything."""

    def __init__(self, text: str = ""):
        self.text = text
        self.requirements: list[Requirement] = []
        if not text.strip():
            return
        for raw in _split_top_level(text):
            self.requirements.append(self._parse(raw.strip()))

    @staticmethod
    def _parse(term: str) -> Requirement:
        if not term:
            raise ValueError("empty requirement in label selector")
        if m := _SET_RE.match(term):
            values = [_check_value(v.strip()) for v in m.group(3).split(",")]
            return Requirement(_check_key(m.group(1)), m.group(2), frozenset(values))
        if m := _EQ_RE.match(term):
            op = "!=" if m.group(2) == "!=" else "="
            return Requirement(_check_key(m.group(1)), op, frozenset([_check_value(m.group(3).strip())]))
        if term.startswith("!"):
            return Requirement(_check_key(term[1:].strip()), "!exists")
        return Requirement(_check_key(term), "exists")

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def match_labels_to_string(selector: dict[str, Any]) -> str:
    """Render a LabelSelector object (matchLabels/matchExpressions) as a selector string."""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], sorted(expr.get("values") or [])
        if op in ("In", "NotIn"):
            terms.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms)


def field_value(obj: dict[str, Any], path: str) -> str:
    """Value at a dotted path as a string ("" when missing), as field selectors compare it."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return str(cur).lower()
    return str(cur)


class FieldSelector:
    """A parsed field selector restricted to the fields a resource supports."""

    def __init__(self, text: str = "", supported: tuple[str, ...] = ()):
        self.text = text
        self.terms: list[tuple[str, bool, str]] = []  # (field, equal?, value)
        if not text.strip():
            return
        allowed = {"metadata.name", "metadata.namespace", *supported}
        known = ", ".join(f'"{f}"' for f in ("metadata.name", "metadata.namespace", *supported))
        for raw in text.split(","):
            m = _EQ_RE.match(raw.strip())
            if not m:
                raise ValueError(f"invalid selector: '{text}'; can't understand '{raw}'")
            key, op, value = m.group(1), m.group(2), m.group(3).strip()
            if key not in allowed:
                # kube-apiserver 1.36's wording (older releases said "field label not supported: <key>").
                raise ValueError(f'"{key}" is not a known field selector: only {known}')
            self.terms.append((key, op != "!=", value))

    def matches(self, obj: dict[str, Any]) -> bool:
        return all((field_value(obj, key) == value) == equal for key, equal, value in self.terms)
