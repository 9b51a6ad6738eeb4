"""A DB-API 2.0 driver and SQLAlchemy dialect for Spark SQL over a SparkSession.

No SQLAlchemy dialect reaches an in-process Spark, so dpgate brings this one:

- ``spark+local:///WAREHOUSE?master=local[2]``: a SparkSession in the gateway's process
  (a JVM, Java 17), whose tables live in the warehouse directory (Spark's default
  ``spark-warehouse`` when none is given). The tests run on it. One SparkSession per
  process: connections share it.
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
  statement's deadline — cancels its jobs.

A failure is raised as ``OperationalError`` whose text is only Spark's error class
(``DIVIDE_BY_ZERO``, ``CANCELLED``…): Spark's message can quote a value of the rows.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import sqlglot
from sqlalchemy.engine import URL
from sqlglot import exp

from gateway.engines.dbapi import (  # PEP 249 wants them on the driver's module
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
_ENGINE = "Spark"


def session(
    master: str | None = None, remote: str | None = None, warehouse: str | None = None
) -> Any:
    """The process's SparkSession (created on first use), with ANSI errors off."""
    from pyspark.sql import SparkSession

    with _SESSION_LOCK:
        builder = SparkSession.builder.appName("dpgate")
        if remote:
            builder = builder.remote(remote)
        else:
            builder = builder.master(master or "local[2]").config("spark.ui.enabled", "false")
            if warehouse:
                builder = builder.config("spark.sql.warehouse.dir", warehouse)
        spark = builder.getOrCreate()
        spark.conf.set("spark.sql.ansi.enabled", "false")
        return spark


def connect(
    master: str | None = None, remote: str | None = None, warehouse: str | None = None
) -> Connection:
    return Connection(session(master, remote, warehouse), remote is not None)


class Connection:
    """A handle on the shared SparkSession that can cancel its own running statement."""

    def __init__(self, spark: Any, connect: bool) -> None:
        self.spark = spark
        self._connect = connect
        self._group: str | None = None

    def cursor(self) -> Cursor:
        return Cursor(self)

    def cancel(self) -> None:
        """Cancel the jobs of the statement running on this connection, if any."""
        group = self._group
        if group is None:
            return
        if self._connect:
            self.spark.interruptTag(group)
        else:
            self.spark.sparkContext.cancelJobGroup(group)

    def commit(self) -> None:
        """Spark SQL queries have no transaction: nothing to commit."""

    def rollback(self) -> None:
        """Nothing to roll back."""

    def close(self) -> None:
        """The SparkSession is the process's: it outlives the connection."""

    def run(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        group = f"dpgate-{uuid.uuid4().hex}"
        self._group = group
        try:
            if self._connect:
                self.spark.addTag(group)
            else:
                self.spark.sparkContext.setJobGroup(group, "dpgate statement", True)
            frame = self.spark.sql(sql)
            rows = frame.collect()
            return list(frame.columns), [tuple(r) for r in rows]
        finally:
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
        master = url.query.get("master")
        return [], {
            "master": master if isinstance(master, str) else None,
            "warehouse": url.database or None,
        }
