"""Pass 3b: every accepted row expression is total, and cheap per row.

A runtime error is an oracle: ``ABS(CASE WHEN <secret> THEN -2^63 ELSE 0 END)`` fails
exactly when someone matches. Charging failures makes the oracle cost, but does not
close it. So an expression the analyzer accepts must evaluate without error for every
value its columns can hold, on every supported backend (SQLite, PostgreSQL, DuckDB),
and cost bounded time per row. This pass checks, before anything runs:

- **Types.** Operators get operands of the types they are defined for on every backend:
  arithmetic on numbers, LIKE/LOWER/LENGTH/|| on text, AND/OR/NOT/CASE WHEN on booleans,
  comparisons between comparable types (no text = number, no boolean = number: both fail
  on PostgreSQL). CAST only where no value can fail it (never from text to a number or
  a date, never to a narrower type than the value's range).
- **Ranges.** Every numeric subexpression has an interval, computed from declared bounds
  and literals; arithmetic and numeric functions need them (an unbounded column cannot
  be proven not to overflow), and every intermediate result stays within ±2^53, so it is
  exact as a double and far from the 64-bit integer edges.
- **Caps** on what one row can cost: literal magnitude and length, LIKE patterns, IN
  lists, expression depth and size. Going over one is an ``unsupported_query`` naming
  the limit (``detail.limit``).

The compiler does the rest (``gateway/sql/compile.py``): numeric columns that flow into
arithmetic or functions are clamped to their declared bounds (data outside them cannot
reach an operator the intervals did not account for) and widened to 64-bit integers or
doubles; divisors are wrapped in NULLIF (x / 0 is NULL everywhere); LIKE gets an explicit
ESCAPE. Together they make the language total; ``tests/test_totality.py`` evaluates
generated expressions on adversarial rows on all three backends.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.errors import UnsupportedQuery

#: Largest magnitude of a numeric literal.
MAX_LITERAL_MAGNITUDE = 10**15
#: Largest magnitude of any intermediate numeric result: exact as a double, and 1,024
#: times inside the 64-bit integer range.
MAX_RESULT_MAGNITUDE = 2**53
#: Longest string literal (characters): bounds comparison and concatenation cost.
MAX_STRING_LITERAL = 256
#: Longest LIKE pattern, and most '%' wildcards in one: LIKE backtracks over '%', so its
#: cost per row grows with their number.
MAX_LIKE_PATTERN = 64
MAX_LIKE_WILDCARDS = 4
#: Most values in one IN list.
MAX_IN_LIST = 1_000
#: Deepest nesting, and most nodes, in one row expression (the values of IN lists are
#: not counted: a list is matched by lookup, not one comparison per value). A chain of
#: one connective (``a AND b AND c``, ``x = 1 OR x = 2 OR …``) is one level however long
#: it is: the parser builds it as a left-deep tree, but it is a list of terms, and its
#: length is bounded by ``MAX_NODES`` here and by ``limits.MAX_CONNECTIVES`` before
#: parsing.
MAX_DEPTH = 32
MAX_NODES = 512
#: Most characters of string literals in one row expression, and most LIKE / ILIKE
#: matches: a LIKE costs about (subject length × pattern length) per row, and subjects
#: are built from columns and literals, so these two bound the costliest match.
MAX_STRING_CHARS = 1_024
MAX_LIKES = 8
#: SUBSTRING positions and lengths, ROUND decimals.
MAX_SUBSTRING = 10**6
MAX_ROUND_DECIMALS = 10
#: The largest length a text value can have on any backend (PostgreSQL: 1 GB).
MAX_TEXT_LENGTH = 2**31

Kind = Literal["integer", "real", "text", "boolean", "date", "null"]
NUMERIC: tuple[Kind, ...] = ("integer", "real")

#: Integer CAST targets and the range they hold.
_INTEGER_TARGETS: dict[object, int] = {
    exp.DataType.Type.SMALLINT: 2**15 - 1,
    exp.DataType.Type.INT: 2**31 - 1,
    exp.DataType.Type.BIGINT: 2**63 - 1,
}
_REAL_TARGETS = {
    exp.DataType.Type.DOUBLE,
    exp.DataType.Type.FLOAT,
}
_TEXT_TARGETS = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR}

_SYMBOLS: dict[type[exp.Expr], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}
_COMPARISONS = tuple(_SYMBOLS)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul)


@dataclass(frozen=True)
class Typed:
    """The type of a row expression and, for numbers, the interval of its values
    (``None``: unbounded). ``literal`` keeps a string literal's value (date checks)."""

    kind: Kind
    low: float | None = None
    high: float | None = None
    literal: str | None = None

    @property
    def bounded(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def magnitude(self) -> float:
        assert self.low is not None and self.high is not None
        return max(abs(self.low), abs(self.high))


def check_total(node: exp.Expr, table: TableConfig, *, where: str, boolean: bool = False) -> Typed:
    """Check a resolved row expression (columns are bare, lower-case names of ``table``);
    return its type, or raise ``UnsupportedQuery`` naming what could fail or cost too
    much. ``boolean``: the clause needs a condition (WHERE)."""
    check_size(node, where)
    typed = _Checker(table, where).check(node)
    if boolean and typed.kind not in ("boolean", "null"):
        raise UnsupportedQuery(
            f"{where} needs a condition (true or false), not a {typed.kind} value",
            construct=f"{typed.kind} as a condition",
        )
    return typed


class ExpressionTypes:
    """Types and intervals of the subexpressions of accepted expressions, for the
    compiler: each node is typed once (a subtree's type is looked up, not recomputed,
    when its parent is typed)."""

    def __init__(self, table: TableConfig) -> None:
        self._checker = _Checker(table, "an expression", memo={})

    def of(self, node: exp.Expr) -> Typed:
        return self._checker.check(node)


def check_size(node: exp.Expr, where: str) -> None:
    """Refuse a row expression past the caps on its size (depth, nodes, IN list, string
    characters, LIKEs). A column counts as itself and its name, however qualified, so
    the measure is the same before columns are resolved (``resolve`` checks it first,
    before the work that grows with the expression) and after."""
    nodes = chars = likes = 0
    listed: set[int] = set()
    for sub, depth in _with_depth(node):
        if isinstance(sub, exp.In):
            if len(sub.expressions) > MAX_IN_LIST:
                raise _limit(
                    f"an IN list in {where} has more than {MAX_IN_LIST} values",
                    "max_in_list",
                    MAX_IN_LIST,
                )
            listed.update(id(v) for v in sub.expressions if isinstance(v, exp.Literal))
        if id(sub) not in listed:
            nodes += 1
            if isinstance(sub, exp.Literal) and sub.is_string:
                chars += len(str(sub.this))
        likes += isinstance(sub, exp.Like | exp.ILike)
        if nodes > MAX_NODES:
            raise _limit(f"the expression in {where} is too large", "max_nodes", MAX_NODES)
        if depth > MAX_DEPTH:
            raise _limit(f"the expression in {where} is nested too deeply", "max_depth", MAX_DEPTH)
        if chars > MAX_STRING_CHARS:
            raise _limit(
                f"the string literals in {where} are longer than {MAX_STRING_CHARS} characters "
                "in all",
                "max_string_chars",
                MAX_STRING_CHARS,
            )
        if likes > MAX_LIKES:
            raise _limit(f"{where} has more than {MAX_LIKES} LIKE matches", "max_likes", MAX_LIKES)


def _with_depth(node: exp.Expr) -> Iterator[tuple[exp.Expr, int]]:
    """Each node of ``node`` (parents before children) with its depth, ``node`` at 0,
    where a connective chained in another of its kind (``AND`` under ``AND``, ``OR``
    under ``OR``) is the same level as its parent: the depth of the expression as
    written, not of sqlglot's left-deep tree. Iterative: no recursion on any tree."""
    stack = [(node, 0)]
    while stack:
        sub, depth = stack.pop()
        yield sub, depth
        chain = type(sub) if isinstance(sub, exp.Connector) else None
        if isinstance(sub, exp.Column):  # its name; a qualifier is resolved away
            if isinstance(sub.this, exp.Expr):
                stack.append((sub.this, depth + 1))
            continue
        for child in reversed(list(sub.iter_expressions())):
            stack.append((child, depth if type(child) is chain else depth + 1))


def _limit(message: str, limit: str, value: int) -> UnsupportedQuery:
    return UnsupportedQuery(
        f"{message} (limit: {limit} = {value})", construct=f"limit {limit}", limit=limit
    )


class _Checker:
    def __init__(
        self, table: TableConfig, where: str, memo: dict[int, Typed] | None = None
    ) -> None:
        self.table = table
        self.where = where
        self.memo = memo  # by node identity; the nodes must outlive the checker

    def check(self, node: exp.Expr) -> Typed:
        if self.memo is None:
            return self._check(node)
        typed = self.memo.get(id(node))
        if typed is None:
            typed = self.memo[id(node)] = self._check(node)
        return typed

    def refuse(self, message: str, construct: str) -> UnsupportedQuery:
        return UnsupportedQuery(f"{message} (in {self.where})", construct=construct)

    # -- dispatch ------------------------------------------------------------------------

    def _check(self, node: exp.Expr) -> Typed:
        if isinstance(node, exp.Paren):
            return self.check(node.this)
        if isinstance(node, exp.Column):
            return self.column(node)
        if isinstance(node, exp.Literal):
            return self.literal(node)
        if isinstance(node, exp.Boolean):
            return Typed("boolean", 0, 1)
        if isinstance(node, exp.Null):
            return Typed("null")
        if isinstance(node, exp.And | exp.Or):
            self.condition(node.this)
            self.condition(node.expression)
            return Typed("boolean", 0, 1)
        if isinstance(node, exp.Not):
            self.condition(node.this)
            return Typed("boolean", 0, 1)
        if isinstance(node, _COMPARISONS):
            symbol = _SYMBOLS[type(node)]
            self.comparable(self.check(node.this), self.check(node.expression), symbol)
            return Typed("boolean", 0, 1)
        if isinstance(node, exp.Between):
            subject = self.check(node.this)
            for bound in (node.args["low"], node.args["high"]):
                self.comparable(subject, self.check(bound), "BETWEEN")
            return Typed("boolean", 0, 1)
        if isinstance(node, exp.In):
            return self.in_list(node)
        if isinstance(node, exp.Is):
            return self.is_(node)
        if isinstance(node, exp.Like | exp.ILike):
            return self.like(node)
        if isinstance(node, _ARITHMETIC):
            return self.arithmetic(node)
        if isinstance(node, exp.Div | exp.IntDiv):
            return self.division(node)
        if isinstance(node, exp.Mod):
            return self.modulo(node)
        if isinstance(node, exp.Neg):
            t = self.number(node.this, "unary minus")
            return Typed(t.kind, -t.magnitude, t.magnitude) if t.bounded else t
        if isinstance(node, exp.Abs):
            t = self.number(node.this, "ABS")
            return Typed(t.kind, 0, t.magnitude)
        if isinstance(node, exp.Floor | exp.Ceil):
            return self.floor_ceil(node)
        if isinstance(node, exp.Round):
            return self.round(node)
        if isinstance(node, exp.Case | exp.If):
            return self.case(node)
        if isinstance(node, exp.Coalesce):
            return self.unify([node.this, *node.expressions], "COALESCE")
        if isinstance(node, exp.Cast):
            return self.cast(node)
        if isinstance(node, exp.Lower | exp.Upper):
            self.text(node.this, node.sql_name())
            return Typed("text")
        if isinstance(node, exp.Trim):
            return self.trim(node)
        if isinstance(node, exp.Length):
            self.text(node.this, "LENGTH")
            return Typed("integer", 0, MAX_TEXT_LENGTH)
        if isinstance(node, exp.Substring):
            return self.substring(node)
        if isinstance(node, exp.DPipe):
            self.text(node.this, "||")
            self.text(node.expression, "||")
            return Typed("text")
        if isinstance(node, exp.Concat):
            for part in node.expressions:
                self.text(part, "CONCAT")
            return Typed("text")
        raise self.refuse(f"{node.key.upper()} is not supported here", node.key.upper())

    # -- leaves --------------------------------------------------------------------------

    def column(self, node: exp.Column) -> Typed:
        col = self.table.columns[node.name]
        if col.type == "boolean":
            return Typed("boolean", 0, 1)
        if col.numeric and col.bounded:
            return Typed(col.type, col.lower, col.upper)
        return Typed(col.type)

    def literal(self, node: exp.Literal) -> Typed:
        if node.is_string:
            text = str(node.this)
            if len(text) > MAX_STRING_LITERAL:
                raise _limit(
                    f"a string literal in {self.where} is longer than {MAX_STRING_LITERAL} "
                    "characters",
                    "max_string_literal",
                    MAX_STRING_LITERAL,
                )
            return Typed("text", literal=text)
        try:
            value = float(str(node.this))
        except ValueError:
            raise self.refuse(f"cannot read the number {node.this!r}", "number") from None
        tiny = value == 0 and any(d in "123456789" for d in str(node.this).split("e")[0])
        if (
            not math.isfinite(value)
            or abs(value) > MAX_LITERAL_MAGNITUDE
            or tiny
            or 0 < abs(value) < 1 / MAX_LITERAL_MAGNITUDE
        ):
            raise _limit(
                f"the number {node.this} in {self.where} is beyond ±10^15 or closer to zero "
                "than 10^-15",
                "max_literal_magnitude",
                MAX_LITERAL_MAGNITUDE,
            )
        return Typed("integer" if node.is_int else "real", value, value)

    # -- conditions ----------------------------------------------------------------------

    def condition(self, node: exp.Expr) -> None:
        t = self.check(node)
        if t.kind not in ("boolean", "null"):
            raise self.refuse(
                f"'{node.sql()}' is a {t.kind} value, not a condition", f"{t.kind} as a condition"
            )

    def comparable(self, left: Typed, right: Typed, what: str) -> None:
        kinds = {left.kind, right.kind} - {"null"}
        if len(kinds) <= 1 or kinds <= set(NUMERIC):
            return
        if kinds == {"date", "text"}:
            text = left if left.kind == "text" else right
            if text.literal is not None and _is_iso_date(text.literal):
                return
            raise self.refuse(
                "a date can be compared with a date or a literal 'YYYY-MM-DD'", "date comparison"
            )
        a, b = sorted(kinds)
        raise self.refuse(
            f"'{what}' between {a} and {b} values is not supported: compare values of one "
            "type (quote text, write booleans as TRUE/FALSE)",
            f"{a} compared with {b}",
        )

    def in_list(self, node: exp.In) -> Typed:
        values = node.expressions
        if isinstance(node.this, exp.Tuple):
            raise self.refuse("IN over a tuple of columns is not supported", "tuple IN")
        subject = self.check(node.this)
        for value in values:
            self.comparable(subject, self.check(value), "IN")
        return Typed("boolean", 0, 1)

    def is_(self, node: exp.Is) -> Typed:
        subject = self.check(node.this)
        target = node.expression
        if isinstance(target, exp.Boolean) and subject.kind not in ("boolean", "null"):
            raise self.refuse(
                f"IS {target.sql()} needs a condition, not a {subject.kind} value",
                f"IS {target.sql()} of a {subject.kind}",
            )
        if not isinstance(target, exp.Null | exp.Boolean):
            raise self.refuse("IS takes NULL, TRUE or FALSE", "IS")
        return Typed("boolean", 0, 1)

    def like(self, node: exp.Like | exp.ILike) -> Typed:
        name = "ILIKE" if isinstance(node, exp.ILike) else "LIKE"
        self.text(node.this, name)
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self.refuse(f"the {name} pattern must be a string literal", f"{name} pattern")
        text = str(pattern.this)
        if len(text) > MAX_LIKE_PATTERN:
            raise _limit(
                f"a {name} pattern is longer than {MAX_LIKE_PATTERN} characters",
                "max_like_pattern",
                MAX_LIKE_PATTERN,
            )
        if text.count("%") > MAX_LIKE_WILDCARDS:
            raise _limit(
                f"a {name} pattern has more than {MAX_LIKE_WILDCARDS} '%' wildcards",
                "max_like_wildcards",
                MAX_LIKE_WILDCARDS,
            )
        if _ends_with_escape(text):
            raise self.refuse(
                f"a {name} pattern cannot end with the escape character '\\'",
                f"{name} pattern ending with an escape",
            )
        return Typed("boolean", 0, 1)

    # -- numbers -------------------------------------------------------------------------

    def number(self, node: exp.Expr, what: str) -> Typed:
        """A numeric operand of ``what``, with a known interval."""
        t = self.check(node)
        if t.kind == "null":
            return Typed("integer", 0, 0)
        if t.kind not in NUMERIC:
            raise self.refuse(f"{what} needs numbers, not {t.kind} values", f"{what} of {t.kind}")
        if not t.bounded:
            hint = ""
            if isinstance(node, exp.Column):
                hint = f" (declare columns.{node.name}.lower and upper in the config)"
            raise self.refuse(
                f"{what} needs declared bounds for '{node.sql()}', so that it cannot "
                f"overflow{hint}",
                f"{what} of an unbounded value",
            )
        return t

    def result(self, kind: Kind, low: float, high: float, what: str) -> Typed:
        if max(abs(low), abs(high)) > MAX_RESULT_MAGNITUDE:
            raise _limit(
                f"{what} in {self.where} can reach beyond ±2^53 for values within the "
                "declared bounds",
                "max_result_magnitude",
                MAX_RESULT_MAGNITUDE,
            )
        return Typed(kind, low, high)

    def arithmetic(self, node: exp.Expr) -> Typed:
        what = "+" if isinstance(node, exp.Add) else "-" if isinstance(node, exp.Sub) else "*"
        a = self.number(node.this, what)
        b = self.number(node.expression, what)
        kind: Kind = "integer" if a.kind == b.kind == "integer" else "real"
        assert a.low is not None and a.high is not None and b.low is not None
        assert b.high is not None
        if isinstance(node, exp.Add):
            return self.result(kind, a.low + b.low, a.high + b.high, what)
        if isinstance(node, exp.Sub):
            return self.result(kind, a.low - b.high, a.high - b.low, what)
        products = [x * y for x in (a.low, a.high) for y in (b.low, b.high)]
        return self.result(kind, min(products), max(products), what)

    def division(self, node: exp.Div | exp.IntDiv) -> Typed:
        a = self.number(node.this, "/")
        b = self.number(node.expression, "/")
        if a.kind == b.kind == "integer" or isinstance(node, exp.IntDiv):
            # |a / b| ≤ |a| for any integer b ≠ 0; b = 0 gives NULL (NULLIF).
            if b.kind != "integer":
                raise self.refuse("integer division needs an integer divisor", "DIV of a real")
            return Typed("integer", -a.magnitude, a.magnitude)
        if b.kind == "integer":
            return Typed("real", -a.magnitude, a.magnitude)
        divisor = node.expression.unnest() if isinstance(node.expression, exp.Paren) else None
        literal = divisor if divisor is not None else node.expression
        if isinstance(literal, exp.Neg):
            literal = literal.this
        if isinstance(literal, exp.Literal) and b.magnitude > 0:
            smallest = b.magnitude  # a literal's interval is one point
            return self.result("real", -a.magnitude / smallest, a.magnitude / smallest, "/")
        raise self.refuse(
            "division by a real-valued expression can overflow when it is close to zero: "
            "divide by a number literal or an integer expression",
            "division by a real expression",
        )

    def modulo(self, node: exp.Mod) -> Typed:
        a = self.number(node.this, "%")
        b = self.number(node.expression, "%")
        if a.kind != "integer" or b.kind != "integer":
            raise self.refuse("% needs integers", "% of a real")
        bound = min(a.magnitude, b.magnitude)
        return Typed("integer", -bound, bound)

    def floor_ceil(self, node: exp.Floor | exp.Ceil) -> Typed:
        name = node.sql_name()
        if node.args.get("decimals") is not None or node.args.get("to") is not None:
            raise self.refuse(f"{name} takes one argument", f"{name} with a scale")
        t = self.number(node.this, name)
        assert t.low is not None and t.high is not None
        return Typed(t.kind, math.floor(t.low), math.ceil(t.high))

    def round(self, node: exp.Round) -> Typed:
        t = self.number(node.this, "ROUND")
        assert t.low is not None and t.high is not None
        decimals = node.args.get("decimals")
        if decimals is None:
            return Typed(t.kind, math.floor(t.low), math.ceil(t.high))
        if not (
            isinstance(decimals, exp.Literal)
            and decimals.is_int
            and 0 <= int(decimals.this) <= MAX_ROUND_DECIMALS
        ):
            raise self.refuse(
                f"ROUND's decimals must be a whole number from 0 to {MAX_ROUND_DECIMALS}",
                "ROUND decimals",
            )
        return Typed(t.kind, math.floor(t.low), math.ceil(t.high))

    # -- choices and casts ---------------------------------------------------------------

    def case(self, node: exp.Case | exp.If) -> Typed:
        branches: list[exp.Expr] = []
        if isinstance(node, exp.If):
            self.condition(node.this)
            branches = [node.args["true"], node.args.get("false") or exp.Null()]
            return self.unify(branches, "IF")
        operand = node.this
        subject = self.check(operand) if operand is not None else None
        for when in node.args.get("ifs") or []:
            if subject is not None:
                self.comparable(subject, self.check(when.this), "CASE")
            else:
                self.condition(when.this)
            branches.append(when.args["true"])
        branches.append(node.args.get("default") or exp.Null())
        return self.unify(branches, "CASE")

    def unify(self, nodes: list[exp.Expr], what: str) -> Typed:
        types = [self.check(n) for n in nodes]
        kinds = {t.kind for t in types} - {"null"}
        if not kinds:
            return Typed("null")
        if len(kinds) > 1 and not kinds <= set(NUMERIC):
            raise self.refuse(
                f"the values of {what} must have one type (found {', '.join(sorted(kinds))})",
                f"{what} of mixed types",
            )
        kind: Kind = "real" if kinds == {"integer", "real"} else next(iter(kinds))
        if kind not in NUMERIC:
            return Typed(kind)
        numbers = [t for t in types if t.kind != "null"]
        if not all(t.bounded for t in numbers):
            return Typed(kind)
        return Typed(
            kind,
            min(t.low for t in numbers if t.low is not None),
            max(t.high for t in numbers if t.high is not None),
        )

    def cast(self, node: exp.Cast) -> Typed:
        to = node.to
        target = to.this
        source = self.check(node.this)
        if to.expressions and target not in _TEXT_TARGETS:
            raise self.refuse(
                f"CAST to {to.sql()} is not supported (its precision can overflow)",
                f"CAST to {to.sql()}",
            )
        if target in _TEXT_TARGETS:
            return Typed("text")
        if source.kind == "text":
            literal = source.literal
            if target == exp.DataType.Type.DATE and literal is not None and _is_iso_date(literal):
                return Typed("date")
            raise self.refuse(
                f"CAST from text to {to.sql()} fails on some values and is not supported",
                f"CAST text to {to.sql()}",
            )
        if target in _INTEGER_TARGETS:
            if source.kind == "boolean":
                if target != exp.DataType.Type.INT:  # PostgreSQL casts booleans to INT only
                    raise self.refuse(
                        f"CAST of a boolean to {to.sql()}: use CAST(… AS INTEGER)",
                        f"CAST boolean to {to.sql()}",
                    )
                return Typed("integer", 0, 1)
            if source.kind == "real":
                raise self.refuse(
                    "CAST of a real to an integer rounds differently on each database: use "
                    "FLOOR, CEIL or ROUND",
                    "CAST real to integer",
                )
            t = self.number(node.this, "CAST")
            if t.magnitude > _INTEGER_TARGETS[target]:
                raise self.refuse(
                    f"CAST to {to.sql()} can overflow for values within the declared bounds",
                    f"CAST to {to.sql()}",
                )
            return Typed("integer", t.low, t.high)
        if target in _REAL_TARGETS:
            if source.kind not in (*NUMERIC, "null"):
                raise self.refuse(f"CAST of {source.kind} to a number", f"CAST {source.kind}")
            if target == exp.DataType.Type.FLOAT:
                # single precision overflows past ±3.4e38: only values known to fit
                t = self.number(node.this, "CAST")
                return Typed("real", t.low, t.high)
            return Typed("real", source.low, source.high)
        if target == exp.DataType.Type.BOOLEAN:
            if source.kind not in ("boolean", "integer", "null"):
                raise self.refuse(f"CAST of {source.kind} to BOOLEAN", f"CAST {source.kind}")
            return Typed("boolean", 0, 1)
        if target == exp.DataType.Type.DATE and source.kind in ("date", "null"):
            return Typed("date")
        raise self.refuse(f"CAST to {to.sql()} is not supported", f"CAST to {to.sql()}")

    # -- text ----------------------------------------------------------------------------

    def text(self, node: exp.Expr, what: str) -> Typed:
        t = self.check(node)
        if t.kind not in ("text", "null"):
            raise self.refuse(
                f"{what} needs text, not {t.kind} values (CAST(… AS TEXT) first)",
                f"{what} of {t.kind}",
            )
        return t

    def trim(self, node: exp.Trim) -> Typed:
        self.text(node.this, "TRIM")
        chars = node.expression
        if chars is not None:
            self.text(chars, "TRIM")
        return Typed("text")

    def substring(self, node: exp.Substring) -> Typed:
        self.text(node.this, "SUBSTRING")
        start, length = node.args.get("start"), node.args.get("length")
        for arg, low, name in ((start, 1, "start"), (length, 0, "length")):
            if arg is None:
                continue
            if not (
                isinstance(arg, exp.Literal)
                and arg.is_int
                and low <= int(arg.this) <= MAX_SUBSTRING
            ):
                raise self.refuse(
                    f"SUBSTRING's {name} must be a whole number from {low} to {MAX_SUBSTRING}",
                    f"SUBSTRING {name}",
                )
        return Typed("text")


def _is_iso_date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return len(text) == 10


def _ends_with_escape(pattern: str) -> bool:
    trailing = len(pattern) - len(pattern.rstrip("\\"))
    return trailing % 2 == 1
