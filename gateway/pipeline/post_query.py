"""Stage: the outer query of a nested aggregation, run on the inner query's release.

``SELECT d, SUM(n) FROM (<aggregate query>) AS t GROUP BY d``: the pipeline answers the
inner query as if it had been sent alone — planned, audited, charged, noised, recorded
and cached under its own canonical SQL — and this stage then runs the outer query (a
``PostQuery``, see ``gateway.sql.analyze.nested``) on that release's rows, in the sandbox of
``gateway.sql.released_table``. The input is the release and nothing else, so the result is
post-processing of differentially private values (Dwork & Roth 2014, Prop. 2.1): it
costs nothing more, and the auditor, which judged the inner query and its noisy cells,
has nothing new to judge. Identical inner queries share one cached release, whatever
outer query is run on it.

Accuracy of the outer results comes from the inner noise (``PostAccuracy``): a SUM of k
noisy values has the variance of k independent noises (``mechanisms.accuracy.
sum_accuracy``), an AVG of them 1/k² of that; counts of released rows are exact when
which rows exist is public; anything else over noisy values (MIN, MAX, expressions,
rows chosen by noisy values) is reported as null — unknown — rather than guessed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.core.errors import UnsupportedQuery
from gateway.core.plan import PostAccuracy, QueryPlan
from gateway.pipeline.noising import expected_accuracy
from gateway.pipeline.planning import PlannedQuery
from gateway.pipeline.release import ColumnInfo, Release
from gateway.sql.released_table import OuterQueryFailed, evaluate
from mechanisms import QueryCalibration
from mechanisms.accuracy import sum_accuracy

Row = tuple[Any, ...]


def run_post_query(planned: PlannedQuery, release: Release) -> Release:
    """The outer query's answer over the inner ``release`` (fresh, cached or a dry run)."""
    plan = planned.plan
    post = plan.post_query
    assert post is not None
    note: dict[str, Any] = {
        "inner_sql": plan.canonical_sql,
        "note": (
            "computed by dpgate from the released answer of the inner query, which is what "
            "was charged and audited; the outer query is post-processing and costs nothing"
        ),
    }
    columns = tuple(ColumnInfo(name, vtype) for name, vtype in post.columns)
    if release.extra.get("dry_run"):
        # No rows yet: the accuracy an outer value will have depends on how many released
        # rows it combines, so the dry run shows the inner query's expected accuracy.
        note["inner_accuracy"] = expected_accuracy(plan, planned.calibration)
        return replace(
            release,
            columns=columns,
            accuracy={},
            extra={**release.extra, "post_processing": note},
        )
    try:
        _, rows = evaluate(post.sql, post.inner_columns, release.rows)
    except OuterQueryFailed as e:
        raise UnsupportedQuery(
            f"the outer query failed on the released answer of its subquery ({e}). The "
            "subquery was answered and charged; its answer is cached, so running a "
            "corrected outer query over the same subquery costs nothing",
            construct="outer query",
        ) from None
    visible = len(post.columns)
    return replace(
        release,
        columns=columns,
        rows=tuple(r[:visible] for r in rows),
        accuracy=post_accuracy(plan, planned.calibration, release, rows),
        extra={**release.extra, "post_processing": note},
    )


def post_accuracy(
    plan: QueryPlan, calibration: QueryCalibration, release: Release, rows: list[Row]
) -> dict[str, Any]:
    """Column → accuracy of the outer query's noisy results (null where unknown)."""
    post = plan.post_query
    assert post is not None
    out: dict[str, Any] = {}
    for index, ((name, _), rule) in enumerate(zip(post.columns, post.accuracy, strict=True)):
        if rule.kind == "exact":
            continue
        if rule.kind == "unknown":
            out[name] = None
        elif rule.kind == "rows":
            out[name] = {"stddev": 0.0, "ci95_halfwidth": 0.0}
        elif rule.kind == "inherit":
            assert rule.inner is not None
            out[name] = release.accuracy.get(plan.outputs[rule.inner].name)
        else:
            out[name] = _per_row(plan, calibration, rule, index, rows)
    return out


def _per_row(
    plan: QueryPlan,
    calibration: QueryCalibration,
    rule: PostAccuracy,
    value_index: int,
    rows: list[Row],
) -> dict[str, Any]:
    """SUM or AVG of one noisy inner column: its error depends on how many released
    values each outer row combines (k), so it is given row by row."""
    assert rule.inner is not None and rule.rows_column is not None
    inner = plan.outputs[rule.inner]
    measure = plan.measures[inner.measures[0]]
    noise = calibration.noises[inner.measures[0]]
    resolution = float(measure.resolution)
    stddevs: list[float | None] = []
    halfwidths: list[float | None] = []
    intervals: list[list[float] | None] = []
    for row in rows:
        k = int(row[rule.rows_column] or 0)
        value = row[value_index]
        if k == 0 or value is None:
            stddevs.append(None)
            halfwidths.append(None)
            intervals.append(None)
            continue
        acc = sum_accuracy(noise, k)
        divisor = k if rule.kind == "avg" else 1
        sd = acc.stddev * resolution / divisor
        h = acc.ci95_halfwidth * resolution / divisor
        stddevs.append(sd)
        halfwidths.append(h)
        intervals.append([value - h, value + h])
    return {
        "stddev_per_row": stddevs,
        "ci95_halfwidth_per_row": halfwidths,
        "ci95_intervals": intervals,
    }
