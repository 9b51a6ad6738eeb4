"""One person's influence on the exact aggregates dpgate computes (docs/design.md,
invariant 6): the kit of the join-key attacks (issue 31) and of the sensitivity property.

A real `Gateway` reads the protected database's catalogue as at start-up and compiles
each query as it would answer it (``Gateway.compile``: unique units, join keys, enforced
domains); the statement's exact result — what the noise is calibrated to cover — is then
read on the database D and on each neighbour D − one person. A neighbour is made inside a
transaction that deletes the person's rows from every table that holds them and is
rolled back after the statement ran, so one database serves every neighbour.

`assert_within_sensitivity` is the property the noise relies on: for every measure, the
sum over all cells of |exact(D) − exact(D − person)| is at most the measure's declared L1
sensitivity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import budget
from gateway.core.config import Config
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.pipeline.gateway import Gateway
from gateway.sql.compile import CompiledQuery, compile_plan

Cells = dict[tuple[Any, ...], tuple[int, ...]]
#: One person's rows: (table, column, value) — the rows of ``table`` whose ``column``
#: holds ``value`` (``column`` None: the row whose row id is ``value``).
Person = Sequence[tuple[str, str | None, Any]]


@dataclass(frozen=True)
class Compiled:
    sql: str
    plan: QueryPlan
    compiled: CompiledQuery


def config_for(url: str, tables: Mapping[str, Any], ledger: Path) -> Config:
    return parse_config(
        {"database": {"url": url}, "ledger": {"url": f"sqlite:///{ledger}"}, "tables": tables}
    )


def compile_all(config: Config, sqls: Iterable[str]) -> dict[str, Compiled]:
    """Each query as a gateway over ``config``'s database compiles it (its connections
    closed afterwards: DuckDB lets one process open a file one way only)."""
    ledger = budget.Ledger.from_url(config.ledger.url)
    gateway = Gateway(config, ledger=ledger)
    try:
        out = {}
        for sql in sqls:
            plan = gateway.planner.analyze(sql)
            assert isinstance(plan, QueryPlan), sql
            out[sql] = Compiled(sql, plan, gateway.compile(plan))
        return out
    finally:
        gateway.engine.dispose()
        ledger.close()


def compile_bypassing_the_refusal(config: Config, sql: str) -> Compiled:
    """``sql`` compiled as a gateway over ``config``'s database would, but with none of
    its privacy-unit paths refused as differently stored (``JoinKeys.mismatched``): the
    bounded statement dpgate ran before that refusal, to show the attack it stops."""
    ledger = budget.Ledger.from_url(config.ledger.url)
    gateway = Gateway(config, ledger=ledger)
    try:
        assert gateway.join_keys.mismatched, "nothing here is refused: no attack to show"
        plan = gateway.planner.analyze(sql)
        assert isinstance(plan, QueryPlan), sql
        keys = replace(gateway.join_keys, mismatched=frozenset())
        compiled = compile_plan(
            plan,
            gateway.config.tables[plan.table],
            gateway.dialect,
            unit_unique=plan.table in gateway.unique_units,
            join_keys=keys,
        )
        return Compiled(sql, plan, compiled)
    finally:
        gateway.engine.dispose()
        ledger.close()


def _normal(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == int(v) else float(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def cells(rows: Iterable[Sequence[Any]], compiled: CompiledQuery) -> Cells:
    """The result rows as key → measures (the unit count of partition selection aside)."""
    k, m = compiled.n_keys, compiled.n_measures
    return {
        tuple(_normal(v) for v in r[:k]): tuple(int(_normal(v) or 0) for v in r[k : k + m])
        for r in rows
    }


def _row_id(dialect: str) -> str:
    return "ctid" if dialect == "postgresql" else "rowid"


def answers(
    writer: sa.Engine,
    queries: Sequence[Compiled],
    person: Person | None,
    schema: str | None = None,
) -> list[Cells]:
    """Each query's exact cells on D (``person`` None) or on D − ``person``."""
    prep = writer.dialect.identifier_preparer
    out: list[Cells] = []
    with writer.connect() as conn:
        trans = conn.begin()
        try:
            for table, column, value in person or ():
                name = (
                    prep.quote(table)
                    if schema is None
                    else f"{prep.quote(schema)}.{prep.quote(table)}"
                )
                where = prep.quote(column) if column is not None else _row_id(writer.dialect.name)
                conn.execute(sa.text(f"DELETE FROM {name} WHERE {where} = :v"), {"v": value})
            for q in queries:
                rows = conn.exec_driver_sql(q.compiled.sql).fetchall()
                out.append(cells(rows, q.compiled))
        finally:
            trans.rollback()
    return out


def influence(before: Cells, after: Cells, measure: int) -> int:
    """Σ over cells of |before − after| for one measure (a missing cell counts 0)."""
    return sum(
        abs(
            before.get(k, (0,) * (measure + 1))[measure]
            - after.get(k, (0,) * (measure + 1))[measure]
        )
        for k in set(before) | set(after)
    )


def assert_within_sensitivity(q: Compiled, before: Cells, after: Cells, who: object) -> None:
    for i, m in enumerate(q.plan.measures):
        if not m.noised:
            continue
        moved = influence(before, after, i)
        assert moved <= m.sensitivity.l1, (
            f"removing {who!r} moved measure {i} ({m.kind}) of {q.sql!r} by {moved}, "
            f"more than its sensitivity {m.sensitivity.l1}\n{q.compiled.sql}"
        )
