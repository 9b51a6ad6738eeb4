"""How much work a compiled statement does per row it reads: the cost model's measure of
its expressions (``gateway/pipeline/cost_model.py``, ``op_ns``).

A statement's text length was the measure before, and it counted what costs nothing per
row — the column lists of derived tables, the literals of a domain filter's IN lists,
quoted names — as much as what does. This counts **operations**: each comparison,
boolean or arithmetic operator, function, aggregate and CASE is one; an IN over a list of
``k`` literals is one membership test, which an engine answers by a sorted or hashed
lookup, so it weighs 1 + log2(k + 1); an IN over a subquery is one probe of the
subquery's materialised result (the subquery's own operations are counted as well, as if
they ran per row: an over-estimate); a LIKE's pattern adds a little per eight
characters. Columns, literals, parentheses, aliases and the statement's structure
(derived tables, FROM, GROUP BY) weigh nothing: reading and grouping have their own
coefficients. Window functions are counted here as one operation each; their sorts are
the cost model's ``sort_ns`` term.

Everything it reads is the compiled statement, a function of the plan and the config:
public.
"""

from __future__ import annotations

import math

from sqlglot import exp

#: Operations of a membership test of a subquery's result (one probe).
SUBQUERY_PROBE = 2.0
#: Characters of a LIKE pattern per extra operation.
PATTERN_CHARS_PER_OP = 8

_FREE = (exp.Paren, exp.Dot, exp.Alias)


def row_operations(tree: exp.Expr) -> float:
    """The operations ``tree`` evaluates per row it reads (see the module doc)."""
    ops = 0.0
    for node in tree.walk():
        if isinstance(node, exp.In):
            values = node.args.get("expressions") or []
            if values:
                ops += 1 + math.log2(len(values) + 1)
            else:
                ops += SUBQUERY_PROBE
        elif isinstance(node, (exp.Like, exp.ILike)):
            pattern = node.expression
            chars = len(pattern.name) if isinstance(pattern, exp.Literal) else 0
            ops += 1 + chars / PATTERN_CHARS_PER_OP
        elif isinstance(node, _FREE):
            continue
        elif isinstance(node, (exp.Binary, exp.Unary, exp.Func, exp.Predicate)):
            ops += 1
    return ops
