"""Accepted expressions are total (docs/design.md, invariant 9; issue 11).

A hypothesis property test: it generates queries whose row expressions use everything the
analyzer allows (comparisons, boolean logic, IN, BETWEEN, LIKE/ILIKE, IS NULL, arithmetic,
CASE/IF, CAST, COALESCE and the scalar functions, with ordinary and extreme literals) in
WHERE, GROUP BY keys, COUNT(expr) and SUM/AVG of bounded columns. Every query the
analyzer accepts is compiled and run on SQLite, DuckDB, ClickHouse (chDB), Spark SQL and
(with ``DPGATE_TEST_POSTGRES_URL``) PostgreSQL, over a table of adversarial rows: the extremes
of each column's storage type, NULL everywhere, NaN and ±Infinity, empty, long and
LIKE-special strings, values outside the declared bounds, extreme dates, and on SQLite
values of the wrong storage class. The property: it never raises. A runtime error that
depends on the rows is an oracle on them (issue 11), so none may happen.

Beside the property: ``KNOWN_HAZARDS``, one minimal query per kind of error the property
found before the fix (each must be refused or run on every backend), and SUM/AVG over
thousands of rows at the bounds (the compiled integer SUM must not overflow).
"""

from __future__ import annotations

import math
import os
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.core.config import TableConfig
from gateway.core.config_load import parse_config
from gateway.core.errors import GatewayError
from gateway.core.plan import QueryPlan
from gateway.sql.analyze import analyze
from gateway.sql.compile import compile_plan
from gateway.sql.execute import open_protected_engine, run_aggregate, sqlglot_dialect
from tests import engines

POSTGRES_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL")
# Generous: Spark's first statements on a loaded two-core machine take seconds.
TIMEOUT_MS = 60_000
#: The generator must keep producing queries the analyzer accepts, or the property is
#: vacuous: at least this fraction of the generated queries must be accepted.
MIN_ACCEPTED = 0.25

# ---------------------------------------------------------------------------------------
# The protected table: its declared config, its storage types, its adversarial rows.
# ---------------------------------------------------------------------------------------

Kind = Literal["int", "real", "text", "bool", "date"]
KINDS: tuple[Kind, ...] = ("int", "real", "text", "bool", "date")

INT4 = (-(2**31), 2**31 - 1)
INT8 = (-(2**63), 2**63 - 1)
INT2 = (-(2**15), 2**15 - 1)
FLOAT4_MAX = 3.4028234663852886e38
FLOAT8_MAX = 1.7976931348623157e308


@dataclass(frozen=True)
class Column:
    """A column of the test table: its declaration, its storage type, its extremes."""

    name: str
    kind: Kind
    storage: str  # SQL type on PostgreSQL and DuckDB (and the declared type on SQLite)
    declared: dict[str, Any]
    low: Any = None  # the smallest / largest value the storage type holds
    high: Any = None


def _int(name: str, storage: str, **declared: Any) -> Column:
    low, high = {"SMALLINT": INT2, "INTEGER": INT4, "BIGINT": INT8}[storage]
    return Column(name, "int", storage, {"type": "integer", **declared}, low, high)


def _real(name: str, storage: str, **declared: Any) -> Column:
    top = FLOAT4_MAX if storage == "REAL" else FLOAT8_MAX
    return Column(name, "real", storage, {"type": "real", **declared}, -top, top)


COLUMNS: tuple[Column, ...] = (
    _int("pid", "BIGINT"),
    _int("age", "INTEGER", lower=0, upper=120),
    _int("score", "BIGINT", lower=-1000, upper=1000),
    _int("level", "SMALLINT", lower=-10, upper=10),
    _int("huge", "BIGINT", lower=-(10**15), upper=10**15),
    _int("visits", "INTEGER"),
    _int("amount", "BIGINT"),
    _int("tiny", "SMALLINT"),
    _int("ward", "INTEGER", values=[1, 2, 3]),
    _real("glucose", "REAL", lower=2.0, upper=20.0),
    _real("income", "DOUBLE PRECISION", lower=0, upper=1e6),
    _real("astro", "DOUBLE PRECISION", lower=-1e15, upper=1e15),
    _real("micro", "DOUBLE PRECISION", lower=0, upper=1e-300),
    _real("ratio", "REAL"),
    _real("weight", "DOUBLE PRECISION"),
    Column("sex", "text", "TEXT", {"type": "text", "values": ["F", "M"]}),
    Column("code", "text", "TEXT", {"type": "text", "values": ["a_1", "50%", "it's", "ü\\"]}),
    Column("note", "text", "TEXT", {"type": "text"}),
    Column("zip", "text", "TEXT", {"type": "text"}),
    Column("smoker", "bool", "BOOLEAN", {"type": "boolean"}),
    Column("born", "date", "DATE", {"type": "date"}),
)
BY_NAME = {c.name: c for c in COLUMNS}

#: Columns a row expression may use, by kind (the privacy unit may not appear in them).
EXPR_COLUMNS: dict[Kind, list[str]] = {
    k: [c.name for c in COLUMNS if c.kind == k and c.name != "pid"] for k in KINDS
}
#: Columns SUM and AVG accept: numeric with declared bounds.
BOUNDED = [c.name for c in COLUMNS if "lower" in c.declared]
#: Numeric columns with declared bounds, by kind: arithmetic on them can be proven safe,
#: so the generator prefers them (a total language refuses most arithmetic on the rest).
BOUNDED_BY_KIND: dict[Kind, list[str]] = {
    k: [n for n in BOUNDED if BY_NAME[n].kind == k] for k in ("int", "real")
}

#: Two declared tables over the same stored rows: per-person bounding with windows
#: (``t``), and row-level privacy (``r``), which compile to different statement shapes.
PHYSICAL = "people"
#: A second stored table, of many rows at the bounds, for the SUM overflow test (``m``).
MANY = "many"
MANY_DOUBLINGS = 13


def table_configs(url: str, schema: str | None) -> dict[str, TableConfig]:
    columns = {c.name: c.declared for c in COLUMNS}
    common: dict[str, Any] = {"columns": columns, "source": PHYSICAL}
    if schema is not None:
        common["schema"] = schema
    many = {**common, "source": MANY}
    raw = {
        "database": {"url": url},
        "ledger": {"url": "sqlite:////unused-ledger.db"},
        "tables": {
            "t": {
                **common,
                "privacy_unit": "pid",
                "max_rows_per_unit": 3,
                "max_groups_per_unit": 2,
            },
            "r": dict(common),
            "m": many,
            "mt": {**many, "privacy_unit": "pid", "max_rows_per_unit": 3},
        },
    }
    return dict(parse_config(raw).tables)


Backend = Literal["sqlite", "postgres", "duckdb", "clickhouse", "spark", "spark-connect"]

LONG = "x" * 10_000
SPECIAL_TEXTS = [
    "",
    " ",
    LONG,
    "%",
    "_",
    "\\",
    "%_\\%",
    "50%",
    "a_1",
    "it's",
    "ü\\",
    "Ωμέγα",
    "💥",
    "a:b",
    ":x",
    "NaN",
    "-Infinity",
    "9223372036854775808",
    "1e400",
    " 12 ",
    "2020-02-30",
    "true",
    "\t\n",
    "F",
    "M",
]


def _dates(backend: Backend) -> list[str]:
    if backend == "postgres":
        return ["4713-01-01 BC", "5874897-12-31", "infinity", "-infinity", "1970-01-01"]
    if backend == "duckdb":
        return ["5877642-06-25 (BC)", "5881580-07-10", "infinity", "-infinity", "1970-01-01"]
    if backend == "clickhouse":  # Date32's range
        return ["1900-01-01", "2299-12-31", "1970-01-01", "2000-02-29"]
    if backend == "spark":
        return ["0001-01-01", "9999-12-31", "1970-01-01", "2000-02-29"]
    return ["0000-01-01", "9999-12-31", "1970-01-01", "2020-02-30", "not a date"]


def _fit(column: Column, value: float) -> float:
    """``value`` as a REAL (float4) column can store it: its least subnormal is 1e-45."""
    if column.storage == "REAL" and value != 0 and abs(value) < 1e-45:
        return math.copysign(1e-45, value)
    return value


def adversarial_rows(backend: Backend) -> list[dict[str, Any]]:
    """Rows that push every column to its limits, on ``backend``'s storage types."""
    floats_ok = backend != "sqlite"  # SQLite stores NaN as NULL, but keeps ±Inf
    rows: list[dict[str, Any]] = []

    def row(**values: Any) -> None:
        full: dict[str, Any] = {c.name: None for c in COLUMNS}
        full.update(values)
        full["pid"] = values.get("pid", len(rows) % 5)
        rows.append(full)

    benign = {
        "age": 40,
        "score": 10,
        "level": 1,
        "huge": 5,
        "visits": 3,
        "amount": 100,
        "tiny": 2,
        "ward": 2,
        "glucose": 5.5,
        "income": 5e4,
        "astro": 1.0,
        "micro": 1e-301,
        "ratio": 0.5,
        "weight": 70.0,
        "sex": "F",
        "code": "50%",
        "note": "hello",
        "zip": "10115",
        "smoker": True,
        "born": "1980-05-17",
    }
    row(**benign)
    row()  # NULL in every column but the unit
    ints = [c for c in COLUMNS if c.kind == "int" and c.name != "pid"]
    reals = [c for c in COLUMNS if c.kind == "real"]
    dates = _dates(backend)
    # The storage type's extremes, and just inside them.
    picks: list[Callable[[Column], Any]] = [
        lambda c: c.high,
        lambda c: c.low,
        lambda c: c.high - 1 if c.kind == "int" else c.high / 2,
        lambda c: c.low + 1 if c.kind == "int" else c.low / 2,
    ]
    for pick in picks:
        row(
            **{c.name: pick(c) for c in ints + reals},
            sex="M",
            code="it's",
            note=LONG,
            zip="",
            smoker=False,
            born=dates[len(rows) % 2],
        )
    # Values outside the declared bounds and domains, and special floats.
    specials: list[float] = [math.inf, -math.inf, -0.0, 5e-324, 1e-45]
    if floats_ok:
        specials.append(math.nan)
    for i, special in enumerate(specials):
        row(
            age=-5 - i,
            score=10**6 + i,
            level=11,
            huge=-1,
            visits=0,
            amount=-1,
            tiny=0,
            ward=0,
            **{c.name: _fit(c, special) for c in reals},
            sex="",
            code="zzz",
            note=SPECIAL_TEXTS[i % len(SPECIAL_TEXTS)],
            zip="%_\\",
            smoker=bool(i % 2),
            born=dates[(i + 2) % len(dates)],
        )
    if floats_ok:
        # NaN inside every declared domain, where the compiled SQL reads it: compared
        # with NaN, every comparison is false on ClickHouse, so its clamp lets NaN
        # through to a CAST that raises (gateway/sql/engines/dialects.py).
        row(**{c.name: math.nan for c in reals}, sex="F", code="50%", ward=1, smoker=True)
    # Every special string in every text column.
    for i, text in enumerate(SPECIAL_TEXTS):
        row(
            note=text,
            zip=text[::-1],
            sex=text,
            code=text,
            age=i,
            visits=-i,
            born=dates[i % len(dates)],
        )
    if backend == "sqlite":
        # SQLite stores any value in any column: text and reals in INTEGER columns, text
        # in REAL and DATE columns, integers beyond a declared type, blobs.
        for value in ["abc", "", "12abc", "1e999", 2.5, 1e300, b"\x00\xff", LONG]:
            row(
                **{c.name: value for c in ints},
                **{c.name: value for c in reals if isinstance(value, str | bytes)},
                smoker=value,
                born=value,
                note=value if not isinstance(value, float) else None,
            )
        row(**{c.name: INT8[1] for c in ints}, smoker=2, born=20200101, note=7)
        row(**{c.name: INT8[0] for c in ints}, smoker=-1, born=-1.5, note=-(2**63))
    return rows


# ---------------------------------------------------------------------------------------
# Backends, built once per module.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A backend loaded with the adversarial rows, opened as the gateway opens it."""

    backend: Backend
    engine: sa.Engine
    tables: dict[str, TableConfig]
    dialect: str
    url: str


def many_rows() -> list[dict[str, Any]]:
    """The seed of the ``many`` table: one row at every declared upper bound, one at the
    storage type's maximum (clamped to the bound). ``MANY_DOUBLINGS`` doublings with
    fresh privacy units make 2^14 rows, enough to overflow a 64-bit SUM of a bounded
    integer column at ±1e15 that nothing guards."""
    bounded = [BY_NAME[n] for n in BOUNDED]
    at_bound = {c.name: c.declared["upper"] for c in bounded}
    at_storage_max = {c.name: c.high for c in bounded}
    out = []
    for pid, values in enumerate((at_bound, at_storage_max)):
        full: dict[str, Any] = {c.name: None for c in COLUMNS}
        full.update(
            {n: int(v) if BY_NAME[n].kind == "int" else float(v) for n, v in values.items()}
        )
        full.update(pid=pid, sex="F", smoker=True)
        out.append(full)
    return out


def _name(schema: str | None, physical: str) -> str:
    return f'"{schema}"."{physical}"' if schema else f'"{physical}"'


def _create_sql(schema: str | None, physical: str) -> str:
    cols = ", ".join(f'"{c.name}" {c.storage}' for c in COLUMNS)
    return f"CREATE TABLE {_name(schema, physical)} ({cols})"


def _double_sql(schema: str | None, physical: str, shift: int) -> str:
    """Double the table, with privacy units shifted past the existing ones."""
    cols = ", ".join(f'"{c.name}"' for c in COLUMNS)
    shifted = ", ".join(f'"pid" + {shift}' if c.name == "pid" else f'"{c.name}"' for c in COLUMNS)
    name = _name(schema, physical)
    return f"INSERT INTO {name} ({cols}) SELECT {shifted} FROM {name}"


def _fill_sql(schema: str | None) -> list[str]:
    return [_double_sql(schema, MANY, 2 << i) for i in range(MANY_DOUBLINGS)]


def _insert_sql(schema: str | None, backend: Backend, physical: str) -> str:
    name = _name(schema, physical)
    names = ", ".join(f'"{c.name}"' for c in COLUMNS)
    if backend == "sqlite":
        values = ", ".join("?" for _ in COLUMNS)
    else:
        values = ", ".join(
            f"CAST(:{c.name} AS DATE)" if c.kind == "date" else f":{c.name}" for c in COLUMNS
        )
    return f"INSERT INTO {name} ({names}) VALUES ({values})"


def build_sqlite(path: Path, rows: list[dict[str, Any]]) -> str:
    with sqlite3.connect(path) as conn:
        for physical, content in ((PHYSICAL, rows), (MANY, many_rows())):
            conn.execute(_create_sql(None, physical))
            conn.executemany(
                _insert_sql(None, "sqlite", physical),
                [tuple(r[c.name] for c in COLUMNS) for r in content],
            )
        for statement in _fill_sql(None):
            conn.execute(statement)
    conn.close()
    return f"sqlite:///{path}"


def _load(conn: sa.Connection, schema: str | None, backend: Backend, rows: list[Any]) -> None:
    for physical, content in ((PHYSICAL, rows), (MANY, many_rows())):
        conn.execute(sa.text(_create_sql(schema, physical)))
        if content:
            conn.execute(sa.text(_insert_sql(schema, backend, physical)), content)
    for statement in _fill_sql(schema):
        conn.execute(sa.text(statement))


def build_duckdb(path: Path, rows: list[dict[str, Any]]) -> str:
    url = f"duckdb:///{path}"
    writer = sa.create_engine(url)
    with writer.begin() as conn:
        _load(conn, None, "duckdb", rows)
    writer.dispose()
    return url


def build_postgres(base: str, rows: list[dict[str, Any]]) -> tuple[str, str]:
    """A fresh schema on ``base`` holding the rows; returns (schema, base url)."""
    schema = "dpgate_tot_" + uuid.uuid4().hex[:10]
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
            _load(conn, schema, "postgres", rows)
    finally:
        admin.dispose()
    return schema, base


def drop_postgres(base: str, schema: str) -> None:
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        admin.dispose()


def open_target(backend: Backend, url: str, schema: str | None) -> Target:
    engine = open_protected_engine(url, statement_timeout_ms=TIMEOUT_MS)
    return Target(
        backend=backend,
        engine=engine,
        tables=table_configs(url, schema),
        dialect=sqlglot_dialect(engine),
        url=url,
    )


@pytest.fixture(scope="module")
def sqlite_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    path = tmp_path_factory.mktemp("totality") / "people.db"
    target = open_target("sqlite", build_sqlite(path, adversarial_rows("sqlite")), None)
    yield target
    target.engine.dispose()


@pytest.fixture(scope="module")
def duckdb_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    pytest.importorskip("duckdb_engine")
    path = tmp_path_factory.mktemp("totality") / "people.duckdb"
    target = open_target("duckdb", build_duckdb(path, adversarial_rows("duckdb")), None)
    yield target
    target.engine.dispose()


@pytest.fixture(scope="module")
def postgres_target() -> Iterator[Target]:
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    schema, base = build_postgres(POSTGRES_URL, adversarial_rows("postgres"))
    try:
        target = open_target("postgres", base, schema)
        yield target
        target.engine.dispose()
    finally:
        drop_postgres(base, schema)


#: The columns' storage types as ``tests/engines.py`` names them.
ENGINE_KINDS = {
    "SMALLINT": "smallint",
    "INTEGER": "int",
    "BIGINT": "bigint",
    "REAL": "float",
    "DOUBLE PRECISION": "double",
    "TEXT": "text",
    "BOOLEAN": "boolean",
    "DATE": "date",
}


def engine_target(backend: engines.Engine, factory: Any) -> Target:
    """The adversarial rows (and the ``many`` table, doubled) on ClickHouse or Spark."""
    database = engines.new_database("tot")
    kinds = {c.name: ENGINE_KINDS[c.storage] for c in COLUMNS}
    rows = adversarial_rows("spark" if backend == "spark-connect" else backend)
    engines.load(backend, factory, database, PHYSICAL, kinds, rows)
    many = many_rows()
    for i in range(MANY_DOUBLINGS):
        many += [{**r, "pid": r["pid"] + (2 << i)} for r in many]
    engines.load(backend, factory, database, MANY, kinds, many)
    target = open_target(backend, engines.url(backend, factory), database)
    for physical in (PHYSICAL, MANY):  # warm the engine (Spark's first plans are slow)
        run_aggregate(
            target.engine, f"SELECT COUNT(*) FROM {database}.{physical}", timeout_ms=TIMEOUT_MS
        )
    return target


@pytest.fixture(scope="module")
def clickhouse_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    target = engine_target("clickhouse", tmp_path_factory)
    yield target
    target.engine.dispose()


@pytest.fixture(scope="module")
def spark_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    target = engine_target("spark", tmp_path_factory)
    yield target
    target.engine.dispose()


@pytest.fixture(scope="module")
def spark_connect_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    target = engine_target("spark-connect", tmp_path_factory)
    yield target
    target.engine.dispose()


# ---------------------------------------------------------------------------------------
# The generator: typed row expressions, mostly sensible, sometimes adversarial.
# ---------------------------------------------------------------------------------------

EXTREME_INTS = [
    "0",
    "1",
    "-1",
    "2",
    "10",
    "32767",
    "-32768",
    "32768",
    "2147483647",
    "-2147483648",
    "2147483648",
    "9223372036854775807",
    "-9223372036854775807",
    "(-9223372036854775807 - 1)",
    "9223372036854775808",
    "-9223372036854775808",
    "123456789012345678901234567890",
]
EXTREME_REALS = [
    "0.0",
    "-0.0",
    "0.5",
    "1e308",
    "-1e308",
    "1.7976931348623157e308",
    "1e309",
    "5e-324",
    "2.2250738585072014e-308",
    "1e-45",
    "3.4028235e38",
    "3.5e38",
    "1e-400",
    "CAST('NaN' AS DOUBLE PRECISION)",
    "CAST('Infinity' AS DOUBLE PRECISION)",
    "CAST('-Infinity' AS REAL)",
]
SAFE_TEXTS = ["a", "F", "M", "50%", "a_1", "x", "hello", "10115", "Crohn"]
DATE_LITERALS = [
    "CAST('2020-01-01' AS DATE)",
    "DATE '1999-12-31'",
    "CAST('0001-01-01' AS DATE)",
    "CAST('9999-12-31' AS DATE)",
    "'1980-05-17'",
]
ADVERSARIAL_DATES = ["CAST('2020-02-30' AS DATE)", "CAST('infinity' AS DATE)", "'not a date'"]
INT_TYPES = ["INTEGER", "BIGINT", "SMALLINT", "INT"]
REAL_TYPES = ["REAL", "DOUBLE PRECISION", "FLOAT"]
TEXT_TYPES = ["TEXT", "VARCHAR"]
CAST_TYPES: dict[Kind, list[str]] = {
    "int": INT_TYPES,
    "real": REAL_TYPES,
    "text": TEXT_TYPES,
    "bool": ["BOOLEAN"],
    "date": ["DATE"],
}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _weighted(draw: st.DrawFn, *weights: int) -> int:
    """An index drawn with the given weights (shrinks towards index 0)."""
    roll = draw(st.integers(0, sum(weights) - 1))
    for i, w in enumerate(weights):
        if roll < w:
            return i
        roll -= w
    raise AssertionError


def kinds(options: list[Kind]) -> st.SearchStrategy[Kind]:
    return st.sampled_from(options)


@st.composite
def literal(draw: st.DrawFn, kind: Kind) -> str:
    """A literal of ``kind``: mostly ordinary, sometimes extreme, sometimes NULL."""
    choice = _weighted(draw, 12, 5, 1)
    if choice == 2:
        return "NULL"
    extreme = choice == 1
    if kind == "int":
        if extreme:
            return draw(st.sampled_from(EXTREME_INTS))
        return str(draw(st.integers(-100, 1000)))
    if kind == "real":
        if extreme:
            return draw(st.sampled_from(EXTREME_REALS))
        value = draw(st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32))
        return repr(float(value))
    if kind == "text":
        if extreme:
            return _quote(draw(st.sampled_from(SPECIAL_TEXTS)))
        return _quote(draw(st.sampled_from(SAFE_TEXTS)))
    if kind == "bool":
        return draw(st.sampled_from(["TRUE", "FALSE"]))
    if extreme:
        return draw(st.sampled_from(ADVERSARIAL_DATES))
    return draw(st.sampled_from(DATE_LITERALS))


@st.composite
def leaf(draw: st.DrawFn, kind: Kind) -> str:
    """A column (bounded ones preferred for numbers) or a literal of ``kind``."""
    choice = _weighted(draw, 4, 2, 3)
    if choice == 0 and kind in BOUNDED_BY_KIND:
        return draw(st.sampled_from(BOUNDED_BY_KIND[kind]))
    if choice <= 1:
        return draw(st.sampled_from(EXPR_COLUMNS[kind]))
    return draw(literal(kind))


@st.composite
def position(draw: st.DrawFn, depth: int) -> str:
    """A SUBSTRING position or length: mostly a small literal, sometimes anything."""
    if _weighted(draw, 3, 1) == 0:
        return str(draw(st.integers(-2, 20)))
    return draw(expression("int", depth))


def _case(draw: st.DrawFn, kind: Kind, depth: int) -> str:
    n = draw(st.integers(1, 2))
    whens = " ".join(
        f"WHEN {draw(expression('bool', depth - 1))} THEN {draw(expression(kind, depth - 1))}"
        for _ in range(n)
    )
    tail = f" ELSE {draw(expression(kind, depth - 1))}" if draw(st.booleans()) else ""
    return f"CASE {whens}{tail} END"


@st.composite
def expression(draw: st.DrawFn, kind: Kind, depth: int) -> str:
    """A row expression of type ``kind``, at most ``depth`` operators deep.

    About one operand in twenty is of another type than its position wants: analysts
    (and attackers) write those, and whatever the analyzer accepts must still run.
    """
    if draw(st.integers(0, 19)) == 19:
        kind = draw(st.sampled_from(KINDS))
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(leaf(kind))
    sub: Callable[[Kind], str] = lambda k: draw(expression(k, depth - 1))  # noqa: E731
    if kind == "int":
        form = _weighted(draw, 8, 2, 2, 2, 3, 2, 2, 1, 2, 1)
        if form == 0:
            op = draw(st.sampled_from(["+", "-", "*", "/", "%"]))
            return f"({sub('int')} {op} {sub('int')})"
        if form == 1:
            return f"-{sub('int')}" if draw(st.booleans()) else f"ABS({sub('int')})"
        if form == 2:
            return f"LENGTH({sub('text')})"
        if form == 3:
            return _case(draw, "int", depth)
        if form == 4:
            source = draw(kinds(["int", "int", "real", "bool", "text"]))
            return f"CAST({sub(source)} AS {draw(st.sampled_from(INT_TYPES))})"
        if form == 5:
            fn = draw(st.sampled_from(["FLOOR", "CEIL", "CEILING", "ROUND"]))
            return f"{fn}({sub('real')})"
        if form == 6:
            return f"COALESCE({sub('int')}, {sub('int')})"
        if form == 7:
            return f"IF({sub('bool')}, {sub('int')}, {sub('int')})"
        if form == 8:
            return f"({sub('int')} / {draw(literal('int'))})"
        return f"({sub('int')})"
    if kind == "real":
        form = _weighted(draw, 8, 2, 2, 2, 2, 2, 1)
        if form == 0:
            op = draw(st.sampled_from(["+", "-", "*", "/"]))
            pairs: list[tuple[Kind, Kind]] = [("real", "real"), ("real", "int"), ("int", "real")]
            lk, rk = draw(st.sampled_from(pairs))
            return f"({sub(lk)} {op} {sub(rk)})"
        if form == 1:
            return f"-{sub('real')}" if draw(st.booleans()) else f"ABS({sub('real')})"
        if form == 2:
            return f"ROUND({sub('real')}, {draw(st.integers(-3, 4))})"
        if form == 3:
            return _case(draw, "real", depth)
        if form == 4:
            source = draw(kinds(["int", "int", "real", "text"]))
            return f"CAST({sub(source)} AS {draw(st.sampled_from(REAL_TYPES))})"
        if form == 5:
            return f"COALESCE({sub('real')}, {sub('real')})"
        return f"({sub('real')} % {sub('real')})"
    if kind == "text":
        form = _weighted(draw, 3, 2, 3, 3, 2, 2, 2, 1)
        if form == 0:
            fn = draw(st.sampled_from(["LOWER", "UPPER", "TRIM"]))
            return f"{fn}({sub('text')})"
        if form == 1:
            return f"TRIM(BOTH {draw(literal('text'))} FROM {sub('text')})"
        if form == 2:
            if draw(st.booleans()):
                start, length = draw(position(depth - 1)), draw(position(depth - 1))
                return f"SUBSTRING({sub('text')}, {start}, {length})"
            start, length = draw(position(depth - 1)), draw(position(depth - 1))
            return f"SUBSTRING({sub('text')} FROM {start} FOR {length})"
        if form == 3:
            other = draw(kinds(["text", "text", "int", "real", "date"]))
            return f"({sub('text')} || {sub(other)})"
        if form == 4:
            mixed = kinds(["text", "text", "text", "int", "real", "bool", "date"])
            parts = [sub(draw(mixed)) for _ in range(draw(st.integers(2, 3)))]
            return f"CONCAT({', '.join(parts)})"
        if form == 5:
            source = draw(st.sampled_from(KINDS))
            return f"CAST({sub(source)} AS {draw(st.sampled_from(TEXT_TYPES))})"
        if form == 6:
            return _case(draw, "text", depth)
        return f"COALESCE({sub('text')}, {sub('text')})"
    if kind == "bool":
        form = _weighted(draw, 8, 4, 2, 2, 2, 3, 2, 1, 1)
        if form == 0:
            k = draw(kinds(["int", "int", "real", "text", "date"]))
            op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
            left = sub(k)
            right = sub("int" if k == "real" and draw(st.booleans()) else k)
            return f"{left} {op} {right}"
        if form == 1:
            op = draw(st.sampled_from(["AND", "OR"]))
            return f"({sub('bool')} {op} {sub('bool')})"
        if form == 2:
            return f"NOT {sub('bool')}"
        if form == 3:
            k = draw(kinds(["int", "text", "real", "date"]))
            items = [draw(literal(k)) for _ in range(draw(st.integers(1, 4)))]
            neg = "NOT " if draw(st.booleans()) else ""
            return f"{sub(k)} {neg}IN ({', '.join(items)})"
        if form == 4:
            k = draw(kinds(["int", "real", "date", "text"]))
            return f"{sub(k)} BETWEEN {sub(k)} AND {sub(k)}"
        if form == 5:
            op = draw(st.sampled_from(["LIKE", "ILIKE", "NOT LIKE"]))
            pattern = draw(
                st.one_of(
                    st.sampled_from(["'a%'", "'%x%'", "'_'", "'%'", "'50!%'", "'%\\%'", "'\\'"]),
                    literal("text"),
                    st.just(f"'%{'x' * 300}%b'"),
                )
            )
            if draw(st.integers(0, 4)) == 0:
                pattern = sub("text")
            return f"{sub('text')} {op} {pattern}"
        if form == 6:
            neg = "NOT " if draw(st.booleans()) else ""
            return f"{sub(draw(st.sampled_from(KINDS)))} IS {neg}NULL"
        if form == 7:
            return _case(draw, "bool", depth)
        return "smoker"
    # date
    form = _weighted(draw, 3, 2, 1)
    if form == 0:
        return _case(draw, "date", depth)
    if form == 1:
        return f"COALESCE({sub('date')}, {sub('date')})"
    return f"CAST({sub('text')} AS DATE)"


@st.composite
def queries(draw: st.DrawFn) -> str:
    """One aggregate query over ``t`` or ``r`` using row expressions everywhere."""
    table = draw(st.sampled_from(["t", "r"]))
    keys: list[str] = []
    for _ in range(_weighted(draw, 5, 3, 1)):
        kind = draw(st.sampled_from(KINDS))
        if draw(st.booleans()):
            keys.append(draw(st.sampled_from([c.name for c in COLUMNS if c.name != "pid"])))
        else:
            keys.append(draw(expression(kind, 2)))
    aggregates: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        form = _weighted(draw, 2, 4, 2, 2)
        if form == 0:
            aggregates.append("COUNT(*)")
        elif form == 1:
            kind = draw(st.sampled_from(KINDS))
            aggregates.append(f"COUNT({draw(expression(kind, 3))})")
        else:
            fn = "SUM" if form == 2 else "AVG"
            aggregates.append(f"{fn}({draw(st.sampled_from(BOUNDED))})")
    where = ""
    if draw(st.integers(0, 4)) > 0:
        where = f" WHERE {draw(expression('bool', 4))}"
    group = ""
    if keys:
        group = " GROUP BY " + ", ".join(str(i + 1) for i in range(len(keys)))
    return f"SELECT {', '.join([*keys, *aggregates])} FROM {table}{where}{group}"


# ---------------------------------------------------------------------------------------
# The property.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What happened to one generated query on one backend."""

    refused: str | None = None  # the refusal's error code
    compiled: str | None = None
    error: str | None = None  # the backend's (or driver's) error, if it raised


def diagnose(target: Target, sql: str) -> str:
    """The backend's own error for ``sql`` (``run_aggregate`` hides it, rightly)."""
    if target.backend in ("clickhouse", "spark", "spark-connect"):
        return engines.raw_error(target.backend, target.url, sql)
    try:
        with target.engine.connect() as conn:
            conn.execute(sa.text(sql)).fetchall()
            conn.rollback()
    except Exception as e:
        orig = getattr(e, "orig", None) or e
        return f"{type(orig).__module__}.{type(orig).__name__}: {orig}"
    return "(the statement succeeded when re-run directly)"


def run_query(target: Target, sql: str) -> Outcome:
    """Analyse, compile and execute ``sql`` on ``target`` as the gateway would."""
    try:
        plan = analyze(sql, target.tables)
    except GatewayError as e:
        return Outcome(refused=e.code)
    if not isinstance(plan, QueryPlan):
        return Outcome(refused="probe")
    compiled = compile_plan(plan, target.tables[plan.table], target.dialect)
    try:
        run_aggregate(target.engine, compiled.sql, timeout_ms=TIMEOUT_MS)
    except Exception as e:
        detail = diagnose(target, compiled.sql)
        return Outcome(compiled=compiled.sql, error=f"{type(e).__name__}: {e}\n  cause: {detail}")
    return Outcome(compiled=compiled.sql)


def _shorten(text: str, limit: int = 2000) -> str:
    text = text.replace(LONG, "<'x' * 10000>")
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def check_totality(target: Target, max_examples: int) -> None:
    """The property on one backend, and the generator's acceptance rate."""
    stats: Counter[str] = Counter()

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(sql=queries())
    def accepted_queries_never_raise(sql: str) -> None:
        outcome = run_query(target, sql)
        if outcome.refused is not None:
            stats["refused"] += 1
            event(f"refused: {outcome.refused}")
            return
        stats["accepted"] += 1
        event("accepted")
        if outcome.error is not None:
            raise AssertionError(
                f"an accepted query raised on {target.backend}\n"
                f"  SQL:      {_shorten(sql)}\n"
                f"  compiled: {_shorten(outcome.compiled or '')}\n"
                f"  error:    {_shorten(outcome.error)}"
            )

    accepted_queries_never_raise()
    total = stats["accepted"] + stats["refused"]
    assert total > 0
    print(f"{target.backend}: {stats['accepted']} of {total} generated queries accepted")
    assert stats["accepted"] >= MIN_ACCEPTED * total, (
        f"the generator is too often refused ({stats['accepted']} of {total} accepted): "
        "the property tests too little; make the generated queries more sensible"
    )


def test_accepted_expressions_never_raise_on_sqlite(sqlite_target: Target) -> None:
    check_totality(sqlite_target, max_examples=400)


def test_accepted_expressions_never_raise_on_duckdb(duckdb_target: Target) -> None:
    check_totality(duckdb_target, max_examples=200)


@engines.SLOW
def test_accepted_expressions_never_raise_on_clickhouse(clickhouse_target: Target) -> None:
    check_totality(clickhouse_target, max_examples=200)


@engines.SLOW
@engines.SPARK_GROUP
def test_accepted_expressions_never_raise_on_spark(spark_target: Target) -> None:
    check_totality(spark_target, max_examples=60)


@pytest.mark.postgres
def test_accepted_expressions_never_raise_on_postgres(postgres_target: Target) -> None:
    check_totality(postgres_target, max_examples=200)


#: The hazards of the execution layer: bind-parameter syntax in literals, values the
#: driver cannot read.
DRIVER_HAZARDS = [
    "SELECT COUNT(*) FROM t WHERE note = ':x'",
    "SELECT COUNT(*) FROM t WHERE note LIKE '%:x%'",
    "SELECT born, COUNT(*) FROM t GROUP BY 1",
    "SELECT CAST(born AS TEXT), COUNT(*) FROM t GROUP BY 1",
    "SELECT 'x' || born, COUNT(*) FROM r GROUP BY 1",
]
#: One minimal query per kind of runtime error found by the property test on the code
#: before issue 11 was fixed (each raised on at least one backend). Every one must now be
#: refused by the analyzer or run without error on every backend.
KNOWN_HAZARDS = [
    # integer overflow (int2/int4/int8 storage extremes; SQLite: ABS and SUM only)
    "SELECT COUNT(*) FROM t WHERE ABS(age) > 0",
    "SELECT COUNT(*) FROM t WHERE ABS(amount) > 0",
    "SELECT COUNT(*) FROM t WHERE -age < 0",
    "SELECT COUNT(*) FROM t WHERE age + age > 0",
    "SELECT COUNT(*) FROM t WHERE age - 4 > 0",
    "SELECT COUNT(*) FROM t WHERE age * 2 > 0",
    "SELECT COUNT(*) FROM t WHERE amount * 2 > 0",
    "SELECT COUNT(*) FROM t WHERE level + score > 0",
    "SELECT COUNT(*) FROM t WHERE amount * -9223372036854775808 < 0",
    "SELECT COUNT(*) FROM t WHERE amount / -1 > 0",
    # division and modulo by zero
    "SELECT COUNT(*) FROM t WHERE age / visits > 0",
    "SELECT COUNT(*) FROM t WHERE age % visits > 0",
    "SELECT COUNT(*) FROM t WHERE age / 0 > 0",
    "SELECT COUNT(*) FROM t WHERE age % 0 > 0",
    "SELECT COUNT(*) FROM t WHERE weight / ratio > 0",
    "SELECT COUNT(*) FROM t WHERE age / CEIL(weight) > 0",
    "SELECT COUNT(*) FROM t WHERE CEIL(weight) / 2 > 0",
    # floating point overflow and underflow, literals out of range
    "SELECT COUNT(*) FROM t WHERE weight + weight > 0",
    "SELECT COUNT(*) FROM t WHERE weight * 1e-300 > 0",
    "SELECT COUNT(*) FROM t WHERE ratio * ratio > 0",
    "SELECT COUNT(*) FROM t WHERE weight % 2 > 0",
    "SELECT COUNT(*) FROM t WHERE weight > 1e-400",
    "SELECT COUNT(*) FROM t WHERE weight > 1e309",
    "SELECT SUM(astro) FROM r",
    # numeric casts out of range
    "SELECT COUNT(*) FROM t WHERE CAST(weight AS REAL) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(weight AS INTEGER) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(glucose AS BIGINT) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(amount AS INTEGER) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(visits AS SMALLINT) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(2147483648 AS SMALLINT) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(0 / 0.0 AS INTEGER) > 0",
    # casts from text, and between types that do not convert
    "SELECT COUNT(*) FROM t WHERE CAST(zip AS INTEGER) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(zip AS DOUBLE PRECISION) > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(zip AS DATE) > '2020-01-01'",
    "SELECT COUNT(*) FROM t WHERE CAST(zip AS BOOLEAN)",
    "SELECT COUNT(CASE WHEN smoker THEN CAST('x' AS INTEGER) END) FROM t",
    "SELECT COUNT(*) FROM t WHERE CAST('2020-02-30' AS DATE) > born",
    "SELECT COUNT(*) FROM t WHERE ABS('1980-05-17') > 0",
    "SELECT COUNT(*) FROM t WHERE CAST(smoker AS BIGINT) = 1",
    "SELECT COUNT(*) FROM t WHERE CAST(born AS INTEGER) = 1",
    "SELECT COUNT(*) FROM t WHERE CAST(age AS DATE) = born",
    "SELECT COUNT(*) FROM t WHERE CAST(weight AS DATE) = born",
    # functions: missing overloads, domains, SQLAlchemy's Python floor() on SQLite
    "SELECT COUNT(*) FROM t WHERE ROUND(weight, 2) > 0",
    "SELECT COUNT(*) FROM t WHERE ROUND(glucose, 2) > 0",
    "SELECT COUNT(*) FROM t WHERE FLOOR(weight) > 0",
    "SELECT FLOOR(income), COUNT(*) FROM t GROUP BY 1",
    "SELECT COUNT(*) FROM t WHERE LOWER(age) = 'x'",
    "SELECT COUNT(*) FROM t WHERE LENGTH(weight) > 0",
    "SELECT COUNT(*) FROM t WHERE TRIM(BOTH 'x' FROM age) = 'y'",
    "SELECT COUNT(*) FROM t WHERE age ILIKE 'a%'",
    "SELECT COUNT(*) FROM t WHERE CONCAT(note, 'x') = 'y'",
    "SELECT COUNT(*) FROM t WHERE -NULL IS NULL",
    "SELECT COUNT(*) FROM t WHERE SUBSTRING(note FROM 1 FOR visits) = 'x'",
    "SELECT COUNT(*) FROM t WHERE SUBSTRING(note, 1, amount) = 'x'",
    "SELECT COUNT(*) FROM t WHERE SUBSTRING(note FROM huge FOR 2) = 'x'",
    # LIKE patterns ending in the escape character
    "SELECT COUNT(*) FROM t WHERE note LIKE zip",
    "SELECT COUNT(*) FROM t WHERE note LIKE 'a\\'",
    "SELECT COUNT(*) FROM t WHERE note ILIKE '%' || zip",
    # mixed types and implicit coercions
    "SELECT COUNT(*) FROM t WHERE sex = 1",
    "SELECT COUNT(*) FROM t WHERE zip > 0.5",
    "SELECT COUNT(*) FROM t WHERE age + note > 0",
    "SELECT COUNT(*) FROM t WHERE code",
    "SELECT COUNT(*) FROM t WHERE CASE WHEN sex THEN 1 END = 1",
    "SELECT COUNT(*) FROM t WHERE born",
    "SELECT COUNT(*) FROM t WHERE age",
    "SELECT COUNT(*) FROM t WHERE born > 0",
    "SELECT COUNT(*) FROM t WHERE born < 'not a date'",
    "SELECT COUNT(*) FROM t WHERE smoker >= born",
    "SELECT COUNT(*) FROM t WHERE CASE WHEN smoker THEN note ELSE age END = 'x'",
    "SELECT COUNT(*) FROM t WHERE COALESCE(note, age) = 'x'",
    "SELECT COUNT(*) FROM t WHERE smoker AND age",
    "SELECT COUNT(*) FROM t WHERE NOT note",
    # compiled SQL that does not parse
    "SELECT COUNT(*) FROM t WHERE age > 1 = TRUE",
    "SELECT COUNT(*) FROM t WHERE 1 BETWEEN 0 AND NOT smoker",
    *DRIVER_HAZARDS,
]
MARKS = {"sqlite": [], "duckdb": [], "postgres": [pytest.mark.postgres], **engines.MARKS}


def _on(backend: str, *values: Any) -> Any:
    return pytest.param(backend, *values, marks=MARKS[backend])


#: Every hazard runs on these. Spark Connect runs the same Spark SQL as the local session
#: (one dialect, one compiled statement, ANSI errors off on both); what it adds is its own
#: driver path — the client, gRPC, Arrow-decoded results — so it gets the hazards of that
#: layer (``DRIVER_HAZARDS``) and the SUM/AVG overflow test, whose answers are the largest
#: values decoded: the rest would repeat the local session's statements at Connect's cost.
EVERY_HAZARD_ON = ("sqlite", "duckdb", "postgres", "clickhouse", "spark")
HAZARD_CASES = [_on(b, sql) for b in EVERY_HAZARD_ON for sql in KNOWN_HAZARDS] + [
    _on("spark-connect", sql) for sql in DRIVER_HAZARDS
]


@pytest.mark.parametrize(("backend", "sql"), HAZARD_CASES)
def test_known_hazards_are_refused_or_run(
    backend: str, sql: str, request: pytest.FixtureRequest
) -> None:
    target: Target = request.getfixturevalue(f"{backend.replace('-', '_')}_target")
    outcome = run_query(target, sql)
    assert outcome.error is None, (
        f"an accepted query raised on {backend}\n"
        f"  SQL:      {sql}\n"
        f"  compiled: {_shorten(outcome.compiled or '')}\n"
        f"  error:    {_shorten(outcome.error)}"
    )


@pytest.mark.parametrize("backend", [_on(b) for b in (*EVERY_HAZARD_ON, "spark-connect")])
def test_sum_and_avg_over_many_extreme_rows_do_not_overflow(
    backend: str, request: pytest.FixtureRequest
) -> None:
    target: Target = request.getfixturevalue(f"{backend.replace('-', '_')}_target")
    failures = []
    for column in BOUNDED:
        for sql in (
            f"SELECT SUM({column}), AVG({column}) FROM m",
            f"SELECT SUM({column}), AVG({column}), COUNT(*) FROM mt",
            f"SELECT smoker, SUM({column}) FROM mt GROUP BY smoker",
            f"SELECT SUM({column}), AVG({column}) FROM r",
            f"SELECT sex, SUM({column}), AVG({column}) FROM t GROUP BY sex",
        ):
            outcome = run_query(target, sql)
            assert outcome.refused is None, (sql, outcome.refused)
            if outcome.error is not None:
                failures.append(
                    f"{sql}\n  compiled: {outcome.compiled}\n  error: {_shorten(outcome.error)}"
                )
    assert not failures, f"on {backend}:\n" + "\n".join(failures)
