"""The demo walkthrough of issue 32 (``bench/walkthrough.py``): the README's, the console's
and docs/connect.md's examples and 34 ordinary questions of one new analyst, at the demo's
default ε = 0.1, audit ``refuse``, on the demo data at its real size.

In its written order, fed the exact counts, every question is answered but eight, each
naming its group (docs/privacy.md, "What the auditor refuses"):

- ``z.region, p.sex, COUNT(*) … JOIN zip_regions`` after the README's ``LEFT JOIN`` and the
  console's inner join determines, per sex, the patients whose zip is not listed — none in
  the demo, but the demo's ``patients.zip`` reference is plain: refused for free, the
  LEFT JOIN's own count of that group already showing it small;
- seven single-table ``visits`` questions after the join of ``patients`` and ``visits``
  determine the visits without a patient row — none in the demo, but its ``visits``
  reference is plain too: withheld after execution. Declared ``every_row_matches``, the
  reference makes that group empty by construction (docs/privacy.md, "Joins"), and these
  seven are answered; the demo does not declare it, because then the README's first query
  missed its release deadline (``tests/test_first_hour.py``, with ``deadline_margin: 2``).

Before issue 32's second pass the same replay also withheld the smokers without a glucose
reading (2 per disease in the old demo data: glucose is now missing for the untested
quarter of non-diabetic patients), and, with noise, a city's under-65s sized through a
chain of nine answers (the least-noise solver inverted rounding noise and found nothing:
``PINV_RCOND`` in ``gateway/audit/auditor.py``).

No noise, no false alarm: the auditor is fed the exact counts of the declared cells with
the public noise scales of the real releases (``tests/test_audit_workloads.py``), so what
it refuses here is what it refuses when the noise is zero — a deterministic check of the
decisions, at the product's own confidence. Through the pipeline the noise moves a few
groups near their margin (a city's 259 under-65s against a margin of about 107 at ε = 0.1):
``python -m bench.walkthrough --seeds N`` replays it with noise and reports the counts.
"""

from __future__ import annotations

from pathlib import Path

from bench.walkthrough import WALKTHROUGH, make_gateway
from gateway.pipeline.gateway import Gateway
from tests.test_audit_workloads import _exact_answer
from tests.test_audit_workloads import full_demo as full_demo

EPSILON = 0.1
UNLISTED_ZIPS = (
    "SELECT z.region, p.sex, COUNT(*) AS n FROM patients p "
    "JOIN zip_regions z ON p.zip = z.zip GROUP BY z.region, p.sex"
)


def exact_replay(gateway: Gateway, questions: list[str]) -> list[tuple[str, bool]]:
    """Ask ``questions`` in order with their exact counts; the refused ones, each with
    whether the pre-audit refused it (before execution: free)."""
    auditor = gateway.auditor
    refused = []
    for i, sql in enumerate(questions):
        answer = _exact_answer(gateway, f"q{i}", sql, EPSILON)
        pre = auditor.pre_audit("exact", answer.plan)
        post = auditor.post_audit("exact", answer) if pre.allowed else pre
        if pre.allowed and post.allowed:
            auditor.remember("exact", answer)
        else:
            refused.append((sql, not pre.allowed))
    return refused


VISITS_ALONE = (
    "SELECT year, COUNT(*) AS n FROM visits GROUP BY year",
    "SELECT department, COUNT(*) AS n FROM visits GROUP BY department",
    "SELECT department, AVG(cost) AS mean_cost FROM visits GROUP BY department",
    "SELECT year, AVG(length_of_stay) AS stay FROM visits GROUP BY year",
    "SELECT COUNT(*) FROM visits",
    "SELECT AVG(cost) FROM visits",
)


def test_the_walkthrough_loses_only_the_unmatched_rows_groups(
    full_demo: Path, tmp_path: Path
) -> None:
    refused = exact_replay(make_gateway(full_demo, tmp_path, 0), list(WALKTHROUGH))
    last = "SELECT year, department, COUNT(*) AS n FROM visits GROUP BY year, department"
    assert refused == [
        *((sql, False) for sql in VISITS_ALONE),
        (UNLISTED_ZIPS, True),
        (last, False),
    ]
