"""The cost model: how long a query's statement may take, from public facts only.

The release deadline of a query (``gateway.pipeline.timing``) is what this model says its
statement needs, times a margin. Everything it reads is public: the config and the plan,
never the protected rows nor the running time of any statement (docs/privacy.md,
"Timing"):

- the query's plan and its compiled statement (a function of the plan and the config):
  which tables it reads, how many keys it groups each row by, how many operations each
  row evaluates (``gateway/sql/row_work.py``: domain filters, a quantile's bucket, a
  LIKE's pattern all weigh in), how many window functions (the read
  bound) sort, its joins, how many (group, bucket) rows its quantiles' fine histograms
  can hold (``histogram_rows``) and how many of them, those near the target rank, they
  bring back for the exponential mechanism to weigh (``histogram_returned``);
- per table, the **declared row count** ``tables.<t>.rows`` (an upper bound the admin
  declares public, like a column's bounds; ``dpgate config check --measure`` counts
  and suggests it), and whether the read bound needs a sort (the unit column is not
  kept unique by the database: catalogue facts, read at start-up);
- per engine, **per-row costs** (``execution.row_ns``, ``op_ns``, ``sort_ns``,
  ``join_ns``, ``group_ns``, ``base_ms``): built-in figures fitted on a loaded 2-core
  machine, or the admin's own;
- the gateway's concurrency: how many queries of this process are in flight when the
  query starts (a function of when requests arrived and when earlier answers were
  released, both public), against the machine's CPU count — at most one statement per
  CPU runs at a time (``gateway.pipeline.timing.StatementSlots``), so a statement's own factor
  counts at most the other slots and one thread of the gateway's own work;
- the machine's load: its 1-minute load average, in steps of √2 per CPU, added to the
  in-flight statements' share. This one is
  not strictly public: the run queue holds this gateway's own statements too, whose
  running time can depend on the rows. One person's share of it is bounded (a bounded
  number of their rows read, a bounded cost per row, every attempt charged) and is
  averaged over a minute with everything else the machine runs, then rounded to a
  step; docs/privacy.md ("Timing") weighs it against what it buys (misses — charged
  failures — stay rare when the machine is busy).

Nothing is measured on the protected data at start-up: two gateways started on
neighbouring databases with the same config give every query the same deadline. A table
without a declared ``rows`` gets the fixed fallback deadline (``FALLBACK_DEADLINE_MS``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.core.config import ExecutionConfig, TableConfig
from gateway.core.plan import QueryPlan
from gateway.sql.compile import (
    HISTOGRAM_WINDOWS,
    WINDOW_MARGIN,
    CompiledQuery,
    widest_window,
)


@dataclass(frozen=True)
class EngineCosts:
    """Per-row costs of one engine, in nanoseconds, and its fixed cost per statement."""

    row_ns: float  # reading one row
    op_ns: float  # one operation of the compiled statement (row_work.py), on one row
    sort_ns: float  # one row's share of a window's sort, per log2(rows) (the read bound)
    join_ns: float  # one row's probe of a lookup table
    base_ms: float  # a statement's fixed cost (connection, planning, round trips)
    group_ns: float = 0.0  # one row's share of grouping, per GROUP BY key


#: Built-in figures (the admin sets an engine's own in ``execution:``; ``dpgate config
#: check --measure`` prints what the demo-shaped queries cost on it). SQLite's were fitted
#: to the demo's queries on a 2-core machine and rounded up (``op_ns`` and ``group_ns``
#: on a quiet one: they put a demo statement's estimate at 1.7–1.9 times its running
#: time; ``deadline_margin`` is left for load); the others are scaled from it, generously
#: where the engine plans for long (Spark).
ENGINE_COSTS: Mapping[str, EngineCosts] = {
    "sqlite": EngineCosts(row_ns=64, op_ns=8, sort_ns=64, join_ns=512, base_ms=1, group_ns=512),
    "duckdb": EngineCosts(row_ns=32, op_ns=4, sort_ns=32, join_ns=128, base_ms=3, group_ns=128),
    "postgres": EngineCosts(row_ns=128, op_ns=8, sort_ns=64, join_ns=512, base_ms=3, group_ns=512),
    "clickhouse": EngineCosts(
        row_ns=32, op_ns=4, sort_ns=32, join_ns=128, base_ms=10, group_ns=128
    ),
    "spark": EngineCosts(
        row_ns=256, op_ns=16, sort_ns=128, join_ns=1024, base_ms=3000, group_ns=1024
    ),
}
GENERIC_COSTS = EngineCosts(
    row_ns=512, op_ns=32, sort_ns=256, join_ns=2048, base_ms=20, group_ns=2048
)


#: One row of a quantile's fine histogram (``gateway/sql/compile.py``): fetched from the
#: driver, turned into level runs and weighed by the exponential mechanism
#: (``mechanisms.histogram_quantile``) before the release moment — measured at about
#: 13 µs per non-empty bucket on a loaded 2-core machine, rounded up.
HISTOGRAM_ROW_NS = 20_000


def histogram_rows(plan: QueryPlan, rows: int) -> int:
    """The most (group, bucket) rows the statement's quantile histograms can hold in the
    database, from public facts: per quantile, one per (group, bucket) that holds a
    value — at most the declared rows, and at most the buckets times the groups where
    the keys are public. The database sums over them in bucket order (two window
    functions per quantile, ``HISTOGRAM_WINDOWS``) to keep those near the target."""
    quantiles = [o.quantile for o in plan.outputs if o.quantile is not None]
    if not quantiles:
        return 0
    return sum(min(rows, q.buckets * max(1, _groups(plan, rows))) for q in quantiles)


def histogram_returned(plan: QueryPlan, rows: int) -> int:
    """The most rows the quantile histograms can bring back for the mechanism to weigh:
    per quantile and group, the buckets near the target rank, at most 2·(W + margin) + 2
    for the widest window W any ε needs (``gateway.sql.compile.widest_window``), and
    never more than the histogram holds."""
    quantiles = [o.quantile for o in plan.outputs if o.quantile is not None]
    groups = max(1, _groups(plan, rows))
    total = 0
    for q in quantiles:
        per_cell = 2 * (math.ceil(widest_window(q)) + WINDOW_MARGIN) + 2
        total += min(rows, q.buckets * groups, per_cell * groups)
    return total


def _groups(plan: QueryPlan, rows: int) -> int:
    if all(k.domain is not None for k in plan.group_keys):
        return math.prod(len(k.domain or ()) for k in plan.group_keys)
    return rows


@dataclass(frozen=True)
class TableCost:
    """The public cost facts of one table: its declared rows, whether reading it sorts."""

    rows: int | None
    sorts: bool


@dataclass(frozen=True)
class CostModel:
    """Per-table cost facts, the engine's per-row costs and the machine's CPU count."""

    tables: Mapping[str, TableCost]
    engine: EngineCosts
    cpus: int

    def statement_ms(self, plan: QueryPlan, compiled: CompiledQuery) -> float | None:
        """What the plan's statement ``compiled`` (compiled from the plan and the config:
        public) costs alone on the machine, in ms — an estimate from public facts; the
        caller adds the margin and the concurrency —, or ``None`` when a table it reads
        has no declared row count.

        Per row of the anchor table: reading it, and evaluating the statement's
        operations (``compiled.row_ops``: domain filters, a quantile's bucket, a LIKE's
        pattern), and grouping it by each GROUP BY key; per window function (the
        read bound of a table whose unit is not unique), a sort of the largest table
        read; per lookup, reading it and one probe per anchor row; per quantile, two sorts
        of the most (group, bucket) rows its histogram can hold (``histogram_rows``), and
        per row it can return, its share of the mechanism's work
        (``histogram_returned``)."""
        anchor = self.tables.get(plan.table)
        if anchor is None or anchor.rows is None:
            return None
        e = self.engine
        sql = compiled.sql
        ns = anchor.rows * (
            e.row_ns + compiled.row_ops * e.op_ns + len(plan.group_keys) * e.group_ns
        )
        largest = anchor.rows
        if plan.join is not None:
            for t in plan.join.tables[1:]:
                lookup = self.tables.get(t.name.lower())
                if lookup is None or lookup.rows is None:
                    return None
                ns += lookup.rows * e.row_ns + anchor.rows * e.join_ns
                largest = max(largest, lookup.rows)
        quantiles = sum(1 for o in plan.outputs if o.quantile is not None)
        windows = sql.upper().count(" OVER (") - HISTOGRAM_WINDOWS * quantiles
        ns += windows * largest * math.log2(max(2, largest)) * e.sort_ns
        held = histogram_rows(plan, anchor.rows)
        ns += HISTOGRAM_WINDOWS * held * math.log2(max(2, held)) * e.sort_ns
        ns += histogram_returned(plan, anchor.rows) * HISTOGRAM_ROW_NS
        return e.base_ms + ns / 1e6

    def load_factor(self, in_flight: int, load: float = 0.0) -> float:
        """How much slower a statement runs when it shares the machine's CPUs with
        ``in_flight`` statements of this process (itself included) on top of a run queue
        ``load`` long (the machine's 1-minute load average, rounded up to a power of √2
        per CPU, so that it moves the deadline in steps): the two add up."""
        cpus = max(1, self.cpus)
        machine = load / cpus
        if machine > 1:
            machine = 2 ** (math.ceil(2 * math.log2(machine)) / 2)
        elif machine > 0:
            machine = 1.0
        return max(1.0, machine + in_flight / cpus)


def build_model(
    execution: ExecutionConfig,
    tables: Mapping[str, TableConfig],
    dialect: str,
    unique_units: frozenset[str] | set[str],
) -> CostModel:
    """The cost model of a config on an engine (``dialect``: sqlglot's name); the tables
    in ``unique_units`` are read without a sort (their unit is one row, by the catalogue)."""
    base = ENGINE_COSTS.get(dialect, GENERIC_COSTS)
    engine = EngineCosts(
        row_ns=_either(execution.row_ns, base.row_ns),
        op_ns=_either(execution.op_ns, base.op_ns),
        sort_ns=_either(execution.sort_ns, base.sort_ns),
        join_ns=_either(execution.join_ns, base.join_ns),
        base_ms=_either(execution.base_ms, base.base_ms),
        group_ns=_either(execution.group_ns, base.group_ns),
    )
    costs = {
        key: TableCost(
            rows=t.rows,
            sorts=t.privacy_unit is not None and not t.public and key not in unique_units,
        )
        for key, t in tables.items()
    }
    return CostModel(tables=costs, engine=engine, cpus=cpu_count())


def _either(configured: float | None, default: float) -> float:
    return configured if configured is not None else default


def machine_load() -> float:
    """The machine's 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return 0.0


def cpu_count() -> int:
    """The CPUs this process may run on (public: the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1
