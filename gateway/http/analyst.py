"""Analyst endpoints: ``POST /v1/query``, ``GET /v1/budget``, ``/v1/schema``, ``/v1/queries``."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from gateway.core.errors import (
    AuditRefused,
    BudgetExhausted,
    DatabaseUnavailable,
    Forbidden,
    GatewayError,
    InvalidPrivacyParameters,
    InvalidRequest,
    LedgerUnavailable,
    SqlSyntaxError,
    Unauthenticated,
    UnknownColumn,
    UnknownTable,
    UnsupportedQuery,
)
from gateway.http.auth import (
    admitted,
    bearer_key,
    current_principal,
    gateway,
    record,
    require_analyst,
)
from gateway.http.openapi import document, ref, register_schema
from gateway.pipeline.request import parse_request

bp = Blueprint("analyst", __name__)


@bp.before_request
def _audited() -> None:
    """Every analyst request, answered or not, goes to the ledger's audit log."""
    record().audited = "analyst"


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
            "raw": {
                "type": "boolean",
                "description": "the noisy values as drawn (unbiased; a count may be "
                "negative), not moved into what is public; the same release, free once paid",
            },
        },
    },
)
register_schema(
    "ColumnAccuracy",
    {
        "type": "object",
        "description": "how accurate one released column is. COUNT and SUM: "
        "`ci95_halfwidth` and `stddev` of the noise. AVG: `ci95_intervals` (one [low, high] "
        "per row, or null) and the accuracy of its `sum` and `count`. VARIANCE and STDDEV: "
        "`ci95_intervals` per row (conservative: a union bound over the noises of the "
        "`sum`, `sum_squares` and `count` they are computed from, see `method`). Quantiles "
        "(PERCENTILE_CONT, MEDIAN, MIN, MAX): a rank interval — with 95% probability the "
        "released bucket holds a value whose rank among the group's bounded values is "
        "within ±`rank_ci95_halfwidth` of the target rank p·(n−1), or is empty and lies "
        "between two such values; `buckets` and "
        "`bucket_width` describe the public grid the value is chosen on.",
        "properties": {
            "ci95_halfwidth": {"type": ["number", "null"]},
            "stddev": {"type": ["number", "null"]},
            "ci95_intervals": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"type": "null"},
                        {"type": "array", "items": {"type": "number"}, "minItems": 2},
                    ]
                },
            },
            "sum": {"type": "object"},
            "sum_squares": {"type": "object"},
            "count": {"type": "object"},
            "method": {"type": "string"},
            "quantile": {"type": "number", "minimum": 0, "maximum": 1},
            "rank_ci95_halfwidth": {"type": "integer", "minimum": 0},
            "buckets": {"type": "integer", "minimum": 1},
            "bucket_width": {"type": "number", "minimum": 0},
            "note": {"type": "string"},
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
            "accuracy": {
                "type": "object",
                "description": "noisy column → its accuracy; null where it is not known "
                "(a nested aggregation's MIN, MAX or expressions of noisy values)",
                "additionalProperties": {
                    "oneOf": [ref("ColumnAccuracy"), {"type": "null"}],
                },
            },
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
            "post_processing": {
                "type": "object",
                "description": "nested aggregation: the outer query was computed from the "
                "released answer of `inner_sql`, which alone was charged and audited",
                "required": ["inner_sql", "note"],
                "properties": {
                    "inner_sql": {"type": "string"},
                    "note": {"type": "string"},
                    "inner_accuracy": {"type": "object"},
                },
            },
            "clamped": {
                "type": "object",
                "description": "present when a value or an interval was moved into what "
                "is public (counts ≥ 0, AVG within the column's bounds…); ask `raw` for "
                "the values as drawn",
                "required": ["columns", "note"],
                "properties": {
                    "columns": {"type": "array", "items": {"type": "string"}},
                    "note": {"type": "string"},
                },
            },
            "audit_left_out": {
                "type": "object",
                "description": "present when the auditor left rows out: with earlier answers "
                "they would determine a group it cannot show to hold the minimum group size; "
                "`groups` lists them by their group keys, `reason` names the groups (as WHERE "
                "clauses) and what to ask instead, `ask_instead` gives those queries, to send "
                "as they are (their counts size the groups: the same query then has every "
                "row). The charge is the whole query's",
                "required": ["groups", "reason"],
                "properties": {
                    "groups": {"type": "array", "items": {"type": "object"}},
                    "reason": {"type": "string"},
                    "ask_instead": {"type": "array", "items": {"type": "string"}},
                },
            },
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
    gw, rec = gateway(), record()
    try:
        req = parse_request(
            request.get_json(silent=True, force=True), request.get_data(), gw.config.privacy
        )
    except GatewayError:
        require_analyst()  # who is asking is checked before what is asked
        raise
    rec.sql = req.sql
    _, release = gw.answer(bearer_key(), req, admit=admitted)
    rec.outcome = "cached" if release.cached else ("dry_run" if req.dry_run else "answered")
    if release.charge is not None:  # in budget units: what /v1/budget's ε spent rose by
        rec.epsilon_spent = release.charge.epsilon
    body = release.to_json()
    if req.accuracy is not None:
        body["accuracy_target"] = {
            "ci95_halfwidth": req.accuracy,
            "epsilon": release.privacy.epsilon,  # the ε the target was met with
        }
    return jsonify(body)


@bp.get("/v1/budget")
@document(
    summary="The analyst's privacy budget: total, spent, remaining, composition, period",
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
    summary="The public metadata of the protected tables the caller may read",
    description="Only the tables granted to one of the caller's groups (or open to every "
    "analyst) are listed; an admin sees every table.",
    auth="analyst",
    responses={200: ref("Schema")},
    errors=(Unauthenticated, Forbidden, LedgerUnavailable),
    tags=["analyst"],
)
def schema() -> Response:
    return jsonify(gateway().schema(current_principal()))


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
