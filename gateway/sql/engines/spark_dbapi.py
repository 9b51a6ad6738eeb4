"""A DB-API 2.0 driver and SQLAlchemy dialect for Spark SQL over a SparkSession.

No SQLAlchemy dialect reaches an in-process Spark, so dpgate brings this one:

- ``spark+local:///WAREHOUSE?master=local[2]``: a SparkSession in the gateway's process
  (a JVM, Java 17), whose tables live in the warehouse directory (Spark's default
  ``spark-warehouse`` when none is given). The tests run on it. One SparkSession per
  process: connections share it. With ``&metastore=DIR`` the session's catalogue is a
  persistent one (Hive's metastore, embedded Derby, in ``DIR``): tables saved to the
  warehouse by another process that used the same two directories are found. Without
  it the catalogue lives in memory and knows only the session's own tables and views.
  Derby admits one process at a time: load the tables, stop, then serve
  (docs/operations.md, "Loading data").
- ``spark+connect://host:15002``: a Spark Connect server (Spark 3.4+), the way to a
  real cluster without a JVM in the gateway (``sc://host:15002``; pyspark's connect
  extra: grpcio, pyarrow, pandas).

A Spark Thrift server is reached with PyHive's ``hive://host:10000/db`` and Databricks
SQL with ``databricks://token:…@host?http_path=…`` (docs/connect.md); dpgate compiles
for them in sqlglot's ``spark`` and ``databricks`` dialects.

What this driver guarantees on every statement:

- only a query: a statement that sqlglot's Spark parser does not read as one SELECT
  (DDL, INSERT, a command, two statements) is refused before Spark sees it. Spark has no
  read-only session; give the principal read grants only where the catalogue has them
  (Unity Catalog, Ranger) — docs/operations.md;
- ANSI errors off (``spark.sql.ansi.enabled = false``): a division by zero, an invalid
  cast or an overflow is NULL, not an error that depends on the rows (the compiled SQL
  is total by construction, docs/privacy.md; this is the engine's half of it);
- cancellation: each statement runs in its own job group (classic) or under its own tag
  (Spark Connect), and ``Connection.cancel()`` — called by the gateway's timer at the
  statement's deadline — cancels its jobs (on the local session also those the statement
  had not started yet), again every ``CANCEL_RETRY_S`` until the statement has ended,
  and the statement stops at its next step; a cancel that comes before the statement
  started cancels it as it starts.

A failure is raised as ``OperationalError`` whose text is only Spark's error class
(``DIVIDE_BY_ZERO``, ``CANCELLED``…): Spark's message can quote a value of the rows.

The JVM's own output never reaches dpgate's JSON log lines (stderr): a local session is
started with log4j writing to stdout, or to the file named by ``&engine_log=PATH``, and
without the console progress bar.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import sqlglot
from sqlalchemy.engine import URL
from sqlglot import exp

from gateway.sql.engines.dbapi import (  # PEP 249 wants them on the driver's module
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NoTransactionDialect,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    ResultCursor,
    Warning,
)

__all__ = [
    "Connection",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "SparkDialect",
    "Warning",
    "connect",
    "session",
]

apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"  # declared for SQLAlchemy; no parameter is ever bound

_SESSION_LOCK = threading.Lock()
_LOCAL: list[Any] = []  # the process's local SparkSession, once started
# pyspark warns on import when pandas is 3.x; dpgate hands pyspark no pandas frame (it
# collects Rows), so the warning is expected here and would only be noise in the log.
warnings.filterwarnings(
    "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
)
_LOG4J_FILES: dict[str | None, str] = {}  # written once per process and log target
_ENGINE = "Spark"


def session(
    master: str | None = None,
    remote: str | None = None,
    warehouse: str | None = None,
    metastore: str | None = None,
    engine_log: str | None = None,
) -> Any:
    """The process's SparkSession (created on first use), with ANSI errors off. A local
    one keeps its catalogue in ``metastore`` when given, and its JVM's log out of
    stderr (see the module doc); these take effect when the JVM starts."""
    from pyspark.sql import SparkSession

    with _SESSION_LOCK:
        if remote:
            # Spark Connect's own builder: the generic one refuses a remote session in a
            # process that also holds a local one (and then makes every later one remote).
            from pyspark.sql.connect.session import SparkSession as ConnectSession

            remote_spark = ConnectSession.builder.remote(remote).getOrCreate()
            remote_spark.conf.set("spark.sql.ansi.enabled", "false")
            return remote_spark
        if _LOCAL and _LOCAL[0].sparkContext._jsc is not None:
            return _LOCAL[0]  # asking the builder again would only log that it exists
        settings = local_settings(warehouse, metastore, engine_log)
        _start_jvm(master or "local[2]", settings, engine_log)
        builder = SparkSession.builder.appName("dpgate").master(master or "local[2]")
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.conf.set("spark.sql.ansi.enabled", "false")
        _LOCAL[:] = [spark]
        return spark


def _start_jvm(master: str, settings: dict[str, str], engine_log: str | None) -> None:
    """Start the process's JVM (unless running) with its stdout and stderr sent to
    ``engine_log`` or to this process's stdout: the JVM writes there without log4j too
    (``WARNING: Using incubator modules``, a crash's report)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._active_spark_context is not None:
        return
    conf = SparkConf().setAppName("dpgate").setMaster(master).setAll(list(settings.items()))
    out = open(engine_log, "ab") if engine_log else None  # noqa: SIM115 (the JVM's, for life)
    gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": subprocess.STDOUT})
    SparkContext(conf=conf, gateway=gateway)


def local_settings(
    warehouse: str | None, metastore: str | None, engine_log: str | None
) -> dict[str, str]:
    """The Spark settings of a local session (module doc): no UI or progress bar, the
    JVM's log4j to stdout or ``engine_log``, and the warehouse and metastore."""
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log4j_file(engine_log)}",
    }
    if warehouse:
        settings["spark.sql.warehouse.dir"] = str(Path(warehouse).resolve())
    if metastore:
        root = Path(metastore).resolve()
        root.mkdir(parents=True, exist_ok=True)
        settings["spark.sql.catalogImplementation"] = "hive"
        settings["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
        )
        settings["spark.driver.extraJavaOptions"] += (
            f" -Dderby.stream.error.file={root / 'derby.log'}"
        )
    return settings


def _log4j_file(engine_log: str | None) -> str:
    """A log4j2 configuration that writes the JVM's log (WARN and above) to stdout or to
    ``engine_log``: never to stderr, where dpgate's JSON lines go."""
    known = _LOG4J_FILES.get(engine_log)
    if known is not None:
        return known
    if engine_log:
        appender = (
            "appender.engine.type = File\n"
            f"appender.engine.fileName = {Path(engine_log).resolve()}\n"
        )
    else:
        appender = "appender.engine.type = Console\nappender.engine.target = SYSTEM_OUT\n"
    text = (
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.engine.ref = engine\n"
        f"{appender}"
        "appender.engine.name = engine\n"
        "appender.engine.layout.type = PatternLayout\n"
        "appender.engine.layout.pattern = %d{yyyy-MM-dd'T'HH:mm:ss.SSS} %p %c: %m%n\n"
        # expected at every start, and nothing an operator acts on
        "logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader\n"
        "logger.hadoop.level = error\n"
    )
    handle, path = tempfile.mkstemp(prefix="dpgate-log4j2-", suffix=".properties")
    with os.fdopen(handle, "w") as f:
        f.write(text)
    _LOG4J_FILES[engine_log] = path
    return path


def connect(
    master: str | None = None,
    remote: str | None = None,
    warehouse: str | None = None,
    metastore: str | None = None,
    engine_log: str | None = None,
) -> Connection:
    return Connection(session(master, remote, warehouse, metastore, engine_log), remote is not None)


#: How often a cancel is sent again while its statement runs on (seconds): a cancel that
#: finds no job (Spark still plans) or no operation (Spark Connect's server does not hold
#: it yet) would otherwise leave the statement to run to its end after its deadline.
CANCEL_RETRY_S = 0.2


class Connection:
    """A handle on the shared SparkSession that can cancel its own running statement."""

    def __init__(self, spark: Any, connect: bool) -> None:
        self.spark = spark
        self._connect = connect
        self._lock = threading.Lock()
        self._group: str | None = None  # the running statement's job group or tag
        self._cancelled: str | None = None  # the group a cancel was sent for
        self._pending = False  # a cancel came before the statement started

    def cursor(self) -> Cursor:
        return Cursor(self)

    def cancel(self) -> None:
        """Cancel the statement running on this connection — or, when none runs yet, the
        next one it starts before it goes back to the pool (the gateway's timer can fire
        while the driver still checks the statement's text): its jobs running now and
        those it starts later, and the statement itself between its steps.

        A cancel that comes while Spark still plans the statement (under load, for
        seconds) finds no job yet, and one sent to Spark Connect before the server holds
        the operation finds nothing. So the cancel is sent again every
        ``CANCEL_RETRY_S`` until the statement has ended: the local session's
        ``cancelJobGroupAndFutureJobs`` (Spark 4) marks the group's future jobs
        cancelled, but a shuffle stage that adaptive execution submits on its own was
        measured running on for over a minute after it; the repeated cancel stops it
        within ``CANCEL_RETRY_S`` of its start. The statement also stops at its next
        step (``run``). Returns at once: the retries run in a thread of their own."""
        with self._lock:
            group = self._group
            if group is None:
                self._pending = True
                return
            if self._cancelled == group:
                return  # already being cancelled
            self._cancelled = group
        self._interrupt(group)
        threading.Thread(
            target=self._keep_interrupting, args=(group,), name="dpgate-spark-cancel", daemon=True
        ).start()

    def forget_cancel(self) -> None:
        """Drop a cancel that came after the last statement had ended (called when the
        connection goes back to the pool): it was meant for that statement."""
        with self._lock:
            self._pending = False

    def _interrupt(self, group: str) -> None:
        try:
            if self._connect:
                self.spark.interruptTag(group)
            else:
                self.spark.sparkContext._jsc.sc().cancelJobGroupAndFutureJobs(group)
        except Exception:  # a session being stopped, a server gone: the statement fails too
            return

    def _keep_interrupting(self, group: str) -> None:
        while True:
            time.sleep(CANCEL_RETRY_S)
            with self._lock:
                if self._group != group:
                    return
            self._interrupt(group)

    def _check(self, group: str) -> None:
        """Stop the statement here if it was cancelled (between its steps)."""
        with self._lock:
            if self._cancelled == group:
                raise OperationalError(_ENGINE, "CANCELLED")

    def commit(self) -> None:
        """Spark SQL queries have no transaction: nothing to commit."""

    def rollback(self) -> None:
        """Nothing to roll back."""

    def close(self) -> None:
        """The SparkSession is the process's: it outlives the connection."""

    def run(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        group = f"dpgate-{uuid.uuid4().hex}"
        with self._lock:
            self._group = group
            if self._pending:
                self._pending = False
                self._cancelled = group
        try:
            if self._connect:
                self.spark.addTag(group)
            else:
                self.spark.sparkContext.setJobGroup(group, "dpgate statement", True)
            self._check(group)
            frame = self.spark.sql(sql)
            self._check(group)
            rows = frame.collect()
            return list(frame.columns), [tuple(r) for r in rows]
        finally:
            with self._lock:
                self._group = None
            if self._connect:
                self.spark.removeTag(group)
            else:
                self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


class Cursor(ResultCursor):
    """Runs one query at a time and holds its (small, aggregated) result."""

    def __init__(self, connection: Connection) -> None:
        super().__init__()
        self._connection = connection

    def run(self, operation: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        if not is_one_query(operation):
            raise InterfaceError("only a single query runs on the protected database")
        try:
            return self._connection.run(operation)
        except OperationalError:
            raise
        except Exception as e:  # Py4J, pyspark's captured and Spark Connect errors
            raise OperationalError(_ENGINE, _error_class(e)) from None


def is_one_query(sql: str) -> bool:
    """Whether ``sql`` is exactly one query statement, as Spark's dialect reads it."""
    try:
        statements = sqlglot.parse(sql, read="spark")
    except sqlglot.errors.SqlglotError:
        return False
    return len(statements) == 1 and isinstance(statements[0], exp.Query)


def _error_class(e: BaseException) -> str | None:
    """Spark's error class (``DIVIDE_BY_ZERO``…) and nothing else of the error."""
    getter = getattr(e, "getCondition", None) or getattr(e, "getErrorClass", None)
    try:
        value = getter() if getter is not None else None
    except Exception:  # a Py4J error whose JVM side is gone
        value = None
    return str(value) if value else type(e).__name__


class SparkDialect(NoTransactionDialect):
    """SQLAlchemy's view of Spark SQL over this driver (``spark+local://`` and
    ``spark+connect://``)."""

    name = "spark"
    driver = "local"
    # SQLAlchemy looks for this on the dialect's own class, not on a base
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> Any:
        import sys

        return sys.modules[__name__]

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        if url.get_driver_name() == "connect":
            port = url.port or 15002
            params = "".join(f";{k}={v}" for k, v in sorted(url.query.items()))
            return [], {"remote": f"sc://{url.host}:{port}/{params}"}

        def one(name: str) -> str | None:
            value = url.query.get(name)
            return value if isinstance(value, str) else None

        return [], {
            "master": one("master"),
            "warehouse": url.database or None,
            "metastore": one("metastore"),
            "engine_log": one("engine_log"),
        }
