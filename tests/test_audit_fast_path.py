"""The auditor's fast path decides exactly as a straightforward computation.

Issue 32 made the audit of a new query cheaper (bench/README.md, "the audit's price and
precision"): the span's dense update writes in place, the noise quantile evaluates its
terms at once, the candidate regions' "determined before?" test runs on all of them at
once, and a size that clears k with a cheap upper bound on the confidence margin is not
sized with the margin itself. None of that may change a decision. Here seeded random
histories of overlapping boxes (age × income, with GROUP BY sex and conditions on
disease, on the demo schema) are audited twice: by the auditor as it is, and by the same
auditor with the straightforward computations put back (the loop over noise terms, every
margin computed in full, the basis update through an outer product, the regions tested
one by one, the cell space refined and split even when it already is). Every pre-audit
and post-audit must agree: allowed or not, the reason, the
queries combined and the groups named.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import yaml

from gateway.audit import AnsweredCell, AnsweredQuery, Auditor, CountNoise
from gateway.audit import findings as auditor_module
from gateway.audit import span as span_module
from gateway.audit.confidence import _GRID, noise_quantile, quantile_upper_bound
from gateway.audit.space import CellSpace
from gateway.core.config import TableConfig, with_nullability
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.demo.hospital import NULLABLE, config_yaml
from gateway.sql.analyze import analyze

K = 5


@pytest.fixture(scope="module")
def tables() -> dict[str, TableConfig]:
    cfg = parse_config(yaml.safe_load(config_yaml("demo.db", "ledger.db")))
    return with_nullability(cfg.tables, NULLABLE)


def reference_noise_quantile(terms: Sequence[tuple[float, CountNoise]], alpha: float) -> float:
    """The Chernoff bound of ``confidence.noise_quantile``, one term after the other."""
    laplace = [(abs(c), n.scale) for c, n in terms if n.mechanism == "laplace" and c]
    variance = sum(c * c * n.scale * n.scale for c, n in terms if n.mechanism == "gaussian")
    if any(not math.isfinite(b) or b < 0 for _, b in laplace):
        return math.inf
    laplace = [(c, b) for c, b in laplace if b > 0]
    log_alpha = math.log(1 / alpha)
    if not laplace:
        return math.sqrt(2 * variance * log_alpha)
    t = _GRID * min(1 / (c * b) for c, b in laplace)
    log_mgf = 0.5 * variance * t * t
    for c, b in laplace:
        p = math.exp(-1 / b)
        s = c * t
        log_mgf = log_mgf + (
            2 * math.log1p(-p) - np.log1p(-p * np.exp(s)) - np.log1p(-p * np.exp(-s))
        )
    return float(np.min((log_alpha + log_mgf) / t))


def reference_insert(
    self: span_module.Block, x: np.ndarray, row_id: int
) -> tuple[span_module.Block, bool]:
    """``Block.insert`` with the dense update through ``np.outer`` into fresh arrays."""
    res = self.residual(x)
    if self.rank == 0 or float(np.max(np.abs(res))) < span_module.DOUBT_TOL:
        return ORIGINAL_INSERT(self, x, row_id)  # dependent or in doubt: nothing to update
    o = -(x[self.pivots] @ self.origin)
    p = int(np.argmax(np.abs(res)))
    scale = res[p]
    res = res / scale
    o = np.append(o, 1.0) / scale
    r = self.rank
    c = self.basis[:, p].copy()
    basis = self.basis - np.outer(c, res)
    origin = np.zeros((r + 1, r + 1))
    origin[:r, :r] = self.origin - np.outer(c, o[:r])
    origin[:r, r] = -c * o[r]
    basis[np.nonzero(c)[0], p] = 0.0
    origin[r] = o
    return (
        span_module.Block(
            self.cols,
            np.vstack([basis, res[None, :]]),
            np.append(self.pivots, p).astype(np.intp),
            origin,
            (*self.members, row_id),
            np.vstack([self.asked, x[None, :] > 0.5]),
            (*self.asked_ids, row_id),
            np.append(self.dirty_rows() | (c != 0), True),
        ),
        True,
    )


ORIGINAL_INSERT = span_module.Block.insert


def history(seed: int, n: int) -> list[tuple[str, list[tuple[tuple[Any, ...], float]]]]:
    """Queries (overlapping boxes, some grouped by sex or filtered on disease) and the
    noisy counts each would release, drawn from ``seed`` (small counts: refusals)."""
    rng = random.Random(seed)
    out: list[tuple[str, list[tuple[tuple[Any, ...], float]]]] = []
    for _ in range(n):
        a = rng.randrange(0, 80, 10)
        b = rng.randrange(a + 10, 101, 10)
        x = rng.randrange(0, 60_000, 10_000)
        y = rng.randrange(x + 10_000, 80_001, 10_000)
        where = f"age BETWEEN {a} AND {b} AND income >= {x} AND income < {y}"
        if rng.random() < 0.2:
            where += " AND disease = 'Diabetes'"
        if rng.random() < 0.25:
            sql = f"SELECT sex, COUNT(*) FROM patients WHERE {where} GROUP BY sex"
            cells: list[tuple[tuple[Any, ...], float]] = [
                (("F",), float(rng.randrange(0, 40))),
                (("M",), float(rng.randrange(0, 40))),
            ]
        else:
            sql = f"SELECT COUNT(*) FROM patients WHERE {where}"
            cells = [((), float(rng.randrange(0, 80)))]
        out.append((sql, cells))
    return out


def decisions(
    tables: dict[str, TableConfig], queries: list[tuple[str, list[tuple[tuple[Any, ...], float]]]]
) -> list[tuple[Any, ...]]:
    """Every decision of one analyst's session, pre-audit then post-audit, as seen."""
    auditor = Auditor(tables, min_group_size=K)
    noise = CountNoise("laplace", 2.0)
    seen: list[tuple[Any, ...]] = []
    for i, (sql, cells) in enumerate(queries):
        plan = analyze(sql, tables)
        assert isinstance(plan, QueryPlan)
        pre = auditor.pre_audit("a", plan, noise)
        seen.append(("pre", i, pre.allowed, pre.reason, pre.combined_with, pre.groups))
        if not pre.allowed:
            continue
        answer = AnsweredQuery(
            f"q{i}", plan, tuple(AnsweredCell(v, c, {}, noise) for v, c in cells)
        )
        post = auditor.post_audit("a", answer)
        seen.append(("post", i, post.allowed, post.reason, post.combined_with, post.groups))
        if post.allowed:
            auditor.remember("a", answer)
    return seen


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fast_path_decides_as_the_straightforward_computation(
    seed: int, tables: dict[str, TableConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    queries = history(seed, 70)
    aligned = CellSpace.aligned
    shortcuts: list[bool] = []

    def counted(self: CellSpace, label: np.ndarray) -> np.ndarray | None:
        out = aligned(self, label)
        shortcuts.append(out is not None)
        return out

    monkeypatch.setattr(CellSpace, "aligned", counted)
    fast = decisions(tables, queries)
    assert any(shortcuts) and not all(shortcuts)  # both ways are taken
    # no shortcut: the space refined and split for every query, as if it never were
    monkeypatch.setattr(CellSpace, "needs", lambda self, formulas: True)
    monkeypatch.setattr(CellSpace, "aligned", lambda self, label: None)
    monkeypatch.setattr(auditor_module, "noise_quantile", reference_noise_quantile)
    # no shortcut: every margin computed in full
    monkeypatch.setattr(auditor_module, "quantile_upper_bound", lambda *args: math.inf)
    monkeypatch.setattr(auditor_module, "_in_old_spans", lambda *args: None)
    monkeypatch.setattr(span_module.Block, "insert", reference_insert)
    block_counts = auditor_module._BlockCounts.of  # noise terms through add_noise_terms
    monkeypatch.setattr(
        auditor_module._BlockCounts,
        "of",
        staticmethod(lambda *a: dataclasses.replace(block_counts(*a), own_noise=False)),
    )
    reference = decisions(tables, queries)
    assert fast == reference
    # the histories reach the paths that matter: refusals that name groups, answers
    refusals = [d for d in fast if not d[2]]
    assert any(d[5] for d in refusals), "no refusal named a group"
    assert sum(1 for d in fast if d[0] == "post" and d[2]) >= 20


def test_noise_quantile_is_the_loop_over_terms_bit_for_bit_and_bounded_above() -> None:
    rng = random.Random(7)
    for _ in range(500):
        terms = [
            (
                rng.choice([1.0, -1.0, 0.5, -0.5, rng.uniform(-3, 3)]),
                CountNoise(
                    rng.choice(["laplace", "laplace", "gaussian"]),
                    rng.choice([1.0, 2.0, 10.0, rng.uniform(0.1, 40.0)]),
                ),
            )
            for _ in range(rng.choice([1, 2, 5, 40, 300]))
        ]
        alpha = rng.choice([1e-3, 1e-6, 0.05])
        exact = noise_quantile(terms, alpha)
        assert exact == reference_noise_quantile(terms, alpha)
        assert quantile_upper_bound(terms, alpha) >= exact


def test_regions_tested_at_once_are_those_tested_one_by_one(
    tables: dict[str, TableConfig],
) -> None:
    """``_in_old_spans`` against ``_in_old_span`` on a history's knowledge: regions in
    the span (sums and differences of answered regions) and regions that are not."""
    auditor = Auditor(tables, min_group_size=K)
    noise = CountNoise("laplace", 2.0)
    for i, (sql, cells) in enumerate(history(4, 40)):
        plan = analyze(sql, tables)
        assert isinstance(plan, QueryPlan)
        answer = AnsweredQuery(
            f"q{i}", plan, tuple(AnsweredCell(v, c, {}, noise) for v, c in cells)
        )
        auditor.remember("a", answer)  # unaudited: a knowledge with every region in it
    kn = auditor.knowledge("a", "patients").parts[0]
    block = max(kn.blocks, key=lambda b: b.rank)
    rng = np.random.default_rng(4)
    regions = []
    for _ in range(200):
        i, j = rng.integers(len(block.asked), size=2)
        both = block.asked[i] & block.asked[j]
        regions += [block.asked[i] & ~block.asked[j], both, block.asked[i] | block.asked[j]]
        regions.append(rng.random(len(block.cols)) < 0.3)
    regions = [r for r in regions if r.any()]
    at_once = auditor_module._in_old_spans(kn, block.cols, regions)
    assert at_once is not None
    one_by_one = []
    for r in regions:
        mask = np.zeros(kn.space.n_atoms, dtype=bool)
        mask[block.cols[r]] = True
        one_by_one.append(auditor_module._in_old_span(kn, mask))
    assert at_once == one_by_one
    assert 0 < sum(one_by_one) < len(one_by_one)
