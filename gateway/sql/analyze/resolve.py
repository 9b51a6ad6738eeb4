"""Pass 2: resolve the table and every column, and check expressions against the allow-list.

Row expressions (in WHERE, GROUP BY and inside aggregates) may use declared columns,
literals, comparisons, boolean logic, IN lists, BETWEEN, LIKE, IS NULL, arithmetic, CASE
and a short list of scalar functions. Anything else is refused by name. Resolved
expressions have bare lower-case column names, so later passes never see aliases.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.errors import UnknownColumn, UnknownTable, UnsupportedQuery
from gateway.core.plan import ValueType
from gateway.sql.analyze.totality import check_size, check_total

#: Expression node types allowed in row expressions.
ALLOWED_NODES: tuple[type[exp.Expr], ...] = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.Paren,
    exp.And,
    exp.Or,
    exp.Not,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.Is,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.IntDiv,
    exp.Mod,
    exp.Neg,
    exp.Case,
    exp.If,
    exp.Cast,
    exp.DataType,
    exp.Coalesce,
    exp.Abs,
    exp.Lower,
    exp.Upper,
    exp.Length,
    exp.Substring,
    exp.Round,
    exp.Floor,
    exp.Ceil,
    exp.Trim,
    exp.DPipe,
    exp.Concat,
    exp.Tuple,
    exp.Var,
)

ALLOWED_FUNCTIONS_TEXT = (
    "ABS, CEIL, COALESCE, FLOOR, LENGTH, LOWER, ROUND, SUBSTRING, TRIM, UPPER, CAST, CASE"
)

_AGGREGATE_NAMES: dict[type[exp.Expr], str] = {
    exp.Min: "MIN",
    exp.Max: "MAX",
    exp.Median: "MEDIAN",
    exp.PercentileCont: "PERCENTILE_CONT",
    exp.PercentileDisc: "PERCENTILE_DISC",
    exp.Quantile: "QUANTILE",
    exp.ApproxQuantile: "APPROX_QUANTILE",
    exp.Stddev: "STDDEV",
    exp.StddevPop: "STDDEV_POP",
    exp.StddevSamp: "STDDEV_SAMP",
    exp.Variance: "VARIANCE",
    exp.VariancePop: "VAR_POP",
    exp.ArrayAgg: "ARRAY_AGG",
    exp.GroupConcat: "GROUP_CONCAT",
    exp.AnyValue: "ANY_VALUE",
    exp.First: "FIRST",
    exp.Last: "LAST",
    exp.ApproxDistinct: "APPROX_COUNT_DISTINCT",
}


def resolve_table(select: exp.Select, tables: Mapping[str, TableConfig]) -> tuple[TableConfig, str]:
    """The one declared table the query reads, and the alias its columns may use."""
    refuse_with(select)
    if select.args.get("joins"):  # gateway/sql/analyze/joins.py reads those
        raise UnsupportedQuery("a join is read by the join pass", construct="JOIN")
    from_ = select.args.get("from") or select.args.get("from_")
    if from_ is None:
        raise UnsupportedQuery(
            "the query reads no table: add FROM <table>", construct="SELECT without FROM"
        )
    return declared_table(from_.this, tables)


def declared_table(source: exp.Expr, tables: Mapping[str, TableConfig]) -> tuple[TableConfig, str]:
    """The declared table a FROM (or JOIN) item names, and the alias its columns may use."""
    if isinstance(source, exp.Subquery | exp.Select):
        raise UnsupportedQuery(
            "subqueries are supported only as the BI wrapper "
            "SELECT … FROM (<aggregate query>) AS t",
            construct="subquery",
        )
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        raise UnsupportedQuery(
            f"reading from {source.key.upper()} is not supported", construct=source.key.upper()
        )
    name = source.name.lower()
    table = tables.get(name)
    schema = source.db.lower() if source.db else None
    if table is None or (schema is not None and not _schema_matches(schema, table)):
        known = ", ".join(sorted(t.name for t in tables.values()))
        shown = f"{schema}.{name}" if schema else name
        raise UnknownTable(f"unknown table '{shown}' (tables: {known})", table=shown)
    alias = source.alias_or_name.lower()
    return table, alias


def refuse_with(select: exp.Select) -> None:
    if select.args.get("with") or select.args.get("with_"):
        raise UnsupportedQuery("WITH (common table expressions) is not supported", construct="WITH")


def _schema_matches(schema: str, table: TableConfig) -> bool:
    if table.schema is not None:
        return schema == table.schema.lower()
    return schema in ("main", "public")


def column_type(table: TableConfig, name: str) -> ValueType:
    return table.columns[name].type


def resolve_row_expression(
    node: exp.Expr, table: TableConfig, alias: str, *, where: str
) -> exp.Expr:
    """A copy of ``node`` with columns resolved, or a refusal naming what is not allowed.

    ``where`` names the clause for messages ("WHERE", "GROUP BY", "SUM").
    """
    check_size(node, where)  # first: what follows grows with the expression
    resolved = node.copy()
    for sub in list(resolved.walk()):
        _check_node(sub, where)
    for column in list(resolved.find_all(exp.Column)):
        if isinstance(column.this, exp.Star):
            raise UnsupportedQuery(f"'*' is not allowed in {where}", construct="*")
        qualifier = column.table.lower() if column.table else None
        if qualifier is not None and qualifier not in (alias, table.name.lower()):
            raise UnknownColumn(
                f"unknown table or alias '{column.table}' in {where}", column=column.sql()
            )
        name = column.name.lower()
        if name not in table.columns:
            known = ", ".join(c.name for c in table.columns.values())
            raise UnknownColumn(
                f"unknown column '{column.name}' in table '{table.name}' (columns: {known})",
                column=column.name,
            )
        if name == table.privacy_unit:
            raise UnsupportedQuery(
                f"'{name}' is the privacy unit: it cannot be used in {where} "
                "(only COUNT(DISTINCT "
                f"{name}) may refer to it)",
                construct="privacy unit column",
            )
        if column is resolved:
            resolved = exp.column(name)  # replace() cannot swap the root of a tree
            break
        column.replace(exp.column(name))
    check_total(resolved, table, where=where, boolean=where == "WHERE")
    return resolved


def _check_node(node: exp.Expr, where: str) -> None:
    if isinstance(node, ALLOWED_NODES):
        if isinstance(node, exp.In) and (node.args.get("query") or node.args.get("unnest")):
            raise UnsupportedQuery(
                "IN (subquery) is not supported: list the values", construct="subquery"
            )
        return
    if isinstance(node, exp.Subquery | exp.Select | exp.Exists):
        raise UnsupportedQuery(
            "subqueries are supported only as the BI wrapper "
            "SELECT … FROM (<aggregate query>) AS t",
            construct="subquery",
        )
    if isinstance(node, exp.Window):
        raise UnsupportedQuery("window functions are not supported", construct="window function")
    for cls, name in _AGGREGATE_NAMES.items():
        if isinstance(node, cls):
            raise UnsupportedQuery(
                f"{name} is not supported: dpgate releases COUNT, SUM and AVG "
                "(order statistics of a few people are not protected by noise on counts)",
                construct=name,
            )
    if isinstance(node, exp.Count | exp.Sum | exp.Avg):
        raise UnsupportedQuery(
            f"aggregates are not allowed in {where}", construct=f"aggregate in {where}"
        )
    if isinstance(node, exp.Star):
        raise UnsupportedQuery(f"'*' is not allowed in {where}", construct="*")
    if isinstance(node, exp.Func):
        fname = node.name.upper() if isinstance(node, exp.Anonymous) else node.sql_name()
        raise UnsupportedQuery(
            f"function {fname} is not allowed (allowed: {ALLOWED_FUNCTIONS_TEXT})",
            construct=f"function {fname}",
        )
    raise UnsupportedQuery(
        f"{node.key.upper()} is not supported in {where}", construct=node.key.upper()
    )


def infer_type(node: exp.Expr, table: TableConfig) -> ValueType:
    """The value type of a resolved row expression (good enough for output typing)."""
    if isinstance(node, exp.Paren):
        return infer_type(node.this, table)
    if isinstance(node, exp.Column):
        return column_type(table, node.name)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return "text"
        return "integer" if node.is_int else "real"
    if isinstance(node, (exp.Boolean, exp.Predicate | exp.Connector | exp.Not)):
        return "boolean"
    if isinstance(node, exp.Case | exp.If | exp.Coalesce):
        branches = [infer_type(b, table) for b in _branches(node) if not isinstance(b, exp.Null)]
        if branches and all(b == branches[0] for b in branches):
            return branches[0]
        return "real" if branches and all(b in ("integer", "real") for b in branches) else "text"
    if isinstance(node, exp.Div):
        left, right = infer_type(node.this, table), infer_type(node.expression, table)
        return "integer" if left == right == "integer" else "real"
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Mod | exp.IntDiv):
        left, right = infer_type(node.this, table), infer_type(node.expression, table)
        return "integer" if left == right == "integer" else "real"
    if isinstance(node, exp.Neg | exp.Abs):
        return infer_type(node.this, table)
    if isinstance(node, exp.Floor | exp.Ceil | exp.Length):
        return "integer"
    if isinstance(node, exp.Round):
        return "integer" if not node.args.get("decimals") else "real"
    if isinstance(node, exp.Cast):
        to = node.to.this
        if to in exp.DataType.INTEGER_TYPES:
            return "integer"
        if to in exp.DataType.REAL_TYPES:
            return "real"
        if to == exp.DataType.Type.BOOLEAN:
            return "boolean"
        return "text"
    return "text"


def _branches(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.Case):
        out = [i.args["true"] for i in node.args.get("ifs") or []]
        default = node.args.get("default")
        out.append(default if default is not None else exp.Null())
        return out
    if isinstance(node, exp.If):
        false = node.args.get("false")
        return [node.args["true"], false if false is not None else exp.Null()]
    return [*list(node.expressions), node.this]
