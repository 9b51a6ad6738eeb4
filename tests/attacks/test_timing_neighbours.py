"""Response times on two neighbouring databases must not be distinguishable.

Two `dpgate serve` at the same default config; their databases differ in exactly one
person (tag 'victim', 100 rows: without a key on `person_id`, as in a table of events),
who alone evaluates the costliest branch the analyzer accepts in 2,000 characters
(kit.BRANCH_SQL):

    SELECT COUNT(*) FROM people WHERE CASE WHEN tag = 'victim' THEN <costly, false>
                                           ELSE FALSE END

The released count is 0 on both (the branch is false), so only time could tell them apart.
Both servers declare the same row count (`rows: 2100`, public: an upper bound of either
table), so every query gets the cost model's deadline (gateway/pipeline/cost_model.py; 26 ms for
this statement on an idle gateway since issue 33's defaults — margin 2, floor 10 ms —,
110 ms before), not the 250 ms fallback; the test checks it from a dry run on each
server.
How much the victim adds without a timing policy is what gives this test its power: with
`execution: {timing: off}` it measured p = 4e-6 on commit c313166 (all 100 of the
victim's rows evaluate the branch, about 45 µs each; medians 0.30 s against 0.23 s on a
loaded 2-core machine), and p = 0.004 on commit 5b62263, where at most 10 of a person's
rows are read (about 0.5 ms a query): a one-person difference that small is within the
jitter even without the deadline.

The same query is sent to both servers at the same moment (a barrier per pair, a pair
every 30 ms whatever the servers do: `paired_sample` says why not a closed loop), so
machine load hits both alike. Each request has its own ε (≥ the minimum), so
none is answered from the cache, and the requests are spread over 25 analysts, so that no
analyst's history grows long: the auditor's work grows with it, before the deadline's
clock starts, and would drown the comparison in noise that has nothing to do with rows.
200 pairs; the two samples of response times are compared with a two-sample
Kolmogorov–Smirnov test at α = 1e-3.

So that CI does not flake while α stays 1e-3: when the first sample gives p < 1e-3, a
fresh sample of 200 pairs is drawn and the test fails only if that one is also below 1e-3.
For independent runs of a server whose timing does not depend on the victim, a false
alarm then has probability 1e-6; a real difference fails both.

The statuses must not tell the servers apart either (Fisher's exact test, same α, when
any request fails).

Measured:
- under issue 33's defaults (statement slots, margin 2, a 26 ms deadline), load average
  26-30 on 2 cores: KS p = 0.79 (D = 0.065), medians 0.29 s against 0.30 s; at that load
  (thirteen times the machine's CPUs) most requests missed their deadline (153 of 200
  against 134: Fisher p = 0.045, above α) — the residual named below, at a load far past
  what the margin is sized for; with an analyst's own misses stretching their later
  deadlines, at load 29-31: KS p = 0.11 (D = 0.12), 85 against 66 misses (Fisher
  p = 0.063);
- under the model's deadline (issue 33, load average 16-19 on 2 cores, i.e. far above the
  load the deadline is sized for; the whole test took 2 minutes): KS p = 0.088, then
  0.030 on the re-draw; but many requests missed their deadline (95 of 200 on the
  victim's server, 59 on the other: Fisher p = 0.0003, under α, then 88 against 70,
  p = 0.08 on the re-draw). Misses at that
  load are the residual docs/privacy.md names ("Whether a query completes"): whether a
  statement tips over its deadline can depend on the rows, and is charged;
- before issue 11 (commit 2efccd4): p ≈ 0 twice (KS D = 0.99: the victim's server
  answered in 0.4-0.7 s, the other in 0.03-0.04 s);
- after (commits 5e4a628 to 5b62263): p = 0.03-0.63 in eight runs (medians within 30 ms
  of each other, both at the 250 ms deadline plus the gateway's own work). Once, with
  500 victim rows, before commit 5b62263 and under heavy load, 10 of 200 requests timed
  out on the victim's server and none on the other (Fisher p = 0.0017): the many-rows
  residual that commit 5b62263 bounds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from scipy import stats

from gateway.pipeline.timing import FALLBACK_DEADLINE_MS
from tests.attacks.kit import (
    BRANCH_SQL,
    N_PEOPLE,
    PEOPLE,
    PRIVATE,
    Deployment,
    Observation,
    Person,
    costliest_branch,
    query_epsilon,
    report,
    shut_down,
    start_deployment,
    write_sqlite,
)

pytestmark = [pytest.mark.slow, pytest.mark.timing]

ALPHA = 1e-3
PAIRS = 200
WARM_PAIRS = 40  # sent first, on both servers alike, and not kept
GAP_S = 0.03  # between the moments two pairs are sent
IN_FLIGHT = 32  # threads sending pairs: enough that none waits for a free one
KEYS = 25  # analysts per server; 8 queries each per sample
QUERY = "SELECT COUNT(*) FROM people WHERE CASE WHEN tag = 'victim' THEN {branch} ELSE FALSE END"
VICTIM = Person(N_PEOPLE + 1, "victim", 1, 50, 50.0, f"{PRIVATE}0000beef")
VICTIM_ROWS = 100  # the victim's rows in the table (one person; max_rows_per_unit is 1)
#: The row count both servers declare (public, an upper bound of either table): each query
#: then gets the cost model's deadline, not the 250 ms fallback (issue 33).
ROWS = N_PEOPLE + VICTIM_ROWS


@dataclass
class Neighbours:
    with_victim: Deployment
    without: Deployment


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Neighbours]:
    deployments = []
    victim = [VICTIM] * VICTIM_ROWS
    for label, people in (("with-victim", [*PEOPLE, *victim]), ("without", PEOPLE)):
        root = tmp_path_factory.mktemp(f"attack-neighbours-{label}")
        write_sqlite(root / "people.db", people, primary_key=False)
        deployments.append(start_deployment(root, "sqlite:///people.db", label, rows=ROWS))
    yield Neighbours(*deployments)
    for d in deployments:
        shut_down(d)


def analysts(pair: Neighbours) -> list[tuple[str, str]]:
    """``KEYS`` analysts on each server (the same on both): each sends a few queries only,
    so that the auditor's work, which grows with an analyst's history, stays small."""
    return [
        (pair.with_victim.analyst(f"ks{i}"), pair.without.analyst(f"ks{i}")) for i in range(KEYS)
    ]


def paired_sample(
    pair: Neighbours, keys: list[tuple[str, str]], sql: str, first: int
) -> tuple[list[Observation], list[Observation]]:
    """``PAIRS`` requests to each server, each pair sent at the same moment, the pairs on a
    fixed schedule (one every ``GAP_S``), after ``WARM_PAIRS`` that are not kept.

    Open loop, not "the next pair once both answered": a client that waits for the slower
    of two servers couples them, and with identical databases one server settled into a
    slower regime for a whole sample (closed loop, 6 pairs in flight, identical tables:
    KS p < 1e-3 in 7 of 12 runs before the schedule counted from arrivals, 5 of 15
    after), which would make any difference — or none — look like a leak."""

    def one_pair(i: int, at: float) -> tuple[Observation, Observation]:
        epsilon = query_epsilon() * (1 + (first + i) * 1e-6)
        key_a, key_b = keys[i % len(keys)]
        pause = at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        barrier = threading.Barrier(2, timeout=120)

        def send(deployment: Deployment, key: str) -> Observation:
            barrier.wait()
            return deployment.ask(key, sql, epsilon=epsilon)

        with ThreadPoolExecutor(2) as both:
            a = both.submit(send, pair.with_victim, key_a)
            b = both.submit(send, pair.without, key_b)
            return a.result(), b.result()

    begin = time.monotonic() + 0.1
    total = WARM_PAIRS + PAIRS
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        futures = [pool.submit(one_pair, i, begin + i * GAP_S) for i in range(total)]
        results = [f.result() for f in futures][WARM_PAIRS:]
    return [a for a, _ in results], [b for _, b in results]


def distinguishable(a: list[Observation], b: list[Observation], label: str) -> float:
    """The smaller p-value of the timing (KS) and status (Fisher) comparisons."""
    ks = stats.ks_2samp([o.seconds for o in a], [o.seconds for o in b])
    failed = [sum(o.status != 200 for o in side) for side in (a, b)]
    fisher = 1.0
    if any(failed):
        table = [[failed[0], len(a) - failed[0]], [failed[1], len(b) - failed[1]]]
        fisher = float(stats.fisher_exact(table).pvalue)
    report(
        label,
        {
            "ks_p": float(ks.pvalue),
            "ks_d": float(ks.statistic),
            "fisher_p": fisher,
            "median_with_victim_s": float(sorted(o.seconds for o in a)[len(a) // 2]),
            "median_without_s": float(sorted(o.seconds for o in b)[len(b) // 2]),
            "failed_with_victim": failed[0],
            "failed_without": failed[1],
        },
    )
    return min(float(ks.pvalue), fisher)


def test_response_times_on_neighbouring_databases_are_indistinguishable(
    neighbours: Neighbours,
) -> None:
    keys = analysts(neighbours)
    branch = costliest_branch(
        neighbours.with_victim, keys[0][0], lambda b: QUERY.format(branch=b), max_sql=BRANCH_SQL
    )
    sql = QUERY.format(branch=branch)
    deadlines = []
    for deployment, key in ((neighbours.with_victim, keys[0][0]), (neighbours.without, keys[0][1])):
        status, _, body = deployment.server.call(
            "POST", "/v1/query", {"sql": sql, "dry_run": True}, key=key
        )
        assert status == 200, body
        deadlines.append(body["release_deadline_ms"])
    # the model's deadline (a function of the declared rows and the statement: the same on
    # both), not the fallback's fixed 250 ms
    assert deadlines[0] == deadlines[1] != FALLBACK_DEADLINE_MS, deadlines
    report("sqlite-timing-neighbours-deadline", {"release_deadline_ms": float(deadlines[0])})
    a, b = paired_sample(neighbours, keys, sql, first=0)
    p = distinguishable(a, b, "sqlite-timing-neighbours")
    if p < ALPHA:
        a, b = paired_sample(neighbours, keys, sql, first=WARM_PAIRS + PAIRS)
        p_again = distinguishable(a, b, "sqlite-timing-neighbours-redraw")
        assert p_again >= ALPHA, (
            f"neighbouring databases are distinguishable twice in a row: p = {p:.2e}, then "
            f"{p_again:.2e} (α = {ALPHA}); medians {sorted(o.seconds for o in a)[PAIRS // 2]:.4f}"
            f" s with the victim, {sorted(o.seconds for o in b)[PAIRS // 2]:.4f} s without"
        )
