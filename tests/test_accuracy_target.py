"""Cost and accuracy before spending (issue 15), over HTTP on the demo data.

- ``"accuracy": {"ci95_halfwidth": X}`` instead of ``epsilon``: the released interval of
  every COUNT and SUM is at most X, with the smallest ε that does it (a slightly smaller
  ε would not), or the query is refused and the answer says what it would cost.
- A dry run says what one query would add to the budget (in its own units), how many
  such queries remain, and the expected ±95% interval of each measure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gateway.pipeline.accuracy_target import smallest_epsilon

Ask = Callable[..., tuple[int, dict[str, Any]]]


def halfwidths(body: dict[str, Any]) -> dict[str, float]:
    return {name: acc["ci95_halfwidth"] for name, acc in body["accuracy"].items()}


@pytest.mark.parametrize(
    ("sql", "target", "mechanism"),
    [
        ("SELECT COUNT(*) AS n FROM patients", 10.0, "laplace"),
        ("SELECT COUNT(*) AS n FROM patients", 3.0, "laplace"),
        ("SELECT sex, COUNT(*) AS n, SUM(age) AS s FROM patients GROUP BY sex", 1500.0, "laplace"),
        ("SELECT SUM(glucose) AS g FROM patients WHERE age > 30", 100.0, "laplace"),
        ("SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease", 12.0, "gaussian"),
    ],
)
def test_the_released_interval_is_at_most_the_interval_asked_for(
    ask: Ask, sql: str, target: float, mechanism: str
) -> None:
    status, body = ask(sql, accuracy={"ci95_halfwidth": target}, mechanism=mechanism)
    assert status == 200, body
    widths = halfwidths(body)
    assert widths and all(w <= target for w in widths.values()), widths
    chosen = body["accuracy_target"]["epsilon"]
    assert body["accuracy_target"]["ci95_halfwidth"] == target
    assert body["privacy"]["epsilon"] == chosen
    # the smallest such ε: a little less and some interval would be wider than asked
    status, less = ask(sql, epsilon=chosen * (1 - 1e-3), mechanism=mechanism, dry_run=True)
    assert status == 200
    assert max(halfwidths(less).values()) > target
    # the same request again is the same answer, free
    status, again = ask(sql, accuracy={"ci95_halfwidth": target}, mechanism=mechanism)
    assert status == 200 and again["cached"] and again["rows"] == body["rows"]


def test_an_unreachable_accuracy_is_refused_with_its_cost(ask: Ask) -> None:
    sql = "SELECT SUM(income) AS s FROM patients"  # income in [0, 200000]
    status, body = ask(sql, accuracy={"ci95_halfwidth": 20000})
    assert status == 400 and body["error"]["code"] == "invalid_privacy_parameters"
    detail = body["error"]["detail"]
    assert detail["max_epsilon_per_query"] == 1.0
    assert detail["epsilon_needed"] > 1.0
    assert f"it would need ε = {detail['epsilon_needed']:.4g}" in body["error"]["message"]
    status, body = ask(sql, accuracy={"ci95_halfwidth": 50})
    assert status == 400 and body["error"]["detail"]["epsilon_needed"] is None
    assert "not even ε = 100" in body["error"]["message"]
    status, budget = ask("SELECT COUNT(*) FROM patients", dry_run=True)
    assert budget["budget"]["queries"] == 0  # nothing was charged


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"accuracy": {"ci95_halfwidth": 5}, "epsilon": 0.5}, "not both"),
        ({"accuracy": {"ci95_halfwidth": -1}}, "> 0"),
        ({"accuracy": {"ci95_halfwidth": "ten"}}, "must be a number"),
        ({"accuracy": {"stddev": 3}}, "ci95_halfwidth"),
        ({"accuracy": 5}, "ci95_halfwidth"),
    ],
)
def test_malformed_accuracy_targets_are_refused(
    ask: Ask, params: dict[str, Any], words: str
) -> None:
    status, body = ask("SELECT COUNT(*) FROM patients", **params)
    assert status == 400 and body["error"]["code"] == "invalid_privacy_parameters"
    assert words in body["error"]["message"]


def test_an_accuracy_target_cannot_promise_an_average(ask: Ask) -> None:
    status, body = ask("SELECT AVG(age) AS a FROM patients", accuracy={"ci95_halfwidth": 1})
    assert status == 400 and "AVG" in body["error"]["message"]


def test_a_dry_run_says_what_one_query_costs_and_how_many_remain(ask: Ask) -> None:
    sql = "SELECT sex, COUNT(*) AS n, SUM(age) AS s FROM patients GROUP BY sex"
    status, dry = ask(sql, epsilon=0.5, dry_run=True)
    assert status == 200 and dry["dry_run"] and dry["would_fit"]
    # alice's budget is ε 10: basic composition fits twenty queries of ε 0.5
    assert dry["charge"] == {"epsilon": 0.5, "delta": 0.0}
    assert dry["queries_remaining"] == 20
    assert set(halfwidths(dry)) == {"n", "s"} and all(w > 0 for w in halfwidths(dry).values())
    status, real = ask(sql, epsilon=0.5)
    assert status == 200
    assert halfwidths(real) == halfwidths(dry)  # the interval announced is the one released
    assert real["charge"] == dry["charge"]
    assert real["budget"]["epsilon_spent"] == pytest.approx(0.5)
    status, after = ask(sql, epsilon=0.5, dry_run=True)
    assert after["queries_remaining"] == 19
    # the same with an accuracy target: the ε chosen, its charge and what it leaves
    status, target = ask(sql, accuracy={"ci95_halfwidth": 1500.0}, dry_run=True)
    assert status == 200
    chosen = target["accuracy_target"]["epsilon"]
    assert target["charge"]["epsilon"] == pytest.approx(chosen)
    assert target["queries_remaining"] == int((10 - 0.5) / chosen + 1e-9)


def test_partition_selection_with_an_accuracy_target(ask: Ask) -> None:
    status, body = ask(
        "SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip", accuracy={"ci95_halfwidth": 20}
    )
    assert status == 200, body
    assert all(w <= 20 for w in halfwidths(body).values())
    assert body["partition_selection"]["threshold"] > 1
    assert body["charge"]["delta"] == body["privacy"]["selection_delta"] > 0


def test_smallest_epsilon_is_a_checked_bisection() -> None:
    # a step function of ε: the half-width is 100/ε rounded up to whole units
    def widths(eps: float) -> dict[str, float]:
        return {"n": float(-(-100 // eps))}

    eps = smallest_epsilon(widths, 7.0, 0.01, 100.0)
    assert eps is not None and widths(eps)["n"] <= 7.0
    assert widths(eps * (1 - 1e-4))["n"] > 7.0
    assert smallest_epsilon(widths, 0.5, 0.01, 100.0) is None
    assert smallest_epsilon(widths, 1e6, 0.01, 100.0) == 0.01
    assert smallest_epsilon(lambda e: None, 1.0, 0.01, 100.0) is None


def test_the_chosen_epsilon_depends_on_public_facts_only(
    make_gateway: Callable[..., Any],
) -> None:
    """The attack: ask for an accuracy and read the ε (and the cost, the refusal) it was
    given, hoping it moved with the data. On two neighbouring databases — one patient's
    rows removed from the second — every target gets the same ε, the same charge and
    the same refusal: they are computed from the plan and the config, never from rows."""
    import sqlite3

    from gateway.core.errors import GatewayError
    from gateway.core.plan import QueryRequest

    full, neighbour = make_gateway(), make_gateway()
    db = neighbour.config.database.url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        (pid,) = conn.execute("SELECT patient_id FROM patients LIMIT 1").fetchone()
        for table in ("visits", "patients"):
            conn.execute(f"DELETE FROM {table} WHERE patient_id = ?", (pid,))
    seen = []
    for gw in (full, neighbour):
        gw.ledger.create_analyst("mallory", 100.0, 1e-6)
        outcomes = []
        for sql, target in [
            ("SELECT COUNT(*) AS n FROM patients", 5.0),
            ("SELECT sex, SUM(age) AS s FROM patients GROUP BY sex", 800.0),
            ("SELECT COUNT(*) AS n FROM patients WHERE age > 60", 0.01),  # unreachable
        ]:
            request = QueryRequest(sql, 1.0, 1e-6, "laplace", accuracy=target)
            try:
                release = gw.query("mallory", request)
                outcomes.append((release.privacy.epsilon, release.privacy.rho))
            except GatewayError as e:
                outcomes.append((e.code, e.detail.get("epsilon_needed")))
        seen.append(outcomes)
    # the targets, not the placeholder ε = 1, set the cost; the last one is out of reach
    assert seen[0][0][0] != 1.0 and seen[0][2][0] == "invalid_privacy_parameters", seen[0]
    assert seen[0] == seen[1]
