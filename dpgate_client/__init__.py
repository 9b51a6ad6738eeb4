"""dpgate's Python client, DB-API 2.0 driver and SQLAlchemy dialect (HTTP only).

- ``Client(url, key)`` — ``.query()``, ``.budget()``, ``.schema()`` returning frozen results.
- ``dpgate_client.dbapi`` — PEP 249 driver (``connect("dpgate://KEY@host:port")``).
- ``dpgate_client.dialect`` — SQLAlchemy dialect for ``dpgate://`` / ``dpgate+https://``.

The SQLAlchemy dialect is imported lazily, so the client works without SQLAlchemy.
"""

from dpgate_client.client import Client
from dpgate_client.errors import (
    AuditRefusedError,
    AuthenticationError,
    BudgetExhaustedError,
    ConflictError,
    ConnectionFailedError,
    DatabaseError,
    DatabaseUnavailableError,
    DataError,
    Error,
    ForbiddenError,
    IntegrityError,
    InterfaceError,
    InternalError,
    InvalidPrivacyParametersError,
    InvalidRequestError,
    LedgerUnavailableError,
    MethodNotAllowedError,
    NotFoundError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    RateLimitedError,
    ShuttingDownError,
    SQLSyntaxError,
    UnknownColumnError,
    UnknownTableError,
    UnsupportedQueryError,
    Warning,
)
from dpgate_client.results import (
    Accuracy,
    Budget,
    ColumnSchema,
    Privacy,
    QueryResult,
    ResultColumn,
    Schema,
    TableSchema,
)
from dpgate_client.transport import __version__

__all__ = [
    "Accuracy",
    "AuditRefusedError",
    "AuthenticationError",
    "Budget",
    "BudgetExhaustedError",
    "Client",
    "ColumnSchema",
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
    "Privacy",
    "ProgrammingError",
    "QueryResult",
    "RateLimitedError",
    "ResultColumn",
    "SQLSyntaxError",
    "Schema",
    "ShuttingDownError",
    "TableSchema",
    "UnknownColumnError",
    "UnknownTableError",
    "UnsupportedQueryError",
    "Warning",
    "__version__",
]
