"""Issue 31: a catalogue fact never stands in for an enforcement the SQL's own semantics
break. Each attack stores keys that a UNIQUE index (or PARTITION BY) sees as distinct and
the join's ``=`` sees as equal — SQLite's type affinity, collations, PostgreSQL's
implicit casts and nondeterministic collations, NULL keys, partial unique indexes — and
checks what the noise relies on: removing any one person moves each exact aggregate the
compiled statement computes by at most its declared sensitivity (tests/attacks/
neighbours.py). Without the fix, the first attack counted each person 64 times.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import budget
from gateway.core.errors import UnsupportedQuery
from gateway.core.plan import QueryRequest
from gateway.pipeline.gateway import Gateway
from gateway.sql.join_keys import key_type_problems
from tests.attacks.neighbours import (
    Compiled,
    answers,
    assert_within_sensitivity,
    compile_all,
    compile_bypassing_the_refusal,
    config_for,
)
from tests.conftest import POSTGRES_URL, drop_postgres_schema, postgres_schema_url

SPELLINGS = 64
N_PEOPLE = 24
HIV = [p % 3 == 0 for p in range(N_PEOPLE + 1)]


def _sqlite(path: Path, script: str, rows: dict[str, list[tuple[Any, ...]]]) -> str:
    db = sqlite3.connect(path)
    db.executescript(script)
    for table, values in rows.items():
        if values:
            marks = ", ".join("?" * len(values[0]))
            db.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    db.commit()
    db.close()
    return f"sqlite:///{path}"


def _check_every_person(
    url: str,
    queries: dict[str, Compiled],
    people: Sequence[Sequence[tuple[str, str | None, Any]]],
    schema: str | None = None,
) -> list[dict[Any, Any]]:
    writer = sa.create_engine(url)
    try:
        qs = list(queries.values())
        whole = answers(writer, qs, None, schema)
        for person in people:
            for q, before, after in zip(
                qs, whole, answers(writer, qs, person, schema), strict=True
            ):
                assert_within_sensitivity(q, before, after, person)
        return whole
    finally:
        writer.dispose()


# -- the attack: 64 spellings of each key under SQLite's affinity ------------------

BDAY_TABLES = {
    "patients": {
        "privacy_unit": "pid",
        "columns": {
            "pid": {"type": "integer"},
            "bday": {"type": "integer"},
            "hiv": {"type": "integer", "lower": 0, "upper": 1},
        },
        "references": {"bday": "bday_info.bday"},
    },
    "bday_info": {
        "public": True,
        "key": "bday",
        "columns": {
            "bday": {"type": "integer", "nullable": False},
            "label": {"type": "text", "nullable": False},
        },
    },
}
BDAY_QUERIES = [
    "SELECT COUNT(*) FROM patients p JOIN bday_info b ON p.bday = b.bday WHERE p.hiv = 1",
    "SELECT b.label, COUNT(*) FROM patients p JOIN bday_info b ON p.bday = b.bday "
    "WHERE p.hiv = 1 GROUP BY b.label",
    "SELECT COUNT(*), SUM(p.hiv) FROM patients p LEFT JOIN bday_info b ON p.bday = b.bday",
]


def _spellings(v: int) -> list[Any]:
    """Distinct to a UNIQUE index on a column without a type, equal to ``v`` in a join
    with an INTEGER column: ``v`` itself, '5', '05', '005', … (64 in all)."""
    return [v] + ["0" * i + str(v) for i in range(SPELLINGS - 1)]


@pytest.fixture(scope="module")
def bday_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("bday")
    lookup = [(s, f"L{v}-{j:02d}") for v in range(1, 7) for j, s in enumerate(_spellings(v))]
    patients = [(p, 1 + p % 6, int(HIV[p])) for p in range(1, N_PEOPLE + 1)]
    return _sqlite(
        root / "bday.db",
        "CREATE TABLE bday_info (bday NOT NULL UNIQUE, label TEXT NOT NULL);"
        "CREATE TABLE patients (pid INTEGER PRIMARY KEY, bday INTEGER, hiv INTEGER);",
        {"bday_info": lookup, "patients": patients},
    )


def test_64_spellings_of_a_key_multiply_nobody(bday_db: str, tmp_path: Path) -> None:
    config = config_for(bday_db, BDAY_TABLES, tmp_path / "ledger.db")
    queries = compile_all(config, BDAY_QUERIES)
    people = [[("patients", "pid", p)] for p in range(1, N_PEOPLE + 1)]
    whole = _check_every_person(bday_db, queries, people)
    # and the join counts each person at most once (the issue saw 7808 for a true 122)
    assert whole[0][()][0] <= sum(HIV)
    assert sum(c[0] for c in whole[1].values()) <= sum(HIV)


# -- the same under other affinities and collations (SQLite) --------------------------------

AFFINITY_CASES = {
    # key column type, anchor column type, declared type, key spellings of one value
    "untyped key, INTEGER anchor": ("", "INTEGER", "integer", [5, "5", "05", "5.0", " 5"]),
    "TEXT key, INTEGER anchor": ("TEXT", "INTEGER", "integer", ["5", "05", "005", "5.0"]),
    "TEXT key, REAL anchor": ("TEXT", "REAL", "real", ["5", "05", "5.0", "5e0"]),
    "untyped key, REAL anchor": ("", "REAL", "real", [5, "5.0", "05"]),
    "NUMERIC anchor, TEXT key": ("TEXT", "NUMERIC", "integer", ["5", "05", "+5"]),
    "NOCASE anchor, TEXT key": ("TEXT", "TEXT COLLATE NOCASE", "text", ["k", "K"]),
}


@pytest.mark.parametrize("case", list(AFFINITY_CASES))
@pytest.mark.parametrize("anchor_unit", ["pk", "rows", "row-level"])
def test_affinity_and_collation_spellings_multiply_nobody(
    case: str, anchor_unit: str, tmp_path: Path
) -> None:
    """A public lookup whose key holds several spellings of one value, joined from an
    anchor whose unit is a primary key (the unique-unit shortcut), repeats (three rows per
    person, bounded in SQL), or is absent (row-level privacy)."""
    key_type, anchor_type, declared, spellings = AFFINITY_CASES[case]
    value = 5.0 if declared == "real" else "k" if declared == "text" else 5
    other = 6.0 if declared == "real" else "z" if declared == "text" else 6
    lookup = [(s, f"g{j}") for j, s in enumerate(spellings)] + [(other, "other")]
    pk = " PRIMARY KEY" if anchor_unit == "pk" else ""
    per = 3 if anchor_unit == "rows" else 1
    anchor = [(p, value if p % 2 else other, p % 5) for p in range(1, 13) for _ in range(per)]
    url = _sqlite(
        tmp_path / "t.db",
        f"CREATE TABLE look (k {key_type} NOT NULL UNIQUE, g TEXT NOT NULL);"
        f"CREATE TABLE people (pid INTEGER{pk}, k {anchor_type}, x INTEGER);",
        {"look": lookup, "people": anchor},
    )
    people_cfg: dict[str, Any] = {
        "columns": {
            "pid": {"type": "integer"},
            "k": {"type": declared},
            "x": {"type": "integer", "lower": 0, "upper": 4},
        },
        "references": {"k": "look.k"},
    }
    if anchor_unit != "row-level":
        people_cfg |= {"privacy_unit": "pid", "max_rows_per_unit": per}
    tables = {
        "people": people_cfg,
        "look": {
            "public": True,
            "key": "k",
            "columns": {"k": {"type": declared}, "g": {"type": "text"}},
        },
    }
    sqls = [
        "SELECT COUNT(*) FROM people p JOIN look l ON p.k = l.k",
        "SELECT l.g, COUNT(*), SUM(p.x) FROM people p JOIN look l ON p.k = l.k GROUP BY l.g",
        "SELECT COUNT(*) FROM people p LEFT JOIN look l ON p.k = l.k WHERE l.g IS NOT NULL",
    ]
    queries = compile_all(config_for(url, tables, tmp_path / "ledger.db"), sqls)
    if anchor_unit == "row-level":
        people = [[("people", None, r)] for r in range(1, len(anchor) + 1)]
    else:
        people = [[("people", "pid", p)] for p in range(1, 13)]
    _check_every_person(url, queries, people)


def test_a_privacy_unit_path_with_spelled_units_multiplies_nobody(tmp_path: Path) -> None:
    """visits → patients through the unit, patients.pid a TEXT primary key holding '5'
    and '05' (two rows to its index and to PARTITION BY, both equal to visits' 5)."""
    url = _sqlite(
        tmp_path / "p.db",
        "CREATE TABLE patients (pid TEXT PRIMARY KEY NOT NULL, sex TEXT);"
        "CREATE TABLE visits (pid INTEGER, cost INTEGER);",
        {
            "patients": [(s, "F") for s in ("5", "05", "005")] + [("6", "M"), ("06", "M")],
            "visits": [(p, c) for p in (5, 6, 7) for c in range(4)],
        },
    )
    tables = {
        "patients": {
            "privacy_unit": "pid",
            "columns": {"pid": {"type": "integer"}, "sex": {"type": "text"}},
        },
        "visits": {
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
    queries = compile_all(config_for(url, tables, tmp_path / "ledger.db"), sqls)
    people = [[("visits", "pid", p), ("patients", "pid", p)] for p in (5, 6, 7)]
    people += [[("patients", "pid", s)] for s in ("5", "05", "005", "6", "06")]
    _check_every_person(url, queries, people)


def test_null_keys_match_nothing(tmp_path: Path) -> None:
    """NULL join keys on both sides, and a unique unit column holding NULLs declared
    ``nullable: false`` (a UNIQUE constraint admits any number of NULLs)."""
    url = _sqlite(
        tmp_path / "n.db",
        "CREATE TABLE look (k INTEGER UNIQUE, g TEXT);"
        "CREATE TABLE people (pid INTEGER UNIQUE, k INTEGER);",
        {
            "look": [(None, "n1"), (None, "n2"), (1, "one")],
            "people": [(None, None)] * 5
            + [(None, 1)] * 5
            + [(p, p % 2 or None) for p in range(1, 9)],
        },
    )
    tables = {
        "people": {
            "privacy_unit": "pid",
            "columns": {"pid": {"type": "integer", "nullable": False}, "k": {"type": "integer"}},
            "references": {"k": "look.k"},
        },
        "look": {
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
    queries = compile_all(config_for(url, tables, tmp_path / "ledger.db"), sqls)
    people = [[("people", "pid", p)] for p in range(1, 9)]
    _check_every_person(url, queries, people)


def test_a_partial_unique_index_is_no_unique_unit(tmp_path: Path) -> None:
    """``CREATE UNIQUE INDEX … WHERE pid > 100`` keeps nothing unique below 100: a person
    with 30 rows there must still count once."""
    url = _sqlite(
        tmp_path / "u.db",
        "CREATE TABLE people (pid INTEGER NOT NULL, x INTEGER);"
        "CREATE UNIQUE INDEX people_big ON people (pid) WHERE pid > 100;",
        {"people": [(5, 1)] * 30 + [(p, 0) for p in range(6, 15)] + [(101, 1)]},
    )
    tables = {
        "people": {
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "integer"},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
        }
    }
    queries = compile_all(
        config_for(url, tables, tmp_path / "ledger.db"),
        ["SELECT COUNT(*), SUM(x) FROM people", "SELECT x, COUNT(*) FROM people GROUP BY x"],
    )
    _check_every_person(url, queries, [[("people", "pid", p)] for p in (5, 6, 101)])


# -- PostgreSQL: collations and implicit casts ----------------------------------------------


@pytest.fixture
def pg_schema() -> Iterator[tuple[sa.Engine, str]]:
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    _, schema = postgres_schema_url(POSTGRES_URL)
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        yield engine, schema
    finally:
        engine.dispose()
        drop_postgres_schema(POSTGRES_URL, schema)


def _citext_schema(conn: sa.Connection, schema: str) -> str:
    """The schema of the citext extension: where it already is, else ``CITEXT_SCHEMA``,
    which no test drops. Not the test's own schema: dropping it (CASCADE) took the
    extension, and with it the citext column of a test running beside it on another
    worker ("column k does not exist"). Skipped where the server does not ship citext."""

    def found() -> str | None:
        where = conn.execute(
            sa.text(
                "SELECT n.nspname FROM pg_extension e "
                "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'citext'"
            )
        ).scalar()
        return None if where is None else str(where)

    where = found()
    if where is not None:
        return where
    available = conn.execute(
        sa.text("SELECT 1 FROM pg_available_extensions WHERE name = 'citext'")
    ).scalar()
    if available is None:
        pytest.skip("this PostgreSQL server has no citext extension")
    # one worker creates it; the other waits here and then finds it
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('dpgate-test-citext'))"))
    where = found()
    if where is None:
        conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{CITEXT_SCHEMA}"'))
        conn.execute(sa.text(f'CREATE EXTENSION citext SCHEMA "{CITEXT_SCHEMA}"'))
        where = CITEXT_SCHEMA
    return where


#: Where the tests put the citext extension when the server has it nowhere yet.
CITEXT_SCHEMA = "dpgate_test_citext"


PG_CASES = {
    # key column type, anchor column type, declared, key spellings of one value, the value
    "nondeterministic collation on the anchor": (
        "text",
        'text COLLATE "{schema}".ci',
        "text",
        ["k", "K"],
        "k",
    ),
    "citext anchor, text key": ("text", "citext", "text", ["k", "K"], "k"),
    "numeric key, double anchor": (
        "numeric",
        "double precision",
        "real",
        ["0.1", "0.10000000000000000001", "0.1000000000000000000000001"],
        0.1,
    ),
}


@pytest.mark.parametrize("case", list(PG_CASES))
@pytest.mark.parametrize("anchor_unit", ["pk", "row-level"])
def test_postgres_collations_and_casts_multiply_nobody(
    case: str, anchor_unit: str, pg_schema: tuple[sa.Engine, str], tmp_path: Path
) -> None:
    engine, schema = pg_schema
    key_type, anchor_type, declared, spellings, value = PG_CASES[case]
    pk = " PRIMARY KEY" if anchor_unit == "pk" else ""
    with engine.begin() as conn:
        home = schema
        if "citext" in case:
            home = _citext_schema(conn, schema)
        anchor_type = anchor_type.format(schema=schema).replace("citext", f'"{home}".citext')
        conn.execute(
            sa.text(
                f'CREATE COLLATION "{schema}".ci '
                "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
            )
        )
        conn.execute(
            sa.text(f'CREATE TABLE "{schema}".look (k {key_type} NOT NULL UNIQUE, g text NOT NULL)')
        )
        conn.execute(
            sa.text(f'CREATE TABLE "{schema}".people (pid integer{pk}, k {anchor_type}, x integer)')
        )
        for j, s in enumerate(spellings):
            conn.execute(
                sa.text(f'INSERT INTO "{schema}".look VALUES (CAST(:k AS {key_type}), :g)'),
                {"k": s, "g": f"g{j}"},
            )
        for p in range(1, 11):
            conn.execute(
                sa.text(f'INSERT INTO "{schema}".people VALUES (:p, :k, :x)'),
                {"p": p, "k": value if p % 2 else None, "x": p % 2},
            )
    people_cfg: dict[str, Any] = {
        "schema": schema,
        "columns": {
            "pid": {"type": "integer"},
            "k": {"type": declared},
            "x": {"type": "integer", "lower": 0, "upper": 1},
        },
        "references": {"k": "look.k"},
    }
    if anchor_unit == "pk":
        people_cfg["privacy_unit"] = "pid"
    tables = {
        "people": people_cfg,
        "look": {
            "schema": schema,
            "public": True,
            "key": "k",
            "columns": {"k": {"type": declared}, "g": {"type": "text"}},
        },
    }
    sqls = [
        "SELECT COUNT(*), SUM(p.x) FROM people p JOIN look l ON p.k = l.k",
        "SELECT l.g, COUNT(*) FROM people p JOIN look l ON p.k = l.k GROUP BY l.g",
    ]
    assert POSTGRES_URL is not None
    queries = compile_all(config_for(POSTGRES_URL, tables, tmp_path / "ledger.db"), sqls)
    people = [[("people", "pid", p)] for p in range(1, 11)]
    _check_every_person(POSTGRES_URL, queries, people, schema)


def test_postgres_partial_unique_index_is_no_unique_unit(
    pg_schema: tuple[sa.Engine, str], tmp_path: Path
) -> None:
    engine, schema = pg_schema
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{schema}".people (pid integer NOT NULL, x integer)'))
        conn.execute(sa.text(f'CREATE UNIQUE INDEX ON "{schema}".people (pid) WHERE pid > 100'))
        conn.execute(
            sa.text(f'INSERT INTO "{schema}".people SELECT 5, 1 FROM generate_series(1, 30)')
        )
        conn.execute(sa.text(f'INSERT INTO "{schema}".people VALUES (6, 0), (101, 1)'))
    tables = {
        "people": {
            "schema": schema,
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "integer"},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
        }
    }
    assert POSTGRES_URL is not None
    queries = compile_all(
        config_for(POSTGRES_URL, tables, tmp_path / "ledger.db"),
        ["SELECT COUNT(*), SUM(x) FROM people"],
    )
    _check_every_person(POSTGRES_URL, queries, [[("people", "pid", 5)]], schema)


# -- DuckDB: implicit casts and collations ---------------------------------------------------

DUCK_CASES = {
    "decimal key, double anchor": (
        "DECIMAL(38, 37)",
        "DOUBLE",
        "real",
        ["0.1", "0.1000000000000000000000001"],
        0.1,
    ),
    "NOCASE anchor, VARCHAR key": ("VARCHAR", "VARCHAR COLLATE NOCASE", "text", ["k", "K"], "k"),
}


@pytest.mark.parametrize("case", list(DUCK_CASES))
@pytest.mark.parametrize("anchor_unit", ["pk", "row-level"])
def test_duckdb_casts_and_collations_multiply_nobody(
    case: str, anchor_unit: str, tmp_path: Path
) -> None:
    pytest.importorskip("duckdb_engine")
    key_type, anchor_type, declared, spellings, value = DUCK_CASES[case]
    url = f"duckdb:///{tmp_path / 'd.duckdb'}"
    pk = " PRIMARY KEY" if anchor_unit == "pk" else ""
    writer = sa.create_engine(url)
    with writer.begin() as conn:
        conn.execute(
            sa.text(f"CREATE TABLE look (k {key_type} NOT NULL UNIQUE, g VARCHAR NOT NULL)")
        )
        conn.execute(sa.text(f"CREATE TABLE people (pid INTEGER{pk}, k {anchor_type}, x INTEGER)"))
        for j, s in enumerate(spellings):
            conn.execute(
                sa.text(f"INSERT INTO look VALUES (CAST(:k AS {key_type}), :g)"),
                {"k": s, "g": f"g{j}"},
            )
        for p in range(1, 11):
            conn.execute(
                sa.text("INSERT INTO people VALUES (:p, :k, :x)"),
                {"p": p, "k": value if p % 2 else None, "x": p % 2},
            )
    writer.dispose()
    people_cfg: dict[str, Any] = {
        "columns": {
            "pid": {"type": "integer"},
            "k": {"type": declared},
            "x": {"type": "integer", "lower": 0, "upper": 1},
        },
        "references": {"k": "look.k"},
    }
    if anchor_unit == "pk":
        people_cfg["privacy_unit"] = "pid"
    tables = {
        "people": people_cfg,
        "look": {
            "public": True,
            "key": "k",
            "columns": {"k": {"type": declared}, "g": {"type": "text"}},
        },
    }
    sqls = [
        "SELECT COUNT(*), SUM(p.x) FROM people p JOIN look l ON p.k = l.k",
        "SELECT l.g, COUNT(*) FROM people p JOIN look l ON p.k = l.k GROUP BY l.g",
    ]
    queries = compile_all(config_for(url, tables, tmp_path / "ledger.db"), sqls)
    people = [[("people", "pid", p)] for p in range(1, 11)]
    _check_every_person(url, queries, people)


def test_postgres_inheritance_children_break_the_parents_keys_and_checks(
    pg_schema: tuple[sa.Engine, str], tmp_path: Path
) -> None:
    """A table read with its inheritance children: the parent's PRIMARY KEY does not span
    them, and a CHECK … NO INHERIT does not bind them — person 5 has three rows, two of
    them far outside x's declared [0, 1]."""
    engine, schema = pg_schema
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f'CREATE TABLE "{schema}".people (pid integer PRIMARY KEY, '
                "x integer NOT NULL CHECK (x BETWEEN 0 AND 1) NO INHERIT)"
            )
        )
        conn.execute(sa.text(f'CREATE TABLE "{schema}".more () INHERITS ("{schema}".people)'))
        conn.execute(sa.text(f'INSERT INTO "{schema}".people VALUES (5, 1), (6, 0), (7, 1)'))
        conn.execute(sa.text(f'INSERT INTO "{schema}".more VALUES (5, 700), (5, 900)'))
    tables = {
        "people": {
            "schema": schema,
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "integer"},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
        }
    }
    assert POSTGRES_URL is not None
    queries = compile_all(
        config_for(POSTGRES_URL, tables, tmp_path / "ledger.db"),
        ["SELECT COUNT(*), SUM(x) FROM people", "SELECT x, COUNT(*) FROM people GROUP BY x"],
    )
    people = [[("people", "pid", p)] for p in (5, 6, 7)]
    _check_every_person(POSTGRES_URL, queries, people, schema)


def test_duckdb_a_collated_unique_unit_is_not_unique(tmp_path: Path) -> None:
    """DuckDB's PRIMARY KEY on a NOCASE column keeps 'a' and 'A' (bytes differ), which its
    PARTITION BY and COUNT(DISTINCT) read as one person."""
    pytest.importorskip("duckdb_engine")
    url = f"duckdb:///{tmp_path / 'c.duckdb'}"
    writer = sa.create_engine(url)
    with writer.begin() as conn:
        conn.execute(
            sa.text("CREATE TABLE people (pid VARCHAR COLLATE NOCASE PRIMARY KEY, x INTEGER)")
        )
        conn.execute(sa.text("INSERT INTO people VALUES ('a', 1), ('A', 1), ('b', 0), ('c', 1)"))
    writer.dispose()
    tables = {
        "people": {
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "text", "nullable": False},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
        }
    }
    queries = compile_all(
        config_for(url, tables, tmp_path / "ledger.db"),
        ["SELECT COUNT(*), SUM(x) FROM people", "SELECT x, COUNT(*) FROM people GROUP BY x"],
    )
    # one person under the column's collation: every spelling of them is removed
    people = [[("people", "pid", p)] for p in ("a", "b", "c")]
    _check_every_person(url, queries, people)


# -- a privacy-unit path between differently stored columns: refused -------------------------


@pytest.mark.parametrize(
    "unit_type, visit_type, units, visits",
    [
        # two DECIMAL persons in visits, one DOUBLE person in patients equal to both
        ("DOUBLE", "DECIMAL(38, 37)", ["0.1"], ["0.1", "0.1000000000000000000000001"]),
        # two VARCHAR persons in visits, one NOCASE person in patients equal to both
        ("VARCHAR COLLATE NOCASE", "VARCHAR", ["k"], ["k", "K"]),
    ],
)
def test_duckdb_a_privacy_unit_path_between_storage_types_is_refused(
    unit_type: str, visit_type: str, units: list[str], visits: list[str], tmp_path: Path
) -> None:
    """Bounding after the join keeps each *anchor* unit's rows bounded, but here the join
    hands one patient's row to two visit persons: removing that patient moves both. The
    query is refused (free, from the config and the catalogue); compiled anyway, the
    attack shows."""
    pytest.importorskip("duckdb_engine")
    url = f"duckdb:///{tmp_path / 'u.duckdb'}"
    writer = sa.create_engine(url)
    with writer.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE patients (pid {unit_type}, x INTEGER)"))
        conn.execute(sa.text(f"CREATE TABLE visits (pid {visit_type}, c INTEGER)"))
        for u in units:
            conn.execute(
                sa.text(f"INSERT INTO patients VALUES (CAST(:u AS {unit_type.split()[0]}), 1)"),
                {"u": u},
            )
        for v in visits:
            conn.execute(
                sa.text(f"INSERT INTO visits VALUES (CAST(:v AS {visit_type}), 1)"), {"v": v}
            )
    writer.dispose()
    declared = "text" if "VARCHAR" in unit_type else "real"
    tables = {
        "patients": {
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": declared},
                "x": {"type": "integer", "lower": 0, "upper": 1},
            },
        },
        "visits": {
            "columns": {
                "pid": {"type": declared},
                "c": {"type": "integer", "lower": 0, "upper": 1},
            },
            "references": {"pid": "patients.pid"},
        },
    }
    sql = "SELECT COUNT(*), SUM(p.x) FROM visits v JOIN patients p ON p.pid = v.pid"
    config = config_for(url, tables, tmp_path / "ledger.db")
    with pytest.raises(UnsupportedQuery, match="privacy unit is not supported") as refused:
        compile_all(config, [sql])
    assert refused.value.detail["construct"].startswith("privacy-unit path")
    assert compile_all(config, ["SELECT COUNT(*) FROM visits"])  # each table alone: answered
    reader = sa.create_engine(url)
    try:  # `dpgate config check` names the reference and says it is refused
        problems = key_type_problems(reader, config.tables)
    finally:
        reader.dispose()
    assert any(p.startswith("tables.visits.references.pid:") and "refused" in p for p in problems)
    ledger = budget.Ledger.from_url(config.ledger.url)
    gateway = Gateway(config, ledger=ledger)
    try:  # through the pipeline: refused before anything is charged
        ledger.create_analyst("eve", 10.0, 1e-6)
        request = QueryRequest(sql=sql, epsilon=1.0, delta=0.0, mechanism="laplace")
        with pytest.raises(UnsupportedQuery):
            gateway.query("eve", request)
        assert ledger.budget_status("eve").rho_spent == 0
    finally:
        gateway.engine.dispose()
        ledger.close()
    bypassed = compile_bypassing_the_refusal(config, sql)
    with pytest.raises(AssertionError, match="more than its sensitivity"):
        _check_every_person(url, {sql: bypassed}, [[("patients", "pid", units[0])]])
