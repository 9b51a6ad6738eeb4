"""What the HTTP layer does around ``Gateway.query``, done for the wire front end.

``POST /v1/query`` is more than the pipeline: the request is counted against the
source address's and the analyst's rate limits, gets a request id, a JSON log line
(``gateway.ops.logs``), metrics (``gateway.ops.metrics``) and a row in the ledger's audit log.
``Observer.query`` does the same for every statement a wire client sends to the
pipeline, with the same fields, so operators see one stream of requests whichever door
they came through (``path`` is ``pgwire:query``, ``method`` ``PG``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

from gateway.core.config import Config
from gateway.core.errors import GatewayError, RateLimited
from gateway.ops import metrics
from gateway.ops.logs import RequestLog, log_request
from gateway.ops.ratelimit import RateLimiter, limiter_for_ledger
from gateway.pipeline.gateway import Gateway
from gateway.pipeline.identity import Principal
from gateway.pipeline.observation import RequestRecord, observe

if TYPE_CHECKING:
    from gateway.pgwire.session import Outcome, Session

log = logging.getLogger("dpgate.pgwire")
METHOD = "PG"
QUERY_PATH = "pgwire:query"
CONNECT_PATH = "pgwire:connect"
CANCELLED_MESSAGE = (
    "canceling statement due to user request: if the query reached the protected "
    "database it stays charged, and sending it again returns the same answer free"
)


class Observer:
    """Rate limits, request ids, log lines, metrics and the audit log of wire requests."""

    def __init__(self, gateway: Gateway, config: Config) -> None:
        self.gateway = gateway
        self.limiter: RateLimiter | None = limiter_for_ledger(gateway.ledger, config.limits)

    def check_address(self, peer: str) -> None:
        """Count a connection attempt against the source address's limit."""
        self._hit("address", peer)

    def _hit(self, scope: str, who: str) -> None:
        if self.limiter is None:
            return
        try:
            self.limiter.hit(scope, who)  # type: ignore[arg-type]
        except RateLimited:
            metrics.record_rate_limited(scope)
            raise

    def connection(self, peer: str, user: str, outcome: str) -> None:
        """Log and count one login attempt (``ok`` or the error code)."""
        status = {"ok": 200, "unauthenticated": 401, "too_many_clients": 503}.get(outcome, 403)
        metrics.record_request(
            endpoint=CONNECT_PATH, method=METHOD, status=status, outcome=outcome, duration_s=0.0
        )
        log_request(
            RequestLog(
                request_id=uuid.uuid4().hex,
                method=METHOD,
                path=CONNECT_PATH,
                status=status,
                duration_ms=0.0,
                remote_addr=peer,
                analyst=user[:64] or None,
                error_code=None if outcome == "ok" else outcome,
            )
        )

    def query(self, session: Session, sql: str, request: object) -> Outcome:
        """Run one statement through ``Gateway.query`` as ``POST /v1/query`` does."""
        from gateway.core.plan import QueryRequest
        from gateway.pgwire.session import CancelledQuery

        assert isinstance(request, QueryRequest)
        request_id = uuid.uuid4().hex
        started = time.perf_counter()
        outcome_name = "answered"
        status = 200
        code: str | None = None
        epsilon: float | None = None
        session.cancelled.clear()
        session.busy = True
        try:
            self._hit("address", session.peer)
            self._hit("analyst", session.user)
            release = self.gateway.query(session.user, request, session.groups)
            outcome_name = "cached" if release.cached else "answered"
            if not release.cached and release.privacy.mechanism != "none":
                epsilon = request.epsilon
            if session.cancelled.is_set():
                raise CancelledQuery(CANCELLED_MESSAGE)
            return session.answer(release)
        except GatewayError as e:
            code = e.code if not isinstance(e, CancelledQuery) else "cancelled"
            outcome_name = code
            status = e.status
            e.request_id = request_id  # type: ignore[attr-defined]
            raise
        except Exception:
            code = outcome_name = "internal"
            status = 500
            log.error("internal error (request %s)", request_id, exc_info=True)
            error = GatewayError("internal error; quote the request id to the admin")
            error.request_id = request_id  # type: ignore[attr-defined]
            raise error from None
        finally:
            session.busy = False
            duration = time.perf_counter() - started
            self._record(session, sql, request_id, outcome_name, status, code, epsilon, duration)

    def _record(
        self,
        session: Session,
        sql: str,
        request_id: str,
        outcome: str,
        status: int,
        code: str | None,
        epsilon: float | None,
        duration: float,
    ) -> None:
        """Report it as HTTP requests are reported: one request record, read once by
        the log line, the metrics and the audit-log row (``gateway.pipeline.observation``)."""
        record = RequestRecord(
            request_id=request_id,
            method=METHOD,
            path=QUERY_PATH,
            remote_addr=session.peer,
            started=time.perf_counter() - duration,
            rule=QUERY_PATH,
            audited="analyst",
            principal=Principal(session.user, is_admin=False),
            sql=sql,
            outcome=outcome,
            epsilon_spent=epsilon,
            status=status,
            error_code=code,
            is_query=True,
        )
        try:
            observe(record, self.gateway.ledger)
        except Exception:  # observing must never turn an answer into an error
            log.warning("could not record wire request %s", request_id)
