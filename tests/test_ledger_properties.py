"""Property test: under any sequence of reserve / commit / refund, what the ledger
reports as spent is the sum of the costs not refunded, and never exceeds the budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budget import BudgetExhausted, Ledger, Reservation, zcdp_rho_budget
from mechanisms.types import PrivacyCost

EPSILON_BUDGET, DELTA_BUDGET = 2.0, 1e-6

operations = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from([0.01, 0.05, 0.1, 0.3, 0.7])),
        st.tuples(st.just("commit"), st.integers(0, 50)),
        st.tuples(st.just("refund"), st.integers(0, 50)),
    ),
    max_size=60,
)


@pytest.mark.parametrize("composition", ["zcdp", "pure"])
@settings(max_examples=40, deadline=None)
@given(ops=operations)
def test_spent_is_the_sum_of_live_charges(composition: str, ops: list[tuple[str, float]]) -> None:
    led = Ledger.from_url("sqlite://", composition=composition)
    led.migrate()
    led.create_analyst("a", EPSILON_BUDGET, DELTA_BUDGET)
    open_: list[Reservation] = []
    live: list[PrivacyCost] = []
    for op, arg in ops:
        if op == "reserve":
            cost = PrivacyCost(arg, 0.0, arg * arg / 2)
            try:
                r = led.reserve(
                    "a", cost, query_key="k", sql="s", mechanism="laplace", data_version="v"
                )
            except BudgetExhausted:
                continue
            open_.append(r)
            live.append(cost)
        elif open_:
            r = open_.pop(int(arg) % len(open_))
            if op == "commit":
                led.commit(r, {"n": 1}, "answered")
            else:
                led.refund(r, "failure")
                live.remove(r.cost)
        status = led.budget_status("a")
        assert status.queries == len(live)
        assert status.rho_spent == pytest.approx(math.fsum(c.rho for c in live), abs=1e-12)
        if composition == "pure":
            assert status.epsilon_spent <= EPSILON_BUDGET * (1 + 1e-10)
        else:
            assert status.rho_spent <= zcdp_rho_budget(EPSILON_BUDGET, DELTA_BUDGET) * (1 + 1e-10)
            assert status.epsilon_spent <= EPSILON_BUDGET * (1 + 1e-9)
    led.close()
