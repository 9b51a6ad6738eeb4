"""SQL analysis: an analyst's SQL text → a frozen ``QueryPlan`` (or a BI ``ProbePlan``).

The passes, each in its own module:

1. ``parse``      text → one SELECT (syntax errors at the offending token, quoted);
   ``malformed``  with what sqlglot would silently repair (``GROUP BY`` with nothing
                  after it, trailing commas, ``IN ()``) refused as syntax errors
2. ``wrapper``    BI wrappers and connection probes
   ``nested``     an outer query over an aggregate subquery → post-processing of the
                  subquery's released rows (nested aggregation)
3. ``resolve``    the table, the columns, the expression allow-list
   ``joins``      a join along declared references → the one relation it reads
4. ``aggregates`` aggregate calls → measures with their sensitivities
5. ``groups``     GROUP BY keys and their public domains
6. ``select``     the select list, HAVING, ORDER BY and LIMIT → outputs

``analyze`` reads only the SQL text and the public schema, never the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.errors import UnsupportedQuery
from gateway.core.plan import ProbePlan, QueryPlan
from gateway.sql.analyze.nested import bind_post_query, split_nested
from gateway.sql.analyze.parse import READ_DIALECT, parse_select
from gateway.sql.analyze.select import build_plan, canonical_sql, public_values_plan, uncut_sql
from gateway.sql.analyze.wrapper import probe_plan, unwrap
from gateway.sql.dialects import dialect

__all__ = ["analyze"]


def _refuse_windows(select: exp.Expr) -> None:
    """A window function anywhere is refused by name, before any other check could
    refuse it for a reason the analyst did not write (``COUNT(*) OVER ()`` is not a
    column "neither aggregated nor in GROUP BY")."""
    window = select.find(exp.Window)
    if window is not None:
        raise UnsupportedQuery(
            f"window functions are not supported: {window.sql(dialect=dialect(READ_DIALECT))}."
            " dpgate releases one noisy aggregate per group: ask for the aggregates with "
            "GROUP BY, then rank, total or compare the released rows yourself (free)",
            construct="window function",
        )


def analyze(sql: str, tables: Mapping[str, TableConfig]) -> QueryPlan | ProbePlan:
    """Analyse ``sql`` against the declared ``tables``; raise a ``GatewayError`` if refused."""
    select = parse_select(sql)
    _refuse_windows(select)
    probe = probe_plan(select)
    if probe is not None:
        return probe
    listing = public_values_plan(select, tables)
    if listing is not None:
        return listing
    nested = split_nested(select)
    if nested is not None:  # the inner query is the plan; the outer, its post-processing
        plan = build_plan(nested.inner, tables)
        post_query = bind_post_query(nested, plan)
        return replace(plan, post_query=post_query, uncut_sql=uncut_sql(nested.inner))
    inner, outer = unwrap(select)
    plan = build_plan(inner, tables, outer=outer)
    if outer is not None:
        plan = replace(plan, canonical_sql=canonical_sql(select))
    elif select.args.get("limit") is None and select.args.get("offset") is None:
        return replace(plan, uncut_sql=plan.canonical_sql)  # nothing to cut: the same text
    return replace(plan, uncut_sql=uncut_sql(select))
