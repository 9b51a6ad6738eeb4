"""Attack: an earlier query's answer read before its release moment, through a later one.

A query's statement may take longer when one person is there (a costly branch only
they select). Its answer leaves at a release moment fixed before it ran, but the
gateway learns the answer as soon as the statement is done. If anything a *later*
request of the same analyst gets before that moment depends on whether the answer is
known yet, the statement's running time — and so the person — shows through it:

- **the pre-audit** (a free, immediate refusal) reading the auditor's knowledge as it
  is, with the earlier answer in it once its post-audit ran;
- **a refusal recorded by a post-audit**, which refuses a repeat of that request for
  free ("refused before");
- **the answer cache**, which hands an identical request the earlier release, free,
  once it is in the ledger;
- **the history** (``GET /v1/queries``), which shows the charge's outcome once recorded.

Each attack sends query A, whose statement is made slow or fast on purpose (the secret),
then, while A is surely in flight and after the fast statement is surely done, a probe
B built to tell the two apart. What B gets (status, code, charged, cached) must be the
same whichever the secret: each of B's views may hold only answers whose release
moment has passed. The honest session beside it: B sent after A's release moment sees
A (refused free, or answered from the cache), as before.

Outcomes are deterministic here (no noise decides them), so the test compares them
exactly: a false alarm needs the probe's pre-audit to run more than a second late (B is
sent 0.3 s after A, whose release moment is 1.5 s after it started), which makes the
two secrets look alike, never different.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import gateway.pipeline.gateway
import gateway.sql.execute
from gateway.core.errors import GatewayError
from gateway.core.plan import QueryRequest
from gateway.pipeline.gateway import Gateway

pytestmark = pytest.mark.timing

DEADLINE_MS = 1500
SLOW_S = 0.8  # the secret statement's extra time when "the person is there"
PROBE_AFTER_S = 0.3  # the fast statement is done and post-audited; the slow one is not
TRIALS = 2  # per secret: outcomes are deterministic, so two show a difference

# a differencing pair: the second, post-audited against the first, is withheld
WHOLE = "SELECT COUNT(*) FROM patients WHERE age >= 0"
ALL_BUT_ONE = "SELECT COUNT(*) FROM patients WHERE age >= 0 AND age <> 99"  # 1 or 2 people
# two conditions on one column the auditor cannot relate: the second is refused, free,
# by a pre-audit that knows the first
BY_LENGTH = "SELECT COUNT(*) FROM patients WHERE LENGTH(CAST(income AS TEXT)) = 5"
BY_VALUE = "SELECT COUNT(*) FROM patients WHERE income = 50000"


def request(sql: str) -> QueryRequest:
    return QueryRequest(sql=sql, epsilon=1.0, delta=0.0, mechanism="laplace")


def outcome(gw: Gateway, analyst: str, sql: str) -> tuple[Any, ...]:
    """What the analyst observes of one request, bar its noisy values and timing."""
    try:
        release = gw.query(analyst, request(sql))
    except GatewayError as e:
        return (e.code, e.detail.get("charged"))
    return ("answered", release.cached)


class SlowStatement:
    """The protected statement, made ``delay`` seconds slower when its SQL holds
    ``marker`` (the secret's costly branch)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.delay = 0.0
        self.real = gateway.sql.execute.run_aggregate

    def __call__(self, engine: Any, sql: str, *, timeout_ms: int) -> Any:
        rows = self.real(engine, sql, timeout_ms=timeout_ms)
        if self.marker in sql:
            time.sleep(self.delay)
        return rows


def probe(
    gw: Gateway,
    slow: SlowStatement,
    analyst: str,
    secret: int,
    first: str,
    then: str,
    *,
    wait: float = PROBE_AFTER_S,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Send ``first`` (slow when ``secret`` is 1), then ``then`` ``wait`` seconds later;
    the outcomes of both."""
    slow.delay = SLOW_S * secret
    results: dict[str, tuple[Any, ...]] = {}

    def send_first() -> None:
        results["first"] = outcome(gw, analyst, first)

    thread = threading.Thread(target=send_first)
    thread.start()
    time.sleep(wait)
    results["then"] = outcome(gw, analyst, then)
    thread.join()
    return results["first"], results["then"]


@pytest.fixture
def setup(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> tuple[Gateway, SlowStatement]:
    """A gateway whose statements holding the marker are slowed by the secret; a fixed
    deadline (it takes no statement slot, so the trials do not queue on the schedule)."""
    slow = SlowStatement("99")
    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", slow)
    gw = make_gateway(
        execution={"timing": "deadline", "deadline_ms": DEADLINE_MS}, audit={"mode": "refuse"}
    )
    return gw, slow


def _analyst(gw: Gateway, name: str) -> str:
    gw.ledger.create_analyst(name, 1000.0, 1e-5)
    return name


def _observed(
    gw: Gateway,
    slow: SlowStatement,
    name: str,
    first: str,
    then: str,
    before: list[str] = (),  # type: ignore[assignment]
    *,
    wait: float = PROBE_AFTER_S,
) -> dict[int, set[tuple[Any, ...]]]:
    seen: dict[int, set[tuple[Any, ...]]] = {0: set(), 1: set()}
    for secret in (0, 1):
        for trial in range(TRIALS):
            analyst = _analyst(gw, f"{name}{secret}{trial}")
            for sql in before:
                assert outcome(gw, analyst, sql)[0] == "answered"
            seen[secret].add(probe(gw, slow, analyst, secret, first, then, wait=wait)[1])
    return seen


def test_the_pre_audit_does_not_see_an_answer_before_its_release_moment(
    setup: tuple[Gateway, SlowStatement],
) -> None:
    gw, slow = setup
    slow.marker = "LENGTH("
    seen = _observed(gw, slow, "pre", BY_LENGTH, BY_VALUE)
    assert seen[0] == seen[1], seen
    # honest session: once the first answer is out, the second is refused for free
    analyst = _analyst(gw, "honest-pre")
    assert outcome(gw, analyst, BY_LENGTH) == ("answered", False)
    assert outcome(gw, analyst, BY_VALUE) == ("audit_refused", False)


def test_a_post_audit_refusal_is_not_refused_again_before_its_release_moment(
    setup: tuple[Gateway, SlowStatement],
) -> None:
    gw, slow = setup
    seen = _observed(gw, slow, "again", ALL_BUT_ONE, ALL_BUT_ONE, before=[WHOLE])
    assert seen[0] == seen[1], seen
    # honest session: after the release moment of the withheld one, a repeat is free
    analyst = _analyst(gw, "honest-again")
    assert outcome(gw, analyst, WHOLE) == ("answered", False)
    assert outcome(gw, analyst, ALL_BUT_ONE) == ("audit_refused", True)
    assert outcome(gw, analyst, ALL_BUT_ONE) == ("audit_refused", False)


def test_the_answer_cache_does_not_serve_an_answer_before_its_release_moment(
    setup: tuple[Gateway, SlowStatement],
) -> None:
    gw, slow = setup
    slow.marker = "END >= 0"  # the compiled WHERE age >= 0 (age clamped to its bounds)
    seen = _observed(gw, slow, "cache", WHOLE, WHOLE)
    assert seen[0] == seen[1], seen
    # honest session: after the release moment, the identical request is a free hit
    analyst = _analyst(gw, "honest-cache")
    assert outcome(gw, analyst, WHOLE) == ("answered", False)
    assert outcome(gw, analyst, WHOLE) == ("answered", True)


def test_the_history_does_not_show_an_outcome_before_its_release_moment(
    setup: tuple[Gateway, SlowStatement],
) -> None:
    """``GET /v1/queries`` read while the query is in flight: its charge is there (it was
    reserved at a public moment), its outcome is not, fast statement or slow."""
    gw, slow = setup
    slow.marker = "END >= 0"
    seen: dict[int, set[tuple[Any, ...]]] = {0: set(), 1: set()}
    for secret in (0, 1):
        for trial in range(TRIALS):
            analyst = _analyst(gw, f"history{secret}{trial}")
            slow.delay = SLOW_S * secret
            thread = threading.Thread(target=outcome, args=(gw, analyst, WHOLE))
            thread.start()
            time.sleep(PROBE_AFTER_S)
            shown = gw.history(analyst)
            seen[secret].add(tuple((h["outcome"], h["release"] is None) for h in shown))
            thread.join()
    assert seen[0] == seen[1] == {(("pending", True),)}, seen
    # honest session: after the release moment the answer is in the history
    analyst = _analyst(gw, "honest-history")
    assert outcome(gw, analyst, WHOLE) == ("answered", False)
    assert [h["outcome"] for h in gw.history(analyst)] == ["answered"]
