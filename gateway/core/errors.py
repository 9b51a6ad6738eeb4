"""The errors dpgate reports, each with a stable code and an HTTP status.

Every error an analyst, an admin or a BI tool can see is a ``GatewayError``; the HTTP
layer renders all of them in one envelope
``{"ok": false, "status": N, "error": {"code", "message", "detail"}}``.
Messages and details never carry values read from protected rows.

    GatewayError (500 internal)
    ├── InvalidRequest (400 invalid_request)        malformed body, wrong JSON types
    │   ├── SqlSyntaxError (400 sql_syntax)         with line and column
    │   ├── UnsupportedQuery (400 unsupported_query) names the construct
    │   ├── UnknownTable (400 unknown_table)
    │   ├── UnknownColumn (400 unknown_column)
    │   └── InvalidPrivacyParameters (400 invalid_privacy_parameters)
    ├── Unauthenticated (401 unauthenticated)       no key, or a key nobody has
    ├── Forbidden (403 forbidden)                   wrong role, disabled analyst
    ├── BudgetExhausted (403 budget_exhausted)      the query does not fit the budget
    ├── AuditRefused (403 audit_refused)            differencing would single people out
    ├── NotFound (404 not_found)                    no such endpoint or analyst
    ├── MethodNotAllowed (405 method_not_allowed)
    ├── Conflict (409 conflict)                     e.g. an analyst name already taken
    ├── RateLimited (429 rate_limited)
    ├── DatabaseUnavailable (503 database_unavailable)
    ├── LedgerUnavailable (503 ledger_unavailable)
    └── ShuttingDown (503 shutting_down)           ``dpgate serve`` is stopping
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    """Root of every error dpgate reports; the plain class is an internal error."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail: dict[str, Any] = detail

    def to_dict(self) -> dict[str, Any]:
        """The error envelope, exactly as the HTTP layer sends it."""
        return {
            "ok": False,
            "status": self.status,
            "error": {"code": self.code, "message": self.message, "detail": self.detail},
        }


class InvalidRequest(GatewayError):
    """The request itself is malformed: not JSON, wrong field types, unknown fields."""

    code = "invalid_request"
    status = 400


class SqlSyntaxError(InvalidRequest):
    """The SQL does not parse; ``detail`` has ``line`` and ``column`` (1-based)."""

    code = "sql_syntax"


class UnsupportedQuery(InvalidRequest):
    """The SQL parses but is outside the supported subset; ``detail.construct`` names why."""

    code = "unsupported_query"


class UnknownTable(InvalidRequest):
    """The query names a table that is not declared in the config."""

    code = "unknown_table"


class UnknownColumn(InvalidRequest):
    """The query names a column that is not declared for its table."""

    code = "unknown_column"


class InvalidPrivacyParameters(InvalidRequest):
    """ε, δ or the mechanism are invalid, or above what the config allows per query."""

    code = "invalid_privacy_parameters"


class Unauthenticated(GatewayError):
    """No bearer key, or one that matches no analyst and is not the admin key."""

    code = "unauthenticated"
    status = 401


class Forbidden(GatewayError):
    """The key is valid but may not do this (analyst on an admin endpoint, disabled)."""

    code = "forbidden"
    status = 403


class BudgetExhausted(GatewayError):
    """The query's cost does not fit what remains of the analyst's (or global) budget."""

    code = "budget_exhausted"
    status = 403


class AuditRefused(GatewayError):
    """The auditor refused: with earlier answers, this one would pin down a small group."""

    code = "audit_refused"
    status = 403


class NotFound(GatewayError):
    """No such endpoint or object."""

    code = "not_found"
    status = 404


class MethodNotAllowed(GatewayError):
    """The endpoint exists but not with this HTTP method."""

    code = "method_not_allowed"
    status = 405


class Conflict(GatewayError):
    """The request conflicts with existing state (e.g. an analyst name already taken)."""

    code = "conflict"
    status = 409


class RateLimited(GatewayError):
    """Too many requests; ``detail.retry_after`` says when to try again (seconds)."""

    code = "rate_limited"
    status = 429


class DatabaseUnavailable(GatewayError):
    """The protected database failed or timed out; nothing was released or charged."""

    code = "database_unavailable"
    status = 503


class LedgerUnavailable(GatewayError):
    """The ledger database failed; nothing was released."""

    code = "ledger_unavailable"
    status = 503


class ShuttingDown(GatewayError):
    """``dpgate serve`` is stopping: a connection accepted after SIGTERM is answered with
    this (``Retry-After: 1``, ``Connection: close``) instead of being reset. The request
    was not read by the gateway, so nothing was run or charged; send it again (to
    another instance, or to this one once it is back)."""

    code = "shutting_down"
    status = 503


ALL_ERRORS: tuple[type[GatewayError], ...] = (
    GatewayError,
    InvalidRequest,
    SqlSyntaxError,
    UnsupportedQuery,
    UnknownTable,
    UnknownColumn,
    InvalidPrivacyParameters,
    Unauthenticated,
    Forbidden,
    BudgetExhausted,
    AuditRefused,
    NotFound,
    MethodNotAllowed,
    Conflict,
    RateLimited,
    DatabaseUnavailable,
    LedgerUnavailable,
    ShuttingDown,
)
