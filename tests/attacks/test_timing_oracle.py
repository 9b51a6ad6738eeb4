"""The timing oracle: a costly expression that only the secret row evaluates.

    SELECT COUNT(*) FROM people WHERE CASE WHEN tag = 't017' AND secret = 1
                                           THEN <costly, false> ELSE FALSE END

The attacker calibrates a threshold a priori, from control queries whose outcome it knows
without any secret: the same branch under `tag = 't…' AND 1 = 1` (one row evaluates it, as
when the bit is 1) and under `tag = 'absent…'` (no row does). The threshold is the midpoint
of the two medians; a target's bit is guessed 1 when its response is slower. The truth is
never used to pick it. The size of the response is scored too (bit 1 when it is larger
than the median size of the run). Every query is sent by a fresh analyst (kit.attack), in
12 parallel streams; if the server answers one request at a time altogether (it did before
issue 11), the attacker sees that from a burst of controls and sends one query at a time,
so that queueing does not blur the timings.

Two branches: the issue's (a 30 KB string LIKE '%aaa…b', quadratic in its length), and the
costliest branch the analyzer accepts in 20,000 characters (or a shorter one within a
factor 3 of its cost, which spares the gateway's CPU), found with free dry runs
(kit.costliest_branch).

Measured recovery of the 256 bits:
- before issue 11 (commit 2efccd4): 100% by time with the 30 KB branch (0.38 s against
  0.01 s), 98.8-99.6% with the costliest (an 18 KB LIKE: 35 ms against 8 ms);
- after (commit 5b62263): the 30 KB branch is refused before execution, for free, as
  unsupported_query naming its limit (max_string_literal); the costliest accepted branch
  (1,024 literal characters, about 45 µs a row) gives 45-54% by time, 44-52% by size, and
  every answer leaves at the 250 ms deadline (medians 0.28-0.34 s under test load).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest

from tests.attacks.kit import (
    N_TARGETS,
    THREADS,
    AttackRun,
    Deployment,
    assert_attack_fails,
    attack,
    costliest_branch,
    like_term,
    report,
    target_tags,
)

pytestmark = [pytest.mark.slow, pytest.mark.timing]

QUERY = "SELECT COUNT(*) FROM people WHERE CASE WHEN {condition} THEN {branch} ELSE FALSE END"
N_CONTROLS = 16


def wrap(condition: str) -> Callable[[str], str]:
    return lambda branch: QUERY.format(condition=condition, branch=branch)


def pick_streams(
    deployment: Deployment, keys: list[str], false_control: Callable[[int], str]
) -> int:
    """One stream if the server answers one request at a time, else one per key."""
    alone = min(deployment.ask(keys[i], false_control(i)).seconds for i in range(2))
    burst = deployment.run(keys, [false_control(2 + i) for i in range(len(keys))])
    slowest = max(o.seconds for o in burst)
    return len(keys) if slowest < alone * len(keys) / 2 else 1


def timing_attack(deployment: Deployment, label: str, branch: str) -> AttackRun:
    def true_control(i: int) -> str:
        return wrap(f"tag = '{target_tags()[i % N_TARGETS]}' AND {i} = {i}")(branch)

    def false_control(i: int) -> str:
        return wrap(f"tag = 'absent-{i}'")(branch)

    streams = pick_streams(
        deployment, deployment.analysts(f"{label}-calibration", THREADS), false_control
    )
    controls = [f(i) for i in range(100, 100 + N_CONTROLS) for f in (true_control, false_control)]
    keys = deployment.analysts(f"{label}-calibration", len(controls))
    seen = deployment.run(keys, controls, streams=streams)
    slow = statistics.median(o.seconds for o in seen[0::2])
    fast = statistics.median(o.seconds for o in seen[1::2])
    threshold = (slow + fast) / 2
    sqls = [wrap(f"tag = '{tag}' AND secret = 1")(branch) for tag in target_tags()]
    run = attack(deployment, label, sqls, streams=streams)
    guesses = [int(o.seconds > threshold) for o in run.observations]
    # Response size too: bit 1 when larger than the run's median (no truth used).
    middle = statistics.median(o.size for o in run.observations)
    sizes = [int(o.size > middle) for o in run.observations]
    report(
        label,
        {"control_slow_s": slow, "control_fast_s": fast, "streams": streams, "branch": len(branch)},
    )
    assert_attack_fails(run, {"time": guesses, "size": sizes})
    return run


def test_the_issues_30kb_like_branch_reveals_nothing(sqlite_gateway: Deployment) -> None:
    """Expected since issue 11: refused before execution, for free, as unsupported_query
    naming the limit it exceeds."""
    run = timing_attack(sqlite_gateway, "sqlite-timing-30kb-like", like_term(30_000))
    if run.refused_before_execution():
        for o in run.observations:
            assert o.code == "unsupported_query", (o.status, o.code, o.message)
            assert "limit" in o.detail or "limit" in o.message, o.message


def test_the_costliest_accepted_branch_reveals_nothing(sqlite_gateway: Deployment) -> None:
    key = sqlite_gateway.analyst("timing-costliest")
    branch = costliest_branch(
        sqlite_gateway, key, wrap("tag = 't000' AND secret = 1"), max_sql=20_000, slack=3.0
    )
    probe = wrap("tag = 't255' AND secret = 1")(branch)
    assert sqlite_gateway.ask(key, probe, dry_run=True).status == 200, "the attack is refused"
    timing_attack(sqlite_gateway, "sqlite-timing-costliest-accepted", branch)
