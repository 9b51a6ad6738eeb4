"""Pass 3a: a FROM with JOINs → the relation it reads (``gateway/core/joins.py``), or a refusal.

A join is supported when it follows the declared references (gateway/core/config.py): each
JOIN relates the table it brings in to one table already in the FROM by one equality of
two columns, one of which references the other — a privacy-unit path between protected
tables, or a protected table's column to a public table's key. The references used form
a tree whose root, the *anchor*, is the one table no other one references: the others
are lookups, holding at most one row per join key (enforced in the compiled SQL), so the
relation has one row per row of the anchor and the anchor's privacy unit and bounds.

Everything else is refused, by name, from the SQL text and the config alone: CROSS and
comma joins, RIGHT and FULL joins, NATURAL and USING joins, conditions that are not one
equality of two columns, joins no reference declares (a column that is not a privacy
unit or a public key), a table read twice (a self-join), two tables that reference the
same lookup (their rows would pair up), and a LEFT JOIN whose right side is not a lookup
of its left side (it would keep rows that are not the anchor's).

The pass returns a copy of the SELECT whose column references name the relation's
columns, so the passes after it read the relation as one table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.errors import UnknownColumn, UnknownTable, UnsupportedQuery
from gateway.core.joins import matched_lookups, relation, relation_column
from gateway.core.plan import JoinKind, JoinPlan, JoinStep
from gateway.sql.analyze.parse import READ_DIALECT
from gateway.sql.analyze.resolve import declared_table, refuse_with

HINT = (
    "join tables on the references the config declares: a protected table's privacy "
    "unit to another's (e.g. JOIN patients p ON p.patient_id = v.patient_id), or a "
    "column to a public table's key"
)


@dataclass
class _Source:
    table: TableConfig
    alias: str

    @property
    def name(self) -> str:
        return self.table.name.lower()


def resolve_join(
    select: exp.Select, tables: Mapping[str, TableConfig]
) -> tuple[exp.Select, TableConfig, JoinPlan]:
    """The relation a join query reads: a copy of ``select`` over the relation's column
    names, the relation, and the plan of the join."""
    refuse_with(select)
    from_ = select.args.get("from") or select.args.get("from_")
    if from_ is None:
        raise UnsupportedQuery("a JOIN needs a FROM table", construct="JOIN")
    sources = [_Source(*declared_table(from_.this, tables))]
    steps: list[JoinStep] = []
    referenced: dict[str, str] = {}  # lookup → the table that references it
    for join in select.args["joins"]:
        kind = _kind(join)
        new = _Source(*declared_table(join.this, tables))
        if any(s.name == new.name for s in sources):
            raise UnsupportedQuery(
                f"'{new.table.name}' is read twice: a self-join pairs a person's rows with "
                "each other and multiplies them",
                construct="self-join",
            )
        if any(s.alias == new.alias for s in sources):
            raise UnsupportedQuery(f"the alias '{new.alias}' is used twice", construct="JOIN")
        sources.append(new)
        (left, lcol), (right, rcol) = _equality(join, sources)
        if new.name == left.name:  # the new table on the left of '='
            (left, lcol), (right, rcol) = (right, rcol), (left, lcol)
        if right is not new or left is new:
            raise UnsupportedQuery(
                f"the condition of JOIN {new.table.name} must relate it to a table before it",
                construct="JOIN condition",
            )
        if _references(left.table, lcol, new.name, rcol):
            lookup, by = new.name, left.name
        elif _references(new.table, rcol, left.name, lcol):
            if kind == "left":
                raise UnsupportedQuery(
                    f"LEFT JOIN {new.table.name} would keep {left.table.name}'s rows that "
                    f"no {new.table.name} row references, rows that are not the join's: "
                    f"write FROM {new.table.name} LEFT JOIN {left.table.name}",
                    construct="LEFT JOIN of a referencing table",
                )
            lookup, by = left.name, new.name
        else:
            raise UnsupportedQuery(
                f"{left.table.name}.{lcol} = {new.table.name}.{rcol}: no reference in the "
                f"config declares this join, so one row could match many ({HINT})",
                construct="JOIN on an undeclared column",
            )
        if lookup in referenced:
            raise UnsupportedQuery(
                f"{referenced[lookup]} and {by} both reference {lookup}: joined through it, "
                "each of a person's rows in one would pair with each in the other",
                construct="JOIN of two referencing tables",
            )
        referenced[lookup] = by
        steps.append(JoinStep(new.name, kind, rcol, left.name, lcol))
    anchor = next(s for s in sources if s.name not in referenced)
    always = matched_lookups(tables, anchor.name)
    # a LEFT JOIN of a lookup every row matches is its inner join (no row goes unmatched)
    steps = [
        replace(step, kind="inner")
        if step.kind == "left" and _lookup_of(step, referenced) in always
        else step
        for step in steps
    ]
    required = _required(steps, referenced) | always
    rel = relation(tables, anchor.name, required)
    rewritten = _rewrite(select, sources, anchor, required, rel)
    # every row matches those lookups, in every query on the anchor: no condition says so
    matched = _matched(rewritten, required - always, referenced, tables)
    keys: dict[str, str] = {}
    for step in steps:
        if referenced.get(step.table) == step.other:
            keys[step.table] = step.column
        else:
            keys[step.other] = step.other_column
    plan = JoinPlan(
        first=sources[0].name,
        steps=tuple(steps),
        relation=rel,
        tables=tuple(s.table for s in sources),
        keys=tuple(keys.get(s.name) for s in sources),
        matched=matched,
    )
    return rewritten, rel, with_matched_lookups(plan, anchor.name, tables) or plan


def with_matched_lookups(
    join: JoinPlan | None, anchor: str, tables: Mapping[str, TableConfig]
) -> JoinPlan | None:
    """``join`` (None: a query on ``anchor`` alone) inner-joining every lookup each row of
    ``anchor`` matches (``every_row_matches``, gateway/core/joins.py) that it does not join
    already: the rows that match none are outside the table in every query on it, so the
    auditor has no region of unmatched rows to keep (docs/design.md, invariant 10)."""
    always = matched_lookups(tables, anchor)
    joined = set() if join is None else {t.name.lower() for t in join.tables}
    missing = [
        r for r in tables[anchor].references if r.every_row_matches and r.table not in joined
    ]
    if not missing:
        return join
    hidden = [r.table for r in missing if r.table not in tables]
    if hidden:
        # the table's rows are defined through a lookup this caller may not read (a
        # table grant): refused, free, rather than counted without the lookup
        raise UnknownTable(
            f"{tables[anchor].name} is read through {hidden[0]} (its reference is declared "
            f"every_row_matches), which this key may not read: ask the admin to grant it",
            table=tables[anchor].name,
        )
    steps = tuple(JoinStep(r.table, "inner", r.target, anchor, r.column) for r in missing)
    extra = tuple(tables[r.table] for r in missing)
    targets = tuple(r.target for r in missing)
    if join is None:
        return JoinPlan(
            first=anchor,
            steps=steps,
            relation=relation(tables, anchor, always),
            tables=(tables[anchor], *extra),
            keys=(None, *targets),
            matched=None,
        )
    return replace(
        join,
        steps=join.steps + steps,
        tables=join.tables + extra,
        keys=join.keys + targets,
    )


def _lookup_of(step: JoinStep, referenced: Mapping[str, str]) -> str:
    """The lookup a step brings in (either side of its equality)."""
    return step.table if referenced.get(step.table) == step.other else step.other


def _kind(join: exp.Join) -> JoinKind:
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if join.args.get("method"):
        method = str(join.args["method"]).upper()
        raise UnsupportedQuery(
            f"{method} JOIN matches on every column of the same name: write ON a.x = b.y",
            construct=f"{method} JOIN",
        )
    if kind in ("SEMI", "ANTI", "ASOF"):
        raise UnsupportedQuery(f"{kind} JOIN is not supported ({HINT})", construct=f"{kind} JOIN")
    if side in ("RIGHT", "FULL"):
        raise UnsupportedQuery(
            f"{side} JOIN keeps rows of the joined table that match nothing, which are not "
            "rows of the table the query counts: use JOIN or LEFT JOIN",
            construct=f"{side} JOIN",
        )
    if join.args.get("using"):
        raise UnsupportedQuery(
            "JOIN … USING is not supported: write ON a.x = b.y", construct="JOIN USING"
        )
    if kind == "CROSS" or join.args.get("on") is None:
        raise UnsupportedQuery(
            "a join without a condition pairs every row with every row, multiplying each "
            f"person's rows ({HINT})",
            construct="CROSS JOIN",
        )
    return "left" if side == "LEFT" else "inner"


def _equality(
    join: exp.Join, sources: list[_Source]
) -> tuple[tuple[_Source, str], tuple[_Source, str]]:
    """The two columns of a JOIN's ``ON a.x = b.y``."""
    on = join.args["on"]
    while isinstance(on, exp.Paren):
        on = on.this
    if isinstance(on, exp.And):
        raise UnsupportedQuery(
            "a JOIN condition is one equality of two columns; put other conditions in WHERE",
            construct="JOIN on several conditions",
        )
    if not isinstance(on, exp.EQ):
        raise UnsupportedQuery(
            f"a JOIN condition is one equality of two columns, not {on.key.upper()}: a "
            "comparison other than = could match one row with many",
            construct="non-equi JOIN",
        )
    sides = []
    for side in (on.this, on.expression):
        while isinstance(side, exp.Paren):
            side = side.this
        if not isinstance(side, exp.Column) or isinstance(side.this, exp.Star):
            raise UnsupportedQuery(
                f"a JOIN condition compares two columns, not '{side.sql()}'",
                construct="JOIN on an expression",
            )
        sides.append(_column_source(side, sources, clause="JOIN"))
    return sides[0], sides[1]


def _column_source(
    column: exp.Column, sources: list[_Source], *, clause: str
) -> tuple[_Source, str]:
    """The table a column reference reads (by qualifier, else by name) and its name."""
    name = column.name.lower()
    if column.table:
        qualifier = column.table.lower()
        for s in sources:
            if qualifier in (s.alias, s.name):
                if name not in s.table.columns:
                    known = ", ".join(c.name for c in s.table.columns.values())
                    raise UnknownColumn(
                        f"unknown column '{column.name}' in table '{s.table.name}' "
                        f"(columns: {known})",
                        column=column.sql(),
                    )
                return s, name
        raise UnknownColumn(
            f"unknown table or alias '{column.table}' in {clause}", column=column.sql()
        )
    having = [s for s in sources if name in s.table.columns]
    if len(having) > 1:
        both = " and ".join(s.table.name for s in having)
        raise UnknownColumn(
            f"column '{column.name}' is ambiguous: {both} both have it; qualify it "
            f"(e.g. {having[0].alias}.{name})",
            column=column.name,
        )
    if not having:
        raise UnknownColumn(f"unknown column '{column.name}' in {clause}", column=column.name)
    return having[0], name


def _references(table: TableConfig, column: str, target_table: str, target: str) -> bool:
    return any(
        r.column == column and r.table == target_table and r.target == target
        for r in table.references
    )


def _required(steps: list[JoinStep], referenced: Mapping[str, str]) -> frozenset[str]:
    """The lookups every row of the join has matched: one joined by an inner join (or
    the FROM table, when an inner join brought in the table referencing it), and every
    lookup on the way from the anchor to one of those."""
    required: set[str] = set()
    for step in steps:
        if step.kind != "inner":
            continue
        lookup = step.table if referenced.get(step.table) == step.other else step.other
        required.add(lookup)
    for lookup in list(required):
        parent = referenced.get(lookup)
        while parent is not None and parent in referenced:
            required.add(parent)
            parent = referenced.get(parent)
    return frozenset(required)


def _rewrite(
    select: exp.Select,
    sources: list[_Source],
    anchor: _Source,
    required: frozenset[str],
    rel: TableConfig,
) -> exp.Select:
    """A copy of ``select`` (JOIN conditions aside) with every column named as the
    relation names it; a name no table has is left for the later passes (an output
    alias in HAVING or ORDER BY, or an unknown column they report)."""
    copy = select.copy()
    for item in copy.expressions:
        if not isinstance(item, exp.Alias | exp.Column) and item.find(exp.Column) is not None:
            # an aggregate keeps the name the analyst wrote (SUM(p.income), not the
            # relation's SUM("patients.income"))
            item.replace(exp.alias_(item.copy(), item.sql(dialect=READ_DIALECT), quoted=True))
    for clause in ("expressions", "where", "group", "having", "order"):
        value = copy.args.get(clause)
        nodes = value if isinstance(value, list) else [value] if value is not None else []
        for node in nodes:
            for column in list(node.find_all(exp.Column)):
                if isinstance(column.this, exp.Star):
                    continue
                if not column.table and not any(
                    column.name.lower() in s.table.columns for s in sources
                ):
                    continue
                source, name = _column_source(column, sources, clause="the query")
                column.replace(exp.column(_relation_name(source, name, anchor, required, rel)))
    return copy


def _relation_name(
    source: _Source, name: str, anchor: _Source, required: frozenset[str], rel: TableConfig
) -> str:
    if source is anchor:
        return name
    if name == source.table.privacy_unit:
        if source.name in required and rel.privacy_unit is not None:
            return rel.privacy_unit  # the same person as the anchor's unit, on every row
        raise UnsupportedQuery(
            f"'{source.alias}.{name}' is a privacy unit, NULL where the LEFT JOIN found no "
            f"row: count persons with COUNT(DISTINCT {anchor.alias}.{rel.privacy_unit})",
            construct="privacy unit column",
        )
    return relation_column(source.name, name)


def _matched(
    select: exp.Select,
    required: frozenset[str],
    referenced: Mapping[str, str],
    tables: Mapping[str, TableConfig],
) -> exp.Expr | None:
    """``lookup.c IS NOT NULL`` for each required lookup: for ``c`` a column the query
    reads that is never NULL in its table (so NULL in the relation means "no match"),
    else the lookup's join key. The auditor then relates the match to the lookup's
    other conditions on one dimension."""
    read = {c.name for c in select.find_all(exp.Column)}
    conditions: list[exp.Expr] = []
    for lookup in sorted(required):
        table = tables[lookup]
        by = tables[referenced[lookup]]
        key = next(r.target for r in by.references if r.table == lookup)
        column = next(
            (
                name
                for name, col in table.columns.items()
                if relation_column(lookup, name) in read and not col.may_be_null
            ),
            key,
        )
        conditions.append(
            exp.Not(
                this=exp.Is(this=exp.column(relation_column(lookup, column)), expression=exp.Null())
            )
        )
    if not conditions:
        return None
    return exp.and_(*conditions, copy=False) if len(conditions) > 1 else conditions[0]
