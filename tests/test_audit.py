"""The differencing auditor on the demo schema, with no database at all.

Every test constructs the auditor from the public schema only and feeds it noisy
answers by hand: that it works here is also the proof that it needs no handle on the
protected data (docs/design.md, invariant 8: the auditor never touches the data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import yaml

from gateway.audit import AnsweredCell, AnsweredQuery, AuditDecision, Auditor, CountNoise
from gateway.core.config import TableConfig, with_nullability
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.demo.hospital import NULLABLE, config_yaml
from gateway.sql.analyze import analyze

K = 5
NOISE = CountNoise("laplace", 1.0)  # every count here: ε = 1, sensitivity 1


@pytest.fixture(scope="module")
def tables() -> dict[str, TableConfig]:
    cfg = parse_config(yaml.safe_load(config_yaml("demo.db", "ledger.db")))
    return with_nullability(cfg.tables, NULLABLE)


@pytest.fixture
def auditor(tables: dict[str, TableConfig]) -> Auditor:
    return Auditor(tables, min_group_size=K)


class Session:
    """An analyst talking to the auditor the way the pipeline does."""

    #: The public noise of every count the session's answers carry, and whether the
    #: pre-audit is told it (as the pipeline tells it the calibrated noise).
    noise = NOISE
    noise_in_pre_audit = False

    def __init__(self, auditor: Auditor, tables: dict[str, TableConfig], scope: str = "alice"):
        self.auditor = auditor
        self.tables = tables
        self.scope = scope
        self.n = 0
        self.remember_anyway = False

    def plan(self, sql: str) -> QueryPlan:
        plan = analyze(sql, self.tables)
        assert isinstance(plan, QueryPlan)
        return plan

    def ask(
        self, sql: str, counts: float | Sequence[tuple[tuple[Any, ...], float | None]] | None
    ) -> tuple[AuditDecision, AuditDecision | None]:
        """pre-audit, then (if allowed) post-audit and remember; returns both decisions."""
        self.n += 1
        plan = self.plan(sql)
        pre = self.auditor.pre_audit(
            self.scope, plan, self.noise if self.noise_in_pre_audit else None
        )
        if not pre.allowed:
            return pre, None
        if counts is None or isinstance(counts, int | float):
            cells: tuple[AnsweredCell, ...] = (AnsweredCell((), counts, {}, self.noise),)
        else:
            cells = tuple(AnsweredCell(v, c, {}, self.noise) for v, c in counts)
        answer = AnsweredQuery(f"q{self.n}", plan, cells)
        post = self.auditor.post_audit(self.scope, answer)
        if post.allowed or self.remember_anyway:
            self.auditor.remember(self.scope, answer)
        return pre, post


def refused(result: tuple[AuditDecision, AuditDecision | None]) -> bool:
    pre, post = result
    return not pre.allowed or (post is not None and not post.allowed)


@pytest.fixture
def alice(auditor: Auditor, tables: dict[str, TableConfig]) -> Session:
    return Session(auditor, tables)


def test_crohn_pair_is_refused_after_the_noise(alice: Session) -> None:
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'", 41.3))
    pre, post = alice.ask(
        "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND city = 'Budapest'", 39.8
    )
    assert pre.allowed  # Crohn-not-in-Budapest cannot be sized before the answer
    assert post is not None and not post.allowed
    assert post.combined_with == ("q1",)
    assert "41" not in post.reason and "39" not in post.reason and "1.5" not in post.reason


def test_crohn_pair_is_refused_before_spending_when_the_group_is_known_small(
    alice: Session,
) -> None:
    alice.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'", 3.2)
    pre, post = alice.ask(
        "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND zip = '1051'", 2.0
    )
    assert not pre.allowed and post is None
    assert pre.combined_with == ("q1",)


def test_large_differences_are_answered(alice: Session) -> None:
    alice.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'", 412.0)
    assert not refused(
        alice.ask(
            "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND city = 'Budapest'", 101.0
        )
    )


def test_avg_over_everyone_but_one_is_refused(alice: Session) -> None:
    assert not refused(alice.ask("SELECT AVG(income) FROM patients", 2999.0))
    _pre, post = alice.ask("SELECT AVG(income) FROM patients WHERE age <> 37", 2998.0)
    assert post is not None and not post.allowed and post.combined_with == ("q1",)


def test_sum_without_counts_is_refused_when_the_difference_cannot_be_sized(alice: Session) -> None:
    alice.ask("SELECT SUM(income) FROM patients", None)
    assert refused(alice.ask("SELECT SUM(income) FROM patients WHERE age <> 37", None))


def test_honest_nested_queries_are_answered(alice: Session) -> None:
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients", 3001.0))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age > 30", 2010.0))
    assert not refused(alice.ask("SELECT AVG(glucose) FROM patients WHERE age > 30", 1950.0))
    assert not refused(
        alice.ask("SELECT COUNT(*) FROM patients WHERE age > 30 AND sex = 'F'", 1003.0)
    )


def test_repeated_identical_queries_determine_nothing_new(alice: Session) -> None:
    for _ in range(20):
        assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'", 3.0))


def test_denning_general_tracker_is_refused(alice: Session) -> None:
    # q(C) = q(C ∨ T) + q(C ∨ ¬T) − q(everyone): the third query completes the tracker
    target = "sex = 'F' AND age = 37 AND city = 'Eger'"
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients", 3000.0))
    assert not refused(
        alice.ask(f"SELECT COUNT(*) FROM patients WHERE ({target}) OR smoker", 901.0)
    )
    pre, post = alice.ask(f"SELECT COUNT(*) FROM patients WHERE ({target}) OR NOT smoker", 2101.0)
    assert pre.allowed and post is not None and not post.allowed
    assert post.combined_with == ("q1", "q2")


def test_tracker_fourth_query_is_refused_before_spending(alice: Session) -> None:
    # in flag mode the pipeline releases and remembers refused answers too; the 4th
    # tracker query (T) would then pin C ∧ T, whose size the earlier answers already bound
    target = "sex = 'F' AND age = 37 AND city = 'Eger'"
    alice.remember_anyway = True
    alice.ask("SELECT COUNT(*) FROM patients", 3000.0)
    alice.ask(f"SELECT COUNT(*) FROM patients WHERE ({target}) OR smoker", 901.0)
    alice.ask(f"SELECT COUNT(*) FROM patients WHERE ({target}) OR NOT smoker", 2101.0)
    pre, post = alice.ask("SELECT COUNT(*) FROM patients WHERE smoker", 899.0)
    assert not pre.allowed and post is None
    assert pre.combined_with == ("q1", "q2", "q3")


def test_splitting_a_small_released_group_is_refused_before_spending(alice: Session) -> None:
    alice.ask("SELECT COUNT(*) FROM patients WHERE sex = 'F' AND age = 37 AND city = 'Eger'", 1.4)
    pre, post = alice.ask(
        "SELECT COUNT(*) FROM patients WHERE sex = 'F' AND age = 37 AND city = 'Eger' AND smoker",
        1.0,
    )
    assert not pre.allowed and post is None and pre.combined_with == ("q1",)


def test_group_by_cells_are_regions(alice: Session, tables: dict[str, TableConfig]) -> None:
    cities = tables["patients"].columns["city"].values
    assert cities is not None
    alice.ask("SELECT city, COUNT(*) FROM patients GROUP BY city", [((c,), 375.0) for c in cities])
    # everyone minus every city but one: fine, that city was released itself
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE city <> 'Eger'", 2625.0))
    # a city's Crohn patients, then Crohn elsewhere by city: Crohn in Eger is determined
    alice.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'", 40.0)
    result = alice.ask(
        "SELECT city, COUNT(*) FROM patients WHERE disease = 'Crohn' AND city <> 'Eger' "
        "GROUP BY city",
        [((c,), 5.5 if c != "Eger" else None) for c in cities if c != "Eger"],
    )
    assert refused(result)


def test_scopes_are_separate_and_forgettable(
    auditor: Auditor, tables: dict[str, TableConfig]
) -> None:
    alice, bob = Session(auditor, tables, "alice"), Session(auditor, tables, "bob")
    alice.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'", 41.0)
    assert not refused(
        bob.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND city = 'Eger'", 2.0)
    )
    auditor.forget_scope("alice")
    assert not refused(
        alice.ask("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND city = 'Eger'", 2.0)
    )
    auditor.reset()
    assert not auditor.knows("alice", "q1")


def test_remember_is_idempotent_by_query_id(
    auditor: Auditor, tables: dict[str, TableConfig]
) -> None:
    s = Session(auditor, tables)
    plan = s.plan("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'")
    answer = AnsweredQuery("same", plan, (AnsweredCell((), 40.0, {}, NOISE),))
    for _ in range(3):
        auditor.remember("alice", answer)
    other = AnsweredQuery(
        "other",
        s.plan("SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND city = 'Eger'"),
        (AnsweredCell((), 38.0, {}, NOISE),),
    )
    decision = auditor.post_audit("alice", other)
    assert not decision.allowed and decision.combined_with == ("same",)


def test_tables_do_not_combine(alice: Session) -> None:
    alice.ask("SELECT COUNT(*) FROM visits WHERE year = 2020", 400.0)
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age = 20", 30.0))


def test_opaque_conditions_are_their_own_dimension(alice: Session) -> None:
    alice.ask("SELECT COUNT(*) FROM patients WHERE zip LIKE '10%'", 700.0)
    assert refused(
        alice.ask("SELECT COUNT(*) FROM patients WHERE zip LIKE '10%' AND age <> 44", 698.0)
    )
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE zip LIKE '11%'", 3.0))


def test_everyone_derived_in_one_component_is_known_to_the_others(alice: Session) -> None:
    # age > 30 and age <= 30 together are everyone; then "everyone but Eger" pins Eger
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age > 30", 2000.0))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age <= 30", 1000.0))
    _, post = alice.ask("SELECT COUNT(*) FROM patients WHERE city <> 'Eger'", 2998.0)
    assert post is not None and not post.allowed
    assert post.combined_with == ("q1", "q2")


def test_a_long_diverse_honest_session_keeps_being_answered(
    alice: Session, tables: dict[str, TableConfig]
) -> None:
    cities = tables["patients"].columns["city"].values
    diseases = tables["patients"].columns["disease"].values
    assert cities is not None and diseases is not None
    sqls = [
        "SELECT COUNT(*) FROM patients",
        "SELECT COUNT(*) FROM patients WHERE age > 30 AND sex = 'F'",
        "SELECT AVG(glucose) FROM patients WHERE disease IN ('Diabetes', 'Crohn')",
        "SELECT SUM(income) FROM patients WHERE NOT smoker",
        "SELECT COUNT(*) FROM patients WHERE zip LIKE '1%' OR city = 'Szeged'",
        "SELECT COUNT(*) FROM patients WHERE glucose BETWEEN 3.5 AND 7.25",
        "SELECT COUNT(*) FROM patients WHERE age BETWEEN 20 AND 60 AND smoker",
        "SELECT COUNT(*) FROM patients WHERE income > 50000",
        "SELECT COUNT(*) FROM patients WHERE age < 18",
    ]
    for i, sql in enumerate(sqls):
        # everyone (the sum of the city cells below: the auditor combines consistent
        # answers, and noisy ones are consistent up to their noise), then large subgroups
        count = 2428.0 if i == 0 else 700.0 + len(sql)
        assert not refused(alice.ask(sql, count)), sql
    grouped = [
        ("SELECT city, COUNT(*) FROM patients GROUP BY city", cities),
        ("SELECT disease, COUNT(*) FROM patients WHERE age > 40 GROUP BY disease", diseases),
        ("SELECT sex, COUNT(*) FROM patients WHERE income > 20000 GROUP BY sex", ("F", "M")),
    ]
    for sql, values in grouped:
        cells = [((v,), 300.0 + i) for i, v in enumerate(values)]
        assert not refused(alice.ask(sql, cells)), sql
    kn = alice.auditor.knowledge("alice", "patients")
    assert max(p.space.n_cells for p in kn.parts) < 100_000


def test_values_beyond_a_bound_count_as_the_bound(alice: Session) -> None:
    """The compiled SQL clamps bounded numbers (gateway/core/domain.py): nobody lies outside
    the bounds, so conditions that differ only there are one region."""
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients", 3000.4))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age >= -1", 3001.2))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age >= -2", 2999.1))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE income <= 200000", 3002.0))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age > 30", 2012.4))
    assert not refused(
        alice.ask("SELECT COUNT(*) FROM patients WHERE age > 30 AND income <= 10000000", 2011.2)
    )


def test_differencing_on_a_declared_bound_is_refused(alice: Session) -> None:
    """The bound itself holds everyone clamped to it: a pair around it is refused."""
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE income >= 150000", 8.2))
    result = alice.ask(
        "SELECT COUNT(*) FROM patients WHERE income >= 150000 AND income < 200000", 7.1
    )
    assert refused(result)


def test_constants_beyond_the_declared_bounds_are_audited_not_crashed(alice: Session) -> None:
    for x in (150_000, 250_000, 10**7):
        pre, post = alice.ask(f"SELECT COUNT(*) FROM patients WHERE income >= {x}", 400.0)
        assert pre.reason and (post is None or post.reason)


# -- normalisation: rewrites of one condition are one region ------------------------------

SAME_REGION = [
    ("zip = '1051'", "LOWER(zip) = '1051'"),
    ("zip = '1051'", "UPPER(zip) = '1051'"),
    ("zip = '1051'", "zip || '' = '1051'"),
    ("zip = '1051'", "zip LIKE '1051'"),
    ("zip = '1051'", "CASE WHEN zip = '1051' THEN 1 ELSE 0 END = 1"),
    ("zip = '1051'", "(zip = '1051') IS TRUE"),
    ("zip = '1051'", "COALESCE(zip, '') = '1051'"),
    ("zip = '1051'", "CAST(zip AS TEXT) = '1051'"),
    ("zip <> '1051'", "NOT (zip = '1051')"),
    ("zip = '1051' AND age > 3", "NOT (zip <> '1051' OR age <= 3)"),
    ("city = 'Eger'", "LOWER(city) = 'eger'"),
    ("city = 'Pécs'", "LOWER(city) = 'pécs'"),
    ("city IN ('Eger', 'Győr')", "city LIKE '%r'"),
    ("city = 'Eger'", "CASE WHEN city = 'Eger' THEN TRUE ELSE FALSE END"),
    ("smoker", "CAST(smoker AS INTEGER) = 1"),
    ("smoker", "smoker IS TRUE"),
    ("age BETWEEN 30 AND 39", "age / 10 = 3"),
    ("age >= 30", "age / 10 >= 3"),
    ("age = 37", "age + 0 = 37"),
    ("age = 37", "age * 2 = 74"),
    ("age > 30", "age * 1 - 0 > 30"),
    ("age < 18", "CASE WHEN age < 18 THEN 'child' ELSE 'adult' END = 'child'"),
    ("age >= 40 AND age <= 60", "ABS(age - 50) <= 10"),
    ("income >= 24000 AND income <= 24999", "income / 1000 = 24"),
    ("income > 50000", "income - 50000 > 0"),
    ("income < 0", "FALSE"),
    ("age >= -1", "TRUE"),
    ("age IS NULL", "FALSE"),
    ("glucose > 5", "glucose + 0 > 5"),
    ("zip LIKE '10%'", "zip LIKE '10%' AND zip LIKE '1%'"),
]


@pytest.mark.parametrize(("plain", "rewrite"), SAME_REGION)
def test_rewrites_are_one_region(plain: str, rewrite: str, tables: dict[str, TableConfig]) -> None:
    import sqlglot

    from gateway.audit.predicates import FormulaBuilder
    from gateway.audit.space import CellSpace

    table = tables["patients"]
    b = FormulaBuilder(table)
    f, g = b.build(sqlglot.parse_one(plain)), b.build(sqlglot.parse_one(rewrite))
    space = CellSpace(table)
    space.ensure([f, g])
    shape = space.atom_of.shape
    assert (np.broadcast_to(space.truth(f), shape) == np.broadcast_to(space.truth(g), shape)).all()
    assert all(d.key.column is not None for d in space.dims)  # no dimension of its own


def test_a_leaf_is_read_once_across_asts_and_alike_leaves_only(
    tables: dict[str, TableConfig],
) -> None:
    """The builder remembers a leaf by its whole shape: the same condition in another
    query's AST is the same formula; a literal's kind or a quoted name keeps it apart."""
    import sqlglot

    from gateway.audit.predicates import FormulaBuilder

    b = FormulaBuilder(tables["patients"])

    def read(sql: str) -> Any:
        return b.build(sqlglot.parse_one(sql))

    assert read("age >= 30") is read("age >= 30")
    assert read("age >= 30 AND smoker").children[0] is read("age >= 30")
    assert read("sex = 'F'") == FormulaBuilder(tables["patients"]).build(
        sqlglot.parse_one("sex = 'F'")
    )
    assert read("age >= 30") != read("age >= 31")
    assert read("zip = '30'") != read("zip = 30")
    assert read('"age" >= 30') == read("age >= 30")  # same column, whatever the quoting


def test_a_rewrite_and_its_plain_form_add_nothing(alice: Session) -> None:
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE zip = '1051'", 9.0))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE LOWER(zip) = '1051'", 9.4))
    kn = alice.auditor.knowledge("alice", "patients")
    assert [sorted(d.sql for d in p.space.index) for p in kn.parts] == [["zip"]]


def test_an_expression_that_cannot_be_normalised_is_not_treated_as_unrelated(
    alice: Session,
) -> None:
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE LENGTH(zip) = 4", 3000.0))
    pre, post = alice.ask("SELECT COUNT(*) FROM patients WHERE zip = '1051' AND smoker", 2.0)
    assert not pre.allowed and post is None
    assert pre.combined_with == ("q1",) and "zip" in pre.reason and "relate" in pre.reason
    # nor two such expressions on one column, nor one within a single query
    assert refused(alice.ask("SELECT COUNT(*) FROM patients WHERE TRIM(zip) = '1051'", 9.0))
    bob = Session(alice.auditor, alice.tables, "bob")
    assert not refused(bob.ask("SELECT COUNT(*) FROM patients WHERE age > income / 1000", 900.0))
    assert refused(bob.ask("SELECT COUNT(*) FROM patients WHERE age > 30", 2000.0))


def test_is_not_null_is_the_region_the_sql_reads(alice: Session) -> None:
    """``glucose IS NOT NULL`` is the readings, not their absence (sqlglot 30 parses it
    as IS NULL with a ``negate`` flag, which the auditor once read past): the over-40s
    of Eger without a reading, minus those over 41, is the one person of 41 without one."""
    eger = "SELECT COUNT(*) FROM patients WHERE city = 'Eger' AND "
    assert not refused(alice.ask(eger + "age > 40", 100.0))
    assert not refused(alice.ask(eger + "age > 40 AND glucose IS NOT NULL", 60.0))
    assert refused(alice.ask(eger + "age > 41 AND glucose IS NULL", 39.0))


def test_nullable_columns_have_a_null_cell_and_others_none(alice: Session) -> None:
    # glucose may be NULL (the catalogue says so): the NULL cell is a region of its own
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients", 3000.0))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE glucose > 5", 2000.0))
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE glucose <= 5", 910.0))
    # ... so everyone minus both is the NULL glucose group, determined: sized 90, allowed
    kn = alice.auditor.knowledge("alice", "patients")
    glucose = next(d for p in kn.parts for d in p.space.dims if d.key.column == "glucose")
    assert any(p.sample is None for p in glucose.pieces)
    # age may not be NULL: no row is read with a NULL age, the region is empty
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE age IS NULL", 0.4))


def test_an_avg_counts_the_rows_where_its_column_is_not_null(alice: Session) -> None:
    """COUNT(*) − the count of AVG(glucose) is the people without a glucose reading: a
    region the auditor must see (here, in one zip, a group of one)."""
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE zip = '1051'", 9.0))
    assert refused(alice.ask("SELECT AVG(glucose) FROM patients WHERE zip = '1051'", 8.0))


def test_a_plans_where_region_is_built_once_for_its_pre_and_post_audit(
    alice: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = alice.auditor._builders["patients"]
    built: list[object] = []
    build = builder.build

    def counting(node: object) -> object:
        built.append(node)
        return build(node)  # type: ignore[arg-type]

    monkeypatch.setattr(builder, "build", counting)
    pre, post = alice.ask("SELECT COUNT(*) FROM patients WHERE age >= 40", 7000)
    assert pre.allowed and post is not None and post.allowed
    assert len(built) == 1  # the pre-audit built it; the post-audit found it
    # a plan of the same text is another object: its region is built afresh, and equal
    again = alice.plan("SELECT COUNT(*) FROM patients WHERE age >= 40")
    assert alice.auditor._where(again) == alice.auditor._where(
        alice.plan("SELECT COUNT(*) FROM patients WHERE age >= 40")
    )
    assert len(built) == 3


def test_a_plans_cell_regions_are_built_once_for_its_pre_and_post_audit(
    alice: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The post-audit asks for the pre-audit's cells again: it gets the same region
    objects (and so finds the pre-audit's extension of the span by identity)."""
    builder = alice.auditor._builders["patients"]
    conditions: list[object] = []
    group_condition = builder.group_condition

    def counting(key: object, value: object) -> object:
        conditions.append(value)
        return group_condition(key, value)  # type: ignore[arg-type]

    monkeypatch.setattr(builder, "group_condition", counting)
    pre, post = alice.ask(
        "SELECT sex, COUNT(*) FROM patients WHERE age >= 40 GROUP BY sex",
        [(("F",), 3500), (("M",), 3400)],
    )
    assert pre.allowed and post is not None and post.allowed
    assert sorted(conditions) == ["F", "M"]  # the pre-audit built them; the post-audit found them
