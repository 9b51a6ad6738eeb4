"""Release moments that fit the query (gateway/pipeline/timing.py, gateway/pipeline/cost_model.py)
and the
concurrent queries of one analyst (gateway/pipeline/lanes.py).

What must hold (docs/privacy.md, "Timing"): a query's release moment is a function of
public facts only — the plan, the config, the catalogue, arrival times and earlier
release moments —; one analyst's queries run their statements concurrently while the
auditor decides in an order fixed before any statement ran; a statement still running
at its deadline is abandoned and reported, charged, at the release moment, whatever the
engine does with the cancel. Timing figures (latency, a dashboard's wall time) are
measured by `python -m bench --parts dashboard`, not asserted here.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

import gateway.pipeline.gateway
import gateway.pipeline.timing
import gateway.sql.execute
from gateway.core.config_load import parse_config
from gateway.core.errors import DatabaseUnavailable
from gateway.core.plan import QueryRequest
from gateway.pipeline.cost_model import ENGINE_COSTS
from gateway.pipeline.gateway import CHARGED_FAILURE_MESSAGE, Gateway
from gateway.pipeline.timing import (
    AHEAD_SHARE,
    ARRIVAL_WINDOW_S,
    FALLBACK_DEADLINE_MS,
    FORGET_BATCH,
    HORIZON_S,
    MIN_STEP_MS,
    StatementSlots,
    admitted_by,
)
from gateway.sql.compile import CompiledQuery

pytestmark = pytest.mark.timing

DEADLINE = {"timing": "deadline"}
DASHBOARD = [
    "SELECT COUNT(*) FROM patients",
    "SELECT AVG(age) FROM patients",
    "SELECT sex, COUNT(*) FROM patients GROUP BY sex",
    "SELECT disease, COUNT(*) FROM patients GROUP BY disease",
    "SELECT city, AVG(income) FROM patients GROUP BY city",
    "SELECT smoker, AVG(glucose) FROM patients GROUP BY smoker",
    "SELECT AVG(glucose) FROM patients",
    "SELECT SUM(income) FROM patients",
]


def request(sql: str, epsilon: float = 0.1) -> QueryRequest:
    return QueryRequest(sql=sql, epsilon=epsilon, delta=0.0, mechanism="laplace")


def deadline_of(gw: Gateway, sql: str) -> float | None:
    planned = gw.planner.plan(request(sql))
    plan = planned.plan  # type: ignore[union-attr]
    compiled = gw._compile(planned)  # type: ignore[arg-type]
    return gw.timing.deadline_ms(plan, gw.config.tables[plan.table], compiled)


def drop_one_patient(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        pid = conn.execute("SELECT MIN(patient_id) FROM patients").fetchone()[0]
        conn.execute("DELETE FROM visits WHERE patient_id = ?", (pid,))
        conn.execute("DELETE FROM patients WHERE patient_id = ?", (pid,))


def misses(stage: str) -> float:
    return sum(
        s.value
        for m in REGISTRY.collect()
        for s in m.samples
        if s.name == "dpgate_deadline_misses_total" and s.labels.get("stage") == stage
    )


# -- deadlines from public facts -----------------------------------------------------------


@pytest.fixture
def idle_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's load average read as 0: the tests below compare deadlines, which
    must not move with the load of a shared test machine between two reads."""
    monkeypatch.setattr("gateway.pipeline.timing.machine_load", lambda: 0.0)


def test_neighbouring_databases_give_every_query_the_same_deadline(
    make_gateway: Callable[..., Gateway], idle_machine: None
) -> None:
    """Nothing is measured on the protected rows: the deadline is the config's and the
    plan's, so a database with one person fewer gives the same one, for every query."""
    a = make_gateway(execution=DEADLINE)
    b = make_gateway(drop_one_patient, execution=DEADLINE)
    queries = [
        *DASHBOARD,
        "SELECT department, COUNT(*) FROM visits GROUP BY department",
        "SELECT MEDIAN(cost) FROM visits",
        "SELECT region, COUNT(*) FROM patients JOIN zip_regions "
        "ON patients.zip = zip_regions.zip GROUP BY region",
    ]
    for sql in queries:
        assert deadline_of(a, sql) == deadline_of(b, sql), sql
    assert a.timing.model == b.timing.model


def test_the_deadline_follows_the_querys_cost(
    make_gateway: Callable[..., Gateway], idle_machine: None
) -> None:
    gw = make_gateway(execution=DEADLINE)
    count = deadline_of(gw, "SELECT COUNT(*) FROM patients")
    median = deadline_of(gw, "SELECT MEDIAN(age) FROM patients")
    bounded = deadline_of(gw, "SELECT department, COUNT(*) FROM visits GROUP BY department")
    assert count is not None and median is not None and bounded is not None
    # a plain count on the demo's 12,000 patients: well under the old fixed 250 ms
    assert count < 250
    # a quantile's fine histogram (a second branch of its statement) costs at least a
    # count; a table read through its per-person bound costs more
    assert median >= count
    assert bounded > 2 * count
    # the release moment waits for more when more statements are in flight (public)
    planned = gw.planner.plan(request("SELECT COUNT(*) FROM patients"))
    plan = planned.plan  # type: ignore[union-attr]
    compiled = gw._compile(planned)  # type: ignore[arg-type]
    table = gw.config.tables["patients"]
    many = gw.timing.deadline_ms(plan, table, compiled, in_flight=20)
    assert many is not None and many > count
    # and when the machine is busy (its load average, in steps)
    model = gw.timing.model
    assert model is not None and model.cpus >= 1
    assert model.load_factor(1, 0.0) == 1.0
    cpus = model.cpus
    assert model.load_factor(cpus, 4.0 * cpus) == 5.0
    assert model.load_factor(cpus, 2.5 * cpus) == pytest.approx(2**1.5 + 1)


def test_requests_present_lengthen_a_statements_allowance_not_its_slot(
    make_gateway: Callable[..., Gateway], idle_machine: None
) -> None:
    """Requests that reached the pipeline in the last ``ARRIVAL_WINDOW_S`` (public:
    arrival times) each add ``interpreter_ms`` to the allowance of a statement starting
    beside them (their Python work shares the interpreter with it); the statement's slot
    is reserved for the model's allowance alone, so the statements after it do not move."""
    gw = make_gateway(execution={**DEADLINE, "interpreter_ms": 3})
    planned = gw.planner.plan(request("SELECT COUNT(*) FROM patients"))
    plan = planned.plan  # type: ignore[union-attr]
    compiled = gw._compile(planned)  # type: ignore[arg-type]
    table = gw.config.tables["patients"]

    def allowance_and_reservation() -> tuple[float, float]:
        clock = gw.timing.start(plan, table, compiled, 10_000)
        assert clock.statement_until is not None and clock.fixed_at is not None
        slot = max(gw.timing._slot_free)
        return clock.statement_until - clock.fixed_at, slot - clock.fixed_at

    alone, alone_slot = allowance_and_reservation()
    time.sleep(ARRIVAL_WINDOW_S + 0.05)  # its release moment and the window have passed
    gw.timing._slot_free = [0.0] * len(gw.timing._slot_free)
    for _ in range(11):
        gw.timing.arrived()
    crowded, crowded_slot = allowance_and_reservation()
    assert crowded - alone == pytest.approx(10 * 0.003, abs=0.003)
    assert crowded_slot == pytest.approx(alone_slot, abs=0.003)


def test_the_schedule_counts_from_the_arrival_not_from_the_admissions_end(
    make_gateway: Callable[..., Gateway],
) -> None:
    """How long a query's own admission took (compiling, its lane, the pre-audit, the
    reservation: work that other queries' statements, whose running time depends on the
    rows, can slow down) does not move its release moment while it stays within the
    allowance; past it, the moment moves by a whole step (the allowance doubled, until
    the admission fits), never by the admission's own length. Requests that arrived after
    it do not count in its allowance, whenever its schedule is fixed."""
    first = make_gateway(execution=DEADLINE)
    planned = first.planner.plan(request("SELECT COUNT(*) FROM patients"))
    plan = planned.plan  # type: ignore[union-attr]
    table = first.config.tables["patients"]

    def fresh() -> tuple[Gateway, CompiledQuery]:
        gw = make_gateway(execution={**DEADLINE, "admission_ms": 200})
        return gw, gw._compile(planned)  # type: ignore[arg-type]

    prompt, compiled = fresh()
    since = prompt.timing.arrived()
    quick = prompt.timing.start(plan, table, compiled, 10_000, arrival=since)
    assert quick.release_at is not None
    slow, _ = fresh()
    since_slow = slow.timing.arrived()
    time.sleep(0.03)  # an admission slowed down, within its 200 ms
    for _ in range(5):  # and requests that arrived meanwhile
        slow.timing.arrived()
    late = slow.timing.start(plan, table, compiled, 10_000, arrival=since_slow)
    assert late.release_at is not None
    assert late.release_at - since_slow.at == pytest.approx(quick.release_at - since.at, abs=1e-6)
    overrun, _ = fresh()
    since_overrun = overrun.timing.arrived()
    time.sleep(0.25)  # past its allowance: one step later (400 ms), not 50 ms later
    stepped = overrun.timing.start(plan, table, compiled, 10_000, arrival=since_overrun)
    assert stepped.release_at is not None
    moved = (stepped.release_at - since_overrun.at) - (quick.release_at - since.at)
    assert moved == pytest.approx(0.200, abs=1e-6)


def test_requests_ahead_in_the_lane_count_whichever_fixed_its_schedule_first(
    make_gateway: Callable[..., Gateway],
) -> None:
    """A query's admission allowance grows with the requests of its audit scope that
    arrived before it and whose admission the schedule has not done by its arrival (their
    pre-audits and post-audits hold the lane first); whether those fixed their own
    schedule before it or after it (which depends on how long admissions really took)
    changes nothing."""
    first = make_gateway(execution=DEADLINE)
    planned = first.planner.plan(request("SELECT COUNT(*) FROM patients"))
    plan = planned.plan  # type: ignore[union-attr]
    table = first.config.tables["patients"]
    compiled = first._compile(planned)  # type: ignore[arg-type]

    def second_after(first_fixes_first: bool, scope_b: str = "erin") -> float:
        timing = make_gateway(execution={**DEADLINE, "admission_ms": 50}).timing
        a = timing.arrived("erin")
        b = timing.arrived(scope_b)
        if first_fixes_first:
            timing.start(plan, table, compiled, 10_000, arrival=a)
        clock = timing.start(plan, table, compiled, 10_000, arrival=b)
        if not first_fixes_first:
            timing.start(plan, table, compiled, 10_000, arrival=a)
        assert clock.release_at is not None
        return clock.release_at - b.at

    in_order, out_of_order = second_after(True), second_after(False)
    assert in_order == pytest.approx(out_of_order, abs=0.002)
    # the one ahead added its share; another scope's request does not
    alone = second_after(True, scope_b="finn")
    assert in_order - alone == pytest.approx(AHEAD_SHARE * 0.050, abs=0.01)


def test_a_request_released_before_an_arrival_is_not_present_beside_it(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One client asking one question after another: the answers already released when
    the next question arrives add nothing to its schedule (they counted as present for
    ``ARRIVAL_WINDOW_S`` before, ~9 ms on a 50 ms answer); one still on its way does,
    and so does one refused before its statement (it has no release moment: whether it
    was refused yet is not public)."""
    first = make_gateway(execution=DEADLINE)
    planned = first.planner.plan(request("SELECT COUNT(*) FROM patients"))
    plan = planned.plan  # type: ignore[union-attr]
    table = first.config.tables["patients"]
    compiled = first._compile(planned)  # type: ignore[arg-type]
    clock = [1000.0]
    monkeypatch.setattr(gateway.pipeline.timing.time, "monotonic", lambda: clock[0])

    def deadline_after(earlier: str) -> float:
        clock[0] = 1000.0
        timing = make_gateway(execution=DEADLINE).timing
        if earlier != "none":
            a = timing.arrived("erin")
            if earlier == "refused":
                clock[0] += 0.005
            else:
                released = timing.start(plan, table, compiled, 10_000, arrival=a).release_at
                assert released is not None
                # the next question arrives just after the answer, or just before it
                clock[0] = released + (0.001 if earlier == "released" else -0.001)
        b = timing.arrived("erin")
        clock_b = timing.start(plan, table, compiled, 10_000, arrival=b)
        assert clock_b.release_at is not None
        return clock_b.release_at - b.at

    alone = deadline_after("none")
    assert deadline_after("released") == pytest.approx(alone, abs=1e-9)
    assert deadline_after("on its way") > alone
    # a refused one: present beside it, and ahead of it in its analyst's lane
    ex = make_gateway(execution=DEADLINE).config.execution
    extra_ms = ex.interpreter_ms + AHEAD_SHARE * ex.admission_ms
    assert deadline_after("refused") == pytest.approx(alone + extra_ms / 1000, abs=1e-9)


def test_what_the_schedule_remembers_of_arrivals_is_bounded(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrivals, and the scopes they came from (one per analyst), are forgotten once no
    schedule can count them any more (issue 36: memory that stays flat)."""
    clock = [1000.0]
    monkeypatch.setattr(gateway.pipeline.timing.time, "monotonic", lambda: clock[0])
    timing = make_gateway(execution=DEADLINE).timing
    for i in range(2 * FORGET_BATCH):
        timing.arrived(f"analyst-{i}")
    clock[0] += ARRIVAL_WINDOW_S + HORIZON_S + 1
    for _ in range(2 * FORGET_BATCH):
        timing.arrived("erin")
    assert list(timing._by_scope) == ["erin"]
    assert len(timing._arrivals) <= 2 * FORGET_BATCH + 1


def test_an_admission_past_its_allowance_moves_by_whole_steps() -> None:
    assert admitted_by(10.0, 4.0, 10.003) == pytest.approx(10.004)
    assert admitted_by(10.0, 4.0, 10.004) == pytest.approx(10.004)
    assert admitted_by(10.0, 4.0, 10.0041) == pytest.approx(10.008)
    assert admitted_by(10.0, 4.0, 10.020) == pytest.approx(10.032)
    # a fixed deadline's allowance is 0: its steps start at MIN_STEP_MS
    assert admitted_by(10.0, 0.0, 10.0) == pytest.approx(10.0)
    assert admitted_by(10.0, 0.0, 10.0025) == pytest.approx(10.0 + 4 * MIN_STEP_MS / 1000)
    # every moment it gives is on the grid since + allowance·2ᵏ, whatever ``now`` was
    grid = {round(10.0 + 0.004 * 2**k, 9) for k in range(12)}
    for now in (10.0 + i * 0.0007 for i in range(1, 400)):
        assert round(admitted_by(10.0, 4.0, now), 9) in grid


def test_without_a_declared_row_count_the_fixed_deadline_applies(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway(execution=DEADLINE, tables=_without_rows(make_gateway))
    assert deadline_of(gw, "SELECT COUNT(*) FROM patients") == FALLBACK_DEADLINE_MS
    fixed = make_gateway(execution={"timing": "deadline", "deadline_ms": 321})
    assert deadline_of(fixed, "SELECT MEDIAN(cost) FROM visits") == 321
    off = make_gateway(execution={"timing": "off"})
    assert deadline_of(off, "SELECT COUNT(*) FROM patients") is None


def _without_rows(make_gateway: Callable[..., Gateway]) -> dict[str, Any]:
    import yaml

    from gateway.demo.hospital import config_yaml

    tables: dict[str, Any] = yaml.safe_load(config_yaml("x.db", "l.db"))["tables"]
    for t in tables.values():
        t.pop("rows", None)
    return tables


def test_the_cost_model_settings_are_checked() -> None:
    base = {"database": {"url": "sqlite:///x.db"}, "ledger": {"url": "sqlite:///l.db"}}
    table = {"t": {"rows": 1000, "columns": {"a": {"type": "integer"}}}}
    cfg = parse_config({**base, "tables": table, "execution": {"row_ns": 10, "base_ms": 2}})
    assert cfg.tables["t"].rows == 1000
    assert cfg.execution.row_ns == 10 and cfg.execution.base_ms == 2
    assert cfg.execution.interpreter_ms == 1.0
    bad_settings = (
        {"row_ns": -1},
        {"deadline_margin": 0.5},
        {"post_ms": 0},
        {"speed": 1},
        {"interpreter_ms": -1},
    )
    for bad in bad_settings:
        with pytest.raises(Exception, match="execution"):
            parse_config({**base, "tables": table, "execution": bad})
    with pytest.raises(Exception, match="rows"):
        parse_config({**base, "tables": {"t": {**table["t"], "rows": -5}}})
    assert "sqlite" in ENGINE_COSTS and "spark" in ENGINE_COSTS


def test_a_dry_run_shows_the_querys_own_deadline(
    make_gateway: Callable[..., Gateway], idle_machine: None
) -> None:
    gw = make_gateway(execution=DEADLINE)
    gw.ledger.create_analyst("dana", 10.0, 1e-6)
    sql = "SELECT COUNT(*) FROM patients"
    release = gw.query("dana", QueryRequest(sql, 0.1, 0.0, "laplace", dry_run=True))
    assert release.extra["release_deadline_ms"] == deadline_of(gw, sql)


# -- one analyst's dashboard ---------------------------------------------------------------


class Statements:
    """Records when each protected statement ran (wrapping the real one)."""

    def __init__(self, slow_first: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[float, float]] = []
        self.slow_first = slow_first
        self.real = gateway.sql.execute.run_aggregate

    def __call__(self, engine: Any, sql: str, *, timeout_ms: int) -> Any:
        with self.lock:
            first = not self.spans and not getattr(self, "started", False)
            self.started = True
        start = time.monotonic()
        rows = self.real(engine, sql, timeout_ms=timeout_ms)
        if first and self.slow_first:
            time.sleep(self.slow_first)  # the first ticket's statement ends last
        with self.lock:
            self.spans.append((start, time.monotonic()))
        return rows

    def most_at_once(self) -> int:
        events = sorted([(s, 1) for s, _ in self.spans] + [(e, -1) for _, e in self.spans])
        now = best = 0
        for _, step in events:
            now += step
            best = max(best, now)
        return best


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[Statements]:
    recorder = Statements(slow_first=1.0)
    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", recorder)
    yield recorder


def test_a_dashboard_of_one_analyst_overlaps_and_is_audited_in_ticket_order(
    make_gateway: Callable[..., Gateway], statements: Statements
) -> None:
    """Eight charts fired at once by one analyst: their statements overlap; the first
    ticket's statement is made to end last, yet every post-audit runs in ticket order,
    and the release moments follow the tickets."""
    # deadlines generous enough for the slowed statement on a loaded machine
    gw = make_gateway(execution={**DEADLINE, "min_deadline_ms": 5000}, audit={"mode": "refuse"})
    gw.ledger.create_analyst("dana", 100.0, 1e-6)
    reserved: list[str] = []
    remembered: list[str] = []
    releases: list[float | None] = []
    reserve, remember, start = gw.charges.reserve, gw.audit.remember, gw.timing.start

    def reserving(*a: Any, **k: Any) -> Any:
        r = reserve(*a, **k)
        reserved.append(r.id)
        return r

    def remembering(scope: str, query_id: str, *a: Any) -> None:
        remembered.append(query_id)
        remember(scope, query_id, *a)

    def starting(*a: Any, **k: Any) -> Any:
        clock = start(*a, **k)
        releases.append(clock.release_at)
        return clock

    gw.charges.reserve = reserving  # type: ignore[method-assign]
    gw.audit.remember = remembering  # type: ignore[method-assign,assignment]
    gw.timing.start = starting  # type: ignore[method-assign]
    barrier = threading.Barrier(len(DASHBOARD))

    def chart(sql: str) -> Any:
        barrier.wait()
        return gw.query("dana", request(sql, epsilon=1.0))

    with ThreadPoolExecutor(len(DASHBOARD)) as pool:
        answers = list(pool.map(chart, DASHBOARD))
    assert all(a.rows for a in answers)
    assert statements.most_at_once() >= 2, statements.spans
    assert remembered == reserved
    moments = [r for r in releases if r is not None]
    assert len(moments) == len(DASHBOARD)
    assert all(b - a >= 0.002 - 1e-9 for a, b in itertools.pairwise(moments))


def test_statements_share_the_cpus_on_a_public_schedule(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dashboard fired at once: at most one statement per CPU runs at a time, so the
    first chart's statement is not slowed by the charts that arrived after its deadline
    was fixed; each statement's slot starts, by the public schedule, when an earlier
    reservation ends (never when a statement really ended), and its release moment
    follows from that start."""
    monkeypatch.setattr("gateway.pipeline.cost_model.cpu_count", lambda: 2)
    recorder = Statements()
    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", recorder)
    gw = make_gateway(execution={**DEADLINE, "min_deadline_ms": 2000}, audit={"mode": "refuse"})
    assert gw.timing.slots.slots == 2
    gw.ledger.create_analyst("dana", 100.0, 1e-6)
    clocks: list[Any] = []
    start = gw.timing.start

    def starting(*a: Any, **k: Any) -> Any:
        clock = start(*a, **k)
        clocks.append(clock)
        return clock

    gw.timing.start = starting  # type: ignore[method-assign]
    barrier = threading.Barrier(len(DASHBOARD))

    def chart(sql: str) -> Any:
        barrier.wait()
        return gw.query("dana", request(sql, epsilon=1.0))

    with ThreadPoolExecutor(len(DASHBOARD)) as pool:
        answers = list(pool.map(chart, DASHBOARD))
    assert all(a.rows for a in answers)
    assert recorder.most_at_once() <= 2, recorder.spans
    # two slots, each reserved for a statement's modelled allowance (2 s here; the
    # interpreter's share for the requests present lengthens a statement's own allowance
    # only): the third ticket's slot starts when the first reservation ends, though every
    # statement ended long before (it ran early, in a slot that was really free)
    first, second, third = clocks[:3]
    assert third.starts_at >= min(first.starts_at, second.starts_at) + 2.0 - 1e-9
    assert first.statement_until >= first.starts_at + 2.0
    assert third.release_at >= third.starts_at + 2.0
    assert max(end for _, end in recorder.spans) < third.starts_at


def test_a_statement_slot_is_taken_at_its_public_start_whatever_still_runs() -> None:
    """A statement abandoned at its deadline may run on in the background: the next one
    enters its slot at its public start anyway, so the late one cannot delay it."""
    slots = StatementSlots(1)
    entered = threading.Event()
    with slots.enter(None):
        at = time.monotonic() + 0.2

        def later() -> None:
            with slots.enter(at):
                entered.set()

        waiter = threading.Thread(target=later)
        waiter.start()
        assert not entered.wait(0.1)  # the slot is busy and its start is not yet due
        assert entered.wait(2.0)  # due: it enters beside the late statement
        assert time.monotonic() >= at
        waiter.join()


def test_a_fixed_deadline_takes_no_slot(make_gateway: Callable[..., Gateway]) -> None:
    """A fixed (or fallback) deadline is a worst case chosen for any concurrency: its
    statements take no slot, so many at once do not push each other's release moments."""
    gw = make_gateway(execution={**DEADLINE, "deadline_ms": 300})
    planned = gw.planner.plan(request("SELECT COUNT(*) FROM patients"))
    plan = planned.plan  # type: ignore[union-attr]
    compiled = gw._compile(planned)  # type: ignore[arg-type]
    table = gw.config.tables["patients"]
    for _ in range(8):
        now = time.monotonic()
        clock = gw.timing.start(plan, table, compiled, 10_000)
        assert clock.starts_at is None and clock.release_at is not None
        assert clock.release_at - now == pytest.approx(0.3, abs=0.05)


def test_a_differencing_pair_fired_at_once_is_still_caught(
    make_gateway: Callable[..., Gateway],
) -> None:
    """Both halves of a differencing pair sent at the same moment by one analyst: the
    later ticket's post-audit sees the earlier's answer, so at most one is released."""
    gw = make_gateway(execution=DEADLINE, audit={"mode": "refuse"})
    gw.ledger.create_analyst("mallory", 100.0, 1e-6)
    pair = [
        "SELECT COUNT(*) FROM patients WHERE age >= 0",
        "SELECT COUNT(*) FROM patients WHERE age >= 0 AND patient_id <> 17",
    ]
    barrier = threading.Barrier(2)

    def ask(sql: str) -> Any:
        barrier.wait()
        try:
            return gw.query("mallory", request(sql, epsilon=1.0))
        except Exception as e:
            return e

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(ask, pair))
    released = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(released) <= 1, outcomes


# -- misses ----------------------------------------------------------------------------------


def test_a_statement_past_its_deadline_is_reported_at_the_release_moment(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver that ignores the cancel (Spark's planning does): the statement goes on
    for a second, but the charged failure leaves at the release moment, the miss is
    counted, and the history says withheld."""
    real = gateway.sql.execute.run_aggregate

    def ignores_cancel(engine: Any, sql: str, *, timeout_ms: int) -> Any:
        time.sleep(1.0)
        return real(engine, sql, timeout_ms=timeout_ms)

    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", ignores_cancel)
    gw = make_gateway(execution={**DEADLINE, "deadline_ms": 100})
    gw.ledger.create_analyst("erin", 100.0, 1e-6)
    before, before_release = misses("statement"), misses("release")
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as failure:
        gw.query("erin", request("SELECT COUNT(*) FROM patients"))
    elapsed = time.monotonic() - started
    assert 0.1 <= elapsed < 0.9, elapsed
    assert failure.value.to_dict()["error"]["message"] == CHARGED_FAILURE_MESSAGE
    assert misses("statement") == before + 1
    assert misses("release") == before_release  # one miss, counted once, by its stage
    ((outcome, record),) = [(h.outcome, h.release) for h in gw.ledger.history("erin")]
    assert outcome == "withheld" and record is not None
    # its release moment, past by now: the history shows the outcome from then on only
    assert record.pop("visible_at") <= time.time()
    assert record == {"withheld": True, "failed": True}


def test_a_miss_recorded_after_its_release_moment_is_counted_once(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement miss whose charged failure reaches the ledger only after the release
    moment (a slow ledger, a loaded machine) is one miss, of its stage — not a second,
    "release", one (bench/dashboard.py counted more misses than queries)."""
    real = gateway.sql.execute.run_aggregate

    def ignores_cancel(engine: Any, sql: str, *, timeout_ms: int) -> Any:
        time.sleep(0.5)
        return real(engine, sql, timeout_ms=timeout_ms)

    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", ignores_cancel)
    gw = make_gateway(execution={**DEADLINE, "deadline_ms": 100})
    gw.ledger.create_analyst("erin", 100.0, 1e-6)
    withheld = gw.charges.withheld

    def slow_ledger(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)  # past the release moment
        return withheld(*args, **kwargs)

    monkeypatch.setattr(gw.charges, "withheld", slow_ledger)
    before = {stage: misses(stage) for stage in ("statement", "turn", "release")}
    with pytest.raises(DatabaseUnavailable):
        gw.query("erin", request("SELECT COUNT(*) FROM patients"))
    after = {stage: misses(stage) for stage in before}
    assert after == {**before, "statement": before["statement"] + 1}


def test_a_query_whose_declared_rows_understate_the_table_misses_and_stays_charged(
    make_gateway: Callable[..., Gateway], idle_machine: None
) -> None:
    """A statement made slow on purpose, on the real engine: `visits` declared to hold a
    handful of rows, so the costly query gets the least deadline and cannot make it."""
    tables = _without_rows(make_gateway)
    tables["visits"]["rows"] = 1
    tables["patients"]["rows"] = 1  # every visits query joins patients (every_row_matches)
    gw = make_gateway(
        execution={**DEADLINE, "min_deadline_ms": 1, "post_ms": 5, "deadline_margin": 1},
        tables=tables,
    )
    gw.ledger.create_analyst("erin", 100.0, 1e-6)
    sql = "SELECT department, AVG(cost) FROM visits WHERE year >= 2020 GROUP BY department"
    deadline = deadline_of(gw, sql)
    assert deadline is not None and deadline < 20
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable):
        gw.query("erin", request(sql))
    elapsed = time.monotonic() - started
    assert elapsed >= deadline / 1000
    assert gw.ledger.budget_status("erin").rho_spent == pytest.approx(0.1**2 / 2)


def test_an_analysts_own_misses_stretch_their_deadlines_and_no_one_elses(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch, idle_machine: None
) -> None:
    """A statement made slow on purpose misses its deadline (charged); the analyst who saw
    that failure gets twice the statement allowance next (the dry run shows it), another
    analyst's deadline and the public schedule do not move, and answers released on time
    bring it back down."""
    gw = make_gateway(execution=DEADLINE)
    for name in ("erin", "finn"):
        gw.ledger.create_analyst(name, 100.0, 1e-6)
    sql = "SELECT COUNT(*) FROM patients"

    def dry(analyst: str) -> int:
        release = gw.query(analyst, QueryRequest(sql, 0.1, 0.0, "laplace", dry_run=True))
        return int(release.extra["release_deadline_ms"])

    base = dry("erin")
    assert base == dry("finn")
    real = gateway.sql.execute.run_aggregate

    def slow(engine: Any, sql: str, *, timeout_ms: int) -> Any:
        time.sleep(0.3)
        return real(engine, sql, timeout_ms=timeout_ms)

    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", slow)
    with pytest.raises(DatabaseUnavailable):
        gw.query("erin", request(sql, epsilon=0.2))
    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", real)
    stretched = dry("erin")
    # the statement's allowance doubles; the admission's and what follows it do not
    kept = gw.config.execution.post_ms + gw.config.execution.admission_ms
    assert stretched - kept == pytest.approx(2 * (base - kept), abs=1)
    assert dry("finn") == base
    # the schedule others are given takes the unstretched deadline
    planned = gw.planner.plan(request(sql))
    plan = planned.plan  # type: ignore[union-attr]
    compiled = gw._compile(planned)  # type: ignore[arg-type]
    table = gw.config.tables["patients"]
    before = list(gw.timing._slot_free)
    clock = gw.timing.start(plan, table, compiled, 10_000, analyst="erin")
    assert clock.starts_at is not None and clock.statement_until is not None
    (reserved,) = [b for a, b in zip(before, gw.timing._slot_free, strict=True) if a != b]
    assert reserved - clock.starts_at == pytest.approx((base - kept) / 1000, abs=2e-3)
    assert clock.statement_until - clock.starts_at == pytest.approx(
        (stretched - kept) / 1000, abs=2e-3
    )
    # answered on time (a generous deadline for a loaded machine): it shrinks back
    for _ in range(10):
        gw.timing.observe("erin", missed=False)
    assert dry("erin") == base


def test_the_machines_load_moves_no_deadline_unless_the_admin_asks(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load average counts dpgate's own statements, whose running time may depend on
    the rows: by default it is no input of the release moment (invariant 9); only
    ``execution.load_aware: true`` adds it."""
    sql = "SELECT COUNT(*) FROM patients"
    quiet = make_gateway(execution=DEADLINE)
    aware = make_gateway(execution={**DEADLINE, "load_aware": True})
    monkeypatch.setattr("gateway.pipeline.timing.machine_load", lambda: 0.0)
    idle = (deadline_of(quiet, sql), deadline_of(aware, sql))
    monkeypatch.setattr("gateway.pipeline.timing.machine_load", lambda: 64.0)
    busy = (deadline_of(quiet, sql), deadline_of(aware, sql))
    assert busy[0] == idle[0]
    assert busy[1] is not None and idle[1] is not None and busy[1] > idle[1]
