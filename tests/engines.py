"""The distributed engines under test, on their real engines: ClickHouse embedded (chDB)
and Spark SQL in ``local[2]`` mode in this process, and a Spark Connect server started
from pyspark's own ``sbin/start-connect-server.sh`` (``spark-connect``). Test modules
load their fixture rows with ``load`` and open the engine as the gateway does, from
``url``.

The engines are process-wide singletons (chDB holds one data directory per process, a
JVM one SparkSession), so each test process starts each at most once (``chdb_root``,
``spark_warehouse``, ``connect_server`` are session-scoped) and every test module loads
its tables into a database of its own (``table_on`` loads one table on any backend,
SQLite to Spark). The local session's tests share one pytest-xdist worker
(``SPARK_GROUP``) and Spark Connect's another or the same (``CONNECT_GROUP``), so a
``make test`` run starts one local JVM and one Connect server.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import pytest
import sqlalchemy as sa

Engine = Literal["clickhouse", "spark", "spark-connect"]
#: Column kinds as the tests declare them, and their storage type on each engine.
STORAGE: dict[str, dict[str, str]] = {
    "clickhouse": {
        "integer": "Int64",
        "real": "Float64",
        "text": "String",
        "boolean": "Bool",
        "date": "Date32",
        "smallint": "Int16",
        "int": "Int32",
        "bigint": "Int64",
        "float": "Float32",
        "double": "Float64",
    },
    "spark": {
        "integer": "BIGINT",
        "real": "DOUBLE",
        "text": "STRING",
        "boolean": "BOOLEAN",
        "date": "DATE",
        "smallint": "SMALLINT",
        "int": "INT",
        "bigint": "BIGINT",
        "float": "FLOAT",
        "double": "DOUBLE",
    },
}
STORAGE["spark-connect"] = STORAGE["spark"]
SLOW = pytest.mark.slow
SPARK_GROUP = pytest.mark.xdist_group("spark")
#: The Spark Connect tests' worker: the server is a JVM of its own whichever worker asks
#: for it, so they need not wait behind the local session's tests on Spark's worker.
CONNECT_GROUP = pytest.mark.xdist_group("spark-connect")
#: Each engine's marks: all are slow, and Spark's share one worker.
MARKS: dict[str, list[pytest.MarkDecorator]] = {
    "clickhouse": [SLOW],
    "spark": [SLOW, SPARK_GROUP],
    "spark-connect": [SLOW, CONNECT_GROUP],
}
ENGINES = [pytest.param(name, marks=marks) for name, marks in MARKS.items()]
#: The engines in this process: chDB and Spark's local session. Spark Connect runs the
#: same Spark SQL as the local session, so tests of what the compiled SQL computes run on
#: these; Connect's own path (its client, gRPC, Arrow-decoded answers, cancel by tag, its
#: catalogue) is tested where it matters: tests/test_engines.py, tests/test_execution.py,
#: tests/test_config_check_engines.py and the driver hazards of tests/test_totality.py.
IN_PROCESS_ENGINES = [p for p in ENGINES if p.values != ("spark-connect",)]
#: How long a Spark Connect server may take to listen (~8 s on an idle machine).
CONNECT_START_S = 180


def chdb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This process's chDB data directory (created once)."""
    pytest.importorskip("chdb")
    return tmp_path_factory.getbasetemp() / "chdb"


def spark_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """This process's SparkSession (created once), as the gateway's driver opens it."""
    pytest.importorskip("pyspark")
    from gateway.sql.engines import spark_dbapi

    warehouse = tmp_path_factory.getbasetemp() / "spark-warehouse"
    spark = spark_dbapi.session(master="local[2]", warehouse=str(warehouse))
    spark.sparkContext.setLogLevel("OFF")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    return spark


_CONNECT: dict[str, str] = {}


def connect_server(tmp_path_factory: pytest.TempPathFactory) -> str:
    """This process's Spark Connect server (started once, stopped at exit): pyspark's
    ``sbin/start-connect-server.sh`` in the foreground, on a free port; its URL."""
    pytest.importorskip("pyspark")
    pytest.importorskip("grpc")
    if "url" in _CONNECT:
        return _CONNECT["url"]
    import pyspark

    home = Path(pyspark.__file__).parent
    script = home / "sbin" / "start-connect-server.sh"
    if not script.exists():
        pytest.skip("this pyspark ships no Spark Connect server")
    root = tmp_path_factory.getbasetemp() / "spark-connect"
    root.mkdir(exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_NO_DAEMONIZE": "1",  # in the foreground: its process is ours to stop
        "SPARK_LOG_DIR": str(root),
        "SPARK_PID_DIR": str(root),
        "SPARK_IDENT_STRING": f"dpgate-{os.getpid()}",
    }
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    command = [
        "bash", str(script), "--master", "local[2]", "--driver-memory", "768m",
        *[a for k, v in settings.items() for a in ("--conf", f"{k}={v}")],
    ]  # fmt: skip
    log = (root / "server.out").open("wb")
    server = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    atexit.register(_stop, server)
    _watch(server)
    deadline = time.monotonic() + CONNECT_START_S
    while not _listening(port):
        if server.poll() is not None or time.monotonic() > deadline:
            _stop(server)
            tail = (root / "server.out").read_text(errors="replace")[-2000:]
            pytest.fail(f"the Spark Connect server did not start:\n{tail}")
        time.sleep(0.5)
    _CONNECT["url"] = f"spark+connect://127.0.0.1:{port}"
    return _CONNECT["url"]


#: A watchdog stops the server's process group once this test process is gone, however
#: it ended: ``atexit`` does not run when a worker is killed, and the server lives in its
#: own session (so that stopping it stops Spark's JVM too), where it would outlive us.
_WATCHDOG = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
while True:
    try:
        os.kill(parent, 0)
        os.killpg(group, 0)
    except ProcessLookupError:
        break
    time.sleep(1)
try:
    os.killpg(group, signal.SIGTERM)
    time.sleep(10)
    os.killpg(group, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def _watch(server: subprocess.Popen[bytes]) -> None:
    subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(server.pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def connect_session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Spark Connect session on this process's server, as the gateway's driver opens it."""
    from gateway.sql.engines import spark_dbapi

    remote = connect_server(tmp_path_factory).replace("spark+connect://", "sc://")
    return spark_dbapi.session(remote=remote + "/")


def new_database(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def url(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL the gateway opens the engine with."""
    if engine == "clickhouse":
        return f"chdb:///{chdb_root(tmp_path_factory)}"
    if engine == "spark-connect":
        return connect_server(tmp_path_factory)
    warehouse = tmp_path_factory.getbasetemp() / "spark-warehouse"
    spark_warehouse(tmp_path_factory)
    return f"spark+local:///{warehouse}?master=local[2]"


def load(
    engine: Engine,
    tmp_path_factory: pytest.TempPathFactory,
    database: str,
    table: str,
    columns: Mapping[str, str],
    rows: Iterable[Mapping[str, Any]],
    *,
    not_null: Iterable[str] = (),
) -> None:
    """Create ``database.table`` with ``columns`` (name → kind of ``STORAGE``; nullable
    unless in ``not_null``) and insert ``rows``."""
    rows = list(rows)
    required = set(not_null)
    if engine == "clickhouse":
        _load_clickhouse(chdb_root(tmp_path_factory), database, table, columns, rows, required)
    elif engine == "spark-connect":
        _load_spark(connect_session(tmp_path_factory), database, table, columns, rows, required)
    else:
        _load_spark(spark_warehouse(tmp_path_factory), database, table, columns, rows, required)


def _load_clickhouse(
    root: Path,
    database: str,
    table: str,
    columns: Mapping[str, str],
    rows: list[Mapping[str, Any]],
    required: set[str],
) -> None:
    import chdb

    conn = chdb.connect(f"file:{root}")
    cursor = conn.cursor()
    types = STORAGE["clickhouse"]
    defs = ", ".join(
        f'"{n}" {types[k] if n in required else f"Nullable({types[k]})"}'
        for n, k in columns.items()
    )
    cursor.execute(f'CREATE DATABASE IF NOT EXISTS "{database}"')
    cursor.execute(
        f'CREATE TABLE "{database}"."{table}" ({defs}) ENGINE = MergeTree ORDER BY tuple()'
    )
    if rows:
        lines = "\n".join(json.dumps({n: _jsonable(r.get(n)) for n in columns}) for r in rows)
        # NaN and ±inf travel as JSON's non-standard literals, which ClickHouse reads.
        cursor.execute(
            f'INSERT INTO "{database}"."{table}" SETTINGS input_format_json_read_numbers_as_strings'
            f" = 1 FORMAT JSONEachRow {lines}"
        )
    conn.close()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def _same(value: Any) -> Any:
    return value


def _date(value: Any) -> Any:
    return datetime.date.fromisoformat(value) if isinstance(value, str) else value


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, int) else value


def _load_spark(
    spark: Any,
    database: str,
    table: str,
    columns: Mapping[str, str],
    rows: list[Mapping[str, Any]],
    required: set[str],
) -> None:
    from pyspark.sql import types as T

    # built here, not parsed: parsing a type needs a local JVM, which Connect's client has not
    spark_types = {
        "BIGINT": T.LongType, "DOUBLE": T.DoubleType, "STRING": T.StringType,
        "BOOLEAN": T.BooleanType, "DATE": T.DateType, "SMALLINT": T.ShortType,
        "INT": T.IntegerType, "FLOAT": T.FloatType,
    }  # fmt: skip
    types = STORAGE["spark"]
    schema = T.StructType(
        [T.StructField(n, spark_types[types[k]](), n not in required) for n, k in columns.items()]
    )
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    convert = {"date": _date, "real": _float, "float": _float, "double": _float}
    frame = spark.createDataFrame(
        [tuple(convert.get(k, _same)(r.get(n)) for n, k in columns.items()) for r in rows],
        schema,
    )
    frame.write.saveAsTable(f"`{database}`.`{table}`")


def raw_error(engine: Engine, engine_url: str, sql: str) -> str:
    """The engine's own error for ``sql``, for a failing test's message (the drivers
    hide it from everything else, rightly)."""
    try:
        if engine == "clickhouse":
            import chdb

            conn = chdb.connect("file:" + engine_url.removeprefix("chdb:///"))
            conn.cursor().execute(sql)
            conn.close()
        elif engine == "spark-connect":
            from gateway.sql.engines import spark_dbapi

            remote = engine_url.replace("spark+connect://", "sc://") + "/"
            spark_dbapi.session(remote=remote).sql(sql).collect()
        else:
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.sql(sql).collect()
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:1500]}"
    return "(the statement succeeded when re-run directly)"


def drop_table(
    engine: Engine, tmp_path_factory: pytest.TempPathFactory, database: str, table: str
) -> None:
    """Drop ``database.table`` with a writing connection (not the gateway's)."""
    if engine == "clickhouse":
        import chdb

        conn = chdb.connect(f"file:{chdb_root(tmp_path_factory)}")
        conn.cursor().execute(f'DROP TABLE "{database}"."{table}"')
        conn.close()
    elif engine == "spark-connect":
        connect_session(tmp_path_factory).sql(f"DROP TABLE `{database}`.`{table}`")
    else:
        spark_warehouse(tmp_path_factory).sql(f"DROP TABLE `{database}`.`{table}`")


#: The SQLAlchemy type of each column kind, for the backends ``table_on`` loads through it.
SQLALCHEMY_KINDS: dict[str, Any] = {"integer": sa.Integer, "real": sa.Float, "text": sa.Text}


def table_on(
    backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    table: str,
    columns: Mapping[str, str],
    rows: list[dict[str, Any]],
) -> Iterator[tuple[str, str | None]]:
    """A fresh database on ``backend`` (sqlite, duckdb, postgres — skipped without
    ``DPGATE_TEST_POSTGRES_URL`` — or an engine of ``ENGINES``) holding ``table`` with
    ``columns`` (name → kind: integer, real or text) and ``rows``; yields its (URL,
    schema), the schema None on SQLite and DuckDB. A PostgreSQL schema is dropped after."""
    if backend in ("clickhouse", "spark", "spark-connect"):
        engine = cast(Engine, backend)
        database = new_database(table)
        load(engine, tmp_path_factory, database, table, columns, rows)
        yield url(engine, tmp_path_factory), database
        return
    base = os.environ.get("DPGATE_TEST_POSTGRES_URL")
    schema = None
    if backend in ("sqlite", "duckdb"):
        if backend == "duckdb":
            pytest.importorskip("duckdb_engine")
        path = tmp_path_factory.mktemp(table) / f"{table}.{backend}"
        base = f"{backend}:///{path}"
    elif not base:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    else:
        schema = new_database(f"dpgate_{table}")
    assert base is not None
    kinds = (sa.Column(n, SQLALCHEMY_KINDS[k]) for n, k in columns.items())
    created = sa.Table(table, sa.MetaData(schema=schema), *kinds)
    writer = sa.create_engine(base)
    with writer.begin() as conn:
        if schema is not None:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        created.create(conn)
        conn.execute(created.insert(), rows)
    writer.dispose()  # before the test opens it: DuckDB admits one configuration a file
    try:
        yield base, schema
    finally:
        if schema is not None:
            with writer.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            writer.dispose()
