"""More real drivers against the PostgreSQL front end: asyncpg and node-postgres.

Each speaks the protocol its own way — asyncpg: named prepared statements, binary
results, parameters typed by the server's ParameterDescription, pipelined executions;
node-postgres (under many JavaScript BI and notebook tools): the extended protocol
with text results and untyped parameters — and each must: run a parametrised GROUP BY,
see the cost NOTICE, and get PostgreSQL SQLSTATEs for refusals.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.pgwire.server import WireServer
from gateway.pipeline.gateway import Gateway

NODE_DIR = Path(__file__).with_name("node")


@pytest.fixture
def wire(make_gateway: Callable[..., Gateway]) -> Iterator[tuple[WireServer, int, dict[str, str]]]:
    gw = make_gateway(postgres_wire={"port": 0})
    keys = {
        "alice": gw.ledger.create_analyst("alice", 10.0, 1e-6),
        "bob": gw.ledger.create_analyst("bob", 0.15, 1e-6),  # room for one query at ε=0.1
    }
    server = WireServer(gw.config, gw)
    _, port = server.bind("127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, port, keys
    server.shutdown()


def charges(server: WireServer, analyst: str) -> int:
    return len([e for e in server.gateway.ledger.history(analyst) if e.outcome != "refused"])


def test_asyncpg_binary_prepared_pipelined_notices_and_sqlstates(
    wire: tuple[WireServer, int, dict[str, str]],
) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    server, port, keys = wire

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {"notices": []}
        conn = await asyncpg.connect(
            host="127.0.0.1", port=port, user="alice", password=keys["alice"],
            database="dpgate", ssl=False,
        )  # fmt: skip
        conn.add_log_listener(lambda _c, message: seen["notices"].append(message))
        try:
            sql = "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= $1 GROUP BY sex"
            statement = await conn.prepare(sql)  # named, described: $1 typed int8
            seen["parameter_types"] = [t.name for t in statement.get_parameters()]
            seen["columns"] = [(a.name, a.type.name) for a in statement.get_attributes()]
            seen["rows"] = sorted(tuple(r) for r in await statement.fetch(30))  # binary
            seen["again"] = sorted(tuple(r) for r in await statement.fetch(30))  # cached
            # pipelined: every Bind/Execute sent before one Sync
            batches = await conn.fetchmany(
                "SELECT COUNT(*) AS n FROM patients WHERE age >= $1 AND sex = $2",
                [(40, "F"), (40, "M"), (50, "F")],
            )
            seen["pipelined"] = [int(r["n"]) for r in batches]
            seen["mean"] = await conn.fetchval(
                "SELECT AVG(glucose) AS g FROM patients WHERE sex = $1", "F"
            )
            states = {}
            for bad in (
                "SELECT age FROM patients",
                "SELECT COUNT(*) FROM nowhere",
                "SELEC COUNT(*) FROM patients",
            ):
                try:
                    await conn.fetch(bad)
                except asyncpg.PostgresError as e:
                    states[bad] = e.sqlstate
            seen["states"] = states
        finally:
            await conn.close()
        bob = await asyncpg.connect(
            host="127.0.0.1", port=port, user="bob", password=keys["bob"], database="dpgate",
            ssl=False,
        )  # fmt: skip
        try:
            await bob.fetch("SELECT COUNT(*) AS n FROM patients")
            try:
                await bob.fetch("SELECT COUNT(*) AS n FROM patients WHERE age > $1", 60)
            except asyncpg.PostgresError as e:
                seen["budget"] = (e.sqlstate, json.loads(e.detail or "{}").get("code"))
        finally:
            await bob.close()
        try:
            await asyncpg.connect(
                host="127.0.0.1", port=port, user="alice", password="wrong", database="dpgate",
                ssl=False,
            )  # fmt: skip
        except asyncpg.PostgresError as e:
            seen["login"] = e.sqlstate
        return seen

    seen = asyncio.run(asyncio.wait_for(session(), 120))
    assert seen["parameter_types"] == ["int8"]
    assert seen["columns"] == [("sex", "text"), ("n", "int8")]
    assert [r[0] for r in seen["rows"]] == ["F", "M"] and all(r[1] > 0 for r in seen["rows"])
    assert seen["again"] == seen["rows"]  # the cache: the same released answer
    assert len(seen["pipelined"]) == 3 and all(n > 0 for n in seen["pipelined"])
    assert isinstance(seen["mean"], float)
    assert any("charged" in n.message for n in seen["notices"])
    assert any("free" in n.message for n in seen["notices"])  # the cached answer
    assert seen["states"] == {
        "SELECT age FROM patients": "0A000",
        "SELECT COUNT(*) FROM nowhere": "42P01",
        "SELEC COUNT(*) FROM patients": "42601",
    }
    assert seen["budget"] == ("53400", "budget_exhausted")
    assert seen["login"] == "28P01"
    assert charges(server, "alice") == 1 + 3 + 1  # GROUP BY once, 3 pipelined, the mean
    assert charges(server, "bob") == 1


NODE_PROBE = r"""
const { Client } = require("pg");
(async () => {
  const [port, key, bobKey] = process.argv.slice(2);
  const out = { notices: [], states: {} };
  const client = new Client({ host: "127.0.0.1", port: Number(port), user: "alice",
                              password: key, database: "dpgate", ssl: false });
  client.on("notice", (n) => out.notices.push(n.message));
  await client.connect();
  const r = await client.query(
    "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= $1 GROUP BY sex ORDER BY sex", [30]);
  out.fields = r.fields.map((f) => [f.name, f.dataTypeID]);
  out.rows = r.rows;
  const named = { name: "by-disease", text:
    "SELECT disease, COUNT(*) AS n FROM patients WHERE sex = $1 GROUP BY disease", values: ["F"] };
  out.prepared = (await client.query(named)).rowCount;
  out.preparedAgain = (await client.query(named)).rowCount;
  for (const bad of ["SELECT age FROM patients", "SELECT COUNT(*) FROM nowhere"]) {
    try { await client.query(bad); } catch (e) { out.states[bad] = e.code; }
  }
  await client.end();
  const bob = new Client({ host: "127.0.0.1", port: Number(port), user: "bob",
                           password: bobKey, database: "dpgate", ssl: false });
  await bob.connect();
  await bob.query("SELECT COUNT(*) AS n FROM patients");
  try { await bob.query("SELECT COUNT(*) AS n FROM patients WHERE age > $1", [60]); }
  catch (e) { out.budget = [e.code, JSON.parse(e.detail).code]; }
  await bob.end();
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def _node_pg() -> Path:
    """tests/node with node-postgres installed from its lock file (npm ci), or a skip."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("needs Node.js and npm (Debian: apt-get install nodejs npm)")
    if not (NODE_DIR / "node_modules" / "pg").is_dir():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"npm ci could not install node-postgres: {done.stderr[-300:]}")
    return Path(node)


def test_node_postgres_groups_prepares_reads_the_notice_and_gets_sqlstates(
    wire: tuple[WireServer, int, dict[str, str]],
) -> None:
    node = _node_pg()
    server, port, keys = wire
    probe = NODE_DIR / "probe.js"
    probe.write_text(NODE_PROBE)
    try:
        out = subprocess.run(
            [str(node), str(probe), str(port), keys["alice"], keys["bob"]],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=120,
            env={**os.environ, "NODE_PATH": str(NODE_DIR / "node_modules")},
        )  # fmt: skip
    finally:
        probe.unlink(missing_ok=True)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["fields"] == [["sex", 25], ["n", 20]]
    assert [r["sex"] for r in seen["rows"]] == ["F", "M"]
    assert all(int(r["n"]) > 0 for r in seen["rows"])  # int8 arrives as text in node-pg
    assert seen["prepared"] == seen["preparedAgain"] > 1  # one row per disease, twice
    assert any("charged" in n for n in seen["notices"])
    assert seen["states"] == {
        "SELECT age FROM patients": "0A000",
        "SELECT COUNT(*) FROM nowhere": "42P01",
    }
    assert seen["budget"] == ["53400", "budget_exhausted"]
    assert charges(server, "alice") == 2 and charges(server, "bob") == 1
