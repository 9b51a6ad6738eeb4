"""Calibration: the cost model's coefficients measured on the protected database
(``dpgate config check --measure``).

The release deadline of a query is the cost model's estimate of its statement
(``gateway/pipeline/cost_model.py``) times a margin, and the estimate rests on per-row costs of
the engine (``execution.row_ns``, ``op_ns``, ``sort_ns``, ``join_ns``, ``group_ns``,
``base_ms``) and
declared row counts (``tables.<t>.rows``). Built-in figures fit a loaded 2-core machine
running SQLite; this module measures them where the gateway will run:

- per table, its row count (``COUNT(*)`` on the stored table), suggested as ``rows``
  rounded up (two significant digits);
- per table and query shape, the running time of the statement dpgate compiles for it
  (the real compiler, the real catalogue facts: a table whose unit the database keeps
  unique gets no window; the engine's own plan, with whatever indexes it has): a count, a
  bounded SUM, a long WHERE (per-operation work), a GROUP BY over declared values (the
  group bound), a quantile (its grid of cumulative counts) and a join along each
  declared reference; the median of ``repeat`` runs after a warm-up run;
- the coefficients: a non-negative least-squares fit of the model to every measured
  shape (relative error), its per-row cost raised until the model covers every
  measurement, each rounded up to a power of two.

Privacy. The measurement runs statements on the protected rows and times them, so its
figures are not public facts: they are shown to the admin, who is trusted, and nothing
is stored. They enter the release deadlines only when the admin writes them into the
config, which makes them public like a column's declared bounds (docs/privacy.md,
"Timing": calibration). That is why the gateway does not calibrate itself at start-up
or on a new ``data_version``: the deadline would then follow running times measured on
the rows without anyone having declared them. What the rounded figures can say about
one person is small — a statement reads at most ``max_rows_read_per_unit`` of their
rows, the fit is over whole-table times, and each coefficient moves only in powers of
two — but the choice to publish them is the admin's.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.joins import matched_lookups
from gateway.pipeline.cost_model import EngineCosts
from gateway.sql import dialects
from gateway.sql.compile import CompiledQuery

#: Runs of each statement after its warm-up run; the median is kept.
REPEAT = 5
#: The per-row coefficients, in the order of the fit's columns.
COEFFICIENTS = ("row_ns", "op_ns", "sort_ns", "join_ns", "group_ns")
#: Conditions in the long WHERE of the per-operation shape (each a comparison of a
#: bounded column with a literal: the analyst's cheapest per-row work, written out long).
LONG_WHERE_TERMS = 24


@dataclass(frozen=True)
class Shape:
    """One measured statement: its table, what it is, its SQL and features, its time."""

    table: str
    name: str
    sql: str
    rows: int  # rows of the anchor table
    lookup_rows: int  # rows of the joined tables (0: no join)
    windows: int  # window functions in the statement (sorts)
    largest: int  # rows of the largest table it reads (what a window sorts)
    ms: float  # median running time
    group_keys: int = 0  # GROUP BY keys of the analyst's query
    lookups: int | None = None  # tables joined (None: one if ``lookup_rows``, else none)
    row_ops: float = 0.0  # operations per row read (``gateway/sql/row_work.py``)

    def features(self) -> list[float]:
        """Nanoseconds per unit of each coefficient (``COEFFICIENTS``), as in
        ``CostModel.statement_ms``."""
        joins = float(self.lookups if self.lookups is not None else bool(self.lookup_rows))
        return [
            float(self.rows + self.lookup_rows),
            float(self.rows * self.row_ops),
            self.windows * self.largest * math.log2(max(2, self.largest)),
            joins * self.rows,
            float(self.rows * self.group_keys),
        ]


@dataclass(frozen=True)
class Calibration:
    """What ``measure`` found: row counts, shapes, fitted and rounded coefficients."""

    engine: str
    counts: Mapping[str, int]
    shapes: tuple[Shape, ...]
    base_ms: float  # the measured fixed cost of a statement
    fitted: EngineCosts  # covering every shape, unrounded
    suggested: EngineCosts  # rounded up to powers of two: what to put in the config
    load: float  # the machine's 1-minute load average when measuring
    cpus: int
    #: the slowest run of any shape with one copy per CPU running at once, over the
    #: suggested model's estimate of it (``concurrent_spread``); 0: not measured
    spread: float = 0.0

    def suggested_margin(self) -> float:
        """``execution.deadline_margin`` to declare: the measured ``spread``, with a
        quarter more for what the measurement did not meet, rounded up to a half (at
        least 1)."""
        return max(1.0, math.ceil(2 * 1.25 * self.spread) / 2)

    def suggested_rows(self, table: str) -> int:
        """``tables.<t>.rows`` to declare: the count rounded up to two significant digits."""
        return round_rows_up(self.counts[table])

    def estimate_ms(self, shape: Shape, costs: EngineCosts) -> float:
        """The model's estimate of ``shape`` with ``costs`` (as ``CostModel`` computes it)."""
        return estimate_ms(shape, costs)


def estimate_ms(shape: Shape, costs: EngineCosts) -> float:
    """The model's estimate of ``shape`` with ``costs`` (as ``CostModel`` computes it)."""
    ns = sum(f * c for f, c in zip(shape.features(), _per_row(costs), strict=True))
    return costs.base_ms + ns / 1e6


def measure(
    tables: Mapping[str, TableConfig],
    compile_sql: Callable[[str], CompiledQuery],
    run: Callable[[str], object],
    engine: str,
    *,
    repeat: int = REPEAT,
) -> Calibration:
    """Measure every table of ``tables`` (see the module doc). ``compile_sql(sql)`` gives
    the statement dpgate compiles for an analyst's query (its text and row operations),
    ``run(statement)`` runs one on the protected database; both are the gateway's own."""
    base_ms = _timed(run, "SELECT 1", repeat)
    counts: dict[str, int] = {}
    for key, t in tables.items():
        rows = run(count_rows_sql(t, engine))
        assert isinstance(rows, list)
        counts[key] = int(rows[0][0])
    shapes: list[Shape] = []
    for key, t in tables.items():
        if t.public:
            continue
        for name, sql, joined in shape_queries(t, tables):
            compiled = compile_sql(sql)
            statement = compiled.sql
            # the lookups the statement reads: the one the shape joins, and those every
            # query on the table joins (``every_row_matches``), as the cost model counts
            read = {n.lower() for n in matched_lookups(tables, key)}
            if joined:
                read.add(joined)
            lookup = sum(counts.get(name_, 0) for name_ in read)
            shapes.append(
                Shape(
                    table=key,
                    name=name,
                    sql=statement,
                    rows=counts[key],
                    lookup_rows=lookup,
                    windows=statement.upper().count(" OVER ("),
                    largest=max(counts[key], lookup),
                    ms=_timed(run, statement, repeat),
                    row_ops=compiled.row_ops,
                    group_keys=1 if " GROUP BY " in sql.upper() else 0,
                    lookups=len(read),
                )
            )
    fitted = fit(shapes, base_ms)
    suggested = rounded_up(fitted)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return Calibration(
        engine=engine,
        counts=counts,
        shapes=tuple(shapes),
        base_ms=base_ms,
        fitted=fitted,
        suggested=suggested,
        load=_load(),
        cpus=cpus,
        spread=concurrent_spread(shapes, suggested, run, cpus, repeat),
    )


def concurrent_spread(
    shapes: Sequence[Shape],
    costs: EngineCosts,
    run: Callable[[str], object],
    copies: int,
    repeat: int,
) -> float:
    """How much slower than the model's estimate a statement runs when the machine is as
    busy as dpgate makes it: each shape run ``repeat`` times by ``copies`` threads at
    once (one statement slot per CPU, ``gateway.pipeline.timing.StatementSlots``); the slowest
    run of any shape over its estimate with ``costs``."""
    worst = 0.0
    n = max(1, copies)
    for shape in shapes:
        barrier = threading.Barrier(n)

        def runs(statement: str, start_together: threading.Barrier = barrier) -> list[float]:
            start_together.wait()
            out = []
            for _ in range(max(1, repeat)):
                start = time.perf_counter()
                run(statement)
                out.append((time.perf_counter() - start) * 1000)
            return out

        with ThreadPoolExecutor(n) as pool:
            walls = [w for ws in pool.map(runs, [shape.sql] * n) for w in ws]
        worst = max(worst, max(walls) / max(estimate_ms(shape, costs), 1e-3))
    return worst


def shape_queries(
    t: TableConfig, tables: Mapping[str, TableConfig]
) -> list[tuple[str, str, str | None]]:
    """The analyst queries measured on table ``t``: (shape name, SQL, the table it joins)."""
    name = t.name
    bounded = [
        c.name
        for c in t.columns.values()
        if c.type in ("integer", "real")
        and c.lower is not None
        and c.upper is not None
        and c.name != t.privacy_unit
    ]
    grouped = [
        c.name for c in t.columns.values() if c.values is not None and c.name != t.privacy_unit
    ]
    out: list[tuple[str, str, str | None]] = [("count", f"SELECT COUNT(*) FROM {name}", None)]
    if bounded:
        col = bounded[0]
        lower = t.columns[col].lower
        out.append(("sum", f"SELECT SUM({col}) FROM {name}", None))
        terms = " OR ".join(f"{col} < {lower} - {i + 1}" for i in range(LONG_WHERE_TERMS))
        out.append(("long where", f"SELECT SUM({col}) FROM {name} WHERE NOT ({terms})", None))
        out.append(("quantile", f"SELECT MEDIAN({col}) FROM {name}", None))
    if grouped:
        key = grouped[0]
        out.append(("group by", f"SELECT {key}, COUNT(*) FROM {name} GROUP BY {key}", None))
    for ref in t.references:
        target = tables.get(ref.table.lower())
        if target is None:
            continue
        out.append(
            (
                f"join {target.name}",
                f"SELECT COUNT(*) FROM {name} a JOIN {target.name} b ON a.{ref.column} = "
                f"b.{ref.target}",
                ref.table.lower(),
            )
        )
    return out


def fit(shapes: Sequence[Shape], base_ms: float) -> EngineCosts:
    """Non-negative coefficients (``COEFFICIENTS``) that fit the shapes' times less
    ``base_ms`` best in relative error, the per-row cost then raised until the model's
    estimate reaches every measured time: the margin is left for load and jitter only."""
    if not shapes:
        return EngineCosts(row_ns=0, op_ns=0, sort_ns=0, join_ns=0, base_ms=base_ms, group_ns=0)
    a = np.array([s.features() for s in shapes], dtype=float)
    y = np.array([max(0.0, s.ms - base_ms) * 1e6 for s in shapes])
    weight = 1 / np.maximum(y, 1e3)  # relative error, a microsecond at least
    best: np.ndarray | None = None
    best_err = math.inf
    used = [j for j in range(a.shape[1]) if a[:, j].any()]
    # the non-negative least-squares solution is the best of the unconstrained fits on
    # the subsets of columns whose solution is non-negative (five columns: 31 subsets)
    for k in range(1, len(used) + 1):
        for cols in itertools.combinations(used, k):
            sub = a[:, cols] * weight[:, None]
            sol, *_ = np.linalg.lstsq(sub, y * weight, rcond=None)
            if (sol < 0).any():
                continue
            coef = np.zeros(a.shape[1])
            coef[list(cols)] = sol
            err = float(np.sum(((a @ coef - y) * weight) ** 2))
            if err < best_err:
                best, best_err = coef, err
    coef = best if best is not None else np.zeros(a.shape[1])
    if not coef.any():  # nothing above the fixed cost: the reading alone covers it
        coef[0] = max(float(np.max(y / np.maximum(a[:, 0], 1))), 1e-3)
    # every shape reads rows: the per-row cost is raised until each shape is covered
    deficit = (y - a @ coef) / np.maximum(a[:, 0], 1)
    coef[0] += max(0.0, float(np.max(deficit)))
    row, op, sort, join, group = (float(c) for c in coef)
    return EngineCosts(
        row_ns=row, op_ns=op, sort_ns=sort, join_ns=join, base_ms=base_ms, group_ns=group
    )


def rounded_up(costs: EngineCosts) -> EngineCosts:
    """Each coefficient rounded up to a power of two (a coarse figure to publish; a zero
    stays the smallest step, 1/64)."""
    return EngineCosts(
        row_ns=power_of_two_up(costs.row_ns),
        op_ns=power_of_two_up(costs.op_ns),
        sort_ns=power_of_two_up(costs.sort_ns),
        join_ns=power_of_two_up(costs.join_ns),
        base_ms=power_of_two_up(costs.base_ms),
        group_ns=power_of_two_up(costs.group_ns),
    )


def power_of_two_up(x: float) -> float:
    """The least power of two ≥ ``x`` (at least 1/64)."""
    return float(2 ** math.ceil(math.log2(max(x, 1 / 64))))


def round_rows_up(n: int) -> int:
    """``n`` rounded up to two significant digits (at least 10)."""
    if n < 100:
        return max(10, -(-n // 10) * 10)
    step = 10 ** (len(str(n)) - 2)
    return -(-n // step) * step


def _per_row(costs: EngineCosts) -> list[float]:
    return [costs.row_ns, costs.op_ns, costs.sort_ns, costs.join_ns, costs.group_ns]


def _timed(run: Callable[[str], object], sql: str, repeat: int) -> float:
    run(sql)  # warm-up: page cache, plan cache
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        run(sql)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def count_rows_sql(t: TableConfig, engine: str) -> str:
    """``SELECT COUNT(*)`` of a declared table as the database names it, in ``engine``'s
    dialect (sqlglot's name)."""
    table = exp.Table(
        this=exp.to_identifier(t.sql_name, quoted=True),
        db=exp.to_identifier(t.schema, quoted=True) if t.schema else None,
    )
    return exp.select(exp.Count(this=exp.Star())).from_(table).sql(dialect=dialects.dialect(engine))


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return 0.0
