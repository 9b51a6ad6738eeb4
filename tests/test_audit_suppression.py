"""Cells left out instead of a whole answer withheld (``Auditor.post_audit_cells``).

A breakdown one of whose cells would, with earlier answers, determine a group the noisy
answers cannot show to hold k used to be withheld whole, after its charge. Now the cells
that group's estimate needs are left out and the rest audited again, as it would be
released; a known total makes one cell's absence useless (the total minus the others
gives it back), and the re-audit then leaves out a second cell — secondary suppression,
as statistical offices practise it. What is released is what the last audit passed.

The auditor is fed the exact counts with the public noise scales of the real releases at
ε = 0.1 (``tests/test_audit_workloads.py``): no noise, so no false alarm. The demo's 25
Meningitis patients under 40 are a real group that ε = 0.1 cannot show to hold 5
(docs/privacy.md, "What the auditor refuses"). The released regions are then checked
apart from the auditor: on the disease × (age < 40, age ≥ 40) grid, no combination of
them is the Meningitis patients under 40.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.walkthrough import make_gateway
from gateway.demo.hospital import DISEASES, PATIENTS, build
from gateway.pipeline.gateway import Gateway
from tests.test_audit_workloads import _exact_answer

EPSILON = 0.1
TOTAL = "SELECT COUNT(*) FROM patients"
READINGS = "SELECT disease, AVG(glucose) AS g FROM patients GROUP BY disease"
BY_DISEASE = "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease"


@pytest.fixture(scope="module")
def full_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("suppression-demo") / "hospital.db"
    build(path, patients=PATIENTS)
    return path


def _gateway(full_demo: Path, tmp_path: Path) -> Gateway:
    db = tmp_path / "demo.db"
    shutil.copy(full_demo, db)
    return make_gateway(db, tmp_path, 0)


def _answered(full_demo: Path, tmp_path: Path, questions: tuple[str, ...]) -> Gateway:
    """A gateway whose auditor has answered ``questions`` with their exact counts."""
    gateway = _gateway(full_demo, tmp_path)
    for i, sql in enumerate(questions):
        answer = _exact_answer(gateway, f"q{i}", sql, EPSILON)
        assert gateway.auditor.post_audit("exact", answer).allowed
        gateway.auditor.remember("exact", answer)
    return gateway


def _in_span(regions: list[np.ndarray], target: np.ndarray) -> bool:
    a = np.array(regions, dtype=float).T
    coefs, *_ = np.linalg.lstsq(a, target.astype(float), rcond=None)
    return bool(np.allclose(a @ coefs, target, atol=1e-9))


def _region(diseases: list[str], halves: tuple[bool, ...]) -> np.ndarray:
    """A region of a grid disease × two halves — (glucose read, not read), or (under 40,
    40 and over) — ``True`` the first half, ``False`` the second."""
    v = np.zeros(2 * len(DISEASES))
    for d in diseases:
        for first in halves:
            v[2 * DISEASES.index(d) + (0 if first else 1)] = 1
    return v


def test_a_breakdown_keeps_its_other_rows_and_leaves_out_enough_to_hide_the_groups(
    full_demo: Path, tmp_path: Path
) -> None:
    """The total, then the mean glucose by disease (each disease's patients with a
    reading), then the count by disease: each disease's patients without a reading are
    determined — none among the diabetics (all tested), 16 with Meningitis, hundreds
    with influenza. Whole, the breakdown is withheld; now the rows whose group cannot be
    shown to hold 5 are left out, and, the total being known, one more."""
    gateway = _answered(full_demo, tmp_path, (TOTAL, READINGS))
    auditor = gateway.auditor
    answer = _exact_answer(gateway, "q2", BY_DISEASE, EPSILON)
    assert auditor.pre_audit("exact", answer.plan).allowed  # its sizes need the answer
    whole = auditor.post_audit("exact", answer)
    assert not whole.allowed  # whole, it is withheld
    decision, kept, groups = auditor.post_audit_cells("exact", answer)
    assert decision.allowed
    diseases = [str(c.group_values[0]) for c in answer.cells]
    left = [d for i, d in enumerate(diseases) if i not in kept]
    primaries = {diseases[i] for need in whole.cells for i in need}
    assert {"Meningitis", "Diabetes"} <= primaries <= set(left)
    assert len(left) == len(primaries) + 1, (left, primaries)  # one more: the total is known
    assert all("glucose IS NULL" in g for g in groups), groups
    # apart from the auditor, on the grid: what was released determines no left-out
    # disease's patients without a reading
    released = [_region(list(DISEASES), (True, False))]  # the total
    released += [_region([d], (True,)) for d in DISEASES]  # the readings by disease
    released += [_region([diseases[i]], (True, False)) for i in kept]
    for d in left:
        assert not _in_span(released, _region([d], (False,))), d
    # had only the primary rows gone, the total would have given them back
    only = released[: 1 + len(DISEASES)] + [
        _region([d], (True, False)) for d in diseases if d not in primaries
    ]
    assert _in_span(only, _region(sorted(primaries), (False,)))
    # it remembers what it released, and only that: asked again, the breakdown loses
    # the same rows (the kept ones are asked directly now; the others still determine)
    auditor.remember("exact", replace(answer, cells=tuple(answer.cells[i] for i in kept)))
    again = _exact_answer(gateway, "q3", BY_DISEASE, EPSILON)
    decision, kept_again, _ = auditor.post_audit_cells("exact", again)
    assert decision.allowed and kept_again == kept


def test_a_breakdown_whose_every_row_is_needed_is_withheld_whole(
    full_demo: Path, tmp_path: Path
) -> None:
    """A single-cell answer has nothing to leave out but itself: withheld, as before."""
    gateway = _gateway(full_demo, tmp_path)
    auditor = gateway.auditor
    first = _exact_answer(
        gateway, "q0", "SELECT COUNT(*) FROM patients WHERE disease = 'Meningitis'", EPSILON
    )
    auditor.remember("exact", first)
    second = _exact_answer(
        gateway,
        "q1",
        "SELECT COUNT(*) FROM patients WHERE disease = 'Meningitis' AND age >= 40",
        EPSILON,
    )
    decision, kept, groups = auditor.post_audit_cells("exact", second)
    assert not decision.allowed and kept == () and groups == ()


OVER_40_TOTAL = "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY sex"
OVER_40 = "SELECT disease, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY disease"


def test_rows_the_earlier_answers_already_show_too_fine_are_left_out_before_it_runs(
    full_demo: Path, tmp_path: Path
) -> None:
    """The count by disease and the over-40s by sex, then the over-40s by disease: the
    25 Meningitis patients under 40 (the total minus the over-40s) cannot be shown to
    hold 5 at ε = 0.1 whatever the new answer — refused whole, free, before. Now the
    Meningitis row is left out before it runs, decided from earlier answers only (a dry
    run says so); the over-40s' total would give it back through the other rows, a
    group whose size the new answer decides, so the post-audit leaves out more."""
    gateway = _answered(full_demo, tmp_path, (BY_DISEASE, OVER_40_TOTAL))
    auditor = gateway.auditor
    answer = _exact_answer(gateway, "q2", OVER_40, EPSILON)
    assert not auditor.pre_audit("exact", answer.plan).allowed  # whole, refused free
    decision, pre_kept, groups = auditor.pre_audit_cells("exact", answer.plan)
    assert decision.allowed and pre_kept is not None
    diseases = [str(c.group_values[0]) for c in answer.cells]
    assert [d for i, d in enumerate(diseases) if i not in pre_kept] == ["Meningitis"]
    assert groups == ("disease = 'Meningitis' AND age < 40",), groups
    prediction = auditor.predict("exact", answer.plan)
    assert prediction.verdict == "answered_in_part"
    assert prediction.left_out == (("Meningitis",),)
    assert "may be left out once its answer is known" in prediction.reason
    offered = replace(answer, cells=tuple(answer.cells[i] for i in pre_kept))
    decision, post_kept, _ = auditor.post_audit_cells("exact", offered)
    assert decision.allowed
    kept = [pre_kept[i] for i in post_kept]
    left = [d for i, d in enumerate(diseases) if i not in kept]
    # (the 35 Crohn patients under 40 go too: the exact answer cannot show them to hold 5)
    assert "Meningitis" in left and 2 <= len(left) < len(diseases) - 2, left
    released = [_region([d], (True, False)) for d in DISEASES]
    released.append(_region(list(DISEASES), (False,)))
    released += [_region([diseases[i]], (False,)) for i in kept]
    for d in left:
        assert not _in_span(released, _region([d], (True,))), d
