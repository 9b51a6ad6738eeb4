"""Values on the wire: parameters decoded into SQL literals, results encoded as text or binary.

Parameters of the extended protocol become literals in the statement's text, built by
sqlglot (quoting is sqlglot's, never string formatting), so a bound query reaches the
pipeline exactly as if its values had been typed in: same analysis, same canonical
form, same cache key.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import struct
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from gateway.core.errors import InvalidRequest, UnsupportedQuery
from gateway.pgwire.catalog_settings import PG_TYPES, TYPE_OF_VALUE

EPOCH_2000 = dt.date(2000, 1, 1)
INT_TYPES = {20: "!q", 21: "!h", 23: "!i", 26: "!I"}
FLOAT_TYPES = {700: "!f", 701: "!d"}
TEXT_TYPES = {0, 18, 19, 25, 1042, 1043, 114, 3802, 705}
NUMERIC, BOOL, DATE = 1700, 16, 1082
_NUMBER = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$")
_SIZES = {oid: size for oid, _, size, *_ in PG_TYPES}
_ARRAY_OF = {elem: oid for oid, _, _, category, _, elem, _ in PG_TYPES if category == "A"}


def infer_parameter_types(sql: str, column_types: dict[str, str]) -> dict[int, int]:
    """Types for the ``$n`` a client left unspecified, as PostgreSQL infers them: from
    the declared column each is compared with (``age >= $1`` → int8). Only the public
    schema is read; a parameter whose column is unknown (or ambiguous) is left out.

    ``column_types``: declared column name → dpgate type, over the config's tables.
    """
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except SqlglotError:
        return {}
    found: dict[int, int] = {}
    for parameter in tree.find_all(exp.Parameter):
        try:
            index = int(parameter.name)
        except ValueError:
            continue
        parent = parameter.parent
        if isinstance(parent, exp.Paren | exp.Neg):
            parent = parent.parent
        if not isinstance(parent, exp.Binary | exp.In | exp.Between):
            continue
        column = next((c for c in parent.find_all(exp.Column)), None)
        kind = column_types.get(column.name) if column is not None else None
        if kind in TYPE_OF_VALUE:
            found[index] = TYPE_OF_VALUE[kind][0]
    return found


class ParameterError(InvalidRequest):
    """A bound parameter that cannot be read as its declared type (SQLSTATE 22P02)."""


def parameter_literal(value: bytes | None, type_oid: int, binary: bool) -> exp.Expr:
    """One Bind parameter as a SQL literal."""
    if value is None:
        return exp.Null()
    if binary:
        return _binary_parameter(value, type_oid)
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        raise ParameterError("a text parameter is not valid UTF-8") from None
    if type_oid in INT_TYPES or type_oid in FLOAT_TYPES or type_oid == NUMERIC:
        if not _NUMBER.match(text):
            raise ParameterError(f"invalid input for a numeric parameter: {text[:40]!r}")
        return _number(text.strip())
    if type_oid == BOOL:
        lowered = text.strip().lower()
        if lowered in ("t", "true", "y", "yes", "on", "1"):
            return exp.Boolean(this=True)
        if lowered in ("f", "false", "n", "no", "off", "0"):
            return exp.Boolean(this=False)
        raise ParameterError(f"invalid input for a boolean parameter: {text[:40]!r}")
    return exp.Literal.string(text)


def _number(text: str) -> exp.Expr:
    negative = text.startswith("-")
    literal = exp.Literal.number(text.lstrip("+-"))
    return exp.Neg(this=literal) if negative else literal


def _binary_parameter(value: bytes, type_oid: int) -> exp.Expr:
    try:
        if type_oid in INT_TYPES:
            return _number(str(struct.unpack(INT_TYPES[type_oid], value)[0]))
        if type_oid in FLOAT_TYPES:
            number = struct.unpack(FLOAT_TYPES[type_oid], value)[0]
            if not math.isfinite(number):
                raise ParameterError("a numeric parameter must be finite")
            return _number(repr(number))
        if type_oid == BOOL:
            if len(value) != 1:
                raise ParameterError("a binary boolean is one byte")
            return exp.Boolean(this=value != b"\0")
        if type_oid == DATE:
            (days,) = struct.unpack("!i", value)
            return exp.Literal.string((EPOCH_2000 + dt.timedelta(days=days)).isoformat())
        if type_oid in TEXT_TYPES:
            return exp.Literal.string(value.decode("utf-8"))
    except (struct.error, UnicodeDecodeError, OverflowError):
        raise ParameterError("a binary parameter does not match its declared type") from None
    raise UnsupportedQuery(
        f"binary parameters of type {type_oid} are not supported: send it as text",
        construct="parameter",
    )


def bind(sql: str, literals: list[exp.Expr]) -> str:
    """``sql`` with each ``$n`` placeholder replaced by the n-th literal."""
    if not literals:
        return sql
    try:
        tokens = sqlglot.Tokenizer(dialect="postgres").tokenize(sql)
    except SqlglotError:
        return sql  # the pipeline reports the syntax error
    out: list[str] = []
    last = 0
    for token in tokens:
        if token.token_type in (TokenType.VAR, TokenType.PARAMETER) and re.fullmatch(
            r"\$\d+", token.text
        ):
            index = int(token.text[1:]) - 1
            if not 0 <= index < len(literals):
                raise InvalidRequest(f"there is no parameter {token.text}")
            out.append(sql[last : token.start])
            out.append(f"({literals[index].sql(dialect='postgres')})")
            last = token.end + 1
    out.append(sql[last:])
    return "".join(out)


def placeholders(sql: str) -> int:
    """The highest ``$n`` used in ``sql`` (0 when none)."""
    try:
        tokens = sqlglot.Tokenizer(dialect="postgres").tokenize(sql)
    except SqlglotError:
        return 0
    found = [
        int(t.text[1:])
        for t in tokens
        if t.token_type in (TokenType.VAR, TokenType.PARAMETER) and re.fullmatch(r"\$\d+", t.text)
    ]
    return max(found, default=0)


# -- results ----------------------------------------------------------------------------

_DUCKDB_TYPES = {
    "BOOLEAN": 16,
    "TINYINT": 21,
    "SMALLINT": 21,
    "INTEGER": 23,
    "BIGINT": 20,
    "UTINYINT": 21,
    "USMALLINT": 23,
    "UINTEGER": 26,
    "UBIGINT": 20,
    "HUGEINT": 1700,
    "FLOAT": 700,
    "DOUBLE": 701,
    "DATE": 1082,
    "VARCHAR": 25,
    "TIMESTAMP": 1114,
    "TIMESTAMP WITH TIME ZONE": 1184,
}


def duckdb_type_oid(name: str) -> int:
    """The PostgreSQL type of a DuckDB result column."""
    upper = name.upper()
    if upper.endswith("[]"):
        return _ARRAY_OF.get(duckdb_type_oid(upper[:-2]), 1009)
    if upper.startswith("DECIMAL"):
        return NUMERIC
    return _DUCKDB_TYPES.get(upper, 25)


def value_type_oid(value_type: str) -> tuple[int, int]:
    """A dpgate value type (``integer``, ``real``, …) as a PostgreSQL type and size."""
    return TYPE_OF_VALUE.get(value_type, (25, -1))


def type_size(oid: int) -> int:
    return _SIZES.get(oid, -1)


def encode(value: Any, type_oid: int, binary: bool) -> bytes | None:
    """One result value in the text or binary format of ``type_oid``."""
    if value is None:
        return None
    if binary:
        return _encode_binary(value, type_oid)
    return _text(value).encode("utf-8")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, list | tuple):
        return "{" + ",".join(_array_element(v) for v in value) + "}"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _array_element(value: Any) -> str:
    if value is None:
        return "NULL"
    text = _text(value)
    if text == "" or any(c in text for c in ' ,{}"\\') or text.upper() == "NULL":
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _encode_binary(value: Any, type_oid: int) -> bytes:
    if type_oid in INT_TYPES:
        return struct.pack(INT_TYPES[type_oid], int(value))
    if type_oid in FLOAT_TYPES:
        return struct.pack(FLOAT_TYPES[type_oid], float(value))
    if type_oid == BOOL:
        return b"\1" if value else b"\0"
    if type_oid == DATE:
        day = value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
        return struct.pack("!i", (day - EPOCH_2000).days)
    if type_oid in TEXT_TYPES:
        return _text(value).encode("utf-8")
    raise UnsupportedQuery(
        f"binary results of type {type_oid} are not supported: ask for text",
        construct="result_format",
    )
