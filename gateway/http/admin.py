"""Admin endpoints: analysts, their budgets and keys, and the request audit log.

``admin_bp`` is registered by the app factory under ``/v1/admin``. Every endpoint needs
``Authorization: Bearer <admin key>`` where the admin key is ``DPGATE_ADMIN_KEY`` from
the environment (compared in constant time): no key or a wrong key is ``unauthenticated``
(401); an analyst's key is ``forbidden`` (403).

    POST  /v1/admin/analysts                  {name, epsilon, delta, period?} → the new key (201)
    GET   /v1/admin/analysts                  every analyst's budget status (+ the global one)
    GET   /v1/admin/analysts/<name>           one analyst's budget status
    PATCH /v1/admin/analysts/<name>           {epsilon?, delta?, period?, disabled?}
    POST  /v1/admin/analysts/<name>/keys      rotate: a new API key, the old one stops working
    GET   /v1/admin/budget                    the dataset-wide budget (null if none)
    PATCH /v1/admin/budget                    {epsilon?, delta?, period?}
    GET   /v1/admin/audit-log                 ?analyst=&actor=&since=&until=&limit=
    POST  /v1/admin/admins                    {name, role} → the new admin's key (201)
    GET   /v1/admin/admins                    every named admin and role
    PATCH /v1/admin/admins/<name>             {role?, disabled?}

Admins: ``DPGATE_ADMIN_KEY`` is the bootstrap admin (named ``admin``); named admins, each
with its own key, have the role ``admin`` (everything) or ``auditor`` (every GET; any
other method is ``forbidden``, 403).

``period`` is ``day``, ``week``, ``month`` or ``none`` (the default): the budget renews at
the end of each period (UTC; ``budget/periods.py``).

Each admin request appends exactly one row to the ledger's audit log, naming the admin,
the action and its parameters (never a key): a change writes it in the change's own
transaction (``budget.AdminCaller``); a read, or a refused request, writes it after the
response (``gateway.pipeline.observation``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

import budget
from gateway.core.errors import (
    Conflict,
    InvalidRequest,
    LedgerUnavailable,
    NotFound,
)
from gateway.http.auth import record, require_admin
from gateway.http.openapi import array_of, document, ok_answer, register_schema
from gateway.pipeline.charges import ledger_errors

log = logging.getLogger("dpgate.admin")
admin_bp = Blueprint("admin", __name__)

MAX_AUDIT_LIMIT = 10_000
_AUDIT_ARGS = ("analyst", "actor", "since", "until", "limit")

_BUDGET_STATUS = register_schema(
    "BudgetStatus",
    {
        "type": "object",
        "description": "A budget as its accountant reports it, in its current period: ε "
        "spent is the smaller of the basic-composition total (Σε, while no Gaussian query "
        "was charged) and the zCDP total (the CKS conversion of Σρ); `basis` says which. "
        "δ spent is partition-selection δ (docs/accounting.md).",
        "properties": {
            "name": {"type": "string"},
            "disabled": {"type": "boolean"},
            "composition": {"enum": ["combined", "zcdp", "pure"]},
            "basis": {"enum": ["basic", "zcdp"]},
            "period": {"enum": ["none", "day", "week", "month"]},
            "period_started_at": {"type": ["string", "null"], "format": "date-time"},
            "period_ends_at": {
                "type": ["string", "null"],
                "format": "date-time",
                "description": "when the budget renews (UTC); null without a period",
            },
            **{
                k: {"type": ["number", "null"]}
                for k in (
                    "epsilon",
                    "delta",
                    "epsilon_spent",
                    "delta_spent",
                    "epsilon_remaining",
                    "delta_remaining",
                    "rho_budget",
                    "rho_spent",
                    "rho_remaining",
                    "max_next_laplace_epsilon",
                    "epsilon_spent_basic",
                    "epsilon_spent_zcdp",
                    "selection_delta_budget",
                )
            },
            "queries": {"type": "integer"},
        },
    },
)
_NEW_KEY = register_schema(
    "NewApiKey",
    ok_answer(
        {
            "name": {"type": "string"},
            "api_key": {"type": "string", "description": "Shown once; only its hash is kept."},
        },
        {"budget": _BUDGET_STATUS},
    ),
)
_BUDGET_FIELDS = {
    "epsilon": {"type": "number", "minimum": 0},
    "delta": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "period": {
        "enum": list(budget.PERIODS),
        "description": "the budget renews at the end of each day, week or month (UTC); "
        "none (the default): never",
    },
}


def _ledger() -> budget.Ledger:
    ledger: budget.Ledger = current_app.extensions["dpgate"].ledger
    return ledger


#: Each admin endpoint's action, as its audit-log row names it (also when the request is
#: refused before the endpoint runs: a role without the right, a bad key).
ACTIONS: dict[str, str] = {
    "create_analyst": "analyst.create",
    "list_analysts": "analyst.list",
    "get_analyst": "budget.show",
    "update_analyst": "analyst.update",
    "get_global_budget": "budget.show_global",
    "set_global_budget": "budget.set_global",
    "rotate_key": "key.rotate",
    "audit_log": "audit_log.read",
    "create_admin": "admin.create",
    "list_admins": "admin.list",
    "update_admin": "admin.update",
    "list_grants": "grant.list",
    "add_grant": "grant.add",
    "remove_grant": "grant.remove",
    "list_groups": "group.list",
    "add_member": "group.add_member",
    "remove_member": "group.remove_member",
}


def _action() -> str | None:
    endpoint = request.endpoint or ""
    return ACTIONS.get(endpoint.rpartition(".")[2])


def _caller(params: dict[str, Any], status: int = 200) -> budget.AdminCaller:
    """The calling admin, for the audit row the ledger writes with the change (in its
    transaction); this request then writes no other row. ``params`` are also what the
    row of a refused attempt says."""
    rec = record()
    rec.params = params
    principal = rec.principal
    assert principal is not None  # require_admin let the request in
    return budget.AdminCaller(
        actor=principal.name,
        request_id=rec.request_id,
        endpoint=f"{request.method} {request.path}",
        status=status,
    )


def _written() -> None:
    record().audit_written = True


def _reading(params: dict[str, Any] | None = None) -> None:
    """A read: its audit row is the request's own, written after the response."""
    record().params = params


def _ledger_errors() -> AbstractContextManager[None]:
    """The ledger's errors as the gateway's; a missing analyst is ``not_found`` here."""
    return ledger_errors(unknown_analyst=NotFound)


@admin_bp.before_request
def _require_admin() -> None:
    rec = record()
    rec.audited = "admin"  # every admin request, allowed or not, is audit-logged
    rec.action = _action()
    rec.params = dict(request.view_args or {}) or None
    require_admin()


def _json_body(allowed: set[str], required: Iterable[str] = ()) -> Mapping[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", fields=unknown)
    missing = sorted(set(required) - set(body))
    if missing:
        raise InvalidRequest(f"missing field(s): {', '.join(missing)}", fields=missing)
    return body


def _number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number", field=name)
    return float(value)


def _period(body: Mapping[str, Any]) -> budget.Period | None:
    value = body.get("period")
    if value is None:
        return None
    if value not in budget.PERIODS:
        raise InvalidRequest(f"period must be one of {', '.join(budget.PERIODS)}", field="period")
    return value


def _status_json(status: budget.BudgetStatus) -> dict[str, Any]:
    return status.to_json()


@admin_bp.post("/analysts")
@document(
    summary="Create an analyst with a budget; returns their API key once",
    auth="admin",
    request={
        "type": "object",
        "required": ["name", "epsilon", "delta"],
        "additionalProperties": False,
        "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"}}
        | _BUDGET_FIELDS,
    },
    responses={201: _NEW_KEY},
    errors=[Conflict, LedgerUnavailable],
    tags=["admin"],
)
def create_analyst() -> tuple[Response, int]:
    body = _json_body({"name", "epsilon", "delta", "period"}, {"name", "epsilon", "delta"})
    name = body["name"]
    if not isinstance(name, str):
        raise InvalidRequest("name must be a string", field="name")
    epsilon, delta = _number(body, "epsilon"), _number(body, "delta")
    if epsilon is None or delta is None:
        raise InvalidRequest("epsilon and delta must be numbers", fields=["epsilon", "delta"])
    period = _period(body) or "none"
    ledger = _ledger()
    params = {"name": name, "epsilon": epsilon, "delta": delta, "period": period}
    caller = _caller(params, 201)
    with _ledger_errors():
        key = ledger.create_analyst(name, epsilon, delta, period, caller=caller)
        _written()
        status = ledger.budget_status(name)
    return jsonify({"ok": True, "name": name, "api_key": key, "budget": _status_json(status)}), 201


@admin_bp.get("/analysts")
@document(
    summary="Every analyst's budget status, and the dataset-wide budget if configured",
    auth="admin",
    responses={
        200: ok_answer(
            {"analysts": array_of(_BUDGET_STATUS)},
            {"global": {"oneOf": [_BUDGET_STATUS, {"type": "null"}]}},
        )
    },
    errors=[LedgerUnavailable],
    tags=["admin"],
)
def list_analysts() -> Response:
    _reading()
    ledger = _ledger()
    with _ledger_errors():
        statuses = ledger.list_analysts()
        global_status = ledger.global_status()
    return jsonify(
        {
            "ok": True,
            "analysts": [_status_json(s) for s in statuses],
            "global": None if global_status is None else _status_json(global_status),
        }
    )


_ONE_ANALYST = ok_answer({"analyst": _BUDGET_STATUS})


@admin_bp.get("/analysts/<name>")
@document(
    summary="One analyst's budget status",
    auth="admin",
    responses={200: _ONE_ANALYST},
    errors=[NotFound, LedgerUnavailable],
    tags=["admin"],
)
def get_analyst(name: str) -> Response:
    _reading({"name": name})
    with _ledger_errors():
        status = _ledger().budget_status(name)
    return jsonify({"ok": True, "analyst": _status_json(status)})


@admin_bp.patch("/analysts/<name>")
@document(
    summary="Change an analyst's budget or period, or disable / enable them",
    description="Lowering a budget below what is already spent is allowed: nothing more "
    "is admitted. A new period counts the charges made since the start of the current "
    "one. A disabled analyst's key is refused with `forbidden`.",
    auth="admin",
    request={
        "type": "object",
        "additionalProperties": False,
        "properties": {"disabled": {"type": "boolean"}} | _BUDGET_FIELDS,
    },
    responses={200: _ONE_ANALYST},
    errors=[NotFound, LedgerUnavailable],
    tags=["admin"],
)
def update_analyst(name: str) -> Response:
    body = _json_body({"epsilon", "delta", "period", "disabled"})
    disabled = body.get("disabled")
    if disabled is not None and not isinstance(disabled, bool):
        raise InvalidRequest("disabled must be true or false", field="disabled")
    epsilon, delta, period = _number(body, "epsilon"), _number(body, "delta"), _period(body)
    given = {"epsilon": epsilon, "delta": delta, "period": period, "disabled": disabled}
    params = {"name": name, **{k: v for k, v in given.items() if v is not None}}
    caller = _caller(params)
    with _ledger_errors():
        status = _ledger().update_analyst(
            name, epsilon=epsilon, delta=delta, disabled=disabled, period=period, caller=caller
        )
        _written()
    return jsonify({"ok": True, "analyst": _status_json(status)})


_GLOBAL = ok_answer({"budget": {"oneOf": [_BUDGET_STATUS, {"type": "null"}]}})


@admin_bp.get("/budget")
@document(
    summary="The dataset-wide budget, which caps all analysts together (null if none)",
    auth="admin",
    responses={200: _GLOBAL},
    errors=[LedgerUnavailable],
    tags=["admin"],
)
def get_global_budget() -> Response:
    _reading()
    with _ledger_errors():
        status = _ledger().global_status()
    return jsonify({"ok": True, "budget": None if status is None else _status_json(status)})


@admin_bp.patch("/budget")
@document(
    summary="Set the dataset-wide budget or its period",
    description="Stored in the ledger, where it then wins over `privacy.global_budget` of "
    "the config. Without a global budget yet, give both epsilon and delta.",
    auth="admin",
    request={"type": "object", "additionalProperties": False, "properties": _BUDGET_FIELDS},
    responses={200: _GLOBAL},
    errors=[LedgerUnavailable],
    tags=["admin"],
)
def set_global_budget() -> Response:
    body = _json_body({"epsilon", "delta", "period"})
    epsilon, delta, period = _number(body, "epsilon"), _number(body, "delta"), _period(body)
    given = {"epsilon": epsilon, "delta": delta, "period": period}
    caller = _caller({k: v for k, v in given.items() if v is not None})
    with _ledger_errors():
        status = _ledger().set_global_budget(
            epsilon=epsilon, delta=delta, period=period, caller=caller
        )
        _written()
    return jsonify({"ok": True, "budget": _status_json(status)})


@admin_bp.post("/analysts/<name>/keys")
@document(
    summary="Rotate an analyst's API key: returns the new key once; the old one stops working",
    auth="admin",
    responses={201: _NEW_KEY},
    errors=[NotFound, LedgerUnavailable],
    tags=["admin"],
)
def rotate_key(name: str) -> tuple[Response, int]:
    caller = _caller({"name": name}, 201)
    with _ledger_errors():
        key = _ledger().rotate_key(name, caller=caller)
        _written()
    return jsonify({"ok": True, "name": name, "api_key": key}), 201


def _time_arg(name: str) -> datetime | None:
    raw = request.args.get(name)
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"{name} must be an ISO 8601 time", field=name) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@admin_bp.get("/audit-log")
@document(
    summary="The request audit log, newest first",
    auth="admin",
    query={
        "analyst": {"type": "string"},
        "actor": {"type": "string", "description": "who acted: an admin, a CLI user"},
        "since": {"type": "string", "format": "date-time"},
        "until": {"type": "string", "format": "date-time"},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_AUDIT_LIMIT, "default": 1000},
    },
    responses={200: ok_answer({"entries": {"type": "array"}})},
    errors=[LedgerUnavailable],
    tags=["admin"],
)
def audit_log() -> Response:
    raw_limit = request.args.get("limit", "1000")
    try:
        limit = int(raw_limit)
    except ValueError:
        raise InvalidRequest("limit must be an integer", field="limit") from None
    if not 1 <= limit <= MAX_AUDIT_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_AUDIT_LIMIT}", field="limit")
    _reading({k: v for k, v in request.args.items() if k in _AUDIT_ARGS})
    with _ledger_errors():
        entries = _ledger().audit_log(
            analyst=request.args.get("analyst") or None,
            actor=request.args.get("actor") or None,
            since=_time_arg("since"),
            until=_time_arg("until"),
            limit=limit,
        )
    return jsonify({"ok": True, "entries": [e.to_json() for e in entries]})


_ADMIN = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "role": {"enum": list(budget.ADMIN_ROLES)},
        "disabled": {"type": "boolean"},
    },
}


def _role(body: Mapping[str, Any]) -> budget.AdminRole | None:
    value = body.get("role")
    if value is None:
        return None
    if value not in budget.ADMIN_ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(budget.ADMIN_ROLES)}", field="role")
    return value


@admin_bp.post("/admins")
@document(
    summary="Create a named admin with a role; returns their key once",
    auth="admin",
    request={
        "type": "object",
        "required": ["name", "role"],
        "additionalProperties": False,
        "properties": {"name": {"type": "string"}, "role": {"enum": list(budget.ADMIN_ROLES)}},
    },
    responses={
        201: ok_answer(
            {
                "name": {"type": "string"},
                "role": {"enum": list(budget.ADMIN_ROLES)},
                "api_key": {"type": "string", "description": "Shown once."},
            }
        )
    },
    errors=[Conflict, LedgerUnavailable],
    tags=["admin"],
)
def create_admin() -> tuple[Response, int]:
    body = _json_body({"name", "role"}, {"name", "role"})
    name, role = body["name"], _role(body)
    if not isinstance(name, str):
        raise InvalidRequest("name must be a string", field="name")
    if role is None:
        raise InvalidRequest(f"role must be one of {', '.join(budget.ADMIN_ROLES)}", field="role")
    caller = _caller({"name": name, "role": role}, 201)
    with _ledger_errors():
        key = _ledger().create_admin(name, role, caller=caller)
        _written()
    return jsonify({"ok": True, "name": name, "role": role, "api_key": key}), 201


@admin_bp.get("/admins")
@document(
    summary="Every named admin and their role",
    auth="admin",
    responses={200: ok_answer({"admins": array_of(_ADMIN)})},
    errors=[LedgerUnavailable],
    tags=["admin"],
)
def list_admins() -> Response:
    _reading()
    with _ledger_errors():
        admins = _ledger().list_admins()
    return jsonify({"ok": True, "admins": [a.to_json() for a in admins]})


@admin_bp.patch("/admins/<name>")
@document(
    summary="Change a named admin's role, or disable / enable them",
    auth="admin",
    request={
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "role": {"enum": list(budget.ADMIN_ROLES)},
            "disabled": {"type": "boolean"},
        },
    },
    responses={200: ok_answer({"admin": _ADMIN})},
    errors=[NotFound, LedgerUnavailable],
    tags=["admin"],
)
def update_admin(name: str) -> Response:
    body = _json_body({"role", "disabled"})
    role, disabled = _role(body), body.get("disabled")
    if disabled is not None and not isinstance(disabled, bool):
        raise InvalidRequest("disabled must be true or false", field="disabled")
    given = {"role": role, "disabled": disabled}
    caller = _caller({"name": name, **{k: v for k, v in given.items() if v is not None}})
    with _ledger_errors():
        admin = _ledger().update_admin(name, role=role, disabled=disabled, caller=caller)
        _written()
    return jsonify({"ok": True, "admin": admin.to_json()})


__all__ = ["admin_bp"]
