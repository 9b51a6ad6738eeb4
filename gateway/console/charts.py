"""Vega-Lite specs for the console's charts, built from released answers and spend series.

A chart is chosen from the shape of the answer, never from its values:

- no group key, or no noisy column: no chart (the table says it all);
- one group key whose type is ordered (``integer``, ``real``, ``date``): a line through
  the noisy values with the 95% interval as a band;
- otherwise (text or boolean keys, or several keys joined into one label): bars with a
  95% error bar on each.

The first noisy column is drawn. Every interval is the one the API released: ``value ±
ci95_halfwidth`` for COUNT and SUM, the released ``ci95_intervals`` row for AVG (a row
whose interval is ``null`` is drawn without one). Data is inlined under fixed field
names (``key``, ``value``, ``low``, ``high``) so that column names such as ``AVG(age)``
need no escaping; the column names appear only as titles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

SCHEMA_URL = "https://vega.github.io/schema/vega-lite/v6.json"
ORDERED_TYPES = frozenset({"integer", "real", "date"})
MAX_POINTS = 500
"""Rows drawn at most (in the answer's own order); a title says when more were left out."""
HEIGHT = 260

ChartKind = Literal["bars", "line"]
Width = int | Literal["container"]


@dataclass(frozen=True)
class Point:
    """One released cell to draw: its group label, noisy value and 95% interval."""

    key: str | float | int
    value: float
    low: float | None
    high: float | None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class ReleaseChart:
    """The chart chosen for a released answer, and its Vega-Lite spec."""

    kind: ChartKind
    measure: str
    keys: tuple[str, ...]
    points: tuple[Point, ...]
    truncated_from: int | None
    spec: dict[str, Any]


def release_chart(release: Mapping[str, Any], *, width: Width = "container") -> ReleaseChart | None:
    """The chart of a released answer (``columns``, ``rows``, ``accuracy``), or ``None``.

    ``None`` when there is nothing to plot: no rows, no group key or no noisy column.
    """
    columns = [c for c in release.get("columns") or () if isinstance(c, Mapping)]
    rows = [r for r in release.get("rows") or () if isinstance(r, Sequence)]
    accuracy = release.get("accuracy") or {}
    names = [str(c.get("name")) for c in columns]
    noisy = [i for i, n in enumerate(names) if n in accuracy]
    keys = [i for i in range(len(names)) if i not in noisy]
    if not rows or not noisy or not keys:
        return None
    measure = noisy[0]
    measure_accuracy = accuracy[names[measure]]
    ordered = len(keys) == 1 and columns[keys[0]].get("type") in ORDERED_TYPES
    points: list[Point] = []
    for index, row in enumerate(rows[:MAX_POINTS]):
        value = _finite(row[measure]) if measure < len(row) else None
        if value is None:
            continue
        low, high = _interval(measure_accuracy, index, value)
        key: str | float | int
        if ordered and columns[keys[0]].get("type") != "date":
            number = _finite(row[keys[0]])
            if number is None:
                continue
            key = number
        else:
            key = " · ".join(_label(row[i]) for i in keys)
        points.append(Point(key=key, value=value, low=low, high=high))
    if not points:
        return None
    kind: ChartKind = "line" if ordered else "bars"
    truncated = len(rows) if len(rows) > MAX_POINTS else None
    key_title = " · ".join(names[i] for i in keys)
    key_type = columns[keys[0]].get("type") if ordered else None
    spec = _release_spec(
        kind,
        points,
        key_title=key_title,
        key_type=key_type,
        measure=names[measure],
        truncated_from=truncated,
        width=width,
    )
    return ReleaseChart(
        kind=kind,
        measure=names[measure],
        keys=tuple(names[i] for i in keys),
        points=tuple(points),
        truncated_from=truncated,
        spec=spec,
    )


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _label(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _interval(accuracy: Any, index: int, value: float) -> tuple[float | None, float | None]:
    """The released 95% interval of one cell (see the module docstring)."""
    if not isinstance(accuracy, Mapping):
        return None, None
    intervals = accuracy.get("ci95_intervals")
    if isinstance(intervals, Sequence):
        pair = intervals[index] if index < len(intervals) else None
        if isinstance(pair, Sequence) and len(pair) == 2:
            low, high = _finite(pair[0]), _finite(pair[1])
            if low is not None and high is not None:
                return low, high
        return None, None
    half = _finite(accuracy.get("ci95_halfwidth"))
    if half is None:
        return None, None
    return value - half, value + half


def _release_spec(
    kind: ChartKind,
    points: Sequence[Point],
    *,
    key_title: str,
    key_type: Any,
    measure: str,
    truncated_from: int | None,
    width: Width,
) -> dict[str, Any]:
    title = f"{measure} by {key_title}, with 95% intervals"
    if truncated_from is not None:
        title += f" (first {len(points)} of {truncated_from} rows)"
    if kind == "bars":
        x: dict[str, Any] = {
            "field": "key",
            "type": "nominal",
            "title": key_title,
            "sort": None,
            "axis": {"labelAngle": 0 if len(points) <= 8 else -45, "labelLimit": 160},
        }
    else:
        x = {
            "field": "key",
            "type": "temporal" if key_type == "date" else "quantitative",
            "title": key_title,
            "scale": {"zero": False},
        }
        if key_type == "integer":
            # a year or an age is a label: 2019, not 2,019.0 (and no ticks between them)
            x["axis"] = {"format": "d", "tickMinStep": 1}
    y = {"field": "value", "type": "quantitative", "title": measure}
    tooltip = [
        {"field": "key", "type": x["type"], "title": key_title}
        | ({"format": "d"} if key_type == "integer" and kind != "bars" else {}),
        {"field": "value", "type": "quantitative", "title": measure, "format": ",.4~f"},
        {"field": "low", "type": "quantitative", "title": "95% low", "format": ",.4~f"},
        {"field": "high", "type": "quantitative", "title": "95% high", "format": ",.4~f"},
    ]
    interval = {
        "x": x,
        "y": {"field": "low", "type": "quantitative", "title": measure},
        "y2": {"field": "high"},
    }
    with_interval = {"filter": "isValid(datum.low) && isValid(datum.high)"}
    if kind == "bars":
        layers: list[dict[str, Any]] = [
            {
                "mark": {"type": "bar", "tooltip": True},
                "encoding": {"x": x, "y": y, "tooltip": tooltip},
            },
            {
                "transform": [with_interval],
                "mark": {"type": "errorbar", "ticks": True, "color": "#222"},
                "encoding": interval,
            },
        ]
    else:
        layers = [
            {
                "transform": [with_interval],
                "mark": {"type": "errorband", "opacity": 0.3},
                "encoding": interval,
            },
            {
                "mark": {"type": "line", "point": True, "tooltip": True},
                "encoding": {"x": x, "y": y, "tooltip": tooltip},
            },
        ]
    return {
        "$schema": SCHEMA_URL,
        "description": title,
        "title": title,
        "width": width,
        "height": HEIGHT,
        "autosize": {"type": "fit-x", "contains": "padding"},
        "data": {"values": [p.to_json() for p in points]},
        "layer": layers,
    }


@dataclass(frozen=True)
class SpendPoint:
    """ε spent by one analyst just after one charge (or refund), as the accountant reports."""

    at: str
    epsilon_spent: float
    query_epsilon: float
    outcome: str


def spend_chart(
    name: str,
    points: Sequence[SpendPoint],
    *,
    epsilon_budget: float | None,
    width: Width = "container",
) -> dict[str, Any]:
    """ε spent over time for one analyst: a step line, the budget as a rule."""
    title = f"ε spent by {name} over time"
    layers: list[dict[str, Any]] = [
        {
            "mark": {"type": "line", "interpolate": "step-after", "point": True, "tooltip": True},
            "encoding": {
                "x": {
                    "field": "at",
                    "type": "temporal",
                    "title": "time (UTC)",
                    # UTC, as the ledger records it; padded so that one charge is not
                    # drawn on a zero-width axis.
                    "scale": {"type": "utc", "padding": 24},
                    # one format for every tick (Vega's default mixes "07:48" and "08 PM"),
                    # in UTC as the scale is (a "formatType" would make Vega ignore it)
                    "axis": {"labelAngle": 0, "format": "%m-%d %H:%M"},
                },
                "y": {"field": "epsilon_spent", "type": "quantitative", "title": "ε spent"},
                "tooltip": [
                    {
                        "field": "at",
                        "type": "temporal",
                        "title": "time (UTC)",
                        "format": "%Y-%m-%d %H:%M:%S",
                        "formatType": "utc",
                    },
                    {
                        "field": "epsilon_spent",
                        "type": "quantitative",
                        "title": "ε spent",
                        "format": ".4~f",
                    },
                    {
                        "field": "query_epsilon",
                        "type": "quantitative",
                        "title": "this query's ε",
                        "format": ".4~f",
                    },
                    {"field": "outcome", "type": "nominal", "title": "outcome"},
                ],
            },
        }
    ]
    data: dict[str, Any] = {"values": [asdict(p) for p in points]}
    if epsilon_budget is not None and math.isfinite(epsilon_budget):
        layers.append(
            {
                "data": {"values": [{"budget": epsilon_budget}]},
                "mark": {"type": "rule", "strokeDash": [4, 4], "color": "#b00"},
                "encoding": {
                    "y": {"field": "budget", "type": "quantitative"},
                    "tooltip": [{"field": "budget", "type": "quantitative", "title": "ε budget"}],
                },
            }
        )
    return {
        "$schema": SCHEMA_URL,
        "description": title,
        "title": title,
        "width": width,
        "height": HEIGHT,
        "autosize": {"type": "fit-x", "contains": "padding"},
        "data": data,
        "layer": layers,
    }
