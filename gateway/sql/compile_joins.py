"""The SQL of a join's relation (docs/design.md, "Joins"; a part of ``gateway/sql/compile.py``).

Each table is read on its rows inside its declared domain; each lookup is cut to one row
per key; the tables are joined as the query wrote it. Whether that keeps every anchor row
at most once depends on the join's ``=`` being the equality the cut (or a UNIQUE
constraint) groups by, which the catalogue alone does not promise (issue 31,
``gateway/sql/join_keys.py``). Each reference is compiled one of three ways:

- *proven* (``JoinKeys.unique`` or ``.consistent``): the key compared as stored, cut by
  it unless the database keeps it unique;
- *canonical* (SQLite, every reference not proven unique): both sides compared as
  ``CASE WHEN typeof(x) = '<class>' THEN x END`` for the storage class of the declared
  type, and the lookup cut by that value. A CASE has no affinity and no collation
  (https://sqlite.org/datatype3.html, 4.2 and 7.1), so ``=`` compares two values of one
  storage class as they are — the identity of integers, of texts byte by byte (BINARY),
  of reals — which is also how PARTITION BY groups them. Values of another storage class
  (``'05'`` in a column declared integer) match nothing;
- *unproven* (any other engine): the key compared and cut as stored. Such a join may
  repeat an anchor row, so ``multiplies`` says so and the compiler bounds each unit's
  rows after the join whatever the catalogue says (a table with row-level privacy gets a
  unit per anchor row, ``ROW_UNIT``).

A privacy-unit path whose two columns are stored differently (``JoinKeys.mismatched``) is
refused instead: bounding after the join keeps each anchor unit's rows bounded, but such
a join can attach one person's row to several other persons' rows, which no bound on the
anchor's units covers. The refusal is decided from the config and the catalogue (schema
metadata, the same for every neighbouring database), before anything is charged.

Why the contribution bound then holds: docs/privacy.md, "Joins".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from gateway.core.config import ColumnConfig, TableConfig
from gateway.core.domain import row_filter
from gateway.core.errors import UnsupportedQuery
from gateway.core.joins import relation_column
from gateway.core.plan import JoinPlan, QueryPlan
from gateway.sql.join_keys import JoinKeys

KEY_RANK = "dp_key_rank"
JOIN_KEY = "dp_join_key"
#: The unit of a row-level anchor's relation when the join may repeat its rows: the
#: anchor row's number, given before the join.
ROW_UNIT = "dp_row"

#: SQLite storage classes of each declared type (``typeof``).
_SQLITE_CLASS = {
    "integer": "integer",
    "boolean": "integer",
    "real": "real",
    "text": "text",
    "date": "text",
}


@dataclass(frozen=True)
class _Lookup:
    """How one JOIN is compiled: the lookup it brings, the referencing side, the mode."""

    table: str  # the lookup (lower case)
    parent: str  # the referencing table (lower case)
    parent_column: str
    mode: str  # "unique" | "consistent" | "canonical" | "unproven"


def _lookups(join: JoinPlan, keys: JoinKeys, dialect: str) -> list[_Lookup]:
    """For each step of ``join``, in order, how its reference is compiled."""
    configs = {t.name.lower(): t for t in join.tables}

    def refers(table: str, column: str, target_table: str, target: str) -> bool:
        return any(
            r.column.lower() == column.lower()
            and r.table.lower() == target_table
            and r.target.lower() == target.lower()
            for r in configs[table].references
        )

    out: list[_Lookup] = []
    for step in join.steps:
        if refers(step.other, step.other_column, step.table, step.column):
            lookup, parent, column = step.table, step.other, step.other_column
        else:
            lookup, parent, column = step.other, step.table, step.column
        ref = (parent, column.lower())
        if ref in keys.mismatched:
            shown = {t.name.lower(): t.name for t in join.tables}
            raise UnsupportedQuery(
                f"the join of {shown[parent]}.{column} to {shown[lookup]}'s privacy unit is "
                "not supported: the database stores the two columns differently, so its "
                "= could join one person's rows to another's (the admin's `dpgate config "
                "check` names the difference)",
                construct="privacy-unit path between differently stored columns",
            )
        if ref in keys.uncomparable:
            shown = {t.name.lower(): t.name for t in join.tables}
            raise UnsupportedQuery(
                f"the join of {shown[parent]}.{column} to {shown[lookup]} is not supported: "
                "the database stores the two columns as types it cannot compare (the "
                "admin's `dpgate config check` names them)",
                construct="join between columns of types the database cannot compare",
            )
        if ref in keys.unique:
            mode = "unique"
        elif dialect == "sqlite":
            mode = "canonical"
        elif ref in keys.consistent:
            mode = "consistent"
        else:
            mode = "unproven"
        out.append(_Lookup(lookup, parent, column, mode))
    return out


def multiplies(plan: QueryPlan, keys: JoinKeys, dialect: str) -> bool:
    """Whether the relation of ``plan``'s join may hold an anchor row more than once."""
    if plan.join is None:
        return False
    return any(lk.mode == "unproven" for lk in _lookups(plan.join, keys, dialect))


def with_row_unit(relation: TableConfig) -> TableConfig:
    """A row-level relation with the anchor row's number as its unit (one row each)."""
    columns = dict(relation.columns)
    columns[ROW_UNIT] = ColumnConfig(name=ROW_UNIT, type="integer", nullable=False)
    return replace(
        relation,
        columns=columns,
        privacy_unit=ROW_UNIT,
        max_rows_per_unit=1,
        max_groups_per_unit=None,
    )


def joined(plan: QueryPlan, keys: JoinKeys, dialect: str, *, row_unit: bool) -> exp.Expr:
    """The relation of a join: the query's joins in its own order, over each table's rows
    inside its declared domain, a lookup's cut to one row per key (the first by its
    declared values: a deterministic choice) unless the database provably keeps the key
    unique. Only the relation's columns the query reads (and the unit) are carried out
    of it; ``row_unit``: and the anchor row's number, as ``ROW_UNIT``."""
    join = plan.join
    assert join is not None
    nodes = [plan.where] if plan.where is not None else []
    nodes += [k.expression for k in plan.group_keys]
    nodes += [m.expression for m in plan.measures if m.expression is not None]
    read = {c.name for n in nodes for c in n.find_all(exp.Column)}
    read.add(join.relation.privacy_unit or "")
    steps = _lookups(join, keys, dialect)
    lookups = {lk.table: lk for lk in steps}
    position = {t.name.lower(): i for i, t in enumerate(join.tables)}
    anchor = join.relation.name.lower()
    sides: list[exp.Expr] = []
    columns: list[exp.Expr] = []
    for i, (table, key) in enumerate(zip(join.tables, join.keys, strict=True)):
        alias = f"t{i}"
        name = table.name.lower()
        own = name == anchor
        lookup = lookups.get(name) if key is not None else None
        if lookup is None:
            rows = _side(table, dialect, row_unit=row_unit and own)
        else:
            rows = _lookup_side(table, key or "", lookup.mode)
        sides.append(exp.Subquery(this=rows, alias=exp.TableAlias(this=exp.to_identifier(alias))))
        for column in table.columns:
            shown = column if own else relation_column(name, column)
            if shown in read:
                columns.append(
                    exp.alias_(exp.column(column, table=alias, quoted=True), shown, quoted=True)
                )
        if own and row_unit:
            columns.append(
                exp.alias_(exp.column(ROW_UNIT, table=alias, quoted=True), ROW_UNIT, quoted=True)
            )
    if not columns:  # COUNT(*) of a row-level anchor reads no column
        columns.append(exp.alias_(exp.Literal.number(1), "dp_row_read", quoted=True))
    query = exp.select(*columns).from_(sides[0], copy=False)
    parents = {lk.parent for lk in steps}
    for i, (step, lk, side) in enumerate(zip(join.steps, steps, sides[1:], strict=True)):
        lookup_name = lk.table
        parent_side = f"t{position[lk.parent]}"
        parent_column = exp.column(lk.parent_column, table=parent_side, quoted=True)
        key_side = f"t{position[lookup_name]}"
        table = join.tables[position[lookup_name]]
        key_name = join.keys[position[lookup_name]] or ""
        left: exp.Expr = parent_column
        if lk.mode == "canonical":
            left = _canonical(parent_column, table.columns[key_name].type)
        brings_lookup = position[lookup_name] == i + 1  # (not the anchor, joined to it)
        if (
            step.kind != "left"
            and brings_lookup
            and lookup_name not in parents
            and not _reads(table, read)
        ):
            # an inner join whose lookup only filters (none of its columns is read, no
            # join hangs off it): the same anchor rows, each once, as a semi-join
            listed = exp.Subquery(this=_lookup_keys(table, key_name, lk.mode))
            query = query.where(exp.In(this=left, query=listed), copy=False)
            continue
        if lk.mode == "canonical":
            right: exp.Expr = exp.column(JOIN_KEY, table=key_side, quoted=True)
        else:
            right = exp.column(key_name, table=key_side, quoted=True)
        query = query.join(
            side,
            on=exp.EQ(this=left, expression=right),
            join_type="LEFT" if step.kind == "left" else "INNER",
            copy=False,
        )
    return exp.Subquery(this=query, alias=exp.TableAlias(this=exp.to_identifier("j")))


def _reads(table: TableConfig, read: set[str]) -> bool:
    """Whether the query reads any column of the lookup ``table``."""
    name = table.name.lower()
    return any(relation_column(name, c) in read for c in table.columns)


def _lookup_keys(table: TableConfig, key: str, mode: str) -> exp.Select:
    """The keys of a lookup's rows inside its domain (as ``_lookup_side`` compares them,
    NULL left out): the set an inner join matches against. Membership needs no cut, so
    an anchor row is kept once whatever the lookup holds."""
    grouped: exp.Expr = exp.column(key, quoted=True)
    if mode == "canonical":
        grouped = _canonical(grouped, table.columns[key].type)
    present = exp.Not(this=exp.Is(this=grouped.copy(), expression=exp.Null()))
    domain = row_filter(table)
    return (
        exp.select(grouped)
        .from_(_stored(table), copy=False)
        .where(present if domain is None else exp.and_(domain, present), copy=False)
    )


def _canonical(column: exp.Expr, ctype: str) -> exp.Expr:
    """SQLite: ``column`` where it holds a value of the declared type's storage class,
    else NULL, as an expression with neither affinity nor collation (module doc)."""
    stored = exp.func("typeof", column.copy())
    return exp.Case(
        ifs=[
            exp.If(
                this=exp.EQ(this=stored, expression=exp.Literal.string(_SQLITE_CLASS[ctype])),
                true=column.copy(),
            )
        ]
    )


def _stored(table: TableConfig) -> exp.Table:
    return exp.Table(
        this=exp.to_identifier(table.sql_name, quoted=True),
        db=exp.to_identifier(table.schema, quoted=True) if table.schema else None,
    )


def _side(table: TableConfig, dialect: str, *, row_unit: bool) -> exp.Select:
    """The anchor's rows inside its domain; ``row_unit``: each numbered (``ROW_UNIT``).
    The number needs no order (any numbering tells the rows apart), except on Spark,
    which refuses a window without one."""
    columns: list[exp.Expr] = [exp.column(c, quoted=True) for c in table.columns]
    if row_unit:
        order = None
        if dialect in ("spark", "databricks"):
            order = exp.Order(
                expressions=[exp.Ordered(this=exp.column(c, quoted=True)) for c in table.columns]
            )
        number = exp.Window(this=exp.RowNumber(), order=order)
        columns.append(exp.alias_(number, ROW_UNIT, quoted=True))
    rows = exp.select(*columns).from_(_stored(table), copy=False)
    domain = row_filter(table)
    return rows.where(domain, copy=False) if domain is not None else rows


def _lookup_side(table: TableConfig, key: str, mode: str) -> exp.Select:
    """A lookup's rows inside its domain, without NULL keys, cut to the first row per key
    (by declared values) unless the key is provably unique. ``canonical``: the key as
    ``_canonical`` reads it, carried as ``JOIN_KEY`` (and cut by it)."""
    columns: list[exp.Expr] = [exp.column(c, quoted=True) for c in table.columns]
    grouped: exp.Expr = exp.column(key, quoted=True)
    carried = list(columns)
    if mode == "canonical":
        grouped = _canonical(exp.column(key, quoted=True), table.columns[key].type)
        carried.append(exp.alias_(grouped.copy(), JOIN_KEY, quoted=True))
    rows = exp.select(*carried).from_(_stored(table), copy=False)
    present = exp.Not(this=exp.Is(this=grouped.copy(), expression=exp.Null()))
    domain = row_filter(table)
    rows = rows.where(present if domain is None else exp.and_(domain, present), copy=False)
    if mode == "unique":
        return rows
    rank = exp.Window(
        this=exp.RowNumber(),
        partition_by=[grouped.copy()],
        order=exp.Order(
            expressions=[exp.Ordered(this=exp.column(c, quoted=True)) for c in table.columns]
        ),
    )
    ranked = rows.select(exp.alias_(rank, KEY_RANK, quoted=True), copy=False)
    outer = [exp.column(c, quoted=True) for c in table.columns]
    if mode == "canonical":
        outer.append(exp.column(JOIN_KEY, quoted=True))
    return (
        exp.select(*outer)
        .from_(exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier("k"))))
        .where(exp.EQ(this=exp.column(KEY_RANK, quoted=True), expression=exp.Literal.number(1)))
    )
