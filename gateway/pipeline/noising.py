"""Adding noise: exact aggregate rows → released noisy cells, with their accuracy.

Which cells exist is decided without looking at the data where the keys are public
(every declared value, zeros included, in declared order), and by DP partition selection
otherwise (a group is kept iff its noisy unit count reaches the threshold). Every measure
of every cell gets fresh integer noise from ``mechanisms.sample``; the released values
are post-processing of those noisy integers (scaling by the grid resolution, AVG as a
ratio, HAVING, ORDER BY, LIMIT), so they cost nothing more.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.audit import AnsweredCell, CountNoise
from gateway.core.plan import Measure, OutputColumn, QueryPlan
from gateway.pipeline.quantiles import (
    choose_quantile,
    quantile_accuracy,
    released_quantile,
    spread_interval,
    spread_value,
    window_of,
)
from gateway.sql.compile import HISTOGRAM_COLUMNS, CompiledQuery
from gateway.sql.dialects import dialect
from mechanisms import Noise, QueryCalibration, accuracy, ratio_interval, sample

Row = tuple[Any, ...]

SPREAD_KINDS = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")


@dataclass(frozen=True)
class NoisyCells:
    """Every noisy cell of a query: as rows of all outputs (hidden ones included), each
    followed by the 95% intervals of its AVG outputs, before post-processing; and as
    cells for the auditor."""

    rows: tuple[Row, ...]
    cells: tuple[AnsweredCell, ...]

    def only(self, kept: Sequence[int]) -> NoisyCells:
        """The cells at ``kept`` (positions, in order), as rows and as cells."""
        return NoisyCells(tuple(self.rows[i] for i in kept), tuple(self.cells[i] for i in kept))

    def cells_json(self) -> list[dict[str, Any]]:
        return [
            {
                "key": list(c.group_values),
                "count": c.count,
                "sums": dict(c.sums),
                "noise": None
                if c.noise is None
                else {"mechanism": c.noise.mechanism, "scale": c.noise.scale},
            }
            for c in self.cells
        ]


def audit_cells_from_json(data: Sequence[dict[str, Any]]) -> tuple[AnsweredCell, ...]:
    """The cells ``NoisyCells.cells_json`` recorded (for the auditor's replay)."""
    # records written before noise scales were kept have none: the auditor then cannot
    # bound those counts' error, and refuses what depends on them
    return tuple(
        AnsweredCell(
            group_values=tuple(d["key"]),
            count=d.get("count"),
            sums=dict(d.get("sums") or {}),
            noise=CountNoise(d["noise"]["mechanism"], float(d["noise"]["scale"]))
            if d.get("noise")
            else None,
        )
        for d in data
    )


def add_noise(
    plan: QueryPlan,
    compiled: CompiledQuery,
    exact_rows: Sequence[Row],
    calibration: QueryCalibration,
) -> NoisyCells:
    """Noise every measure of every released cell (post-processing comes later)."""
    nk, nm = compiled.n_keys, compiled.n_measures
    histograms: dict[tuple[int, Row], list[Sequence[Any]]] = {}
    if compiled.n_histograms:
        aggregate_rows = []
        for r in exact_rows:
            tail = r[len(r) - HISTOGRAM_COLUMNS :]
            if tail[0] is None:
                aggregate_rows.append(r)
            else:
                histograms.setdefault((int(tail[0]), tuple(r[:nk])), []).append(tail[1:])
        exact_rows = aggregate_rows
    by_key = {tuple(r[:nk]): r for r in exact_rows}
    zeros = (0,) * nm
    selected: dict[int, list[int]] = {}
    if not plan.group_keys:
        keys: list[Row] = [()]
        exact = [tuple(by_key[()][nk : nk + nm]) if () in by_key else zeros]
    elif not plan.needs_partition_selection:
        keys = [tuple(k) for k in itertools.product(*(g.domain or () for g in plan.group_keys))]
        exact = [tuple(by_key[k][nk : nk + nm]) if k in by_key else zeros for k in keys]
    else:
        selection = calibration.selection
        assert selection is not None
        candidates = list(by_key)
        # the selecting count: a separate unit count (last column), or a measure's own
        column = nk + nm if selection.measure is None else nk + selection.measure
        draws = sample(selection.noise, len(candidates)) if candidates else []
        noisy_count = {
            k: int(by_key[k][column] or 0) + z for k, z in zip(candidates, draws, strict=True)
        }
        keys = [k for k in candidates if noisy_count[k] >= selection.threshold]
        keys.sort(key=lambda k: tuple((v is None, str(v)) for v in k))
        exact = [tuple(by_key[k][nk : nk + nm]) for k in keys]
        if selection.measure is not None:
            # the count that selected is released as drawn: one noise, one budget
            selected = {selection.measure: [noisy_count[k] for k in keys]}
    exact = centred(plan, exact)
    n = len(keys)
    noised = len(calibration.noises)  # the histogram measures come after, never noised
    noisy_measures: list[list[int]] = []
    for j, noise in enumerate(calibration.noises):
        if j in selected:
            noisy_measures.append(selected[j])
            continue
        draws = sample(noise, n) if n else []
        noisy_measures.append([int(exact[i][j] or 0) + draws[i] for i in range(n)])
    per_cell = [[noisy_measures[j][i] for j in range(noised)] for i in range(n)]
    chosen = [_choices(plan, calibration, keys[i], histograms) for i in range(n)]
    # Each row carries, past its outputs, the 95% intervals of its AVG, VARIANCE and
    # STDDEV outputs: they need the cell's noisy parts, which post-processing does not keep.
    all_rows = [
        (
            *(
                chosen[i][j] if j in chosen[i] else _output_value(o, plan, keys[i], per_cell[i])
                for j, o in enumerate(plan.outputs)
            ),
            _avg_intervals(plan, calibration, per_cell[i]),
        )
        for i in range(n)
    ]
    cells = tuple(_cell(plan, calibration, keys[i], per_cell[i]) for i in range(n))
    return NoisyCells(rows=tuple(all_rows), cells=cells)


def centred(plan: QueryPlan, exact: list[Row]) -> list[Row]:
    """Each cell's exact measures with every centred SUM (an AVG's) made Σ(x − c) = S − c·n,
    n being the AVG's count of the same rows (both are exact integers, so this is the very
    sum of the centred values whose sensitivity ``Measure.sensitivity`` states)."""
    pairs = {
        o.measures[0]: o.measures[1]
        for o in plan.outputs
        if o.kind == "avg" and plan.measures[o.measures[0]].center
    }
    if not pairs:
        return exact
    out: list[Row] = []
    for row in exact:
        values = list(row)
        for s, c in pairs.items():
            values[s] = int(values[s] or 0) - plan.measures[s].center * int(values[c] or 0)
        out.append(tuple(values))
    return out


def _choices(
    plan: QueryPlan,
    calibration: QueryCalibration,
    key: Row,
    histograms: Mapping[tuple[int, Row], Sequence[Sequence[Any]]],
) -> dict[int, Any]:
    """The quantile outputs of one cell, each chosen from its exact fine histogram's
    buckets near the target rank."""
    chosen: dict[int, Any] = {}
    quantiles = [(i, o) for i, o in enumerate(plan.outputs) if o.quantile is not None]
    for q, ((i, o), epsilon) in enumerate(zip(quantiles, calibration.choices, strict=True)):
        assert o.quantile is not None
        window = window_of(histograms.get((q, key), ()))
        chosen[i] = released_quantile(o, choose_quantile(o.quantile, window, epsilon))
    return chosen


def _output_value(o: OutputColumn, plan: QueryPlan, key: Row, noisy: list[int]) -> Any:
    if o.kind in SPREAD_KINDS:
        return spread_value(o, plan, noisy)
    if o.kind == "group_key":
        assert o.group_index is not None
        value = key[o.group_index]
        if o.type == "boolean" and value is not None:
            return bool(value)
        return value
    if o.kind == "literal":
        return o.value
    if o.kind == "count":
        return noisy[o.measures[0]]
    measure = plan.measures[o.measures[0]]
    if o.kind == "sum":
        return _scaled(noisy[o.measures[0]], measure)
    count = noisy[o.measures[1]]
    if count <= 0:
        return None
    # Σ(x − c)/n + c, in grid units, then scaled (c = 0 for an uncentred sum)
    average = (noisy[o.measures[0]] / count + measure.center) * float(measure.resolution)
    assert measure.lower is not None and measure.upper is not None
    return min(max(average, measure.lower), measure.upper)


def _scaled(value: int, m: Measure) -> int | float:
    if m.resolution == 1:
        return value
    return float(value * m.resolution)


def _cell(
    plan: QueryPlan, calibration: QueryCalibration, key: Row, noisy: list[int]
) -> AnsweredCell:
    count: float | None = None
    noise: CountNoise | None = None
    for kind in ("count_rows", "count_units", "count_values"):
        for j, m in enumerate(plan.measures):
            if m.kind == kind and count is None:
                count = float(noisy[j])
                n = calibration.noises[j]
                noise = CountNoise(n.mechanism, float(n.scale))
    counts = {o.measures[0]: o.measures[1] for o in plan.outputs if o.kind == "avg"}
    sums = {
        (m.expression.sql(dialect=dialect(None)) if m.expression is not None else f"m{j}"): float(
            _scaled(noisy[j] + m.center * noisy[counts[j]] if m.center else noisy[j], m)
        )
        for j, m in enumerate(plan.measures)
        if m.kind == "sum"
    }
    return AnsweredCell(group_values=key, count=count, sums=sums, noise=noise)


def _avg_intervals(
    plan: QueryPlan, calibration: QueryCalibration, noisy: list[int]
) -> dict[int, list[float] | None]:
    intervals: dict[int, list[float] | None] = {}
    for i, o in enumerate(plan.outputs):
        if o.kind in SPREAD_KINDS and not o.hidden:
            intervals[i] = spread_interval(o, plan, calibration.noises, noisy)
        if o.kind != "avg" or o.hidden:
            continue
        s, c = o.measures
        if noisy[c] <= 0:
            intervals[i] = None
            continue
        lo, hi = ratio_interval(noisy[s], calibration.noises[s], noisy[c], calibration.noises[c])
        r, center = float(plan.measures[s].resolution), plan.measures[s].center
        intervals[i] = [(lo + center) * r, (hi + center) * r]
    return intervals


def released_accuracy(
    plan: QueryPlan,
    calibration: QueryCalibration,
    avg_intervals: Sequence[dict[int, list[float] | None]],
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i, o in enumerate(plan.outputs):
        if o.hidden or o.kind in ("group_key", "literal"):
            continue
        m = plan.measures[o.measures[0]]
        if o.kind in ("count", "sum"):
            out[o.name] = _measure_accuracy(m, calibration.noises[o.measures[0]])
            continue
        if o.quantile is not None or o.kind in SPREAD_KINDS:
            out[o.name] = _nonlinear_accuracy(plan, calibration, o)
            if o.kind in SPREAD_KINDS:
                out[o.name]["ci95_intervals"] = [row.get(i) for row in avg_intervals]
            continue
        s, c = o.measures
        out[o.name] = {
            "ci95_intervals": [row.get(i) for row in avg_intervals],
            "sum": _measure_accuracy(m, calibration.noises[s]),
            "count": _measure_accuracy(plan.measures[c], calibration.noises[c]),
        }
    return out


def _nonlinear_accuracy(
    plan: QueryPlan, calibration: QueryCalibration, o: OutputColumn
) -> dict[str, Any]:
    """A quantile's rank interval; for VARIANCE / STDDEV, the accuracy of its parts (the
    released rows' intervals are added from the noisy values)."""
    if o.quantile is not None:
        quantiles = [q for q in plan.outputs if q.quantile is not None]
        return quantile_accuracy(o.quantile, calibration.choices[quantiles.index(o)])
    parts = zip(("sum", "sum_squares", "count"), o.measures, strict=True)
    return {
        "method": "conservative: union bound over the three noises, interval arithmetic",
        **{name: _measure_accuracy(plan.measures[j], calibration.noises[j]) for name, j in parts},
    }


def _measure_accuracy(m: Measure, noise: Noise) -> dict[str, float]:
    a = accuracy(noise)
    r = float(m.resolution)
    return {"stddev": a.stddev * r, "ci95_halfwidth": a.ci95_halfwidth * r}


def expected_accuracy(plan: QueryPlan, calibration: QueryCalibration) -> dict[str, dict[str, Any]]:
    """Accuracy of each aggregate before anything is computed (for ``dry_run``)."""
    out: dict[str, dict[str, Any]] = {}
    for o in plan.visible_outputs:
        if o.kind in ("count", "sum"):
            out[o.name] = _measure_accuracy(
                plan.measures[o.measures[0]], calibration.noises[o.measures[0]]
            )
        elif o.quantile is not None or o.kind in SPREAD_KINDS:
            out[o.name] = _nonlinear_accuracy(plan, calibration, o)
        elif o.kind == "avg":
            s, c = o.measures
            out[o.name] = {
                "sum": _measure_accuracy(plan.measures[s], calibration.noises[s]),
                "count": _measure_accuracy(plan.measures[c], calibration.noises[c]),
            }
    return out


def selection_note(
    plan: QueryPlan, calibration: QueryCalibration, rows: int | None
) -> dict[str, Any]:
    """What an analyst must know when groups were released by DP partition selection.

    Groups whose noisy count of people falls below the threshold are left out rather than
    shown, so a short or empty answer needs saying in words. The threshold comes from the
    calibration (ε, δ and the contribution bounds), never from the data; ``rows`` is the
    number of released rows, itself a DP output (None for a dry run, which has none).
    """
    selection = calibration.selection
    assert selection is not None
    keys = [g.name for g in plan.group_keys if g.domain is None]
    named = ", ".join(keys)
    if selection.measure is None:
        counted = "its number of people plus noise"
    else:
        counted = f"its noisy {_count_name(plan, selection.measure)} (the one released)"
    note = (
        f"The values of {named} are not declared public, so a group is released only if "
        f"{counted} reaches {selection.threshold} (DP partition selection): smaller groups "
        f"are left out, not shown as zero."
    )
    if rows == 0:  # the answer is empty: say why, rather than leave it unexplained
        note += " No group reached the threshold"
        note += (
            " (or HAVING, LIMIT or OFFSET removed those that did)."
            if plan.having is not None or plan.limit is not None or plan.offset
            else "."
        )
    return {"threshold": selection.threshold, "keys": keys, "note": note}


def _count_name(plan: QueryPlan, measure: int) -> str:
    """How the note names the count that selects: the output showing it, if one does."""
    for o in plan.outputs:
        if o.kind == "count" and o.measures == (measure,) and not o.hidden:
            return o.name
    m = plan.measures[measure]
    if m.kind == "count_units":
        return "number of people"
    if m.kind == "count_values" and m.expression is not None:
        return f"count of rows with a {m.expression.sql(dialect=dialect(None))}"
    return "count of rows"
