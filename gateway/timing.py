"""Release timing: when an answer that read protected rows may leave dpgate.

How long a query runs depends on the rows it reads: a costly expression in a CASE
branch that only some people select makes the statement slower exactly when they are
there. Answering as soon as the database does would turn response time into a channel
that noise does not cover (issue: side channels).

Under ``execution.timing: deadline`` (the default) every query that reaches the protected
database gets a release moment fixed before it starts, from public facts only: the
moment execution starts plus the table's ``deadline_ms`` (or ``execution.deadline_ms``).

- The answer — or the error, or the post-audit refusal — is held until that moment.
- The statement gets ``STATEMENT_SHARE`` of the deadline; one that has not finished by
  then is cancelled, stays charged, and is reported at the same moment with the same
  message as any other failure after the database was reached.

What remains observable is documented in docs/privacy.md ("Timing"): the deadline itself
(public), scheduling jitter, and — only when a statement's cost comes within one person's
bounded share of its deadline — whether it completed at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.config import ExecutionConfig, TableConfig

#: The statement may use this share of the deadline; the rest is kept for what follows it
#: (noise from the pre-drawn pool, the post-audit, the durable ledger commit), so that the
#: answer is ready before its release moment and leaves exactly then.
STATEMENT_SHARE = 0.8


@dataclass(frozen=True)
class ReleaseClock:
    """The release moment of one query (``None``: release at once) and the statement
    timeout that goes with it."""

    release_at: float | None
    statement_timeout_ms: int

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
    """The table's release deadline in milliseconds, or ``None`` when timing is off."""
    if execution.timing == "off":
        return None
    return table.deadline_ms if table.deadline_ms is not None else execution.deadline_ms


def start_clock(
    execution: ExecutionConfig, table: TableConfig, statement_timeout_ms: int
) -> ReleaseClock:
    """Fix the release moment of a query whose execution starts now.

    ``statement_timeout_ms`` (``database.statement_timeout_ms``) caps the statement
    always; under a deadline the statement also gets no more than its share of it. A
    statement stopped early by either is still released at the deadline.
    """
    deadline = deadline_ms(execution, table)
    if deadline is None:
        return ReleaseClock(release_at=None, statement_timeout_ms=statement_timeout_ms)
    share = max(1, int(deadline * STATEMENT_SHARE))
    return ReleaseClock(
        release_at=time.monotonic() + deadline / 1000,
        statement_timeout_ms=min(statement_timeout_ms, share),
    )
