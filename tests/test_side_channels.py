"""What an analyst observes besides the noisy numbers: charge, status, message, timing.

In-process tests of the rules (docs/privacy.md, "Side channels"); the attacks over HTTP
against a real `dpgate serve` are in tests/attacks/.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError
from gateway.core.config_load import parse_config
from gateway.core.errors import DatabaseUnavailable, InvalidPrivacyParameters
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.pipeline.gateway import CHARGED_FAILURE_MESSAGE, Gateway
from gateway.sql.analyze import analyze

pytestmark = pytest.mark.timing

COSTLY = "SELECT department, SUM(cost) FROM visits GROUP BY department"


def request(sql: str, epsilon: float = 0.1, **kw: Any) -> QueryRequest:
    return QueryRequest(
        sql=sql,
        epsilon=epsilon,
        delta=kw.get("delta", 0.0),
        mechanism=kw.get("mechanism", "laplace"),
    )


def timed(gw: Gateway, analyst: str, sql: str) -> tuple[float, Any]:
    started = time.monotonic()
    try:
        outcome: Any = gw.query(analyst, request(sql))
    except DatabaseUnavailable as e:
        outcome = e
    return time.monotonic() - started, outcome


def test_answers_are_held_until_the_deadline_whatever_they_cost(
    make_gateway: Callable[..., Gateway],
) -> None:
    # A deadline generous enough that the costly query finishes within it on a loaded
    # machine (it gets 80% of the deadline before it is cancelled).
    gw = make_gateway(execution={"timing": "deadline", "deadline_ms": 1000})
    gw.ledger.create_analyst("dana", 100.0, 1e-6)
    for sql in ("SELECT COUNT(*) FROM patients", COSTLY, "SELECT COUNT(*) FROM visits"):
        elapsed, outcome = timed(gw, "dana", sql)
        assert not isinstance(outcome, Exception), outcome
        assert elapsed >= 1.0, (sql, elapsed)
    # A cache hit reads no rows: it is answered at once.
    elapsed, _ = timed(gw, "dana", "SELECT COUNT(*) FROM patients")
    assert elapsed < 1.0


def test_a_per_table_deadline_overrides_the_default(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway(execution={"timing": "deadline", "deadline_ms": 50})
    tables = gw.config.tables
    assert tables["visits"].deadline_ms is None
    from gateway.pipeline.timing import deadline_ms

    assert deadline_ms(gw.config.execution, tables["patients"]) == 50
    raw = parse_config(
        {
            "database": {"url": "sqlite:///x.db"},
            "ledger": {"url": "sqlite:///l.db"},
            "execution": {"deadline_ms": 100},
            "tables": {"t": {"deadline_ms": 900, "columns": {"a": {"type": "integer"}}}},
        }
    )
    assert deadline_ms(raw.execution, raw.tables["t"]) == 900
    off = parse_config(
        {
            "database": {"url": "sqlite:///x.db"},
            "ledger": {"url": "sqlite:///l.db"},
            "execution": {"timing": "off"},
            "tables": {"t": {"deadline_ms": 900, "columns": {"a": {"type": "integer"}}}},
        }
    )
    assert deadline_ms(off.execution, off.tables["t"]) is None


def test_a_timeout_and_a_runtime_error_look_the_same_and_stay_charged(
    make_gateway: Callable[..., Gateway],
) -> None:
    """A statement cut at its deadline and one that fails in the database: same error,
    same message, both charged, both released no earlier than the deadline."""
    slow = make_gateway(execution={"timing": "deadline", "deadline_ms": 2})
    slow.ledger.create_analyst("erin", 100.0, 1e-6)
    elapsed, timeout = timed(slow, "erin", COSTLY)
    assert isinstance(timeout, DatabaseUnavailable), timeout
    assert elapsed >= 0.002

    broken = make_gateway(execution={"timing": "deadline", "deadline_ms": 200})
    broken.ledger.create_analyst("erin", 100.0, 1e-6)
    db = Path(broken.config.database.url.removeprefix("sqlite:///"))
    broken.engine.dispose()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE visits")
    elapsed, error = timed(broken, "erin", COSTLY)
    assert isinstance(error, DatabaseUnavailable), error
    assert elapsed >= 0.2

    for gw, failure in ((slow, timeout), (broken, error)):
        assert failure.to_dict() == {
            "ok": False,
            "status": 503,
            "error": {
                "code": "database_unavailable",
                "message": CHARGED_FAILURE_MESSAGE,
                "detail": {"charged": True},
            },
        }
        status = gw.ledger.budget_status("erin")
        assert status.rho_spent == pytest.approx(0.1**2 / 2)
        history = gw.ledger.history("erin")
        # the record carries its release moment (visible_at: shown from then on only)
        assert [(h.outcome, _without_moment(h.release)) for h in history] == [
            ("withheld", {"withheld": True, "failed": True})
        ]


def _without_moment(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A ledger record without its release moment (``visible_at``)."""
    return None if record is None else {k: v for k, v in record.items() if k != "visible_at"}


def test_queries_below_the_minimum_charge_are_refused_free(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway()
    gw.ledger.create_analyst("fay", 100.0, 1e-6)
    with pytest.raises(InvalidPrivacyParameters) as info:
        gw.query("fay", request("SELECT COUNT(*) FROM patients", epsilon=1e-6))
    assert info.value.detail == {"min_epsilon_per_query": 0.01}
    assert "0.01" in info.value.message
    # A Gaussian query whose ρ is below the floor (ε²/2 at the minimum ε) is refused too.
    tiny = QueryRequest("SELECT COUNT(*) FROM patients", 0.02, 1e-7, "gaussian")
    with pytest.raises(InvalidPrivacyParameters) as info:
        gw.query("fay", tiny)
    assert info.value.detail == {"min_rho_per_query": pytest.approx(0.01**2 / 2)}
    assert gw.ledger.budget_status("fay").rho_spent == 0.0
    assert gw.ledger.history("fay") == []


def config_with(column: dict[str, Any], **privacy: Any) -> dict[str, Any]:
    return {
        "database": {"url": "sqlite:///x.db"},
        "ledger": {"url": "sqlite:///l.db"},
        "privacy": privacy,
        "tables": {"t": {"columns": {"x": column}}},
    }


@pytest.mark.parametrize(
    ("column", "privacy", "problem"),
    [
        ({"type": "integer", "lower": 0, "upper": 2.5}, {}, "whole-number bound"),
        ({"type": "integer", "lower": -0.5, "upper": 2}, {}, "whole-number bound"),
        ({"type": "real", "lower": 0, "upper": 1e16}, {}, "bounds beyond"),
        ({"type": "integer"}, {"min_epsilon_per_query": 0.5}, "above the default"),
    ],
)
def test_the_config_refuses_what_would_undercharge(
    column: dict[str, Any], privacy: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config_with(column, **privacy))
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_sum_sensitivity_follows_the_rounding_the_sql_performs() -> None:
    """Clamp then ROUND (half away from zero on SQLite, half-even on PostgreSQL): one row
    moves the integer sum by up to ⌈max|bound| / resolution⌉, never less."""
    for lower, upper in ((0.0, 2.5000001), (-3.3, 1.0), (0.0, 1e12 + 0.5), (-7.0, 7.0)):
        config = parse_config(config_with({"type": "real", "lower": lower, "upper": upper}))
        plan = analyze("SELECT SUM(x) FROM t", config.tables)
        assert isinstance(plan, QueryPlan)
        m = plan.measures[0]
        steps = max(abs(Fraction(lower)), abs(Fraction(upper))) / m.resolution
        assert m.sensitivity.l1 == math.ceil(steps), (lower, upper)
    config = parse_config(config_with({"type": "integer", "lower": -4, "upper": 3}))
    plan = analyze("SELECT SUM(x) FROM t", config.tables)
    assert isinstance(plan, QueryPlan)
    assert plan.measures[0].sensitivity.l1 == 4 and plan.measures[0].resolution == 1


def test_a_query_reads_a_bounded_number_of_each_persons_rows_before_its_expressions(
    demo_db: Path,
) -> None:
    """One person's share of a statement's time is bounded: the analyst's WHERE is
    evaluated only on the rows read (at most 10 × max_rows_per_unit of a person's stored
    rows, or max_rows_read_per_unit), and the rank is tested first."""
    import sqlite3 as sq

    from gateway.sql.compile import compile_plan
    from tests.conftest import demo_config_dict

    raw = demo_config_dict(demo_db, demo_db.parent / "unused-ledger.db")
    raw["tables"]["visits"]["max_rows_read_per_unit"] = 6
    config = parse_config(raw)
    assert config.tables["visits"].rows_read_bound == 6
    assert config.tables["patients"].rows_read_bound == 10  # 10 × max_rows_per_unit (1)
    plan = analyze("SELECT COUNT(*) FROM visits WHERE cost > 100", config.tables)
    assert isinstance(plan, QueryPlan)
    sql = compile_plan(plan, config.tables["visits"], "sqlite").sql
    assert 'CASE WHEN "dp_read_rank" <= 6 THEN' in sql
    # Against the data: a person with more stored rows than the read bound contributes
    # only from the rows read (here every visit matches, so exactly min(visits, 6, 5)).
    with sq.connect(demo_db) as conn:
        expected = conn.execute(
            "SELECT SUM(MIN(n, 5)) FROM (SELECT COUNT(*) AS n FROM visits WHERE cost > -1 "
            "GROUP BY patient_id)"
        ).fetchone()[0]
        all_rows = compile_plan(
            analyze("SELECT COUNT(*) FROM visits WHERE cost > -1", config.tables),  # type: ignore[arg-type]
            config.tables["visits"],
            "sqlite",
        ).sql
        assert conn.execute(all_rows).fetchone()[0] == expected
