"""Prometheus metrics: what `GET /metrics` exposes, correct across worker processes.

Under ``dpgate serve`` with several workers, ``gateway.server.serve`` points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before any worker starts; each worker
then writes its samples to memory-mapped files there and ``render()`` sums them, so a
scrape answered by any worker sees the counts of all of them. Without that variable
(tests, one process) the default in-process registry is used.

Labels name endpoints by their route (``/v1/admin/analysts/<name>``, never the raw path)
and analysts by name (never by key), so label sets stay small and secret-free.

What tells the operator's causes apart (docs/operations.md, "Alerts"):
``dpgate_backend_errors_total{backend="database"}`` counts only a protected database that
could not be reached (the query was refunded); a statement that reached it and did not
finish in time is a deadline miss (``dpgate_deadline_misses_total``, by stage and table), one that
failed otherwise a ``dpgate_statement_failures_total{cause="error"}``. Waits that queue
requests have their own histograms: the audit scope's lock, a ledger connection.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, event
from sqlalchemy.pool import QueuePool

import budget

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

HTTP_REQUESTS = Counter(
    "dpgate_http_requests",
    "HTTP requests by endpoint, method, status and outcome (ok or the error code).",
    ["endpoint", "method", "status", "outcome"],
)
HTTP_LATENCY = Histogram(
    "dpgate_http_request_duration_seconds",
    "Time from receiving a request to sending its response, by endpoint.",
    ["endpoint"],
    buckets=_LATENCY_BUCKETS,
)
QUERIES = Counter(
    "dpgate_queries",
    "Queries by analyst and outcome: answered, cached, or the refusal's error code.",
    ["analyst", "outcome"],
)
QUERY_LATENCY = Histogram(
    "dpgate_query_duration_seconds",
    "Time to answer or refuse a query, by outcome.",
    ["outcome"],
    buckets=_LATENCY_BUCKETS,
)
EPSILON_CHARGED = Counter(
    "dpgate_epsilon_charged",
    "ε charged by answered (not cached) queries, by analyst, in budget units: the sum of "
    "the rises of epsilon_spent. What is spent now is dpgate_budget_epsilon_spent.",
    ["analyst"],
)
BACKEND_ERRORS = Counter(
    "dpgate_backend_errors",
    "Requests that could not reach the protected database (refunded) or whose ledger "
    "database failed, by backend. A statement that reached the database and failed or "
    "missed its deadline is not counted here (dpgate_statement_failures_total, "
    "dpgate_deadline_misses_total).",
    ["backend"],
)
RELEASE_WAIT = Histogram(
    "dpgate_release_wait_seconds",
    "Time an answer that read protected rows was held until its release deadline "
    "(execution.timing: deadline); query duration minus this is the pipeline's own time.",
    buckets=_LATENCY_BUCKETS,
)
STATEMENT_FAILURES = Counter(
    "dpgate_statement_failures",
    "Queries that failed after their statement reached the protected database (charged), "
    "by cause: error, timeout (the deadline was too short for it), noising.",
    ["cause"],
)
AUDIT_CELLS_LEFT_OUT = Counter(
    "dpgate_audit_cells_left_out",
    "Cells of answered queries the post-audit left out (with earlier answers they would "
    "determine a group it cannot show to hold audit.min_group_size; the rest was released).",
)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
AUDIT_LOCK_WAIT = Histogram(
    "dpgate_audit_lock_wait_seconds",
    "Time a query waited for its audit scope's lock (held by another query of the same "
    "analyst, or of anyone under audit.scope: global, from its pre-audit to its release).",
    buckets=_WAIT_BUCKETS,
)
STATEMENT_PHASES = Histogram(
    "dpgate_statement_phase_seconds",
    "Where a query's time goes (execution.timing: deadline): admission (from the pipeline "
    "to its release moment being fixed: compiling, the audit lane, the pre-audit, the "
    "reservation — before the clock, so not padded), then, for a statement the cost model "
    "sizes, queue (from its release moment being fixed to its thread running: the interpreter "
    "shared with other requests' own work), slot (waiting for its statement slot), run "
    "(the statement itself, to its rows; an abandoned one counts its run to its deadline); "
    "after an answered statement: noise, turn (waiting for the post-audits of its scope's "
    "earlier tickets), post_audit (the post-audit and the answer remembered), record (the "
    "answer post-processed and its outcome committed to the ledger).",
    ["phase"],
    buckets=_LATENCY_BUCKETS,
)
DEADLINE_MISSES = Counter(
    "dpgate_deadline_misses",
    "Queries that missed their release deadline (charged, nothing released; the deadline "
    "is too tight for them, or the database is slow: not an outage), by stage — statement "
    "(still running at its deadline: abandoned or cancelled, reported as failed at the "
    "release moment), turn (an earlier query of the same audit scope was not done in "
    "time), release (the answer was ready only after its release moment and left late) "
    "— and by table.",
    ["stage", "table"],
)
PAST_DEADLINE = Counter(
    "dpgate_statements_past_deadline",
    "Statements that returned (an answer, an error or their cancellation) after their "
    "query's release moment, by table: that response left late, at a moment set by the "
    "database rather than by the deadline (docs/privacy.md, Timing).",
    ["table"],
)
#: From a few milliseconds (a cancel honoured at once) to minutes (an engine that plans
#: for long, or ignores the cancel).
_OVERRUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
ABANDONED_OVERRUN = Histogram(
    "dpgate_abandoned_statement_overrun_seconds",
    "Statements abandoned at their deadline (reported as failed at the release moment) "
    "that have since ended, by table, and how long after their deadline each ended: the "
    "time the engine kept working on a cancelled statement. Its _count counts the "
    "statements that ended after their deadline.",
    ["table"],
    buckets=_OVERRUN_BUCKETS,
)
ABANDONED_RUNNING = Gauge(
    "dpgate_abandoned_statements_running",
    "Statements abandoned at their deadline that are still running now (the engine has "
    "not honoured their cancel yet), by table, summed over workers.",
    ["table"],
    multiprocess_mode="livesum",
)
LEDGER_POOL_IN_USE = Gauge(
    "dpgate_ledger_pool_in_use",
    "Ledger database connections checked out of the pool now (summed over workers).",
    multiprocess_mode="livesum",
)
LEDGER_POOL_CAPACITY = Gauge(
    "dpgate_ledger_pool_capacity",
    "Ledger connections the pool may hold at once (size plus overflow), summed over workers.",
    multiprocess_mode="livesum",
)
LEDGER_POOL_WAIT = Histogram(
    "dpgate_ledger_pool_wait_seconds",
    "Time to get a ledger connection: queueing for a free one when the pool is exhausted, "
    "or opening a new one.",
    buckets=_WAIT_BUCKETS,
)
BUILD_INFO = Gauge(
    "dpgate_build_info",
    "Always 1; the labels say which dpgate and Python this worker runs.",
    ["version", "python"],
    multiprocess_mode="max",
)
RATE_LIMITED = Counter(
    "dpgate_rate_limited",
    "Requests refused by the rate limiter, by scope (address or analyst).",
    ["scope"],
)

WIRE_CONNECTIONS = Gauge(
    "dpgate_pgwire_connections",
    "PostgreSQL front end connections now, by state: authenticating (not yet logged in) "
    "or session (logged in; at most postgres_wire.max_connections).",
    ["state"],
    multiprocess_mode="livesum",
)
WIRE_REFUSED = Counter(
    "dpgate_pgwire_connections_refused",
    "PostgreSQL front end connections refused or closed for want of a slot, by reason: "
    "authenticating_per_address, authenticating_total, evicted (a pending connection of "
    "the address holding the most, closed to admit another's), too_many_sessions.",
    ["reason"],
)
WIRE_TIMEOUTS = Counter(
    "dpgate_pgwire_timeouts",
    "PostgreSQL front end connections closed by a timeout: authentication "
    "(postgres_wire.authentication_timeout_s) or idle_session (idle_session_timeout_s).",
    ["kind"],
)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PG"})
BACKEND_OF_CODE = {"database_unavailable": "database", "ledger_unavailable": "ledger"}


def multiprocess_dir() -> str | None:
    """The shared samples directory when running under several workers, else None."""
    return os.environ.get(MULTIPROC_ENV) or None


def record_request(
    *,
    endpoint: str,
    method: str,
    status: int,
    outcome: str,
    duration_s: float,
    charged: bool = False,
) -> None:
    """Count one HTTP request and its latency; count backend failures by their code.
    ``charged``: the error came after the statement reached the protected database (a
    statement failure or deadline miss, counted where it happened), not a backend down."""
    if method not in _METHODS:
        method = "OTHER"  # any token is a valid method: keep the label set bounded
    HTTP_REQUESTS.labels(endpoint, method, str(status), outcome).inc()
    HTTP_LATENCY.labels(endpoint).observe(duration_s)
    backend = BACKEND_OF_CODE.get(outcome)
    if backend is not None and not (charged and backend == "database"):
        BACKEND_ERRORS.labels(backend).inc()


def record_query(
    *, analyst: str | None, outcome: str, duration_s: float, epsilon_spent: float | None
) -> None:
    """Count one query by its outcome (``answered``, ``cached`` or an error code)."""
    name = analyst or ""
    QUERIES.labels(name, outcome).inc()
    QUERY_LATENCY.labels(outcome).observe(duration_s)
    if epsilon_spent:
        EPSILON_CHARGED.labels(name).inc(epsilon_spent)


def record_release_wait(seconds: float) -> None:
    RELEASE_WAIT.observe(seconds)


def record_statement_failure(cause: str) -> None:
    STATEMENT_FAILURES.labels(cause).inc()


def record_rate_limited(scope: str) -> None:
    RATE_LIMITED.labels(scope).inc()


def record_audit_lock_wait(seconds: float) -> None:
    AUDIT_LOCK_WAIT.observe(seconds)


def record_statement_phase(phase: str, seconds: float) -> None:
    STATEMENT_PHASES.labels(phase).observe(max(0.0, seconds))


def record_cells_left_out(n: int) -> None:
    AUDIT_CELLS_LEFT_OUT.inc(n)


def record_deadline_miss(stage: str, table: str) -> None:
    DEADLINE_MISSES.labels(stage, table).inc()


def record_past_deadline(table: str) -> None:
    PAST_DEADLINE.labels(table).inc()


class AbandonedStatements:
    """Counts one query's abandoned statement (``gateway.sql.execute.AbandonWatch``):
    running now, then how long after its deadline it ended."""

    def __init__(self, table: str) -> None:
        self.table = table

    def abandoned(self) -> None:
        ABANDONED_RUNNING.labels(self.table).inc()

    def ended(self, seconds_late: float) -> None:
        ABANDONED_RUNNING.labels(self.table).dec()
        ABANDONED_OVERRUN.labels(self.table).observe(seconds_late)


def record_build_info() -> None:
    """Set ``dpgate_build_info`` for this process (once per worker)."""
    import platform
    from importlib import metadata

    try:
        version = metadata.version("dpgate")
    except metadata.PackageNotFoundError:  # run from a source tree
        version = "unknown"
    BUILD_INFO.labels(version, platform.python_version()).set(1)


def watch_ledger_pool(engine: Engine) -> Callable[[float], None]:
    """Keep ``dpgate_ledger_pool_in_use`` and ``_capacity`` for the ledger's engine (its
    pool's check-out and check-in events); returns what observes a connection wait
    (``budget.Ledger.on_connection_wait``)."""
    pool = engine.pool
    if isinstance(pool, QueuePool):
        LEDGER_POOL_CAPACITY.inc(pool.size() + max(0, pool._max_overflow))

    # The pool's own count, read at each event (not +1/−1 per event: a connection out
    # when the listeners were attached would leave a count that drifts for ever). At
    # check-in the connection is not yet back in the pool, hence the −1.
    counted = callable(getattr(pool, "checkedout", None))

    def checkout(*_: Any) -> None:
        if counted:
            LEDGER_POOL_IN_USE.set(pool.checkedout())  # type: ignore[attr-defined]

    def checkin(*_: Any) -> None:
        if counted:
            LEDGER_POOL_IN_USE.set(max(0, pool.checkedout() - 1))  # type: ignore[attr-defined]

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "checkin", checkin)
    return LEDGER_POOL_WAIT.observe


def set_wire_connections(authenticating: int, sessions: int) -> None:
    WIRE_CONNECTIONS.labels("authenticating").set(authenticating)
    WIRE_CONNECTIONS.labels("session").set(sessions)


def record_wire_refusal(reason: str) -> None:
    WIRE_REFUSED.labels(reason).inc()


def record_wire_timeout(kind: str) -> None:
    WIRE_TIMEOUTS.labels(kind).inc()


class _BudgetCollector(Collector):
    """Gauges of every budget as the ledger reports it now (read at scrape time, so every
    worker shows the same figures as ``/v1/budget``, the CLI and the client)."""

    def __init__(self, statuses: Sequence[budget.BudgetStatus]) -> None:
        self.statuses = statuses

    def collect(self) -> Iterator[Metric]:
        what = "by analyst ((global): the dataset-wide budget), in its current period"
        families = {
            "epsilon": GaugeMetricFamily(
                "dpgate_budget_epsilon", f"The ε budget, {what}.", labels=["analyst"]
            ),
            "epsilon_spent": GaugeMetricFamily(
                "dpgate_budget_epsilon_spent",
                f"ε spent in budget units (what /v1/budget reports), {what}.",
                labels=["analyst"],
            ),
            "epsilon_remaining": GaugeMetricFamily(
                "dpgate_budget_epsilon_remaining", f"ε remaining, {what}.", labels=["analyst"]
            ),
            "delta_spent": GaugeMetricFamily(
                "dpgate_budget_delta_spent",
                f"δ spent by partition selection, {what}.",
                labels=["analyst"],
            ),
            "queries": GaugeMetricFamily(
                "dpgate_budget_queries", f"Queries charged, {what}.", labels=["analyst"]
            ),
        }
        ends = GaugeMetricFamily(
            "dpgate_budget_period_end_timestamp_seconds",
            "When the budget renews (Unix time), by analyst; absent without a period.",
            labels=["analyst"],
        )
        for status in self.statuses:
            for field, family in families.items():
                family.add_metric([status.name], float(getattr(status, field)))
            if status.period_ends_at is not None:
                ends.add_metric([status.name], status.period_ends_at.timestamp())
        yield from families.values()
        yield ends


def render(budgets: Sequence[budget.BudgetStatus] = ()) -> tuple[bytes, str]:
    """The exposition text of every metric (summed over workers) and its content type.

    ``budgets``: the ledger's budget statuses, shown as ``dpgate_budget_*`` gauges.
    """
    if multiprocess_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        text = generate_latest(registry)
    else:
        text = generate_latest(REGISTRY)
    if budgets:
        gauges = CollectorRegistry()
        gauges.register(_BudgetCollector(budgets))
        text += generate_latest(gauges)
    return text, CONTENT_TYPE_LATEST


def mark_process_dead(pid: int) -> None:
    """Forget a dead worker's live samples (gunicorn's ``child_exit`` hook calls this)."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)
