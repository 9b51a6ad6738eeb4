"""The combined privacy filter: basic composition or zCDP, whichever admits (issue 15).

A property test drives random *adaptive* analysts — every query's mechanism and ε are
chosen from the answers to the earlier ones — against the filter, and checks after every
admitted query that the totals satisfy the bound docs/accounting.md proves, recomputed
here from the costs the mechanisms report (not from the accountant's own code):

    Σ selection δ ≤ s·δ_B  and  ( no Gaussian and Σε ≤ ε_B   or   CKS(Σρ, (1−s)·δ_B) ≤ ε_B )

The same analysts, stopping at their first refusal, are run against each total alone:
the combined filter admits at least as many queries as either, and in the workloads each
total is good at it admits strictly more than the other one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budget import (
    DEFAULT_SELECTION_SHARE,
    CombinedFilter,
    Ledger,
    PureFilter,
    Spent,
    ZcdpFilter,
    cks_epsilon,
)
from mechanisms import calibrate_query
from mechanisms.types import PrivacyCost, Sensitivity

ONE = Sensitivity(Fraction(1), Fraction(1), Fraction(1))
EPSILONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0)
KINDS = ("laplace", "selection", "gaussian")
QUERY_DELTA = 1e-8  # the δ a query asks for (Gaussian calibration, partition selection)
MAX_STEPS = 120


@cache
def cost_of(kind: str, epsilon: float) -> PrivacyCost:
    """What the real calibration charges for one COUNT of this kind at ε."""
    if kind == "laplace":
        return calibrate_query("laplace", epsilon, 0.0, [ONE]).cost
    if kind == "selection":  # GROUP BY keys that are not public: DP partition selection
        return calibrate_query("laplace", epsilon, QUERY_DELTA, [ONE], max_groups_per_unit=1).cost
    return calibrate_query("gaussian", epsilon, QUERY_DELTA, [ONE]).cost


def mechanism_of(kind: str) -> str:
    return "gaussian" if kind == "gaussian" else "laplace"


@dataclass(frozen=True)
class Analyst:
    """An adaptive analyst: the next query's kind and ε are functions of the last answer.

    Answers are a noisy count (true value plus noise of the query's scale, drawn from an
    RNG seeded by the run's seed and the step), so what is asked next depends on the
    randomness of what was released before, as in a real interaction.
    """

    seed: int
    weights: tuple[int, int, int]  # how often each kind is asked
    true_count: int
    retries: int  # cheaper attempts after a refusal (0: stop at the first refusal)

    def next_query(self, step: int, last_answer: int) -> tuple[str, float]:
        pick = random.Random(f"{self.seed}/{step}/{last_answer}")
        kind = pick.choices(KINDS, weights=self.weights)[0]
        epsilon = EPSILONS[(last_answer + step) % len(EPSILONS)]
        return kind, epsilon

    def answer(self, step: int, kind: str, epsilon: float) -> int:
        rng = random.Random(f"{self.seed}/answer/{step}")
        noise = rng.expovariate(epsilon) - rng.expovariate(epsilon)
        if kind == "gaussian":
            noise = rng.gauss(0.0, 1.0 / epsilon)
        return max(0, round(self.true_count + noise))


Admit = Callable[[Spent, PrivacyCost, str], bool]


def run(analyst: Analyst, admit: Admit) -> list[tuple[str, float, PrivacyCost]]:
    """The queries admitted when ``analyst`` talks to ``admit``, in order."""
    spent = Spent()
    admitted: list[tuple[str, float, PrivacyCost]] = []
    last = analyst.true_count
    for step in range(MAX_STEPS):
        kind, epsilon = analyst.next_query(step, last)
        for attempt in range(analyst.retries + 1):
            eps = max(EPSILONS[0], epsilon / 2**attempt)
            eps = min(EPSILONS, key=lambda e: abs(e - eps))
            cost = cost_of(kind, eps)
            if admit(spent, cost, mechanism_of(kind)):
                spent = spent.plus(cost, mechanism_of(kind))
                admitted.append((kind, eps, cost))
                last = analyst.answer(step, kind, eps)
                break
        else:
            return admitted
    return admitted


def documented_bound(
    eps_b: float, delta_b: float, queries: list[tuple[str, float, PrivacyCost]]
) -> bool:
    """The condition docs/accounting.md proves sufficient for (ε_B, δ_B)-DP under full
    adaptivity, from the raw costs (s = the selection share of δ_B)."""
    share = DEFAULT_SELECTION_SHARE
    selection = math.fsum(c.selection_delta for _, _, c in queries)
    if selection > share * delta_b * (1 + 1e-9):
        return False
    pure = all(kind != "gaussian" for kind, _, _ in queries)
    if pure and math.fsum(c.epsilon for _, _, c in queries) <= eps_b * (1 + 1e-9):
        return True
    rho = math.fsum(c.rho for _, _, c in queries)
    return rho == 0 or cks_epsilon(rho, (1 - share) * delta_b) <= eps_b * (1 + 1e-8)


analysts = st.builds(
    Analyst,
    seed=st.integers(0, 2**32),
    weights=st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 3)).filter(any),
    true_count=st.integers(0, 500),
    retries=st.integers(0, 3),
)
budgets = st.tuples(
    st.floats(min_value=0.1, max_value=12.0), st.sampled_from([0.0, 1e-7, 1e-6, 1e-5])
)


@settings(max_examples=150, deadline=None)
@given(analyst=analysts, budget=budgets)
def test_adaptive_analysts_never_exceed_the_documented_bound(
    analyst: Analyst, budget: tuple[float, float]
) -> None:
    eps_b, delta_b = budget
    combined = CombinedFilter()

    def admit(spent: Spent, cost: PrivacyCost, mechanism: str) -> bool:
        return combined.refusal(eps_b, delta_b, spent, cost, mechanism) is None

    admitted = run(analyst, admit)
    for n in range(1, len(admitted) + 1):  # every prefix: the bound holds at every moment
        assert documented_bound(eps_b, delta_b, admitted[:n]), admitted[:n]
    spent = Spent()
    for kind, _, cost in admitted:
        spent = spent.plus(cost, mechanism_of(kind))
    report = combined.report(eps_b, delta_b, spent)
    # the figure shown is the smaller total that applies, and it is within the budget
    basic = spent.epsilon if spent.non_pure == 0 else math.inf
    zcdp = cks_epsilon(spent.rho, (1 - DEFAULT_SELECTION_SHARE) * delta_b)
    assert report.epsilon_spent == pytest.approx(min(basic, zcdp), rel=1e-9)
    if admitted:
        assert report.epsilon_spent <= eps_b * (1 + 1e-8)
    assert report.delta_spent <= DEFAULT_SELECTION_SHARE * delta_b * (1 + 1e-9)


@settings(max_examples=150, deadline=None)
@given(analyst=analysts.map(lambda a: Analyst(a.seed, a.weights, a.true_count, 0)), budget=budgets)
def test_each_total_alone_admits_no_more_than_both(
    analyst: Analyst, budget: tuple[float, float]
) -> None:
    """Stopping at its first refusal, an analyst asks the same queries of every filter up
    to there (its choices depend only on earlier answers), so the counts compare."""
    eps_b, delta_b = budget
    cap = DEFAULT_SELECTION_SHARE * delta_b

    def combined(spent: Spent, cost: PrivacyCost, mechanism: str) -> bool:
        return CombinedFilter().refusal(eps_b, delta_b, spent, cost, mechanism) is None

    def zcdp_alone(spent: Spent, cost: PrivacyCost, mechanism: str) -> bool:
        return ZcdpFilter().refusal(eps_b, delta_b, spent, cost, mechanism) is None

    def basic_alone(spent: Spent, cost: PrivacyCost, mechanism: str) -> bool:
        # basic composition with the same cap on partition selection; no Gaussian
        if mechanism == "gaussian":
            return False
        return PureFilter().refusal(eps_b, cap, spent, cost, mechanism) is None

    n_combined = len(run(analyst, combined))
    assert n_combined >= len(run(analyst, zcdp_alone))
    assert n_combined >= len(run(analyst, basic_alone))


def count_admitted(accountant: CombinedFilter | ZcdpFilter | PureFilter, eps: float) -> int:
    spent, n = Spent(), 0
    cost = cost_of("laplace", eps)
    while accountant.refusal(1.0 if eps >= 0.3 else 3.0, 1e-6, spent, cost, "laplace") is None:
        spent, n = spent.plus(cost, "laplace"), n + 1
    return n


def test_each_total_alone_admits_fewer_where_the_other_is_better() -> None:
    # A few large queries: basic composition wins (ε_B = 1: two queries of ε 0.5) ...
    assert count_admitted(CombinedFilter(), 0.5) == 2
    assert count_admitted(PureFilter(), 0.5) == 2
    assert count_admitted(ZcdpFilter(), 0.5) == 0
    # ... many small ones: zCDP wins (ε_B = 3: more than 60 queries of ε 0.05).
    combined, zcdp = count_admitted(CombinedFilter(), 0.05), count_admitted(ZcdpFilter(), 0.05)
    assert combined == zcdp > count_admitted(PureFilter(), 0.05) == 60


def test_acceptance_one_query_of_half_spends_half_and_one_fits_two() -> None:
    ledger = Ledger.from_url("sqlite://")
    ledger.migrate()
    ledger.create_analyst("alice", 1.0, 1e-6)
    cost = cost_of("laplace", 0.5)
    first = ledger.reserve(
        "alice", cost, query_key="a", sql="q", mechanism="laplace", data_version="v"
    )
    assert first.budget.epsilon_spent == pytest.approx(0.5)
    assert first.charge is not None and first.charge.epsilon == pytest.approx(0.5)
    ledger.reserve("alice", cost, query_key="b", sql="q", mechanism="laplace", data_version="v")
    status = ledger.budget_status("alice")
    assert status.queries == 2 and status.epsilon_spent == pytest.approx(1.0)
    assert status.basis == "basic" and status.epsilon_spent_zcdp > 1.0
    ledger.close()


def test_a_gaussian_query_ends_the_basic_total() -> None:
    acc = CombinedFilter()
    spent = Spent().plus(cost_of("laplace", 0.1), "laplace")
    assert acc.report(1.0, 1e-6, spent).basis == "basic"
    spent = spent.plus(cost_of("gaussian", 0.1), "gaussian")
    report = acc.report(1.0, 1e-6, spent)
    assert report.basis == "zcdp" and math.isinf(report.epsilon_spent_basic)
    assert report.epsilon_spent == pytest.approx(cks_epsilon(spent.rho, 5e-7))
    # refunding the Gaussian charge (Spent.non_pure back to 0) brings basic composition back
    again = Spent(spent.epsilon, 0.0, spent.rho, 0.0, 0)
    assert acc.report(1.0, 1e-6, again).basis == "basic"


@settings(max_examples=20, deadline=None)
@given(analyst=analysts, budget=budgets)
def test_the_ledger_applies_the_same_filter(analyst: Analyst, budget: tuple[float, float]) -> None:
    """Through the real ledger (SQL sums, checkpoints, Gaussian counts), the same analyst
    gets exactly the queries the accountant admits."""
    eps_b, delta_b = budget
    ledger = Ledger.from_url("sqlite://")
    ledger.migrate()
    ledger.create_analyst("a", eps_b, delta_b)
    counter = iter(range(10**6))

    def through_ledger(spent: Spent, cost: PrivacyCost, mechanism: str) -> bool:
        from budget import BudgetExhausted

        try:
            ledger.reserve(
                "a",
                cost,
                query_key=str(next(counter)),
                sql="q",
                mechanism=mechanism,
                data_version="v",
            )
        except BudgetExhausted:
            return False
        return True

    def accountant(spent: Spent, cost: PrivacyCost, mechanism: str) -> bool:
        return CombinedFilter().refusal(eps_b, delta_b, spent, cost, mechanism) is None

    assert run(analyst, through_ledger) == run(analyst, accountant)
    ledger.close()
