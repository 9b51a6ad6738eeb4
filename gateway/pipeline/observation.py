"""The request record: one value per request, filled in as the request goes through the
front end and the pipeline (like PostgREST's Observation), and read once at the end by
the three things that report a request — the JSON log line, the metrics and the audit-log
row in the ledger."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import budget
from gateway.ops import metrics
from gateway.ops.logs import RequestLog, log_request
from gateway.pipeline.identity import Principal

log = logging.getLogger("dpgate.observation")
QUERY_RULE = "/v1/query"


@dataclass
class RequestRecord:
    """What is known about one request (mutable while it is served, read once after)."""

    request_id: str
    method: str
    path: str
    remote_addr: str | None
    started: float = field(default_factory=time.perf_counter)
    rule: str = "<unmatched>"
    # ``analyst`` or ``admin``: the request goes to the ledger's audit log as such.
    audited: Literal["analyst", "admin"] | None = None
    principal: Principal | None = None
    # The name behind a key that was refused where it is not allowed (an analyst's key
    # on an admin endpoint): the audit log says who tried.
    caller: str | None = None
    sql: str | None = None
    outcome: str | None = None  # answered, cached, dry_run (an error code otherwise)
    epsilon_spent: float | None = None
    status: int = 0
    error_code: str | None = None
    # A query request on a front end other than ``POST /v1/query`` (the wire protocol).
    is_query: bool = False
    # An admin request's action and parameters (never a key) for its audit-log row; an
    # admin change writes that row itself, in its own transaction (``audit_written``).
    action: str | None = None
    params: dict[str, Any] | None = None
    audit_written: bool = False
    # The error came after the statement reached the protected database (charged): a
    # statement's failure, not the database being down (``gateway.ops.metrics``).
    charged_failure: bool = False

    @property
    def analyst(self) -> str | None:
        if self.principal is not None and not self.principal.is_admin:
            return self.principal.name
        return self.caller

    @property
    def actor(self) -> str | None:
        """Who called: the admin principal or analyst authenticated, else who tried."""
        if self.principal is not None:
            return self.principal.name
        return self.caller


def observe(record: RequestRecord, ledger: budget.Ledger | None) -> None:
    """Report a finished request: metrics, its JSON log line, its audit-log row."""
    duration = time.perf_counter() - record.started
    code = record.error_code
    metrics.record_request(
        endpoint=record.rule,
        method=record.method,
        status=record.status,
        outcome=code or ("ok" if record.status < 400 else str(record.status)),
        duration_s=duration,
        charged=record.charged_failure,
    )
    outcome = None
    if record.is_query or (record.rule == QUERY_RULE and record.method == "POST"):
        outcome = record.outcome or code or "answered"
        metrics.record_query(
            analyst=record.analyst,
            outcome=outcome,
            duration_s=duration,
            epsilon_spent=record.epsilon_spent,
        )
    log_request(
        RequestLog(
            request_id=record.request_id,
            method=record.method,
            path=record.path,
            status=record.status,
            duration_ms=round(duration * 1000, 3),
            remote_addr=record.remote_addr,
            analyst=record.analyst,
            error_code=code,
            query_outcome=outcome,
            epsilon_spent=record.epsilon_spent,
            sql=record.sql,
        )
    )
    if record.audited is None or record.audit_written or ledger is None:
        return
    if record.audited == "admin":
        audit_outcome = "admin" if record.status < 400 else "refused"
    else:
        audit_outcome = record.outcome or ("ok" if code is None else code)
    try:
        ledger.log_request(
            request_id=record.request_id,
            analyst=record.analyst,
            endpoint=f"{record.method} {record.path}",
            sql=record.sql if record.audited == "analyst" else None,
            outcome=audit_outcome,
            error_code=code,
            status=record.status,
            actor=record.actor,
            action=record.action,
            params=record.params,
        )
    except Exception:  # the audit log must never turn an answer into an error
        log.warning("could not append to the audit log (request %s)", record.request_id)
