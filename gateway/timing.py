"""Release timing: when an answer that read protected rows may leave dpgate.

How long a query runs depends on the rows it reads: a costly expression in a CASE
branch that only some people select makes the statement slower exactly when they are
there. Answering as soon as the database does would turn response time into a channel
that noise does not cover (issue: side channels).

Under ``execution.timing: deadline`` (the default) every query that reaches the protected
database gets a release moment fixed before its statement starts, from public facts only
(Haeberlen, Pierce and Narayan, "Differential Privacy Under Fire", USENIX Security 2011:
predictable transactions — each has a deadline fixed in advance and a default outcome
when it misses it):

- its deadline: the cost model's estimate of the statement (``gateway.cost_model``: the
  plan, declared row counts, the engine's per-row costs) times
  ``execution.deadline_margin`` and the load factor of the statements in flight in this
  process, never below ``min_deadline_ms``, plus ``post_ms`` for noising, the post-audit
  and the ledger commit; or the fixed ``deadline_ms`` of the table or of ``execution``
  when set; or ``FALLBACK_DEADLINE_MS`` for a table without a declared row count;
- within an audit scope, never earlier than the previous ticket's release moment plus
  the time kept for a post-audit (``gateway.lanes``: post-audits run in ticket order).

The answer — or the error, or the post-audit refusal — is held until that moment. The
statement may run until ``statement_until`` (the release moment less the time kept for
what follows it); one still running then is abandoned (cancelled in the background,
whatever the engine does with the cancel), charged, and reported at the release moment
with the same message as any other failure after the database was reached (a miss:
``dpgate_deadline_misses_total``).

Every input of the release moment is public: the plan, the config (declared row
counts, per-row costs), the catalogue's unique keys, the arrival time and the release
moments of earlier queries (which fix how many statements are in flight). None of them
is a running time of a statement, nor read from the protected rows.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from gateway.config import ExecutionConfig, TableConfig
from gateway.cost_model import CostModel, machine_load
from gateway.plan import QueryPlan

#: Under a fixed ``deadline_ms``, the statement may use this share of it; the rest is
#: kept for what follows it (noise from the pre-drawn pool, the post-audit, the durable
#: ledger commit), so that the answer is ready before its release moment.
STATEMENT_SHARE = 0.8
#: The deadline of a query on a table whose row count is not declared (``tables.<t>.rows``)
#: and that has no ``deadline_ms``: the cost model cannot size it, so it gets the fixed
#: deadline dpgate always had.
FALLBACK_DEADLINE_MS = 250
#: Release moments of one scope's consecutive tickets are at least this far apart (and at
#: least the time kept after a statement, ``post_ms`` times the load factor): room for
#: one post-audit once the previous ticket is done.
RELEASE_GAP_S = 0.002


@dataclass(frozen=True)
class ReleaseClock:
    """The release moment of one query (``None``: release at once), the moment its
    statement is abandoned, and the statement timeout that goes with it."""

    release_at: float | None
    statement_timeout_ms: int
    statement_until: float | None = None
    deadline_ms: float | None = None

    def wait(self) -> float:
        """Sleep until the release moment; return the seconds spent waiting."""
        if self.release_at is None:
            return 0.0
        pause = self.release_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
            return pause
        return 0.0


def deadline_ms(execution: ExecutionConfig, table: TableConfig) -> int | None:
    """The table's fixed release deadline in milliseconds, or ``None`` when timing is off
    or the cost model sets it per query (``ReleaseTiming.deadline_ms``)."""
    if execution.timing == "off":
        return None
    return table.deadline_ms if table.deadline_ms is not None else execution.deadline_ms


class ReleaseTiming:
    """The timing policy of one gateway: its cost model and the release moments of the
    queries in flight (which, being public, say how loaded the gateway is)."""

    def __init__(self, execution: ExecutionConfig, model: CostModel | None) -> None:
        self.execution = execution
        self.model = model
        self._lock = threading.Lock()
        self._pending: list[float] = []  # release moments not yet past

    @property
    def active(self) -> bool:
        return self.execution.timing != "off"

    def deadline_ms(
        self, plan: QueryPlan, table: TableConfig, sql: str, in_flight: int = 1
    ) -> float | None:
        """The deadline of the plan's statement ``sql`` (plus what follows it) with
        ``in_flight`` statements sharing the machine, or ``None`` when timing is off."""
        return self._deadline(plan, table, sql, in_flight)[0]

    def _deadline(
        self, plan: QueryPlan, table: TableConfig, sql: str, in_flight: int
    ) -> tuple[float | None, float]:
        """(deadline, ms kept after the statement for noising, post-audit and commit)."""
        fixed = deadline_ms(self.execution, table)
        if fixed is not None or not self.active:
            return fixed, (fixed or 0) * (1 - STATEMENT_SHARE)
        ex = self.execution
        estimate = None if self.model is None else self.model.statement_ms(plan, sql)
        if estimate is None or self.model is None:
            return FALLBACK_DEADLINE_MS, FALLBACK_DEADLINE_MS * (1 - STATEMENT_SHARE)
        # the work after the statement slows down with the machine, as the statement does
        # The machine's load average is not public (it counts our own statements, whose
        # running time may depend on the rows): only an admin's explicit choice adds it.
        load = machine_load() if ex.load_aware else 0.0
        factor = self.model.load_factor(in_flight, load)
        statement = max(float(ex.min_deadline_ms), estimate * factor * ex.deadline_margin)
        kept = ex.post_ms * factor
        return float(math.ceil(statement + kept)), kept

    def start(
        self,
        plan: QueryPlan,
        table: TableConfig,
        sql: str,
        statement_timeout_ms: int,
        *,
        after: float | None = None,
    ) -> ReleaseClock:
        """Fix the release moment of a query whose statement starts now; ``after`` is
        the release moment of the previous ticket of its audit scope (``None``: none)."""
        if not self.active:
            return ReleaseClock(release_at=None, statement_timeout_ms=statement_timeout_ms)
        now = time.monotonic()
        with self._lock:
            self._pending = [t for t in self._pending if t > now]
            deadline, kept = self._deadline(plan, table, sql, len(self._pending) + 1)
            assert deadline is not None
            release_at = now + deadline / 1000
            if after is not None:
                # room for this one's post-audit once the previous ticket's is done
                release_at = max(release_at, after + max(RELEASE_GAP_S, kept / 1000))
            self._pending.append(release_at)
        until = release_at - kept / 1000
        return ReleaseClock(
            release_at=release_at,
            statement_timeout_ms=max(1, min(statement_timeout_ms, int((until - now) * 1000))),
            statement_until=until,
            deadline_ms=deadline,
        )
