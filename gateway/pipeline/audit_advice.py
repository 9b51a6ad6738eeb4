"""What to ask instead of a query the audit refuses: runnable SQL, not just words.

A refusal names the groups the query would determine (WHERE clauses over declared
columns, from query texts only) and says what to do. This module writes it out as
queries the analyst can send as they are:

- a group no count sizes (only SUMs or quantiles describe it): the refused query with
  ``COUNT(*)`` added — its counts, with the earlier ones, can then show the groups'
  sizes, all at once;
- groups that differ only in the value of one of the query's GROUP BY columns (each
  department's visits outside 2024, say): one breakdown that counts them all, ``SELECT
  department, COUNT(*) AS n … WHERE <what they share> GROUP BY department``;
- each group named (up to ``MAX_GROUPS``): its own count, ``SELECT COUNT(*) … WHERE
  <group>`` — released with its own noise, it sizes that group for every later query.

Each suggestion is built from the refused query's text, the table and the groups —
public information — and kept only when the gateway would plan it (a suggestion that
would itself be rejected as unsupported is no advice). Nothing here reads the data or
spends anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlglot import exp

from gateway.core.errors import GatewayError
from gateway.sql.analyze.parse import parse_select

MAX_GROUPS = 3
"""Groups whose own COUNT is suggested (a refusal names at most three in its text)."""


def ask_instead(
    sql: str,
    table: str,
    groups: Sequence[str],
    *,
    uncounted: bool,
    plans: Callable[[str], object],
    keys: Sequence[str] = (),
) -> list[str]:
    """Queries to ask instead of ``sql`` (refused, or predicted to be), best first:
    with ``uncounted``, ``sql`` with COUNT(*) added; then a breakdown by one of its
    GROUP BY columns ``keys`` that counts several groups at once; then each group's own
    COUNT. ``plans`` raises a ``GatewayError`` for a query the gateway would refuse."""
    candidates: list[str] = []
    if uncounted:
        counted = with_count(sql)
        if counted is not None:
            candidates.append(counted)
    together = breakdown(table, groups, keys)
    if together is not None:
        candidates.append(together)
    candidates += [f"SELECT COUNT(*) AS n FROM {table} WHERE {g}" for g in groups[:MAX_GROUPS]]
    out = []
    for q in dict.fromkeys(candidates):
        try:
            plans(q)
        except GatewayError:
            continue
        out.append(q)
    return out


def with_count(sql: str) -> str | None:
    """``sql`` with ``COUNT(*)`` as a last output column (named ``n``, or ``n_rows`` when
    ``n`` is taken); None when it already releases COUNT(*) or is no plain SELECT."""
    try:
        tree = parse_select(sql)
    except GatewayError:
        return None
    if not isinstance(tree, exp.Select) or tree.find(exp.Subquery) is not None:
        return None  # (a nested query's outer rows are groups, not people)
    if any(isinstance(c.this, exp.Star) for c in tree.find_all(exp.Count)):
        return None
    names = {s.alias_or_name.lower() for s in tree.expressions}
    alias = next((a for a in ("n", "n_rows", "row_count") if a not in names), "rows_counted")
    return tree.select(f"COUNT(*) AS {alias}", copy=True).sql()


def breakdown(table: str, groups: Sequence[str], keys: Sequence[str]) -> str | None:
    """One COUNT breakdown by a column of ``keys`` that counts two or more of ``groups``:
    those whose WHERE clause is the same conditions plus ``column = value`` (None when
    fewer than two are)."""
    by_column: dict[str, list[tuple[frozenset[str], list[exp.Expr]]]] = {}
    for group in groups:
        try:
            where = parse_select(f"SELECT 1 FROM {table} WHERE {group}").args.get("where")
        except GatewayError:
            continue
        if where is None:
            continue
        conjuncts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
        picks = [
            c
            for c in conjuncts
            if isinstance(c, exp.EQ)
            and isinstance(c.this, exp.Column)
            and c.this.name in keys
            and isinstance(c.expression, exp.Literal | exp.Boolean)
        ]
        if len(picks) != 1:
            continue
        rest = [c for c in conjuncts if c is not picks[0]]
        by_column.setdefault(picks[0].this.name, []).append(
            (frozenset(c.sql() for c in rest), rest)
        )
    best: tuple[str, list[exp.Expr]] | None = None
    size = 1
    for column, found in by_column.items():
        # the groups sharing the most frequent set of other conditions
        shared = max({s for s, _ in found}, key=lambda s: sum(f == s for f, _ in found))
        matching = [rest for s, rest in found if s == shared]
        if len(matching) > size:
            best, size = (column, matching[0]), len(matching)
    if best is None:
        return None
    column, rest = best
    where_sql = f" WHERE {' AND '.join(c.sql() for c in rest)}" if rest else ""
    return f"SELECT {column}, COUNT(*) AS n FROM {table}{where_sql} GROUP BY {column}"
