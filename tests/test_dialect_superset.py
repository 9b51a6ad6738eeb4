"""The Superset engine spec, where Superset is installed (e.g. integration/superset.sh's venv)."""

from __future__ import annotations

import pytest

pytest.importorskip("superset.db_engine_specs.base", exc_type=ImportError)

import sqlalchemy as sa

from dpgate_client import errors
from dpgate_client.superset import DpgateEngineSpec


def test_the_spec_claims_dpgate_urls() -> None:
    assert DpgateEngineSpec.supports_url(sa.engine.make_url("dpgate://k@h:1"))
    assert DpgateEngineSpec.supports_url(sa.engine.make_url("dpgate+https://k@h"))
    assert not DpgateEngineSpec.allows_joins


def test_users_see_the_gateway_message_and_code() -> None:
    exc = errors.BudgetExhaustedError("Budget exhausted.", status=403)
    assert DpgateEngineSpec.extract_error_message(exc) == (
        "dpgate error: Budget exhausted. [dpgate: budget_exhausted]"
    )
    mapped = DpgateEngineSpec.get_dbapi_mapped_exception(exc)
    assert type(mapped).__name__ == "SupersetDBAPIOperationalError"
    assert "budget_exhausted" in str(mapped)


def test_errors_get_superset_error_types() -> None:
    from flask import Flask
    from flask_babel import Babel

    app = Flask("superset-spec-test")
    Babel(app)  # Superset's issue codes are translatable strings
    syntax = errors.SQLSyntaxError("Unexpected FORM.", detail={"line": 1, "column": 17})
    with app.app_context():  # extract_errors reads app.config
        (extracted,) = DpgateEngineSpec.extract_errors(syntax)
        (generic,) = DpgateEngineSpec.extract_errors(errors.AuditRefusedError("Refused."))
    assert extracted.error_type == "SYNTAX_ERROR"
    assert extracted.message.startswith("Unexpected FORM. (line 1, column 17)")
    assert generic.error_type == "GENERIC_DB_ENGINE_ERROR" and "audit_refused" in generic.message
