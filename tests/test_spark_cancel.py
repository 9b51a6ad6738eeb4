"""Spark's cancel takes, whenever the gateway's timer fires (gateway/sql/engines/spark_dbapi.py).

The gateway abandons a statement at its release moment and its timer calls the
connection's ``cancel()``; the statement must then stop soon, not run on for minutes on
the engine's cores. Each test runs a statement made slow on purpose (``range(0, 2·10¹⁰)``:
minutes of work on ``local[2]``) and fires the cancel at one of the moments where Spark
used to miss it:

- while Spark still plans the statement (``sql``), before any job exists: it stops at
  its next step, before ``collect`` sends its job;
- after planning, before the statement's first job (``collect``): the local session
  marks the job group's future jobs cancelled, and the cancel is sent again until the
  statement has ended (without that, the shuffle stage that adaptive execution submits
  ran on for over a minute: this test failed at 60 s);
- before the statement started at all (the timer can fire while the driver still checks
  the statement's text): it is cancelled as it starts; a cancel left over when the
  connection goes back to the pool does not reach the next statement;
- on Spark Connect, when the first interrupt reaches the server before it holds the
  operation (and so finds nothing): the interrupt is sent again until the statement has
  ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests import engines

SLOW = "SELECT sum(id % 7) FROM range(0, 20000000000)"
#: A cancelled statement ends within this (a job cancelled at its start, or at the
#: retry's next interrupt: well under a second on a quiet machine; the rest is load).
STOPS_WITHIN_S = 60.0


class _Frame:
    """A DataFrame whose ``collect`` first runs ``before`` (the timer firing there)."""

    def __init__(self, frame: Any, before: Callable[[], None]) -> None:
        self._frame = frame
        self._before = before
        self.columns = frame.columns

    def collect(self) -> Any:
        self._before()
        return self._frame.collect()


def _run(conn: Any, sql: str = SLOW) -> tuple[float, list[Exception]]:
    """Run ``sql`` on ``conn`` in a thread; (seconds it took, what it raised)."""
    failed: list[Exception] = []

    def run() -> None:
        try:
            conn.run(sql)
        except Exception as e:
            failed.append(e)

    started = time.monotonic()
    statement = threading.Thread(target=run, daemon=True)
    statement.start()
    statement.join(STOPS_WITHIN_S)
    elapsed = time.monotonic() - started
    if statement.is_alive():  # not cancelled: free the cores for the tests after this one
        _cancel_all(conn.spark)
        statement.join(120)
    return elapsed, failed


def _cancel_all(spark: Any) -> None:
    if hasattr(spark, "interruptAll"):
        spark.interruptAll()
    if hasattr(spark, "sparkContext"):
        spark.sparkContext.cancelAllJobs()


def _local(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from gateway.sql.engines import spark_dbapi

    spark = engines.spark_warehouse(tmp_path_factory)
    return spark, spark_dbapi.Connection(spark, connect=False)


@engines.SLOW
@engines.SPARK_GROUP
def test_a_cancel_while_spark_plans_stops_the_statement_before_its_job(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark, conn = _local(tmp_path_factory)
    plan = spark.sql
    jobs: list[str] = []

    def cancelled_while_planned(sql: str) -> Any:
        conn.cancel()  # the statement's job group is set; no job exists yet
        frame = plan(sql)
        return _Frame(frame, lambda: jobs.append("collect"))

    monkeypatch.setattr(spark, "sql", cancelled_while_planned)
    elapsed, failed = _run(conn)
    monkeypatch.undo()
    assert failed and "CANCELLED" in str(failed[0]), failed
    assert jobs == [], "the statement sent its job after its cancel"
    assert elapsed < STOPS_WITHIN_S


@engines.SLOW
@engines.SPARK_GROUP
def test_a_cancel_before_spark_s_first_job_cancels_that_job_as_it_starts(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the planning inside ``collect`` takes seconds: a cancel then finds no
    job, and the job started afterwards is cancelled too (it once ran on for over ten
    minutes, holding both of local[2]'s cores), at the latest by the repeated cancel."""
    spark, conn = _local(tmp_path_factory)
    plan = spark.sql
    monkeypatch.setattr(spark, "sql", lambda sql: _Frame(plan(sql), conn.cancel))
    elapsed, failed = _run(conn)
    monkeypatch.undo()
    assert failed and "SPARK_JOB_CANCELLED" in str(failed[0]), failed
    assert elapsed < STOPS_WITHIN_S


@engines.SLOW
@engines.SPARK_GROUP
def test_a_cancel_before_the_statement_starts_cancels_it_and_no_later_one(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from gateway.sql.execute import StatementFailed, open_protected_engine, run_aggregate

    _, conn = _local(tmp_path_factory)
    conn.cancel()  # the timer fired before the statement reached Spark
    elapsed, failed = _run(conn)
    assert failed and "CANCELLED" in str(failed[0]), failed
    assert elapsed < STOPS_WITHIN_S
    assert conn.run("SELECT 1")[1] == [(1,)]  # that cancel was used up
    # Through the gateway's engine: a cancel that lands after its statement has ended
    # is dropped when the connection goes back to the pool.
    engine = open_protected_engine(
        engines.url("spark", tmp_path_factory), statement_timeout_ms=60_000
    )
    try:
        with engine.connect() as c:
            c.connection.dbapi_connection.cancel()  # type: ignore[union-attr]
        assert run_aggregate(engine, "SELECT 1", timeout_ms=60_000) == [(1,)]
        with pytest.raises(StatementFailed) as info:
            run_aggregate(engine, SLOW, timeout_ms=1)  # the timer fires at once
        assert info.value.timed_out
    finally:
        engine.dispose()


@engines.SLOW
@engines.CONNECT_GROUP
def test_spark_connect_interrupts_again_until_the_statement_has_ended(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.sql.engines import spark_dbapi

    spark = engines.connect_session(tmp_path_factory)
    conn = spark_dbapi.Connection(spark, connect=True)
    plan, interrupt = spark.sql, spark.interruptTag
    interrupts: list[str] = []

    def interrupt_tag(tag: str) -> Any:
        interrupts.append(tag)
        if len(interrupts) == 1:
            return []  # sent before the server held the operation: it found nothing
        return interrupt(tag)

    monkeypatch.setattr(spark, "interruptTag", interrupt_tag)
    monkeypatch.setattr(spark, "sql", lambda sql: _Frame(plan(sql), conn.cancel))
    elapsed, failed = _run(conn)
    monkeypatch.undo()
    assert failed, "the statement ran on after its cancel"
    assert len(interrupts) >= 2 and len(set(interrupts)) == 1, interrupts
    assert elapsed < STOPS_WITHIN_S
