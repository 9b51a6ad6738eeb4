"""Analyst endpoints: ``POST /v1/query``, ``GET /v1/budget``, ``/v1/schema``, ``/v1/queries``."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from gateway.errors import (
    AuditRefused,
    BudgetExhausted,
    DatabaseUnavailable,
    Forbidden,
    InvalidPrivacyParameters,
    InvalidRequest,
    LedgerUnavailable,
    SqlSyntaxError,
    Unauthenticated,
    UnknownColumn,
    UnknownTable,
    UnsupportedQuery,
)
from gateway.http.auth import gateway, require_analyst
from gateway.noising import selection_note
from gateway.openapi import document, ref, register_schema
from gateway.plan import QueryPlan, QueryRequest

bp = Blueprint("analyst", __name__)
log = logging.getLogger("dpgate.http")

QUERY_FIELDS = {"sql", "epsilon", "delta", "mechanism", "dry_run", "accuracy"}

register_schema(
    "QueryRequest",
    {
        "type": "object",
        "required": ["sql"],
        "additionalProperties": False,
        "examples": [
            {"sql": "SELECT COUNT(*) FROM patients", "epsilon": 0.1},
            {"sql": "SELECT sex, AVG(age) FROM patients GROUP BY sex", "epsilon": 0.2},
            {"sql": "SELECT COUNT(*) FROM patients", "accuracy": {"ci95_halfwidth": 10}},
        ],
        "properties": {
            "sql": {"type": "string", "description": "one aggregate SELECT"},
            "epsilon": {"type": "number", "exclusiveMinimum": 0},
            "accuracy": {
                "type": "object",
                "description": "instead of epsilon: the gateway picks the smallest ε whose "
                "95% interval of every COUNT and SUM is at most ±ci95_halfwidth, or "
                "refuses and says what it would cost",
                "required": ["ci95_halfwidth"],
                "additionalProperties": False,
                "properties": {"ci95_halfwidth": {"type": "number", "exclusiveMinimum": 0}},
            },
            "delta": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            "mechanism": {"type": "string", "enum": ["laplace", "gaussian"]},
            "dry_run": {"type": "boolean"},
        },
    },
)
register_schema(
    "Release",
    {
        "type": "object",
        "required": [
            "ok",
            "query_id",
            "cached",
            "columns",
            "rows",
            "accuracy",
            "privacy",
            "budget",
        ],
        "properties": {
            "ok": {"const": True},
            "query_id": {"type": "string"},
            "cached": {"type": "boolean"},
            "columns": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "type"],
                    "properties": {"name": {"type": "string"}, "type": {"type": "string"}},
                },
            },
            "rows": {"type": "array", "items": {"type": "array"}},
            "accuracy": {"type": "object"},
            "privacy": {"type": "object"},
            "budget": {"type": "object"},
            "dry_run": {"type": "boolean"},
            "would_fit": {"type": "boolean"},
            "charge": {
                "type": "object",
                "description": "what this query adds (a dry run: would add) to the analyst's "
                "epsilon_spent and delta_spent, in their budget's units",
                "properties": {
                    "epsilon": {"type": ["number", "null"]},
                    "delta": {"type": ["number", "null"]},
                },
            },
            "queries_remaining": {
                "type": "integer",
                "description": "dry run: how many such queries the budget still admits",
            },
            "accuracy_target": {
                "type": "object",
                "description": "the accuracy asked for and the ε chosen to meet it",
            },
            "plan": {"type": "object"},
            "release_deadline_ms": {"type": ["integer", "null"]},
            "partition_selection": {
                "type": "object",
                "description": "present when GROUP BY keys are not declared public: groups "
                "were released only if their noisy number of people reached `threshold`",
                "required": ["threshold", "keys", "note"],
                "properties": {
                    "threshold": {"type": "integer"},
                    "keys": {"type": "array", "items": {"type": "string"}},
                    "note": {"type": "string"},
                },
            },
        },
    },
)
register_schema("Budget", {"type": "object", "required": ["ok", "budget"]})
register_schema("Schema", {"type": "object", "required": ["ok", "tables"]})
register_schema("History", {"type": "object", "required": ["ok", "queries"]})

_QUERY_ERRORS = (
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
    DatabaseUnavailable,
    LedgerUnavailable,
)


@bp.post("/v1/query")
@document(
    summary="Answer one aggregate SQL query with differential privacy",
    auth="analyst",
    request=ref("QueryRequest"),
    responses={200: ref("Release")},
    errors=_QUERY_ERRORS,
    tags=["analyst"],
)
def query() -> Response:
    analyst = require_analyst()
    req = parse_query_request(request.get_json(silent=True, force=True), request.get_data())
    g.sql = req.sql
    release = gateway().query(analyst, req)
    g.query_outcome = "cached" if release.cached else ("dry_run" if req.dry_run else "answered")
    if release.charge is not None:  # in budget units: what /v1/budget's ε spent rose by
        g.epsilon_spent = release.charge.get("epsilon")
    body = release.to_json()
    if req.accuracy is not None:
        chosen = float(release.privacy["epsilon"])  # the ε the target was met with
        body["accuracy_target"] = {"ci95_halfwidth": req.accuracy, "epsilon": chosen}
        req = replace(req, epsilon=chosen, accuracy=None)
    selection = _partition_selection(req, None if req.dry_run else len(release.rows))
    if selection is not None:
        body["partition_selection"] = selection
    return jsonify(body)


def _partition_selection(req: QueryRequest, rows: int | None) -> dict[str, Any] | None:
    """The partition-selection note for an answered query whose keys are not public.

    Re-derived from the request and the public schema (the plan is cached, calibration
    is deterministic), so cached answers and dry runs carry it too.
    """
    gw = gateway()
    plan = gw.analyze(req.sql)
    if not isinstance(plan, QueryPlan) or not plan.needs_partition_selection:
        return None
    # The pipeline's own calibration (deterministic in the request and the schema), so
    # the threshold shown is the one the answer was selected with.
    return selection_note(plan, gw._calibrate(plan, req), rows)


@bp.get("/v1/budget")
@document(
    summary="The analyst's privacy budget: total, spent, remaining, composition",
    auth="analyst",
    responses={200: ref("Budget")},
    errors=(Unauthenticated, Forbidden, LedgerUnavailable),
    tags=["analyst"],
)
def budget() -> Response:
    analyst = require_analyst()
    return jsonify({"ok": True, "budget": gateway().budget(analyst)})


@bp.get("/v1/schema")
@document(
    summary="The public metadata of the protected tables",
    auth="analyst",
    responses={200: ref("Schema")},
    errors=(Unauthenticated, Forbidden, LedgerUnavailable),
    tags=["analyst"],
)
def schema() -> Response:
    from gateway.http.auth import current_principal

    current_principal()
    return jsonify(gateway().schema())


@bp.get("/v1/queries")
@document(
    summary="The analyst's own history: SQL, cost, outcome, released answer",
    auth="analyst",
    query={"limit": {"type": "integer", "minimum": 1, "maximum": 10000}},
    responses={200: ref("History")},
    errors=(InvalidRequest, Unauthenticated, Forbidden, LedgerUnavailable),
    tags=["analyst"],
)
def queries() -> Response:
    analyst = require_analyst()
    raw_limit = request.args.get("limit", "1000")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 10000:
        raise InvalidRequest("limit must be a whole number from 1 to 10000")
    entries = gateway().history(analyst, limit=int(raw_limit))
    return jsonify({"ok": True, "queries": entries})


@bp.after_request
def record_in_audit_log(response: Response) -> Response:
    """Append every analyst request, answered or not, to the ledger's audit log."""
    body = response.get_json(silent=True) if response.is_json else None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    try:
        gateway().ledger.log_request(
            request_id=str(g.get("request_id") or ""),
            analyst=g.get("analyst_name"),
            endpoint=f"{request.method} {request.path}",
            sql=g.get("sql"),
            outcome=str(g.get("query_outcome") or ("ok" if code is None else code)),
            error_code=code,
            status=response.status_code,
        )
    except Exception:  # the audit log must never turn an answer into an error
        log.warning("could not append to the audit log (request %s)", g.get("request_id"))
    return response


def parse_query_request(body: Any, raw: bytes) -> QueryRequest:
    """Validate a ``POST /v1/query`` body into a QueryRequest (defaults from the config)."""
    if body is None:
        if not raw.strip():
            raise InvalidRequest('send a JSON body like {"sql": "SELECT COUNT(*) FROM t"}')
        raise InvalidRequest("the body is not valid JSON")
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    unknown = sorted(set(body) - QUERY_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"unknown field(s): {', '.join(unknown)} (allowed: {', '.join(sorted(QUERY_FIELDS))})",
            fields=unknown,
        )
    sql = body.get("sql")
    if not isinstance(sql, str):
        raise InvalidRequest("'sql' is required and must be a string")
    if len(sql) > 100_000:
        raise InvalidRequest("'sql' is longer than 100,000 characters")
    defaults = gateway().config.privacy
    accuracy = _accuracy(body)
    if accuracy is not None and body.get("epsilon") is not None:
        raise InvalidPrivacyParameters("give either 'epsilon' or 'accuracy', not both")
    epsilon = _number(body, "epsilon", defaults.epsilon)
    mechanism = body.get("mechanism")
    if mechanism is None:  # absent or JSON null: the config's default
        mechanism = defaults.mechanism
    if mechanism not in ("laplace", "gaussian"):
        raise InvalidPrivacyParameters("'mechanism' must be 'laplace' or 'gaussian'")
    delta = _number(body, "delta", defaults.delta if mechanism == "gaussian" else None)
    if delta is None:
        delta = defaults.delta  # used only by partition selection, when keys are not public
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise InvalidRequest("'dry_run' must be true or false")
    return QueryRequest(
        sql=sql,
        epsilon=epsilon,
        delta=delta,
        mechanism=mechanism,
        dry_run=dry_run,
        accuracy=accuracy,
    )


def _accuracy(body: dict[str, Any]) -> float | None:
    """The target 95% half-width of ``"accuracy": {"ci95_halfwidth": X}``, if given."""
    raw = body.get("accuracy")
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"ci95_halfwidth"}:
        raise InvalidPrivacyParameters(
            "'accuracy' must be an object {\"ci95_halfwidth\": X}, X > 0 in the units of the "
            "released values"
        )
    value = _number(raw, "ci95_halfwidth", None)
    if value is None or value <= 0:
        raise InvalidPrivacyParameters("'accuracy.ci95_halfwidth' must be a number > 0")
    return float(value)


def _number(body: dict[str, Any], key: str, default: float | None) -> Any:
    value = body.get(key)
    if value is None:  # absent or JSON null: the config's default
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPrivacyParameters(f"'{key}' must be a number")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidPrivacyParameters(f"'{key}' must be finite")
    return value
