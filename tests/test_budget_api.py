"""The public API of ``budget`` (what the gateway imports) is pinned here."""

from __future__ import annotations

import inspect

import budget


def test_public_names_are_pinned() -> None:
    assert sorted(budget.__all__) == sorted(
        [
            "COMPOSITIONS",
            "DEFAULT_SELECTION_SHARE",
            "GLOBAL_NAME",
            "PERIODS",
            "SCHEMA_VERSION",
            "SLACK",
            "Accountant",
            "Accounting",
            "Analyst",
            "AnalystDisabled",
            "AnalystExists",
            "ADMIN_ROLES",
            "AdminCaller",
            "AdminPrincipal",
            "AdminRole",
            "AuditEntry",
            "BudgetExhausted",
            "BudgetStatus",
            "CacheProbe",
            "Charge",
            "CombinedFilter",
            "CompositionName",
            "HistoryEntry",
            "HistoryOutcome",
            "Ledger",
            "LedgerError",
            "LedgerUnavailable",
            "Lookup",
            "Outcome",
            "Period",
            "PureFilter",
            "Quote",
            "Refusal",
            "ReleaseEntry",
            "Reservation",
            "ReservationSettled",
            "SchemaTooNew",
            "Spent",
            "UnknownAnalyst",
            "UnsupportedCost",
            "ZcdpFilter",
            "accountant",
            "cks_epsilon",
            "zcdp_rho_budget",
        ]
    )
    for name in budget.__all__:
        assert hasattr(budget, name), name


def test_ledger_signatures_match_the_architecture_contract() -> None:
    def params(fn: object) -> list[str]:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]

    L = budget.Ledger
    assert params(L.reserve) == [
        "self", "analyst", "cost", "query_key", "sql", "mechanism", "data_version"
    ]  # fmt: skip
    assert params(L.commit) == ["self", "reservation", "release", "outcome", "reason", "wait"]
    assert params(L.refund) == ["self", "reservation", "reason"]
    assert params(L.find_release) == ["self", "query_key", "analyst", "data_version"]
    assert params(L.create_analyst) == ["self", "name", "epsilon", "delta", "period", "caller"]
    assert params(L.update_analyst) == [
        "self", "name", "epsilon", "delta", "disabled", "period", "caller"
    ]  # fmt: skip
    assert params(L.rotate_key) == ["self", "name", "caller"]
    assert params(L.quote) == ["self", "analyst", "cost", "mechanism"]
    assert params(L.set_global_budget) == ["self", "epsilon", "delta", "period", "caller"]
    assert params(L.audit_log) == ["self", "analyst", "since", "until", "limit", "actor"]
    assert params(L.log_request)[1:] == [
        "request_id", "analyst", "endpoint", "sql", "outcome", "error_code", "status",
        "actor", "action", "params",
    ]  # fmt: skip
    assert params(L.verify_audit_log) == ["self", "anchor", "kept"]
    assert params(L.export_audit_log) == ["self", "after"]


def test_budget_knows_nothing_of_http_or_the_gateway() -> None:
    import pathlib

    for path in pathlib.Path(budget.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "import flask" not in text and "from flask" not in text, path
        assert "from gateway" not in text and "import gateway" not in text, path
