"""The relation a join query reads, declared as one table (docs/design.md, "Joins").

A table's ``references`` (gateway/core/config.py) form a tree rooted at it: each referenced
table is a *lookup*, joined on a column that names at most one of its rows — a protected
table's privacy unit (it holds one row per unit) or a public table's key. The compiled
SQL keeps one row per key of every lookup, so a join keeps each row of the root (the
*anchor*) at most once: the relation's rows are the anchor's rows, with the lookups'
columns beside them (NULL where a LEFT JOIN found no match). Its privacy unit and
contribution bounds are the anchor's.

One model for the analyzer, the compiler and the auditor: the relation names the
anchor's columns as declared and a lookup's column as ``table.column``. For the auditor
every lookup column may be NULL (the anchor's rows that match nothing); a lookup column
reached through a column that is not the privacy unit (``zip`` → ``zip_regions.region``)
is a function of that column, and says so (``ColumnConfig.determined_by``), so that the
auditor never treats the two as independent dimensions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from sqlglot import exp

from gateway.core.config import ColumnConfig, Reference, TableConfig
from gateway.core.config_nulls import READ_DIALECT
from gateway.core.domain import null_condition

__all__ = [
    "PublicLookup",
    "audit_relations",
    "lookups",
    "matched_lookups",
    "relation",
    "relation_column",
]


@dataclass(frozen=True)
class PublicLookup:
    """The rows of a public lookup as a join through one reference reads them: each key
    (a text value, as the join's ``=`` compares it) with the lookup's text columns
    (``rows[key][column]``, None for NULL). Read by the gateway at start-up
    (gateway/sql/public_lookups.py) only where that is exact (every key a distinct text);
    the auditor translates a condition on such a column into the set of keys whose row
    meets it, so two columns of one lookup relate through the key (docs/privacy.md,
    "Joins")."""

    key: str
    rows: Mapping[str, Mapping[str, str | None]]


def relation_column(table: str, column: str) -> str:
    """A lookup table's column, as the relation names it."""
    return f"{table}.{column}"


def lookups(tables: Mapping[str, TableConfig], anchor: str) -> Iterator[tuple[str, Reference]]:
    """Every reference reachable from ``anchor``, parents first: (the referencing table,
    the reference). The config guarantees each table is reached one way only."""
    queue = [anchor]
    while queue:
        current = queue.pop(0)
        for r in tables[current].references:
            yield current, r
            queue.append(r.table)


def relation(
    tables: Mapping[str, TableConfig], anchor: str, required: frozenset[str] | None = None
) -> TableConfig:
    """The anchor with every lookup's columns beside its own.

    ``required``: the lookups an inner join requires to match, whose columns keep their
    declared nullability and ``null_when`` (over the relation's names of its columns);
    the others' columns may be NULL, whatever their condition says (a row that matches
    nothing has NULL everywhere). None (the auditor's view): every lookup column may be
    NULL.
    """
    base = tables[anchor]
    columns: dict[str, ColumnConfig] = dict(base.columns)
    for parent, ref in lookups(tables, anchor):
        via = ref.column if parent == anchor else relation_column(parent, ref.column)
        # Through the privacy unit, a lookup's columns are attributes of the person: the
        # unit is never a dimension of a region, so they are independent dimensions.
        claim = None if via == base.privacy_unit else via
        keep = required is not None and ref.table in required
        for name, col in tables[ref.table].columns.items():
            columns[relation_column(ref.table, name)] = replace(
                col,
                nullable=col.nullable if keep else True,
                determined_by=claim,
                null_when=_null_when_in_relation(col, ref.table) if keep else None,
            )
    return replace(base, columns=columns)


def _null_when_in_relation(col: ColumnConfig, table: str) -> str | None:
    """A lookup column's ``null_when`` over the relation's names of the lookup's columns."""
    condition = null_condition(col)
    if condition is None:
        return None

    def renamed(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            return exp.column(relation_column(table, node.name), quoted=True)
        return node

    return condition.transform(renamed).sql(dialect=READ_DIALECT)


def audit_relations(
    tables: Mapping[str, TableConfig],
    public: Mapping[tuple[str, str], PublicLookup] | None = None,
) -> dict[str, TableConfig]:
    """Each table as the auditor sees it: with every lookup's columns, so a join's regions
    and the anchor's own queries' regions share one cell space. A lookup's columns may be
    NULL (the anchor's rows that match nothing), except a lookup every row matches
    (``matched_lookups``): every query on the table inner-joins it, so its columns keep
    their declared nullability, and where its rows were read (``public``, translated by
    ``translations``) the column it is joined on holds one of its keys: a row whose value
    is none of them is outside the table in every query."""
    out: dict[str, TableConfig] = {}
    for name, t in tables.items():
        if not t.references:
            out[name] = t
            continue
        matched = matched_lookups(tables, name)
        rel = relation(tables, name, matched)
        for via, lookup in _translatable(tables, name, rel, public or {}, matched):
            col = rel.columns[via]
            keys = tuple(k for k in lookup.rows if col.values is None or k in col.values)
            rel = replace(
                rel, columns={**rel.columns, via: replace(col, values=keys, nullable=False)}
            )
        out[name] = rel
    return out


def translations(
    tables: Mapping[str, TableConfig],
    relations: Mapping[str, TableConfig],
    public: Mapping[tuple[str, str], PublicLookup] | None,
) -> dict[str, dict[str, tuple[str, PublicLookup, str]]]:
    """Per table, the relation columns of public lookups the auditor reads through their
    rows: ``{relation column: (the column the lookup is joined on, its rows, the lookup's
    own column name)}``. Only the text columns of a lookup whose rows were read, joined on
    a column that is itself no function of another (the anchor's, or a lookup's through
    the privacy unit)."""
    out: dict[str, dict[str, tuple[str, PublicLookup, str]]] = {}
    for name, t in tables.items():
        if not t.references or not public:
            continue
        found: dict[str, tuple[str, PublicLookup, str]] = {}
        rel = relations[name]
        for via, lookup in _translatable(tables, name, rel, public, None):
            ref_table = next(
                r.table for p, r in lookups(tables, name) if _via(tables, name, p, r) == via
            )
            for column, col in tables[ref_table].columns.items():
                if col.type == "text":
                    found[relation_column(ref_table, column)] = (via, lookup, column)
        if found:
            out[name] = found
    return out


def _via(tables: Mapping[str, TableConfig], anchor: str, parent: str, ref: Reference) -> str:
    return ref.column if parent == anchor else relation_column(parent, ref.column)


def _translatable(
    tables: Mapping[str, TableConfig],
    anchor: str,
    rel: TableConfig,
    public: Mapping[tuple[str, str], PublicLookup],
    only: frozenset[str] | None,
) -> Iterator[tuple[str, PublicLookup]]:
    """The references of ``anchor``'s relation whose lookup rows were read, joined on a
    text column that is no function of another (``only``: to these lookups)."""
    for parent, ref in lookups(tables, anchor):
        lookup = public.get((parent.lower(), ref.column.lower()))
        if lookup is None or (only is not None and ref.table not in only):
            continue
        via = _via(tables, anchor, parent, ref)
        col = rel.columns.get(via)
        if col is None or col.type != "text" or col.determined_by is not None:
            continue
        if via == rel.privacy_unit:
            continue
        yield via, lookup


def matched_lookups(tables: Mapping[str, TableConfig], anchor: str) -> frozenset[str]:
    """The lookups every row of ``anchor`` matches (its references declared
    ``every_row_matches``): every query on ``anchor`` inner-joins them, so the rows that
    match none are outside the table (gateway/sql/analyze/joins.py)."""
    return frozenset(r.table for r in tables[anchor].references if r.every_row_matches)
