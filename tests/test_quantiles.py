"""Quantiles (PERCENTILE_CONT, MEDIAN, MIN, MAX) and spread (VARIANCE, STDDEV), end to end.

The attack on a quantile is written first: on two neighbouring databases the status, the
charge and the shape of the answer are the same; only the DP output (the chosen bucket)
may differ. Statistical tests of the selection itself are in
tests/statistical/test_selection_dp.py.
"""

from __future__ import annotations

import math
import sqlite3
import statistics
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from gateway.core.errors import AuditRefused
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.pipeline.gateway import Gateway
from gateway.pipeline.quantiles import spread_interval, spread_value
from gateway.sql.analyze import analyze
from gateway.sql.analyze.quantiles import MAX_BUCKETS, quantile_grid
from mechanisms import (
    calibrate_with_choices,
    fine_rank_halfwidth,
    quantile_sensitivity,
    quantile_utilities,
    scored_positions,
)
from mechanisms.histogram_quantile import level_runs


def _ages(gw: Gateway, where: str = "1 = 1") -> list[int]:
    db = gw.config.database.url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        rows = conn.execute(f"SELECT age FROM patients WHERE age IS NOT NULL AND {where}")
        return sorted(min(max(int(a), 0), 100) for (a,) in rows)


def test_a_median_over_http_is_within_the_bounds_with_its_rank_interval(
    ask: Callable[..., Any],
) -> None:
    status, body = ask("SELECT MEDIAN(age) AS m FROM patients", epsilon=1.0)
    assert status == 200, body
    ((m,),) = body["rows"]
    assert 0 <= m <= 100
    accuracy = body["accuracy"]["m"]
    assert accuracy["quantile"] == 0.5
    assert accuracy["buckets"] == 101  # one bucket per declared age
    # levels of Δ = 1/2 ranks (one row per patient, p = 1/2) up to ln(20·101)/ln(e^(ε/2))
    # past the best bucket's (at most ⌈½/Δ⌉ = 1), and half a rank more for the
    # neighbours of an empty bucket (scored at its gap's middle)
    level = math.ceil(math.log(20 * 101) / 0.5) + 1
    half = math.ceil(level / 2 + 0.5)
    assert accuracy["rank_ci95_halfwidth"] in (half, half + 1)
    assert accuracy["rank_ci95_halfwidth"] == fine_rank_halfwidth(Fraction(1), Fraction(1, 2), 101)
    assert body["privacy"]["epsilon"] == 1.0


def test_a_released_median_is_close_in_rank_to_the_true_one(make_gateway: Any) -> None:
    """At ε = 10 a bucket whose score G (the rank distance from the target to its
    positions, or to its gap's middle when empty: ``scored_positions``) exceeds 2 has
    level ⌈G/Δ⌉ ≥ 5 (Δ = ½), the best one at most 1, so it is chosen with probability at
    most 101·exp(−(10/2)·(5 − 1)) ≈ 2e-7, below the false-alarm rate 1e-6."""
    gw = make_gateway(privacy={"max_epsilon_per_query": 10.0})
    gw.ledger.create_analyst("ann", 100.0, 1e-6)
    ages = _ages(gw)
    release = gw.query("ann", QueryRequest("SELECT MEDIAN(age) FROM patients", 10.0, 0, "laplace"))
    ((m,),) = release.rows
    assert release.columns[0].name == "MEDIAN(age)"  # as written, not PERCENTILE_CONT(…)
    t = (len(ages) - 1) / 2
    below, at_most = sum(a < m for a in ages), sum(a <= m for a in ages)
    lo2, hi2 = scored_positions(below, at_most)  # in half ranks
    assert lo2 / 2 - 2 <= t <= hi2 / 2 + 2, (m, below, at_most, t)


def test_quantiles_per_group_public_and_selected(ask: Callable[..., Any]) -> None:
    status, body = ask(
        "SELECT sex, MIN(age) AS youngest, MAX(age) AS oldest, "
        "PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY glucose) AS p90 FROM patients GROUP BY sex",
        epsilon=1.0,
    )
    assert status == 200, body
    assert [r[0] for r in body["rows"]][:2] == ["F", "M"]
    for _, youngest, oldest, p90 in body["rows"]:
        assert isinstance(youngest, int) and isinstance(oldest, int)
        assert 0 <= youngest <= 100 and 0 <= oldest <= 100 and 2.0 <= p90 <= 20.0


def test_quantiles_of_groups_released_by_partition_selection(
    make_gateway: Callable[..., Gateway],
) -> None:
    """zip is not declared public: groups go through DP partition selection (δ > 0), and
    each released group's median is chosen like any other. At ε = 10 the threshold is a
    few people, and the test data has zips of 13 to 16 patients."""
    gw = make_gateway(privacy={"max_epsilon_per_query": 10.0})
    gw.ledger.create_analyst("ann", 100.0, 1e-6)
    sql = "SELECT zip, MEDIAN(glucose) AS g, COUNT(*) AS n FROM patients GROUP BY zip"
    release = gw.query("ann", QueryRequest(sql, 10.0, 1e-7, "laplace"))
    assert release.rows and all(2.0 <= g <= 20.0 for _, g, _ in release.rows)
    assert release.privacy.selection_delta > 0
    assert release.accuracy["g"]["rank_ci95_halfwidth"] > 0


def test_a_quantile_shares_the_query_epsilon_with_the_other_measures(gateway: Gateway) -> None:
    plan = analyze("SELECT COUNT(*), MEDIAN(age), AVG(age) FROM patients", gateway.config.tables)
    assert isinstance(plan, QueryPlan)
    calibration = gateway.planner.calibrate(plan, QueryRequest("x", 1.2, 0.0, "laplace"))
    # four parts: COUNT(*), the median, AVG's sum and count
    (share,) = calibration.choices
    assert share == pytest.approx(Fraction(1.2) / 4, rel=1e-12) and share >= Fraction(1.2) / 4
    assert float(calibration.noises[0].scale) == pytest.approx(4 / 1.2)
    assert calibration.cost.epsilon == 1.2 and calibration.cost.rho == pytest.approx(0.72)
    noised = [m.sensitivity for m in plan.measures if m.noised]
    gauss = calibrate_with_choices("gaussian", 1.0, 1e-6, noised, 1)
    assert gauss.cost.epsilon == 1.0 and gauss.cost.rho > float(gauss.choices[0]) ** 2 / 2


def test_the_observables_of_a_quantile_do_not_depend_on_the_data(
    make_gateway: Callable[..., Gateway],
) -> None:
    """The attack, over HTTP: remove the oldest patient (the one MAX is about) and compare
    what an analyst sees besides the chosen values — status, error code, charge, budget
    left, the number of rows of public groups, the columns, the accuracy. It is all the
    same; the values themselves are DP outputs."""
    from gateway.http.app import create_app

    full, neighbour = make_gateway(), make_gateway()
    db = neighbour.config.database.url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        (pid,) = conn.execute(
            "SELECT patient_id FROM patients ORDER BY age DESC LIMIT 1"
        ).fetchone()
        for table in ("visits", "patients"):
            conn.execute(f"DELETE FROM {table} WHERE patient_id = ?", (pid,))
    queries = [
        {"sql": "SELECT MAX(age) AS m FROM patients", "epsilon": 0.5},
        {"sql": "SELECT sex, MEDIAN(age), STDDEV(glucose) FROM patients GROUP BY sex"},
        {"sql": "SELECT MIN(income) FROM patients WHERE age > 200"},  # nobody: still answered
        {"sql": "SELECT MEDIAN(income) FROM patients", "epsilon": -1.0},  # refused, free
        {"sql": "SELECT MAX(zip) FROM patients"},  # refused, free
        {"sql": "SELECT MAX(age) AS m FROM patients", "epsilon": 0.5},  # cached, free
    ]
    seen = []
    for gw in (full, neighbour):
        key = gw.ledger.create_analyst("mallory", 100.0, 1e-6)
        client = create_app(gw.config, gateway=gw).test_client()
        outcomes: list[Any] = []
        for body in queries:
            resp = client.post("/v1/query", json=body, headers={"Authorization": f"Bearer {key}"})
            answer = resp.get_json()
            if answer["ok"]:
                outcomes.append(
                    (
                        resp.status_code,
                        answer["cached"],
                        answer["columns"],
                        len(answer["rows"]),
                        {  # all but the per-row intervals (DP outputs)
                            name: {k: v for k, v in acc.items() if k != "ci95_intervals"}
                            for name, acc in answer["accuracy"].items()
                        },
                        answer.get("charge"),
                        answer["budget"]["epsilon_spent"],
                    )
                )
            else:
                outcomes.append((resp.status_code, answer["error"]["code"]))
        seen.append(outcomes)
    assert seen[0] == seen[1]
    assert seen[0][3] == (400, "invalid_privacy_parameters")
    assert seen[0][4] == (400, "unsupported_query")
    assert seen[0][5][1] is True  # the repeated MAX is the cached answer


def test_the_auditor_treats_a_quantile_region_like_a_sum_region(
    make_gateway: Callable[..., Gateway],
) -> None:
    """A quantile releases no count, so the auditor knows its region but not its size
    (like a SUM): a differencing pair that pins down one person's region is refused."""
    gw = make_gateway()
    gw.ledger.create_analyst("eve", 100.0, 1e-6)
    target = "sex = 'F' AND age = 37 AND city = 'Eger'"
    gw.query("eve", QueryRequest("SELECT MAX(income) FROM patients", 1.0, 0.0, "laplace"))
    with pytest.raises(AuditRefused):
        gw.query(
            "eve",
            QueryRequest(
                f"SELECT MAX(income) FROM patients WHERE NOT ({target})", 1.0, 0.0, "laplace"
            ),
        )


def test_variance_and_stddev_intervals_contain_the_exact_value(gateway: Gateway) -> None:
    """With every noise at 0 the interval must hold the exact statistic of the bounded
    values (and the released value is that statistic)."""
    ages = _ages(gateway)
    sql = "SELECT VAR_POP(age), VAR_SAMP(age), STDDEV_POP(age), STDDEV(age) FROM patients"
    plan = analyze(sql, gateway.config.tables)
    assert isinstance(plan, QueryPlan)
    calibration = gateway.planner.calibrate(plan, QueryRequest(sql, 1.0, 0.0, "laplace"))
    exact = {"sum": sum(ages), "sum_squares": sum(a * a for a in ages), "count_values": len(ages)}
    noisy = [exact[m.kind] for m in plan.measures]
    expected = [
        statistics.pvariance(ages),
        statistics.variance(ages),
        statistics.pstdev(ages),
        statistics.stdev(ages),
    ]
    for o, want in zip(plan.outputs, expected, strict=True):
        assert spread_value(o, plan, noisy) == pytest.approx(want)
        lo, hi = spread_interval(o, plan, calibration.noises, noisy) or (None, None)
        assert lo is not None and hi is not None and lo <= want <= hi, (o.kind, lo, want, hi)
    # with a count of 0 or 1 there is nothing to release
    few = [0, 0, 1]
    assert spread_value(plan.outputs[1], plan, few) is None


def test_stddev_over_http(ask: Callable[..., Any]) -> None:
    status, body = ask("SELECT sex, STDDEV(age) AS s FROM patients GROUP BY sex", epsilon=1.0)
    assert status == 200, body
    for row, interval in zip(body["rows"], body["accuracy"]["s"]["ci95_intervals"], strict=True):
        assert row[1] is None or 0 <= row[1] <= 100
        assert interval is None or 0 <= interval[0] <= interval[1]
    assert set(body["accuracy"]["s"]) >= {"sum", "sum_squares", "count", "method"}


def test_the_grid_is_public_and_bounded() -> None:
    """Up to MAX_BUCKETS buckets of a power-of-two width from the lower bound, covering
    the declared range; every released value lies inside the bounds (issue 38)."""
    grid = quantile_grid("real", 2.0, 20.0, Fraction(1, 2), 1)
    assert grid.buckets <= MAX_BUCKETS and grid.buckets > MAX_BUCKETS // 2
    assert grid.width.numerator == 1 and grid.width.denominator & (grid.width.denominator - 1) == 0
    assert 2 + (grid.buckets - 1) * grid.width < 20 <= 2 + grid.buckets * grid.width
    assert 2 < grid.value(0) < grid.value(1) and grid.value(grid.buckets - 1) < 20
    wide = quantile_grid("integer", 0, 4_000_000, Fraction(1), 3)
    assert (wide.width, wide.buckets) == (4, 1_000_000) and not wide.integral
    assert wide.value(wide.buckets - 1) == Fraction(3_999_998)  # the middle of its bucket
    income = quantile_grid("integer", 0, 500_000, Fraction(1, 2), 1)
    assert income.integral and income.buckets == 500_001  # one bucket per value
    ages = quantile_grid("integer", 0, 100, Fraction(0), 1)
    assert ages.integral and [ages.value(j) for j in range(ages.buckets)] == list(range(101))


def test_quantile_utilities_score_the_bucket_holding_the_target_rank() -> None:
    # values 0, 0, 1, 3 on buckets {0}, {1}, {2}, {3}: the median position 1.5 lies
    # between the buckets of positions 1 and 2, half a rank from each; the empty bucket
    # {2} lies in the gap between positions 2 and 3, scored at its middle 2.5
    below = [2, 3, 3]  # values < 1, < 2, < 3
    u = quantile_utilities(below, 4, Fraction(1, 2))
    assert u == [Fraction(-1, 2), Fraction(-1, 2), -1, Fraction(-3, 2)]
    # values 0, 1, 3: the median position 1 is in bucket {1}; the empty bucket {2} lies
    # in the gap whose middle is 1.5
    assert quantile_utilities([1, 2, 2], 3, Fraction(1, 2)) == [-1, 0, Fraction(-1, 2), -1]
    # values 0, 2: the median 1 is the empty bucket {1}, in the gap whose middle is t
    assert quantile_utilities([1, 1], 2, Fraction(1, 2)) == [Fraction(-1, 2), 0, Fraction(-1, 2)]
    # MIN (p = 0) picks the bucket of the smallest value, MAX the largest one's
    assert quantile_utilities(below, 4, Fraction(0))[0] == 0
    assert quantile_utilities(below, 4, Fraction(1))[3] == 0


def _below(values: list[int], buckets: int) -> list[int]:
    return [sum(v <= e for v in values) for e in range(buckets - 1)]


def test_one_units_rows_move_every_utility_by_at_most_the_sensitivity() -> None:
    """The sensitivity argument of ``quantile_utilities``, checked exhaustively on small
    data: every multiset of up to 4 values on 5 buckets, one unit adding 1 to 3 rows
    anywhere (removal is the same pair read backwards), every p the tests use. Buckets go
    from empty to non-empty, so the gap score's own case is covered; each utility moves
    by at most Δ = r·max(p, 1 − p), each level by at most one, and the levels
    ``level_runs`` computes in integers are ⌈−u/Δ⌉ of these utilities."""
    import itertools

    buckets, cap = 5, 10**6
    ps = [Fraction(0), Fraction(1, 4), Fraction(1, 3), Fraction(1, 2), Fraction(1)]
    worst = Fraction(0)
    for n in range(5):
        for values in itertools.combinations_with_replacement(range(buckets), n):
            for r in (1, 2, 3):
                for added in itertools.combinations_with_replacement(range(buckets), r):
                    after = sorted([*values, *added])
                    for p in ps:
                        delta = quantile_sensitivity(p, r)
                        u0 = quantile_utilities(_below(list(values), buckets), n, p)
                        u1 = quantile_utilities(_below(after, buckets), n + r, p)
                        moves = [abs(a - b) for a, b in zip(u0, u1, strict=True)]
                        assert max(moves) <= delta, (values, added, p)
                        worst = max(worst, max(moves) / delta)
                        seen = []
                        for us, data in ((u0, values), (u1, after)):
                            counts: dict[int, int] = {}
                            for v in data:
                                counts[v] = counts.get(v, 0) + 1
                            levels = [-1] * buckets
                            for run in level_runs(counts, buckets, p, delta, cap):
                                for j in range(run.start, run.start + run.size):
                                    levels[j] = run.level
                            assert levels == [math.ceil(-u / delta) for u in us], (data, p)
                            seen.append(levels)
                        assert all(abs(a - b) <= 1 for a, b in zip(*seen, strict=True))
    assert worst == 1  # the bound is reached: Δ is not larger than it needs to be


def test_quantile_and_spread_answers_match_the_published_schema(
    client: Any, ask: Callable[..., Any]
) -> None:
    import json

    import jsonschema_rs

    spec = client.get("/openapi.json").get_json()

    def local(node: Any) -> Any:
        return json.loads(json.dumps(node).replace("#/components/schemas/", "#/$defs/"))

    schemas = spec["components"]["schemas"]
    validator = jsonschema_rs.validator_for({**local(schemas["Release"]), "$defs": local(schemas)})
    status, body = ask(
        "SELECT sex, MEDIAN(age) AS m, VAR_POP(glucose) AS v, AVG(age) AS a, COUNT(*) AS n "
        "FROM patients GROUP BY sex",
        epsilon=1.0,
    )
    assert status == 200, body
    validator.validate(body)
    assert "rank_ci95_halfwidth" in schemas["ColumnAccuracy"]["properties"]


def test_a_dry_run_of_a_quantile_shows_its_rank_interval_and_costs_nothing(
    ask: Callable[..., Any],
) -> None:
    status, body = ask(
        "SELECT MEDIAN(age) AS m, STDDEV(age) AS s FROM patients", epsilon=0.5, dry_run=True
    )
    assert status == 200, body
    assert body["accuracy"]["m"]["rank_ci95_halfwidth"] > 0
    assert set(body["accuracy"]["s"]) >= {"sum", "sum_squares", "count"}
    (choice,) = body["plan"]["choices"]
    assert choice["output"] == "m" and choice["buckets"] == 101
    assert choice["epsilon"] == pytest.approx(0.5 / 4)  # median, sum, sum of squares, count
    assert [m["kind"] for m in body["plan"]["measures"]] == ["sum", "sum_squares", "count_values"]
    assert body["budget"]["epsilon_spent"] == 0


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        (
            "SELECT department, MEDIAN(cost) AS m FROM visits GROUP BY department "
            "HAVING MEDIAN(cost) > 0 ORDER BY m DESC LIMIT 3",
            {},
        ),
        ("SELECT * FROM (SELECT MAX(age) AS oldest FROM patients) AS virtual_table", {}),
        ("SELECT MEDIAN(age) AS m, COUNT(*) AS n FROM patients", {"mechanism": "gaussian"}),
        ("SELECT MEDIAN(age) AS m FROM patients", {"mechanism": "gaussian"}),
        ("SELECT VAR_SAMP(cost) AS v FROM visits WHERE year = 2024", {"mechanism": "gaussian"}),
        (
            "SELECT MEDIAN(age) AS m, COUNT(*) AS n FROM patients",
            {"accuracy": {"ci95_halfwidth": 50}},
        ),
    ],
)
def test_quantiles_with_the_rest_of_the_language(
    ask: Callable[..., Any], sql: str, params: dict[str, Any]
) -> None:
    base = {"delta": 1e-7} if "accuracy" in params else {"epsilon": 1.0, "delta": 1e-7}
    status, body = ask(sql, **base, **params)
    assert status == 200, body
    assert body["rows"]
    assert body["privacy"]["epsilon"] > 0


def test_the_cost_model_counts_the_rows_a_quantiles_histogram_can_return(
    gateway: Gateway,
) -> None:
    """The mechanism weighs every returned (group, bucket) before the release moment, so
    the deadline must cover the most there can be — from public facts only."""
    from gateway.pipeline.cost_model import histogram_rows

    def plan_of(sql: str) -> QueryPlan:
        plan = analyze(sql, gateway.config.tables)
        assert isinstance(plan, QueryPlan)
        return plan

    assert histogram_rows(plan_of("SELECT COUNT(*) FROM patients"), 12_000) == 0
    assert histogram_rows(plan_of("SELECT MEDIAN(age) FROM patients"), 12_000) == 101
    by_sex = plan_of("SELECT sex, MEDIAN(age), MAX(age) FROM patients GROUP BY sex")
    assert histogram_rows(by_sex, 12_000) == 2 * 2 * 101
    assert histogram_rows(by_sex, 150) == 2 * 150  # never more than the rows
    by_zip = plan_of("SELECT zip, MEDIAN(age) FROM patients GROUP BY zip")  # not public
    assert histogram_rows(by_zip, 12_000) == 12_000
