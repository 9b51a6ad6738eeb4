"""The ledger: analysts, keys, charging, outcomes, history, cache lookups, audit log.

Every test runs on a SQLite file and, when DPGATE_TEST_POSTGRES_URL is set, on a fresh
PostgreSQL schema that is dropped afterwards.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from budget import (
    SCHEMA_VERSION,
    AnalystDisabled,
    AnalystExists,
    BudgetExhausted,
    Ledger,
    LedgerUnavailable,
    ReservationSettled,
    SchemaTooNew,
    UnknownAnalyst,
    UnsupportedCost,
    cks_epsilon,
    schema,
)
from budget.keys import key_hash
from budget.records import CacheProbe
from mechanisms.types import PrivacyCost
from tests.conftest import drop_postgres_schema, postgres_schema_url


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    led = Ledger.from_url(ledger_url)
    led.migrate()
    yield led
    led.close()


def laplace(eps: float, selection_delta: float = 0.0) -> PrivacyCost:
    return PrivacyCost(eps, 0.0, eps * eps / 2, selection_delta)


def charge(led: Ledger, analyst: str, cost: PrivacyCost, key: str = "q", **kw: str):  # type: ignore[no-untyped-def]
    return led.reserve(
        analyst,
        cost,
        query_key=key,
        sql=kw.get("sql", f"SELECT COUNT(*) FROM t -- {key}"),
        mechanism=kw.get("mechanism", "laplace"),
        data_version=kw.get("data_version", "v1"),
    )


# -- schema ---------------------------------------------------------------------------


def test_migrate_is_idempotent_and_versioned(ledger: Ledger) -> None:
    assert ledger.migrate() == SCHEMA_VERSION
    assert ledger.migrate() == SCHEMA_VERSION
    with ledger.engine.connect() as conn:
        versions = conn.exec_driver_sql("SELECT version FROM dpgate_schema_version").all()
    assert [v for (v,) in versions] == list(range(1, SCHEMA_VERSION + 1))


def test_migrate_refuses_a_newer_schema(ledger: Ledger) -> None:
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO dpgate_schema_version (version, applied_at) "
            "VALUES (999, CURRENT_TIMESTAMP)"
        )
    with pytest.raises(SchemaTooNew):
        ledger.migrate()


def test_sqlite_uses_wal(tmp_path: object) -> None:
    led = Ledger.from_url(f"sqlite:///{tmp_path}/w.db")
    led.migrate()
    with led.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_sqlite_synchronous_url_option(tmp_path: object) -> None:
    led = Ledger.from_url(f"sqlite:///{tmp_path}/n.db?synchronous=normal")
    led.migrate()
    led.create_analyst("a", 1.0, 1e-6)
    charge(led, "a", laplace(0.1))
    with led._transaction(write=False) as conn:  # the connection this thread charged on
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    with pytest.raises(ValueError):
        Ledger.from_url(f"sqlite:///{tmp_path}/n.db?synchronous=off")


def test_in_memory_sqlite_works() -> None:
    led = Ledger.from_url("sqlite://")
    led.migrate()
    led.create_analyst("a", 1.0, 1e-6)
    charge(led, "a", laplace(0.1))
    assert led.budget_status("a").queries == 1


# -- analysts and keys ----------------------------------------------------------------


def test_api_key_is_shown_once_and_only_its_hash_is_stored(ledger: Ledger) -> None:
    key = ledger.create_analyst("alice", 1.0, 1e-6)
    assert len(key) > 40
    analyst = ledger.authenticate(key)
    assert analyst is not None and analyst.name == "alice" and not analyst.disabled
    assert (analyst.epsilon, analyst.delta) == (1.0, 1e-6)
    with ledger.engine.connect() as conn:
        dump = repr(conn.exec_driver_sql("SELECT * FROM dpgate_analysts").all())
    assert key not in dump and key[4:] not in dump
    assert key_hash(key) in dump


def test_authenticate_rejects_wrong_and_empty_keys(ledger: Ledger) -> None:
    key = ledger.create_analyst("alice", 1.0, 1e-6)
    assert ledger.authenticate(key + "x") is None
    assert ledger.authenticate("") is None
    assert ledger.authenticate(key_hash(key)) is None  # the stored hash is not a key


def test_rotate_key_invalidates_the_old_key(ledger: Ledger) -> None:
    old = ledger.create_analyst("alice", 1.0, 1e-6)
    new = ledger.rotate_key("alice")
    assert new != old
    assert ledger.authenticate(old) is None
    got = ledger.authenticate(new)
    assert got is not None and got.name == "alice"
    with pytest.raises(UnknownAnalyst):
        ledger.rotate_key("nobody")


def test_duplicate_and_invalid_analysts(ledger: Ledger) -> None:
    ledger.create_analyst("alice", 1.0, 1e-6)
    with pytest.raises(AnalystExists):
        ledger.create_analyst("alice", 2.0, 1e-6)
    assert ledger.ensure_analyst("alice", 5.0, 1e-6) is None
    assert ledger.budget_status("alice").epsilon == 1.0  # the ledger is the source of truth
    assert ledger.ensure_analyst("bob", 5.0, 1e-6) is not None
    for name, eps, delta in [("", 1, 0), ("a b", 1, 0), ("x", -1, 0), ("x", 1, 1.0)]:
        with pytest.raises(ValueError):
            ledger.create_analyst(name, eps, delta)
    with pytest.raises(ValueError):
        ledger.create_analyst("x", float("nan"), 0.0)


def test_list_and_update_analysts(ledger: Ledger) -> None:
    ledger.create_analyst("bob", 2.0, 1e-6)
    ledger.create_analyst("alice", 1.0, 1e-6)
    charge(ledger, "alice", laplace(0.1))
    statuses = ledger.list_analysts()
    assert [s.name for s in statuses] == ["alice", "bob"]
    assert statuses[0].queries == 1 and statuses[1].queries == 0
    assert statuses[0].rho_spent == pytest.approx(0.005)
    status = ledger.update_analyst("alice", epsilon=3.0, disabled=True)
    assert status.epsilon == 3.0 and status.disabled and status.rho_spent == pytest.approx(0.005)
    got = ledger.authenticate(ledger.rotate_key("alice"))
    assert got is not None and got.disabled
    with pytest.raises(AnalystDisabled):
        charge(ledger, "alice", laplace(0.1))
    ledger.update_analyst("alice", disabled=False)
    charge(ledger, "alice", laplace(0.1))
    with pytest.raises(UnknownAnalyst):
        ledger.update_analyst("nobody", epsilon=1.0)
    with pytest.raises(UnknownAnalyst):
        ledger.budget_status("nobody")


# -- charging -------------------------------------------------------------------------


def test_budget_status_follows_the_accountant(ledger: Ledger) -> None:
    ledger.create_analyst("alice", 10.0, 1e-6)
    for i in range(3):
        ledger.commit(charge(ledger, "alice", laplace(0.1), key=f"q{i}"), {"rows": []}, "answered")
    s = ledger.budget_status("alice")
    assert s.composition == "combined"
    assert s.rho_spent == pytest.approx(0.015)
    # the smaller of the basic-composition total (0.3) and the zCDP one (CKS at δ_B/2)
    assert s.epsilon_spent_zcdp == pytest.approx(cks_epsilon(0.015, 5e-7))
    assert s.epsilon_spent_basic == pytest.approx(0.3) == s.epsilon_spent
    assert s.basis == "basic" and s.epsilon_spent_zcdp > s.epsilon_spent
    assert s.epsilon_remaining == pytest.approx(10.0 - s.epsilon_spent)
    assert s.delta_spent == 0.0 and s.delta_remaining == 5e-7 == s.selection_delta_budget
    assert s.max_next_laplace_epsilon == pytest.approx(9.7)  # basic composition's
    zcdp = Ledger(ledger.engine, composition="zcdp").budget_status("alice")
    assert zcdp.epsilon_spent == pytest.approx(cks_epsilon(0.015, 5e-7))
    assert zcdp.max_next_laplace_epsilon == pytest.approx((2 * zcdp.rho_remaining) ** 0.5)


def test_exactly_the_budget_is_admitted_then_budget_exhausted(ledger: Ledger) -> None:
    n = 25
    eps_b = cks_epsilon(n * 0.005, 5e-7) * (1 + 1e-12)  # below 25 × 0.1: zCDP decides
    assert eps_b < n * 0.1
    ledger.create_analyst("alice", eps_b, 1e-6)
    for i in range(n):
        charge(ledger, "alice", laplace(0.1), key=f"q{i}")
    with pytest.raises(BudgetExhausted) as info:
        charge(ledger, "alice", laplace(0.1))
    assert "remaining" in str(info.value) and info.value.scope == "analyst"
    assert info.value.detail()["max_next_laplace_epsilon"] == pytest.approx(0.0, abs=1e-4)
    assert ledger.budget_status("alice").queries == n  # the refused query appended nothing


def test_refund_gives_the_budget_back(ledger: Ledger) -> None:
    ledger.create_analyst("alice", 0.3, 0.0)
    pure = Ledger(ledger.engine, composition="pure")
    first = charge(pure, "alice", laplace(0.1))
    charge(pure, "alice", laplace(0.2))
    with pytest.raises(BudgetExhausted):
        charge(pure, "alice", laplace(0.1))
    pure.refund(first, "database unavailable")
    assert pure.budget_status("alice").epsilon_spent == pytest.approx(0.2)
    charge(pure, "alice", laplace(0.1))
    with pytest.raises(ReservationSettled):
        pure.refund(first, "again")
    with pytest.raises(ReservationSettled):
        pure.commit(first, {}, "answered")


def test_pure_composition_refuses_gaussian(ledger: Ledger) -> None:
    ledger.create_analyst("alice", 5.0, 1e-6)
    pure = Ledger(ledger.engine, composition="pure")
    with pytest.raises(UnsupportedCost):
        charge(pure, "alice", PrivacyCost(1.0, 1e-7, 0.1), mechanism="gaussian")
    with pytest.raises(UnsupportedCost):
        charge(pure, "alice", PrivacyCost(-1.0, 0.0, 0.5))
    assert pure.budget_status("alice").queries == 0


def test_global_budget_caps_all_analysts_together(ledger: Ledger) -> None:
    ledger.create_analyst("alice", 1.0, 0.0)
    ledger.create_analyst("bob", 1.0, 0.0)
    capped = Ledger(ledger.engine, composition="pure", global_budget=(0.5, 0.0))
    for i in range(3):
        charge(capped, "alice", laplace(0.1), key=f"a{i}")
    charge(capped, "bob", laplace(0.2))
    with pytest.raises(BudgetExhausted) as info:
        charge(capped, "bob", laplace(0.1))
    assert info.value.scope == "global"
    status = capped.global_status()
    assert status is not None and status.epsilon_spent == pytest.approx(0.5)
    assert capped.budget_status("bob").epsilon_spent == pytest.approx(0.2)
    assert ledger.global_status() is None


def test_unknown_analyst_cannot_be_charged(ledger: Ledger) -> None:
    with pytest.raises(UnknownAnalyst):
        charge(ledger, "nobody", laplace(0.1))


def test_checkpoints_are_exact_partial_sums(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import budget.ledger

    monkeypatch.setattr(budget.ledger, "CHECKPOINT_EVERY", 4)
    n = 23
    ledger.create_analyst("alice", cks_epsilon(n * 0.005, 1e-6) * (1 + 1e-12), 1e-6)
    ledger.create_analyst("bob", 100.0, 1e-6)
    for i in range(10 * n):
        try:
            r = charge(ledger, "alice", laplace(0.1), key=f"a{i}")
        except BudgetExhausted:
            break
        charge(ledger, "bob", laplace(0.1), key=f"b{i}")  # interleaved rows of another analyst
        if i % 5 == 0:
            ledger.refund(r, "database timeout")
    else:
        pytest.fail("the budget was never exhausted")
    status = ledger.budget_status("alice")
    spent, count = ledger.recompute_spent("alice")
    assert status.queries == count == n
    assert status.rho_spent == pytest.approx(spent.rho) == pytest.approx(n * 0.005)
    with ledger.engine.connect() as conn:
        checkpoints = conn.exec_driver_sql("SELECT COUNT(*) FROM dpgate_checkpoints").scalar()
    assert checkpoints and checkpoints >= 5
    # checkpoints are a cache: without them the figures are the same
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM dpgate_checkpoints")
    after = ledger.budget_status("alice")
    assert after.queries == status.queries
    assert after.rho_spent == pytest.approx(status.rho_spent, rel=1e-12)


def test_migrate_upgrades_a_version_1_ledger(ledger_url: str) -> None:
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:  # a ledger as dpgate's schema version 1 left it
        schema.schema_version.create(conn)
        schema._v1_initial(conn)
        conn.exec_driver_sql("DROP INDEX dpgate_ledger_analyst_seq")
        conn.exec_driver_sql(
            "CREATE INDEX dpgate_ledger_analyst ON dpgate_ledger "
            "(analyst_id, kind, rho, epsilon, delta, selection_delta)"
        )
        conn.exec_driver_sql("DROP INDEX dpgate_ledger_release")  # v6 made it
        conn.exec_driver_sql(
            "CREATE INDEX dpgate_ledger_query ON dpgate_ledger (query_key, data_version, kind)"
        )
        conn.execute(sa.insert(schema.schema_version).values(version=1, applied_at=schema.utcnow()))
        now = schema.utcnow()
        conn.execute(
            sa.insert(schema.analysts).values(
                name="alice",
                key_hash="0" * 64,
                epsilon=1.0,
                delta=1e-6,
                disabled=False,
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            sa.insert(schema.ledger).values(
                reservation_id="r1",
                analyst_id=1,
                kind="charge",
                epsilon=0.1,
                delta=0.0,
                rho=0.005,
                selection_delta=0.0,
                mechanism="laplace",
                query_key="k",
                sql="SELECT COUNT(*) FROM t",
                data_version="v1",
                created_at=now,
            )
        )
    engine.dispose()
    led = Ledger.from_url(ledger_url)
    assert led.migrate() == SCHEMA_VERSION >= 2
    indexes = {i["name"] for i in sa.inspect(led.engine).get_indexes("dpgate_ledger")}
    assert "dpgate_ledger_analyst_seq" in indexes and "dpgate_ledger_analyst" not in indexes
    assert "dpgate_ledger_release" in indexes and "dpgate_ledger_query" not in indexes
    assert "dpgate_global_checkpoints" in sa.inspect(led.engine).get_table_names()  # v7
    assert led.budget_status("alice").rho_spent == pytest.approx(0.005)
    charge(led, "alice", laplace(0.1))
    assert led.budget_status("alice").queries == 2
    led.close()


# -- history, releases, cache lookups ----------------------------------------------------


def test_history_shows_every_outcome(ledger: Ledger) -> None:
    ledger.create_analyst("alice", 10.0, 1e-6)
    answered = charge(ledger, "alice", laplace(0.1), key="a", sql="SELECT 1")
    ledger.commit(answered, {"rows": [[41]]}, "answered")
    withheld = charge(ledger, "alice", laplace(0.2), key="w", sql="SELECT 2")
    ledger.commit(withheld, {"reason": "audit"}, "withheld")
    refunded = charge(ledger, "alice", laplace(0.3), key="r", sql="SELECT 3")
    ledger.refund(refunded, "database timeout")
    charge(ledger, "alice", laplace(0.4), key="p", sql="SELECT 4")
    history = ledger.history("alice")
    assert [(h.sql, h.outcome) for h in history] == [
        ("SELECT 1", "answered"),
        ("SELECT 2", "withheld"),
        ("SELECT 3", "refunded"),
        ("SELECT 4", "pending"),
    ]
    assert history[0].release == {"rows": [[41]]}
    assert history[0].cost == laplace(0.1)
    assert history[2].reason == "database timeout"
    assert history[0].created_at.tzinfo is not None
    assert [h.sql for h in ledger.history("alice", limit=2)] == ["SELECT 3", "SELECT 4"]
    assert history[0].to_json()["outcome"] == "answered"
    # the spent figure is exactly the sum of the ledger rows: refunds give back, others count
    assert ledger.budget_status("alice").rho_spent == pytest.approx((0.01 + 0.04 + 0.16) / 2)


def test_find_release_and_releases_for_the_cache_and_auditor(ledger: Ledger) -> None:
    ledger.create_analyst("alice", 10.0, 1e-6)
    ledger.create_analyst("bob", 10.0, 1e-6)
    r1 = charge(ledger, "alice", laplace(0.1), key="k1")
    ledger.commit(r1, {"rows": [[1]]}, "answered")
    r2 = charge(ledger, "alice", laplace(0.1), key="k1")  # a concurrent duplicate
    ledger.commit(r2, {"rows": [[2]]}, "answered")
    w = charge(ledger, "bob", laplace(0.1), key="k2")
    ledger.commit(w, {"withheld": True}, "withheld")
    ledger.refund(charge(ledger, "bob", laplace(0.1), key="k3"), "db down")
    charge(ledger, "bob", laplace(0.1), key="k4")  # pending
    assert ledger.find_release("k1", "alice", "v1") == {"rows": [[1]]}  # the first one
    assert ledger.find_release("k1", None, "v1") == {"rows": [[1]]}
    assert ledger.find_release("k1", "bob", "v1") is None
    assert ledger.find_release("k1", "alice", "v2") is None
    assert ledger.find_release("k2", "bob", "v1") is None  # withheld is not a release
    assert ledger.find_release("k3", None, "v1") is None
    assert ledger.find_release("k1", "nobody", "v1") is None
    every = ledger.releases(None, "v1")
    assert [(e.analyst, e.query_key, e.outcome) for e in every] == [
        ("alice", "k1", "answered"),
        ("alice", "k1", "answered"),
        ("bob", "k2", "withheld"),
    ]
    assert every[0].cost == laplace(0.1) and every[0].sql.startswith("SELECT")
    assert [e.query_key for e in ledger.releases("bob", "v1")] == ["k2"]
    assert every[0].seq < every[1].seq < every[2].seq
    assert [e.query_key for e in ledger.releases(None, "v1", after=every[0].seq)] == ["k1", "k2"]
    assert ledger.releases(None, "v1", after=every[2].seq) == []
    assert ledger.releases(None, "v2") == []


def test_a_cache_miss_reads_no_other_analysts_releases_of_the_same_query(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every analyst of a team asks the same queries: the per-analyst cache lookup must
    seek its own release, not read every other analyst's release of that query text
    (with schema v5's index a PUMS run's ledger took a cache miss from 2.0 to 3.8 ms).
    The attack it also closes: with release timing off, an analyst timing their own
    cache misses learnt how many others had asked the same query. Counted in SQLite
    virtual-machine steps, which do not depend on the machine's speed."""
    from budget import reads

    led = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}")
    led.migrate()

    def steps_of_a_miss() -> int:
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0

        with led.engine.connect() as conn:
            raw = conn.connection.driver_connection
            raw.set_progress_handler(count, 1)  # type: ignore[union-attr]
            assert reads.find_release(conn, "same", "newcomer", "v1") is None
            raw.set_progress_handler(None, 1)  # type: ignore[union-attr]
        return steps

    led.create_analyst("newcomer", 10.0, 1e-6)
    for i in range(200):
        led.create_analyst(f"a{i}", 10.0, 1e-6)
        led.commit(charge(led, f"a{i}", laplace(0.1), key="same"), {"rows": [[i]]}, "answered")
        if i == 1:
            few = steps_of_a_miss()
    many = steps_of_a_miss()
    assert many <= few + 5, (few, many)
    led.close()


def test_a_charge_under_a_global_budget_does_not_read_the_whole_ledger(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The global budget's sum starts from the latest global checkpoint, like an
    analyst's: without one, every charge under a global budget summed the whole ledger
    while holding the write lock (25 ms at 100,000 rows, 237 ms at a million:
    ``python -m bench.bench_ledger_growth``). Counted in SQLite virtual-machine steps, at
    the same distance from the latest checkpoint, with 9 times as many rows."""
    import budget.ledger

    monkeypatch.setattr(budget.ledger, "CHECKPOINT_EVERY", 16)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_progress_handler(count, 1)

    sa.event.listen(sa.engine.Engine, "connect", on_connect)
    led = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}", global_budget=(1e6, 0.0))
    try:
        led.migrate()
        led.create_analyst("alice", 1e6, 0.0)

        def steps_of_a_charge(i: int) -> int:
            before = steps
            charge(led, "alice", laplace(0.001), key=f"q{i}")
            return steps - before

        for i in range(40):
            charge(led, "alice", laplace(0.001), key=f"q{i}")
        few = steps_of_a_charge(40)
        for i in range(41, 41 + 16 * 20):
            charge(led, "alice", laplace(0.001), key=f"q{i}")
        many = steps_of_a_charge(41 + 16 * 20)
    finally:
        sa.event.remove(sa.engine.Engine, "connect", on_connect)
        led.close()
    assert many <= few * 1.1, (few, many)


@pytest.mark.postgres
@pytest.mark.parametrize("held", ["refund", "charge"])
def test_no_global_checkpoint_leaves_out_a_row_still_committing(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    """PostgreSQL numbers ledger rows from a sequence, so a row can commit after rows with
    larger ids. A global checkpoint written in between would leave it out of the global
    budget's sum for good. Here a refund, or a charge by a gateway that knows no global
    budget (another worker's config, or one that read the ledger before an admin set
    it), is held open after its row is written, while another analyst's charges under
    the global budget each reach the checkpoint threshold: none may write one until the
    held row has committed."""
    import threading

    import budget.ledger
    from budget import statements as st

    monkeypatch.setattr(budget.ledger, "CHECKPOINT_EVERY", 2)
    url, name = postgres_schema_url(postgres_url)
    led = Ledger.from_url(url, global_budget=(100.0, 0.0))
    unaware = Ledger.from_url(url)  # no global budget: takes no global lock
    try:
        led.migrate()
        for analyst in ("alice", "bob"):
            led.create_analyst(analyst, 100.0, 0.0)
        refunded = charge(led, "alice", laplace(0.1), key="refunded")
        written, go_on = threading.Event(), threading.Event()
        statement = st.SETTLE if held == "refund" else st.INSERT_ENTRY_SHARED
        run = statement.run

        def held_open(conn: Any, params: Any = None) -> int:
            n = run(conn, params)
            if params and (params.get("kind") == "refund" or params.get("query_key") == "held"):
                written.set()
                go_on.wait(30)
            return n

        monkeypatch.setattr(statement, "run", held_open)
        if held == "refund":
            work = threading.Thread(target=led.refund, args=(refunded, "unreachable"))
        else:
            work = threading.Thread(
                target=charge, args=(unaware, "alice", laplace(0.1)), kwargs={"key": "held"}
            )
        work.start()
        assert written.wait(30)
        for i in range(6):
            charge(led, "bob", laplace(0.1), key=f"b{i}")
        go_on.set()
        work.join(30)
        for i in range(6, 12):
            charge(led, "bob", laplace(0.1), key=f"b{i}")
        with led.engine.connect() as conn:
            written_checkpoints = sa.select(sa.func.count()).select_from(schema.global_checkpoints)
            assert conn.execute(written_checkpoints).scalar()
        live = 12 if held == "refund" else 14  # alice's first charge, refunded or not
        status = led.global_status()
        assert status is not None and status.queries == live
        assert status.epsilon_spent == pytest.approx(live * 0.1)
    finally:
        led.close()
        unaware.close()
        drop_postgres_schema(postgres_url, name)


# -- the request audit log --------------------------------------------------------------


def test_audit_log_filters(ledger: Ledger) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    for i, (who, status) in enumerate([("alice", 200), (None, 401), ("bob", 403)]):
        ledger.log_request(
            request_id=f"r{i}",
            analyst=who,
            endpoint="/v1/query",
            sql=None if who is None else "SELECT 1",
            outcome="answered" if status == 200 else "refused",
            error_code=None if status == 200 else "x",
            status=status,
        )
    after = datetime.now(UTC) + timedelta(seconds=1)
    log = ledger.audit_log()
    assert [e.request_id for e in log] == ["r2", "r1", "r0"]  # newest first
    assert [e.request_id for e in ledger.audit_log(analyst="alice")] == ["r0"]
    assert len(ledger.audit_log(since=before, until=after)) == 3
    assert ledger.audit_log(since=after) == []
    assert ledger.audit_log(until=before) == []
    assert len(ledger.audit_log(limit=2)) == 2
    assert log[1].analyst is None and log[1].status == 401
    assert log[0].to_json()["created_at"].endswith("+00:00")


# -- failures ---------------------------------------------------------------------------


def test_unreachable_database_is_ledger_unavailable() -> None:
    led = Ledger.from_url("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=1")
    with pytest.raises(LedgerUnavailable):
        led.ping()
    with pytest.raises(LedgerUnavailable):
        led.authenticate("dpg_x")


def test_sqlite_write_lock_timeout_is_ledger_unavailable(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/locked.db"
    led = Ledger.from_url(url, busy_timeout_ms=50)
    led.migrate()
    led.create_analyst("alice", 1.0, 1e-6)
    blocker = sa.create_engine(url)
    with blocker.connect() as conn:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        with pytest.raises(LedgerUnavailable):
            charge(led, "alice", laplace(0.1))
        conn.exec_driver_sql("ROLLBACK")
    blocker.dispose()
    assert led.budget_status("alice").queries == 0


def test_an_outcome_queued_without_waiting_is_read_at_once_here_and_soon_elsewhere(
    ledger_url: str,
) -> None:
    """``commit(wait=False)``: the row rides on the writer's next batch. This process's
    reads of that query wait for it; another process sees it within the linger."""
    led = Ledger.from_url(ledger_url)
    led.migrate()
    key = led.create_analyst("alice", 10.0, 1e-6)
    r = charge(led, "alice", laplace(0.1), key="k1")
    led.commit(r, {"rows": [[7]]}, "answered", wait=False)
    found = led.lookup(key, CacheProbe("k1", "v1"))
    assert found.release == {"rows": [[7]]}
    assert found.budget is not None and found.budget.queries == 1
    r2 = charge(led, "alice", laplace(0.1), key="k2")
    led.commit(r2, {"rows": [[8]]}, "answered", wait=False)
    assert led.find_release("k2", "alice", "v1") == {"rows": [[8]]}  # the in-process cache
    r4 = charge(led, "alice", laplace(0.1), key="k4")
    led.commit(r4, {"rows": [[4]]}, "answered", wait=False)
    assert [h.outcome for h in led.history("alice")] == ["answered"] * 3
    other = Ledger.from_url(ledger_url)  # another process: no queue of this one to wait for
    r3 = charge(led, "alice", laplace(0.1), key="k3")
    led.commit(r3, {"rows": [[9]]}, "answered", wait=False)
    deadline = time.monotonic() + 10
    while other.find_release("k3", "alice", "v1") is None and time.monotonic() < deadline:
        time.sleep(0.01)  # nobody in this process reads or writes: the lingerer writes it
    assert other.find_release("k3", "alice", "v1") == {"rows": [[9]]}
    # the writer marks the outcome settled just after its commit, which another process
    # can see first: wait (within the same deadline) for the mark
    while led._unsettled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not led._unsettled
    other.close()
    led.close()


def test_a_queued_outcome_that_fails_is_logged_and_forgotten(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.create_analyst("alice", 10.0, 1e-6)
    r = charge(ledger, "alice", laplace(0.1), key="k1")
    ghost = dataclasses.replace(r, id="0" * 32, query_key="ghost")  # no such reservation
    with caplog.at_level("ERROR", logger="dpgate.ledger"):
        ledger.commit(ghost, {"rows": [[1]]}, "answered", wait=False)
        ledger.flush()
    assert "was not recorded" in caplog.text and "0" * 32 in caplog.text
    assert not ledger._unsettled  # a later lookup of that key does not wait for it again
    assert ledger.find_release("ghost", None, "v1") is None
    assert [h.outcome for h in ledger.history("alice")] == ["pending"]  # still charged
