"""The PostgreSQL front end (gateway/pgwire) with real clients: psql, psycopg 3, SQLAlchemy
and pandas, pgjdbc; bad input; a fuzz test of the protocol parser; the memory limit.

A real ``WireServer`` serves a real Gateway (demo data, SQLite ledger) on a free port in
a thread; every client connects over TCP with SCRAM-SHA-256.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.pgwire import codec
from gateway.pgwire.server import WireServer
from tests.conftest import wire_connect as connect

JDBC_JAR = Path("/usr/share/java/postgresql.jar")


def charges(server: WireServer) -> int:
    return len([e for e in server.gateway.ledger.history("alice") if e.outcome != "refused"])


def test_psql_lists_describes_and_groups(wire: tuple[WireServer, int, str]) -> None:
    server, port, key = wire
    if shutil.which("psql") is None:
        pytest.skip("psql (Debian postgresql-client) is not installed")
    env = {**os.environ, "PGPASSWORD": key, "PGCONNECT_TIMEOUT": "10"}
    dsn = f"host=127.0.0.1 port={port} user=alice dbname=dpgate sslmode=disable"
    out = subprocess.run(
        [
            "psql",
            dsn,
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            r"\dt",
            "-c",
            r"\d patients",
            "-c",
            "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex ORDER BY sex",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "patients" in out.stdout and "visits" in out.stdout
    assert 'Table "public.patients"' in out.stdout
    assert "glucose" in out.stdout and "double precision" in out.stdout
    assert " F   |" in out.stdout and " M   |" in out.stdout and "(2 rows)" in out.stdout
    assert "charged" in out.stderr  # the notice: cost and accuracy
    assert charges(server) == 1  # \dt and \d are free: answered from the config


def test_psycopg_simple_and_extended_with_parameters(wire: tuple[WireServer, int, str]) -> None:
    server, port, key = wire
    with connect(port, key) as conn:
        # simple protocol
        cur = conn.cursor()
        cur.execute(psycopg.sql.SQL("SELECT COUNT(*) AS n FROM patients"), prepare=False)
        (n,) = cur.fetchone()  # type: ignore[misc]
        assert 2000 < n < 4000
        # extended protocol, text and binary parameters
        cur.execute("SELECT sex, COUNT(*) AS n FROM patients WHERE age >= %s GROUP BY sex", (30,))
        assert [d.name for d in cur.description or []] == ["sex", "n"]
        assert {r[0] for r in cur.fetchall()} == {"F", "M"}
        cur.execute("SELECT COUNT(*) AS n FROM patients WHERE sex = %s", ("F",), binary=True)
        assert cur.fetchone()[0] > 0  # type: ignore[index]
        cur.execute("SELECT COUNT(*) AS n FROM patients WHERE sex = %s", ("F",), prepare=True)
        assert cur.fetchone()[0] > 0  # type: ignore[index]
    assert charges(server) == 4 - 1  # the repeated query was answered from the cache
    # Same pipeline as HTTP: the audit log has each query, with its SQL.
    logged = server.gateway.ledger.audit_log(analyst="alice")
    assert any(e.endpoint == "PG pgwire:query" and "age >=" in (e.sql or "") for e in logged)


def test_sqlalchemy_inspect_and_pandas(wire: tuple[WireServer, int, str]) -> None:
    sa = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    _, port, key = wire
    engine = sa.create_engine(
        f"postgresql+psycopg://alice:{key}@127.0.0.1:{port}/dpgate?sslmode=disable"
    )
    try:
        inspector = sa.inspect(engine)
        assert set(inspector.get_table_names()) == {"patients", "visits", "zip_regions"}
        columns = {c["name"]: c for c in inspector.get_columns("patients")}
        assert str(columns["age"]["type"]) == "BIGINT"
        assert columns["glucose"]["nullable"] is True
        frame = pd.read_sql("SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", engine)
        assert list(frame.columns) == ["sex", "n"] and sorted(frame["sex"]) == ["F", "M"]
    finally:
        engine.dispose()


JAVA_PROBE = """
import java.sql.*;
public class Probe {
    public static void main(String[] a) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + a[0] + "/dpgate?sslmode=disable";
        try (Connection c = DriverManager.getConnection(url, "alice", a[1])) {
            DatabaseMetaData md = c.getMetaData();
            try (ResultSet rs = md.getTables(null, "public", "%", new String[]{"TABLE"})) {
                while (rs.next()) System.out.println("TABLE " + rs.getString("TABLE_NAME"));
            }
            try (ResultSet rs = md.getColumns(null, "public", "patients", "%")) {
                while (rs.next()) System.out.println(
                    "COLUMN " + rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME"));
            }
            try (ResultSet rs = md.getSchemas()) {
                while (rs.next()) System.out.println("SCHEMA " + rs.getString(1));
            }
            try (ResultSet rs = md.getTypeInfo()) {
                int n = 0; while (rs.next()) n++; System.out.println("TYPES " + n);
            }
            String sql = "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= ? GROUP BY sex";
            try (PreparedStatement ps = c.prepareStatement(sql)) {
                ps.setInt(1, 30);
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next())
                        System.out.println("ROW " + rs.getString(1) + " " + rs.getLong(2));
                }
            }
        }
    }
}
"""


def test_pgjdbc_metadata_and_group_by(wire: tuple[WireServer, int, str], tmp_path: Path) -> None:
    if not JDBC_JAR.exists() or shutil.which("javac") is None:
        pytest.skip("needs a JDK and Debian's libpostgresql-jdbc-java (.ci/run installs it)")
    _, port, key = wire
    (tmp_path / "Probe.java").write_text(JAVA_PROBE)
    subprocess.run(["javac", "Probe.java"], cwd=tmp_path, check=True, timeout=120)
    out = subprocess.run(
        ["java", "-cp", f".:{JDBC_JAR}", "Probe", str(port), key],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert {"TABLE patients", "TABLE visits"} <= set(lines)
    assert "COLUMN age int8" in lines and "COLUMN glucose float8" in lines
    assert "SCHEMA public" in lines
    assert any(line.startswith("TYPES ") and int(line.split()[1]) > 10 for line in lines)
    assert {line.split()[1] for line in lines if line.startswith("ROW ")} == {"F", "M"}


def test_wrong_password_unsupported_and_malformed_get_errors_and_cost_nothing(
    wire: tuple[WireServer, int, str],
) -> None:
    server, port, key = wire
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(port, key[:-2] + "xx")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host="127.0.0.1", port=port, user="nobody", password=key, sslmode="disable")
    with connect(port, key) as conn:
        for sql, state in [
            ("DELETE FROM patients", "0A000"),
            ("SELECT age FROM patients", "0A000"),
            ("SELECT COUNT(*) FROM nowhere", "42P01"),
            ("SELEC COUNT(*) FROM patients", "42601"),
            ("SELECT * FROM pg_catalog.pg_statistic", "0A000"),
        ]:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert info.value.sqlstate == state, sql
        conn.execute("SELECT 1")  # the connection survives each error
    assert charges(server) == 0
    # A malformed message: an ErrorResponse (08P01), then the server closes; nothing charged.
    sock = _login(port, key)
    sock.sendall(b"Q" + struct.pack("!i", 3))  # a length below 4
    reply = _drain(sock)
    assert b"E" in reply and b"08P01" in reply
    assert charges(server) == 0


def test_describe_reads_no_data_and_charges_nothing(wire: tuple[WireServer, int, str]) -> None:
    server, port, key = wire
    sock = _login(port, key)
    sql = b"SELECT sex, COUNT(*) AS n FROM patients WHERE age > $1 GROUP BY sex\0"
    parse = b"P" + struct.pack("!i", 4 + 1 + len(sql) + 2) + b"\0" + sql + b"\0\0"
    describe = b"D" + struct.pack("!i", 4 + 2) + b"S\0"
    sync = b"S" + struct.pack("!i", 4)
    sock.sendall(parse + describe + sync)
    reply = _until_ready(sock)
    assert b"t" in reply and b"T" in reply and b"sex\0" in reply
    assert charges(server) == 0


def _login(port: int, key: str, user: str = "alice") -> socket.socket:
    """A raw socket logged in through psycopg's own SCRAM is not reusable, so log in by
    hand with the same exchange (client side of RFC 5802)."""
    import base64
    import hashlib
    import hmac
    import secrets

    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    params = b"user\0" + user.encode() + b"\0database\0dpgate\0\0"
    sock.sendall(struct.pack("!ii", 8 + len(params), codec.PROTOCOL_V3) + params)
    _read_message(sock)  # AuthenticationSASL
    nonce = base64.b64encode(secrets.token_bytes(18)).decode()
    first_bare = f"n=,r={nonce}"
    first = ("n,," + first_bare).encode()
    body = b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first
    sock.sendall(b"p" + struct.pack("!i", 4 + len(body)) + body)
    _, cont = _read_message(sock)
    server_first = cont[4:].decode()
    attrs = dict(p.split("=", 1) for p in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", key.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    final = f"{without_proof},p={proof.decode()}".encode()
    sock.sendall(b"p" + struct.pack("!i", 4 + len(final)) + final)
    _until_ready(sock)
    return sock


def _read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    header = _recv(sock, 5)
    (length,) = struct.unpack("!i", header[1:])
    return header[:1], _recv(sock, length - 4)


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _until_ready(sock: socket.socket) -> bytes:
    seen = b""
    while True:
        kind, body = _read_message(sock)
        seen += kind + body
        if kind == b"Z":
            return seen


def _drain(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a hang fails on the timeout)."""
    sock.settimeout(10)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionError:
        return data


def test_fuzzed_frames_never_crash_or_hang_the_server(wire: tuple[WireServer, int, str]) -> None:
    """Random, truncated and oversized frames, before and after login: each connection
    ends (error or close) within its deadline, and the server keeps answering."""
    server, port, key = wire
    rng = random.Random(18)
    kinds = b"QPBDECSHXpFdcfZ?\0"
    # An honest analyst's session runs beside the fuzzer: nothing the fuzzer sends may
    # stall it (each answer within seconds, none refused).
    fuzzing = threading.Event()
    fuzzing.set()
    latencies: list[float] = []
    failures: list[str] = []

    def honest() -> None:
        try:
            with connect(port, key) as conn:
                while fuzzing.is_set():
                    t = time.monotonic()
                    assert conn.execute("SELECT 1").fetchone() == (1,)
                    latencies.append(time.monotonic() - t)
                    time.sleep(0.05)
        except Exception as e:  # reported below, in the test's own thread
            failures.append(repr(e))

    analyst = threading.Thread(target=honest, daemon=True)
    analyst.start()
    started = time.monotonic()
    # At least 150 fuzzed connections, and on until the honest session has had ten answers
    # beside them (a fast machine fuzzes 150 in well under the session's first second).
    i = -1
    while i < 149 or (len(latencies) < 10 and time.monotonic() - started < 50):
        i += 1
        logged_in = i % 2 == 0
        sock = _login(port, key) if logged_in else socket.create_connection(("127.0.0.1", port))
        sock.settimeout(5)
        mode = i % 5
        if mode == 0:  # random bytes
            payload = rng.randbytes(rng.randint(1, 400))
        elif mode == 1:  # a valid-looking frame with a random body
            body = rng.randbytes(rng.randint(0, 200))
            payload = bytes([rng.choice(kinds)]) + struct.pack("!i", len(body) + 4) + body
        elif mode == 2:  # truncated: the declared length exceeds what is sent
            body = rng.randbytes(rng.randint(0, 50))
            payload = bytes([rng.choice(kinds)]) + struct.pack("!i", len(body) + 100) + body
        elif mode == 3:  # oversized
            payload = b"Q" + struct.pack("!i", codec.MAX_MESSAGE_BYTES + 1)
        else:  # a Bind with absurd counts
            payload = b"B" + struct.pack("!i", 12) + b"\0\0" + struct.pack("!hh", 32767, -5)
        if not logged_in and mode in (0, 2):
            payload = struct.pack("!i", rng.choice([3, 8, 9, 100_000])) + payload
        try:
            sock.sendall(payload)
            # The client stops sending (mid-frame for the truncated ones): the server must
            # answer or close at once, not wait.
            sock.shutdown(socket.SHUT_WR)
            reply = _drain(sock)
            assert b"Traceback" not in reply
        except OSError:
            pass
        finally:
            sock.close()
    assert time.monotonic() - started < 60
    fuzzing.clear()
    analyst.join(30)
    assert not failures and len(latencies) >= 10, failures
    assert max(latencies) < 5.0, max(latencies)  # a stall, not scheduling noise
    with connect(port, key) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert charges(server) == 0


def test_a_connection_has_a_memory_limit(wire: tuple[WireServer, int, str]) -> None:
    from gateway.pgwire.session import MAX_STATEMENTS, MEMORY_LIMIT_BYTES

    server, port, key = wire
    sock = _login(port, key)
    big = b"SELECT COUNT(*) FROM patients WHERE sex = '" + b"x" * 900_000 + b"'\0"
    refused = None
    for i in range(MEMORY_LIMIT_BYTES // 900_000 + 2):
        name = f"s{i}".encode() + b"\0"
        body = name + big + b"\0\0"
        sock.sendall(b"P" + struct.pack("!i", 4 + len(body)) + body + b"S\0\0\0\4")
        reply = _until_ready(sock)
        if b"54000" in reply:
            refused = i
            break
    assert refused is not None and refused <= MEMORY_LIMIT_BYTES // 900_000
    assert MAX_STATEMENTS >= 16
    # The connection still works, and closing statements frees their memory.
    sock.sendall(b"Q" + struct.pack("!i", 4 + len(b"DEALLOCATE ALL\0")) + b"DEALLOCATE ALL\0")
    assert b"DEALLOCATE" in _until_ready(sock)
    assert charges(server) == 0


def test_http_and_the_wire_share_one_pipeline(wire: tuple[WireServer, int, str]) -> None:
    """An answer released over HTTP comes back identical and free over the wire (same
    cache, same ledger), and the wire query is counted like an HTTP one."""
    from gateway.http.app import create_app
    from gateway.ops import metrics

    server, port, key = wire
    sql = "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease ORDER BY disease"
    client = create_app(server.gateway.config, gateway=server.gateway).test_client()
    r = client.post("/v1/query", json={"sql": sql}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    over_http = [tuple(row) for row in r.get_json()["rows"]]
    before = metrics.QUERIES.labels("alice", "cached")._value.get()
    with connect(port, key) as conn:
        assert conn.execute(sql).fetchall() == over_http
    assert charges(server) == 1
    assert metrics.QUERIES.labels("alice", "cached")._value.get() == before + 1


def test_session_settings_choose_epsilon(wire: tuple[WireServer, int, str]) -> None:
    server, port, key = wire
    with connect(port, key) as conn:
        conn.execute("SET dpgate.epsilon = 0.5")
        assert conn.execute("SHOW dpgate.epsilon").fetchone() == ("0.5",)
        conn.execute("SELECT COUNT(*) FROM patients")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SET dpgate.epsilon = 'lots'")
        assert info.value.sqlstate == "22023"
        conn.execute("SET dpgate.epsilon = 5")  # above max_epsilon_per_query: refused, free
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > 50")
        assert info.value.sqlstate == "22023"
    (entry,) = server.gateway.ledger.history("alice")
    assert entry.cost.epsilon == pytest.approx(0.5)


def test_rate_limits_apply_over_the_wire(
    serve_wire: Callable[..., tuple[WireServer, int, str]],
) -> None:
    server, port, key = serve_wire(limits={"analyst_per_minute": 2})
    # The three requests must fall in one minute's window: on a loaded machine they can
    # take seconds, so start them well away from a minute's end.
    if time.time() % 60 > 40:
        time.sleep(60.5 - time.time() % 60)
    with connect(port, key) as conn:
        conn.execute("SELECT COUNT(*) FROM patients")
        conn.execute("SELECT COUNT(*) FROM patients WHERE age > 30")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > 40")
        assert info.value.sqlstate == "53000" and "rate_limited" in str(
            info.value.diag.message_detail
        )
    assert charges(server) == 2


def test_release_timing_holds_over_the_wire_and_cancel_keeps_the_charge(
    serve_wire: Callable[..., tuple[WireServer, int, str]],
) -> None:
    server, port, key = serve_wire(execution={"timing": "deadline", "deadline_ms": 600})
    with connect(port, key) as conn:
        started = time.monotonic()
        conn.execute("SELECT COUNT(*) FROM patients")
        assert time.monotonic() - started >= 0.6
        sql = "SELECT COUNT(*) FROM patients WHERE age > 20"
        # cancel_safe: libpq's blocking PQcancel would hold the GIL this server needs
        threading.Timer(0.2, conn.cancel_safe).start()
        with pytest.raises(psycopg.errors.QueryCanceled) as info:
            conn.execute(sql)
        assert "stays charged" in str(info.value)
        assert charges(server) == 2  # the cancelled statement had reached the database
        conn.execute(sql)  # the kept answer, free
    assert charges(server) == 2


def test_tls_is_offered_and_can_be_required(
    serve_wire: Callable[..., tuple[WireServer, int, str]], tmp_path: Path
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a test certificate")
    cert, private = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(private), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    tls = {"cert": str(cert), "key": str(private), "require": True}
    _, port, key = serve_wire({"tls": tls})
    with psycopg.connect(
        host="127.0.0.1", port=port, user="alice", password=key, sslmode="require"
    ) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="TLS only"):
        connect(port, key)


def test_a_key_without_a_verifier_must_be_rotated(wire: tuple[WireServer, int, str]) -> None:
    """Keys made before the wire front end (ledger schema < 5) have no SCRAM verifier:
    such an analyst cannot log in until the key is rotated; HTTP keeps working."""
    import sqlalchemy as sa

    from budget import schema

    server, port, key = wire
    with server.gateway.ledger.engine.begin() as db:
        db.execute(sa.delete(schema.scram_verifiers))
    with pytest.raises(psycopg.OperationalError, match="rotate"):
        connect(port, key)
    assert server.gateway.authenticate(key).name == "alice"
    new_key = server.gateway.ledger.rotate_key("alice")
    with connect(port, new_key, autocommit=False) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_catalogue_reads_no_file_and_no_protected_row(
    wire: tuple[WireServer, int, str],
) -> None:
    server, port, key = wire
    with connect(port, key) as conn:
        rows = conn.execute(
            "SELECT relname, reltuples, relpages FROM pg_catalog.pg_class ORDER BY relname"
        ).fetchall()
        assert rows == [("patients", -1.0, 0), ("visits", -1.0, 0), ("zip_regions", -1.0, 0)]
        for sql in [
            "SELECT * FROM read_csv('/etc/passwd')",
            "SELECT c.relname FROM pg_catalog.pg_class c, patients p",
            "SELECT length(repeat('x', 300000000))",
            "SELECT (SELECT COUNT(*) FROM patients) FROM pg_catalog.pg_class",
        ]:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert info.value.sqlstate in ("0A000", "42P01"), sql
    assert charges(server) == 0


#: Catalogue queries DBeaver and Metabase send on connect and sync (as their drivers
#: send them: pgjdbc, parameters bound), answered from the config with the rows expected.
BI_CATALOGUE_QUERIES: list[tuple[str, tuple[Any, ...] | None, int]] = [
    (
        "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datallowconn AND NOT "
        "datistemplate OR db.datname =%s ORDER BY db.datname",
        ("dpgate",),
        1,
    ),
    ("select * from pg_catalog.pg_settings where name=%s", ("standard_conforming_strings",), 1),
    (
        "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n LEFT OUTER JOIN "
        "pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 AND "
        "d.classoid='pg_namespace'::regclass ORDER BY nspname",
        None,
        3,
    ),
    (
        "SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,"
        "d.description, case when c.relkind='p' then true else false end as is_partitioned "
        "FROM pg_catalog.pg_class c LEFT OUTER JOIN pg_catalog.pg_class t ON "
        "t.oid=c.reltoastrelid LEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.reloftype "
        "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND "
        "d.classoid='pg_class'::regclass WHERE c.relnamespace=%s AND c.relkind not in "
        "('i','I','c')",
        (2200,),
        3,  # the demo's tables: patients, visits, zip_regions
    ),
    (
        "SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as def_value,"
        "dsc.description,dep.objid FROM pg_catalog.pg_attribute a INNER JOIN "
        "pg_catalog.pg_class c ON (a.attrelid=c.oid) LEFT OUTER JOIN pg_catalog.pg_attrdef ad "
        "ON (a.attrelid=ad.adrelid AND a.attnum = ad.adnum) LEFT OUTER JOIN "
        "pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid) "
        "LEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' and "
        "dep.refobjsubid = a.attnum and dep.classid = dep.refclassid WHERE NOT a.attisdropped "
        "AND c.relkind not in ('i','I','c') AND c.relname=%s ORDER BY a.attnum",
        ("patients",),
        9,
    ),
    ("SELECT current_schema(),session_user", None, 1),
    ("select string_agg(word, ',') from pg_catalog.pg_get_keywords()", None, 1),
    (
        "SELECT n.nspname AS schema, c.relname AS name, c.relkind AS type, "
        "obj_description(c.oid) AS description FROM pg_catalog.pg_class c JOIN "
        "pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN "
        "('r','p','v','m','f') AND n.nspname !~ '^information_schema$' AND n.nspname !~ '^pg_' "
        "AND has_table_privilege(c.oid, 'SELECT')",
        None,
        3,
    ),
    ("SELECT e.enumtypid, t.typname FROM pg_type t JOIN pg_enum e ON t.oid = e.enumtypid", None, 0),
    (
        "SELECT c.column_name, c.data_type FROM information_schema.columns c "
        "WHERE c.table_name = %s ORDER BY c.ordinal_position",
        ("patients",),
        9,
    ),
]


def test_bi_tool_catalogue_queries_are_answered(wire: tuple[WireServer, int, str]) -> None:
    server, port, key = wire
    with connect(port, key) as conn:
        for sql, params, expected in BI_CATALOGUE_QUERIES:
            assert len(conn.execute(sql, params).fetchall()) == expected, sql
    assert charges(server) == 0


def test_a_nested_aggregation_over_the_wire_is_described_and_charged_as_its_inner_query(
    wire: tuple[WireServer, int, str],
) -> None:
    """Described (extended protocol) with the outer query's columns, answered as
    post-processing of the inner query, which alone is charged."""
    server, port, key = wire
    inner = "SELECT disease, sex, COUNT(*) AS n FROM patients GROUP BY disease, sex"
    outer = f'SELECT sex, SUM(n) AS "SUM(n)" FROM ({inner}) AS t GROUP BY sex ORDER BY sex'
    with connect(port, key) as conn:
        cur = conn.cursor()
        cur.execute(outer, prepare=True)
        assert [d.name for d in cur.description or []] == ["sex", "SUM(n)"]
        rows = cur.fetchall()
        assert [r[0] for r in rows] == ["F", "M"]
        cur.execute(inner)
        totals: dict[str, int] = {}
        for _, sex, n in cur.fetchall():
            totals[sex] = totals.get(sex, 0) + n
        assert dict(rows) == totals
    assert charges(server) == 1  # the inner query, once; the second run was a cache hit


def test_shutdown_ends_serve_forever_and_lets_go_of_the_catalogue(
    make_gateway: Callable[..., Any],
) -> None:
    """A thread blocked in ``accept()`` is not woken on Linux by closing the socket: the
    server's thread lived to the interpreter's exit, holding the catalogue's DuckDB
    connection, which its bindings then reported as leaked (issue 38)."""
    from gateway.pgwire.catalog import CatalogError

    gateway = make_gateway(postgres_wire={"port": 0})
    server = WireServer(gateway.config, gateway)
    server.bind("127.0.0.1")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    time.sleep(0.2)  # blocked in accept()
    server.shutdown()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert not hasattr(server.catalog, "_db")
    with pytest.raises(CatalogError):
        server.catalog.run("SELECT 1")


def test_rows_left_out_by_the_audit_are_named_in_a_notice(
    wire: tuple[WireServer, int, str],
) -> None:
    """A BI tool over the wire gets fewer rows when the audit leaves some out; a notice
    names them and says why (the 4 Meningitis patients without a glucose reading, k = 5,
    ε = 1: the mean glucose by disease, then the count by disease)."""
    _, port, key = wire
    notices: list[str] = []
    with connect(port, key) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("SET dpgate.epsilon = 1")
        conn.execute("SELECT disease, AVG(glucose) AS g FROM patients GROUP BY disease")
        rows = conn.execute(
            "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease"
        ).fetchall()
    (left,) = [n for n in notices if "left out by the audit" in n]
    assert "disease = Meningitis" in left and "glucose IS NULL" in left
    assert "Meningitis" not in {r[0] for r in rows}


def test_an_audit_refusal_carries_what_to_ask_instead_as_its_hint(
    wire: tuple[WireServer, int, str],
) -> None:
    """psql shows an ErrorResponse's hint under the error: a refusal's suggestions
    (``detail.ask_instead``) are there, one runnable statement a line, and the first
    one, sent as it is, is answered."""
    _, port, key = wire
    with connect(port, key) as conn:
        conn.execute("SET dpgate.epsilon = 1")
        conn.execute("SELECT AVG(income) FROM patients")
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute("SELECT SUM(income) AS s FROM patients WHERE NOT smoker")
        hint = refused.value.diag.message_hint or ""
        lines = hint.splitlines()
        assert lines[0] == "Ask instead:"
        first = lines[1].strip().rstrip(";")
        assert first == "SELECT SUM(income) AS s, COUNT(*) AS n FROM patients WHERE NOT smoker"
        assert "SELECT COUNT(*) AS n FROM patients WHERE smoker = TRUE;" in hint
        ((_total, n),) = conn.execute(first).fetchall()
        assert n > 0
