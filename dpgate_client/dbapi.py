"""PEP 249 (DB-API 2.0) driver for dpgate, over its HTTP API.

>>> from dpgate_client import dbapi
>>> conn = dbapi.connect("dpgate://analyst:KEY@127.0.0.1:8000?epsilon=0.5")
>>> cur = conn.cursor()
>>> cur.execute("SELECT sex, COUNT(*) AS n FROM patients WHERE age >= :age GROUP BY sex",
...             {"age": 65})
>>> cur.fetchall(), cur.accuracy["n"].ci95_halfwidth, cur.privacy.epsilon

Module globals: ``apilevel = "2.0"``, ``threadsafety = 2`` (threads may share the
module and connections, not cursors: a connection holds no socket), ``paramstyle =
"named"`` (``:name`` with a mapping; a sequence binds ``?`` placeholders). Parameters
are rendered client-side as SQL literals by ``dpgate_client.binding`` — scalars only;
see that module for the exact rules.

Transactions: there are none. ``commit()`` and ``rollback()`` are no-ops (every query
is read-only and its privacy cost is final once answered).

Extensions beyond PEP 249, on the cursor after ``execute``: ``privacy`` (what the
answer cost), ``accuracy`` (column → 95% half-width and stddev), ``budget`` (what is
left), ``query_id``, ``cached`` and ``result`` (the whole ``QueryResult``).
``execute`` also takes keyword-only ``epsilon``, ``delta``, ``mechanism`` and
``dry_run``; connection-wide defaults come from ``connect(...)`` or the URL query.
"""

from __future__ import annotations

import datetime as dt
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dpgate_client.binding import bind
from dpgate_client.client import Client
from dpgate_client.errors import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
)
from dpgate_client.results import Accuracy, Budget, Privacy, QueryResult
from dpgate_client.transport import DEFAULT_TIMEOUT

__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "Binary",
    "Connection",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Date",
    "DateFromTicks",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Time",
    "TimeFromTicks",
    "Timestamp",
    "TimestampFromTicks",
    "Warning",
    "apilevel",
    "connect",
    "paramstyle",
    "parse_url",
    "threadsafety",
]

apilevel = "2.0"
threadsafety = 2
paramstyle = "named"

# --- PEP 249 type objects and constructors ----------------------------------------------


class DBAPITypeObject:
    """Compares equal to every gateway type name in its group (PEP 249 type objects)."""

    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other.lower() in self.names
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return hash(self.names)

    def __repr__(self) -> str:
        return f"DBAPITypeObject{tuple(sorted(self.names))}"


STRING = DBAPITypeObject("text", "string", "varchar")
BINARY = DBAPITypeObject("binary", "blob")
NUMBER = DBAPITypeObject("integer", "real", "float", "numeric", "decimal", "boolean")
DATETIME = DBAPITypeObject("date", "timestamp", "datetime", "time")
ROWID = DBAPITypeObject("rowid")

Date = dt.date
Time = dt.time
Timestamp = dt.datetime


def DateFromTicks(ticks: float) -> dt.date:
    return dt.date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> dt.time:
    return dt.time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> dt.datetime:
    return dt.datetime(*time.localtime(ticks)[:6])


def Binary(value: bytes) -> bytes:
    """PEP 249 constructor; dpgate refuses binary parameters when they are bound."""
    return bytes(value)


# --- URLs --------------------------------------------------------------------------------

_SCHEMES = {"dpgate": "http", "dpgate+http": "http", "dpgate+https": "https"}
_OPTIONS = ("epsilon", "delta", "mechanism", "timeout", "verify", "ca_file")


def parse_url(url: str) -> dict[str, Any]:
    """Split a ``dpgate://KEY@host:port/prefix?epsilon=…`` URL into ``connect`` arguments.

    The key is the URL's password if it has one (``dpgate://analyst:KEY@host``, which
    BI tools mask) and its username otherwise (``dpgate://KEY@host``). ``http(s)://``
    URLs are taken as the gateway's base URL (give the key separately).
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    query = dict(urllib.parse.parse_qsl(parts.query))
    unknown = set(query) - set(_OPTIONS)
    if unknown:
        raise InterfaceError(
            f"unknown option(s) in the dpgate URL: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(_OPTIONS)})",
            code="invalid_url",
        )
    result: dict[str, Any] = dict(query)
    if scheme in ("http", "https"):
        result["url"] = urllib.parse.urlunsplit((scheme, parts.netloc, parts.path, "", ""))
        return result
    if scheme not in _SCHEMES or not parts.hostname:
        raise InterfaceError(
            f"not a dpgate URL: expected dpgate://KEY@host:port, dpgate+https://KEY@host "
            f"or http(s)://host:port, got scheme {parts.scheme!r}",
            code="invalid_url",
        )
    key = parts.password if parts.password else parts.username
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    result["url"] = urllib.parse.urlunsplit((_SCHEMES[scheme], netloc, parts.path, "", ""))
    if key:
        result["key"] = urllib.parse.unquote(key)
    return result


def _as_float(name: str, value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InterfaceError(
            f"{name} must be a number, got {value!r}", code="invalid_url"
        ) from None


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off")
    return bool(value)


def connect(
    url: str | None = None,
    *,
    key: str | None = None,
    host: str | None = None,
    port: int | None = None,
    scheme: str = "http",
    path: str = "",
    epsilon: float | str | None = None,
    delta: float | str | None = None,
    mechanism: str | None = None,
    timeout: float | str | None = None,
    verify: bool | str | None = None,
    ca_file: str | None = None,
) -> Connection:
    """Open a DB-API connection to a gateway (no network traffic until the first query).

    Either ``url`` (``dpgate://KEY@host:port``, ``dpgate+https://…`` or
    ``http(s)://host:port`` with ``key=``) or ``host``/``port``/``scheme``/``key``.
    ``epsilon``/``delta``/``mechanism`` are the per-query privacy defaults for every
    cursor of this connection (the gateway's own defaults when left out).
    """
    options: dict[str, Any] = {}
    if url is not None:
        options = parse_url(url)
    elif host is not None:
        netloc = f"[{host}]" if ":" in host else host
        if port is not None:
            netloc += f":{int(port)}"
        options["url"] = f"{scheme}://{netloc}{path}"
    else:
        raise InterfaceError("connect() needs a url or a host", code="invalid_url")
    # Explicit keyword arguments win over what the URL says.
    explicit = {
        "key": key,
        "epsilon": epsilon,
        "delta": delta,
        "mechanism": mechanism,
        "ca_file": ca_file,
        "timeout": timeout,
        "verify": verify,
    }
    options.update({k: v for k, v in explicit.items() if v is not None})
    client = Client(
        options["url"],
        options.get("key"),
        timeout=_as_float("timeout", options.get("timeout")) or DEFAULT_TIMEOUT,
        verify=_as_bool(options.get("verify", True)),
        ca_file=options.get("ca_file"),
    )
    return Connection(
        client,
        epsilon=_as_float("epsilon", options.get("epsilon")),
        delta=_as_float("delta", options.get("delta")),
        mechanism=options.get("mechanism") or None,
    )


# --- Connection and Cursor ---------------------------------------------------------------


class Connection:
    """A DB-API connection: a ``Client`` plus per-query privacy defaults.

    It holds no socket, so ``close()`` only marks it closed; ``commit`` and
    ``rollback`` are no-ops because every request is a read-only, self-contained query.
    """

    # PEP 249 optional extension: the exception classes as connection attributes.
    Warning = Warning
    Error = Error
    InterfaceError = InterfaceError
    DatabaseError = DatabaseError
    DataError = DataError
    OperationalError = OperationalError
    IntegrityError = IntegrityError
    InternalError = InternalError
    ProgrammingError = ProgrammingError
    NotSupportedError = NotSupportedError

    def __init__(
        self,
        client: Client,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
    ) -> None:
        self.client = client
        self.epsilon = epsilon
        self.delta = delta
        self.mechanism = mechanism
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<dpgate Connection to {self.client.url} ({state})>"

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the connection is closed", code="connection_closed")

    def close(self) -> None:
        self._closed = True

    def commit(self) -> None:
        self._check_open()

    def rollback(self) -> None:
        # No transactions to undo; SQLAlchemy's pool calls this on every check-in.
        pass

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def ping(self) -> bool:
        """Check that the gateway answers and accepts the key (spends nothing)."""
        self._check_open()
        self.client.budget()
        return True

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


Description = tuple[str, str, None, None, None, None, bool]


class Cursor:
    """A DB-API cursor over released answers (the whole answer arrives at once)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self.result: QueryResult | None = None
        self._rows: Sequence[tuple[Any, ...]] = ()
        self._position = 0
        self._closed = False
        self.rowcount = -1
        self.lastrowid: None = None

    # -- PEP 249 attributes

    @property
    def description(self) -> tuple[Description, ...] | None:
        """(name, type_code, None, None, None, None, null_ok) per column; None before
        a query. ``type_code`` is the gateway type name and compares equal to
        ``STRING``/``NUMBER``/``DATETIME``."""
        if self.result is None or not self.result.columns:
            return None
        return tuple((c.name, c.type, None, None, None, None, True) for c in self.result.columns)

    @property
    def rownumber(self) -> int | None:
        return None if self.result is None else self._position

    # -- dpgate extensions

    @property
    def privacy(self) -> Privacy | None:
        """What the last answer cost (mechanism, ε, δ, ρ)."""
        return None if self.result is None else self.result.privacy

    @property
    def accuracy(self) -> Mapping[str, Accuracy]:
        """Column → accuracy of the last answer's noisy values."""
        return {} if self.result is None else self.result.accuracy

    @property
    def budget(self) -> Budget | None:
        """The analyst's budget after the last answer."""
        return None if self.result is None else self.result.budget

    @property
    def query_id(self) -> str | None:
        return None if self.result is None else self.result.query_id

    @property
    def cached(self) -> bool:
        return False if self.result is None else self.result.cached

    # -- PEP 249 methods

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed", code="cursor_closed")
        self.connection._check_open()

    def close(self) -> None:
        self._closed = True
        self._rows = ()

    def execute(
        self,
        operation: str,
        parameters: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
        dry_run: bool = False,
    ) -> Cursor:
        """Send one query; its answer (all rows) is available to the fetch methods."""
        self._check_open()
        if not isinstance(operation, str):
            raise ProgrammingError("the operation must be SQL text (str)")
        sql = bind(operation, parameters)
        self.result = None
        self._rows, self._position, self.rowcount = (), 0, -1
        conn = self.connection
        result = conn.client.query(
            sql,
            epsilon=epsilon if epsilon is not None else conn.epsilon,
            delta=delta if delta is not None else conn.delta,
            mechanism=mechanism if mechanism is not None else conn.mechanism,
            dry_run=dry_run,
        )
        self.result = result
        self._rows = result.rows
        self.rowcount = len(result.rows)
        return self

    def executemany(
        self,
        operation: str,
        seq_of_parameters: Sequence[Mapping[str, Any] | Sequence[Any]],
    ) -> Cursor:
        """Run the query once per parameter set; the last answer stays fetchable.

        Each run is a separate query and is charged separately.
        """
        total = 0
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
            total += max(self.rowcount, 0)
        self.rowcount = total
        return self

    def _check_result(self) -> None:
        self._check_open()
        if self.result is None:
            raise InterfaceError("no query has been executed on this cursor", code="no_result")

    def fetchone(self) -> tuple[Any, ...] | None:
        self._check_result()
        if self._position >= len(self._rows):
            return None
        row = self._rows[self._position]
        self._position += 1
        return row

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        self._check_result()
        size = self.arraysize if size is None else size
        rows = list(self._rows[self._position : self._position + max(size, 0)])
        self._position += len(rows)
        return rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        self._check_result()
        rows = list(self._rows[self._position :])
        self._position = len(self._rows)
        return rows

    def callproc(self, procname: str, parameters: Sequence[Any] = ()) -> None:
        raise NotSupportedError("dpgate has no stored procedures")

    def nextset(self) -> None:
        return None

    def setinputsizes(self, sizes: Any) -> None:
        pass

    def setoutputsize(self, size: int, column: int | None = None) -> None:
        pass

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
