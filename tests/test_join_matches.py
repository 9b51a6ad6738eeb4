"""References every row matches (``every_row_matches: true``; docs/design.md, "Joins").

An inner join keeps the rows whose lookup matched; the same cells over the table alone
keep every row: the two together determine the rows that match nothing (visits with no
patient row), a group the auditor cannot show to be large, so it refuses the second
(tests/test_joins.py). A reference declared ``every_row_matches`` puts those rows
outside the table in *every* query on it — the compiled SQL inner-joins the lookup even
when the query names only the table — so that group does not exist, in SQL or in the
auditor, and the pair is answered.

The attack first: orphan visits (a person with visits and no patient row) must move no
answer of a table whose reference is declared so, whether the query joins or not; and
without the declaration the differencing pair stays refused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.config import ConfigError
from gateway.core.config_load import parse_config
from gateway.core.errors import GatewayError
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.demo.hospital import config_yaml
from gateway.pipeline.gateway import Gateway

ORPHAN = 999_999  # a patient_id no patient row has
UNLISTED = 999_998  # a patient whose zip no zip_regions row lists


def request(sql: str, epsilon: float = 1.0) -> QueryRequest:
    return QueryRequest(sql=sql, epsilon=epsilon, delta=0.0, mechanism="laplace")


def _plain_references() -> dict[str, Any]:
    """The demo's tables, whose references are declared plain ``table.column`` (rows
    that match nothing stay in the table)."""
    tables: dict[str, Any] = yaml.safe_load(config_yaml("x.db", "l.db"))["tables"]
    tables["visits"]["references"] = {"patient_id": "patients.patient_id"}
    tables["patients"]["references"] = {"zip": "zip_regions.zip"}
    return tables


def _matched_references() -> dict[str, Any]:
    """The demo's tables with both references declared ``every_row_matches`` (every
    visit has its patient, every zip is listed: true of the demo data)."""
    tables = _plain_references()
    matched = {"every_row_matches": True}
    tables["visits"]["references"] = {"patient_id": {"to": "patients.patient_id", **matched}}
    tables["patients"]["references"] = {"zip": {"to": "zip_regions.zip", **matched}}
    return tables


def _orphan_visits(db: Path, n: int = 40) -> None:
    with sqlite3.connect(db) as conn:
        for i in range(n):
            conn.execute(
                "INSERT INTO visits (patient_id, year, department, length_of_stay, cost) "
                "VALUES (?, ?, 'Oncology', 3, 1000.0)",
                (ORPHAN, 2019 + i % 7),
            )


def _orphan_patient(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO patients VALUES (?, 'Nóra Új', 'F', 50, 'Budapest', '0999', 1, "
            "6.0, 50000, 'Crohn')",
            (UNLISTED,),
        )


@pytest.fixture
def build(make_gateway: Callable[..., Gateway]) -> Callable[..., Gateway]:
    def factory(prepare: Callable[[Path], Any] | None = None, **overrides: Any) -> Gateway:
        overrides.setdefault("tables", _matched_references())
        gw = make_gateway(prepare, **overrides)
        gw.ledger.create_analyst("alice", 1000.0, 1e-3)
        return gw

    return factory


def _exact(gw: Gateway, sql: str, seen: list[list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    gw.query("alice", request(sql))
    return seen[-1]


# -- the config ---------------------------------------------------------------------------


def test_the_declaration_is_read_and_checked() -> None:
    base = {"database": {"url": "sqlite://"}, "ledger": {"url": "sqlite://"}}
    tables = _matched_references()
    config = parse_config({**base, "tables": tables})
    (visits_ref,) = config.tables["visits"].references
    assert (visits_ref.table, visits_ref.target, visits_ref.every_row_matches) == (
        "patients",
        "patient_id",
        True,
    )
    plain = parse_config({**base, "tables": _plain_references()})
    assert not plain.tables["visits"].references[0].every_row_matches
    for bad in (
        {"to": "patients.patient_id", "every_row_matches": "yes"},
        {"to": "patients.patient_id", "always": True},
        {"every_row_matches": True},
    ):
        tables["visits"]["references"] = {"patient_id": bad}
        with pytest.raises(ConfigError):
            parse_config({**base, "tables": tables})


# -- the attack: rows that match nothing ---------------------------------------------------


def test_without_the_declaration_the_differencing_pair_is_refused(
    build: Callable[..., Gateway],
) -> None:
    gw = build(tables=_plain_references())
    gw.query(
        "alice",
        request(
            "SELECT v.department, COUNT(*) FROM visits v JOIN patients p "
            "ON p.patient_id = v.patient_id GROUP BY v.department"
        ),
    )
    with pytest.raises(GatewayError) as info:
        gw.query("alice", request("SELECT department, COUNT(*) FROM visits GROUP BY department"))
    assert info.value.code == "audit_refused"
    assert "patients." in info.value.message and "IS NULL" in info.value.message


PAIRS = [
    (
        "SELECT department, COUNT(*) FROM visits GROUP BY department",
        "SELECT v.department, COUNT(*) FROM visits v JOIN patients p "
        "ON p.patient_id = v.patient_id GROUP BY v.department",
    ),
    (
        "SELECT year, COUNT(*), SUM(cost) FROM visits GROUP BY year",
        "SELECT v.year, COUNT(*), SUM(v.cost) FROM visits v LEFT JOIN patients p "
        "ON p.patient_id = v.patient_id GROUP BY v.year",
    ),
    (
        "SELECT COUNT(*) FROM patients",
        "SELECT COUNT(*) FROM patients p LEFT JOIN zip_regions z ON p.zip = z.zip",
    ),
]


@pytest.mark.parametrize(("alone", "joined"), PAIRS)
def test_rows_that_match_nothing_move_no_answer_joined_or_not(
    build: Callable[..., Gateway], exact: list[list[tuple[Any, ...]]], alone: str, joined: str
) -> None:
    """Orphan visits, and a patient whose zip no public row lists: with the declaration,
    outside the table in the query on the table alone as in the join (plain or LEFT), so
    a neighbour made of them moves nothing and the pair determines no group."""
    clean = build()
    with_orphans = build(lambda db: (_orphan_visits(db), _orphan_patient(db)))
    for sql in (alone, joined):
        assert _exact(clean, sql, exact) == _exact(with_orphans, sql, exact), sql
    assert sorted(_exact(clean, alone, exact)) == sorted(_exact(clean, joined, exact))


def test_without_the_declaration_orphans_are_counted_by_the_table_alone(
    build: Callable[..., Gateway], exact: list[list[tuple[Any, ...]]]
) -> None:
    """The control: the same neighbour moves the plain query when nothing is declared
    (so the test above would fail if the declaration changed nothing)."""
    clean = build(tables=_plain_references())
    with_orphans = build(_orphan_visits, tables=_plain_references())
    sql = "SELECT COUNT(*) FROM visits"
    assert _exact(clean, sql, exact) != _exact(with_orphans, sql, exact)


def test_every_query_on_the_table_joins_the_lookup(build: Callable[..., Gateway]) -> None:
    gw = build()
    plan = gw.planner.analyze("SELECT COUNT(*) FROM visits")
    assert isinstance(plan, QueryPlan) and plan.join is not None
    assert [s.table for s in plan.join.steps] == ["patients"]
    assert [s.kind for s in plan.join.steps] == ["inner"]
    left = gw.planner.analyze(
        "SELECT p.sex, COUNT(*) FROM visits v LEFT JOIN patients p "
        "ON p.patient_id = v.patient_id GROUP BY p.sex"
    )
    assert isinstance(left, QueryPlan) and left.join is not None
    assert [s.kind for s in left.join.steps] == ["inner"]
    # the lookup's columns keep their declared nullability: no NULL group of sex
    (sex,) = left.group_keys
    assert sex.domain == ("F", "M")


def test_after_a_join_the_table_alone_is_answered(build: Callable[..., Gateway]) -> None:
    """The walkthrough's pattern: one join of patients and visits, then ordinary
    questions of visits alone (all withheld, charged, before the declaration)."""
    gw = build()
    gw.query(
        "alice",
        request(
            "SELECT p.sex, COUNT(*) FROM patients p JOIN visits v "
            "ON p.patient_id = v.patient_id GROUP BY p.sex"
        ),
    )
    for sql in (
        "SELECT year, COUNT(*) FROM visits GROUP BY year",
        "SELECT department, AVG(cost) FROM visits GROUP BY department",
        "SELECT COUNT(*) FROM visits",
        "SELECT z.region, COUNT(*) FROM patients p LEFT JOIN zip_regions z "
        "ON p.zip = z.zip GROUP BY z.region",
        "SELECT COUNT(*) FROM patients",
    ):
        assert gw.query("alice", request(sql)).rows, sql
