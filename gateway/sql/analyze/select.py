"""Pass 6: the select list, GROUP BY, HAVING, ORDER BY and LIMIT → a QueryPlan.

Every output is a group key, an aggregate (backed by measures), or a literal. HAVING and
ORDER BY are post-processing of the noisy outputs: an aggregate they use that the select
list does not is computed as a hidden output (and shares the query's ε like any other).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.errors import GatewayError, UnsupportedQuery
from gateway.core.plan import (
    GroupKey,
    JoinPlan,
    Measure,
    OrderKey,
    OutputColumn,
    ProbePlan,
    QueryPlan,
)
from gateway.sql.analyze.aggregates import AGGREGATES as LINEAR_AGGREGATES
from gateway.sql.analyze.aggregates import measures_for
from gateway.sql.analyze.groups import (
    is_literal,
    key_type,
    literal_value,
    narrow_domain,
    public_domain,
)
from gateway.sql.analyze.joins import resolve_join, with_matched_lookups
from gateway.sql.analyze.parse import READ_DIALECT
from gateway.sql.analyze.quantiles import (
    QUANTILE_AGGREGATES,
    SPREAD_AGGREGATES,
    quantile_measures,
    spread_measures,
)
from gateway.sql.analyze.resolve import ALLOWED_NODES, resolve_row_expression, resolve_table
from gateway.sql.analyze.wrapper import OuterQuery, limit_value
from gateway.sql.dialects import dialect

AGGREGATES = LINEAR_AGGREGATES + QUANTILE_AGGREGATES + SPREAD_AGGREGATES

ROWS_HINT = (
    "dpgate releases aggregates, not rows: ask e.g. SELECT COUNT(*) FROM t, or "
    "SELECT col, COUNT(*) FROM t GROUP BY col"
)


#: Marks a centred SUM's measure key (an AVG's, ``Measure.center``).
_CENTRED = "\x00centred:"


@dataclass
class _Builder:
    table: TableConfig
    alias: str
    grouped: bool
    where: exp.Expr | None = None
    group_keys: list[GroupKey] = field(default_factory=list)
    measures: list[Measure] = field(default_factory=list)
    outputs: list[OutputColumn] = field(default_factory=list)
    measure_keys: list[str] = field(default_factory=list)
    aggregate_outputs: dict[str, int] = field(default_factory=dict)
    #: Each group key's canonical text → its index: found by lookup, not by printing
    #: every key again for each new one (quadratic in the keys).
    group_texts: dict[str, int] = field(default_factory=dict)
    #: The canonical text of each aliased row expression of the select list → its alias
    #: (the first), made once when a group key first asks for its alias.
    item_aliases: dict[str, str] | None = None

    def measure(self, m: Measure) -> int:
        shown = m.expression.sql(dialect=dialect(None)) if m.expression is not None else ""
        key = f"{m.kind}:{shown}"
        if m.center:
            key += f"{_CENTRED}{m.center}"
        if key in self.measure_keys:
            return self.measure_keys.index(key)
        self.measure_keys.append(key)
        self.measures.append(m)
        return len(self.measures) - 1

    def aggregate_output(self, node: exp.Expr, name: str, hidden: bool) -> int:
        """The output for aggregate call ``node``, created if new."""
        key = _canonical(node)
        if key in self.aggregate_outputs:
            index = self.aggregate_outputs[key]
            if not hidden and self.outputs[index].hidden:
                self.outputs[index] = _replace(self.outputs[index], name=name, hidden=False)
            return index
        if isinstance(node, QUANTILE_AGGREGATES + SPREAD_AGGREGATES):
            return self.nonlinear_output(node, key, name, hidden)
        ms = measures_for(node, self.table, self.alias, self.grouped, centred=True)
        indices = tuple(self.measure(m) for m in ms)
        if isinstance(node, exp.Avg):
            kind, vtype = "avg", "real"
        elif isinstance(node, exp.Sum):
            kind = "sum"
            vtype = "integer" if ms[0].resolution == 1 else "real"
        else:
            kind, vtype = "count", "integer"
        self.outputs.append(
            OutputColumn(name=name, kind=kind, type=vtype, measures=indices, hidden=hidden)  # type: ignore[arg-type]
        )
        self.aggregate_outputs[key] = len(self.outputs) - 1
        return len(self.outputs) - 1

    def nonlinear_output(self, node: exp.Expr, key: str, name: str, hidden: bool) -> int:
        """A quantile (chosen on a public grid) or a VARIANCE / STDDEV output."""
        if isinstance(node, QUANTILE_AGGREGATES):
            ms, grid = quantile_measures(node, self.table, self.alias, self.grouped)
            integral = grid.integral and isinstance(node, exp.Min | exp.Max)
            out = OutputColumn(
                name=name,
                kind="quantile",
                type="integer" if integral else "real",
                measures=tuple(self.measure(m) for m in ms),
                hidden=hidden,
                quantile=grid,
            )
        else:
            kind, ms = spread_measures(node, self.table, self.alias, self.grouped)
            indices = tuple(self.measure(m) for m in ms)
            out = OutputColumn(name=name, kind=kind, type="real", measures=indices, hidden=hidden)
        self.outputs.append(out)
        self.aggregate_outputs[key] = len(self.outputs) - 1
        return len(self.outputs) - 1

    def share_uncentred_sums(self) -> None:
        """An AVG whose column is also summed uncentred (SUM, VARIANCE, STDDEV) uses that
        sum instead of a centred one of its own: one noisy measure fewer to split ε over."""
        plain = {k: i for i, k in enumerate(self.measure_keys) if not self.measures[i].center}
        target = {
            i: plain[k.split(_CENTRED)[0]]
            for i, k in enumerate(self.measure_keys)
            if self.measures[i].center and k.split(_CENTRED)[0] in plain
        }
        if not target:
            return
        kept = [i for i in range(len(self.measures)) if i not in target]
        index = {old: new for new, old in enumerate(kept)}
        remap = {i: index[target.get(i, i)] for i in range(len(self.measures))}
        self.measures = [self.measures[i] for i in kept]
        self.measure_keys = [self.measure_keys[i] for i in kept]
        self.outputs = [
            _replace(o, measures=tuple(remap[i] for i in o.measures)) for o in self.outputs
        ]

    def histograms_last(self) -> None:
        """Put the never-noised histogram measures after all the noised ones (the
        calibration's noises are indexed like the noised measures)."""
        order = sorted(range(len(self.measures)), key=lambda i: not self.measures[i].noised)
        remap = {old: new for new, old in enumerate(order)}
        self.measures = [self.measures[i] for i in order]
        self.measure_keys = [self.measure_keys[i] for i in order]
        self.outputs = [
            _replace(o, measures=tuple(remap[i] for i in o.measures)) for o in self.outputs
        ]

    def group_output(self, index: int, name: str | None, hidden: bool) -> int:
        for i, out in enumerate(self.outputs):
            if out.kind == "group_key" and out.group_index == index:
                return i
        key = self.group_keys[index]
        self.outputs.append(
            OutputColumn(
                name=name or key.name,
                kind="group_key",
                type=key.type,
                group_index=index,
                hidden=hidden,
            )
        )
        return len(self.outputs) - 1

    def find_group(self, resolved: exp.Expr) -> int | None:
        return self.group_texts.get(_canonical(resolved))

    def add_group(self, key: GroupKey) -> None:
        self.group_texts.setdefault(_canonical(key.expression), len(self.group_keys))
        self.group_keys.append(key)


def _replace(out: OutputColumn, **changes: object) -> OutputColumn:
    from dataclasses import replace

    return replace(out, **changes)  # type: ignore[arg-type]


def _canonical(node: exp.Expr) -> str:
    return node.sql(dialect=dialect(READ_DIALECT), normalize=True)


def canonical_sql(select: exp.Expr) -> str:
    """The normalised text of a statement: the cache key and the ledger's record of it.
    ``normalize`` lowercases unquoted identifiers as PostgreSQL resolves them (what
    ``normalize_identifiers`` does for this dialect, without a walk of its own)."""
    return _canonical(select)


def _aggregate_name(node: exp.Expr) -> str:
    """An unaliased aggregate's column name: its normalised text, but MEDIAN as the
    analyst wrote it (the dialect spells it PERCENTILE_CONT(0.5) WITHIN GROUP (…))."""
    if isinstance(node, exp.Median):
        return f"MEDIAN({node.this.sql(dialect=dialect(READ_DIALECT))})"
    return node.sql(dialect=dialect(READ_DIALECT))


def uncut_sql(select: exp.Expr) -> str:
    """``canonical_sql`` of the statement without its own LIMIT and OFFSET (a cut of the
    release, done in post-processing: ``gateway.pipeline.postprocess.present``)."""
    uncut = select.copy()
    uncut.set("limit", None)
    uncut.set("offset", None)
    return _canonical(uncut)


def _contains_aggregate(node: exp.Expr) -> bool:
    return any(isinstance(n, AGGREGATES) for n in node.walk())


def public_values_plan(select: exp.Select, tables: Mapping[str, TableConfig]) -> ProbePlan | None:
    """``SELECT DISTINCT col FROM t [LIMIT n]`` over a column whose values are declared
    public: the declared list itself (what BI tools ask for a filter's dropdown). With a
    WHERE, which values occur would depend on the data, so that is not answered here."""
    if not select.args.get("distinct") or len(select.expressions) != 1:
        return None
    from_ = select.args.get("from") or select.args.get("from_")
    if from_ is None or not isinstance(from_.this, exp.Table):
        return None
    if any(select.args.get(c) for c in ("where", "group", "having", "joins")):
        return None
    table, alias = resolve_table(select, tables)
    item = select.expressions[0]
    node = item.unalias()
    if not isinstance(node, exp.Column):
        return None
    resolved = resolve_row_expression(node, table, alias, where="SELECT DISTINCT")
    domain = public_domain(resolved, table)
    if domain is None:
        return None
    name = item.alias if isinstance(item, exp.Alias) else node.name
    values = list(domain)
    if select.args.get("order") is not None:
        desc = bool(select.args["order"].expressions[0].args.get("desc"))
        values.sort(key=lambda v: (v is None, str(v)), reverse=desc)
    offset = limit_value(select, "offset") or 0
    limit = limit_value(select, "limit")
    values = values[offset:] if limit is None else values[offset : offset + limit]
    return ProbePlan(columns=((name, key_type(resolved, table)),), rows=tuple((v,) for v in values))


def build_plan(
    select: exp.Select, tables: Mapping[str, TableConfig], outer: OuterQuery | None = None
) -> QueryPlan:
    """Turn one SELECT into a QueryPlan against the declared ``tables``."""
    written = select  # its canonical text (joins and all) is printed once it is accepted
    join: JoinPlan | None = None
    if select.args.get("joins"):
        select, table, join = resolve_join(select, tables)
        alias = table.name.lower()
    else:
        table, alias = resolve_table(select, tables)
        # a lookup every row matches is inner-joined by every query on the table
        join = with_matched_lookups(None, table.name.lower(), tables)
    if select.args.get("distinct"):
        raise UnsupportedQuery(
            "SELECT DISTINCT returns rows: use GROUP BY with COUNT(*)",
            construct="SELECT DISTINCT",
        )
    for clause in ("qualify", "windows", "connect", "prewhere", "sample", "locks", "into"):
        if select.args.get(clause):
            raise UnsupportedQuery(f"{clause.upper()} is not supported", construct=clause.upper())
    where_node = select.args.get("where")
    where = (
        resolve_row_expression(where_node.this, table, alias, where="WHERE")
        if where_node is not None
        else None
    )
    group_node = select.args.get("group")
    grouped = group_node is not None and bool(group_node.expressions)
    b = _Builder(table=table, alias=alias, grouped=grouped, where=where)
    items = list(select.expressions)
    aliases = {i.alias.lower(): i.unalias() for i in items if isinstance(i, exp.Alias)}
    if group_node is not None:
        for g in group_node.expressions:
            _add_group_key(b, g, items, aliases)
    for item in items:
        _add_select_item(b, item)
    if not b.measures:
        raise UnsupportedQuery(
            "the query computes no aggregate: add COUNT(*), SUM(col) or AVG(col)",
            construct="no aggregate",
        )
    having = _having(b, select, aliases)
    order_by = _order_by(
        b, list(select.args["order"].expressions) if select.args.get("order") else [], aliases
    )
    limit = limit_value(select, "limit")
    offset = limit_value(select, "offset") or 0
    b.share_uncentred_sums()
    b.histograms_last()
    outputs = b.outputs
    if outer is not None:
        outputs, order_by, limit, offset = _apply_outer(b, outer, order_by, limit, offset)
    return QueryPlan(
        table=table.name.lower(),
        measures=tuple(b.measures),
        outputs=tuple(outputs),
        where=where,
        group_keys=tuple(b.group_keys),
        having=having,
        order_by=tuple(order_by),
        limit=limit,
        offset=offset,
        canonical_sql=canonical_sql(written),
        join=join,
    )


def _add_group_key(
    b: _Builder,
    node: exp.Expr,
    items: list[exp.Expr],
    aliases: Mapping[str, exp.Expr],
) -> None:
    name: str | None = None
    if isinstance(node, exp.Literal) and node.is_int:
        position = int(node.this)
        if not 1 <= position <= len(items):
            raise UnsupportedQuery(
                f"GROUP BY {position}: there is no select item at that position",
                construct="GROUP BY position",
            )
        item = items[position - 1]
        name = item.alias_or_name if isinstance(item, exp.Alias) else None
        node = item.unalias()
    elif (
        isinstance(node, exp.Column)
        and not node.table
        and node.name.lower() in aliases
        and node.name.lower() not in b.table.columns
    ):
        name = node.name
        node = aliases[node.name.lower()]
    if _contains_aggregate(node):
        raise UnsupportedQuery("aggregates cannot be grouped by", construct="GROUP BY aggregate")
    resolved = resolve_row_expression(node, b.table, b.alias, where="GROUP BY")
    if b.find_group(resolved) is not None:
        return
    if name is None:
        name = _alias_of(b, resolved, items)
    b.add_group(
        GroupKey(
            expression=resolved,
            name=name or _key_name(resolved),
            type=key_type(resolved, b.table),
            domain=narrow_domain(public_domain(resolved, b.table), resolved, b.where),
        )
    )


def _key_name(resolved: exp.Expr) -> str:
    """A group key's default output name: the column's own name (a joined table's
    ``table.column`` shown as ``column``, as the database would name it)."""
    if isinstance(resolved, exp.Column):
        return resolved.name.rsplit(".", 1)[-1]
    return resolved.sql()


def _alias_of(b: _Builder, resolved: exp.Expr, items: list[exp.Expr]) -> str | None:
    """The alias of the select item computing the same expression as a group key."""
    if b.item_aliases is None:
        b.item_aliases = {}
        for item in items:
            if not isinstance(item, exp.Alias) or _contains_aggregate(item.this):
                continue
            try:
                candidate = resolve_row_expression(item.this, b.table, b.alias, where="SELECT")
            except GatewayError:
                continue
            b.item_aliases.setdefault(_canonical(candidate), item.alias)
    return b.item_aliases.get(_canonical(resolved))


def _add_select_item(b: _Builder, item: exp.Expr) -> None:
    node = item.unalias()
    alias = item.alias if isinstance(item, exp.Alias) else None
    if isinstance(node, exp.Star) or (
        isinstance(node, exp.Column) and isinstance(node.this, exp.Star)
    ):
        raise UnsupportedQuery(f"SELECT * returns rows. {ROWS_HINT}", construct="SELECT *")
    if isinstance(node, AGGREGATES):
        b.aggregate_output(node, alias or _aggregate_name(node), hidden=False)
        return
    if _contains_aggregate(node):
        raise UnsupportedQuery(
            "arithmetic on aggregates is not supported: select the aggregates and combine "
            "them yourself (the noisy values are yours to post-process)",
            construct="expression of aggregates",
        )
    if is_literal(node):
        value = literal_value(node)
        b.outputs.append(
            OutputColumn(
                name=alias or node.sql(),
                kind="literal",
                type="text"
                if isinstance(value, str)
                else "integer"
                if isinstance(value, int)
                else "real",
                value=value,
            )
        )
        return
    resolved = resolve_row_expression(node, b.table, b.alias, where="SELECT")
    index = b.find_group(resolved)
    if index is None:
        shown = node.sql(dialect=dialect(READ_DIALECT))
        raise UnsupportedQuery(
            f"'{shown}' is neither aggregated nor in GROUP BY. {ROWS_HINT}",
            construct="non-aggregated column",
        )
    name = alias or b.group_keys[index].name
    b.group_output(index, name, hidden=False)
    out_index = next(
        i for i, o in enumerate(b.outputs) if o.kind == "group_key" and o.group_index == index
    )
    if b.outputs[out_index].hidden or b.outputs[out_index].name != name:
        b.outputs[out_index] = _replace(b.outputs[out_index], name=name, hidden=False)


def _output_ref(b: _Builder, node: exp.Expr, aliases: Mapping[str, exp.Expr], clause: str) -> int:
    """The output index that ``node`` (in HAVING or ORDER BY) refers to."""
    if isinstance(node, exp.Column) and not node.table:
        lowered = node.name.lower()
        for i, out in enumerate(b.outputs):
            if out.name.lower() == lowered and not out.hidden:
                return i
        if lowered in aliases and lowered not in b.table.columns:
            node = aliases[lowered]
    if isinstance(node, AGGREGATES):
        return b.aggregate_output(node, f"__{clause.lower()}_{len(b.outputs)}", hidden=True)
    if _contains_aggregate(node):
        raise UnsupportedQuery(
            f"{clause} may use aggregates and group keys, not expressions of aggregates",
            construct=f"expression of aggregates in {clause}",
        )
    resolved = resolve_row_expression(node, b.table, b.alias, where=clause)
    index = b.find_group(resolved)
    if index is None:
        raise UnsupportedQuery(
            f"{clause} refers to '{node.sql()}', which is neither an aggregate nor a group key",
            construct=f"non-aggregated column in {clause}",
        )
    return b.group_output(index, None, hidden=True)


def _having(b: _Builder, select: exp.Select, aliases: Mapping[str, exp.Expr]) -> exp.Expr | None:
    node = select.args.get("having")
    if node is None:
        return None
    condition = node.this.copy()

    def to_output(n: exp.Expr) -> exp.Expr:
        if isinstance(n, AGGREGATES) or (
            isinstance(n, exp.Column) and not isinstance(n.parent, AGGREGATES)
        ):
            index = _output_ref(b, n, aliases, "HAVING")
            return exp.column(f"__out{index}")
        return n

    rewritten = condition.transform(to_output)
    for sub in rewritten.walk():
        if not isinstance(sub, ALLOWED_NODES):
            raise UnsupportedQuery(
                f"{sub.key.upper()} is not supported in HAVING", construct="HAVING"
            )
    return rewritten


def _order_by(
    b: _Builder, ordered: list[exp.Expr], aliases: Mapping[str, exp.Expr]
) -> list[OrderKey]:
    keys: list[OrderKey] = []
    visible = [i for i, o in enumerate(b.outputs) if not o.hidden]
    for o in ordered:
        node = o.this if isinstance(o, exp.Ordered) else o
        desc = bool(o.args.get("desc")) if isinstance(o, exp.Ordered) else False
        if isinstance(node, exp.Literal) and node.is_int:
            position = int(node.this)
            if not 1 <= position <= len(visible):
                raise UnsupportedQuery(
                    f"ORDER BY {position}: there is no select item at that position",
                    construct="ORDER BY position",
                )
            keys.append(OrderKey(visible[position - 1], desc))
            continue
        keys.append(OrderKey(_output_ref(b, node, aliases, "ORDER BY"), desc))
    return keys


def _apply_outer(
    b: _Builder, outer: OuterQuery, order_by: list[OrderKey], limit: int | None, offset: int
) -> tuple[list[OutputColumn], list[OrderKey], int | None, int]:
    outputs = list(b.outputs)
    if outer.columns is not None:
        by_name = {o.name.lower(): i for i, o in enumerate(outputs) if not o.hidden}
        chosen: list[int] = []
        for inner_name, outer_name in outer.columns:
            index = by_name.get(inner_name.lower())
            if index is None:
                raise UnsupportedQuery(
                    f"the outer query names '{inner_name}', which the inner query does not return",
                    construct="unknown column of a subquery",
                )
            chosen.append(index)
            outputs[index] = _replace(outputs[index], name=outer_name)
        for i, o in enumerate(outputs):
            if not o.hidden and i not in chosen:
                outputs[i] = _replace(o, hidden=True)
        # The released columns come in the outer query's order.
        order = chosen + [i for i in range(len(outputs)) if i not in chosen]
        remap = {old: new for new, old in enumerate(order)}
        outputs = [outputs[i] for i in order]
        order_by = [OrderKey(remap[k.output], k.descending) for k in order_by]
    if outer.order_by:
        if limit is not None or offset:
            raise UnsupportedQuery(
                "ORDER BY outside a subquery that has its own LIMIT is not supported",
                construct="ORDER BY over a limited subquery",
            )
        names = {o.name.lower(): i for i, o in enumerate(outputs) if not o.hidden}
        visible = [i for i, o in enumerate(outputs) if not o.hidden]
        order_by = []
        for ordered in outer.order_by:
            node = ordered.this
            desc = bool(ordered.args.get("desc"))
            if (
                isinstance(node, exp.Literal)
                and node.is_int
                and 1 <= int(node.this) <= len(visible)
            ):
                order_by.append(OrderKey(visible[int(node.this) - 1], desc))
            elif isinstance(node, exp.Column) and node.name.lower() in names:
                order_by.append(OrderKey(names[node.name.lower()], desc))
            else:
                raise UnsupportedQuery(
                    "the outer query may order only by the inner query's columns",
                    construct="ORDER BY outside a subquery",
                )
    if outer.limit is not None or outer.offset:
        start = offset + outer.offset
        inner_end = None if limit is None else offset + limit
        outer_end = None if outer.limit is None else start + outer.limit
        ends = [e for e in (inner_end, outer_end) if e is not None]
        end = min(ends) if ends else None
        offset = start
        limit = None if end is None else max(0, end - start)
    return outputs, order_by, limit, offset
