"""A sandboxed SQL engine holding one released answer: where a nested aggregation's
outer query runs (``SELECT d, SUM(n) FROM (<aggregate query>) AS t GROUP BY d``).

The engine is an in-memory DuckDB that can see nothing but the table ``released`` it is
given for one evaluation — the noisy rows of an answer dpgate has already released, or
no rows at all when a query is checked before anything is spent. It has no handle on
the protected database, and DuckDB's own ways out are shut and locked: no files, no
network, no extension loading (``enable_external_access = false``,
``lock_configuration = true``). The outer query's text is also allow-listed by
``gateway.sql.analyze.nested`` before it gets here; the lock is the second wall.

Whatever the outer query computes is therefore a function of released values only:
differential privacy is closed under post-processing (Dwork & Roth 2014, Prop. 2.1).
"""

from __future__ import annotations

import atexit
import datetime
import decimal
import math
import threading
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np

from gateway.core.plan import ValueType

Row = tuple[Any, ...]
TABLE = "released"

_DUCKDB_TYPES: dict[ValueType, str] = {
    "integer": "BIGINT",
    "real": "DOUBLE",
    "text": "VARCHAR",
    "boolean": "BOOLEAN",
    "date": "DATE",
}
_SETTINGS = (
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    # No Python variable is readable as a table by its name: only what is registered.
    "SET python_enable_replacements = false",
    # x / 0 is NULL (or ±inf for reals, released as NULL), not an error: a division in
    # a dashboard's metric should not fail on one noisy zero.
    "SET error_on_division_by_zero = false",
    "SET lock_configuration = true",
)
_SOURCE = "dpgate_released_rows"
_base: duckdb.DuckDBPyConnection | None = None
_base_lock = threading.Lock()


class OuterQueryFailed(Exception):
    """DuckDB refused or failed the outer query; the message is DuckDB's own sentence."""


def _connection() -> duckdb.DuckDBPyConnection:
    """A fresh connection to the locked in-memory database (cheap: a cursor of it)."""
    global _base
    with _base_lock:
        if _base is None:
            base = duckdb.connect(":memory:", config={"threads": 1, "memory_limit": "64MB"})
            for setting in _SETTINGS:
                base.execute(setting)
            _base = base
            atexit.register(_close_base)
        return _base.cursor()


def _close_base() -> None:
    """Close the base connection before the interpreter exits: a DuckDB connection still
    open at exit is reported by its bindings (nanobind) as a leak, on stderr."""
    global _base
    with _base_lock:
        if _base is not None:
            _base.close()
            _base = None


def evaluate(
    sql: str, columns: Sequence[tuple[str, ValueType]], rows: Sequence[Row]
) -> tuple[tuple[tuple[str, ValueType], ...], list[Row]]:
    """Run ``sql`` over a table ``released`` with ``columns`` holding ``rows``; return
    the result's columns (name, dpgate type) and rows (JSON-ready values)."""
    conn = _connection()
    try:
        # A temporary table belongs to this connection alone: concurrent evaluations
        # never see each other's rows.
        spec = ", ".join(f"{_quote(name)} {_DUCKDB_TYPES[vtype]}" for name, vtype in columns)
        conn.execute(f"CREATE TEMP TABLE {TABLE} ({spec})")
        if rows:
            # The rows go in as columns of Python objects (NULLs kept), cast to the
            # declared types by DuckDB: one statement, whatever the number of rows.
            source = {
                f"c{i}": np.array([_stored_value(r[i], vtype) for r in rows], dtype=object)
                for i, (_, vtype) in enumerate(columns)
            }
            conn.register(_SOURCE, source)
            casts = ", ".join(
                f"CAST(c{i} AS {_DUCKDB_TYPES[vtype]})" for i, (_, vtype) in enumerate(columns)
            )
            conn.execute(f"INSERT INTO {TABLE} SELECT {casts} FROM {_SOURCE}")
            conn.unregister(_SOURCE)
        result = conn.sql(sql)
        if result is None:  # pragma: no cover - the analyzer only lets SELECTs through
            raise OuterQueryFailed("the outer query returned no result")
        names = tuple(result.columns)
        types = tuple(_value_type(str(t)) for t in result.types)
        out = [tuple(_json_value(v) for v in r) for r in result.fetchall()]
    except duckdb.Error as e:
        raise OuterQueryFailed(_first_line(str(e))) from None
    finally:
        conn.close()
    return tuple(zip(names, types, strict=True)), out


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "the outer query failed"


def _value_type(duckdb_type: str) -> ValueType:
    upper = duckdb_type.upper()
    if upper in ("BOOLEAN",):
        return "boolean"
    if upper.startswith(("DATE", "TIMESTAMP")):
        return "date"
    if upper in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UBIGINT", "UINTEGER"):
        return "integer"
    if upper in ("FLOAT", "DOUBLE", "REAL") or upper.startswith("DECIMAL"):
        return "real"
    return "text"


def _stored_value(value: Any, vtype: ValueType) -> Any:
    """One Python type per column, so DuckDB's look at a sample of it cannot mislead it."""
    if value is None:
        return None
    if vtype == "date":  # ISO text: DuckDB casts it exactly (date and datetime alike)
        return value.isoformat() if isinstance(value, datetime.date) else str(value)
    if vtype == "real":
        return float(value)
    if vtype == "integer":
        return int(value)
    if vtype == "boolean":
        return bool(value)
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # ±inf and NaN (a division by a noisy zero) are not JSON
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return value.date().isoformat() if value.time() == datetime.time() else value.isoformat()
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value
