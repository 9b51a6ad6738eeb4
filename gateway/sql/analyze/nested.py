"""Pass 2b: nested aggregation — an outer query over a released aggregate.

    SELECT department, SUM(n) AS total
    FROM (SELECT department, year, COUNT(*) AS n FROM visits GROUP BY department, year) AS t
    WHERE year >= 2022 GROUP BY department ORDER BY total DESC LIMIT 10

is what Superset sends for a chart over a virtual dataset. The inner query is planned
exactly as if it had been sent alone (analysis, charge, audit, noise, answer cache all
see only it); the outer query becomes a ``PostQuery``: post-processing that
``gateway.pipeline.post_query`` runs on the inner query's released rows, in the sandbox of
``gateway.sql.released_table``. It costs nothing more and is differentially private by
post-processing, because it can read nothing but those noisy rows:

- its only FROM is the one subquery — no JOIN, no WITH, no other table;
- every column it names is a column the subquery returns (or one of its own aliases);
- no subquery anywhere else in it, no window, no function outside a short allow-list
  (arithmetic, comparisons, CASE, CAST, COALESCE, rounding, DATE_TRUNC, EXTRACT, the
  aggregates SUM, COUNT, AVG, MIN, MAX);
- the subquery is itself an aggregate query over a protected table, with no subquery
  of its own (one level of nesting).

Simple wrappers that only pick, rename, order and cut the subquery's columns are folded
into the plan by ``wrapper.unwrap`` instead, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from gateway.core.errors import UnknownColumn, UnsupportedQuery
from gateway.core.plan import OutputColumn, PostAccuracy, PostQuery, QueryPlan
from gateway.sql.analyze.aggregates import AGGREGATES
from gateway.sql.analyze.parse import READ_DIALECT
from gateway.sql.analyze.resolve import ALLOWED_NODES
from gateway.sql.released_table import TABLE, OuterQueryFailed, evaluate

_CLAUSES_FOR_NESTED = ("where", "group", "having", "distinct")
_REFUSED_CLAUSES = {
    "joins": "JOIN",
    "with": "WITH",
    "laterals": "LATERAL",
    "pivots": "PIVOT",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
    "connect": "CONNECT BY",
    "sample": "TABLESAMPLE",
    "locks": "FOR UPDATE",
    "into": "INTO",
}
# Row expressions dpgate accepts anywhere (``resolve.ALLOWED_NODES``: arithmetic,
# comparisons, CASE, CAST, COALESCE, rounding, text functions), plus the clauses of a
# query, a few functions of released values and the aggregates.
_ALLOWED = (
    *ALLOWED_NODES,
    exp.Select,
    exp.From,
    exp.Where,
    exp.Group,
    exp.Having,
    exp.Order,
    exp.Ordered,
    exp.Limit,
    exp.Offset,
    exp.Alias,
    exp.Star,
    exp.TableAlias,
    exp.Distinct,
    exp.DataTypeParam,
    exp.TryCast,
    exp.Nullif,
    exp.Greatest,
    exp.Least,
    exp.DateTrunc,
    exp.TimestampTrunc,
    exp.Extract,
    exp.Sum,
    exp.Count,
    exp.Avg,
    exp.Min,
    exp.Max,
)
_NOISY = ("count", "sum", "avg")
HIDDEN_PREFIX = "__dpgate_rows_"


@dataclass(frozen=True)
class NestedQuery:
    """An outer query and the aggregate subquery it post-processes."""

    inner: exp.Select
    outer: exp.Select  # a copy whose FROM reads the table ``released``
    alias: str


def split_nested(select: exp.Select) -> NestedQuery | None:
    """The (inner, outer) of a nested aggregation, None for anything else (a plain
    query, or a BI wrapper that ``wrapper.unwrap`` folds); refuses what it cannot run."""
    from_ = select.args.get("from") or select.args.get("from_")
    if from_ is None or not isinstance(from_.this, exp.Subquery) or _is_bi_wrapper(select):
        return None
    subquery = from_.this
    inner = subquery.this
    if not isinstance(inner, exp.Select):
        raise UnsupportedQuery(
            "the subquery in FROM must be one aggregate SELECT", construct="subquery"
        )
    for clause, name in _REFUSED_CLAUSES.items():
        if select.args.get(clause):
            raise UnsupportedQuery(
                f"the outer query of SELECT … FROM (<aggregate query>) AS t reads only its "
                f"subquery's released answer: {name} is not supported there",
                construct=f"{name} outside a subquery",
            )
    inner_from = inner.args.get("from") or inner.args.get("from_")
    if inner_from is not None and isinstance(inner_from.this, exp.Subquery):
        raise UnsupportedQuery(
            "one level of nesting is supported: an outer query over one aggregate query "
            "of a protected table, not over another subquery",
            construct="nested subquery",
        )
    if not _is_aggregate_query(inner):
        raise UnsupportedQuery(
            "an outer query can only post-process released aggregates, and its subquery "
            "returns rows: dpgate never releases rows. Aggregate in the subquery, e.g. "
            "SELECT d, SUM(n) FROM (SELECT d, COUNT(*) AS n FROM t GROUP BY d) AS s "
            "GROUP BY d",
            construct="aggregate over rows",
        )
    alias = subquery.alias or "t"
    outer = select.copy()
    outer_from = outer.args.get("from") or outer.args.get("from_")
    assert outer_from is not None
    placeholder = exp.Table(
        this=exp.to_identifier(TABLE), alias=exp.TableAlias(this=exp.to_identifier(alias))
    )
    outer_from.set("this", placeholder)
    _check_allowed(outer, placeholder, alias)
    return NestedQuery(inner=inner, outer=outer, alias=alias)


def _is_bi_wrapper(select: exp.Select) -> bool:
    """What ``wrapper.unwrap`` folds: pick, rename, order and cut the inner columns."""
    if any(select.args.get(c) for c in (*_CLAUSES_FOR_NESTED, *_REFUSED_CLAUSES)):
        return False
    for item in select.expressions:
        node = item.unalias()
        if not isinstance(node, exp.Column | exp.Star):
            return False
    order = select.args.get("order")
    if order is not None:
        from_ = select.args.get("from") or select.args.get("from_")
        inner = from_.this.this if from_ is not None else None
        if isinstance(inner, exp.Select) and (inner.args.get("limit") or inner.args.get("offset")):
            return False  # ordering over a cut subquery: the post-query gets it right
        for ordered in order.expressions:
            node = ordered.this
            positional = isinstance(node, exp.Literal) and node.is_int
            if not (isinstance(node, exp.Column) or positional):
                return False
    return True


def _is_aggregate_query(select: exp.Select) -> bool:
    group = select.args.get("group")
    if group is not None and group.expressions:
        return True
    return any(isinstance(n, AGGREGATES) for item in select.expressions for n in item.walk())


def _check_allowed(outer: exp.Select, placeholder: exp.Table, alias: str) -> None:
    for node in outer.walk():
        if node is placeholder or node is outer:
            continue
        if isinstance(node, exp.Subquery | exp.Select | exp.SetOperation):
            raise UnsupportedQuery(
                "the outer query may contain no further subquery: it post-processes the "
                "released answer of the one subquery in its FROM",
                construct="subquery in the outer query",
            )
        if isinstance(node, exp.Table) and node.parent is not placeholder:
            raise UnsupportedQuery(
                "the outer query reads only its subquery's released answer, never a table",
                construct="table in the outer query",
            )
        if isinstance(node, exp.Window):
            raise UnsupportedQuery(
                "window functions are not supported in the outer query",
                construct="window function in the outer query",
            )
        if isinstance(node, exp.Column) and node.table and node.table.lower() != alias.lower():
            raise UnsupportedQuery(
                f"the outer query may use only the columns of its subquery '{alias}' (found "
                f"{node.sql()}): it post-processes the released answer and reads no table",
                construct="column of another table in the outer query",
            )
        if not isinstance(node, _ALLOWED):
            name = (
                node.name.upper()
                if isinstance(node, exp.Anonymous)
                else node.sql_name().upper()
                if isinstance(node, exp.Func)
                else node.key.upper()
            )
            raise UnsupportedQuery(
                f"{name} is not supported in the outer query of a nested aggregation",
                construct="function in the outer query",
            )


def bind_post_query(nested: NestedQuery, plan: QueryPlan) -> PostQuery:
    """The outer query checked against the columns the inner ``plan`` releases, with
    helper columns for its accuracy and a deterministic row order; runs it on no rows
    to learn its result's columns (public information only: names and types)."""
    inner_outputs = [(i, o) for i, o in enumerate(plan.outputs) if not o.hidden]
    by_name = {o.name.lower(): (i, o) for i, o in inner_outputs}
    outer = nested.outer
    _expand_stars(outer, [o.name for _, o in inner_outputs])
    aliases = {item.alias.lower() for item in outer.expressions if isinstance(item, exp.Alias)}
    for column in outer.find_all(exp.Column):
        if isinstance(column.this, exp.Star):
            continue
        name = column.name.lower()
        if name not in by_name and not (name in aliases and not column.table):
            returned = ", ".join(o.name for _, o in inner_outputs)
            raise UnknownColumn(
                f"the subquery '{nested.alias}' returns no column '{column.name}' (it "
                f"returns: {returned}); the outer query can use only those",
                column=column.name,
            )

    def noisy(node: exp.Expr) -> list[tuple[int, OutputColumn]]:
        return [
            by_name[c.name.lower()]
            for c in node.find_all(exp.Column)
            if c.name.lower() in by_name and by_name[c.name.lower()][1].kind in _NOISY
        ]

    where = outer.args.get("where")
    group = outer.args.get("group")
    # Rows chosen or grouped by noisy values: a SUM over them is not a sum of
    # independent, centred noises any more.
    grouping = [_group_item(g, outer) for g in (group.expressions if group else [])]
    selection_by_noise = bool(where is not None and noisy(where)) or any(noisy(g) for g in grouping)
    inner_cut = plan.having is not None or plan.limit is not None or bool(plan.offset)
    rows_exact = not inner_cut and not plan.needs_partition_selection and not selection_by_noise
    aggregated = bool(group) or any(
        isinstance(n, AGGREGATES) for item in outer.expressions for n in item.walk()
    )
    # Unnamed items are named by their text, as the inner query's are ("SUM(n)").
    items = [
        item
        if isinstance(item, exp.Alias | exp.Column)
        else exp.alias_(item, item.sql(dialect=READ_DIALECT), quoted=True)
        for item in outer.expressions
    ]
    accuracy: list[PostAccuracy] = []
    counted: dict[str, int] = {}
    hidden: list[exp.Expr] = []
    for item in items:
        node = item.unalias()
        refs = noisy(node)
        if not aggregated:
            if not refs:
                accuracy.append(PostAccuracy("exact"))
            elif (
                isinstance(node, exp.Column)
                and len(refs) == 1
                and refs[0][1].kind in ("count", "sum")
            ):
                accuracy.append(PostAccuracy("inherit", inner=refs[0][0]))
            else:
                accuracy.append(PostAccuracy("unknown"))
            continue
        if isinstance(node, exp.Count) and not isinstance(node.this, exp.Distinct):
            counted = node.this
            countable = isinstance(counted, exp.Star) or (
                isinstance(counted, exp.Column) and [o.kind for _, o in noisy(counted)] != ["avg"]
            )
            accuracy.append(PostAccuracy("rows" if countable and rows_exact else "unknown"))
            continue
        if not refs:  # a group key is exact; an aggregate of them, if the rows are
            combines = any(isinstance(n, AGGREGATES) for n in node.walk())
            accuracy.append(PostAccuracy("unknown" if combines and not rows_exact else "exact"))
            continue
        if (
            isinstance(node, exp.Sum | exp.Avg)
            and isinstance(node.this, exp.Column)
            and refs[0][1].kind in ("count", "sum")
            and not selection_by_noise
            and not inner_cut
        ):
            key = node.this.name.lower()
            if key not in counted:
                counted[key] = len(items) + len(hidden)
                hidden.append(
                    exp.alias_(
                        exp.Count(this=node.this.copy()),
                        f"{HIDDEN_PREFIX}{len(hidden)}",
                        quoted=True,
                    )
                )
            rows_column = counted[key]
            kind = "sum" if isinstance(node, exp.Sum) else "avg"
            accuracy.append(PostAccuracy(kind, inner=refs[0][0], rows_column=rows_column))  # type: ignore[arg-type]
            continue
        accuracy.append(PostAccuracy("unknown"))
    if hidden and outer.args.get("distinct"):  # DISTINCT over helper columns would
        hidden = []  # change the answer: say "unknown" instead
        accuracy = [PostAccuracy("unknown") if a.kind in ("sum", "avg") else a for a in accuracy]
    outer.set("expressions", items + hidden)
    _order_deterministically(outer, len(items))
    sql = outer.sql(dialect="duckdb")
    inner_columns = tuple((o.name, o.type) for _, o in inner_outputs)
    try:
        columns, _ = evaluate(sql, inner_columns, [])
    except OuterQueryFailed as e:
        raise UnsupportedQuery(
            f"the outer query cannot run on its subquery's columns: {e}",
            construct="outer query",
        ) from None
    return PostQuery(
        sql=sql,
        inner_columns=inner_columns,
        columns=columns[: len(items)],
        accuracy=tuple(accuracy),
        hidden=len(hidden),
        rows_exact=rows_exact,
    )


def _group_item(node: exp.Expr, outer: exp.Select) -> exp.Expr:
    """What a GROUP BY entry groups by: ``GROUP BY 1`` and ``GROUP BY alias`` name an
    item of the select list."""
    items = outer.expressions
    if isinstance(node, exp.Literal) and node.is_int and 1 <= int(node.this) <= len(items):
        return items[int(node.this) - 1].unalias()
    if isinstance(node, exp.Column) and not node.table:
        for item in items:
            if isinstance(item, exp.Alias) and item.alias.lower() == node.name.lower():
                return item.this
    return node


def _expand_stars(outer: exp.Select, names: list[str]) -> None:
    """``*`` and ``t.*`` → the subquery's columns, by name (so each has its accuracy)."""
    expanded: list[exp.Expr] = []
    for item in outer.expressions:
        node = item.unalias()
        if isinstance(node, exp.Star) or (
            isinstance(node, exp.Column) and isinstance(node.this, exp.Star)
        ):
            expanded.extend(exp.column(n, quoted=True) for n in names)
        else:
            expanded.append(item)
    outer.set("expressions", expanded)


def _order_deterministically(outer: exp.Select, visible: int) -> None:
    """Break every tie by the visible columns in turn: identical requests get identical
    rows (and LIMIT the same ones) whatever order the engine grouped in."""
    order = outer.args.get("order")
    keys = list(order.expressions) if order is not None else []
    keys += [exp.Ordered(this=exp.Literal.number(i + 1)) for i in range(visible)]
    outer.set("order", exp.Order(expressions=keys))
