"""The auditor reads ``null_when`` (docs/privacy.md, "The domain model"): the regions a
declaration makes empty — an occupation for someone not employed, none for someone
employed, an employment status under 16 — are never a determined small group, and
relations the declaration states are used to find groups that are determined.

Only public facts: the declarations are config, and the compiled SQL reads no row that
breaks them (tests/test_compile_null_when.py), so a region empty by declaration holds no
one whatever the data. The census data set of the honest workloads
(tests/workload_datasets.py) meets its declarations; each session here is audited with
its exact counts and the public noise scales of its releases, as in
tests/test_audit_workloads.py (2.), with a fresh auditor.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AnsweredCell, AnsweredQuery, Auditor
from gateway.audit.confidence import CountNoise
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.pipeline.gateway import Gateway
from gateway.sql.compile import compile_plan
from gateway.sql.execute import run_aggregate
from tests.conftest import ADMIN_KEY
from tests.workload_datasets import build_census, census_config

DECLARED = ("employment", "occupation", "hours_worked")


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("census") / "census.db"
    build_census(path)
    return path


def _gateway(census: Path, folder: Path, *, declared: bool = True) -> Gateway:
    """The census admin's gateway; without ``declared``, the columns the declarations
    tie together are merely nullable (as before ``null_when``)."""
    folder.mkdir(exist_ok=True)
    raw = census_config(census, folder / "ledger.db")
    raw["ledger"]["url"] += "?synchronous=normal"
    if not declared:
        for name in DECLARED:
            column = raw["tables"]["persons"]["columns"][name]
            column.pop("null_when")
            column["nullable"] = True
    return Gateway(parse_config(raw))


@pytest.fixture
def gateway(census: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    yield _gateway(census, tmp_path)


@pytest.fixture
def undeclared(census: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Gateway:
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    return _gateway(census, tmp_path / "undeclared", declared=False)


def _answer(gateway: Gateway, query_id: str, sql: str, epsilon: float = 0.5) -> AnsweredQuery:
    """The query's cells with their exact counts and the public noise of their release."""
    plan = gateway.analyze(sql)
    assert isinstance(plan, QueryPlan)
    noise = gateway.planner.calibrate(plan, QueryRequest(sql, epsilon, 0.0, "laplace")).noises
    compiled = compile_plan(plan, gateway.config.tables[plan.table], gateway.dialect)
    rows = run_aggregate(gateway.engine, compiled.sql, timeout_ms=60_000)
    by_key = {tuple(r[: compiled.n_keys]): r[compiled.n_keys :] for r in rows}
    kinds = [m.kind for m in plan.measures]
    j = next(i for i, k in enumerate(kinds) if k in ("count_rows", "count_units", "count_values"))
    scale = noise[j]
    assert scale is not None
    domains = [g.domain or () for g in plan.group_keys]
    cells = []
    for key in _product(domains):
        found = by_key.get(key)
        count = float((found[j] if found else 0) or 0)
        cells.append(AnsweredCell(key, count, {}, CountNoise(scale.mechanism, float(scale.scale))))
    return AnsweredQuery(query_id, plan, tuple(cells))


def _product(domains: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for domain in domains:
        out = [(*key, value) for key in out for value in domain]
    return out


def _session(gateway: Gateway, queries: list[str]) -> list[tuple[str, str]]:
    """Audit ``queries`` in order with a fresh auditor; the (query, reason) refused."""
    auditor = Auditor(gateway.auditor.tables, min_group_size=5, confidence=0.999)
    refused = []
    for i, sql in enumerate(queries):
        answer = _answer(gateway, f"q{i}", sql)
        pre = auditor.pre_audit("s", answer.plan)
        post = auditor.post_audit("s", answer) if pre.allowed else pre
        if not post.allowed:
            refused.append((sql, post.reason))
            continue
        auditor.remember("s", answer)
    return refused


#: Each pair of these differs by a region the declarations make empty: everyone minus
#: the employment groups (NULL included: under 16) is no one; the employment NULL group
#: minus the under-16s is no one from 16 on; the persons by occupation minus the
#: employed by occupation is no one (hours likewise); and the sex breakdown is another
#: component, which learns "everyone" from the employment groups, until sex by
#: occupation ties it to the declared columns (where it comes after the sex breakdown,
#: that component's answers are replayed in a space holding the declarations).
SESSION = [
    "SELECT COUNT(*) FROM persons",
    "SELECT employment, COUNT(*) FROM persons GROUP BY employment",
    "SELECT COUNT(*) FROM persons WHERE age < 16",
    "SELECT occupation, COUNT(*) FROM persons GROUP BY occupation",
    "SELECT occupation, AVG(hours_worked) FROM persons WHERE employment = 'Employed' "
    "GROUP BY occupation",
    "SELECT sex, COUNT(*) FROM persons GROUP BY sex",
    "SELECT COUNT(hours_worked) FROM persons WHERE age >= 16",
    "SELECT sex, occupation, COUNT(*) FROM persons GROUP BY sex, occupation",
]


@pytest.mark.parametrize("order", ["written", "reversed", "shuffled 1", "shuffled 2"])
def test_regions_empty_by_declaration_are_never_small_groups(gateway: Gateway, order: str) -> None:
    """In any order: a component that comes to need a declaration replays its answers
    in a space that holds it, so old regions and new ones leave out the same cells."""
    queries = list(SESSION)
    if order == "reversed":
        queries.reverse()
    elif order.startswith("shuffled"):
        random.Random(int(order[-1])).shuffle(queries)
    assert _session(gateway, queries) == []


def test_answers_given_before_a_declaration_was_needed_leave_out_what_it_rules_out(
    gateway: Gateway,
) -> None:
    """The women, then the women by employment status: the second query's groups leave
    out the cells the declarations rule out, so the first one's region must too, or the
    women minus their groups would be those cells — no one, "determined" and refused.
    The component of the first answer is replayed in a space that holds the
    declarations when the second one comes."""
    queries = [
        "SELECT sex, COUNT(*) FROM persons GROUP BY sex",
        "SELECT employment, COUNT(*) FROM persons WHERE sex = 'F' GROUP BY employment",
    ]
    assert _session(gateway, queries) == []


def test_everyone_known_through_a_declaration_is_known_to_every_component(
    gateway: Gateway, census: Path
) -> None:
    """Everyone but one person, then everyone by employment status (NULL included): the
    groups hold every row there can be — the cells they leave out are empty by
    declaration — so they determine everyone, and with the first answer that person.
    The first answer lives in another component, which must learn "everyone" too."""
    with sqlite3.connect(census) as conn:
        # columns no declaration reads: a component of their own
        (one,) = conn.execute(
            "SELECT printf('marital_status = ''%s'' AND education = ''%s'' AND "
            "tenure = ''%s'' AND household_size = %d', marital_status, education, tenure, "
            "household_size) FROM persons GROUP BY marital_status, education, tenure, "
            "household_size HAVING COUNT(*) = 1 LIMIT 1"
        ).fetchone()
    queries = [
        f"SELECT COUNT(*) FROM persons WHERE NOT ({one})",
        "SELECT employment, COUNT(*) FROM persons GROUP BY employment",
    ]
    ((sql, _),) = _session(gateway, queries)
    assert sql == queries[1]


def test_without_the_declarations_the_same_session_is_refused(undeclared: Gateway) -> None:
    """The test that fails on the auditor without ``null_when``: the groups empty in
    the data but not by declaration cannot be shown to hold 5 by any noisy count."""
    refused = _session(undeclared, SESSION)
    assert refused, "the empty groups should be refused without their declaration"
    assert any("occupation" in reason or "employment" in reason for _, reason in refused)


def test_the_labour_force_session_needs_the_declarations(
    gateway: Gateway, undeclared: Gateway
) -> None:
    """census_labour_force's withheld pair (its former ``known_gap``)."""
    pair = [
        "SELECT occupation, COUNT(*) AS n FROM persons GROUP BY occupation",
        "SELECT occupation, AVG(hours_worked) AS mean_hours FROM persons "
        "WHERE employment = 'Employed' GROUP BY occupation",
    ]
    assert _session(gateway, pair) == []
    ((sql, reason),) = _session(undeclared, pair)
    assert sql == pair[1] and "cannot show that group" not in reason  # a determined group
    assert "determine the group" in reason


def test_a_group_determined_through_a_declaration_is_refused(
    gateway: Gateway, undeclared: Gateway, census: Path
) -> None:
    """The employed of one age, from "an occupation, aged b or more" minus "employed,
    aged more than b": one region inside the other only by declaration. The auditor
    reads the declaration both ways: regions it empties, and relations it states."""
    with sqlite3.connect(census) as conn:
        (age,) = conn.execute(
            "SELECT age FROM persons WHERE employment = 'Employed' AND age >= 67 "
            "GROUP BY age HAVING COUNT(*) < 5 ORDER BY age LIMIT 1"
        ).fetchone()
    pair = [
        f"SELECT COUNT(*) FROM persons WHERE occupation IS NOT NULL AND age >= {age}",
        f"SELECT COUNT(*) FROM persons WHERE employment = 'Employed' AND age > {age}",
    ]
    ((sql, reason),) = _session(gateway, pair)
    assert sql == pair[1]
    assert f"age = {age}" in reason and "employment = 'Employed'" in reason, reason
    assert _session(undeclared, pair) == []  # without it, the two seem unrelated


def test_a_condition_the_auditor_cannot_relate_to_a_declaration_is_refused_free(
    gateway: Gateway,
) -> None:
    """A declaration puts plain conditions on its columns into every region that reads
    them: another reading of one of them (arithmetic on reals) cannot be related to
    them, and is refused before anything is spent, as two readings of one column are."""
    auditor = Auditor(gateway.auditor.tables, min_group_size=5)
    plan = gateway.analyze("SELECT COUNT(*) FROM persons WHERE hours_worked / 7.5 > 5")
    assert isinstance(plan, QueryPlan)
    decision = auditor.pre_audit("s", plan)
    assert not decision.allowed
    assert "cannot relate" in decision.reason and "hours_worked" in decision.reason
