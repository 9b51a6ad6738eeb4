"""dpgate's error codes as PostgreSQL SQLSTATEs, for ErrorResponse messages.

The message of an ErrorResponse is dpgate's own; its detail field is the JSON
``{"code", "detail"}`` that the HTTP API puts in its error envelope, so a client can
tell a ``budget_exhausted`` from an ``audit_refused`` without parsing text.
"""

from __future__ import annotations

from gateway.core.errors import GatewayError

#: SQLSTATE per dpgate error code (PostgreSQL documentation, Appendix A).
SQLSTATE_OF_CODE: dict[str, str] = {
    "invalid_request": "22023",  # invalid_parameter_value
    "sql_syntax": "42601",  # syntax_error
    "unsupported_query": "0A000",  # feature_not_supported
    "unknown_table": "42P01",  # undefined_table
    "unknown_column": "42703",  # undefined_column
    "invalid_privacy_parameters": "22023",  # invalid_parameter_value
    "unauthenticated": "28P01",  # invalid_password
    "forbidden": "42501",  # insufficient_privilege
    "budget_exhausted": "53400",  # configuration_limit_exceeded: the configured budget
    "audit_refused": "42501",  # insufficient_privilege
    "not_found": "42704",  # undefined_object
    "method_not_allowed": "0A000",
    "conflict": "23505",
    "rate_limited": "53000",  # insufficient_resources
    "database_unavailable": "58000",  # system_error (not 08xxx: the connection is fine)
    "ledger_unavailable": "58000",
    "shutting_down": "57P01",  # admin_shutdown: PostgreSQL's own, for a server stopping
    "internal": "XX000",  # internal_error
}

#: Errors of the wire front end itself, by class name (not dpgate codes).
SQLSTATE_OF_CLASS: dict[str, str] = {
    "MemoryLimit": "54000",  # program_limit_exceeded
    "InFailedTransaction": "25P02",  # in_failed_sql_transaction
    "UnknownSetting": "42704",  # undefined_object
    "ParameterError": "22P02",  # invalid_text_representation
    "CancelledQuery": "57014",  # query_canceled
    "UndefinedFunction": "42883",  # undefined_function (a catalogue function not emulated)
}


def sqlstate_of(error: GatewayError) -> str:
    """The SQLSTATE an ErrorResponse carries for ``error``."""
    return SQLSTATE_OF_CLASS.get(type(error).__name__) or SQLSTATE_OF_CODE.get(error.code, "XX000")
