"""CEL matchConditions for the chart tests: the implementation lives in ``demo.cel`` (shared with
the demo's admission chain)."""

from demo.cel import MatchConditionError, activation_for, evaluate_match_conditions

__all__ = ["MatchConditionError", "evaluate_match_conditions", "activation_for"]
