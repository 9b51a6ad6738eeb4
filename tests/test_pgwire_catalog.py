"""The emulated catalogue answers from the config or fixed text only, and BI tools' own
catalogue queries (Grafana, Metabase, DBeaver) are answered.

The walk: the functions and views BI tools call on connect (version, current_setting,
pg_settings, pg_database, pg_stat_*, information_schema, …) and the probes an attacker
would add (the engine's own functions, a missing column): no answer — column names,
values, notices or error messages — may name the engine, the host or the protected
database, nor carry a value of the protected rows beyond what ``/v1/schema`` publishes.
"""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
import yaml

import gateway
from gateway.pgwire.server import WireServer
from tests.conftest import wire_connect

WALK = [
    "SELECT version()",
    "SELECT pg_catalog.version()",
    "SELECT current_setting('server_version'), current_setting('server_version_num')",
    "SELECT current_setting('search_path'), current_setting('TimeZone')",
    "SELECT current_setting('data_directory')",
    "SELECT current_setting('threads', true), current_setting('memory_limit', true)",
    "SELECT * FROM pg_catalog.pg_settings",
    "SELECT name, setting FROM pg_settings WHERE name = 'server_version'",
    "SELECT * FROM pg_catalog.pg_database",
    "SELECT * FROM pg_catalog.pg_stat_activity",
    "SELECT * FROM pg_catalog.pg_stat_database",
    "SELECT * FROM pg_catalog.pg_stat_user_tables",
    "SELECT relname, n_live_tup FROM pg_stat_all_tables",
    "SELECT * FROM pg_catalog.pg_class",
    "SELECT * FROM pg_catalog.pg_attribute",
    "SELECT * FROM pg_catalog.pg_namespace",
    "SELECT * FROM pg_catalog.pg_type",
    "SELECT * FROM pg_catalog.pg_roles",
    "SELECT * FROM pg_catalog.pg_user",
    "SELECT * FROM pg_catalog.pg_tables",
    "SELECT * FROM pg_catalog.pg_indexes",
    "SELECT * FROM pg_catalog.pg_extension",
    "SELECT * FROM information_schema.schemata",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM information_schema.columns",
    "SELECT * FROM information_schema.views",
    "SELECT * FROM information_schema.table_constraints",
    "SELECT * FROM information_schema.key_column_usage",
    "SELECT * FROM information_schema.routines",
    "SELECT current_database(), current_user, session_user, current_schema()",
    "SELECT inet_server_addr(), inet_server_port(), pg_postmaster_start_time()",
    "SELECT pg_backend_pid(), pg_is_in_recovery()",
    "SELECT pg_total_relation_size('patients'), pg_relation_size('patients')",
    "SHOW ALL",
    "SHOW server_version",
    # what an attacker would try: the engine's own functions and tables, its errors
    "SELECT typeof(1)",
    "SELECT uuid()",
    "SELECT pragma_version()",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM pragma_database_list",
    "SELECT getenv('HOME')",
    "SELECT nosuchcol FROM pg_catalog.pg_class",
    "SELECT * FROM pg_catalog.pg_nosuchtable",
    "SELECT 1 FROM pg_class WHERE relname = 1",
    "SELECT now()",
]


def _texts(conn: psycopg.Connection[Any], sql: str) -> list[str]:
    """Everything the client sees of one statement: column names, values, notices,
    or the error's message, detail and hint."""
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    try:
        cur = conn.execute(sql)
        seen = [d.name for d in cur.description or []]
        seen += [repr(v) for row in cur.fetchall() for v in row]
    except psycopg.Error as e:
        seen = [str(e), str(e.diag.message_detail), str(e.diag.message_hint), str(e.sqlstate)]
    return seen + notices


def test_the_catalogue_walk_reveals_no_engine_host_or_data(
    wire: tuple[WireServer, int, str], demo_db: Path
) -> None:
    server, port, key = wire
    config = server.gateway.config
    database_url = str(config.database.url)
    forbidden = {
        "duckdb",
        "binder error",
        "catalog error",
        "parser error",
        "conversion error",
        duckdb.__version__.lower(),
        "v" + duckdb.__version__.lower(),
        socket.gethostname().lower(),
        database_url.lower(),
        "sqlite",
        "pytz",
        "traceback",
    }
    # Protected values that /v1/schema does not publish: the zip codes (a text column
    # without declared values), and each table's true row count.
    declared = {
        value for table in config.tables.values() for column in table.columns.values()
        for value in (column.values or ())
    }  # fmt: skip
    with sqlite3.connect(demo_db) as db:
        secrets_ = {str(z) for (z,) in db.execute("SELECT DISTINCT zip FROM patients")}
        secrets_ -= {str(v) for v in declared}
        counts = {
            int(n)
            for t in ("patients", "visits")
            for (n,) in db.execute(f"SELECT COUNT(*) FROM {t}")
        }
    assert secrets_ and counts
    with wire_connect(port, key) as conn:
        for sql in WALK:
            for text in _texts(conn, sql):
                lowered = text.lower()
                assert not any(f and f in lowered for f in forbidden), (sql, text)
                assert not (text.startswith("'") and text.strip("'") in secrets_), (sql, text)
                assert text not in {repr(n) for n in counts}, (sql, text)
        # The engine's own functions are refused as PostgreSQL refuses an unknown one.
        for sql in ("SELECT typeof(1)", "SELECT uuid()", "SELECT pragma_version()"):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert info.value.sqlstate == "42883", sql
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT nosuchcol FROM pg_catalog.pg_class")
        assert info.value.sqlstate == "42703"
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT current_setting('data_directory')")
        assert info.value.sqlstate == "42704"
        # Settings come from fixed text: exactly the emulated ones, no engine setting.
        from gateway.pgwire.catalog_settings import SETTINGS

        names = {r[0] for r in conn.execute("SELECT name FROM pg_settings").fetchall()}
        assert names == set(SETTINGS)
        # Statistics views are empty: their PostgreSQL counterparts count protected rows.
        for view in ("pg_stat_user_tables", "pg_stat_all_tables", "pg_stat_database"):
            assert conn.execute(f"SELECT * FROM pg_catalog.{view}").fetchall() == [], view
        # Tables and columns are exactly those of /v1/schema.
        columns = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
        ).fetchall()
        assert set(columns) == {
            (t.name, c.name) for t in config.tables.values() for c in t.columns.values()
        }
    assert server.gateway.ledger.history("alice") == []  # the walk cost nothing


def test_version_is_the_same_over_http_and_the_wire(wire: tuple[WireServer, int, str]) -> None:
    from gateway.http.app import create_app

    server, port, key = wire
    client = create_app(server.gateway.config, gateway=server.gateway).test_client()
    r = client.post(
        "/v1/query", json={"sql": "SELECT version()"}, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 200, r.json
    over_http = r.json
    with wire_connect(port, key) as conn:
        for sql in ("SELECT version()", "SELECT pg_catalog.version()"):
            cur = conn.execute(sql)
            assert [d.name for d in cur.description or []] == ["version"]
            assert cur.fetchall() == [(gateway.VERSION_TEXT,)]
        cur = conn.execute("SELECT version() AS v")
        assert [d.name for d in cur.description or []] == ["v"]
        server_version = conn.execute("SHOW server_version").fetchone()
    assert [c["name"] for c in over_http["columns"]] == ["version"]
    assert over_http["rows"] == [[gateway.VERSION_TEXT]]
    assert server_version == (gateway.POSTGRES_VERSION,)
    assert gateway.VERSION_TEXT.startswith(f"PostgreSQL {gateway.POSTGRES_VERSION} ")


@pytest.mark.parametrize(
    ("sql", "name"),
    [
        ("SELECT 1 + 1", "?column?"),
        ("SELECT count(*) FROM pg_class", "count"),
        ("SELECT 'x'::text", "text"),
        ("SELECT relname::text FROM pg_class", "relname"),
        ("SELECT (SELECT relname FROM pg_class LIMIT 1)", "relname"),
        ("SELECT CASE WHEN true THEN 1 END", "case"),
        ("SELECT coalesce(null, 1)", "coalesce"),
        ("SELECT current_setting('server_version')", "current_setting"),
        ("SELECT c.relname FROM pg_class c", "relname"),
    ],
)
def test_catalogue_columns_are_named_as_postgresql_names_them(
    wire: tuple[WireServer, int, str], sql: str, name: str
) -> None:
    _, port, key = wire
    with wire_connect(port, key) as conn:
        cur = conn.execute(sql)
        assert [d.name for d in cur.description or []] == [name]


BI_QUERIES = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "pgwire_bi_catalogue.yaml").read_text()
)


@pytest.mark.parametrize("case", BI_QUERIES, ids=[f"{c['tool']}: {c['what']}" for c in BI_QUERIES])
def test_bi_tools_catalogue_queries_replayed(
    wire: tuple[WireServer, int, str], case: dict[str, Any]
) -> None:
    server, port, key = wire
    with wire_connect(port, key) as conn:
        params = case.get("params")
        rows = conn.execute(case["sql"], params).fetchall()
    assert len(rows) == case["rows"], rows
    if "first_row" in case:
        assert list(rows[0]) == case["first_row"], rows
    assert server.gateway.ledger.history("alice") == []
