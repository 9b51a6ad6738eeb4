"""The attacker's kit: a planted cohort, a real `dpgate serve` over it, and the scoring.

The protected table `people` holds 2,000 people. 256 of them are the targets: each has a
unique `tag` ('t000' … 't255', a quasi-identifier the attacker knows) and a secret bit
drawn from a seeded RNG, known to the test only. An attack sends one query per target and
turns what it observes into a guess of the bit; `assert_attack_fails` scores the guesses.

Servers run at the DEFAULT config (no `execution:` section, default privacy limits, audit
`refuse`; only the timeout tests shorten `database.statement_timeout_ms`, an admin's
choice): the guarantee must hold there. Each query is sent by a fresh analyst with a huge
budget (ε = 1000) at ε = max(0.01, the minimum per query), so what stops an attack is the
channel being closed, not the budget or the auditor (kit.attack says why). Requests go
out in parallel streams (``THREADS``, or $DPGATE_ATTACK_THREADS): the gateway releases
every answer that read rows at a fixed deadline, so sequential attacks would be slow.

Set $DPGATE_ATTACK_REPORT to a file to collect each attack's rates as JSON lines (they
are printed too: run with -s to see them).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import sqlite3
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import budget
from tests.test_serve import ADMIN_KEY, Server, start, stop

POSTGRES_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL")
N_PEOPLE = 2_000
N_TARGETS = 256
SEED = 20_261_111
MAX_RATE = 0.60  # the bar: chance is 50%
THREADS = int(os.environ.get("DPGATE_ATTACK_THREADS", "12"))
ANALYST_EPSILON = 1000.0
ANALYST_DELTA = 1e-5
PRIVATE = "private-note-"  # every protected note starts with this; no response may echo it
MAX_SQL = 99_000  # the gateway refuses SQL longer than 100,000 characters
# The timing attacks keep their SQL to 2,000 characters: the gateway spends CPU time on a
# query's size before it runs it (parsing, analysis, compilation: about 1 ms per node), and
# hundreds of large queries would make the tests slow. Since issue 11, 2,000 characters
# hold a branch of about 45 µs a row in SQLite (1,024 literal characters); the costliest
# the caps accept (numbers cast to text up to the 512-node cap) costs about 120 µs a row
# in 4,000 characters, and ten times the gateway's CPU time.
BRANCH_SQL = 2_000
SPENT = ("epsilon_spent", "delta_spent", "rho_spent", "queries")
DROPPED = 0  # the status recorded when the server closed the connection without a response
OUT_OF_BOUNDS = 1e300  # the targets' score, declared to lie in [0, 100]

TABLE_DDL = (
    "CREATE TABLE people (person_id INTEGER PRIMARY KEY, tag TEXT, secret INTEGER, "
    "age INTEGER, score {real}, note TEXT)"
)
CONFIG = """\
database: {{url: "{url}"{database_extra}}}
ledger: {{url: "sqlite:///ledger.db"}}
tables:
  people:
    privacy_unit: person_id{table_extra}
    columns:
      person_id: {{type: integer}}
      tag: {{type: text}}
      secret: {{type: integer, lower: 0, upper: 1}}
      age: {{type: integer, lower: 0, upper: 120}}
      score: {{type: real, lower: 0, upper: 100}}
      note: {{type: text}}
{extra_columns}"""


def query_epsilon() -> float:
    """ε per attack query: 0.01, or the gateway's minimum per query if that is larger."""
    from gateway.core.config import PrivacyConfig

    return max(0.01, float(getattr(PrivacyConfig(), "min_epsilon_per_query", 0.01)))


# -- the planted cohort ----------------------------------------------------------------


@dataclass(frozen=True)
class Person:
    person_id: int
    tag: str
    secret: int
    age: int
    score: float
    note: str


def make_people(n_people: int = N_PEOPLE, seed: int = SEED) -> list[Person]:
    """``n_people`` people; the 256 targets are scattered among them, tagged t000…t255.

    Only the 256 targets' secret bits are scored; everyone's `secret` is random."""
    rng = random.Random(seed)
    targets = rng.sample(range(1, n_people + 1), N_TARGETS)
    tag_of = {pid: f"t{j:03d}" for j, pid in enumerate(targets)}
    return [
        Person(
            person_id=pid,
            tag=tag_of.get(pid, f"p{pid:06d}"),
            secret=rng.getrandbits(1),
            age=rng.randint(18, 95),
            # The targets' scores lie far outside the declared [0, 100]: a declared bound
            # is the admin's claim, not a constraint the database enforces.
            score=OUT_OF_BOUNDS if pid in tag_of else round(rng.uniform(0, 100), 3),
            note=f"{PRIVATE}{rng.getrandbits(32):08x}",
        )
        for pid in range(1, n_people + 1)
    ]


def target_tags() -> list[str]:
    return [f"t{j:03d}" for j in range(N_TARGETS)]


def secret_bits(people: Sequence[Person]) -> list[int]:
    """The targets' bits, in tag order (t000 first): what the attacker tries to learn."""
    by_tag = {p.tag: p.secret for p in people}
    return [by_tag[t] for t in target_tags()]


PEOPLE = make_people()
TRUTH = secret_bits(PEOPLE)
assert 0.45 <= sum(TRUTH) / N_TARGETS <= 0.55, "the seed should plant about half ones"


def write_sqlite(path: Path, people: Sequence[Person], *, primary_key: bool = True) -> None:
    """The `people` table; without ``primary_key`` a person may have several rows."""
    db = sqlite3.connect(path)
    ddl = TABLE_DDL.format(real="REAL")
    db.execute(ddl if primary_key else ddl.replace(" PRIMARY KEY", ""))
    db.executemany("INSERT INTO people VALUES (?, ?, ?, ?, ?, ?)", [astuple(p) for p in people])
    db.commit()
    db.close()


def write_config(
    root: Path,
    database_url: str,
    *,
    statement_timeout_ms: int | None = None,
    extra_columns: str = "",
    schema: str | None = None,
    rows: int | None = None,
) -> Path:
    """The default config over `people` (in ``schema``, if given); ``extra_columns`` are
    YAML lines that declare more columns; ``rows`` declares the table's row count (public:
    the cost model then sets each query's deadline instead of the 250 ms fallback)."""
    extra = f", statement_timeout_ms: {statement_timeout_ms}" if statement_timeout_ms else ""
    path = root / "dpgate.yaml"
    path.write_text(
        CONFIG.format(
            url=database_url,
            database_extra=extra,
            extra_columns=extra_columns,
            table_extra=(f"\n    schema: {schema}" if schema else "")
            + (f"\n    rows: {rows}" if rows is not None else ""),
        )
    )
    return path


@dataclass
class PostgresSchema:
    """A fresh schema on the test PostgreSQL server holding one `people` table (named in
    the config with `tables.people.schema`: the gateway sets its own connection options,
    so a search_path in the URL would not reach the protected connections)."""

    base_url: str
    name: str = field(default_factory=lambda: "dpgate_attack_" + uuid.uuid4().hex[:10])

    def create(self, people: Sequence[Person]) -> None:
        engine = sa.create_engine(self.base_url)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {self.name}")
            conn.exec_driver_sql(
                TABLE_DDL.format(real="DOUBLE PRECISION").replace(
                    "TABLE people", f"TABLE {self.name}.people"
                )
            )
            conn.execute(
                sa.text(
                    f"INSERT INTO {self.name}.people VALUES (:person_id, :tag, :secret, :age, "
                    ":score, :note)"
                ),
                [p.__dict__ for p in people],
            )
        engine.dispose()

    def drop(self) -> None:
        engine = sa.create_engine(self.base_url)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {self.name} CASCADE")
        engine.dispose()


# -- talking to the gateway --------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """Everything the analyst sees of one request."""

    sql: str
    status: int
    code: str | None
    message: str
    seconds: float
    size: int
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Deployment:
    """A running `dpgate serve` over a `people` table, and its ledger."""

    server: Server
    ledger_url: str
    label: str
    names: dict[str, str] = field(default_factory=dict)  # analyst key → name

    def analyst(self, label: str) -> str:
        """A fresh analyst, created straight in the ledger; returns its key."""
        return self.analysts(label, 1)[0]

    def analysts(self, label: str, n: int) -> list[str]:
        """``n`` fresh analysts, created straight in the ledger; returns their keys."""
        ledger = budget.Ledger.from_url(self.ledger_url)
        keys = []
        try:
            ledger.migrate()
            for _ in range(n):
                name = f"{label[:40]}-{uuid.uuid4().hex[:8]}"
                key = ledger.create_analyst(name, ANALYST_EPSILON, ANALYST_DELTA)
                self.names[key] = name
                keys.append(key)
        finally:
            ledger.close()
        return keys

    def statuses(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each analyst's budget status (what GET /v1/budget shows it), read in one
        request to GET /v1/admin/analysts rather than one per key."""
        status, _, body = self.server.call("GET", "/v1/admin/analysts", key=ADMIN_KEY)
        assert status == 200, body
        by_name = {a["name"]: a for a in body["analysts"]}
        return {key: by_name[self.names[key]] for key in keys}

    def ask(
        self, key: str, sql: str, *, epsilon: float | None = None, dry_run: bool = False
    ) -> Observation:
        body: dict[str, Any] = {"sql": sql, "epsilon": epsilon or query_epsilon()}
        if dry_run:
            body["dry_run"] = True
        t0 = time.perf_counter()
        try:
            status, _, answer = self.server.call("POST", "/v1/query", body, key=key)
        except (OSError, http.client.HTTPException) as e:  # a dropped connection is seen too
            status, answer = DROPPED, {"error": {"code": type(e).__name__, "message": str(e)}}
        seconds = time.perf_counter() - t0
        error = answer.get("error") if isinstance(answer, dict) else None
        if not isinstance(error, dict):
            error = {}
        return Observation(
            sql=sql,
            status=status,
            code=error.get("code"),
            message=str(error.get("message", "")),
            seconds=seconds,
            size=len(json.dumps(answer)),
            detail=error.get("detail") or {},
        )

    def outcomes(self, key: str) -> dict[str, str]:
        """SQL → outcome of every query in the analyst's history (charged, refunded, or
        refused for free)."""
        status, _, body = self.server.call("GET", "/v1/queries?limit=10000", key=key)
        assert status == 200, body
        return {q["sql"]: q["outcome"] for q in body["queries"]}

    def run(
        self,
        keys: str | Sequence[str],
        sqls: Sequence[str],
        *,
        streams: int | None = None,
        stagger: float = 0.0,
    ) -> list[Observation]:
        """Send ``sqls``, query i as ``keys[i % len(keys)]``, in ``streams`` parallel streams
        (by default one per key, at most ``THREADS``): stream k sends queries k, k + streams,
        … one after another and starts ``k × stagger`` seconds after the first (answers that
        leave at a fixed deadline then keep the streams apart, so that their statements do
        not all run at the same moment). The gateway answers one query per analyst at a
        time: give one key per query, or a number of keys that ``streams`` divides."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        n = streams if streams is not None else min(len(keys), THREADS)
        if n <= 1:
            return [self.ask(keys[i % len(keys)], s) for i, s in enumerate(sqls)]

        def stream(k: int) -> list[Observation]:
            time.sleep(k * stagger)
            return [self.ask(keys[i % len(keys)], sqls[i]) for i in range(k, len(sqls), n)]

        with ThreadPoolExecutor(n) as pool:
            done = list(pool.map(stream, range(n)))
        return [done[i % n][i // n] for i in range(len(sqls))]


def start_deployment(root: Path, database_url: str, label: str, **config: Any) -> Deployment:
    path = write_config(root, database_url, **config)
    ledger_url = f"sqlite:///{root / 'ledger.db'}"
    ledger = budget.Ledger.from_url(ledger_url)
    ledger.migrate()
    ledger.close()
    return Deployment(server=start(root, path, workers=1), ledger_url=ledger_url, label=label)


def shut_down(deployment: Deployment) -> None:
    status = stop(deployment.server)
    assert status == 0, deployment.server.log_path.read_text()[-3000:]


# -- running and scoring an attack ----------------------------------------------------------


@dataclass
class AttackRun:
    """One attack: what each query showed, and the analysts' budgets around them."""

    label: str
    observations: list[Observation]
    before: dict[str, float]  # the analysts' spending, summed
    after: dict[str, float]
    charged: list[bool]  # per query: its analyst's count of charges went up
    history_mismatches: list[str]  # GET /v1/queries disagreeing with GET /v1/budget

    def statuses(self) -> Counter[tuple[int, str | None]]:
        return Counter((o.status, o.code) for o in self.observations)

    def spent_changed(self) -> bool:
        return any(self.before[k] != self.after[k] for k in SPENT)

    def refused_before_execution(self) -> bool:
        """Every query refused with a 4xx, and no budget touched."""
        return (
            all(400 <= o.status < 500 for o in self.observations)
            and not self.spent_changed()
            and not any(self.charged)
        )


HISTORY_SAMPLE = 16  # analysts whose GET /v1/queries is checked against their budget


def attack(
    deployment: Deployment,
    label: str,
    sqls: Sequence[str],
    *,
    streams: int = THREADS,
    stagger: float = 0.0,
) -> AttackRun:
    """Send ``sqls``, each as a fresh analyst, in ``streams`` parallel streams; record
    what comes back, and the analysts' budgets right before and after.

    One attacker, many keys. The gateway answers one query per analyst at a time (256
    queries of one analyst would take 256 release deadlines), and the auditor, defence in
    depth on top of DP, refuses an analyst's queries that single people out with the
    analyst's earlier ones. A fresh key per query keeps it out of the way, so that what is
    measured is the channel itself: DP must hold without the auditor (docs/design.md). With one
    query per analyst, a query stayed charged exactly when its analyst's count of charges
    (GET /v1/budget) went up; GET /v1/queries must say the same (checked on a sample)."""
    keys = deployment.analysts(label, len(sqls))
    before = deployment.statuses(keys)
    observations = deployment.run(keys, sqls, streams=streams, stagger=stagger)
    after = deployment.statuses(keys)
    charged = [after[k]["queries"] > before[k]["queries"] for k in keys]
    mismatches = []
    for key, sql, was_charged in list(zip(keys, sqls, charged, strict=True))[:HISTORY_SAMPLE]:
        outcome = deployment.outcomes(key).get(sql)
        in_history = outcome is not None and outcome not in ("refunded", "refused")
        if in_history != was_charged:
            mismatches.append(f"{sql[:80]!r}: history {outcome}, charged {was_charged}")

    def total(statuses: dict[str, dict[str, Any]]) -> dict[str, float]:
        return {k: sum(float(s[k] or 0.0) for s in statuses.values()) for k in SPENT}

    return AttackRun(label, observations, total(before), total(after), charged, mismatches)


_RUNS: dict[tuple[int, str], AttackRun] = {}


def attack_once(deployment: Deployment, label: str, sqls: Sequence[str]) -> AttackRun:
    """``attack``, run once per process and deployment: the error oracle and the charge
    oracle read the same 256 queries, as one attacker would."""
    cache_key = (id(deployment), label)
    if cache_key not in _RUNS:
        _RUNS[cache_key] = attack(deployment, label, sqls)
    return _RUNS[cache_key]


def rate(guesses: Sequence[int], truth: Sequence[int] = TRUTH) -> float:
    assert len(guesses) == len(truth) == N_TARGETS
    return sum(int(g == t) for g, t in zip(guesses, truth, strict=True)) / N_TARGETS


def status_guesses(run: AttackRun) -> list[int]:
    """The error oracle: bit 1 when the response is not a 200."""
    return [int(o.status != 200) for o in run.observations[:N_TARGETS]]


def charge_guesses(run: AttackRun) -> list[int]:
    """The refund oracle: bit 1 when the query did not stay charged."""
    return [int(not charged) for charged in run.charged[:N_TARGETS]]


def report(label: str, rates: dict[str, float], run: AttackRun | None = None) -> None:
    """Print the rates (shown with -s) and append them to $DPGATE_ATTACK_REPORT if set."""
    line: dict[str, Any] = {"attack": label, **{k: round(v, 4) for k, v in rates.items()}}
    if run is not None:
        line["statuses"] = {f"{s} {c}": n for (s, c), n in run.statuses().items()}
        line["spent_changed"] = run.spent_changed()
        seconds = [o.seconds for o in run.observations]
        line["median_seconds"] = round(statistics.median(seconds), 4)
    print(json.dumps(line))
    path = os.environ.get("DPGATE_ATTACK_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def assert_attack_fails(
    run: AttackRun, extra: dict[str, Sequence[int]] | None = None
) -> dict[str, float]:
    """The acceptance of issue 11 for one attack, on every channel it can read.

    The status rule (error oracle) and the charge rule (refund oracle: did the analyst's
    count of charges in GET /v1/budget go up?) are always scored, since both are visible
    to any attacker, and GET /v1/queries must agree with the budgets (on a sample);
    ``extra`` adds the attack's own guesses (e.g. from response times or sizes). Passes if
    every query was refused before execution and for free, or if no rule recovers more
    than 60% of the 256 bits. Error messages must never carry protected values, and the
    server must answer every request.
    """
    for o in run.observations:
        assert PRIVATE not in o.message, f"{run.label}: an error message quotes protected data"
    assert not run.history_mismatches, (
        f"{run.label}: GET /v1/queries and GET /v1/budget disagree on what was charged: "
        f"{run.history_mismatches[:3]}"
    )
    rates = {"status": rate(status_guesses(run)), "charge": rate(charge_guesses(run))}
    for name, guesses in (extra or {}).items():
        rates[name] = rate(guesses)
    refused = run.refused_before_execution()
    report(run.label, {**rates, "refused_before_execution": float(refused)}, run)
    dropped = sum(o.status == DROPPED for o in run.observations)
    assert not dropped, (
        f"{run.label}: the server dropped {dropped} of {len(run.observations)} connections "
        f"without a response (e.g. {next(o.message for o in run.observations if not o.status)})"
    )
    if refused:
        return rates
    leaking = {k: v for k, v in rates.items() if v > MAX_RATE}
    assert not leaking, (
        f"{run.label}: recovered {leaking} of {N_TARGETS} secret bits (bar {MAX_RATE:.0%}); "
        f"responses {dict(run.statuses())}; budget spent changed: {run.spent_changed()}; "
        f"e.g. {run.observations[0].sql[:300]!r}"
    )
    return rates


# -- the costliest branch the analyzer accepts -----------------------------------------------


def balanced(terms: Sequence[str], op: str) -> str:
    """``terms`` joined by ``op`` as a balanced tree (depth log2 n, not n)."""
    if len(terms) == 1:
        return terms[0]
    mid = len(terms) // 2
    return f"({balanced(terms[:mid], op)} {op} {balanced(terms[mid:], op)})"


def like_term(n: int) -> str:
    """A false LIKE whose cost is quadratic in ``n``: '%' restarts at every position."""
    return like(f"'{'a' * n}'", n + 1)


def like(subject: str, pattern: int, fill: str = "a") -> str:
    """``subject`` LIKE '%xx…xy' (``pattern`` characters, x = ``fill``): false for a subject
    made of x's, after about len(subject) × ``pattern`` character comparisons."""
    stop = "b" if fill != "b" else "c"
    return f"{subject} LIKE '%{fill * (pattern - 2)}{stop}'"


def literals(chunk: int, k: int, fill: str = "a") -> str:
    """A string of ``k`` × ``chunk`` ``fill`` characters, concatenated from ``k`` literals."""
    return balanced(["'" + fill * chunk + "'"] * k, "||")


DIGITS = "CAST(111111111111111 AS TEXT)"  # 15 characters of text without a string literal


def digits(k: int) -> str:
    """A string of 15·``k`` ones, concatenated from numbers cast to text."""
    return balanced([DIGITS] * k, "||")


def compare_term(n: int) -> str:
    """A false comparison of two long strings, linear in ``n`` (when LIKE is refused)."""
    return f"UPPER('{'a' * n}') = '{'A' * (n - 1)}b'"


def largest(accepts: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest n in [low, high] that ``accepts`` (assumed monotone), or None."""
    if high < low or not accepts(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if accepts(mid):
            low = mid
        else:
            high = mid - 1
    return low


def costliest_branch(
    deployment: Deployment,
    key: str,
    wrap: Callable[[str], str],
    *,
    max_sql: int = MAX_SQL,
    slack: float = 1.0,
    column: str = "note",
) -> str:
    """The costliest boolean expression the analyzer still accepts inside ``wrap(expr)``,
    in at most ``max_sql`` characters of SQL.

    Found as an attacker would, with free dry runs (they read no data). The costly part is
    a false LIKE '%xx…xy' over a long string of x's: about (string length) × (pattern
    length) character comparisons per evaluation. The longest accepted string literal and
    LIKE pattern are probed first; then the string is built in four ways, each sized to
    the analyzer's caps: one literal; as many literals as accepted, concatenated; as many
    numbers cast to text as accepted, concatenated (no string literal at all); both. The
    best of these is then repeated in as many ORed LIKEs as accepted (all false, so all
    evaluated).
    The string starts with a column (`note` by default), so that the database evaluates it
    for every row that selects the branch (SQLite evaluates a constant expression in a CASE
    branch at most once per statement); a column the query does not otherwise test, so
    that the auditor need not relate two conditions on one column. A comparison of two
    strings is the fallback.

    ``slack`` > 1 trades cost for speed: the shortest branch whose estimated cost is within
    that factor of the costliest is taken (a long one makes every request cost the gateway
    more CPU time before it runs, which slows the tests, not the attack).
    """

    def accepted(expr: str) -> bool:
        sql = wrap(expr)
        return len(sql) <= max_sql and deployment.ask(key, sql, dry_run=True).status == 200

    def subject(text: str) -> str:
        return f"({column} || {text})"

    room = max_sql - len(wrap("TRUE")) - 32
    longest = largest(lambda n: accepted(f"'{'a' * n}' LIKE 'a%'"), 1, room)
    pattern = largest(lambda n: accepted(like(column, n)), 3, room)
    if longest is None or pattern is None:
        m = largest(lambda m: accepted(compare_term(m)), 2, room // 2)
        return compare_term(m) if m else "TRUE"
    p = min(pattern, room // 2)
    candidates: list[tuple[float, str]] = []
    single = min(longest, room // 2)
    one = like(subject(f"'{'1' * single}'"), p, "1")
    if accepted(one):
        candidates.append((float(single) * p, one))
    chunk = min(longest, 4096)
    n_lit = largest(
        lambda k: accepted(like(subject(literals(chunk, k, "1")), p, "1")), 2, room // (chunk + 8)
    )
    if n_lit is not None:
        text = literals(chunk, n_lit, "1")
        candidates.append((float(n_lit) * chunk * p, like(subject(text), p, "1")))
    n_dig = largest(lambda k: accepted(like(subject(digits(k)), p, "1")), 1, room // len(DIGITS))
    if n_dig is not None:
        candidates.append((15.0 * n_dig * p, like(subject(digits(n_dig)), p, "1")))
    if n_lit is not None and n_dig is not None:  # both: literals, then numbers as text

        def both(k: int, lits: str = literals(chunk, n_lit, "1")) -> str:
            return like(subject(f"{lits} || {digits(k)}"), p, "1")

        k = largest(lambda k: accepted(both(k)), 1, n_dig)
        if k is not None:
            candidates.append(((n_lit * chunk + 15.0 * k) * p, both(k)))
    if not candidates:
        return "TRUE"
    top = max(cost for cost, _ in candidates)
    best = min((b for cost, b in candidates if cost * slack >= top), key=len)
    m = largest(lambda m: accepted(balanced([best] * m, "OR")), 2, room // len(best))
    return balanced([best] * m, "OR") if m is not None else best


# -- the padded timeout attack ------------------------------------------------------------------

PADDED = (
    "SELECT COUNT(*) FROM people WHERE CASE WHEN (tag = '{tag}' AND {condition}) "
    "OR (tag <> '{tag}' AND score < {padding:.4f}) THEN {branch} ELSE FALSE END"
)
GRID = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # paddings tried, relative to the edge
PER_PADDING = 6  # controls of each kind tried at each padding
DEADLINE_S = 0.25  # the default release deadline (public: the docs and the dry runs say it)


def padded_timeout_attack(
    deployment: Deployment,
    label: str,
    *,
    streams: int = THREADS,
    max_sql: int = 20_000,
    slack: float = 3.0,
) -> AttackRun:
    """Tip statements over their timeout with the target's rows (see test_timeout_oracle).

    A costly accepted branch is evaluated by the target's rows when its secret is 1, and
    by padding rows (`score < S`, other people) whose number the attacker tunes from
    control queries only: first the edge, the smallest S of a doubling ladder (0.001,
    0.002, …) at which the padding alone mostly times out, with ``streams`` probes in
    flight; then, under the same load, paddings below the edge, each with 6 controls
    `secret < 2` (true for every row) and 6 controls `secret > 1` (for none) in place of
    `secret = 1`, alternating; the padding whose controls differ most is used for the 256
    targets. The streams start staggered over the release deadline, so that their
    statements do not all compete for the CPU at once (which would blur the timeout with
    the load the attacker itself makes). Every query is sent by a fresh analyst.
    """

    def fresh(n: int) -> list[str]:
        return deployment.analysts(f"{label}-calibration", n)

    branch = costliest_branch(
        deployment,
        fresh(1)[0],
        lambda b: PADDED.format(
            tag="t000", condition="secret = 1 AND 9999 = 9999", padding=50.0, branch=b
        ),
        max_sql=max_sql,
        slack=slack,
    )
    probes = count()

    def query(tag: str, secret: str, padding: float) -> str:
        # `{i} = {i}`: a new text each time (no cache hit), folded away by the database.
        i = next(probes)
        condition = f"{secret} AND {i} = {i}"
        return PADDED.format(tag=tag, condition=condition, padding=padding, branch=branch)

    def control(truth: bool, padding: float) -> str:
        # The same work per row as `secret = 1`, with a result known from the declared
        # bounds [0, 1]: true for every row, or for none.
        tag = target_tags()[next(probes) % N_TARGETS]
        return query(tag, "secret < 2" if truth else "secret > 1", padding)

    stagger = DEADLINE_S / streams

    def mostly_times_out(padding: float) -> bool:
        probe = [control(False, padding) for _ in range(streams)]
        seen = deployment.run(fresh(streams), probe, stagger=stagger)
        return 2 * sum(o.status != 200 for o in seen) >= len(seen)

    # Doubling, one round of probes at a time: a probe far past the edge would cost the
    # database the most.
    edge = 0.001
    while edge < 100 and not mostly_times_out(edge):
        edge *= 2
    grid = [edge * f for f in GRID]
    probes_sql = [control(t, s) for s in grid for _ in range(PER_PADDING) for t in (True, False)]
    seen = iter(deployment.run(fresh(len(probes_sql)), probes_sql, stagger=stagger))
    separation = {}
    for s in grid:
        fails = [next(seen).status != 200 for _ in range(2 * PER_PADDING)]
        separation[s] = (sum(fails[0::2]) - sum(fails[1::2])) / PER_PADDING
    padding = max(grid, key=lambda s: separation[s])
    sqls = [query(tag, "secret = 1", padding) for tag in target_tags()]
    assert deployment.ask(fresh(1)[0], sqls[-1], dry_run=True).status == 200, "refused"
    run = attack(deployment, label, sqls, streams=streams, stagger=stagger)
    report(label, {"edge": edge, "padding": padding, "separation": separation[padding]})
    return run
