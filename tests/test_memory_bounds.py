"""What a serving worker keeps grows with distinct queries only up to a cap (issue 36).

Each test drives more distinct queries (or statements) than a cache holds and checks
that what it keeps stays within its documented size: it fails if that cache becomes
unbounded again. The soak (``bench/soak.py``) measures the whole worker's RSS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import budget
import gateway.pipeline.gateway
import gateway.pipeline.planning
from budget.sqlite import PAGE_CACHE_KIB
from gateway.audit import Auditor, predicates
from gateway.core.config import TableConfig, with_nullability
from gateway.core.config_load import parse_config
from gateway.demo.hospital import NULLABLE, config_yaml
from gateway.http.app import create_app
from gateway.ops.heap import limit_malloc_arenas
from gateway.pipeline.gateway import Gateway
from gateway.sql.analyze import analyze
from gateway.sql.execute import SQLITE_STATEMENT_CACHE


def _sqlite_memory_used() -> Callable[[], int] | None:
    """SQLite's own count of the bytes it holds, from the library Python's ``sqlite3``
    runs on (None when that library cannot be reached: a statically linked build)."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    used: Callable[[], int] = lib.sqlite3_memory_used
    before = used()
    probe = sqlite3.connect(":memory:")
    probe.execute("CREATE TABLE t (x)")
    opened = used()
    probe.close()
    return used if opened > before else None  # not the library sqlite3 runs on


def test_protected_sqlite_connection_keeps_few_prepared_statements(gateway: Gateway) -> None:
    """200 distinct statements on one protected connection: SQLite's memory stays flat
    once its pages are read (Python's default statement cache, 128, grew it ~600 kB)."""
    used = _sqlite_memory_used()
    if used is None:
        pytest.skip("the sqlite3 module's library cannot be read through ctypes")
    with gateway.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None

        def run(i: int) -> None:
            cursor = raw.cursor()
            cursor.execute(
                "SELECT disease, sex, COUNT(*), AVG(glucose), SUM(income) FROM patients "
                f"WHERE age BETWEEN {i % 60} AND {i % 60 + 30} AND income > {i} "
                "GROUP BY disease, sex ORDER BY disease, sex"
            )
            cursor.fetchall()
            cursor.close()

        for i in range(32):  # every page read, the statement cache full
            run(i)
        settled = used()
        for i in range(32, 232):
            run(i)
        grown = used() - settled
    # ~6 kB per statement kept: at Python's default cache (128) this grew ~600 kB
    assert SQLITE_STATEMENT_CACHE <= 16
    assert grown < 128 * 1024, f"SQLite's memory grew {grown} bytes over 200 new statements"


def test_ledger_sqlite_connections_cap_their_page_cache(tmp_path: Path) -> None:
    led = budget.Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        led.migrate()
        with led.engine.connect() as conn:
            size = conn.exec_driver_sql("PRAGMA cache_size").scalar()
    finally:
        led.close()
    assert size == -PAGE_CACHE_KIB  # negative: KiB, not pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_worker_malloc_arenas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False  # the operator's setting stands
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    if not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"):
        pytest.skip("not glibc")
    assert limit_malloc_arenas() is True


def test_plan_and_statement_caches_stay_within_their_size(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More distinct questions than the plan caches hold: each keeps at most its size."""
    cap = 12
    monkeypatch.setattr(gateway.pipeline.planning, "PLAN_CACHE_SIZE", cap)
    monkeypatch.setattr(gateway.pipeline.gateway, "PLAN_CACHE_SIZE", cap)
    gw = make_gateway(audit={"mode": "off"})
    key = gw.ledger.create_analyst("alice", 1e6, 1e-3)
    client = create_app(gw.config, gateway=gw).test_client()
    answered = 0
    for x in range(3 * cap):
        resp = client.post(
            "/v1/query",
            json={"sql": f"SELECT COUNT(*) FROM patients WHERE income >= {1000 * x}", "epsilon": 1},
            headers={"Authorization": f"Bearer {key}"},
        )
        answered += resp.status_code == 200
        assert len(gw.planner._plans) <= cap
        assert len(gw._compiled) <= cap
    assert answered == 3 * cap  # every question was new: the caches were filled past cap


@pytest.fixture(scope="module")
def tables() -> dict[str, TableConfig]:
    cfg = parse_config(yaml.safe_load(config_yaml("demo.db", "ledger.db")))
    return with_nullability(cfg.tables, NULLABLE)


def test_formula_caches_stay_within_their_size(
    tables: dict[str, TableConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The auditor's formula caches, over more distinct plans and cells than they hold."""
    cap = 16
    monkeypatch.setattr(predicates, "CACHE_SIZE", cap)
    auditor = Auditor(tables, min_group_size=5)
    for i in range(4 * cap):
        for sql in (
            f"SELECT disease, COUNT(glucose) FROM patients WHERE age >= {i} GROUP BY disease",
            f"SELECT city, AVG(glucose) FROM patients WHERE income < {1000 * i} GROUP BY city",
        ):
            auditor.pre_audit("alice", analyze(sql, tables))
        builder = auditor._builders["patients"]
        caches: dict[str, Any] = {
            "formulas": builder._cache,
            "cells": builder._cells,
            "group keys": builder._keys,
            "counted": builder._counted,
        }
        for name, cache in caches.items():
            assert len(cache) <= cap, f"{name}: {len(cache)} entries"
    assert len(builder._cache) + len(builder._cells) > 0  # the caches were used
