"""Nested aggregation through the real app: ``SELECT d, SUM(n) FROM (<aggregate query>) AS
t GROUP BY d`` — what Superset sends for a chart over a virtual dataset.

The inner query is answered, charged, audited and cached as if sent alone; the outer
query is post-processing of its release (gateway/pipeline/post_query.py), run in a locked DuckDB
that holds only the noisy rows (gateway/sql/released_table.py). Pinned here: the charge is
the inner query's alone; the outer result is a function of the inner release (the very
rows the inner query returns, cached); refusals are free; a runtime failure of the outer
query leaves the inner charged and cached; the auditor cannot be bypassed by wrapping a
refused query; the sandbox cannot read files even if the allow-list let something by;
the reported accuracy of a sum of k noisy values covers at least 95%.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from gateway.pipeline.gateway import Gateway
from gateway.sql.released_table import OuterQueryFailed, evaluate
from mechanisms import sample
from mechanisms.accuracy import accuracy, sum_accuracy
from mechanisms.types import Noise

Ask = Callable[..., tuple[int, dict[str, Any]]]

INNER = "SELECT department, year, COUNT(*) AS n FROM visits GROUP BY department, year"
SUPERSET_CHART = (
    f'SELECT department AS department, SUM(n) AS "SUM(n)" FROM ({INNER}) AS virtual_table '
    'GROUP BY department ORDER BY "SUM(n)" DESC LIMIT 10000'
)


def _spent(client: Any, auth: dict[str, str]) -> float:
    return float(client.get("/v1/budget", headers=auth).get_json()["budget"]["rho_spent"])


def test_a_superset_chart_over_a_virtual_dataset_costs_the_inner_query_only(
    ask: Ask, client: Any, auth: dict[str, str]
) -> None:
    status, chart = ask(SUPERSET_CHART, epsilon=0.5)
    assert status == 200, chart
    assert [c["name"] for c in chart["columns"]] == ["department", "SUM(n)"]
    assert chart["charge"]["epsilon"] == 0.5 and chart["privacy"]["epsilon"] == 0.5
    assert chart["post_processing"]["inner_sql"] == INNER
    spent = _spent(client, auth)
    # The inner query alone is now a cache hit: the same release, free.
    status, inner = ask(INNER, epsilon=0.5)
    assert status == 200 and inner["cached"] is True
    assert _spent(client, auth) == spent
    # The chart is exactly the post-processing of those rows.
    totals: dict[str, int] = defaultdict(int)
    for department, _, n in inner["rows"]:
        totals[department] += n
    expected = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    assert [tuple(r) for r in chart["rows"]] == expected


def test_different_outer_queries_over_one_inner_query_share_its_charge(
    ask: Ask, client: Any, auth: dict[str, str]
) -> None:
    assert ask(SUPERSET_CHART, epsilon=0.5)[0] == 200
    spent = _spent(client, auth)
    others = [
        f"SELECT year, SUM(n), AVG(n), MIN(n), MAX(n), COUNT(*) FROM ({INNER}) AS t "
        "WHERE department IN ('Cardiology', 'Oncology') GROUP BY year ORDER BY year",
        f"SELECT CASE WHEN year < 2022 THEN 'before' ELSE 'since' END AS era, SUM(n) AS total "
        f"FROM ({INNER}) AS t GROUP BY 1 HAVING SUM(n) > 0 ORDER BY total DESC",
        f"SELECT * FROM ({INNER}) AS t WHERE n > 100 ORDER BY n DESC LIMIT 5",
        f"SELECT DISTINCT department FROM ({INNER}) AS virtual_table LIMIT 100",
    ]
    for sql in others:
        status, body = ask(sql, epsilon=0.5)
        assert status == 200, body
        assert body["cached"] is True and "charge" not in body
    assert _spent(client, auth) == spent
    # A different ε is a different inner release, charged once.
    status, body = ask(others[0], epsilon=0.25)
    assert status == 200 and body["charge"]["epsilon"] == 0.25


def test_outer_accuracy_is_the_sum_of_independent_noises(ask: Ask) -> None:
    status, body = ask(
        f"SELECT department, SUM(n) AS total, AVG(n) AS mean, MAX(n) AS top, COUNT(*) AS k "
        f"FROM ({INNER}) AS t GROUP BY department",
        epsilon=0.5,
    )
    assert status == 200, body
    status, inner = ask(INNER, epsilon=0.5)
    one = inner["accuracy"]["n"]["stddev"]
    years = 7  # the declared domain of visits.year: 2019..2025, every one released
    total, mean = body["accuracy"]["total"], body["accuracy"]["mean"]
    for i, row in enumerate(body["rows"]):
        assert row[4] == years
        assert math.isclose(total["stddev_per_row"][i], math.sqrt(years) * one)
        assert math.isclose(mean["stddev_per_row"][i], math.sqrt(years) * one / years)
        low, high = total["ci95_intervals"][i]
        assert low < row[1] < high
    assert body["accuracy"]["top"] is None  # MAX of noisy values: unknown, not guessed
    assert body["accuracy"]["k"] == {"stddev": 0.0, "ci95_halfwidth": 0.0}  # public rows
    assert "department" not in body["accuracy"]


def test_rows_chosen_by_noisy_values_have_unknown_accuracy(ask: Ask) -> None:
    status, body = ask(
        f"SELECT department, SUM(n) AS big FROM ({INNER}) AS t WHERE n > 100 GROUP BY department",
        epsilon=0.5,
    )
    assert status == 200
    assert body["accuracy"] == {"big": None}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM (SELECT * FROM patients) AS t",
        f"SELECT SUM(n) FROM ({INNER}) AS t JOIN patients ON TRUE",
        f"SELECT SUM(n) FROM ({INNER}) AS t WHERE n > (SELECT COUNT(*) FROM patients)",
        f"SELECT SUM(p.age) FROM ({INNER}) AS t",
        f"SELECT SUM(age) FROM ({INNER}) AS t",
        f"SELECT SUM(n) FROM (SELECT year, SUM(n) AS n FROM ({INNER}) AS a GROUP BY year) AS b",
        f"SELECT read_csv('/etc/passwd') FROM ({INNER}) AS t",
    ],
)
def test_refused_nested_queries_cost_nothing(
    ask: Ask, client: Any, auth: dict[str, str], sql: str
) -> None:
    before = _spent(client, auth)
    status, body = ask(sql, epsilon=0.5)
    assert status == 400, body
    assert body["error"]["code"] in ("unsupported_query", "unknown_column")
    assert _spent(client, auth) == before


def test_an_outer_query_failing_on_the_released_rows_leaves_the_inner_charged_and_cached(
    ask: Ask, client: Any, auth: dict[str, str]
) -> None:
    # Types check on the empty table; the cast fails only on the released values.
    sql = f"SELECT SUM(CAST(department AS INTEGER)) FROM ({INNER}) AS t"
    status, body = ask(sql, epsilon=0.5)
    assert status == 400 and body["error"]["detail"]["construct"] == "outer query"
    assert "costs nothing" in body["error"]["message"]
    spent = _spent(client, auth)
    assert spent > 0
    status, inner = ask(INNER, epsilon=0.5)
    assert status == 200 and inner["cached"] is True
    assert _spent(client, auth) == spent


def test_a_dry_run_shows_the_outer_columns_and_the_inner_cost(
    ask: Ask, client: Any, auth: dict[str, str]
) -> None:
    status, body = ask(SUPERSET_CHART, epsilon=0.5, dry_run=True)
    assert status == 200, body
    assert body["rows"] == [] and [c["name"] for c in body["columns"]] == ["department", "SUM(n)"]
    assert body["plan"]["canonical_sql"] == INNER
    assert "n" in body["post_processing"]["inner_accuracy"]
    assert _spent(client, auth) == 0


def test_identical_nested_queries_get_identical_answers(ask: Ask) -> None:
    sql = f"SELECT year, SUM(n) AS total FROM ({INNER}) AS t GROUP BY year LIMIT 3"
    first = ask(sql, epsilon=0.5)[1]
    again = ask(sql, epsilon=0.5)[1]
    assert first["rows"] == again["rows"] and again["cached"] is True
    assert first["accuracy"] == again["accuracy"]


# --- the auditor sees the inner query: wrapping a refused query changes nothing -----------


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(audit={"mode": "refuse", "min_group_size": 40})


def test_wrapping_a_differencing_query_does_not_get_it_past_the_auditor(
    ask: Ask, client: Any, auth: dict[str, str]
) -> None:
    status, first = ask(
        "SELECT sex, COUNT(*) AS n FROM patients WHERE disease = 'Crohn' GROUP BY sex",
        epsilon=1.0,
    )
    assert status == 200
    spent = _spent(client, auth)
    inner = (
        "SELECT sex, COUNT(*) AS n FROM patients WHERE disease = 'Crohn' AND city <> 'Eger' "
        "GROUP BY sex"
    )
    attack = f"SELECT SUM(n) AS everyone_but_one FROM ({inner}) AS t"
    status, body = ask(attack, epsilon=1.0)
    assert status == 403 and body["error"]["code"] == "audit_refused", body
    assert body["error"]["detail"]["combined_with"] == [first["query_id"]]
    # the same refusal as the inner query sent alone, and free like it
    status, alone = ask(inner, epsilon=1.0)
    assert status == 403 and alone["error"]["code"] == "audit_refused"
    assert _spent(client, auth) == spent


# --- the sandbox: only the released rows, even if the allow-list let something by --------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/hostname')",
        "SELECT * FROM read_text('/etc/hostname')",
        "ATTACH '/tmp/dpgate-nested-probe.db' AS other",
        "SET enable_external_access = true",
        "INSTALL httpfs",
        # Python objects are not tables by their names (replacement scans are off), and
        # the registered rows are gone once copied in
        "SELECT * FROM rows",
        "SELECT * FROM source",
        "SELECT * FROM dpgate_released_rows",
    ],
)
def test_the_released_table_engine_reads_no_files_and_stays_locked(sql: str) -> None:
    with pytest.raises(OuterQueryFailed):
        evaluate(sql, [("n", "integer")], [(1,)])


def test_evaluations_do_not_see_each_other() -> None:
    columns, rows = evaluate("SELECT SUM(n) FROM released", [("n", "integer")], [(1,), (2,)])
    assert rows == [(3,)] and columns == (("sum(n)", "integer"),)
    _, rows = evaluate("SELECT COUNT(*) FROM released", [("n", "integer")], [])
    assert rows == [(0,)]


def test_concurrent_evaluations_keep_their_own_rows() -> None:
    from concurrent.futures import ThreadPoolExecutor

    def total(i: int) -> Any:
        rows = [(i,)] * (50 + i)
        return evaluate("SELECT SUM(n) FROM released", [("n", "integer")], rows)[1][0][0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(total, range(64)))
    assert results == [i * (50 + i) for i in range(64)]


def test_a_time_grain_over_a_date_key_runs_as_superset_writes_it() -> None:
    """Superset's month grain over a date group key (PostgreSQL spelling, transpiled the
    way ``gateway.sql.analyze.nested`` does): dates in, ISO dates out."""
    import datetime

    import sqlglot

    sql = sqlglot.parse_one(
        "SELECT DATE_TRUNC('month', d) AS m, SUM(n) AS s FROM released GROUP BY 1 ORDER BY 1",
        read="postgres",
    ).sql(dialect="duckdb")
    rows = [("2024-01-05", 3), (datetime.date(2024, 1, 20), 4), ("2024-02-01", 5)]
    columns, out = evaluate(sql, [("d", "date"), ("n", "integer")], rows)
    assert columns == (("m", "date"), ("s", "integer"))
    assert out == [("2024-01-01", 7), ("2024-02-01", 5)]


# --- accuracy of a sum of k noises: at least 95% coverage ---------------------------------


@pytest.mark.parametrize(
    "noise",
    [
        Noise("laplace", Fraction(4)),
        Noise("gaussian", Fraction(3), sigma2=Fraction(9)),
        # too wide for the exact convolution: the union and Chernoff bounds
        Noise("laplace", Fraction(20_000)),
        Noise("gaussian", Fraction(60_000), sigma2=Fraction(60_000**2)),
    ],
    ids=["laplace", "gaussian", "laplace-bounds", "gaussian-bounds"],
)
@pytest.mark.parametrize("k", [2, 7])
def test_the_sum_half_width_covers_at_least_95_percent(noise: Noise, k: int) -> None:
    """The exact convolution where the support is small, the bounds where it is not.
    20 000 sums of k fresh draws each: if the true coverage were below 95%, more than
    1 000 would fall outside on average; the test fails above 1 147 (the binomial
    (20 000, 0.05) upper tail beyond 1 147 is below 1e-6, so a valid half-width fails
    this test with probability below 1e-6)."""
    trials = 20_000
    acc = sum_accuracy(noise, k)
    draws = sample(noise, trials * k)
    outside = sum(
        1 for t in range(trials) if abs(sum(draws[t * k : (t + 1) * k])) > acc.ci95_halfwidth
    )
    assert outside <= 1_147
    assert math.isclose(acc.stddev, math.sqrt(k) * accuracy(noise).stddev)
    assert sum_accuracy(noise, 1) == accuracy(noise)


def test_the_sum_half_width_is_exact_where_the_support_is_small() -> None:
    """Where the convolution is computed the half-width is the exact 95% point, close to
    the normal one for many terms — not a loose bound (the bounds alone are ≥ 1.38×)."""
    for noise in (Noise("laplace", Fraction(10)), Noise("gaussian", Fraction(10), Fraction(100))):
        acc = sum_accuracy(noise, 50)
        assert acc.ci95_halfwidth <= 1.02 * 1.96 * acc.stddev


def test_a_nested_answer_matches_the_documented_release_schema(
    ask: Ask, client: Any, auth: dict[str, str]
) -> None:
    from tests.test_openapi import validator

    spec = client.get("/openapi.json").get_json()
    schema = spec["paths"]["/v1/query"]["post"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ]
    status, body = ask(
        f"SELECT department, SUM(n) AS total, MAX(n) AS top FROM ({INNER}) AS t "
        "GROUP BY department",
        epsilon=0.5,
    )
    assert status == 200 and body["accuracy"]["top"] is None
    assert [str(e) for e in validator(spec, schema).iter_errors(body)] == []
    assert "post_processing" in spec["components"]["schemas"]["Release"]["properties"]
