"""The auditor's precision for honest work (issue 32), and the attacks it must still stop.

Two changes in how a determined region is sized, both from public information only:

- only answers that release a *count* combine into an estimate of a region's size: a
  SUM's or a quantile's row over the same cells (which carries no count) left the
  estimate "unknown" when the basis happened to hold it, and the region was refused;
- among the combinations of answered counts that determine a region, the one with the
  least noise variance (over the public scales) is used: a region was refused when the
  basis expressed it through a long chain of answers and a short one existed.

No database: the answers are fed by hand, as in ``tests/test_audit.py``. Counts here are
at ε = 0.1 (discrete Laplace, scale 10), the demo's default.
"""

from __future__ import annotations

import pytest

from gateway.audit import Auditor, CountNoise
from gateway.audit.confidence import noise_quantile
from gateway.audit.findings import Sizing
from gateway.core.config import TableConfig
from tests.test_audit import K, Session, refused
from tests.test_audit import tables as tables

SCALE = 10.0
NOISE = CountNoise("laplace", SCALE)
CITIES = ("Budapest", "Debrecen", "Szeged", "Pécs", "Győr", "Miskolc", "Eger", "Sopron")
DISEASES = ("Crohn", "Influenza", "Meningitis", "Diabetes", "Asthma", "Hypertension", "None")


class Noisy(Session):
    """A session whose counts carry the demo's default noise (scale 10), which the
    pre-audit is told as the pipeline tells it."""

    noise = NOISE
    noise_in_pre_audit = True


@pytest.fixture
def alice(tables: dict[str, TableConfig]) -> Noisy:
    return Noisy(Auditor(tables, min_group_size=K), tables)


def test_a_sum_over_everyone_does_not_hide_the_counts(alice: Noisy) -> None:
    """SUM(income) over everyone carries no count; the disease breakdown gives everyone's
    count, and the over-65s by city then determine the under-65s. AVG(income) over
    everyone was refused: the basis combined the under-65s through the SUM's row."""
    assert not refused(alice.ask("SELECT SUM(income) FROM patients", None))
    by_disease = [
        ((d,), n) for d, n in zip(DISEASES, (129, 1443, 61, 1109, 849, 1756, 6653), strict=True)
    ]
    assert not refused(
        alice.ask("SELECT disease, COUNT(*) FROM patients GROUP BY disease", by_disease)
    )
    older = [((c,), n) for c, n in zip(CITIES, (900, 200, 180, 160, 140, 130, 60, 50), strict=True)]
    assert not refused(
        alice.ask("SELECT city, COUNT(*) FROM patients WHERE age >= 65 GROUP BY city", older)
    )
    assert not refused(alice.ask("SELECT AVG(income) FROM patients", 12000.0))
    assert not refused(alice.ask("SELECT STDDEV(income) FROM patients", 12000.0))


def test_the_attack_a_sum_pair_around_one_person_is_still_refused(alice: Noisy) -> None:
    """The same mix, around one person: everyone's income, then everyone's but the
    37-year-olds' (one person): no count shows that group large, so it is refused."""
    assert not refused(alice.ask("SELECT AVG(income) FROM patients", 3000.0))
    assert refused(alice.ask("SELECT SUM(income) FROM patients WHERE age <> 37", None))
    assert refused(alice.ask("SELECT AVG(income) FROM patients WHERE age <> 37", 2999.0))


def test_a_region_is_sized_through_the_shortest_chain(
    alice: Noisy,
    tables: dict[str, TableConfig],
) -> None:
    """Everyone (from the disease breakdown), the over-65s by city, then all patients by
    city: each city's under-65s are one city cell minus its over-65s (two noises). The
    basis expressed the last city through everyone minus the seven others (nine noises,
    a margin of about 300 at ε = 0.1): its 199 under-65s were withheld."""
    sized: list[Sizing] = []
    alice.auditor.observe = sized.append
    by_disease = [
        ((d,), n) for d, n in zip(DISEASES, (129, 1443, 61, 1109, 849, 1756, 6653), strict=True)
    ]
    alice.ask("SELECT disease, COUNT(*) FROM patients GROUP BY disease", by_disease)
    older = (900, 200, 180, 160, 140, 130, 60, 60)
    alice.ask(
        "SELECT city, COUNT(*) FROM patients WHERE age >= 65 GROUP BY city",
        [((c,), n) for c, n in zip(CITIES, older, strict=True)],
    )
    everyone = (4800, 1100, 1000, 900, 800, 750, 400, 250)
    sized.clear()
    result = alice.ask(
        "SELECT city, COUNT(*) FROM patients GROUP BY city",
        [((c,), n) for c, n in zip(CITIES, everyone, strict=True)],
    )
    assert not refused(result)
    two = noise_quantile([(1.0, CountNoise("laplace", SCALE))] * 2, alice.auditor.alpha)
    post = [s for s in sized if not s.pre]
    assert post and max(s.margin for s in post) == pytest.approx(two)


def test_the_attack_a_short_chain_around_one_person_is_still_refused(alice: Noisy) -> None:
    """The same shapes around one person: Sopron's patients, and Sopron's but the
    37-year-olds': the least-noise combination is the pair, its bound is below k."""
    by_disease = [
        ((d,), n) for d, n in zip(DISEASES, (129, 1443, 61, 1109, 849, 1756, 6653), strict=True)
    ]
    alice.ask("SELECT disease, COUNT(*) FROM patients GROUP BY disease", by_disease)
    assert not refused(alice.ask("SELECT COUNT(*) FROM patients WHERE city = 'Sopron'", 250.0))
    assert refused(
        alice.ask("SELECT COUNT(*) FROM patients WHERE city = 'Sopron' AND age <> 37", 249.0)
    )
