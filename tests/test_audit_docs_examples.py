"""The docs' example queries, in any order, by one analyst of the demo: all answered.

Issue 32: the README's, docs/connect.md's and the console's example queries
(``bench.walkthrough.DOCS_EXAMPLES``) asked one after the other by one new analyst, in
their written order and shuffled with several seeds, at the demo's default ε = 0.1 and
audit ``refuse``, on the demo data at its real size. None may be refused or withheld.

Not yet met in every order: in three of the six shuffles (seeds 0, 2 and 4) a disease
breakdown comes after answers that, with it, determine a rare disease's group (seed 0:
``disease … WHERE age >= 40`` after ``disease, sex`` and ``sex … WHERE age >= 40``, a
rare disease's patients under 40) — a group of a few dozen that the noise at ε = 0.1
cannot show to hold 5 — and it is refused, free (docs/privacy.md, "What the auditor
refuses"). Those orders are marked ``xfail(strict=True)``: the day they are answered the
mark fails and must go.

Deterministic: the auditor is fed the exact counts of the released cells with the public
noise scales of the real releases (``tests/test_audit_walkthrough.exact_replay``), so what
it refuses here is what it refuses when the noise is zero — no false alarm to bound.
``python -m bench.walkthrough --docs-only --seeds N`` replays the same through the whole
pipeline with noise.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from bench.walkthrough import DOCS_EXAMPLES, make_gateway
from tests.conftest import REPOSITORY
from tests.test_audit_walkthrough import exact_replay
from tests.test_audit_walkthrough import full_demo as full_demo

SEEDS = range(6)
TEXTS = (
    REPOSITORY / "README.md",
    REPOSITORY / "docs" / "connect.md",
    REPOSITORY / "gateway" / "console" / "static" / "index.html",
)


def _pattern(sql: str) -> re.Pattern[str]:
    """An example as the docs may write it: a literal or a bound parameter in its place
    (``:sex``), spaces and line breaks as they fall."""
    parts = re.split(r"('[^']*'|\b\d+\b)", sql)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"(?:{re.escape(part)}|:\\w+)")
        else:
            out.append(r"\s+".join(re.escape(w) for w in part.split(" ")))
    return re.compile("".join(out))


def test_the_examples_are_the_docs_own() -> None:
    text = "\n".join(p.read_text() for p in TEXTS)
    missing = [sql for sql in DOCS_EXAMPLES if not _pattern(sql).search(text)]
    assert not missing, f"not in README.md, docs/connect.md or the console: {missing}"


#: The orders that still lose a rare disease's breakdown at ε = 0.1 (module doc).
RARE_GROUP_REFUSED = frozenset({0, 2, 4})


@pytest.mark.parametrize(
    "seed",
    [
        None,
        *(
            pytest.param(
                s,
                marks=pytest.mark.xfail(
                    strict=True, reason="a rare disease's group at ε = 0.1 (issue 32)"
                ),
            )
            if s in RARE_GROUP_REFUSED
            else s
            for s in SEEDS
        ),
    ],
)
def test_the_docs_examples_are_answered_in_any_order(
    seed: int | None, full_demo: Path, tmp_path: Path
) -> None:
    questions = list(DOCS_EXAMPLES)
    if seed is not None:
        random.Random(seed).shuffle(questions)
    refused = exact_replay(make_gateway(full_demo, tmp_path, 0), questions)
    assert refused == [], f"order {questions}"
