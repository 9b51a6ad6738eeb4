"""Spark SQL as the protected database: opening it through ``spark_dbapi``.

``spark+local:///WAREHOUSE?master=local[2]`` runs Spark in the gateway's process;
``spark+connect://host:15002`` reaches a cluster through Spark Connect. What read-only
and cancellation mean on Spark is in ``gateway/sql/engines/spark_dbapi.py``; the statement's
deadline is enforced by the gateway's timer (``gateway/sql/execute.py``), which calls the
connection's ``cancel()``: Spark has no per-statement timeout of its own.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

#: SQLAlchemy dialect names that reach Spark SQL.
DIALECT_NAMES = ("spark",)
#: URL schemes (``URL.get_backend_name()``) this module opens.
BACKENDS = ("spark",)


def open_engine(url: URL) -> sa.Engine:
    """A SQLAlchemy engine on Spark SQL whose statements can only be single queries."""
    for name in ("spark", "spark.local", "spark.connect"):
        sa.dialects.registry.register(name, "gateway.sql.engines.spark_dbapi", "SparkDialect")
    engine = sa.create_engine(
        url, poolclass=sa.pool.QueuePool, pool_size=4, max_overflow=12, pool_pre_ping=False
    )

    @sa.event.listens_for(engine, "checkin")
    def _forget_cancel(dbapi_connection: Any, _record: Any) -> None:
        # a cancel that came after its statement ended must not stop the next one
        forget = getattr(dbapi_connection, "forget_cancel", None)
        if forget is not None:
            forget()

    return engine
