"""Stage: post-processing on noisy values — what is publicly known imposed on the released
values, HAVING, ORDER BY, LIMIT and OFFSET, hidden outputs dropped, and the accuracy of
what is released.

These run after noise is added and after the post-audit, on noisy values only, so they
cost nothing more (differential privacy is closed under post-processing: Dwork & Roth
2014, Prop. 2.1). HAVING refers to outputs as columns named ``__out<i>`` (see
``gateway.sql.analyze.select``).

Two steps, because one release serves many requests (the answer cache):

- ``finish`` keeps the rows HAVING and ORDER BY select, with the noisy values as drawn
  (unbiased: what the ledger records as the query's *uncut* answer);
- ``present`` shapes that answer for one request: values (and 95% intervals) moved into
  what is public — a count is never below 0, a SUM of a column bounded below by 0 is
  never negative, an AVG and its interval lie within the column's declared bounds —
  unless the request asks ``"raw": true``; then LIMIT and OFFSET. A ``LIMIT 1`` probe and
  the full query are two cuts of one release, charged once.

HAVING and ORDER BY read the clamped values whether or not ``raw`` is asked, so a raw
answer has the same rows as the clamped one: only its values differ.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlglot import exp

from gateway.core.plan import OutputColumn, QueryPlan
from gateway.pipeline.noising import NoisyCells, released_accuracy, selection_note
from gateway.pipeline.planning import PlannedQuery
from gateway.pipeline.release import Release
from gateway.sql.analyze.groups import is_literal, literal_value
from mechanisms import QueryCalibration

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Answer:
    """The released rows (visible outputs only) and their accuracy."""

    rows: tuple[Row, ...]
    accuracy: dict[str, dict[str, Any]]


def finish(plan: QueryPlan, calibration: QueryCalibration, noisy: NoisyCells) -> Answer:
    """Filter and order the noisy rows (not cut: see ``present``); keep the visible
    outputs, as drawn; say how accurate each number is."""
    kept = post_process(plan, noisy.rows)
    visible = [i for i, o in enumerate(plan.outputs) if not o.hidden]
    return Answer(
        rows=tuple(tuple(r[i] for i in visible) for r in kept),
        accuracy=released_accuracy(plan, calibration, [r[-1] for r in kept]),
    )


Bounds = tuple[float | None, float | None]

CLAMPED_NOTE = (
    "post-processing (free): values are moved into what is publicly known — a count is "
    "never below 0, a SUM of a column declared non-negative is never below 0, an AVG and "
    'its interval lie within the column\'s declared bounds. Ask with "raw": true for '
    "the noisy values as drawn (unbiased, so they can be summed; a count may then be "
    "negative)"
)


def public_bounds(plan: QueryPlan, o: OutputColumn) -> Bounds | None:
    """What is publicly known about an output's value, whatever the data: (lower, upper),
    either None when unknown; None when nothing is known."""
    if o.kind == "count":
        return (0, None)
    if o.kind in ("sum", "avg"):
        m = plan.measures[o.measures[0]]
        if m.lower is None or m.upper is None:
            return None
        if o.kind == "avg":
            return (m.lower, m.upper)
        return (0 if m.lower >= 0 else None, 0 if m.upper <= 0 else None)
    return None


def present(plan: QueryPlan, answer: Answer, *, raw: bool) -> tuple[Answer, dict[str, Any] | None]:
    """One request's view of a finished answer: clamped into public bounds unless ``raw``,
    then cut by OFFSET and LIMIT. Returns the answer and, when a value or an interval was
    moved, the note that says so (with the columns concerned)."""
    rows = list(answer.rows)
    accuracy = {name: dict(entry) for name, entry in answer.accuracy.items()}
    moved: list[str] = []
    if not raw:
        for i, o in enumerate(plan.visible_outputs):
            bounds = public_bounds(plan, o)
            if bounds is None:
                continue
            changed = False
            for r, row in enumerate(rows):
                value = _clamp(row[i], bounds)
                if value != row[i] or type(value) is not type(row[i]):
                    rows[r] = (*row[:i], value, *row[i + 1 :])
                    changed = True
            intervals = accuracy.get(o.name, {}).get("ci95_intervals")
            if intervals is not None:
                fixed = [_clamp_interval(iv, bounds, rows[r][i]) for r, iv in enumerate(intervals)]
                changed = changed or fixed != intervals
                accuracy[o.name]["ci95_intervals"] = fixed
            if changed:
                moved.append(o.name)
    start = plan.offset
    stop = None if plan.limit is None else start + plan.limit
    for entry in accuracy.values():
        if isinstance(entry.get("ci95_intervals"), list):
            entry["ci95_intervals"] = entry["ci95_intervals"][start:stop]
    note = {"columns": moved, "note": CLAMPED_NOTE} if moved else None
    return Answer(rows=tuple(rows[start:stop]), accuracy=accuracy), note


def shown(planned: PlannedQuery, release: Release, uncut: Answer) -> Release:
    """``release`` as this request sees it: ``uncut`` presented (``present``), with the
    notes that depend on what is shown (clamping; partition selection's empty answer)."""
    plan = planned.plan
    answer, note = present(plan, uncut, raw=planned.request.raw)
    extra = {k: v for k, v in release.extra.items() if k not in ("clamped", "partition_selection")}
    if plan.needs_partition_selection:
        extra["partition_selection"] = selection_note(plan, planned.calibration, len(answer.rows))
    if note is not None:
        extra["clamped"] = note
    return replace(release, rows=answer.rows, accuracy=answer.accuracy, extra=extra)


def _clamp(value: Any, bounds: Bounds) -> Any:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return value
    lower, upper = bounds
    if lower is not None and value < lower:
        return type(value)(lower)
    if upper is not None and value > upper:
        return type(value)(upper)
    return value


def _clamp_interval(interval: Any, bounds: Bounds, value: Any) -> Any:
    """An interval moved into the bounds, still holding the (clamped) released value."""
    if not isinstance(interval, list) or len(interval) != 2:
        return interval
    lo, hi = (float(_clamp(float(x), bounds)) for x in interval)
    if isinstance(value, int | float) and not isinstance(value, bool):
        lo, hi = min(lo, float(value)), max(hi, float(value))
    return [lo, hi]


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
    """Filter and order the noisy rows (all outputs, hidden ones included), by their
    values clamped into public bounds (``present``)."""
    bounds = [public_bounds(plan, o) for o in plan.outputs]
    views = [
        (tuple(v if b is None else _clamp(v, b) for v, b in zip(r, bounds, strict=False)), r)
        for r in rows
    ]
    if plan.having is not None:
        having = plan.having
        views = [(v, r) for v, r in views if _truthy(_evaluate(having, v))]
    for key in reversed(plan.order_by):
        index = key.output
        views.sort(key=lambda vr: _sort_key(vr[0][index]), reverse=key.descending)
    return [r for _, r in views]


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
