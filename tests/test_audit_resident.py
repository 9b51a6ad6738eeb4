"""The auditor's memory per process is bounded (issue 36), and bounding it changes no
decision: scopes beyond ``max_bytes`` are written to disk and read back exactly as they
were (``gateway/audit/resident.py``)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml

from gateway.audit import AnsweredCell, AnsweredQuery, Auditor, CountNoise
from gateway.audit.findings import Sizing
from gateway.audit.resident import footprint
from gateway.core.config import TableConfig, with_nullability
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.demo.hospital import CITIES, DEPARTMENTS, DISEASES, NULLABLE, config_yaml
from gateway.sql.analyze import analyze

NOISE = CountNoise("laplace", 2.0)
SCOPES = tuple(f"analyst{i}" for i in range(6))


@pytest.fixture(scope="module")
def tables() -> dict[str, TableConfig]:
    cfg = parse_config(yaml.safe_load(config_yaml("demo.db", "ledger.db")))
    return with_nullability(cfg.tables, NULLABLE)


def question(rng: random.Random) -> str:
    """A mixed analyst question on the demo: bands, drill-downs, averages, visits."""
    kind = rng.randrange(6)
    if kind == 0:
        a = rng.randrange(0, 90, 10)
        b = rng.randrange(a + 10, 101, 10)
        return (
            f"SELECT disease, COUNT(*) FROM patients WHERE age BETWEEN {a} AND {b} GROUP BY disease"
        )
    if kind == 1:
        return (
            f"SELECT sex, AVG(glucose) FROM patients WHERE city = '{rng.choice(CITIES)}' "
            "GROUP BY sex"
        )
    if kind == 2:
        return f"SELECT COUNT(*) FROM patients WHERE income >= {rng.randrange(0, 200_000, 20_000)}"
    if kind == 3:
        return (
            f"SELECT department, COUNT(*) FROM visits WHERE year = {rng.randrange(2019, 2026)} "
            "GROUP BY department"
        )
    if kind == 4:
        return (
            f"SELECT COUNT(*) FROM patients WHERE disease = '{rng.choice(DISEASES)}' "
            f"AND city = '{rng.choice(CITIES)}'"
        )
    return (
        f"SELECT AVG(cost) FROM visits WHERE department = '{rng.choice(DEPARTMENTS)}' "
        f"AND length_of_stay >= {rng.randrange(0, 25, 5)}"
    )


def session(
    tables: dict[str, TableConfig], max_bytes: int | None, steps: int, check: Any = None
) -> list[Any]:
    """Every decision and every sizing of a seeded multi-scope session, in order."""
    auditor = Auditor(tables, min_group_size=5, max_bytes=max_bytes)
    seen: list[Any] = []
    auditor.observe = lambda s: seen.append(("sizing", s))
    rng = random.Random(5)
    for n in range(steps):
        scope = rng.choice(SCOPES)
        plan = analyze(question(rng), tables)
        assert isinstance(plan, QueryPlan)
        pre = auditor.pre_audit(scope, plan, NOISE)
        seen.append(("pre", scope, pre))
        if not pre.allowed:
            continue
        cells = tuple(
            AnsweredCell(values, rng.uniform(-3, 400), {}, NOISE) for values in _cells(plan)
        )
        answer = AnsweredQuery(f"q{n}", plan, cells)
        post = auditor.post_audit(scope, answer)
        seen.append(("post", scope, post))
        if post.allowed:
            auditor.remember(scope, answer)
        if check is not None:
            check(auditor, scope)
    return seen


def _cells(plan: QueryPlan) -> list[tuple[Any, ...]]:
    import itertools

    domains = [g.domain for g in plan.group_keys]
    assert all(d is not None for d in domains)
    return list(itertools.product(*domains))  # type: ignore[arg-type]


def test_writing_scopes_out_changes_no_decision(tables: dict[str, TableConfig]) -> None:
    """With a budget of one byte every scope but the one in use is on disk after each
    answer, and is read back for its next question: every verdict, every named query and
    group, and every size estimate with its margin are the same as with no budget."""
    unbounded = session(tables, None, 150)
    bounded = session(tables, 1, 150)
    assert len(bounded) == len(unbounded)
    for a, b in zip(unbounded, bounded, strict=True):
        if a[0] == "sizing":
            assert isinstance(a[1], Sizing) and isinstance(b[1], Sizing)
            assert (a[1].pre, a[1].estimate, a[1].margin, a[1].small) == (
                b[1].pre,
                b[1].estimate,
                b[1].margin,
                b[1].small,
            )
        else:
            assert a == b
    decisions = [d for d in unbounded if d[0] != "sizing"]
    # the session is a real test of the auditor: it refuses some questions, answers most
    assert any(not d[2].allowed for d in decisions)
    assert sum(d[2].allowed for d in decisions if d[0] == "post") > 50


def test_memory_held_stays_within_the_budget(tables: dict[str, TableConfig]) -> None:
    """After every answer, what is held in memory fits the budget, or is the one scope in
    use (which alone may exceed it) — and without a budget it would not fit."""
    budget = 40_000

    def check(auditor: Auditor, scope: str) -> None:
        held = auditor.held_scopes()
        if len(held) > 1:
            assert auditor.held_bytes() <= budget
        else:
            assert held <= {scope}

    session(tables, budget, 150, check)
    unbounded = Auditor(tables, min_group_size=5)
    sizes: list[int] = []

    def grow(auditor: Auditor, scope: str) -> None:
        sizes.append(auditor.held_bytes())

    session(tables, None, 150, grow)
    assert max(sizes) > 3 * budget  # the budget above did bind
    assert unbounded.held_bytes() == 0


def test_footprint_grows_with_the_knowledge(tables: dict[str, TableConfig]) -> None:
    """The estimate the budget is enforced on counts every answered row."""
    auditor = Auditor(tables, min_group_size=5)
    before = footprint(auditor.knowledge("a", "patients"))
    plan = analyze("SELECT disease, COUNT(*) FROM patients GROUP BY disease", tables)
    assert isinstance(plan, QueryPlan)
    cells = tuple(AnsweredCell(v, 100.0, {}, NOISE) for v in _cells(plan))
    auditor.remember("a", AnsweredQuery("q1", plan, cells))
    after = footprint(auditor.knowledge("a", "patients"))
    assert after - before >= len(cells) * 900


def test_the_budget_comes_from_the_config() -> None:
    """``audit.memory_mb`` sets the budget (default 64 MB); it must be a whole number ≥ 1."""
    from gateway.core.config import ConfigError

    raw = yaml.safe_load(config_yaml("demo.db", "ledger.db"))
    assert parse_config(raw).audit.memory_mb == 64
    raw["audit"]["memory_mb"] = 8
    assert parse_config(raw).audit.memory_mb == 8
    raw["audit"]["memory_mb"] = 0
    with pytest.raises(ConfigError, match=r"audit\.memory_mb"):
        parse_config(raw)


def _deep_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of ``obj`` and what it refers to, each object counted once (``seen``)."""
    import sys

    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    total = sys.getsizeof(obj)
    if isinstance(obj, dict):
        return total + sum(_deep_bytes(k, seen) + _deep_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        return total + sum(_deep_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        total += _deep_bytes(vars(obj), seen)
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                total += _deep_bytes(getattr(obj, name), seen)
    return total


def test_an_answered_cell_is_kept_compactly(tables: dict[str, TableConfig]) -> None:
    """What a scope keeps per released cell (its row, count, noise, statistics and its
    share of the region's formula, objects shared between rows counted once) stays
    small: on this session 1,187 bytes a row before issue 36's compaction, 553 after
    (slots, a row's own noise kept as its distribution, one object per noise
    distribution and per set of statistics)."""
    from gateway.audit.knowledge import RowInfo

    auditor = Auditor(tables, min_group_size=5)
    rng = random.Random(9)
    for n in range(120):
        plan = analyze(question(rng), tables)
        assert isinstance(plan, QueryPlan)
        noise = CountNoise("laplace", rng.choice((2.0, 5.0)))  # a new object per answer
        cells = tuple(AnsweredCell(v, rng.uniform(0, 400), {}, noise) for v in _cells(plan))
        auditor.remember("a", AnsweredQuery(f"q{n}", plan, cells))
    rows = [
        r
        for table in ("patients", "visits")
        for part in auditor.knowledge("a", table).parts
        for r in part.info
    ]
    assert len(rows) > 300
    seen: set[int] = set()
    per_row = sum(_deep_bytes(r, seen) for r in rows) / len(rows)
    assert per_row < 700, per_row
    own = next(r for r in rows if r.cell >= 0 and r.noise is not None)
    assert not hasattr(own, "__dict__")
    assert own.noise == (((own.query_id, own.cell), 1.0, own.noise[0][2]),)
    assert isinstance(own._noise, CountNoise)  # the terms are rebuilt, not stored
    derived = RowInfo("q1,q2", -1, 3.0, noise=((("q1", 0), 1.0, NOISE), (("q2", 0), -1.0, NOISE)))
    assert derived.noise == ((("q1", 0), 1.0, NOISE), (("q2", 0), -1.0, NOISE))
