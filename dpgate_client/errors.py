"""The exceptions the dpgate client raises: PEP 249's tree, one leaf per gateway error code.

Every error the gateway sends has one shape, ``{"ok": false, "status": N, "error":
{"code", "message", "detail"}}``; the client raises the class registered for its
``code`` and keeps ``code``, ``status``, ``message`` and ``detail`` on the exception.
``str(exc)`` is the gateway's message followed by the code, readable by a dashboard
user (Superset and Jupyter show it verbatim)::

    Warning                              (PEP 249; never raised by dpgate)
    Error                                PEP 249 root; catch this to catch everything
    ├── InterfaceError                   misuse of the client: closed cursor, bad URL,
    │                                    a response that is not dpgate's JSON
    └── DatabaseError                    the gateway refused or failed the request
        ├── DataError                    (PEP 249; not used)
        ├── IntegrityError               (PEP 249; not used)
        ├── NotSupportedError            a DB-API feature dpgate has no use for
        ├── InternalError                500 internal (detail: a request id)
        ├── ProgrammingError             400: fix the SQL or the request
        │   ├── InvalidRequestError          invalid_request
        │   ├── SQLSyntaxError               sql_syntax (detail: line, column)
        │   ├── UnsupportedQueryError        unsupported_query (names the construct)
        │   ├── UnknownTableError            unknown_table
        │   ├── UnknownColumnError           unknown_column
        │   └── InvalidPrivacyParametersError invalid_privacy_parameters
        └── OperationalError             the request was fine; the gateway would not or
            │                            could not answer it now
            ├── ConnectionFailedError        no HTTP answer (refused, timeout, TLS)
            ├── AuthenticationError          401 unauthenticated
            ├── ForbiddenError               403 forbidden
            ├── BudgetExhaustedError         403 budget_exhausted
            ├── AuditRefusedError            403 audit_refused
            ├── NotFoundError                404 not_found (wrong URL prefix, no such
            │                                analyst)
            ├── MethodNotAllowedError        405 method_not_allowed
            ├── ConflictError                409 conflict (e.g. analyst name taken)
            ├── RateLimitedError             429 rate_limited
            ├── DatabaseUnavailableError     503 database_unavailable
            ├── LedgerUnavailableError       503 ledger_unavailable
            └── ShuttingDownError            503 shutting_down (the server is stopping;
                                             nothing was run: send it again)

Every code the gateway can send has its class here (``tests/test_client.py`` pins the
map against the gateway's own list). The base classes are named exactly as PEP 249
names them, so SQLAlchemy wraps them
into its own ``sqlalchemy.exc.ProgrammingError`` / ``OperationalError`` / … and keeps
the original as ``.orig``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = [
    "AuditRefusedError",
    "AuthenticationError",
    "BudgetExhaustedError",
    "ConflictError",
    "ConnectionFailedError",
    "DataError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "Error",
    "ForbiddenError",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "InvalidPrivacyParametersError",
    "InvalidRequestError",
    "LedgerUnavailableError",
    "MethodNotAllowedError",
    "NotFoundError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "RateLimitedError",
    "SQLSyntaxError",
    "ShuttingDownError",
    "UnknownColumnError",
    "UnknownTableError",
    "UnsupportedQueryError",
    "Warning",
    "error_from_response",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Warning(Exception):  # the name PEP 249 requires
    """PEP 249 warning; dpgate never raises it."""


class Error(Exception):
    """Root of every error the dpgate client raises.

    ``code`` is the gateway's stable error code (or a client-side one such as
    ``connection_failed``), ``status`` the HTTP status (``None`` when no HTTP answer
    arrived), ``message`` the human sentence, ``detail`` the structured detail.
    """

    code: str = "error"
    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.detail: Mapping[str, Any] = MappingProxyType(dict(detail)) if detail else _EMPTY

    def __str__(self) -> str:
        where = ""
        line, column = self.detail.get("line"), self.detail.get("column")
        if line is not None and column is not None and f"line {line}" not in self.message:
            where = f" (line {line}, column {column})"
        return f"{self.message}{where} [dpgate: {self.code}]"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, "
            f"message={self.message!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the keyword-only state across pickling (Superset's async workers pickle).
        return (
            _rebuild,
            (type(self), self.message, self.code, self.status, dict(self.detail)),
        )


def _rebuild(
    cls: type[Error], message: str, code: str, status: int | None, detail: dict[str, Any]
) -> Error:
    return cls(message, code=code, status=status, detail=detail)


class InterfaceError(Error):
    """The client was misused, or the server's answer is not dpgate's JSON."""

    code = "interface_error"


class DatabaseError(Error):
    """The gateway refused or failed the request."""

    code = "database_error"


class DataError(DatabaseError):
    """PEP 249 class for problems with processed data; not used by dpgate."""


class IntegrityError(DatabaseError):
    """PEP 249 class for relational integrity failures; not used by dpgate."""


class NotSupportedError(DatabaseError):
    """A DB-API feature dpgate does not offer (transactions, binary parameters, …)."""

    code = "not_supported"


class InternalError(DatabaseError):
    """The gateway failed internally; ``detail`` carries only a request id."""

    code = "internal"
    status = 500


class ProgrammingError(DatabaseError):
    """The request is wrong: fix the SQL, the parameters or the privacy settings."""

    code = "invalid_request"
    status = 400


class InvalidRequestError(ProgrammingError):
    """The request body is malformed."""

    code = "invalid_request"


class SQLSyntaxError(ProgrammingError):
    """The SQL does not parse; ``detail`` has ``line`` and ``column``."""

    code = "sql_syntax"


class UnsupportedQueryError(ProgrammingError):
    """The SQL parses but is outside what dpgate can answer privately; the message
    names the construct and what to ask instead."""

    code = "unsupported_query"


class UnknownTableError(ProgrammingError):
    """The query names a table that is not declared public."""

    code = "unknown_table"


class UnknownColumnError(ProgrammingError):
    """The query names a column that is not declared public."""

    code = "unknown_column"


class InvalidPrivacyParametersError(ProgrammingError):
    """epsilon / delta / mechanism are out of range or inconsistent."""

    code = "invalid_privacy_parameters"


class OperationalError(DatabaseError):
    """The request was valid, but the gateway would not or could not answer it now."""

    code = "operational_error"


class ConnectionFailedError(OperationalError):
    """No HTTP answer arrived: connection refused, timeout or TLS failure."""

    code = "connection_failed"


class AuthenticationError(OperationalError):
    """The API key is missing, wrong, rotated or disabled."""

    code = "unauthenticated"
    status = 401


class ForbiddenError(OperationalError):
    """The key is valid but may not do this."""

    code = "forbidden"
    status = 403


class BudgetExhaustedError(OperationalError):
    """Answering would overspend the analyst's (or the dataset's) privacy budget."""

    code = "budget_exhausted"
    status = 403


class AuditRefusedError(OperationalError):
    """The auditor refused: with earlier answers this query would single out a
    small group. Nothing was released and (if refused before execution) nothing spent.
    ``groups`` names those groups (WHERE clauses); ``ask_instead`` lists queries to
    send instead, as they are (the query with COUNT(*) added, each group's own count)."""

    code = "audit_refused"
    status = 403

    @property
    def charged(self) -> bool:
        return bool(self.detail.get("charged"))

    @property
    def groups(self) -> list[str]:
        return [str(g) for g in self.detail.get("groups") or ()]

    @property
    def ask_instead(self) -> list[str]:
        return [str(q) for q in self.detail.get("ask_instead") or ()]


class NotFoundError(OperationalError):
    """No such endpoint or object: often a gateway URL with a wrong path prefix."""

    code = "not_found"
    status = 404


class MethodNotAllowedError(OperationalError):
    """The endpoint exists, but not with this HTTP method."""

    code = "method_not_allowed"
    status = 405


class ConflictError(OperationalError):
    """The request conflicts with existing state (e.g. an analyst name already taken)."""

    code = "conflict"
    status = 409


class RateLimitedError(OperationalError):
    """Too many requests; ``retry_after`` says in how many seconds to retry (if known)."""

    code = "rate_limited"
    status = 429

    @property
    def retry_after(self) -> float | None:
        value = self.detail.get("retry_after")
        return float(value) if isinstance(value, int | float) else None


class DatabaseUnavailableError(OperationalError):
    """The protected database did not answer. If the query never reached it, nothing was
    spent; if it did (``charged`` is true), the query stays charged and nothing was
    released — the gateway does not say why, since that could depend on the data."""

    code = "database_unavailable"
    status = 503

    @property
    def charged(self) -> bool:
        return bool(self.detail.get("charged"))


class LedgerUnavailableError(OperationalError):
    """The budget ledger did not answer; nothing was released."""

    code = "ledger_unavailable"
    status = 503


class ShuttingDownError(OperationalError):
    """The gateway instance is stopping (SIGTERM) and did not run the request: nothing
    was released or spent, so sending it again is safe — to another instance behind the
    same address, or to this one once it is back (the answer says ``Retry-After: 1``)."""

    code = "shutting_down"
    status = 503


#: The class for each error code the gateway sends.
_BY_CODE: Mapping[str, type[Error]] = MappingProxyType(
    {
        cls.code: cls
        for cls in (
            InvalidRequestError,
            SQLSyntaxError,
            UnsupportedQueryError,
            UnknownTableError,
            UnknownColumnError,
            InvalidPrivacyParametersError,
            AuthenticationError,
            ForbiddenError,
            BudgetExhaustedError,
            AuditRefusedError,
            NotFoundError,
            MethodNotAllowedError,
            ConflictError,
            RateLimitedError,
            DatabaseUnavailableError,
            LedgerUnavailableError,
            ShuttingDownError,
            InternalError,
        )
    }
)


def _class_for_status(status: int) -> type[Error]:
    """The class for a code this client does not know, chosen from the HTTP status."""
    if status in (401, 403, 404, 405, 408, 409, 429) or status >= 502:
        return OperationalError
    if 400 <= status < 500:
        return ProgrammingError
    if status >= 500:
        return InternalError
    return DatabaseError


def error_from_response(status: int, body: Any) -> Error:
    """Build the exception for one non-``ok`` HTTP answer (parsed JSON or raw text)."""
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        error = body["error"]
        code = str(error.get("code") or "")
        message = str(error.get("message") or code or f"HTTP {status}")
        detail = error.get("detail")
        status = int(body.get("status") or status)
        cls = _BY_CODE.get(code) or _class_for_status(status)
        return cls(
            message,
            code=code or cls.code,
            status=status,
            detail=detail if isinstance(detail, Mapping) else None,
        )
    text = body if isinstance(body, str) else ""
    snippet = " ".join(text.split())[:200]
    cls = _class_for_status(status)
    message = f"the gateway answered HTTP {status} without a dpgate error body"
    if snippet:
        message += f": {snippet}"
    return cls(message, code=f"http_{status}", status=status)
