"""Operations: liveness, readiness, metrics, the OpenAPI document, and the request hooks.

``install_operations(app)`` registers the ``ops`` blueprint and hooks that run around
every request:

- before: start the request's record (``gateway.pipeline.observation.RequestRecord`` in
  ``g.record``: its id is echoed as ``X-Request-Id`` and put into error envelopes by the
  app's error handler) and count the request against the source address's rate limit;
- after: hand the record, which the endpoints filled in, to ``observation.observe``:
  metrics, the JSON log line and the audit-log row.

The analyst limit needs the analyst's name, known only after authentication: the auth
code calls ``check_rate_limit(name)``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from sqlalchemy import Engine, create_engine, literal, select

from budget import Ledger
from gateway.core.errors import DatabaseUnavailable, GatewayError, LedgerUnavailable
from gateway.http.openapi import build_spec, document, register_schema
from gateway.ops import metrics
from gateway.ops.logs import configure_logging
from gateway.ops.ratelimit import RateLimiter, limiter_for_ledger
from gateway.pipeline.observation import RequestRecord, observe

EXTENSION = "dpgate_ops"
QUERY_RULE = "/v1/query"

log = logging.getLogger("dpgate.ops")
bp = Blueprint("ops", __name__)

_CHECKS = register_schema(
    "ReadinessChecks",
    {
        "type": "object",
        "required": ["database", "ledger"],
        "properties": {
            "database": {"type": "boolean"},
            "ledger": {"type": "boolean"},
            # only with postgres_wire: in the config (gateway/pgwire/probe.py)
            "postgres_wire": {"type": "boolean"},
        },
    },
)


@dataclass
class Operations:
    """The per-app state of the operations layer."""

    limiter: RateLimiter | None
    spec: dict[str, Any] | None = None
    exempt_endpoints: frozenset[str] = field(
        default_factory=lambda: frozenset(
            {"ops.healthz", "ops.readyz", "ops.metrics", "ops.openapi", "static"}
        )
    )


def install_operations(app: Flask) -> None:
    """Register the operations endpoints and the per-request hooks on ``app``."""
    configure_logging()
    app.extensions[EXTENSION] = Operations(limiter=_make_limiter(app))
    app.register_blueprint(bp)
    # Run first, before any authentication hook, so every response has a request id.
    app.before_request_funcs.setdefault(None, []).insert(0, _before_request)
    app.after_request(_after_request)


def _ops(app: Flask | None = None) -> Operations:
    ops: Operations = (app or current_app).extensions[EXTENSION]
    return ops


def _make_limiter(app: Flask) -> RateLimiter | None:
    gateway = app.extensions.get("dpgate")
    config = getattr(gateway, "config", None) or app.config.get("DPGATE_CONFIG")
    limits = getattr(config, "limits", None)
    if limits is None or (limits.analyst_per_minute is None and limits.address_per_minute is None):
        return None
    ledger = getattr(gateway, "ledger", None)
    if isinstance(ledger, Ledger):
        limiter = limiter_for_ledger(ledger, limits)
        assert limiter is not None
    else:  # an app without a ledger of its own: counters in the configured database
        limiter = RateLimiter(
            _ledger_engine(gateway) or create_engine(config.ledger.url),  # type: ignore[union-attr]
            address_per_minute=limits.address_per_minute,
            analyst_per_minute=limits.analyst_per_minute,
        )
    try:
        limiter.ensure_schema()
    except Exception:  # the ledger may come up later; hit() retries and fails closed
        log.warning("rate-limit table not ready", exc_info=True)
    return limiter


def _ledger_engine(gateway: Any) -> Engine | None:
    ledger = getattr(gateway, "ledger", None)
    engine = getattr(ledger, "engine", None)
    return engine if isinstance(engine, Engine) else None


def check_rate_limit(analyst_name: str) -> None:
    """Count a request against the analyst's limit; raises ``RateLimited`` when over it.

    Called by the authentication code once it knows who is asking.
    """
    limiter = _ops().limiter
    if limiter is None or request.endpoint in _ops().exempt_endpoints:
        return
    try:
        limiter.hit("analyst", analyst_name)
    except GatewayError as e:
        if e.code == "rate_limited":
            metrics.record_rate_limited("analyst")
        raise


def _before_request() -> None:
    g.record = RequestRecord(
        request_id=uuid.uuid4().hex,
        method=request.method,
        path=request.path,
        remote_addr=request.remote_addr,
    )
    ops = _ops()
    if ops.limiter is None or request.endpoint in ops.exempt_endpoints:
        return
    try:
        ops.limiter.hit("address", request.remote_addr or "unknown")
    except GatewayError as e:
        if e.code == "rate_limited":
            metrics.record_rate_limited("address")
        raise


def _error_of(response: Response) -> dict[str, Any] | None:
    if response.status_code < 400 or not response.is_json:
        return None
    body = response.get_json(silent=True)
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None


def _after_request(response: Response) -> Response:
    rec: RequestRecord | None = g.get("record")
    if rec is None:  # a hook before ours failed: nothing to observe
        return response
    response.headers["X-Request-Id"] = rec.request_id
    try:
        error = _error_of(response)
        rec.error_code = str(error.get("code")) if error else None
        rec.charged_failure = bool(error and (error.get("detail") or {}).get("charged"))
        if rec.error_code == "rate_limited" and error is not None:
            retry_after = (error.get("detail") or {}).get("retry_after")
            if isinstance(retry_after, int):
                response.headers["Retry-After"] = str(retry_after)
        rec.status = response.status_code
        if request.url_rule is not None:
            rec.rule = request.url_rule.rule
        observe(rec, getattr(current_app.extensions.get("dpgate"), "ledger", None))
    except Exception:  # observing must never turn a response into a failure
        log.exception("could not record the request")
    return response


def _envelope(err: GatewayError) -> Response:
    body = err.to_dict()
    rec = g.get("record")
    if rec is not None:
        body["error"]["detail"]["request_id"] = rec.request_id
    response = jsonify(body)
    response.status_code = err.status
    return response


def _probe(engine: Any) -> bool:
    if not isinstance(engine, Engine):
        return False
    try:
        with engine.connect() as conn:
            conn.execute(select(literal(1))).scalar()
        return True
    except Exception:
        log.warning("readiness probe failed", exc_info=True)
        return False


def readiness(app: Flask) -> dict[str, bool]:
    """Whether the protected database and the ledger database answer right now, and,
    when the config has ``postgres_wire``, whether the PostgreSQL front end accepts
    connections (``gateway.pgwire.probe``)."""
    gateway = app.extensions.get("dpgate")
    ready = getattr(gateway, "ready", None)
    if callable(ready):
        raw = ready()
        checks = {"database": bool(raw.get("database")), "ledger": bool(raw.get("ledger"))}
    else:
        checks = {
            "database": _probe(getattr(gateway, "engine", None)),
            "ledger": _ledger_ready(getattr(gateway, "ledger", None)),
        }
    config = getattr(gateway, "config", None)
    if getattr(config, "postgres_wire", None) is not None:
        from gateway.pgwire.probe import wire_ready

        checks["postgres_wire"] = wire_ready(config)  # type: ignore[arg-type]
    return checks


def _ledger_ready(ledger: Any) -> bool:
    ping = getattr(ledger, "ping", None)
    if not callable(ping):
        return _probe(getattr(ledger, "engine", None))
    try:
        ping()
        return True
    except Exception:
        log.warning("ledger readiness probe failed", exc_info=True)
        return False


@bp.get("/healthz")
@document(
    summary="Liveness: the process answers",
    responses={200: {"type": "object", "required": ["ok"], "properties": {"ok": {"const": True}}}},
    tags=["operations"],
    rate_limited=False,
)
def healthz() -> Response:
    return jsonify({"ok": True})


@bp.get("/readyz")
@document(
    summary="Readiness: the protected database and the ledger answer",
    responses={
        200: {
            "type": "object",
            "required": ["ok", "checks"],
            "properties": {"ok": {"const": True}, "checks": _CHECKS},
        }
    },
    errors=[DatabaseUnavailable, LedgerUnavailable],
    tags=["operations"],
    rate_limited=False,
)
def readyz() -> Response:
    checks = readiness(current_app)
    if not checks["database"]:
        return _envelope(
            DatabaseUnavailable("the protected database does not answer", checks=checks)
        )
    if not checks["ledger"]:
        return _envelope(LedgerUnavailable("the ledger database does not answer", checks=checks))
    if checks.get("postgres_wire") is False:
        # The PostgreSQL front end is a door to the database for its clients.
        return _envelope(
            DatabaseUnavailable(
                "the PostgreSQL front end does not accept connections (yet)", checks=checks
            )
        )
    return jsonify({"ok": True, "checks": checks})


@bp.get("/metrics", endpoint="metrics")
@document(
    summary="Prometheus metrics, summed over all worker processes",
    responses={200: {"type": "string"}},
    content_type="text/plain",
    tags=["operations"],
    rate_limited=False,
)
def metrics_endpoint() -> Response:
    body, content_type = metrics.render(_budgets())
    return Response(body, content_type=content_type)


def _budgets() -> list[Any]:
    """Every budget as the ledger reports it now (none if there is no ledger, or it fails:
    the other metrics are still worth a scrape)."""
    ledger = getattr(current_app.extensions.get("dpgate"), "ledger", None)
    if ledger is None or not callable(getattr(ledger, "list_analysts", None)):
        return []
    try:
        statuses = list(ledger.list_analysts())
        global_status = ledger.global_status()
    except Exception:
        log.warning("could not read the budgets for /metrics", exc_info=True)
        return []
    return statuses + ([global_status] if global_status is not None else [])


@bp.get("/openapi.json")
@document(
    summary="This OpenAPI 3.1 document",
    responses={200: {"type": "object", "required": ["openapi", "paths"]}},
    tags=["operations"],
    rate_limited=False,
)
def openapi() -> Response:
    ops = _ops()
    if ops.spec is None:
        ops.spec = build_spec(current_app)
    return jsonify(ops.spec)
