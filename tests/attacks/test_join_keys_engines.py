"""Issue 31 on the engines whose declared keys promise nothing: ClickHouse (chDB), whose
PRIMARY KEY is a sort key, and Spark SQL (local), whose constraints are informational.
The attacks of tests/attacks/test_join_keys.py, as they can be planted there — repeated
units under a declared key, duplicate keys the join's ``=`` finds equal (Spark's
string-to-number coercion; on ClickHouse, which joins two types only through an exact
common type, one key stored several times), NULL keys, a privacy-unit path over
repeated units, and one between two storage types (refused) — and the check the noise
relies on: removing a person moves each exact aggregate of the compiled statement by at
most its declared sensitivity (tests/attacks/neighbours.py).

Each test removes the persons its attack is about, and D and every D − person are
computed in one statement per query: the compiled SQL with each of the person's tables
read through ``(SELECT * FROM t WHERE NOT (col = value))``, one UNION ALL branch per
neighbour — so Spark runs one job per query, not one per person (the tests share the
Spark worker's one local session, ``engines.SPARK_GROUP``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlglot import exp

from gateway.core.errors import UnsupportedQuery
from gateway.sql.execute import StatementFailed, open_protected_engine, run_aggregate
from gateway.sql.join_keys import key_type_problems
from tests import engines
from tests.attacks.neighbours import (
    Compiled,
    Person,
    assert_within_sensitivity,
    cells,
    compile_all,
    compile_bypassing_the_refusal,
    config_for,
)

ENGINES = [
    pytest.param("clickhouse", marks=engines.SLOW),
    pytest.param("spark", marks=[engines.SLOW, engines.SPARK_GROUP]),
]
BIG = 2**53  # BIG and BIG + 1: two Int64 / BIGINT keys, one double
BIT = {"type": "integer", "lower": 0, "upper": 1}


@pytest.fixture(scope="module", params=ENGINES)
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, pytest.TempPathFactory]]:
    """(engine, the URL the gateway opens it with, the factory its fixtures load through)."""
    kind = request.param
    yield kind, engines.url(kind, tmp_path_factory), tmp_path_factory


def _create(
    kind: str,
    tpf: pytest.TempPathFactory,
    database: str,
    table: str,
    columns: str,
    rows: Sequence[Sequence[Any]],
    *,
    key: str | None = None,
) -> None:
    """``database.table`` with ``columns`` (the engine's own DDL) and ``rows``;
    ``key``: declared as the table's PRIMARY KEY where the engine has one to declare
    (ClickHouse's orders rows and keeps nothing unique)."""
    values = ", ".join("(" + ", ".join(_literal(kind, v) for v in r) + ")" for r in rows)
    if kind == "clickhouse":
        import chdb

        conn = chdb.connect(f"file:{engines.chdb_root(tpf)}")
        cursor = conn.cursor()
        cursor.execute(f'CREATE DATABASE IF NOT EXISTS "{database}"')
        order = f"PRIMARY KEY {key} ORDER BY {key}" if key else "ORDER BY tuple()"
        cursor.execute(
            f'CREATE TABLE "{database}"."{table}" ({columns}) ENGINE = MergeTree {order} '
            "SETTINGS allow_nullable_key = 1"
        )
        cursor.execute(f'INSERT INTO "{database}"."{table}" VALUES {values}')
        conn.close()
    else:
        spark = engines.spark_warehouse(tpf)
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        spark.sql(f"CREATE TABLE `{database}`.`{table}` ({columns}) USING parquet")
        spark.sql(f"INSERT INTO `{database}`.`{table}` VALUES {values}")


def _literal(kind: str, value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float) and math.isnan(value):
        return "nan" if kind == "clickhouse" else "CAST('NaN' AS DOUBLE)"
    return json.dumps(value).replace('"', "'")


def _quoted(kind: str, *parts: str) -> str:
    q = '"' if kind == "clickhouse" else "`"
    return ".".join(f"{q}{p}{q}" for p in parts)


def _without(kind: str, sql: str, database: str, person: Person) -> str:
    """``sql`` read on D − ``person``: each of the person's tables replaced by its rows
    whose column is not equal (under the engine's ``=``) to the person's value."""
    dialect = "clickhouse" if kind == "clickhouse" else "spark"
    kept: dict[str, list[str]] = {}
    for table, column, value in person:
        assert column is not None
        equal = exp.EQ(this=exp.column(column, quoted=True), expression=exp.convert(value))
        keep = exp.Not(this=exp.func("COALESCE", equal, exp.false()))
        kept.setdefault(table, []).append(keep.sql(dialect=dialect))
    for table, conditions in kept.items():
        name = _quoted(kind, database, table)
        assert name in sql, (name, sql)
        rows = f"(SELECT * FROM {name} WHERE {' AND '.join(conditions)})"
        sql = sql.replace(name, rows)
    return sql


def _check_every_person(
    kind: str,
    url: str,
    database: str,
    queries: dict[str, Compiled],
    people: Sequence[Person],
) -> list[dict[Any, Any]]:
    """Each query on D and on every D − person, in one statement per query; every
    neighbour within the declared sensitivity. Returns each query's cells on D."""
    engine = open_protected_engine(url, statement_timeout_ms=600_000)
    whole = []
    try:
        for q in queries.values():
            branches = [q.compiled.sql] + [
                _without(kind, q.compiled.sql, database, p) for p in people
            ]
            sql = " UNION ALL ".join(
                f"SELECT {i} AS dp_who, n{i}.* FROM ({b}) AS n{i}" for i, b in enumerate(branches)
            )
            try:
                rows = run_aggregate(engine, sql, timeout_ms=600_000)
            except StatementFailed:
                pytest.fail(f"{engines.raw_error(kind, url, sql)}\n{sql}")  # type: ignore[arg-type]
            by_who: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(len(branches))}
            for r in rows:
                by_who[int(r[0])].append(tuple(r[1:]))
            before = cells(by_who[0], q.compiled)
            for i, person in enumerate(people, start=1):
                assert_within_sensitivity(q, before, cells(by_who[i], q.compiled), person)
            whole.append(before)
    finally:
        engine.dispose()
    return whole


def _compile(
    url: str, tables: dict[str, Any], sqls: list[str], tmp_path: Path
) -> dict[str, Compiled]:
    return compile_all(config_for(url, tables, tmp_path / "ledger.db"), sqls)


def _storage(kind: str, declared: str) -> str:
    return engines.STORAGE[kind][declared]


# -- keys the engine does not enforce --------------------------------------------------------


def test_a_declared_key_the_engine_does_not_enforce_is_no_unique_unit(
    engine: tuple[str, str, pytest.TempPathFactory], tmp_path: Path
) -> None:
    """``pid`` is the table's PRIMARY KEY on ClickHouse (a sort key) and holds person 5
    thirty times; bound 1 row per person: person 5 moves COUNT by 1, SUM by 1."""
    kind, url, tpf = engine
    database = engines.new_database("unenforced")
    integer = _storage(kind, "integer")
    rows = [(5, 1)] * 30 + [(p, p % 2) for p in range(6, 12)]
    _create(kind, tpf, database, "people", f"pid {integer}, x {integer}", rows, key="pid")
    tables = {
        "people": {
            "schema": database,
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "integer", "nullable": False},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
        }
    }
    sqls = ["SELECT COUNT(*), SUM(x) FROM people", "SELECT x, COUNT(*) FROM people GROUP BY x"]
    queries = _compile(url, tables, sqls, tmp_path)
    people = [[("people", "pid", p)] for p in (5, 6)]
    whole = _check_every_person(kind, url, database, queries, people)
    assert whole[0][()] == (7, 4)  # seven persons, person 5 once


# -- duplicate spellings of a key under the join's coercion ----------------------------------


def _spelled_lookup(kind: str) -> tuple[str, list[tuple[Any, ...]], str, Any, Any]:
    """A public lookup's key type and rows holding several keys the join's ``=`` finds
    equal to one anchor value; the anchor's type and two of its values (the spelled one
    and another)."""
    if kind == "spark":
        # a STRING key against a BIGINT: Spark casts the string, '5' = '05' = ' 5' = 5
        spellings = ["5", "05", "005", " 5", "5 "]
        rows = [(s, f"g{j}") for j, s in enumerate(spellings)] + [("6", "other")]
        return "STRING", rows, "BIGINT", 5, 6
    # ClickHouse joins two types only through an exact common type (Int64 against
    # Float64 is an error, NO_COMMON_TYPE): its "spellings" are one key stored three
    # times under a PRIMARY KEY, which orders rows and keeps nothing unique
    rows = [(5, "g0"), (5, "g1"), (5, "g2"), (6, "other")]
    return "Int64", rows, "Int64", 5, 6


@pytest.mark.parametrize("anchor_unit", ["rows", "row-level"])
def test_keys_the_join_converts_to_one_value_multiply_nobody(
    engine: tuple[str, str, pytest.TempPathFactory], anchor_unit: str, tmp_path: Path
) -> None:
    kind, url, tpf = engine
    database = engines.new_database("spelled")
    key_type, lookup, anchor_type, value, other = _spelled_lookup(kind)
    string = _storage(kind, "text")
    integer = _storage(kind, "integer")
    _create(kind, tpf, database, "look", f"k {key_type}, g {string}", lookup, key="k")
    per = 3 if anchor_unit == "rows" else 1
    anchor = [(p, value if p % 2 else other, p % 5) for p in range(1, 9) for _ in range(per)]
    _create(kind, tpf, database, "people", f"pid {integer}, k {anchor_type}, x {integer}", anchor)
    declared = "integer"
    people_cfg: dict[str, Any] = {
        "schema": database,
        "columns": {
            "pid": {"type": "integer"},
            "k": {"type": declared},
            "x": {"type": "integer", "lower": 0, "upper": 4},
        },
        "references": {"k": "look.k"},
    }
    if anchor_unit == "rows":
        people_cfg |= {"privacy_unit": "pid", "max_rows_per_unit": per}
    tables = {
        "people": people_cfg,
        "look": {
            "schema": database,
            "public": True,
            "key": "k",
            "columns": {"k": {"type": declared}, "g": {"type": "text"}},
        },
    }
    sqls = [
        "SELECT COUNT(*), SUM(p.x) FROM people p JOIN look l ON p.k = l.k",
        "SELECT l.g, COUNT(*) FROM people p JOIN look l ON p.k = l.k GROUP BY l.g",
        "SELECT l.g, SUM(p.x) FROM people p LEFT JOIN look l ON p.k = l.k GROUP BY l.g",
    ]
    queries = _compile(url, tables, sqls, tmp_path)
    # person 1 holds the respelled key, person 2 another (row-level: one row per pid here,
    # so removing a pid removes one person)
    people = [[("people", "pid", p)] for p in (1, 2)]
    whole = _check_every_person(kind, url, database, queries, people)
    # each anchor row is counted once at most: 8 persons, `per` rows each, bound `per`
    assert whole[0][()][0] <= 8 * per


# -- NULL keys ---------------------------------------------------------------------------------


def test_null_keys_match_nothing(
    engine: tuple[str, str, pytest.TempPathFactory], tmp_path: Path
) -> None:
    """NULL join keys on both sides (a Nullable key on ClickHouse, whose LEFT JOIN reads
    unmatched columns as NULL, not the type's default), NULL units declared not null."""
    kind, url, tpf = engine
    database = engines.new_database("nulls")
    integer = _storage(kind, "integer")
    string = _storage(kind, "text")
    nullable = f"Nullable({integer})" if kind == "clickhouse" else integer
    _create(
        kind, tpf, database, "look", f"k {nullable}, g {string}",
        [(None, "n1"), (None, "n2"), (1, "one"), (0, "zero")],
    )  # fmt: skip
    rows = [(None, None)] * 4 + [(None, 1)] * 4 + [(p, p % 2 or None) for p in range(1, 9)]
    _create(kind, tpf, database, "people", f"pid {nullable}, k {nullable}", rows)
    tables = {
        "people": {
            "schema": database,
            "privacy_unit": "pid",
            "columns": {"pid": {"type": "integer", "nullable": False}, "k": {"type": "integer"}},
            "references": {"k": "look.k"},
        },
        "look": {
            "schema": database,
            "public": True,
            "key": "k",
            "columns": {"k": {"type": "integer"}, "g": {"type": "text"}},
        },
    }
    sqls = [
        "SELECT COUNT(*) FROM people",
        "SELECT l.g, COUNT(*) FROM people p LEFT JOIN look l ON p.k = l.k GROUP BY l.g",
        "SELECT COUNT(*) FROM people p JOIN look l ON p.k = l.k",
    ]
    queries = _compile(url, tables, sqls, tmp_path)
    people = [[("people", "pid", p)] for p in (1, 2)]  # a key that matches, a NULL key
    whole = _check_every_person(kind, url, database, queries, people)
    assert whole[0][()] == (8,)  # the NULL units are outside the declared domain
    assert None not in {k[0] for k in whole[1]} or whole[1].get((None,), (0,))[0] == 4
    assert whole[2][()] == (4,)  # the odd persons match key 1; NULL keys match nothing


# -- a privacy-unit path over units the engine does not keep unique ---------------------------


def test_a_privacy_unit_path_over_repeated_units_multiplies_nobody(
    engine: tuple[str, str, pytest.TempPathFactory], tmp_path: Path
) -> None:
    """visits → patients through the unit, patients.pid its PRIMARY KEY (ClickHouse: a
    sort key) holding person 5 four times: each of person 5's visits matches four
    patient rows, bounded after the join."""
    kind, url, tpf = engine
    database = engines.new_database("unitpath")
    integer = _storage(kind, "integer")
    string = _storage(kind, "text")
    patients = [(5, "F")] * 4 + [(6, "M"), (7, "F")]
    _create(kind, tpf, database, "patients", f"pid {integer}, sex {string}", patients, key="pid")
    visits = [(p, c) for p in (5, 6, 7, 8) for c in range(4)]
    _create(kind, tpf, database, "visits", f"pid {integer}, cost {integer}", visits)
    tables = {
        "patients": {
            "schema": database,
            "privacy_unit": "pid",
            "columns": {"pid": {"type": "integer"}, "sex": {"type": "text"}},
        },
        "visits": {
            "schema": database,
            "max_rows_per_unit": 2,
            "columns": {
                "pid": {"type": "integer"},
                "cost": {"type": "integer", "lower": 0, "upper": 3},
            },
            "references": {"pid": "patients.pid"},
        },
    }
    sqls = [
        "SELECT COUNT(*), SUM(v.cost) FROM visits v JOIN patients p ON p.pid = v.pid",
        "SELECT p.sex, COUNT(*) FROM visits v LEFT JOIN patients p ON p.pid = v.pid GROUP BY p.sex",
    ]
    queries = _compile(url, tables, sqls, tmp_path)
    # person 5 has four patient rows, person 8 none
    people = [[("visits", "pid", p), ("patients", "pid", p)] for p in (5, 8)]
    whole = _check_every_person(kind, url, database, queries, people)
    assert whole[0][()][0] <= 2 * 3  # three persons with a patient row, two visits each


def test_a_privacy_unit_path_between_different_types_is_refused(
    engine: tuple[str, str, pytest.TempPathFactory], tmp_path: Path
) -> None:
    """patients.pid (the unit) stored as a double, visits.pid as a 64-bit integer: the
    visits of BIG and of BIG + 1 are two persons, both equal to the one patient's double
    — the join hands that patient's row to both. Refused before anything runs."""
    kind, url, tpf = engine
    database = engines.new_database("unittypes")
    integer, real = _storage(kind, "integer"), _storage(kind, "real")
    _create(kind, tpf, database, "patients", f"pid {real}, x {integer}", [(float(BIG), 1)])
    _create(kind, tpf, database, "visits", f"pid {integer}, c {integer}", [(BIG, 1), (BIG + 1, 0)])
    tables = {
        "patients": {
            "schema": database,
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "integer"},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
        },
        "visits": {
            "schema": database,
            "columns": {
                "pid": {"type": "integer"},
                "c": {"type": "integer", "lower": 0, "upper": 1},
            },
            "references": {"pid": "patients.pid"},
        },
    }
    sql = "SELECT COUNT(*), SUM(p.x) FROM visits v JOIN patients p ON p.pid = v.pid"
    with pytest.raises(UnsupportedQuery, match="privacy unit is not supported"):
        _compile(url, tables, [sql], tmp_path)
    reader = open_protected_engine(url, statement_timeout_ms=600_000)
    try:  # `dpgate config check` names the reference and says it is refused
        problems = key_type_problems(reader, config_for(url, tables, tmp_path / "l3.db").tables)
    finally:
        reader.dispose()
    assert any(p.startswith("tables.visits.references.pid:") and "refused" in p for p in problems)
    if kind == "clickhouse":
        return  # ClickHouse refuses this join itself (NO_COMMON_TYPE): no attack to show
    # compiled anyway (bounded after the join, as before the refusal), removing the one
    # patient moves both visit persons' rows: COUNT and SUM by 2, past their sensitivity 1
    bypassed = compile_bypassing_the_refusal(config_for(url, tables, tmp_path / "l2.db"), sql)
    people = [[("patients", "pid", float(BIG))]]
    with pytest.raises(AssertionError, match="more than its sensitivity"):
        _check_every_person(kind, url, database, {sql: bypassed}, people)


def test_a_lookup_join_the_engine_cannot_compare_is_refused_free(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """ClickHouse joins an Int64 to a Float64 lookup key not at all (NO_COMMON_TYPE): each
    query through that reference would fail at the database and be charged (invariant 9:
    what is accepted runs). It is refused when compiled, before anything is charged, and
    `dpgate config check` says so; a lookup stored alike is answered."""
    url = engines.url("clickhouse", tmp_path_factory)
    database = engines.new_database("uncomparable")
    _create("clickhouse", tmp_path_factory, database, "look", "k Float64, g String", [(5.0, "a")])
    _create("clickhouse", tmp_path_factory, database, "alike", "k Int32, g String", [(5, "a")])
    people = [(p, 5, 1) for p in range(1, 5)]
    _create(
        "clickhouse", tmp_path_factory, database, "people", "pid Int64, k Int64, x Int64", people
    )
    lookup = {
        "public": True,
        "key": "k",
        "columns": {"k": {"type": "integer"}, "g": {"type": "text"}},
    }
    tables = {
        "people": {
            "schema": database,
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "integer"},
                "k": {"type": "integer"},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
            "references": {"k": "look.k"},
        },
        "look": {"schema": database, **lookup},
    }
    sql = "SELECT l.g, COUNT(*) FROM people p JOIN look l ON p.k = l.k GROUP BY l.g"
    with pytest.raises(UnsupportedQuery, match="cannot compare"):
        _compile(url, tables, [sql], tmp_path)
    reader = open_protected_engine(url, statement_timeout_ms=600_000)
    try:
        problems = key_type_problems(reader, config_for(url, tables, tmp_path / "l2.db").tables)
    finally:
        reader.dispose()
    assert any(p.startswith("tables.people.references.k:") and "refused" in p for p in problems)
    # Int64 against Int32 has an exact common type: compiled, and it runs
    tables["people"]["references"] = {"k": "alike.k"}
    tables["alike"] = {"schema": database, **lookup}
    alike = sql.replace("look", "alike")
    compiled = _compile(url, tables, [alike], tmp_path)[alike]
    reader = open_protected_engine(url, statement_timeout_ms=600_000)
    try:
        rows = run_aggregate(reader, compiled.compiled.sql, timeout_ms=600_000)
    finally:
        reader.dispose()
    assert rows  # the statement ran (its rows are the compiled statement's raw cells)


def test_a_join_reads_each_tables_real_columns_with_nan_as_the_others_engines_do(
    engine: tuple[str, str, pytest.TempPathFactory], tmp_path: Path
) -> None:
    """Real columns on both sides of a join, NaN in each: ClickHouse reads each joined
    table through its own NaN guard (NaN as +inf, clamped to the upper bound, as
    PostgreSQL, DuckDB and Spark order it). Its statement used to guard the anchor's
    table with the whole relation's columns and fail (UNKNOWN_IDENTIFIER)."""
    kind, url, tpf = engine
    database = engines.new_database("reals")
    integer, real, string = (_storage(kind, k) for k in ("integer", "real", "text"))
    nan = float("nan")
    look = [(1, 2.5, "a"), (2, nan, "b")]
    _create(kind, tpf, database, "look", f"k {integer}, w {real}, g {string}", look, key="k")
    people = [(p, 1 + p % 2, nan if p == 3 else p / 2) for p in range(1, 7)]
    _create(kind, tpf, database, "people", f"pid {integer}, k {integer}, r {real}", people)
    tenth = {"type": "real", "lower": 0, "upper": 10}
    tables = {
        "people": {
            "schema": database,
            "privacy_unit": "pid",
            "columns": {"pid": {"type": "integer"}, "k": {"type": "integer"}, "r": tenth},
            "references": {"k": "look.k"},
        },
        "look": {
            "schema": database,
            "public": True,
            "key": "k",
            "columns": {"k": {"type": "integer"}, "w": tenth, "g": {"type": "text"}},
        },
    }
    sql = (
        "SELECT l.g, COUNT(*), SUM(l.w), SUM(p.r) FROM people p JOIN look l ON p.k = l.k "
        "GROUP BY l.g"
    )
    queries = _compile(url, tables, [sql], tmp_path)
    [whole] = _check_every_person(kind, url, database, queries, [[("people", "pid", 3)]])
    # the NaN weights read as +inf, clamped to 10 (three people of key 2); grid-scaled
    # sums compared by their order only: key 2's weights outweigh key 1's
    assert whole[("a",)][0] == 3 and whole[("b",)][0] == 3
    assert whole[("b",)][1] > whole[("a",)][1]
