"""Evaluating a row expression of one column on one value, as every backend would.

The auditor normalises a condition on one column (``LOWER(city) = 'eger'``,
``age / 10 = 3``, ``CASE WHEN zip = '8423' THEN 1 ELSE 0 END = 1``) by evaluating it on
each value of the column's domain (``gateway/core/domain.py``): the declared values, the
integers between the bounds, or — for a text column with no declared values — the
string constants the condition names plus ``OTHER``, any string it does not name.

The evaluation must agree with what the compiled SQL computes on SQLite, PostgreSQL and
DuckDB alike (``gateway/sql/portable.py``): integer arithmetic is exact and division
truncates, a zero divisor gives NULL, ``||`` with NULL is NULL. Whatever could differ
between backends or cannot be decided for ``OTHER`` — real arithmetic, text order,
case mapping of non-ASCII text, ``LENGTH`` of an unnamed string — raises ``Unknown``, and
the caller treats the condition conservatively instead (``predicates``).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from sqlglot import exp


class Unknown(Exception):
    """The value cannot be decided the same way for every backend."""


class _Other:
    """Any text value that is none of the named constants."""

    def __reduce__(self) -> str:
        return "OTHER"  # compared by identity: read back (unpickled) as the one instance

    def __repr__(self) -> str:
        return "OTHER"


class _Folded:
    """LOWER or UPPER of ``OTHER``: equal to a constant only if that constant's case
    could have been folded from something else."""

    def __reduce__(self) -> str:
        return "FOLDED"  # compared by identity: read back (unpickled) as the one instance

    def __repr__(self) -> str:
        return "FOLDED(OTHER)"


OTHER = _Other()
FOLDED = _Folded()
_INTEGER_TYPES = {
    exp.DataType.Type.SMALLINT,
    exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT,
}
_TEXT_TYPES = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR}


def evaluate(node: exp.Expr, column: str, value: Any, named: frozenset[str] = frozenset()) -> Any:
    """The value of ``node`` when ``column`` holds ``value`` (None: NULL; numbers as int or
    Fraction; ``OTHER``: a text value outside ``named``). Truth values are True / False /
    None. Raises ``Unknown``."""
    # Case mapping differs between backends (SQLite and PostgreSQL's C locale map ASCII
    # only, DuckDB and other locales all of Unicode): decide only where both agree.
    ascii_only = _Evaluator(column, value, named, unicode=False).eval(node)
    unicode = _Evaluator(column, value, named, unicode=True).eval(node)
    if ascii_only != unicode or type(ascii_only) is not type(unicode):
        raise Unknown("depends on the backend's case mapping")
    return ascii_only


def string_constants(node: exp.Expr) -> frozenset[str]:
    """The string literals of an expression: what ``OTHER`` is known to differ from."""
    return frozenset(
        str(n.this)
        for n in node.find_all(exp.Literal)
        if isinstance(n, exp.Literal) and n.is_string
    )


def caseless(text: str) -> bool:
    """Whether no case mapping (ASCII or Unicode) can produce or change ``text``: then
    ``LOWER(x) = text`` and ``x LIKE text`` hold only for ``x = text`` on every backend."""
    return all(not ch.isalpha() and ch.lower() == ch == ch.upper() for ch in text)


def _kleene_and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _kleene_or(a: Any, b: Any) -> Any:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _is_number(v: Any) -> bool:
    return isinstance(v, int | Fraction) and not isinstance(v, bool)


class _Evaluator:
    def __init__(self, column: str, value: Any, named: frozenset[str], *, unicode: bool) -> None:
        self.column = column
        self.value = value
        self.named = named
        self.unicode = unicode

    def eval(self, node: exp.Expr) -> Any:
        method = getattr(self, "_" + type(node).__name__.lower(), None)
        if method is None:
            raise Unknown(type(node).__name__)
        return method(node)

    # -- leaves ---------------------------------------------------------------------

    def _paren(self, node: exp.Paren) -> Any:
        return self.eval(node.this)

    def _column(self, node: exp.Column) -> Any:
        if node.name.lower() != self.column:
            raise Unknown("another column")
        return self.value

    def _literal(self, node: exp.Literal) -> Any:
        if node.is_string:
            return str(node.this)
        text = str(node.this)
        try:
            return int(text)
        except ValueError:
            try:
                return Fraction(text)
            except (ValueError, ZeroDivisionError):
                raise Unknown(text) from None

    def _boolean(self, node: exp.Boolean) -> Any:
        return bool(node.this)

    def _null(self, node: exp.Null) -> Any:
        return None

    # -- logic ----------------------------------------------------------------------

    def _and(self, node: exp.And) -> Any:
        return _kleene_and(self.truth(node.this), self.truth(node.expression))

    def _or(self, node: exp.Or) -> Any:
        return _kleene_or(self.truth(node.this), self.truth(node.expression))

    def _not(self, node: exp.Not) -> Any:
        t = self.truth(node.this)
        return None if t is None else not t

    def truth(self, node: exp.Expr) -> Any:
        v = self.eval(node)
        if v is None or isinstance(v, bool):
            return v
        raise Unknown("not a truth value")

    def _is(self, node: exp.Is) -> Any:
        v = self.eval(node.this)
        target = node.expression
        if isinstance(target, exp.Null):
            return v is None
        if isinstance(target, exp.Boolean):
            return v is bool(target.this)
        raise Unknown("IS")

    # -- comparisons ----------------------------------------------------------------

    def compare(self, a: Any, b: Any, op: str) -> Any:
        if a is None or b is None:
            return None
        if _is_number(a) and _is_number(b):
            return {
                "eq": a == b,
                "neq": a != b,
                "lt": a < b,
                "lte": a <= b,
                "gt": a > b,
                "gte": a >= b,
            }[op]
        if op not in ("eq", "neq"):
            raise Unknown("order of text or booleans")  # collation-dependent
        equal = self.equal(a, b)
        return equal if op == "eq" else not equal

    def equal(self, a: Any, b: Any) -> bool:
        if isinstance(a, bool) and isinstance(b, bool):
            return a == b
        if isinstance(a, str) and isinstance(b, str):
            return a == b
        for x, y in ((a, b), (b, a)):
            if x is OTHER and isinstance(y, str) and y in self.named:
                return False  # OTHER is a value none of the named constants
            if x is FOLDED and isinstance(y, str) and y in self.named and caseless(y):
                return False  # LOWER(s) = 'c' with c caseless means s = 'c', a named one
        raise Unknown("equality")

    def _eq(self, node: exp.EQ) -> Any:
        return self.compare(self.eval(node.this), self.eval(node.expression), "eq")

    def _neq(self, node: exp.NEQ) -> Any:
        return self.compare(self.eval(node.this), self.eval(node.expression), "neq")

    def _lt(self, node: exp.LT) -> Any:
        return self.compare(self.eval(node.this), self.eval(node.expression), "lt")

    def _lte(self, node: exp.LTE) -> Any:
        return self.compare(self.eval(node.this), self.eval(node.expression), "lte")

    def _gt(self, node: exp.GT) -> Any:
        return self.compare(self.eval(node.this), self.eval(node.expression), "gt")

    def _gte(self, node: exp.GTE) -> Any:
        return self.compare(self.eval(node.this), self.eval(node.expression), "gte")

    def _between(self, node: exp.Between) -> Any:
        v = self.eval(node.this)
        low = self.compare(v, self.eval(node.args["low"]), "gte")
        high = self.compare(v, self.eval(node.args["high"]), "lte")
        return _kleene_and(low, high)

    def _in(self, node: exp.In) -> Any:
        if node.args.get("query") or not node.expressions:
            raise Unknown("IN")
        v = self.eval(node.this)
        out: Any = False
        for item in node.expressions:
            out = _kleene_or(out, self.compare(v, self.eval(item), "eq"))
        return out

    def _like(self, node: exp.Like) -> Any:
        return self.like(node, insensitive=False)

    def _ilike(self, node: exp.ILike) -> Any:
        return self.like(node, insensitive=True)

    def like(self, node: exp.Like | exp.ILike, *, insensitive: bool) -> Any:
        v = self.eval(node.this)
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise Unknown("LIKE pattern")
        p = str(pattern.this)
        if v is None:
            return None
        if v is OTHER or v is FOLDED:
            if "%" in p or "_" in p or "\\" in p or not caseless(p) or p not in self.named:
                raise Unknown("LIKE of an unnamed value")
            return False  # a pattern without wildcards is the constant itself: named
        if not isinstance(v, str):
            raise Unknown("LIKE of a non-text value")
        regex = _like_regex(p)
        # SQLite's LIKE ignores ASCII case, PostgreSQL's and DuckDB's do not: decide only
        # where both readings agree
        exact = re.fullmatch(regex, v, re.DOTALL) is not None
        ascii_folded = re.fullmatch(_like_regex(_ascii_lower(p)), _ascii_lower(v), re.DOTALL)
        readings = {exact, ascii_folded is not None}
        if insensitive:
            unicode_folded = re.fullmatch(_like_regex(p.lower()), v.lower(), re.DOTALL)
            readings = {(unicode_folded if self.unicode else ascii_folded) is not None}
        if len(readings) != 1:
            raise Unknown("LIKE depends on the backend's case rules")
        return readings.pop()

    # -- arithmetic (integers only: exact on every backend) ----------------------------

    def integers(self, node: exp.Expr) -> tuple[Any, Any]:
        a, b = self.eval(node.this), self.eval(node.expression)
        for v in (a, b):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise Unknown("arithmetic on a non-integer")
        return a, b

    def _add(self, node: exp.Add) -> Any:
        a, b = self.integers(node)
        return None if a is None or b is None else a + b

    def _sub(self, node: exp.Sub) -> Any:
        a, b = self.integers(node)
        return None if a is None or b is None else a - b

    def _mul(self, node: exp.Mul) -> Any:
        a, b = self.integers(node)
        return None if a is None or b is None else a * b

    def _div(self, node: exp.Div) -> Any:
        return self._intdiv(node)

    def _intdiv(self, node: exp.Expr) -> Any:
        a, b = self.integers(node)
        if a is None or b is None or b == 0:
            return None  # NULLIF(divisor, 0)
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q

    def _mod(self, node: exp.Mod) -> Any:
        a, b = self.integers(node)
        if a is None or b is None or b == 0:
            return None
        r = abs(a) % abs(b)
        return r if a >= 0 else -r

    def _neg(self, node: exp.Neg) -> Any:
        v = self.eval(node.this)
        if v is None:
            return None
        if not _is_number(v):
            raise Unknown("minus of a non-number")
        return -v

    def _abs(self, node: exp.Abs) -> Any:
        v = self.eval(node.this)
        if v is None:
            return None
        if not _is_number(v):
            raise Unknown("ABS of a non-number")
        return abs(v)

    def _floor(self, node: exp.Floor) -> Any:
        return self.whole(node)

    def _ceil(self, node: exp.Ceil) -> Any:
        return self.whole(node)

    def _round(self, node: exp.Round) -> Any:
        decimals = node.args.get("decimals")
        if decimals is not None and not (
            isinstance(decimals, exp.Literal) and decimals.is_int and int(decimals.this) >= 0
        ):
            raise Unknown("ROUND to tens")
        return self.whole(node)

    def whole(self, node: exp.Expr) -> Any:
        v = self.eval(node.this)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool)):
            raise Unknown("rounding a non-integer")
        return v  # an integer is its own floor, ceiling and rounding

    # -- conditional ------------------------------------------------------------------

    def _case(self, node: exp.Case) -> Any:
        if node.this is not None:
            raise Unknown("simple CASE")
        for branch in node.args.get("ifs") or []:
            if self.truth(branch.this) is True:
                return self.eval(branch.args["true"])
        default = node.args.get("default")
        return None if default is None else self.eval(default)

    def _if(self, node: exp.If) -> Any:
        if self.truth(node.this) is True:
            return self.eval(node.args["true"])
        other = node.args.get("false")
        return None if other is None else self.eval(other)

    def _coalesce(self, node: exp.Coalesce) -> Any:
        for part in [node.this, *node.expressions]:
            v = self.eval(part)
            if v is not None:
                return v
        return None

    def _nullif(self, node: exp.Nullif) -> Any:
        a, b = self.eval(node.this), self.eval(node.expression)
        return None if self.compare(a, b, "eq") is True else a

    # -- text -----------------------------------------------------------------------

    def _lower(self, node: exp.Lower) -> Any:
        return self.fold(node, upper=False)

    def _upper(self, node: exp.Upper) -> Any:
        return self.fold(node, upper=True)

    def fold(self, node: exp.Expr, *, upper: bool) -> Any:
        v = self.eval(node.this)
        if v is None:
            return None
        if v is OTHER or v is FOLDED:
            return FOLDED
        if not isinstance(v, str):
            raise Unknown("case of a non-text value")
        if self.unicode:
            return v.upper() if upper else v.lower()
        return "".join((ch.upper() if upper else ch.lower()) if ch.isascii() else ch for ch in v)

    def _dpipe(self, node: exp.DPipe) -> Any:
        a, b = self.eval(node.this), self.eval(node.expression)
        if a is None or b is None:
            return None
        return self.concat(a, b)

    def _concat(self, node: exp.Concat) -> Any:
        out: Any = ""
        for part in node.expressions:
            v = self.eval(part)
            out = self.concat(out, "" if v is None else v)
        return out

    def concat(self, a: Any, b: Any) -> Any:
        if a == "" and (b is OTHER or isinstance(b, str)):
            return b
        if b == "" and (a is OTHER or isinstance(a, str)):
            return a
        if isinstance(a, str) and isinstance(b, str):
            return a + b
        raise Unknown("concatenation with an unnamed value")

    def _length(self, node: exp.Length) -> Any:
        v = self.eval(node.this)
        if v is None:
            return None
        if not isinstance(v, str) or not v.isascii():
            raise Unknown("LENGTH")
        return len(v)

    def _trim(self, node: exp.Trim) -> Any:
        if node.args.get("expression") is not None or node.args.get("position"):
            raise Unknown("TRIM with options")
        v = self.eval(node.this)
        if v is None:
            return None
        if not isinstance(v, str) or not v.isascii():
            raise Unknown("TRIM")
        stripped = v.strip(" ")
        if stripped.strip() != stripped:
            raise Unknown("TRIM of other whitespace")
        return stripped

    def _substring(self, node: exp.Substring) -> Any:
        v = self.eval(node.this)
        start = self.eval(node.args["start"]) if node.args.get("start") else 1
        length = self.eval(node.args["length"]) if node.args.get("length") else None
        if v is None or start is None or (node.args.get("length") and length is None):
            return None
        if not isinstance(v, str) or not v.isascii() or not isinstance(start, int) or start < 1:
            raise Unknown("SUBSTRING")
        if length is not None and (not isinstance(length, int) or length < 0):
            raise Unknown("SUBSTRING")
        return v[start - 1 :] if length is None else v[start - 1 : start - 1 + length]

    def _cast(self, node: exp.Cast) -> Any:
        v = self.eval(node.this)
        target = node.to.this
        if v is None:
            return None
        if target in _INTEGER_TYPES:
            if isinstance(v, bool):
                return int(v)
            if isinstance(v, int):
                return v
        if target in _TEXT_TYPES and not node.to.expressions:
            if isinstance(v, str) or v is OTHER:
                return v
            if isinstance(v, int) and not isinstance(v, bool):
                return str(v)
        raise Unknown("CAST")


def _ascii_lower(text: str) -> str:
    return "".join(ch.lower() if ch.isascii() else ch for ch in text)


def _like_regex(pattern: str) -> str:
    """A LIKE pattern (escape character ``\\``, as the compiled SQL declares) as a regex."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return "".join(out)
