"""Reading a column's ``null_when``: the condition that holds exactly where it is NULL.

``occupation: {type: text, values: […], null_when: "employment <> 'Employed'"}`` says
that occupation is NULL on exactly the rows whose employment is not 'Employed'. It is
part of the declared domain (``gateway/core/domain.py``): the compiled SQL leaves out of
every query the rows where it does not hold, and the auditor knows the regions those
rows would fill (an occupation for someone not employed, none for someone employed) are
empty.

The condition is a small SQL predicate over the same table's other declared columns:
comparisons of one column with constants — ``=``, ``<>``, ``IN``, ``NOT IN`` (text,
numbers, booleans), ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN`` (numbers), ``IS [NOT] NULL``
(any column) — joined by ``AND``, ``OR``, ``NOT`` and parentheses. Nothing else: every
backend evaluates these alike and without error, and the auditor reads each exactly (no
text order, which collations change; no arithmetic). Each problem is reported with the
field's path, as every other config problem.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from gateway.core.config import ColumnConfig

#: The SQL the condition is read in: what analysts write (double-quoted identifiers).
READ_DIALECT = "postgres"

_ORDER = (exp.LT, exp.LTE, exp.GT, exp.GTE)
_EQUALITY = (exp.EQ, exp.NEQ)
_WRITE = (
    "write comparisons of this table's other columns with constants (=, <>, IN, NOT IN; "
    "<, <=, >, >=, BETWEEN on numbers; IS NULL, IS NOT NULL), joined by AND, OR, NOT"
)


def parse_null_when(
    text: str, column: str, columns: Mapping[str, ColumnConfig], unit: str | None
) -> tuple[str | None, list[str]]:
    """The condition of ``column``'s ``null_when`` in its canonical form (column names in
    lower case, ``IS NOT NULL`` as ``NOT … IS NULL``), or None with the problems found
    (each without its path)."""
    if not text.strip():
        return None, [
            "must be a SQL condition on this table's other columns, e.g. "
            "\"employment <> 'Employed'\""
        ]
    try:
        tree = sqlglot.parse_one(text, read=READ_DIALECT)
    except (ParseError, TokenError) as e:
        errors = getattr(e, "errors", None) or [{}]
        said = errors[0].get("description") or str(e).splitlines()[0]
        return None, [f"not a SQL condition ({said})"]
    problems = list(_problems(tree, column, columns, unit))
    if problems:
        return None, problems
    condition = canonical(tree)
    written = condition.sql(dialect=READ_DIALECT)
    try:
        plain = sqlglot.parse_one(written, read=READ_DIALECT) == condition
    except (ParseError, TokenError):
        plain = False
    # a column named like a keyword ("order") reads back only when quoted
    return written if plain else condition.sql(dialect=READ_DIALECT, identify=True), []


def canonical(tree: exp.Expr) -> exp.Expr:
    """The condition with lower-case column names and ``x IS NOT NULL`` written ``NOT x
    IS NULL`` (one spelling for the compiler and the auditor)."""

    def lower(node: exp.Expr) -> exp.Expr:
        return exp.column(node.name.lower()) if isinstance(node, exp.Column) else node

    def positive(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Is) and node.args.get("negate"):
            return exp.Not(this=exp.Is(this=node.this, expression=exp.Null()))
        return node

    return tree.transform(lower).transform(positive)


def _problems(
    node: exp.Expr, column: str, columns: Mapping[str, ColumnConfig], unit: str | None
) -> Iterator[str]:
    if isinstance(node, exp.Paren | exp.Not):
        yield from _problems(node.this, column, columns, unit)
        return
    if isinstance(node, exp.And | exp.Or):
        yield from _problems(node.this, column, columns, unit)
        yield from _problems(node.expression, column, columns, unit)
        return
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            yield f"`{node.sql()}` is not supported: {_WRITE}"
            return
        yield from _column(node.this, column, columns, unit)
        return
    if isinstance(node, exp.In):
        if node.args.get("query") or node.args.get("unnest") or not node.expressions:
            yield f"`{node.sql()}` is not supported: IN takes a list of constants"
            return
        yield from _compared(node, node.this, node.expressions, column, columns, unit)
        return
    if isinstance(node, exp.Between):
        yield from _compared(
            node, node.this, [node.args["low"], node.args["high"]], column, columns, unit
        )
        return
    if isinstance(node, (*_EQUALITY, *_ORDER)):
        side, other = node.this, node.expression
        if not isinstance(_bare(side), exp.Column):
            side, other = other, side  # the constant first: 'Employed' = employment
        if not isinstance(_bare(side), exp.Column):
            yield f"`{node.sql()}` is not supported: compare a column itself with constants"
            return
        yield from _compared(node, side, [other], column, columns, unit)
        return
    yield f"`{node.sql()}` is not supported: {_WRITE}"


def _bare(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _column(
    node: exp.Expr, column: str, columns: Mapping[str, ColumnConfig], unit: str | None
) -> Iterator[str]:
    """Problems with ``node`` as the column a comparison reads."""
    node = _bare(node)
    if not isinstance(node, exp.Column):
        yield f"`{node.sql()}` is not supported: compare a column itself, not an expression"
        return
    name = node.name.lower()
    if node.table:
        yield (
            f"`{node.sql()}` names another table's column: the condition reads this "
            "table's own columns, by their names alone"
        )
    elif name == column:
        yield f"'{name}' is this column: whether it is NULL cannot depend on itself"
    elif name not in columns:
        yield f"'{name}' is not a declared column of this table"
    elif name == unit:
        yield (
            f"'{name}' is the privacy unit: it names people, and no condition on it "
            "describes the data"
        )


def _compared(
    node: exp.Expr,
    side: exp.Expr,
    constants: list[exp.Expr],
    column: str,
    columns: Mapping[str, ColumnConfig],
    unit: str | None,
) -> Iterator[str]:
    """Problems with a comparison of ``side`` (a column) with ``constants``."""
    found = list(_column(side, column, columns, unit))
    if found:
        yield from found
        return
    col = columns[_bare(side).name.lower()]
    if col.type == "date":
        yield f"`{node.sql()}`: a date column is read here with IS NULL only"
        return
    if col.type in ("text", "boolean") and isinstance(node, (*_ORDER, exp.Between)):
        yield f"`{node.sql()}`: {col.type} compares with =, <>, IN and NOT IN only"
        return
    for constant in constants:
        value = _bare(constant)
        if isinstance(value, exp.Null):
            yield f"`{node.sql()}`: compare with NULL using IS NULL or IS NOT NULL"
        elif isinstance(value, exp.Column):
            yield f"`{node.sql()}` is not supported: compare a column with constants only"
        elif col.type == "text" and not (isinstance(value, exp.Literal) and value.is_string):
            yield f"`{node.sql()}`: {col.name} is text, so compare it with a quoted string"
        elif col.type == "boolean" and not isinstance(value, exp.Boolean):
            yield f"`{node.sql()}`: {col.name} is boolean, so compare it with TRUE or FALSE"
        elif col.numeric and not _is_number(value):
            yield f"`{node.sql()}`: {col.name} is {col.type}, so compare it with a number"
        elif col.type == "text" and col.values is not None and value.this not in col.values:
            yield f"'{value.this}' is not one of {col.name}'s declared values"


def _is_number(node: exp.Expr) -> bool:
    if isinstance(node, exp.Neg):
        node = node.this
    return isinstance(node, exp.Literal) and not node.is_string
