"""Execution adapters for the protected database engines beyond SQLite, PostgreSQL and
DuckDB (which ``gateway/sql/execute.py`` opens itself).

- ``clickhouse``: a ClickHouse server through clickhouse-connect's SQLAlchemy dialect
  (``clickhousedb://``), or the embedded engine chDB (``chdb:///data/dir``, through
  ``chdb_dbapi``); opened read-only (``readonly=2``) with a per-statement
  ``max_execution_time``.
- ``spark``: Spark SQL through a DB-API adapter over a SparkSession (``spark+local://``
  for an in-process ``local[N]`` session, ``spark+connect://host:15002`` for Spark
  Connect; ``spark_dbapi``), with ANSI errors turned off and a job group cancelled at
  the deadline.
- ``dialects``: the few rewrites of a compiled statement that one engine needs to compute
  what every other engine computes (ClickHouse rounds halves to even).

Each engine's module is imported only when a URL names it, so dpgate runs without their
packages (the ``engines`` extra).
"""

from __future__ import annotations

#: SQLAlchemy dialect name → sqlglot dialect name, for the engines of this package and
#: the SQLAlchemy dialects of other drivers that reach the same engines.
SQLGLOT_DIALECTS = {
    "clickhousedb": "clickhouse",  # clickhouse-connect
    "clickhouse": "clickhouse",  # clickhouse-sqlalchemy, and chdb (chdb_dbapi)
    "spark": "spark",  # spark_dbapi: local or Spark Connect
    "hive": "spark",  # PyHive's dialect, on a Spark Thrift server
    "databricks": "databricks",  # databricks-sql-connector
    "trino": "trino",
    "bigquery": "bigquery",
}
