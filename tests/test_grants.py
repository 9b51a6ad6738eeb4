"""Issue 39: table grants. Analysts belong to groups; a table granted to groups is read
only by their members; a table the caller may not read does not exist for them — on
HTTP, the console's API calls, the dry run and the wire, its refusal is exactly an
undeclared table's, free — and grant or membership changes apply to the next request,
without a restart, each one an audit-logged admin action."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient

from gateway.cli.admin import register_admin_commands
from gateway.core.config import ConfigError
from gateway.core.config_load import parse_config
from gateway.core.errors import UnknownTable
from gateway.core.plan import QueryRequest
from gateway.http.app import create_app
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY, demo_config_dict
from tests.test_audit_trail import cli_config

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
COUNT = "SELECT COUNT(*) AS n FROM patients"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _tables_with_grants(**grants: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def edit(tables: dict[str, Any]) -> dict[str, Any]:
        for name, groups in grants.items():
            tables[name] = {**tables[name], "grants": groups}
        return tables

    return edit


def _plain_references(tables: dict[str, Any]) -> dict[str, Any]:
    """The demo's tables with plain references: a query reads only the tables it names
    (the demo declares them ``every_row_matches``, which reads the lookup in every query)."""
    tables["visits"]["references"] = {"patient_id": "patients.patient_id"}
    tables["patients"]["references"] = {"zip": "zip_regions.zip"}
    return tables


@pytest.fixture
def granted(make_gateway: Callable[..., Gateway], tmp_path: Path) -> Gateway:
    """The demo with ``patients`` granted to the group ``oncology`` in the config, its
    references plain (with ``every_row_matches``, as the demo declares them, every
    ``visits`` query reads ``patients``: ``test_a_table_read_through_a_lookup_not_granted``)."""
    raw = demo_config_dict(tmp_path / "unused.db", tmp_path / "unused-ledger.db")
    tables = _plain_references(_tables_with_grants(patients=["oncology"])(raw["tables"]))
    return make_gateway(tables=tables, analysts=[])


def test_a_table_read_through_a_lookup_not_granted_is_refused_free(
    make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """``visits`` declared ``every_row_matches`` on ``patients`` is read through it in
    every query; a caller who may read ``visits`` but not ``patients`` is refused (free,
    structured: the table its rows are defined through), not answered without it."""
    raw = demo_config_dict(tmp_path / "unused.db", tmp_path / "unused-ledger.db")
    gw = make_gateway(tables=_tables_with_grants(patients=["oncology"])(raw["tables"]))
    gw.ledger.create_analyst("bob", 10.0, 1e-6)
    with pytest.raises(UnknownTable) as info:
        gw.query("bob", QueryRequest("SELECT COUNT(*) FROM visits", 1.0, 0.0, "laplace"))
    assert "every_row_matches" in info.value.message and "patients" in info.value.message
    assert gw.ledger.budget_status("bob").rho_spent == 0.0


@pytest.fixture
def client(granted: Gateway) -> FlaskClient:
    return create_app(granted.config, gateway=granted).test_client()


@pytest.fixture
def keys(granted: Gateway) -> dict[str, str]:
    """alice is in oncology, bob in no group."""
    keys = {n: granted.ledger.create_analyst(n, 10.0, 1e-6) for n in ("alice", "bob")}
    granted.ledger.add_member("oncology", "alice")
    return keys


def _query(client: FlaskClient, key: str, sql: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    r = client.post("/v1/query", json={"sql": sql, "epsilon": 0.5, **extra}, headers=bearer(key))
    return r.status_code, r.get_json()


def _spent(client: FlaskClient, key: str) -> float:
    body = client.get("/v1/budget", headers=bearer(key)).get_json()
    return float(body["budget"]["epsilon_spent"])


def _tables(client: FlaskClient, key: str) -> list[str]:
    body = client.get("/v1/schema", headers=bearer(key)).get_json()
    return [t["name"] for t in body["tables"]]


def _as_if_undeclared(body: dict[str, Any], name: str, stand_in: str) -> dict[str, Any]:
    """The error with the hidden table's name put where an undeclared one's stands."""
    error = json.loads(json.dumps(body["error"]).replace(stand_in, name))
    error["detail"].pop("request_id", None)
    return dict(error)


def test_a_table_not_granted_is_as_if_undeclared(client: FlaskClient, keys: dict[str, str]) -> None:
    alice, bob = keys["alice"], keys["bob"]
    assert "patients" in _tables(client, alice)
    assert "patients" not in _tables(client, bob)
    assert set(_tables(client, bob)) == {"visits", "zip_regions"}
    status, body = _query(client, alice, COUNT)
    assert status == 200, body
    # bob: the refusal of a table that is not declared, for every kind of query on it
    for sql in (
        COUNT,
        "SELECT COUNT(nosuchcolumn) AS n FROM patients",
        "SELECT sex, AVG(age) AS a FROM patients GROUP BY sex",
        "SELECT COUNT(*) AS n FROM patients p JOIN zip_regions z ON p.zip = z.zip",
    ):
        hidden = _query(client, bob, sql)
        undeclared = _query(client, bob, sql.replace("patients", "patientz"))
        assert hidden[0] == undeclared[0] == 400, (sql, hidden)
        assert hidden[1]["error"]["code"] == "unknown_table", hidden
        hidden[1]["error"]["detail"].pop("request_id", None)
        assert hidden[1]["error"] == _as_if_undeclared(undeclared[1], "patients", "patientz")
        # a dry run too
        dry = _query(client, bob, sql, dry_run=True)
        assert dry[1]["error"]["code"] == "unknown_table"
    assert _spent(client, bob) == 0.0  # free
    # what bob may read still works
    status, body = _query(client, bob, "SELECT COUNT(*) AS n FROM visits")
    assert status == 200, body


def test_a_granted_table_is_unknown_until_the_caller_is_known(
    client: FlaskClient, keys: dict[str, str], granted: Gateway
) -> None:
    """A request is planned before its caller is identified against the tables every
    analyst may read: for it, a table closed to some analyst and an undeclared one are
    alike (the same refusal, the same work), so what a refused request costs cannot tell
    bob that ``patients`` exists. alice's answers on it are still cached and reused."""
    from gateway.core.errors import UnknownTable

    status, first = _query(client, keys["alice"], COUNT)
    assert status == 200 and not first["cached"]
    status, again = _query(client, keys["alice"], COUNT)
    assert status == 200 and again["cached"] and again["rows"] == first["rows"]
    assert _spent(client, keys["alice"]) == 0.5  # the second one was free
    before_identification = granted.planner_for(granted._open_tables)
    assert granted._open_tables == {"visits", "zip_regions"}
    for sql in (COUNT, COUNT.replace("patients", "patientz")):
        with pytest.raises(UnknownTable):
            before_identification.analyze(sql)


def test_grant_changes_apply_to_the_next_request(
    client: FlaskClient, keys: dict[str, str], granted: Gateway
) -> None:
    bob = keys["bob"]
    assert _query(client, bob, COUNT)[0] == 400
    r = client.post("/v1/admin/groups/oncology/members", json={"analyst": "bob"}, headers=ADMIN)
    assert r.status_code == 201, r.get_json()
    assert _query(client, bob, COUNT)[0] == 200
    assert "patients" in _tables(client, bob)
    r = client.delete("/v1/admin/groups/oncology/members/bob", headers=ADMIN)
    assert r.status_code == 200, r.get_json()
    assert _query(client, bob, COUNT)[1]["error"]["code"] == "unknown_table"
    # a ledger grant closes an open table to everyone else
    visits = "SELECT COUNT(*) AS n FROM visits"
    assert _query(client, keys["alice"], visits)[0] == 200
    r = client.post("/v1/admin/grants", json={"table": "visits", "group": "cardio"}, headers=ADMIN)
    assert r.status_code == 201, r.get_json()
    assert _query(client, keys["alice"], visits)[1]["error"]["code"] == "unknown_table"
    assert _query(client, bob, visits)[1]["error"]["code"] == "unknown_table"
    assert _tables(client, bob) == ["zip_regions"]
    # a second gateway on the same ledger sees it at once (no cache, no restart)
    other = Gateway(granted.config)
    other_client = create_app(other.config, gateway=other).test_client()
    assert _query(other_client, bob, visits)[1]["error"]["code"] == "unknown_table"
    r = client.post("/v1/admin/groups/cardio/members", json={"analyst": "bob"}, headers=ADMIN)
    assert r.status_code == 201
    assert _query(other_client, bob, visits)[0] == 200
    listing = client.get("/v1/admin/grants", headers=ADMIN).get_json()
    by_table = {t["table"]: t for t in listing["tables"]}
    assert by_table["patients"]["config_groups"] == ["oncology"]
    assert by_table["visits"]["ledger_groups"] == ["cardio"]
    assert by_table["zip_regions"]["readable_by"] == "everyone"
    groups = client.get("/v1/admin/groups", headers=ADMIN).get_json()["groups"]
    assert {"name": "oncology", "members": ["alice"]} in groups


def test_revocations_that_would_open_a_table_are_refused(
    client: FlaskClient, keys: dict[str, str]
) -> None:
    # a config grant is the config's to change
    r = client.delete("/v1/admin/grants/patients/oncology", headers=ADMIN)
    assert r.status_code == 409, r.get_json()
    client.post("/v1/admin/grants", json={"table": "visits", "group": "cardio"}, headers=ADMIN)
    r = client.delete("/v1/admin/grants/visits/cardio", headers=ADMIN)
    assert r.status_code == 409  # its last grant: visits would be open to everyone
    assert "access.default" in r.get_json()["error"]["message"]
    client.post("/v1/admin/grants", json={"table": "visits", "group": "icu"}, headers=ADMIN)
    assert client.delete("/v1/admin/grants/visits/cardio", headers=ADMIN).status_code == 200
    assert client.delete("/v1/admin/grants/visits/cardio", headers=ADMIN).status_code == 404
    r = client.post("/v1/admin/grants", json={"table": "nosuch", "group": "icu"}, headers=ADMIN)
    assert r.status_code == 404
    r = client.post("/v1/admin/grants", json={"table": "visits", "group": "icu"}, headers=ADMIN)
    assert r.status_code == 409  # granted already
    r = client.post("/v1/admin/groups/icu/members", json={"analyst": "nobody"}, headers=ADMIN)
    assert r.status_code == 404


def test_access_default_granted_closes_tables_without_grants(
    make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    raw = demo_config_dict(tmp_path / "unused.db", tmp_path / "unused-ledger.db")
    tables = _plain_references(raw["tables"])
    gw = make_gateway(access={"default": "granted"}, analysts=[], tables=tables)
    client = create_app(gw.config, gateway=gw).test_client()
    key = gw.ledger.create_analyst("ann", 10.0, 1e-6)
    assert _tables(client, key) == []
    assert _query(client, key, COUNT)[1]["error"]["code"] == "unknown_table"
    client.post("/v1/admin/grants", json={"table": "patients", "group": "g"}, headers=ADMIN)
    client.post("/v1/admin/groups/g/members", json={"analyst": "ann"}, headers=ADMIN)
    assert _tables(client, key) == ["patients"]
    assert _query(client, key, COUNT)[0] == 200
    # the last grant may go: the table closes, it does not open
    assert client.delete("/v1/admin/grants/patients/g", headers=ADMIN).status_code == 200
    assert _tables(client, key) == []


def test_an_empty_grants_list_closes_a_table(
    make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    raw = demo_config_dict(tmp_path / "unused.db", tmp_path / "unused-ledger.db")
    gw = make_gateway(tables=_tables_with_grants(visits=[])(raw["tables"]), analysts=[])
    client = create_app(gw.config, gateway=gw).test_client()
    key = gw.ledger.create_analyst("ann", 10.0, 1e-6)
    visits = "SELECT COUNT(*) AS n FROM visits"
    assert "visits" not in _tables(client, key)
    assert _query(client, key, visits)[1]["error"]["code"] == "unknown_table"
    client.post("/v1/admin/grants", json={"table": "visits", "group": "g"}, headers=ADMIN)
    client.post("/v1/admin/groups/g/members", json={"analyst": "ann"}, headers=ADMIN)
    assert _query(client, key, visits)[0] == 200
    # its last stored grant may go: the config keeps the table closed
    assert client.delete("/v1/admin/grants/visits/g", headers=ADMIN).status_code == 200
    assert _query(client, key, visits)[1]["error"]["code"] == "unknown_table"
    listing = client.get("/v1/admin/grants", headers=ADMIN).get_json()
    assert {t["table"]: t["readable_by"] for t in listing["tables"]}["visits"] == "nobody"


def test_the_admin_sees_every_table(client: FlaskClient, keys: dict[str, str]) -> None:
    assert set(_tables(client, ADMIN_KEY)) == {"patients", "visits", "zip_regions"}


def test_grants_in_the_config_are_checked(tmp_path: Path) -> None:
    raw = demo_config_dict(tmp_path / "d.db", tmp_path / "l.db")
    raw["tables"]["patients"]["grants"] = "oncology"
    raw["access"] = {"default": "closed"}
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    text = str(e.value)
    assert "tables.patients.grants: must be a list of group names" in text
    assert "access.default" in text


def test_every_grant_change_is_one_audit_row_from_http_and_cli(
    client: FlaskClient, keys: dict[str, str], granted: Gateway, tmp_path: Path
) -> None:
    cli = click.Group("dpgate")
    register_admin_commands(cli)
    config = cli_config(tmp_path, granted.config.ledger.url)
    # the CLI's config has one table `t`; grants of the ledger name the gateway's tables
    client.post("/v1/admin/grants", json={"table": "visits", "group": "cardio"}, headers=ADMIN)
    client.post("/v1/admin/groups/cardio/members", json={"analyst": "bob"}, headers=ADMIN)
    client.delete("/v1/admin/groups/cardio/members/bob", headers=ADMIN)

    def invoke(*args: str) -> str:
        actor = ["--actor", "carol"] if args[1] != "list" else []
        result = CliRunner().invoke(cli, [*args, "--config", config, *actor])
        assert result.exit_code == 0, result.output
        return result.output

    invoke("grant", "add", "t", "cardio")
    invoke("group", "add-member", "cardio", "bob")
    invoke("group", "remove-member", "cardio", "bob")
    invoke("grant", "add", "t", "icu")
    invoke("grant", "remove", "t", "icu")
    assert "cardio" in invoke("grant", "list")
    entries = client.get("/v1/admin/audit-log?limit=100", headers=ADMIN).get_json()["entries"]
    changes = [
        (e["actor"], e["action"], e["params"], e["status"])
        for e in entries[::-1]
        if e["action"]
        and e["action"].startswith(("grant.add", "grant.remove", "group."))
        and e["outcome"] == "admin"
    ]
    assert changes == [
        ("admin", "grant.add", {"table": "visits", "group": "cardio"}, 201),
        ("admin", "group.add_member", {"group": "cardio", "analyst": "bob"}, 201),
        ("admin", "group.remove_member", {"group": "cardio", "analyst": "bob"}, 200),
        ("cli:carol", "grant.add", {"table": "t", "group": "cardio"}, 200),
        ("cli:carol", "group.add_member", {"group": "cardio", "analyst": "bob"}, 200),
        ("cli:carol", "group.remove_member", {"group": "cardio", "analyst": "bob"}, 200),
        ("cli:carol", "grant.add", {"table": "t", "group": "icu"}, 200),
        ("cli:carol", "grant.remove", {"table": "t", "group": "icu"}, 200),
    ]
    # a refused change is one refused row, and changes nothing
    r = client.delete("/v1/admin/grants/patients/oncology", headers=ADMIN)
    assert r.status_code == 409
    granted.ledger.flush()
    entries = client.get("/v1/admin/audit-log?limit=1", headers=ADMIN).get_json()["entries"]
    assert (entries[0]["action"], entries[0]["outcome"], entries[0]["status"]) == (
        "grant.remove",
        "refused",
        409,
    )
    assert granted.ledger.verify_audit_log().ok


def test_an_auditor_may_not_change_grants(client: FlaskClient, keys: dict[str, str]) -> None:
    r = client.post("/v1/admin/admins", json={"name": "ivy", "role": "auditor"}, headers=ADMIN)
    ivy = bearer(r.get_json()["api_key"])
    for method, path, body in (
        ("POST", "/v1/admin/grants", {"table": "visits", "group": "g"}),
        ("DELETE", "/v1/admin/grants/patients/oncology", None),
        ("POST", "/v1/admin/groups/oncology/members", {"analyst": "bob"}),
        ("DELETE", "/v1/admin/groups/oncology/members/alice", None),
    ):
        r = client.open(path, method=method, json=body, headers=ivy)
        assert r.status_code == 403, (method, path)
    assert client.get("/v1/admin/grants", headers=ivy).status_code == 200
    assert client.get("/v1/admin/groups", headers=ivy).status_code == 200
    assert _query(client, keys["bob"], COUNT)[0] == 400  # nothing changed


DT = (
    "SELECT n.nspname AS schema, c.relname AS name FROM pg_catalog.pg_class c "
    "LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind IN ('r','p','') AND n.nspname <> 'pg_catalog' "
    "AND n.nspname <> 'information_schema' AND pg_catalog.pg_table_is_visible(c.oid) "
    "ORDER BY 1, 2"
)


def test_the_wire_shows_and_answers_only_what_is_granted(
    make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    import threading

    import psycopg

    from gateway.pgwire.server import WireServer

    raw = demo_config_dict(tmp_path / "unused.db", tmp_path / "unused-ledger.db")
    tables = _tables_with_grants(patients=["oncology"])(raw["tables"])
    gw = make_gateway(tables=tables, analysts=[], postgres_wire={"port": 0})
    keys = {n: gw.ledger.create_analyst(n, 10.0, 1e-6) for n in ("alice", "bob")}
    gw.ledger.add_member("oncology", "alice")
    server = WireServer(gw.config, gw)
    _, port = server.bind("127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def connect(user: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host="127.0.0.1", port=port, user=user, password=keys[user], dbname="dpgate",
            sslmode="disable", connect_timeout=10, autocommit=True,
        )  # fmt: skip

    def listed(conn: psycopg.Connection[Any]) -> set[str]:
        names = {r[1] for r in conn.execute(DT).fetchall()}
        info = conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
        columns = conn.execute(
            "SELECT DISTINCT table_name FROM information_schema.columns"
        ).fetchall()
        assert {r[0] for r in info} == {r[0] for r in columns} == names
        return names

    def untyped(user: str, column: str) -> int:
        """The type the server describes for an untyped parameter compared with ``column``
        (Parse with no parameter types, Describe the statement, Sync)."""
        from tests.test_pgwire import _login, _read_message

        sock = _login(port, keys[user], user)
        try:
            sql = f"SELECT COUNT(*) FROM visits WHERE {column} > $1".encode()
            parse = b"\0" + sql + b"\0" + struct.pack("!h", 0)
            describe = b"S\0"
            sock.sendall(
                b"P" + struct.pack("!i", 4 + len(parse)) + parse
                + b"D" + struct.pack("!i", 4 + len(describe)) + describe
                + b"S" + struct.pack("!i", 4)
            )  # fmt: skip
            while True:
                kind, body = _read_message(sock)
                if kind == b"t":  # ParameterDescription: a count, then one OID each
                    (count,) = struct.unpack("!h", body[:2])
                    assert count == 1
                    return int(struct.unpack("!I", body[2:6])[0])
                assert kind != b"Z", "no ParameterDescription before ReadyForQuery"
        finally:
            sock.close()

    def refusal(conn: psycopg.Connection[Any], sql: str) -> tuple[str | None, str]:
        with pytest.raises(psycopg.Error) as e:
            conn.execute(sql)
        text = re.sub(r'"request_id": "\w+"', "", str(e.value))
        return e.value.sqlstate, text.replace("patientz", "patients")

    try:
        with connect("alice") as alice, connect("bob") as bob:
            assert listed(alice) == {"patients", "visits", "zip_regions"}
            assert listed(bob) == {"visits", "zip_regions"}
            assert alice.execute(COUNT).fetchone() is not None
            for sql in (COUNT, "SELECT COUNT(nosuch) AS n FROM patients"):
                hidden = refusal(bob, sql)
                assert hidden == refusal(bob, sql.replace("patients", "patientz"))
                assert hidden[0] == "42P01"  # undefined_table
            # describing it (the extended protocol's Parse/Describe) is refused too
            with pytest.raises(psycopg.Error):
                bob.cursor().execute(COUNT, prepare=True)
            # an untyped parameter compared with a column only the hidden table declares
            # gets the type an undeclared name gets (the ParameterDescription comes before
            # the refusal): the hidden table's column types do not show
            assert untyped("alice", "age") == 20  # int8, from patients.age
            assert untyped("bob", "age") == untyped("bob", "agez") == 25  # text: unknown
            # a grant change applies to the open session, without reconnecting
            gw.ledger.add_member("oncology", "bob")
            assert "patients" in listed(bob)
            assert bob.execute(COUNT).fetchone() is not None
            gw.ledger.remove_member("oncology", "bob")
            assert listed(bob) == {"visits", "zip_regions"}
            assert refusal(bob, COUNT)[0] == "42P01"
    finally:
        server.shutdown()
