"""Structured logs: one JSON object per line, one line per HTTP request.

What a request line carries is fixed by ``RequestLog``: who asked (analyst name, source
address), what they asked (method, path, the query's SQL), how it ended (status, error
code, query outcome, ε spent) and how long it took. It never carries anything read from
the protected database: response bodies (rows, noisy answers) and error messages are
not logged, only error codes. ε spent is rounded for display as the budget's figures are
in JSON (12 significant digits, ``budget.records.JSON_DIGITS``): a charge of 0.7 reads
0.7, not 0.7000000000000001.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from budget.records import JSON_DIGITS

ACCESS_LOGGER = "dpgate.access"


@dataclass(frozen=True)
class RequestLog:
    """The fields of one request's log line (``None`` fields are left out)."""

    request_id: str
    method: str
    path: str
    status: int
    duration_ms: float
    remote_addr: str | None = None
    analyst: str | None = None
    error_code: str | None = None
    query_outcome: str | None = None
    epsilon_spent: float | None = None
    sql: str | None = None


class JsonFormatter(logging.Formatter):
    """Renders a record as one JSON line: time, level, logger, message and its fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            "pid": record.process,  # which worker process served it
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info and record.exc_info[0] is not None:
            # The exception type only: messages and tracebacks of database errors can
            # quote parameters, which may come from protected rows.
            line["exception"] = record.exc_info[0].__name__
        return json.dumps(line, default=str, ensure_ascii=False)


#: Loggers of the libraries dpgate runs on that write to stderr when they have something
#: to say: their records become JSON lines too (Python warnings, pyspark's and Py4J's).
ENGINE_LOGGERS = ("py.warnings", "pyspark", "py4j")


def configure_logging(level: int | str = logging.INFO) -> None:
    """Send dpgate's logs to stderr as JSON lines (idempotent); Python warnings and the
    Spark client's log records go there as JSON lines too (``ENGINE_LOGGERS``, WARNING
    and above), never as free text between them. The JVM's own log is kept off stderr
    by the Spark driver (``gateway/sql/engines/spark_dbapi.py``).

    Records still propagate to the root logger, so an embedding application's logging
    (or pytest's ``caplog``) sees them too; under ``dpgate serve`` the root logger has no
    handler and each record is written once.
    """
    logger = logging.getLogger("dpgate")
    logger.setLevel(level)
    _json_handler(logger)
    logging.captureWarnings(True)
    for name in ENGINE_LOGGERS:
        engine_logger = logging.getLogger(name)
        if engine_logger.level == logging.NOTSET:
            engine_logger.setLevel(logging.WARNING)
        _json_handler(engine_logger)


def _json_handler(logger: logging.Logger) -> None:
    if not any(getattr(h, "_dpgate", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        handler._dpgate = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def log_request(entry: RequestLog) -> None:
    """Write the request's line to the ``dpgate.access`` logger."""
    fields = {k: v for k, v in vars(entry).items() if v is not None}
    if entry.epsilon_spent is not None:
        fields["epsilon_spent"] = float(f"{entry.epsilon_spent:.{JSON_DIGITS}g}")
    level = logging.ERROR if entry.status >= 500 else logging.INFO
    logging.getLogger(ACCESS_LOGGER).log(level, "request", extra={"fields": fields})
