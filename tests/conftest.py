"""Shared fixtures: small real databases (the demo generator, fewer people), a config,
a ledger, the Flask app and an analyst key. Nothing is mocked: the protected data and
the ledger are real SQLite files (PostgreSQL where ``DPGATE_TEST_POSTGRES_URL`` is set).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
import yaml
from flask import Flask
from flask.testing import FlaskClient

import gateway.pipeline.gateway as pipeline_module
from gateway.core.config import Config
from gateway.core.config_load import parse_config
from gateway.demo.hospital import build, config_yaml

if TYPE_CHECKING:
    import psycopg

    from gateway.pgwire.server import WireServer
    from gateway.pipeline.gateway import Gateway

ADMIN_KEY = "admin-" + "k" * 40
TEST_PATIENTS = 3000
POSTGRES_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL")


REPOSITORY = Path(__file__).resolve().parents[1]


def repository_files() -> list[Path]:
    """The checkout's files a clone would hold (tracked, plus new files git does not
    ignore); skips the test outside a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPOSITORY,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs git and a git checkout of dpgate")
    return [REPOSITORY / n for n in listed.decode().split("\0") if n and (REPOSITORY / n).is_file()]


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo hospital database with 3,000 patients, built once per test session."""
    path = tmp_path_factory.mktemp("demo") / "hospital.db"
    build(path, patients=TEST_PATIENTS)
    return path


def demo_config_dict(db: Path, ledger: Path, **overrides: Any) -> dict[str, Any]:
    """The demo config as a dict, with top-level sections updated by ``overrides``."""
    raw: dict[str, Any] = yaml.safe_load(config_yaml(str(db), str(ledger)))
    # Most tests exercise everything but release timing, which would hold each answer for
    # the deadline; tests of the timing policy (tests/test_side_channels.py, tests/attacks)
    # turn it back on.
    raw["execution"] = {"timing": "off"}
    for section, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(section), dict):
            raw[section] = {**raw[section], **value}
        else:
            raw[section] = value
    return raw


@pytest.fixture
def make_gateway(
    demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Gateway]:
    """Build a Gateway on a private copy of the demo data and a fresh ledger."""
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    counter = iter(range(1000))

    def factory(prepare: Callable[[Path], Any] | None = None, **overrides: Any) -> Gateway:
        """``prepare`` changes the copy of the data first (a neighbouring database)."""
        from gateway.pipeline.gateway import Gateway

        n = next(counter)
        db = tmp_path / f"hospital{n}.db"
        shutil.copy(demo_db, db)
        if prepare is not None:
            prepare(db)
        raw = demo_config_dict(db, tmp_path / f"ledger{n}.db", **overrides)
        return Gateway(parse_config(raw))

    return factory


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway()


@pytest.fixture
def config(gateway: Gateway) -> Config:
    return gateway.config


@pytest.fixture
def app(gateway: Gateway) -> Flask:
    from gateway.http.app import create_app

    return create_app(gateway.config, gateway=gateway)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def analyst_key(gateway: Gateway) -> str:
    """The key of a fresh analyst 'alice' with ε = 10, δ = 1e-6."""
    return gateway.ledger.create_analyst("alice", 10.0, 1e-6)


@pytest.fixture
def auth(analyst_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {analyst_key}"}


@pytest.fixture
def ask(client: FlaskClient, auth: dict[str, str]) -> Callable[..., Any]:
    """POST /v1/query as alice; returns (status, json)."""

    def post(sql: str, **params: Any) -> tuple[int, dict[str, Any]]:
        resp = client.post("/v1/query", json={"sql": sql, **params}, headers=auth)
        return resp.status_code, resp.get_json()

    return post


@pytest.fixture
def serve_wire(
    make_gateway: Callable[..., Gateway],
) -> Iterator[Callable[..., tuple[WireServer, int, str]]]:
    """Start PostgreSQL wire servers, each in a thread on a free port, on a gateway built
    with config ``overrides`` and the ``wire`` settings of its ``postgres_wire`` section;
    returns (server, port, alice's key). All are shut down after the test."""
    from gateway.pgwire.server import WireServer

    servers: list[WireServer] = []

    def start(wire: dict[str, Any] | None = None, **overrides: Any) -> tuple[WireServer, int, str]:
        gateway = make_gateway(postgres_wire={"port": 0, **(wire or {})}, **overrides)
        key = gateway.ledger.create_analyst("alice", 10.0, 1e-6)
        server = WireServer(gateway.config, gateway)
        _, port = server.bind("127.0.0.1")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, port, key

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def wire(
    serve_wire: Callable[..., tuple[WireServer, int, str]],
) -> tuple[WireServer, int, str]:
    """A wire server on the demo gateway (as ``serve_wire()``)."""
    return serve_wire()


def wire_connect(port: int, key: str, **kw: Any) -> psycopg.Connection[Any]:
    """A psycopg session as alice to a test wire server, in autocommit mode unless ``kw``
    (psycopg's options) says otherwise."""
    import psycopg

    kw.setdefault("autocommit", True)
    return psycopg.connect(
        host="127.0.0.1", port=port, user="alice", password=key, dbname="dpgate",
        sslmode="disable", connect_timeout=10, **kw,
    )  # fmt: skip


@pytest.fixture
def postgres_url() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    yield POSTGRES_URL


def postgres_schema_url(base: str) -> tuple[str, str]:
    """A URL on a fresh PostgreSQL schema (tests share the server), and the schema's name."""
    schema = "dpgate_t_" + uuid.uuid4().hex[:12]
    engine = sa.create_engine(base)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engine.dispose()
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}", schema


def drop_postgres_schema(base: str, schema: str, attempts: int = 5) -> None:
    """Drop a test's schema. A gateway the test left open may still be writing to it (a
    queued outcome): the DROP then waits for, or deadlocks with, that write. PostgreSQL
    aborts one of the two; the DROP is tried again (each try waits at most 10 s for its
    locks), so a test's teardown does not fail on a write it did not wait for."""
    engine = sa.create_engine(base)
    try:
        for attempt in range(attempts):
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql("SET LOCAL lock_timeout = '10s'")
                    conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                return
            except sa.exc.OperationalError:  # deadlock detected, lock timeout
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A ledger database URL: SQLite always, PostgreSQL (own schema) when configured."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/ledger.db"
        return
    if not POSTGRES_URL:
        pytest.skip("DPGATE_TEST_POSTGRES_URL not set")
    url, schema = postgres_schema_url(POSTGRES_URL)
    try:
        yield url
    finally:
        drop_postgres_schema(POSTGRES_URL, schema)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Unload duckdb before the interpreter exits, so its exit is quiet.

    duckdb's nanobind bindings count, at interpreter exit, every object of theirs still
    alive, and print a "nanobind: leaked …" report for each (module-level type constants
    included) whenever finalization has not freed the modules first — which depends on
    what else the test session imported. Dropping the modules here, after the last test,
    frees those objects in time. Harmless otherwise: nothing runs after this hook.
    """
    import gc
    import sys

    roots = ("duckdb", "_duckdb", "duckdb_engine")
    for name in [n for n in sys.modules if n.split(".")[0] in roots]:
        sys.modules.pop(name).__dict__.clear()
    gc.collect()


@pytest.fixture
def exact(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[tuple[Any, ...]]]]:
    """The exact rows of every statement the pipeline runs (before noise)."""
    seen: list[list[tuple[Any, ...]]] = []
    real = pipeline_module.run_aggregate

    def recording(*args: Any, **kwargs: Any) -> Any:
        rows = real(*args, **kwargs)
        seen.append([tuple(r) for r in rows])
        return rows

    monkeypatch.setattr(pipeline_module, "run_aggregate", recording)
    yield seen
