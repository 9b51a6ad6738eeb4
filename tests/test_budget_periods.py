"""Budget periods (issue 15): a budget renews at the end of each day, week or month (UTC).

The ledger takes an injected clock, so these tests move through periods without waiting.
Every test of the ledger runs on SQLite and, when DPGATE_TEST_POSTGRES_URL is set,
PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from budget import PERIODS, BudgetExhausted, Ledger, schema
from budget.accountants import COMPOSITIONS
from budget.periods import ALL_TIME, period_end, period_start
from mechanisms.types import PrivacyCost

LAPLACE_HALF = PrivacyCost(0.5, 0.0, 0.125)


class Clock:
    """A settable clock: naive UTC, like ``budget.schema.utcnow``."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 3, 31, 23, 0))  # a Tuesday, the last day of March


@pytest.fixture
def ledger(ledger_url: str, clock: Clock) -> Iterator[Ledger]:
    led = Ledger.from_url(ledger_url, clock=clock)
    led.migrate()
    yield led
    led.close()


def charge(led: Ledger, analyst: str, cost: PrivacyCost = LAPLACE_HALF, key: str = "q"):  # type: ignore[no-untyped-def]
    return led.reserve(
        analyst, cost, query_key=key, sql="SELECT COUNT(*) FROM t", mechanism="laplace",
        data_version="v1",
    )  # fmt: skip


# -- the calendar ---------------------------------------------------------------------


def test_periods_are_utc_calendar_periods() -> None:
    now = datetime(2026, 3, 31, 23, 0)  # Tuesday
    assert period_start("day", now) == datetime(2026, 3, 31)
    assert period_end("day", now) == datetime(2026, 4, 1)
    assert period_start("week", now) == datetime(2026, 3, 30)  # Monday
    assert period_end("week", now) == datetime(2026, 4, 6)
    assert period_start("month", now) == datetime(2026, 3, 1)
    assert period_end("month", now) == datetime(2026, 4, 1)
    december = datetime(2026, 12, 15, 8, 30)
    assert period_end("month", december) == datetime(2027, 1, 1)
    assert period_start("none", now) == ALL_TIME and period_end("none", now) is None
    # a period boundary belongs to the period it starts
    midnight = datetime(2026, 4, 1)
    assert period_start("day", midnight) == midnight == period_start("month", midnight)


def test_the_config_knows_the_same_periods_and_compositions() -> None:
    from gateway.core import config

    assert config.PERIODS == PERIODS and config.COMPOSITIONS == COMPOSITIONS


# -- the ledger -----------------------------------------------------------------------


def test_a_daily_budget_renews_at_midnight_and_the_ledger_keeps_the_history(
    ledger: Ledger, clock: Clock
) -> None:
    ledger.create_analyst("alice", 1.0, 1e-6, "day")
    charge(ledger, "alice", key="a")
    charge(ledger, "alice", key="b")
    with pytest.raises(BudgetExhausted) as refused:
        charge(ledger, "alice", key="c")
    assert "renews at 2026-04-01T00:00:00+00:00" in str(refused.value)
    assert refused.value.detail()["period_ends_at"] == "2026-04-01T00:00:00+00:00"
    status = ledger.budget_status("alice")
    assert status.period == "day" and status.epsilon_spent == pytest.approx(1.0)
    assert status.period_ends_at == datetime(2026, 4, 1, tzinfo=UTC)
    assert status.to_json()["period_ends_at"] == "2026-04-01T00:00:00+00:00"

    clock.advance(hours=1)  # 00:00 on April 1st: a new day
    renewed = ledger.budget_status("alice")
    assert renewed.epsilon_spent == 0.0 and renewed.queries == 0
    assert renewed.period_started_at == datetime(2026, 4, 1, tzinfo=UTC)
    assert renewed.period_ends_at == datetime(2026, 4, 2, tzinfo=UTC)
    charge(ledger, "alice", key="d")
    charge(ledger, "alice", key="e")
    with pytest.raises(BudgetExhausted):
        charge(ledger, "alice", key="f")
    assert len(ledger.history("alice")) == 4  # nothing was deleted at renewal


def test_weekly_and_monthly_budgets(ledger: Ledger, clock: Clock) -> None:
    ledger.create_analyst("wendy", 1.0, 0.0, "week")
    ledger.create_analyst("molly", 1.0, 0.0, "month")
    for name in ("wendy", "molly"):
        charge(ledger, name, key=f"{name}1")
        charge(ledger, name, key=f"{name}2")
    clock.advance(days=1)  # Wednesday April 1st: same week, new month
    assert ledger.budget_status("wendy").epsilon_spent == pytest.approx(1.0)
    assert ledger.budget_status("molly").epsilon_spent == 0.0
    clock.advance(days=5)  # Monday April 6th: a new week
    assert ledger.budget_status("wendy").epsilon_spent == 0.0
    assert ledger.budget_status("wendy").period_ends_at == datetime(2026, 4, 13, tzinfo=UTC)


def test_a_refund_counts_in_the_period_of_its_charge(ledger: Ledger, clock: Clock) -> None:
    ledger.create_analyst("alice", 1.0, 0.0, "day")
    late = charge(ledger, "alice", key="late")  # 23:00 on March 31st
    clock.advance(hours=2)  # 01:00 on April 1st
    charge(ledger, "alice", key="early")
    ledger.refund(late, "the database was unreachable")
    # the refund gives back March 31st's charge, not room on April 1st
    status = ledger.budget_status("alice")
    assert status.epsilon_spent == pytest.approx(0.5) and status.queries == 1
    spent, live = ledger.recompute_spent("alice")
    assert spent.epsilon == pytest.approx(0.5) and live == 1


def test_changing_the_period_counts_from_the_start_of_the_current_one(
    ledger: Ledger, clock: Clock
) -> None:
    ledger.create_analyst("alice", 1.0, 0.0)
    charge(ledger, "alice", key="march")
    clock.advance(days=2)  # April 2nd
    charge(ledger, "alice", key="april")
    assert ledger.budget_status("alice").epsilon_spent == pytest.approx(1.0)
    status = ledger.update_analyst("alice", period="month")
    assert status.period == "month" and status.epsilon_spent == pytest.approx(0.5)
    assert ledger.update_analyst("alice", period="none").epsilon_spent == pytest.approx(1.0)
    with pytest.raises(ValueError, match="period must be one of"):
        ledger.update_analyst("alice", period="fortnight")  # type: ignore[arg-type]


def test_checkpoints_within_a_period_are_exact(
    ledger: Ledger, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import budget.ledger

    monkeypatch.setattr(budget.ledger, "CHECKPOINT_EVERY", 3)
    small = PrivacyCost(0.01, 0.0, 0.00005)
    ledger.create_analyst("alice", 100.0, 0.0, "day")
    for day in range(3):
        for i in range(10):
            r = charge(ledger, "alice", small, key=f"{day}-{i}")
            if i % 4 == 0:
                ledger.refund(r, "unreachable")
        status = ledger.budget_status("alice")
        spent, live = ledger.recompute_spent("alice")
        assert status.queries == live == 7
        assert status.epsilon_spent == pytest.approx(spent.epsilon) == pytest.approx(0.07)
        clock.advance(days=1)
    with ledger.engine.connect() as conn:
        sinces = conn.execute(sa.select(schema.checkpoints.c.since).distinct()).scalars().all()
    assert len(sinces) == 3  # one set of checkpoints per day


def test_global_checkpoints_within_a_period_are_exact(
    ledger: Ledger, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a global budget a charge sums every analyst's rows from the latest global
    checkpoint of the period; refunds and a new period in between change nothing."""
    import budget.ledger

    monkeypatch.setattr(budget.ledger, "CHECKPOINT_EVERY", 3)
    small = PrivacyCost(0.01, 0.0, 0.00005)
    ledger.set_global_budget(epsilon=100.0, delta=0.0, period="day")
    for name in ("alice", "bob"):
        ledger.create_analyst(name, 100.0, 0.0)
    for day in range(3):
        for i in range(10):
            r = charge(ledger, ("alice", "bob")[i % 2], small, key=f"{day}-{i}")
            if i % 4 == 0:
                ledger.refund(r, "unreachable")
        status = ledger.global_status()
        assert status is not None and status.queries == 7
        assert status.epsilon_spent == pytest.approx(0.07)
        clock.advance(days=1)
    with ledger.engine.begin() as conn:
        table = schema.global_checkpoints
        sinces = conn.execute(sa.select(table.c.since).distinct()).scalars().all()
        assert len(sinces) == 3  # one set of global checkpoints per day
        conn.execute(sa.delete(table))
    clock.advance(days=-1)  # the last day again: without checkpoints, the same figures
    status = ledger.global_status()
    assert status is not None and status.queries == 7
    assert status.epsilon_spent == pytest.approx(0.07)


def test_the_global_budget_set_in_the_ledger_has_a_period(ledger_url: str, clock: Clock) -> None:
    led = Ledger.from_url(ledger_url, clock=clock, global_budget=(0.5, 0.0))
    led.migrate()
    for name in ("alice", "bob"):
        led.create_analyst(name, 10.0, 0.0)
    status = led.global_status()
    assert status is not None and status.epsilon == 0.5 and status.period == "none"
    charge(led, "alice", key="a")
    with pytest.raises(BudgetExhausted) as refused:
        charge(led, "bob", key="b")
    assert refused.value.scope == "global"
    # an admin raises it and gives it a daily period: the ledger's now wins over the config's
    status = led.set_global_budget(epsilon=1.0, period="day")
    assert (status.epsilon, status.delta, status.period) == (1.0, 0.0, "day")
    charge(led, "bob", key="b")
    with pytest.raises(BudgetExhausted):
        charge(led, "bob", key="c")
    clock.advance(hours=1)
    charge(led, "bob", key="c")
    other = Ledger(led.engine, clock=clock, global_budget=(0.5, 0.0))  # another worker
    assert other.global_status() == led.global_status()
    led.close()


def test_a_global_budget_needs_epsilon_and_delta_first(ledger: Ledger) -> None:
    assert ledger.global_status() is None
    with pytest.raises(ValueError, match="give both epsilon and delta"):
        ledger.set_global_budget(period="week")
    status = ledger.set_global_budget(epsilon=3.0, delta=1e-6, period="week")
    assert status.name == "(global)" and status.period == "week"


def test_migrating_a_version_3_ledger_keeps_what_was_spent(ledger_url: str) -> None:
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:  # a ledger as schema version 3 left it
        schema.schema_version.create(conn)
        for version, migration in enumerate(schema.MIGRATIONS[:3], start=1):
            migration(conn)
            conn.execute(
                sa.insert(schema.schema_version).values(version=version, applied_at=datetime.now())
            )
        conn.exec_driver_sql("DROP INDEX IF EXISTS dpgate_ledger_analyst_charged")
        conn.exec_driver_sql("DROP INDEX IF EXISTS dpgate_ledger_charged")
        for table, column in (
            ("dpgate_ledger", "charged_at"),
            ("dpgate_analysts", "period"),
            ("dpgate_checkpoints", "since"),
            ("dpgate_checkpoints", "gaussian"),
            ("dpgate_global", "epsilon"),
            ("dpgate_global", "delta"),
            ("dpgate_global", "period"),
            ("dpgate_global", "updated_at"),
        ):
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        then = datetime(2026, 1, 5, 12, 0)
        conn.execute(
            sa.text(
                "INSERT INTO dpgate_analysts (name, key_hash, epsilon, delta, disabled,"
                " created_at, updated_at) VALUES ('alice', :h, 1.0, 1e-6, false, :t, :t)"
            ),
            {"h": "0" * 64, "t": then},
        )
        row = sa.text(
            "INSERT INTO dpgate_ledger (reservation_id, settles, analyst_id, kind, epsilon,"
            " delta, rho, selection_delta, mechanism, query_key, sql, data_version, created_at)"
            " VALUES (:r, :s, 1, :k, :e, 0, :rho, 0, 'laplace', 'q', 'SELECT 1', 'v1', :t)"
        )
        for params in (
            {"r": "r1", "s": None, "k": "charge", "e": 0.25, "rho": 0.03125, "t": then},
            {"r": "r2", "s": None, "k": "charge", "e": 0.25, "rho": 0.03125, "t": then},
            {"r": "r2", "s": "r2", "k": "refund", "e": -0.25, "rho": -0.03125,
             "t": then + timedelta(days=40)},
        ):  # fmt: skip
            conn.execute(row, params)
    engine.dispose()
    led = Ledger.from_url(ledger_url, clock=lambda: datetime(2026, 2, 20))
    assert led.migrate() == schema.SCHEMA_VERSION >= 4
    status = led.budget_status("alice")
    assert status.period == "none" and status.queries == 1
    assert status.epsilon_spent == pytest.approx(0.25)
    with led.engine.connect() as conn:
        charged = dict(
            conn.execute(sa.select(schema.ledger.c.kind, schema.ledger.c.charged_at)).all()
        )
    assert charged["refund"] == then  # the refund belongs to its charge's period
    # January's charges are not February's: a monthly period now starts afresh
    assert led.update_analyst("alice", period="month").epsilon_spent == 0.0
    led.close()
