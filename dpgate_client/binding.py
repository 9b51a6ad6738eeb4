"""Client-side parameter binding: placeholders become safely quoted SQL literals.

The gateway's HTTP contract carries SQL text only, so the DB-API driver renders each
parameter as a literal. Safety comes from two rules, not from escaping tricks:

* placeholders are found by a scanner that skips string literals, quoted identifiers
  and comments, so a ``:name`` or ``?`` inside them is never replaced;
* only scalars are rendered, each by a fixed rule: ``None`` → ``NULL``, ``bool`` →
  ``TRUE``/``FALSE``, ``int`` → digits, finite ``float``/``Decimal`` → a numeric
  literal, ``str`` → ``'…'`` with ``'`` doubled (NUL refused), ``date`` /
  ``datetime`` / ``time`` → their ISO text quoted; numpy scalars as the Python scalar
  they hold. Anything else (bytes, lists, arrays, tuples, dicts, sets, arbitrary
  objects) is refused with ``ProgrammingError`` rather than turned into text by
  ``str()``.

Paramstyle is ``named`` (``:name`` with a mapping); a sequence binds ``?``
placeholders in order (``qmark``), for tools that prefer it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dpgate_client.errors import NotSupportedError, ProgrammingError

__all__ = ["bind", "render_literal"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def render_literal(value: Any) -> str:
    """One Python scalar as a SQL literal, or ``ProgrammingError`` if it is not one."""
    if value is None:
        return "NULL"
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        # numpy scalars (what pandas hands out) become the Python scalar they hold;
        # numpy arrays stay non-scalars and are refused below.
        return render_literal(value.item())
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProgrammingError(f"cannot bind a non-finite float ({value!r}) as a SQL literal")
        return repr(float(value))
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ProgrammingError(f"cannot bind a non-finite Decimal ({value}) as a SQL literal")
        return format(value, "f")
    if isinstance(value, str):
        if "\x00" in value:
            raise ProgrammingError("cannot bind a string containing a NUL character")
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, dt.datetime):
        return "'" + value.isoformat(sep=" ") + "'"
    if isinstance(value, dt.date | dt.time):
        return "'" + value.isoformat() + "'"
    if isinstance(value, bytes | bytearray | memoryview):
        raise NotSupportedError("dpgate does not accept binary parameters")
    raise ProgrammingError(
        f"cannot bind a value of type {type(value).__name__}: dpgate binds only scalars "
        "(None, bool, int, float, Decimal, str, date, datetime, time)"
    )


def _scan(sql: str) -> list[tuple[int, int, str]]:
    """The placeholders in ``sql`` as (start, end, name-or-'?'), outside quotes/comments."""
    found: list[tuple[int, int, str]] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in ("'", '"', "`"):
            i += 1
            while i < n:
                if sql[i] == ch:
                    if i + 1 < n and sql[i + 1] == ch:  # doubled quote inside
                        i += 2
                        continue
                    break
                i += 1
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif ch == ":" and sql.startswith("::", i):
            i += 2  # a PostgreSQL-style cast, not a placeholder
        elif ch == ":" and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_")):
            match = _NAME.match(sql, i + 1)
            if match:
                found.append((i, match.end(), match.group()))
                i = match.end()
            else:
                i += 1
        elif ch == "?":
            found.append((i, i + 1, "?"))
            i += 1
        else:
            i += 1
    return found


def bind(sql: str, parameters: Mapping[str, Any] | Sequence[Any] | None) -> str:
    """``sql`` with its placeholders replaced by the rendered ``parameters``.

    ``None`` leaves the SQL untouched (colons and question marks included).
    """
    if parameters is None:
        return sql
    if isinstance(parameters, str | bytes) or not isinstance(parameters, Mapping | Sequence):
        raise ProgrammingError(
            "parameters must be a mapping (for :name placeholders) or a sequence "
            f"(for ? placeholders), not {type(parameters).__name__}"
        )
    placeholders = _scan(sql)
    named = [p for p in placeholders if p[2] != "?"]
    positional = [p for p in placeholders if p[2] == "?"]
    if named and positional:
        raise ProgrammingError("do not mix :name and ? placeholders in one statement")
    out: list[str] = []
    last = 0
    if isinstance(parameters, Mapping):
        if positional:
            raise ProgrammingError("? placeholders need a sequence of parameters, not a mapping")
        for start, end, name in named:
            if name not in parameters:
                raise ProgrammingError(f"no value was given for the parameter :{name}")
            out += [sql[last:start], render_literal(parameters[name])]
            last = end
    else:
        if named:
            raise ProgrammingError(":name placeholders need a mapping of parameters")
        if len(positional) != len(parameters):
            raise ProgrammingError(
                f"the statement has {len(positional)} ? placeholders but "
                f"{len(parameters)} parameters were given"
            )
        for (start, end, _), value in zip(positional, parameters, strict=True):
            out += [sql[last:start], render_literal(value)]
            last = end
    out.append(sql[last:])
    return "".join(out)
