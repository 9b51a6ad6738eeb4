"""Thin adapters between the benchmark harness and dpgate (in-process and over HTTP).

Everything the harness needs from dpgate goes through this module, so a change of
dpgate's internal API is fixed here once:

- ``write_config``: a dpgate YAML config (public contract: docs/design.md, "Config
  reference") for a set of tables;
- ``InProcess``: ``Gateway.from_config`` + ``Gateway.query`` with analysts created in the
  ledger (one fresh analyst per repetition, so a repeated query is a real cache miss with
  a real ledger reserve/commit, not a cache hit — the cache is per analyst by default);
- ``Http``: the ``POST /v1/query`` endpoint, stdlib only.
"""

from __future__ import annotations

import http.client
import itertools
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import queries as Q

BIG_BUDGET = {"epsilon": 1.0e6, "delta": 1.0e-3}


@dataclass(frozen=True)
class Answer:
    ok: bool
    rows: list[list[Any]]
    cached: bool = False
    error: str | None = None  # the error code (and message) when not ok


def pums_tables() -> dict[str, Any]:
    """PUMS as a dpgate table: row-level privacy like SmartNoise's ``row_privacy: True``."""
    cols: dict[str, Any] = {"pid": {"type": "integer"}}
    for c in Q.COLUMNS:
        if c in Q.BOUNDS:
            lo, hi = Q.BOUNDS[c]
            cols[c] = {"type": "integer", "lower": lo, "upper": hi}
        else:
            cols[c] = {"type": "integer", "values": Q.DOMAINS[c]}
    return {"pums": {"columns": cols}}


def scale_tables(source: str) -> dict[str, Any]:
    """The synthetic table three times: row-level (``people``) and person-level, privacy
    unit ``pid``, at most one row per person (``people_unit``) or three
    (``people_unit3``) — bounds enforced in the executed SQL (the column has no key, so
    the database does not enforce them)."""
    base = pums_tables()["pums"]["columns"]
    return {
        "people": {"source": source, "columns": base},
        "people_unit": {
            "source": source,
            "privacy_unit": "pid",
            "max_rows_per_unit": 1,
            "columns": base,
        },
        "people_unit3": {
            "source": source,
            "privacy_unit": "pid",
            "max_rows_per_unit": 3,
            "columns": base,
        },
    }


def write_config(
    path: Path,
    *,
    database_url: str,
    ledger_url: str,
    tables: dict[str, Any],
    audit_mode: str = "off",
    statement_timeout_ms: int = 600_000,
    timing: str = "off",
) -> Path:
    """A dpgate config for a benchmark. ``timing`` is ``off`` by default: the figures
    are pipeline time; the deliberate padding of ``timing: deadline`` (every answer
    leaves at its release moment, gateway/pipeline/timing.py) is measured on its own."""
    cfg = {
        "database": {"url": database_url, "statement_timeout_ms": statement_timeout_ms},
        "ledger": {"url": ledger_url},
        "privacy": {
            "mechanism": "laplace",
            "epsilon": 1.0,
            "max_epsilon_per_query": 1.0,
            "delta": 1.0e-7,
            "composition": "zcdp",
        },
        "audit": {"mode": audit_mode},
        "execution": {"timing": timing},
        "tables": tables,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def create_analyst(ledger_url: str, name: str) -> str:
    """A new analyst with a budget no benchmark exhausts; returns the API key."""
    from budget import Ledger

    ledger = Ledger.from_url(ledger_url)
    ledger.migrate()
    return ledger.create_analyst(name, BIG_BUDGET["epsilon"], BIG_BUDGET["delta"])


class InProcess:
    """dpgate's whole pipeline in this process (no HTTP)."""

    _names = itertools.count(1)

    def __init__(self, config_path: Path) -> None:
        from gateway.core.config_load import load_config
        from gateway.pipeline.gateway import Gateway

        self.config = load_config(config_path)
        factory = getattr(Gateway, "from_config", None)
        self.gateway = factory(self.config) if callable(factory) else Gateway(self.config)
        self.ledger = self.gateway.ledger

    def new_analyst(self) -> str:
        """A fresh analyst (so a fresh per-analyst cache); returns the analyst's name."""
        name = f"bench{next(self._names)}"
        self.ledger.create_analyst(name, BIG_BUDGET["epsilon"], BIG_BUDGET["delta"])
        return name

    def query(self, analyst: str, sql: str, epsilon: float = 1.0) -> Answer:
        from gateway.core.errors import GatewayError
        from gateway.core.plan import QueryRequest

        request = QueryRequest(
            sql=sql, epsilon=epsilon, delta=self.config.privacy.delta, mechanism="laplace"
        )
        try:
            release = self.gateway.query(analyst, request)
        except GatewayError as e:
            return Answer(False, [], error=f"{getattr(e, 'code', type(e).__name__)}: {e}")
        return Answer(True, _rows(release), cached=bool(getattr(release, "cached", False)))

    def analyze_uncached(self, sql: str) -> None:
        """Run dpgate's SQL analysis passes alone, bypassing the gateway's plan cache."""
        from gateway.sql.analyze import analyze

        analyze(sql, self.config.tables)

    def compiled_sql(self, sql: str) -> str | None:
        """The one statement dpgate would execute for ``sql`` (None if unavailable)."""
        try:
            from gateway.core.plan import QueryPlan
            from gateway.sql.analyze import analyze
            from gateway.sql.compile import compile_plan

            # The tables as the gateway reads them (nullability from the catalogue) and its
            # unique-unit shortcut: the statement the gateway itself would send.
            tables = self.gateway.config.tables
            plan = analyze(sql, tables)
            if not isinstance(plan, QueryPlan):
                return None
            unique = plan.table in getattr(self.gateway, "unique_units", set())
            compiled = compile_plan(
                plan, tables[plan.table], self.gateway.dialect, unit_unique=unique
            )
            return str(compiled.sql)
        except Exception:
            return None

    def close(self) -> None:
        for obj in (self.gateway.engine, self.ledger):
            for attr in ("close", "dispose"):
                fn = getattr(obj, attr, None)
                if callable(fn):
                    fn()
                    break


def _rows(release: Any) -> list[list[Any]]:
    rows = getattr(release, "rows", None)
    if rows is None and isinstance(release, dict):
        rows = release.get("rows")
    return [list(r) for r in rows or []]


class Http:
    """``POST /v1/query`` over one keep-alive connection (stdlib only, one per thread)."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self.host, self.port, self.key = host, port, key
        self.conn: http.client.HTTPConnection | None = None

    def query(self, sql: str, epsilon: float = 1.0) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"sql": sql, "epsilon": epsilon})
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            try:
                self.conn.request("POST", "/v1/query", body=body, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return resp.status, json.loads(data or b"{}")
            except (http.client.HTTPException, ConnectionError, OSError):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


class LeanHttp:
    """``POST /v1/query`` over one keep-alive socket, speaking just enough HTTP/1.1 for
    dpgate's answers (a status line, headers with a ``Content-Length``, a JSON body): the
    throughput part's load generator, which shares the machine's cores with the server,
    so every microsecond it spends parsing is taken from the figure it measures.
    ``http.client`` (``Http``) builds a header object per response through the
    ``email`` parser: 0.30–0.34 ms of client CPU per answer on the bench machine."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self.address = (host, port)
        self.head = (
            f"POST /v1/query HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            "Content-Length: "
        ).encode()
        self.sock: socket.socket | None = None
        self.buffer = b""

    def query(self, sql: str, epsilon: float = 1.0) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"sql": sql, "epsilon": epsilon}).encode()
        request = self.head + str(len(body)).encode() + b"\r\n\r\n" + body
        for attempt in range(2):
            try:
                if self.sock is None:
                    self.sock = socket.create_connection(self.address, timeout=120)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.buffer = b""
                self.sock.sendall(request)
                return self._response()
            except (ConnectionError, OSError, ValueError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _response(self) -> tuple[int, dict[str, Any]]:
        assert self.sock is not None
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._receive()
        head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + 4 :]
        lines = head.split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", ""))  # ValueError: not one of dpgate's
        while len(self.buffer) < length:
            self._receive()
        data, self.buffer = self.buffer[:length], self.buffer[length:]
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, json.loads(data or b"{}")

    def _receive(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
