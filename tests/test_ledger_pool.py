"""A PostgreSQL ledger's connections and deferred writes.

The pool (budget/pool.py): a connection in use moments ago is not pinged again, an idle
one is, and one the server dropped while idle is replaced without the caller seeing an
error. The request log (``Ledger.write(wait=False)``): rows are committed together, each
in a savepoint, so one that fails loses nothing of the others."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import event

import budget.pool
from budget import Ledger
from tests.conftest import drop_postgres_schema, postgres_schema_url

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_ledger(postgres_url: str) -> Iterator[Ledger]:
    url, schema = postgres_schema_url(postgres_url)
    ledger = Ledger.from_url(url)
    try:
        ledger.migrate()
        ledger.create_analyst("a", 1.0, 1e-6)
        yield ledger
    finally:
        ledger.close()
        drop_postgres_schema(postgres_url, schema)


def _count_pings(ledger: Ledger) -> list[int]:
    pings = [0]
    ping = ledger.engine.dialect.do_ping

    def counted(dbapi_connection: object) -> bool:
        pings[0] += 1
        return ping(dbapi_connection)

    ledger.engine.dialect.do_ping = counted  # type: ignore[method-assign]
    return pings


def test_a_connection_just_checked_in_is_not_pinged_again(pg_ledger: Ledger) -> None:
    pg_ledger.budget_status("a")
    pings = _count_pings(pg_ledger)
    for _ in range(20):
        pg_ledger.budget_status("a")
    assert pings[0] == 0


def test_an_idle_connection_is_pinged_and_replaced_if_the_server_dropped_it(
    pg_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg_ledger.budget_status("a")
    with pg_ledger.engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    # the server ends that session, as a restart or an idle timeout would
    other = sa.create_engine(pg_ledger.engine.url)
    with other.begin() as conn:
        conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
    other.dispose()
    pings = _count_pings(pg_ledger)
    # now idle for "longer than the threshold": the checkout pings, finds it dead, and
    # the pool hands out a fresh connection
    monkeypatch.setattr(budget.pool, "_now", lambda: 1e12)
    assert pg_ledger.budget_status("a").name == "a"
    assert pings[0] >= 1


def test_request_log_rows_are_committed_together_and_one_failure_loses_no_other(
    pg_ledger: Ledger,
) -> None:
    commits = [0]
    event.listen(pg_ledger.engine, "commit", lambda conn: commits.__setitem__(0, commits[0] + 1))

    def failing(conn: sa.Connection) -> None:
        conn.exec_driver_sql("INSERT INTO no_such_table VALUES (1)")

    for i in range(10):
        pg_ledger.log_request(
            request_id=f"r{i}",
            analyst="a",
            endpoint="POST /v1/query",
            sql="SELECT 1",
            outcome="answered",
            error_code=None,
            status=200,
        )
        if i == 4:  # a write that fails, queued among the others
            pg_ledger.write(failing, durable=False, wait=False)
    pg_ledger.flush()
    ids = sorted(e.request_id for e in pg_ledger.audit_log(analyst="a"))
    assert ids == sorted(f"r{i}" for i in range(10))
    assert commits[0] < 10  # not one transaction per row


def test_sixteen_threads_reuse_kept_connections_instead_of_opening_new_ones(
    pg_ledger: Ledger,
) -> None:
    """A serving worker's 16 request threads each hold a connection for one short
    transaction at a time: the pool keeps that many (``SERVER_POOL_SIZE``), so after the
    first round nobody connects again. (SQLAlchemy's default keeps 5 and closes the rest
    at check-in: a new PostgreSQL connection for most transactions under load.)"""
    from budget.ledger import SERVER_POOL_SIZE

    assert SERVER_POOL_SIZE >= 16
    connects = [0]
    event.listen(pg_ledger.engine, "connect", lambda *_: connects.__setitem__(0, connects[0] + 1))
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def round_of_reads() -> None:
        try:
            barrier.wait(10)
            with pg_ledger.engine.connect() as conn:  # held while the others take theirs
                barrier.wait(10)
                conn.execute(sa.text("SELECT 1"))
        except BaseException as e:  # a pool too small: checkout times out, barrier breaks
            errors.append(e)
            barrier.abort()

    def run_round() -> None:
        threads = [threading.Thread(target=round_of_reads) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[:1]

    run_round()
    opened = connects[0]
    assert 0 < opened <= 16
    for _ in range(3):
        run_round()
    assert connects[0] == opened
