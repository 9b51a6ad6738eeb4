"""The console's chart specs, built in Python and rendered to SVG without a browser.

vl-convert (Vega and Vega-Lite compiled into a Python extension) renders each spec the
way the console's vendored Vega does, so these tests see the marks a user would see:
one bar and one 95% error bar per group, error bars as long as the released intervals.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from budget import HistoryEntry, accountant
from gateway.console.charts import MAX_POINTS, release_chart, spend_chart
from gateway.console.spend import spend_series
from mechanisms.types import PrivacyCost

vlc = pytest.importorskip("vl_convert", reason="pip install vl-convert-python (the dev extra)")
VL_VERSION = "6.4"  # the newest Vega-Lite 6 that vl-convert ships; the console vendors 6.5


def render(spec: dict[str, Any]) -> str:
    svg: str = vlc.vegalite_to_svg(spec, vl_version=VL_VERSION)
    return svg


def marks(svg: str, role: str) -> list[str]:
    """The SVG elements Vega drew for one kind of mark (its aria-roledescription)."""
    return re.findall(rf'<[a-z]+ [^>]*aria-roledescription="{role}"[^>]*>', svg)


def rule_length(element: str) -> float:
    return abs(float(re.search(r'y2="([-0-9.e]+)"', element).group(1)))  # type: ignore[union-attr]


def release(
    columns: list[tuple[str, str]], rows: list[list[Any]], accuracy: dict[str, Any]
) -> dict[str, Any]:
    return {
        "columns": [{"name": n, "type": t} for n, t in columns],
        "rows": rows,
        "accuracy": accuracy,
    }


COUNT_BY_DISEASE = release(
    [("disease", "text"), ("n", "integer")],
    [["Crohn", 94], ["Influenza", 872], ["Asthma", -3]],
    {"n": {"stddev": 2.8, "ci95_halfwidth": 6.0}},
)


def test_a_group_by_text_key_is_bars_with_one_error_bar_per_group() -> None:
    chart = release_chart(COUNT_BY_DISEASE, width=400)
    assert chart is not None
    assert chart.kind == "bars" and chart.measure == "n" and chart.keys == ("disease",)
    assert [(p.key, p.value, p.low, p.high) for p in chart.points] == [
        ("Crohn", 94.0, 88.0, 100.0),
        ("Influenza", 872.0, 866.0, 878.0),
        ("Asthma", -3.0, -9.0, 3.0),
    ]
    svg = render(chart.spec)
    assert len(marks(svg, "bar")) == 3
    bars = marks(svg, "errorbar")
    # The ranged error bar (one rule per group) and its two ticks per group.
    rules = [b for b in bars if b.startswith("<line")]
    assert len(rules) == 3
    # Same half-width on every row: every error bar has the same length on screen.
    lengths = {round(rule_length(r), 6) for r in rules}
    assert len(lengths) == 1 and lengths.pop() > 0


def test_avg_error_bars_follow_each_rows_released_interval() -> None:
    avg = release(
        [("sex", "text"), ("AVG(age)", "real")],
        [["F", 40.0], ["M", 50.0], ["X", 45.0]],
        {
            "AVG(age)": {
                "ci95_intervals": [[30.0, 50.0], [45.0, 55.0], None],
                "sum": {"stddev": 1.0, "ci95_halfwidth": 2.0},
                "count": {"stddev": 1.0, "ci95_halfwidth": 2.0},
            }
        },
    )
    chart = release_chart(avg, width=400)
    assert chart is not None and chart.kind == "bars"
    assert [(p.low, p.high) for p in chart.points] == [(30.0, 50.0), (45.0, 55.0), (None, None)]
    rules = [b for b in marks(render(chart.spec), "errorbar") if b.startswith("<line")]
    assert len(rules) == 2  # the row without an interval has no error bar
    first, second = (rule_length(r) for r in rules)
    assert first == pytest.approx(2 * second, rel=1e-6)  # widths 20 and 10


def test_an_ordered_key_is_a_line_with_a_band() -> None:
    by_age = release(
        [("age", "integer"), ("n", "integer")],
        [[20, 5], [30, 9], [40, 7]],
        {"n": {"stddev": 1.0, "ci95_halfwidth": 3.0}},
    )
    chart = release_chart(by_age, width=400)
    assert chart is not None and chart.kind == "line"
    assert [p.key for p in chart.points] == [20.0, 30.0, 40.0]
    svg = render(chart.spec)
    assert marks(svg, "line mark") or "mark-line" in svg
    assert "mark-area" in svg  # the 95% band
    by_day = release(
        [("admitted", "date"), ("n", "integer")],
        [["2024-01-01", 5], ["2024-01-02", 9]],
        {"n": {"stddev": 1.0, "ci95_halfwidth": 3.0}},
    )
    chart = release_chart(by_day, width=400)
    assert chart is not None and chart.kind == "line"
    assert chart.spec["layer"][1]["encoding"]["x"]["type"] == "temporal"
    assert "mark-line" in render(chart.spec)


def test_several_keys_are_joined_into_one_label() -> None:
    two = release(
        [("sex", "text"), ("smoker", "boolean"), ("n", "integer")],
        [["F", True, 3], ["F", False, 4], ["M", None, 5]],
        {"n": {"stddev": 1.0, "ci95_halfwidth": 2.0}},
    )
    chart = release_chart(two, width=400)
    assert chart is not None and chart.kind == "bars" and chart.keys == ("sex", "smoker")
    assert [p.key for p in chart.points] == ["F · true", "F · false", "M · NULL"]
    assert len(marks(render(chart.spec), "bar")) == 3


def test_nothing_to_plot_is_no_chart() -> None:
    no_key = release([("n", "integer")], [[5]], {"n": {"stddev": 1.0, "ci95_halfwidth": 2.0}})
    assert release_chart(no_key) is None
    empty = {**COUNT_BY_DISEASE, "rows": []}
    assert release_chart(empty) is None
    public_only = release([("sex", "text")], [["F"], ["M"]], {})  # SELECT DISTINCT: free
    assert release_chart(public_only) is None
    assert release_chart({}) is None


def test_a_long_answer_is_cut_and_says_so() -> None:
    rows = [[f"k{i}", i] for i in range(MAX_POINTS + 20)]
    chart = release_chart(
        release([("k", "text"), ("n", "integer")], rows, {"n": {"ci95_halfwidth": 1.0}})
    )
    assert chart is not None
    assert len(chart.points) == MAX_POINTS and chart.truncated_from == MAX_POINTS + 20
    assert f"first {MAX_POINTS} of {MAX_POINTS + 20} rows" in chart.spec["title"]


def test_column_names_are_titles_never_field_paths() -> None:
    tricky = release(
        [("a.b[0]", "text"), ('SUM(x) "y"', "integer")],
        [["p", 1], ["q", 2]],
        {'SUM(x) "y"': {"ci95_halfwidth": 1.0}},
    )
    chart = release_chart(tricky, width=300)
    assert chart is not None
    svg = render(chart.spec)  # would raise if a name were read as a nested field path
    assert len(marks(svg, "bar")) == 2


def entry(minutes: int, cost: PrivacyCost, outcome: str) -> HistoryEntry:
    t = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes)
    return HistoryEntry(
        reservation_id=f"q{minutes}",
        sql="SELECT COUNT(*) FROM t",
        mechanism="laplace",
        cost=cost,
        outcome=outcome,  # type: ignore[arg-type]
        release=None,
        reason=None,
        created_at=t,
        settled_at=t,
    )


def laplace(eps: float) -> PrivacyCost:
    return PrivacyCost(eps, 0.0, eps * eps / 2, 0.0)


@pytest.mark.parametrize("composition", ["zcdp", "pure"])
def test_spend_is_what_the_accountant_reports_after_each_standing_charge(composition: str) -> None:
    entries = [
        entry(3, laplace(0.5), "answered"),
        entry(1, laplace(0.1), "answered"),
        entry(2, laplace(0.3), "refunded"),  # costs nothing
        entry(4, PrivacyCost(0, 0, 0, 0), "refused"),  # costs nothing
        entry(5, laplace(0.2), "withheld"),  # charged
    ]
    points = spend_series(entries, composition=composition, epsilon=10.0, delta=1e-6)  # type: ignore[arg-type]
    assert [p.query_epsilon for p in points] == [0.1, 0.5, 0.2]
    assert [p.outcome for p in points] == ["answered", "answered", "withheld"]
    report = accountant(composition).report  # type: ignore[arg-type]
    expected = report(10.0, 1e-6, PrivacyCost(0.8, 0.0, (0.01 + 0.25 + 0.04) / 2, 0.0))
    assert points[-1].epsilon_spent == pytest.approx(expected.epsilon_spent)
    assert [p.epsilon_spent for p in points] == sorted(p.epsilon_spent for p in points)
    if composition == "pure":
        assert [p.epsilon_spent for p in points] == pytest.approx([0.1, 0.6, 0.8])


def test_the_spend_chart_draws_one_point_per_charge_and_the_budget() -> None:
    points = spend_series(
        [entry(i, laplace(0.1), "answered") for i in range(4)],
        composition="pure",
        epsilon=1.0,
        delta=0.0,
    )
    spec = spend_chart("alice", points, epsilon_budget=1.0, width=400)
    svg = render(spec)
    assert "mark-line" in svg and "mark-rule role-mark" in svg
    assert spec["data"]["values"][-1]["epsilon_spent"] == pytest.approx(0.4)
    assert spec["layer"][1]["data"]["values"] == [{"budget": 1.0}]
