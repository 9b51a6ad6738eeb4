"""SQL analysis: an analyst's SQL text → a frozen ``QueryPlan`` (or a BI ``ProbePlan``).

The passes, each in its own module:

1. ``parse``      text → one SELECT (syntax errors at the offending token, quoted);
   ``malformed``  with what sqlglot would silently repair (``GROUP BY`` with nothing
                  after it, trailing commas, ``IN ()``) refused as syntax errors
2. ``wrapper``    BI wrappers and connection probes
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

from gateway.analyze.parse import parse_select
from gateway.analyze.select import build_plan, canonical_sql, public_values_plan
from gateway.analyze.wrapper import probe_plan, unwrap
from gateway.config import TableConfig
from gateway.plan import ProbePlan, QueryPlan

__all__ = ["analyze"]


def analyze(sql: str, tables: Mapping[str, TableConfig]) -> QueryPlan | ProbePlan:
    """Analyse ``sql`` against the declared ``tables``; raise a ``GatewayError`` if refused."""
    select = parse_select(sql)
    probe = probe_plan(select)
    if probe is not None:
        return probe
    listing = public_values_plan(select, tables)
    if listing is not None:
        return listing
    inner, outer = unwrap(select)
    plan = build_plan(inner, tables, outer=outer)
    if outer is not None:
        plan = replace(plan, canonical_sql=canonical_sql(select))
    return plan
