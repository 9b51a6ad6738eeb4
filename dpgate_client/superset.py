"""Apache Superset engine spec for dpgate (loaded by Superset only, never by dpgate).

Superset works with dpgate through the SQLAlchemy dialect alone (it falls back to its
generic engine spec). This spec, registered under the ``superset.db_engine_specs``
entry point, adds what the generic one cannot know:

- the name "dpgate" and a URI placeholder in Superset's database form;
- no joins or file uploads (dpgate answers one table at a time, read-only);
- aggregates are never hidden in ORDER BY: Superset then puts a sort metric in the
  SELECT list, which is the query shape dpgate's analyzer reads;
- error messages shown to users keep dpgate's code (``[dpgate: budget_exhausted]``),
  and syntax / unknown column / unknown table / bad key errors get Superset's own error
  types (and their issue codes and UI).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from superset.db_engine_specs.base import BaseEngineSpec
from superset.errors import SupersetErrorType

from dpgate_client import errors


class DpgateEngineSpec(BaseEngineSpec):
    """Superset's view of dpgate: a read-only, single-table, aggregate-only SQL engine."""

    engine = "dpgate"
    engine_name = "dpgate (differentially private gateway)"
    drivers: ClassVar[dict[str, str]] = {"http": "dpgate over HTTP", "https": "dpgate over HTTPS"}
    default_driver = "http"
    sqlalchemy_uri_placeholder = "dpgate://analyst:API_KEY@host:8080?epsilon=0.1"

    allows_joins = False
    allows_subqueries = True  # SELECT … FROM (<aggregate query>) AS virtual_table
    allows_alias_in_select = True
    allows_alias_in_orderby = True
    allows_hidden_orderby_agg = False
    allows_cte_in_subquery = False
    supports_file_upload = False
    disable_ssh_tunneling = True
    supports_dynamic_schema = False

    # The user sees the gateway's own sentence (an empty message keeps it); the type
    # selects Superset's issue code and UI.
    custom_errors: ClassVar[dict[re.Pattern[str], tuple[str, Any, dict[str, Any]]]] = {
        re.compile(r"\[dpgate: sql_syntax\]"): ("", SupersetErrorType.SYNTAX_ERROR, {}),
        re.compile(r"\[dpgate: unknown_column\]"): (
            "",
            SupersetErrorType.COLUMN_DOES_NOT_EXIST_ERROR,
            {},
        ),
        re.compile(r"\[dpgate: unknown_table\]"): (
            "",
            SupersetErrorType.TABLE_DOES_NOT_EXIST_ERROR,
            {},
        ),
        re.compile(r"\[dpgate: unauthenticated\]"): (
            "",
            SupersetErrorType.CONNECTION_ACCESS_DENIED_ERROR,
            {},
        ),
        re.compile(r"\[dpgate: connection_failed\]"): (
            "",
            SupersetErrorType.CONNECTION_HOST_DOWN_ERROR,
            {},
        ),
    }

    @classmethod
    def _extract_error_message(cls, ex: Exception) -> str:
        original = getattr(ex, "orig", ex)
        if isinstance(original, errors.Error):
            return str(original)
        return str(super()._extract_error_message(ex))

    @classmethod
    def get_dbapi_exception_mapping(cls) -> dict[type[Exception], type[Exception]]:
        from superset.db_engine_specs.exceptions import (
            SupersetDBAPIDatabaseError,
            SupersetDBAPIOperationalError,
            SupersetDBAPIProgrammingError,
        )

        mapping: dict[type[Exception], Any] = {
            errors.ProgrammingError: SupersetDBAPIProgrammingError,
            errors.OperationalError: SupersetDBAPIOperationalError,
            errors.DatabaseError: SupersetDBAPIDatabaseError,
        }
        return mapping

    @classmethod
    def get_dbapi_mapped_exception(cls, exception: Exception) -> Exception:
        # Superset looks the exact type up; dpgate raises leaves of a tree.
        mapping = cls.get_dbapi_exception_mapping()
        for klass in type(exception).__mro__:
            if klass in mapping:
                mapped: Exception = mapping[klass](str(exception))
                return mapped
        return super().get_dbapi_mapped_exception(exception)
