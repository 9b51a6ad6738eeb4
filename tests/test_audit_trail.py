"""Issue 39: every admin action, from HTTP and from the CLI, is one audit-log row naming
who, what and the parameters (never a key); the audit log is a hash chain that
``dpgate audit-log verify`` checks — an altered, removed or moved row is found, and
concurrent appenders (processes, on SQLite and PostgreSQL) keep one unforked chain."""

from __future__ import annotations

import itertools
import json
import multiprocessing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from budget import AdminCaller, Ledger, audit_chain, schema
from gateway.cli.admin import register_admin_commands
from gateway.http.app import create_app
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def cli() -> click.Group:
    @click.group()
    def dpgate() -> None:
        pass

    register_admin_commands(dpgate)
    return dpgate


def invoke(cli: click.Group, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return result.output


def cli_config(tmp_path: Path, ledger_url: str) -> str:
    path = tmp_path / "cli.yaml"
    path.write_text(
        f"""
database: {{url: "sqlite:///data.db"}}
ledger: {{url: "{ledger_url}"}}
privacy: {{composition: zcdp}}
tables:
  t:
    columns:
      x: {{type: integer, lower: 0, upper: 10}}
"""
    )
    return str(path)


def test_every_admin_action_is_one_row_from_http_and_cli(
    make_gateway: Callable[..., Gateway], cli: click.Group, tmp_path: Path
) -> None:
    gateway = make_gateway(analysts=[])
    client = create_app(gateway.config, gateway=gateway).test_client()
    config = cli_config(tmp_path, gateway.config.ledger.url)
    keys = []

    def http(method: str, path: str, body: Any = None) -> None:
        r = client.open(path, method=method, json=body, headers=ADMIN)
        assert r.status_code in (200, 201), r.get_json()
        if "api_key" in (r.get_json() or {}):
            keys.append(r.get_json()["api_key"])

    http("POST", "/v1/admin/analysts", {"name": "ann", "epsilon": 2, "delta": 1e-6})
    http("PATCH", "/v1/admin/analysts/ann", {"epsilon": 3, "period": "week"})
    http("PATCH", "/v1/admin/analysts/ann", {"disabled": True})
    http("PATCH", "/v1/admin/analysts/ann", {"disabled": False})
    http("POST", "/v1/admin/analysts/ann/keys")
    http("PATCH", "/v1/admin/budget", {"epsilon": 40, "delta": 1e-5})
    http("GET", "/v1/admin/analysts")
    gateway.ledger.flush()  # a read's row is written after its response

    keys.append(
        invoke(cli, "analyst", "add", "bob", "--epsilon", "1", "--delta", "0", "--config", config)
        .strip()
        .splitlines()[-1]
    )
    invoke(cli, "budget", "set", "bob", "--epsilon", "1.5", "--actor", "carol", "--config", config)
    invoke(cli, "budget", "set", "--global", "--period", "month", "--config", config)
    invoke(cli, "analyst", "disable", "bob", "--config", config)
    invoke(cli, "analyst", "enable", "bob", "--config", config)
    keys.append(invoke(cli, "key", "rotate", "bob", "--config", config).strip().splitlines()[-1])

    r = client.get("/v1/admin/audit-log?limit=1000", headers=ADMIN)
    entries = r.get_json()["entries"][::-1]  # oldest first
    # Every row but this read's own (written after its response).
    got = [(e["actor"], e["endpoint"], e["action"], e["params"], e["status"]) for e in entries]
    assert got == [
        (
            "admin",
            "POST /v1/admin/analysts",
            "analyst.create",
            {"name": "ann", "epsilon": 2.0, "delta": 1e-6, "period": "none"},
            201,
        ),
        (
            "admin",
            "PATCH /v1/admin/analysts/ann",
            "budget.set",
            {"name": "ann", "epsilon": 3.0, "period": "week"},
            200,
        ),
        (
            "admin",
            "PATCH /v1/admin/analysts/ann",
            "analyst.disable",
            {"name": "ann", "disabled": True},
            200,
        ),
        (
            "admin",
            "PATCH /v1/admin/analysts/ann",
            "analyst.enable",
            {"name": "ann", "disabled": False},
            200,
        ),
        ("admin", "POST /v1/admin/analysts/ann/keys", "key.rotate", {"name": "ann"}, 201),
        (
            "admin",
            "PATCH /v1/admin/budget",
            "budget.set_global",
            {"epsilon": 40.0, "delta": 1e-5},
            200,
        ),
        ("admin", "GET /v1/admin/analysts", "analyst.list", None, 200),
        (
            entries[7]["actor"],
            "cli analyst add",
            "analyst.create",
            {"name": "bob", "epsilon": 1.0, "delta": 0.0, "period": "none"},
            200,
        ),
        ("cli:carol", "cli budget set", "budget.set", {"name": "bob", "epsilon": 1.5}, 200),
        (
            entries[7]["actor"],
            "cli budget set --global",
            "budget.set_global",
            {"period": "month"},
            200,
        ),
        (
            entries[7]["actor"],
            "cli analyst disable",
            "analyst.disable",
            {"name": "bob", "disabled": True},
            200,
        ),
        (
            entries[7]["actor"],
            "cli analyst enable",
            "analyst.enable",
            {"name": "bob", "disabled": False},
            200,
        ),
        (entries[7]["actor"], "cli key rotate", "key.rotate", {"name": "bob"}, 200),
    ]
    assert entries[7]["actor"].startswith("cli:") and entries[7]["actor"] != "cli:"
    assert all(e["outcome"] == "admin" for e in entries)
    # never a key, in any form the log holds
    dump = json.dumps(entries) + invoke(cli, "audit-log", "--limit", "1000", "--config", config)
    assert len(keys) == 4 and not any(k in dump for k in keys)
    # the CLI shows the same rows, and filters by actor
    mine = json.loads(
        invoke(cli, "audit-log", "--actor", "cli:carol", "--json", "--config", config)
    )
    assert [(e["action"], e["params"]) for e in mine] == [
        ("budget.set", {"name": "bob", "epsilon": 1.5})
    ]
    assert "ok: " in invoke(cli, "audit-log", "verify", "--config", config)


def test_a_failed_change_writes_one_refused_row_and_no_change_row(
    make_gateway: Callable[..., Gateway],
) -> None:
    gateway = make_gateway(analysts=[])
    client = create_app(gateway.config, gateway=gateway).test_client()
    body = {"name": "dan", "epsilon": 1, "delta": 0}
    assert client.post("/v1/admin/analysts", json=body, headers=ADMIN).status_code == 201
    assert client.post("/v1/admin/analysts", json=body, headers=ADMIN).status_code == 409
    r = client.patch("/v1/admin/analysts/nobody", json={"epsilon": 1}, headers=ADMIN)
    assert r.status_code == 404
    gateway.ledger.flush()
    rows = [e.to_json() for e in gateway.ledger.audit_log()][::-1]
    assert [(e["action"], e["status"], e["outcome"]) for e in rows] == [
        ("analyst.create", 201, "admin"),
        ("analyst.create", 409, "refused"),
        ("analyst.update", 404, "refused"),
    ]
    assert gateway.ledger.verify_audit_log().ok


# -- the hash chain ----------------------------------------------------------------------


def _fill(ledger: Ledger, n: int = 6) -> None:
    caller = AdminCaller(actor="root", request_id="r0", endpoint="test")
    ledger.create_analyst("eve", 1.0, 0.0, caller=caller)
    for i in range(n):
        ledger.log_request(
            request_id=f"q{i}",
            analyst="eve",
            endpoint="POST /v1/query",
            sql=f"SELECT COUNT(*) FROM t WHERE x > {i} -- é",
            outcome="answered",
            error_code=None,
            status=200,
        )
    ledger.update_analyst("eve", epsilon=2.0, caller=caller)
    ledger.flush()


@pytest.fixture
def chained(ledger_url: str) -> Iterator[Ledger]:
    ledger = Ledger.from_url(ledger_url)
    ledger.migrate()
    _fill(ledger)
    try:
        yield ledger
    finally:
        ledger.close()


def _sql(ledger: Ledger, statement: Any) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(statement)


T = schema.audit_log


def test_an_untouched_chain_verifies(chained: Ledger) -> None:
    verdict = chained.verify_audit_log()
    assert verdict.ok and verdict.rows == 8 and verdict.head_seq == 8
    assert chained.verify_audit_log(anchor=(8, verdict.head_hash)).ok
    rows = list(chained.export_audit_log())
    assert [r["seq"] for r in rows] == list(range(1, 9))
    assert rows[0]["prev_hash"] == audit_chain.GENESIS
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(rows))
    # an export read back as JSON verifies against the ledger
    kept = [json.loads(json.dumps(r)) for r in rows]
    assert chained.verify_audit_log(kept=kept).ok


@pytest.mark.parametrize(
    "change",
    [
        {"sql": "SELECT 1"},
        {"outcome": "refused"},
        {"status": 500},
        {"actor": "mallory"},
        {"params": '{"epsilon":99.0,"name":"eve"}'},
    ],
)
def test_an_altered_row_is_found(chained: Ledger, change: dict[str, Any]) -> None:
    seq = 8 if "params" in change else 4
    _sql(chained, sa.update(T).where(T.c.seq == seq).values(**change))
    brk = chained.verify_audit_log().first_break
    assert brk is not None and (brk.seq, brk.kind) == (seq, "altered")


def test_an_altered_time_is_found(chained: Ledger) -> None:
    _sql(
        chained,
        sa.update(T).where(T.c.seq == 3).values(created_at=schema.utcnow().replace(year=2001)),
    )
    brk = chained.verify_audit_log().first_break
    assert brk is not None and (brk.seq, brk.kind) == (3, "altered")


def test_a_deleted_row_is_found(chained: Ledger) -> None:
    _sql(chained, sa.delete(T).where(T.c.seq == 5))
    brk = chained.verify_audit_log().first_break
    assert brk is not None and (brk.seq, brk.kind) == (5, "removed")


def test_a_deleted_row_with_the_rest_renumbered_is_found(chained: Ledger) -> None:
    _sql(chained, sa.delete(T).where(T.c.seq == 5))
    for seq in range(6, 9):
        _sql(chained, sa.update(T).where(T.c.seq == seq).values(seq=seq - 1))
    brk = chained.verify_audit_log().first_break
    assert brk is not None and (brk.seq, brk.kind) == (5, "removed")


def test_an_edit_rehashed_is_found_at_the_next_row(chained: Ledger) -> None:
    """Whoever recomputes the altered row's hash breaks the link to the next row."""
    with chained.engine.begin() as conn:
        row = dict(conn.execute(sa.select(T).where(T.c.seq == 4)).mappings().one())
        row["sql"] = "SELECT 1"
        conn.execute(
            sa.update(T)
            .where(T.c.seq == 4)
            .values(sql="SELECT 1", hash=audit_chain.row_hash(row, row["prev_hash"]))
        )
    brk = chained.verify_audit_log().first_break
    assert brk is not None and (brk.seq, brk.kind) == (5, "removed")


def test_reordered_rows_are_found(chained: Ledger) -> None:
    # swap rows 3 and 4 (their positions), keeping every stored hash
    _sql(chained, sa.update(T).where(T.c.seq == 3).values(seq=-3))
    _sql(chained, sa.update(T).where(T.c.seq == 4).values(seq=3))
    _sql(chained, sa.update(T).where(T.c.seq == -3).values(seq=4))
    brk = chained.verify_audit_log().first_break
    assert brk is not None and brk.seq == 3 and brk.kind in ("altered", "removed")


def test_swapped_contents_are_found(chained: Ledger) -> None:
    with chained.engine.begin() as conn:
        a, b = (
            dict(conn.execute(sa.select(T).where(T.c.seq == s)).mappings().one()) for s in (2, 3)
        )
        for src, dst in ((a, b), (b, a)):
            conn.execute(
                sa.update(T).where(T.c.id == dst["id"]).values(request_id=src["request_id"])
            )
    brk = chained.verify_audit_log().first_break
    assert brk is not None and (brk.seq, brk.kind) == (2, "altered")


def test_a_truncated_tail_is_found_against_a_kept_head_or_export(chained: Ledger) -> None:
    verdict = chained.verify_audit_log()
    kept = list(chained.export_audit_log())
    _sql(chained, sa.delete(T).where(T.c.seq >= 7))
    assert chained.verify_audit_log().ok  # the chain alone cannot tell
    brk = chained.verify_audit_log(anchor=(verdict.head_seq, verdict.head_hash)).first_break
    assert brk is not None and (brk.seq, brk.kind) == (8, "mismatch")
    brk = chained.verify_audit_log(kept=kept).first_break
    assert brk is not None and (brk.seq, brk.kind) == (7, "mismatch")


def test_a_row_inserted_outside_the_chain_is_found(chained: Ledger) -> None:
    _sql(
        chained,
        sa.insert(T).values(
            request_id="x", endpoint="e", outcome="ok", status=200, created_at=schema.utcnow()
        ),
    )
    brk = chained.verify_audit_log().first_break
    assert brk is not None and brk.kind == "unchained"


def test_the_migration_chains_the_rows_already_logged(tmp_path: Path) -> None:
    ledger = Ledger.from_url(f"sqlite:///{tmp_path}/old.db")
    ledger.migrate()
    with ledger.engine.begin() as conn:  # rows as a dpgate before schema v8 wrote them
        for i in range(3):
            conn.execute(
                sa.insert(T).values(
                    request_id=f"old{i}",
                    analyst="zoe",
                    endpoint="POST /v1/query",
                    outcome="answered",
                    status=200,
                    created_at=schema.utcnow(),
                )
            )
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 8))
    assert not ledger.verify_audit_log().ok
    ledger.migrate()
    verdict = ledger.verify_audit_log()
    assert verdict.ok and verdict.rows == 3
    assert [e.actor for e in ledger.audit_log()] == ["zoe"] * 3
    ledger.close()


def test_verify_and_export_commands(cli: click.Group, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.from_url(url)
    ledger.migrate()
    _fill(ledger)
    config = cli_config(tmp_path, url)
    out = invoke(cli, "audit-log", "verify", "--config", config)
    assert out.startswith("ok: 8 rows; head 8:")
    head = out.split("head ")[1].strip()
    export = tmp_path / "audit.jsonl"
    invoke(cli, "audit-log", "export", "--output", str(export), "--config", config)
    lines = export.read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, 9))
    tail = invoke(cli, "audit-log", "export", "--after", "6", "--config", config)
    assert [json.loads(line)["seq"] for line in tail.splitlines()] == [7, 8]
    invoke(
        cli, "audit-log", "verify", "--anchor", head, "--against", str(export), "--config", config
    )
    _sql(ledger, sa.update(T).where(T.c.seq == 2).values(sql="SELECT 0"))
    out = invoke(cli, "audit-log", "verify", "--config", config, code=1)
    assert "BROKEN at row 2 (altered)" in out
    report = json.loads(invoke(cli, "audit-log", "verify", "--json", "--config", config, code=1))
    assert report["first_break"]["seq"] == 2 and report["ok"] is False
    invoke(cli, "audit-log", "verify", "--anchor", "x", "--config", config, code=2)
    ledger.close()


# -- concurrent appenders ----------------------------------------------------------------

PROCESSES = 3
ROWS_EACH = 40


def _append_many(url: str, who: int, start: Any) -> None:
    ledger = Ledger.from_url(url)
    ledger.ping()
    start.wait(60)  # every process appends at once
    caller = AdminCaller(actor=f"p{who}", request_id=f"p{who}", endpoint="test")
    for i in range(ROWS_EACH):
        ledger.log_request(
            request_id=f"p{who}-{i}",
            analyst=None,
            endpoint="GET /v1/schema",
            sql=None,
            outcome="ok",
            error_code=None,
            status=200,
        )
        if i % 10 == 0:  # admin changes append in their own transactions meanwhile
            ledger.update_analyst("eve", epsilon=1.0 + i, caller=caller)
    ledger.close()


def test_concurrent_appenders_keep_one_chain(ledger_url: str) -> None:
    ledger = Ledger.from_url(ledger_url)
    ledger.migrate()
    ledger.create_analyst("eve", 1.0, 0.0)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    procs = [
        ctx.Process(target=_append_many, args=(ledger_url, w, start)) for w in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    verdict = ledger.verify_audit_log()
    assert verdict.ok, verdict.first_break
    assert verdict.rows == PROCESSES * (ROWS_EACH + ROWS_EACH // 10)
    ledger.close()
