"""Evaluate admission webhook ``matchConditions`` (CEL) the way the Kubernetes API server does.

Used by the local demo's admission chain (``demo.admission_chain``) and by the chart tests on
the rendered webhook configurations (through ``tests/support/cel.py``). Needs ``cel-python``,
which the ``demo`` and ``test`` extras install.

Kubernetes semantics (``admissionregistration.k8s.io/v1`` MatchCondition):

* variables: ``object``, ``oldObject`` (``null`` when absent, e.g. on CREATE), ``request``
  (the AdmissionReview ``request``), ``authorizer`` (not supported here);
* each expression must yield a bool;
* if ANY condition is false the webhook is skipped (even if another one errored);
* otherwise, if any condition errored, the webhook's failurePolicy decides: we raise
  :class:`MatchConditionError` so the caller can apply it;
* otherwise (all true) the webhook is called.

Inputs are converted with ``celpy.json_to_cel``: plain Python dicts would make ``has()``
silently return false.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import celpy
from celpy.adapter import json_to_cel

__all__ = ["MatchConditionError", "evaluate_match_conditions", "activation_for"]


class MatchConditionError(Exception):
    """A matchCondition failed to compile or evaluate, or did not return a bool."""

    def __init__(self, name: str, expression: str, cause: object) -> None:
        super().__init__(f"matchCondition {name!r} ({expression!r}): {cause}")
        self.name = name
        self.expression = expression
        self.cause = cause


_ENV = celpy.Environment()


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> Any:
    return _ENV.program(_ENV.compile(expression))


def activation_for(request: Mapping[str, Any]) -> dict[str, Any]:
    """The CEL variables for one AdmissionReview ``request`` dict."""
    return {
        "request": json_to_cel(dict(request)),
        "object": json_to_cel(request.get("object")),
        "oldObject": json_to_cel(request.get("oldObject")),
    }


def evaluate_match_conditions(conditions: Iterable[Mapping[str, str]], request: Mapping[str, Any]) -> bool:
    """True when every condition is true; False when any is false.

    Raises :class:`MatchConditionError` when none is false but one errors (Kubernetes then
    applies the webhook's failurePolicy).
    """
    activation = activation_for(request)
    first_error: MatchConditionError | None = None
    for cond in conditions:
        name, expression = cond["name"], cond["expression"]
        try:
            value = _program(expression).evaluate(activation)
        except Exception as exc:  # noqa: BLE001 - compile errors and CELEvalError alike
            first_error = first_error or MatchConditionError(name, expression, exc)
            continue
        if isinstance(value, Exception):  # celpy may return an error value instead of raising
            first_error = first_error or MatchConditionError(name, expression, value)
            continue
        if not isinstance(value, (bool, celpy.celtypes.BoolType)):
            first_error = first_error or MatchConditionError(
                name, expression, f"returned {type(value).__name__}, not bool"
            )
            continue
        if not bool(value):
            return False
    if first_error is not None:
        raise first_error
    return True
