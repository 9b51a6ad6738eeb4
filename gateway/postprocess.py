"""Stage: post-processing on noisy values — HAVING, ORDER BY, LIMIT and OFFSET, hidden
outputs dropped, and the accuracy of what is released.

These run after noise is added and after the post-audit, on noisy values only, so they
cost nothing more (differential privacy is closed under post-processing). HAVING refers
to outputs as columns named ``__out<i>`` (see ``gateway.analyze.select``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from gateway.analyze.groups import is_literal, literal_value
from gateway.noising import NoisyCells, released_accuracy
from gateway.plan import QueryPlan
from mechanisms import QueryCalibration

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Answer:
    """The released rows (visible outputs only) and their accuracy."""

    rows: tuple[Row, ...]
    accuracy: dict[str, dict[str, Any]]


def finish(plan: QueryPlan, calibration: QueryCalibration, noisy: NoisyCells) -> Answer:
    """Filter, order and cut the noisy rows; keep the visible outputs; say how accurate
    each released number is."""
    kept = post_process(plan, noisy.rows)
    visible = [i for i, o in enumerate(plan.outputs) if not o.hidden]
    return Answer(
        rows=tuple(tuple(r[i] for i in visible) for r in kept),
        accuracy=released_accuracy(plan, calibration, [r[-1] for r in kept]),
    )


_COMPARISONS: dict[type[exp.Expr], Callable[[Any, Any], bool]] = {
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
}
_ARITHMETIC: dict[type[exp.Expr], Callable[[Any, Any], Any]] = {
    exp.Add: operator.add,
    exp.Sub: operator.sub,
    exp.Mul: operator.mul,
    exp.Div: operator.truediv,
    exp.Mod: operator.mod,
}


def post_process(plan: QueryPlan, rows: Sequence[Row]) -> list[Row]:
    """Filter, order and cut the noisy rows (all outputs, hidden ones included)."""
    out = list(rows)
    if plan.having is not None:
        having = plan.having
        out = [r for r in out if _truthy(_evaluate(having, r))]
    for key in reversed(plan.order_by):
        index = key.output
        out.sort(key=lambda r: _sort_key(r[index]), reverse=key.descending)
    if plan.offset:
        out = out[plan.offset :]
    if plan.limit is not None:
        out = out[: plan.limit]
    return out


def _sort_key(value: Any) -> tuple[int, Any]:
    # NULLs last in ascending order; numbers and texts never compared with each other.
    if value is None:
        return (2, 0)
    if isinstance(value, int | float):
        return (0, value)
    return (1, str(value))


def _truthy(value: Any) -> bool:
    return bool(value) if value is not None else False


def _evaluate(node: exp.Expr, row: Row) -> Any:
    if isinstance(node, exp.Paren):
        return _evaluate(node.this, row)
    if isinstance(node, exp.Column):
        return row[int(node.name.removeprefix("__out"))]
    if is_literal(node):
        return literal_value(node)
    if isinstance(node, exp.And):
        return _truthy(_evaluate(node.this, row)) and _truthy(_evaluate(node.expression, row))
    if isinstance(node, exp.Or):
        return _truthy(_evaluate(node.this, row)) or _truthy(_evaluate(node.expression, row))
    if isinstance(node, exp.Not):
        return not _truthy(_evaluate(node.this, row))
    if isinstance(node, exp.Neg):
        value = _evaluate(node.this, row)
        return None if value is None else -value
    for cls, op in _COMPARISONS.items():
        if isinstance(node, cls):
            left, right = _evaluate(node.this, row), _evaluate(node.expression, row)
            if left is None or right is None:
                return None
            try:
                return op(left, right)
            except TypeError:
                return False
    for cls, fn in _ARITHMETIC.items():
        if isinstance(node, cls):
            left, right = _evaluate(node.this, row), _evaluate(node.expression, row)
            if left is None or right is None:
                return None
            try:
                return fn(left, right)
            except (ZeroDivisionError, TypeError):
                return None
    if isinstance(node, exp.Between):
        value = _evaluate(node.this, row)
        low, high = _evaluate(node.args["low"], row), _evaluate(node.args["high"], row)
        if value is None or low is None or high is None:
            return None
        return low <= value <= high
    if isinstance(node, exp.In):
        value = _evaluate(node.this, row)
        return value in [_evaluate(e, row) for e in node.expressions]
    if isinstance(node, exp.Is):
        return _evaluate(node.this, row) is None
    return None
