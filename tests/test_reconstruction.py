"""Reconstruction attack (Dinur–Nissim 2003): works on exact answers, fails through dpgate.

256 people, each with a secret bit. The attacker asks random subset counts
``COUNT(*) WHERE secret = 1 AND id IN (…)`` and decodes the bits by least squares and by
the Dinur–Nissim linear program (scipy ``linprog``). On exact answers computed straight
from the database it recovers (almost) every bit. Through dpgate, with a total budget of
ε = 1 (pure accounting) split over its queries, it cannot do much better than
guessing: no ε = 1 mechanism lets anyone guess a bit with probability above
e / (1 + e) ≈ 73%, and the test asserts ≤ 80%. It runs with the auditor off (the noise
alone) and on (the auditor also stops the queries once single people are determined).

The database here is the test's own fixture (SQLite), not the auditor's business.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from scipy.optimize import linprog

from gateway.core.config_load import parse_config
from gateway.core.errors import AuditRefused, BudgetExhausted, GatewayError
from gateway.core.plan import QueryRequest

N = 256
QUERIES = 512  # on exact answers: twice overdetermined
DP_QUERIES = 300  # through dpgate: ε = 1/300 each (fewer, noisier-per-query answers
# change nothing: no split of ε = 1 beats the e/(1+e) ceiling)
SEED = 20260


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(SEED)
    secret = rng.integers(0, 2, N)
    path = tmp_path_factory.mktemp("recon") / "people.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE people (id INTEGER NOT NULL, secret INTEGER NOT NULL)")
        db.executemany(
            "INSERT INTO people VALUES (?, ?)", [(i, int(s)) for i, s in enumerate(secret)]
        )
    return path, secret


def subsets() -> np.ndarray:
    return np.random.default_rng(SEED + 1).integers(0, 2, (QUERIES, N)).astype(bool)


def sql_for(subset: np.ndarray) -> str:
    ids = ", ".join(str(i) for i in np.nonzero(subset)[0])
    return f"SELECT COUNT(*) AS n FROM people WHERE secret = 1 AND id IN ({ids})"


def decode_least_squares(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    x, *_ = np.linalg.lstsq(a.astype(float), y, rcond=None)
    return (x > 0.5).astype(int)


def decode_lp(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min Σ|a·x − y| over x ∈ [0, 1]ⁿ (variables x, then one slack per answer)."""
    m, n = a.shape
    af = a.astype(float)
    c = np.concatenate([np.zeros(n), np.ones(m)])
    upper = np.hstack([af, -np.eye(m)])  # a·x − e ≤ y
    lower = np.hstack([-af, -np.eye(m)])  # −a·x − e ≤ −y
    res = linprog(
        c,
        A_ub=np.vstack([upper, lower]),
        b_ub=np.concatenate([y, -y]),
        bounds=[(0, 1)] * n + [(0, None)] * m,
        method="highs",
    )
    assert res.status == 0
    return (res.x[:n] > 0.5).astype(int)


def recovery(guess: np.ndarray, secret: np.ndarray) -> float:
    return float(np.mean(guess == secret))


def test_the_attack_works_on_exact_answers(people: tuple[Path, np.ndarray]) -> None:
    path, secret = people
    a = subsets()
    with sqlite3.connect(path) as db:
        y = np.array([db.execute(sql_for(s)).fetchone()[0] for s in a], dtype=float)
    assert recovery(decode_least_squares(a, y), secret) >= 0.98
    assert recovery(decode_lp(a, y), secret) >= 0.98


def _gateway(path: Path, tmp: Path, mode: str) -> Any:
    from gateway.pipeline.gateway import Gateway

    raw = {
        "database": {"url": f"sqlite:///{path}"},
        "ledger": {"url": f"sqlite:///{tmp / ('ledger-' + mode + '.db')}"},
        "privacy": {
            "mechanism": "laplace",
            "epsilon": 0.01,
            "max_epsilon_per_query": 1.0,
            "min_epsilon_per_query": 0.001,
            "composition": "pure",
        },
        "audit": {"mode": mode, "min_group_size": 5},
        "execution": {"timing": "off"},  # reconstruction, not timing, is under test here
        "tables": {
            "people": {
                "columns": {
                    "id": {"type": "integer", "lower": 0, "upper": N - 1},
                    "secret": {"type": "integer", "lower": 0, "upper": 1},
                }
            }
        },
        "analysts": [{"name": "mallory", "epsilon": 1.0, "delta": 1e-6}],
    }
    return Gateway(parse_config(yaml.safe_load(yaml.safe_dump(raw))))


@pytest.mark.parametrize("mode", ["off", "refuse"])
def test_the_attack_fails_through_dpgate_at_epsilon_one(
    people: tuple[Path, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    monkeypatch.setenv("DPGATE_ADMIN_KEY", "admin-" + "k" * 40)
    path, secret = people
    gw = _gateway(path, tmp_path, mode)
    a = subsets()[:DP_QUERIES]
    eps = 1.0 / DP_QUERIES * (1 - 1e-9)
    answered: list[int] = []
    y: list[float] = []
    refused = 0
    for j, s in enumerate(a):
        try:
            release = gw.query("mallory", QueryRequest(sql_for(s), eps, 0.0, "laplace"))
        except (AuditRefused, BudgetExhausted):
            refused += 1
            continue
        except GatewayError as e:  # anything else is a test failure worth seeing
            raise AssertionError(f"query {j}: {e.code}: {e.message}") from e
        answered.append(j)
        y.append(float(release.rows[0][0]))
    assert answered, "the attacker got no answer at all"
    sub, ys = a[answered], np.array(y)
    for decode in (decode_least_squares, decode_lp):
        rate = recovery(decode(sub, ys), secret)
        print(
            f"audit={mode} answered={len(answered)} refused={refused} {decode.__name__}: {rate:.3f}"
        )
        assert rate <= 0.80
    if mode == "refuse":
        assert refused > 0  # single people became determined: the auditor stepped in
