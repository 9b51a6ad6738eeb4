"""The rows of public lookups, read once at start-up, where the auditor may use them.

A public table's rows are public (``public: true``, docs/design.md, "Joins"): the auditor
may know that ``plans.tier = 'Basic'`` is the subscribers whose ``plan_id`` is ``PRE-S``
or ``POST-S``, and so relate it to ``plans.contract = 'prepaid'`` (issue 32). That is
exact only if the set of keys read is the set of rows the compiled join attaches to each
anchor value. So a reference's rows are read only where:

- the referencing column and the key are declared ``text``, and every key read (inside
  the lookup's declared domain, NULL keys left out as the join leaves them) is a text
  value: the join's ``=`` compares the anchor's value with the key as the auditor
  compares a text column with a constant;
- no two keys are equal after case folding and trimming, so no collation (NOCASE, RTRIM,
  a nondeterministic one) could merge two of them, and the compiled cut to one row per key
  keeps every row read;
- the engine compares them without conversion: SQLite (a ``canonical`` or proven join,
  ``gateway/sql/compile_joins.py``) or a reference the catalogue proves (``JoinKeys``
  unique or consistent);
- the lookup holds at most ``MAX_ROWS`` rows (formulas over its keys stay small).

Anything else is not read: the auditor then treats the lookup's columns as it did before
(they claim the join column, and conditions on two of them are refused). The rows are
read under the gateway's start-up and its ``data_version``; an admin who changes a public
table restarts the gateway (docs/privacy.md, "Joins"). Only public rows are read here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.domain import row_filter
from gateway.core.joins import PublicLookup
from gateway.sql.engines.catalogue import engine_kind
from gateway.sql.join_keys import JoinKeys

log = logging.getLogger("dpgate.public_lookups")

MAX_ROWS = 4096
"""Public lookups with more rows are not read (the auditor keeps its conservative rule)."""


def read_public_lookups(
    engine: sa.Engine, tables: Mapping[str, TableConfig], keys: JoinKeys, dialect: str
) -> dict[tuple[str, str], PublicLookup]:
    """Per reference to a public table (``(referencing table, column)``, lower case), its
    rows, where the module doc says they are exact; the others are left out."""
    out: dict[tuple[str, str], PublicLookup] = {}
    cache: dict[str, PublicLookup | None] = {}
    sqlite = engine_kind(engine) == "sqlite"
    for name, t in tables.items():
        for r in t.references:
            lookup = tables.get(r.table)
            ref = (name.lower(), r.column.lower())
            if lookup is None or not lookup.public:
                continue
            column = t.columns.get(r.column)
            if column is None or column.type != "text":
                continue
            if not sqlite and ref not in keys.unique and ref not in keys.consistent:
                continue
            if r.table not in cache:
                cache[r.table] = _read(engine, lookup, r.target, dialect)
            rows = cache[r.table]
            if rows is not None:
                out[ref] = rows
    return out


def _read(engine: sa.Engine, t: TableConfig, key: str, dialect: str) -> PublicLookup | None:
    if t.columns[key].type != "text":
        return None
    texts = [c for c, col in t.columns.items() if col.type == "text"]
    present = exp.Not(this=exp.Is(this=exp.column(key, quoted=True), expression=exp.Null()))
    domain = row_filter(t)
    table = exp.Table(
        this=exp.to_identifier(t.sql_name, quoted=True),
        db=exp.to_identifier(t.schema, quoted=True) if t.schema else None,
    )
    query = (
        exp.select(*(exp.column(c, quoted=True) for c in texts))
        .from_(table)
        .where(present if domain is None else exp.and_(domain, present))
        .limit(MAX_ROWS + 1)
    )
    try:
        with engine.connect() as conn:
            fetched = conn.execute(sa.text(query.sql(dialect=dialect))).fetchall()
    except sa.exc.SQLAlchemyError as e:
        log.warning("public lookup %s not read (%s): its columns stay unrelated", t.name, e)
        return None
    if len(fetched) > MAX_ROWS:
        return None
    rows: dict[str, dict[str, str | None]] = {}
    folded: set[str] = set()
    at = texts.index(key)
    for row in fetched:
        values: list[Any] = list(row)
        if not all(v is None or isinstance(v, str) for v in values):
            return None  # a stored value of another class: not compared as the auditor does
        k = values[at]
        fold = k.casefold().strip()
        if fold in folded:
            return None  # a collation could merge two keys: not read
        folded.add(fold)
        rows[k] = dict(zip(texts, values, strict=True))
    return PublicLookup(key=key, rows=rows)
