"""The demo walkthrough of issue 32 (``bench/walkthrough.py``): the README's, the console's
and docs/connect.md's examples and 34 ordinary questions of one new analyst, at the demo's
default ε = 0.1, audit ``refuse``, on the demo data at its real size.

In its written order, fed the exact counts, every question is answered but one, which
names its group (docs/privacy.md, "What the auditor refuses"): ``department, SUM(cost) …
WHERE year = 2024 GROUP BY department`` after ``department, AVG(cost) … GROUP BY
department`` determines each department's cost over the other years, a SUM whose group no
answered count can size (the per-department year counts come last): refused for free.

Before issue 32's third pass the same replay lost eight more: after the join of
``patients`` and ``visits``, seven single-table ``visits`` questions determined the visits
without a patient row (withheld), and ``z.region, p.sex`` after the README's LEFT JOIN
the patients whose zip is not listed (refused) — groups of no one that the demo's plain
references left possible. The demo now declares both references ``every_row_matches``
(docs/privacy.md, "Joins"), compiled as a semi-join where the lookup's columns are not
read, so those groups are empty by construction. Before its second pass it also withheld
the smokers without a glucose reading (2 per disease in the old demo data), and, with
noise, a city's under-65s sized through a chain of nine answers (``PINV_RCOND`` in
``gateway/audit/auditor.py``).

No noise, no false alarm: the auditor is fed the exact counts of the declared cells with
the public noise scales of the real releases (``tests/test_audit_workloads.py``), so what
it refuses here is what it refuses when the noise is zero — a deterministic check of the
decisions, at the product's own confidence. Through the pipeline the noise moves a few
groups near their margin (a city's 259 under-65s against a margin of about 107 at ε = 0.1):
``python -m bench.walkthrough --seeds N`` replays it with noise and reports the counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.walkthrough import WALKTHROUGH, make_gateway
from gateway.demo.hospital import PATIENTS, build
from gateway.pipeline.gateway import Gateway
from tests.test_audit_workloads import _exact_answer

EPSILON = 0.1


@pytest.fixture(scope="module")
def full_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo database at its real size (``dpgate demo``)."""
    path = tmp_path_factory.mktemp("full-demo") / "hospital.db"
    build(path, patients=PATIENTS)
    return path


def exact_replay(gateway: Gateway, questions: list[str], ids: str = "q") -> list[tuple[str, bool]]:
    """Ask ``questions`` in order with their exact counts; the refused ones, each with
    whether the pre-audit refused it (before execution: free). ``ids``: the prefix of
    their query ids (distinct from an earlier replay's into the same auditor)."""
    auditor = gateway.auditor
    refused = []
    for i, sql in enumerate(questions):
        answer = _exact_answer(gateway, f"{ids}{i}", sql, EPSILON)
        pre = auditor.pre_audit("exact", answer.plan)
        post = auditor.post_audit("exact", answer) if pre.allowed else pre
        if pre.allowed and post.allowed:
            auditor.remember("exact", answer)
        else:
            refused.append((sql, not pre.allowed))
    return refused


SUM_OVER_PART = (
    "SELECT department, SUM(cost) AS total FROM visits WHERE year = 2024 GROUP BY department"
)


def test_the_walkthrough_loses_only_a_sum_over_part_of_an_answered_group(
    full_demo: Path, tmp_path: Path
) -> None:
    refused = exact_replay(make_gateway(full_demo, tmp_path, 0), list(WALKTHROUGH))
    assert refused == [(SUM_OVER_PART, True)]


def test_a_refused_average_leaves_the_count_over_its_cells_answered(
    full_demo: Path, tmp_path: Path
) -> None:
    """A shuffled walkthrough (seed 3) asked the year counts and the SUM over 2024, then
    ``department, AVG(cost)`` — refused, rightly: each department's cost outside 2024,
    no count sizing it — and then ``department, COUNT(*)``, which determines nothing new
    of any statistic. It was refused too: the auditor kept the AVG's work on the same
    cells and reused it for the COUNT, SUM regions included (the attack that reuse let
    through is in tests/test_audit_attacks.py, "a trial stands in for no other
    statistic")."""
    average = "SELECT department, AVG(cost) AS mean_cost FROM visits GROUP BY department"
    questions = [
        "SELECT year, COUNT(*) AS n FROM visits GROUP BY year",
        SUM_OVER_PART,
        average,
        "SELECT department, COUNT(*) AS n FROM visits GROUP BY department",
    ]
    refused = exact_replay(make_gateway(full_demo, tmp_path, 0), questions)
    assert refused == [(average, True)]


def test_the_sum_over_part_of_a_group_says_to_add_a_count_and_is_answered_with_one(
    full_demo: Path, tmp_path: Path
) -> None:
    """The one question the written order loses names what to do: no count sizes each
    department's other years, and COUNT(*) in the same query would (the department
    totals minus its 2024 counts). Asked so, it is answered — and so is the whole
    walkthrough."""
    gateway = make_gateway(full_demo, tmp_path, 0)
    auditor = gateway.auditor
    at = WALKTHROUGH.index(SUM_OVER_PART)
    assert exact_replay(gateway, list(WALKTHROUGH[:at])) == []
    answer = _exact_answer(gateway, "sum", SUM_OVER_PART, EPSILON)
    decision = auditor.pre_audit("exact", answer.plan)
    assert not decision.allowed and "add COUNT(*) to this query" in decision.reason
    with_count = SUM_OVER_PART.replace("AS total", "AS total, COUNT(*) AS n")
    rest = [with_count, *WALKTHROUGH[at + 1 :]]
    assert exact_replay(gateway, rest, ids="rest") == []
