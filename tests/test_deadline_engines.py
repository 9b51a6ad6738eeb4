"""Every engine keeps the release moment (gateway/sql/execute.py, ``run_aggregate_until``).

A statement made slow on purpose — the real statement on the real engine, then held for
1.5 s more, as a driver that ignores the cancel would (Spark's job-group cancel does
nothing while the query is still planned) — must be reported as the one charged failure
at its release moment, not when the engine gives up; the miss is counted in
``dpgate_deadline_misses_total{stage="statement"}``, the statement as running in
``dpgate_abandoned_statements_running`` until it ends, and then in
``dpgate_abandoned_statement_overrun_seconds`` with how long after its deadline it
ended. And the same statement left alone is answered at its release moment on the same
engine.

The engines are the in-process ones (``engines.IN_PROCESS_ENGINES``): the lateness is the
pipeline's here, and Spark Connect's own cancel at the deadline is tested in
tests/test_engines.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

import gateway.pipeline.gateway
from gateway.core.config_load import parse_config
from gateway.core.errors import DatabaseUnavailable
from gateway.core.plan import QueryRequest
from gateway.pipeline.gateway import CHARGED_FAILURE_MESSAGE, Gateway
from tests import engines

DEADLINE_MS = 600  # fixed, so that the machine's load does not move it
SPARK_DEADLINE_MS = 15_000  # long enough for Spark to plan and run it on a loaded machine
HELD_S = 1.5  # what the slowed statement adds after the engine's answer (Spark: 15 s)
STAYS = {"pid": "integer", "dept": "text", "stay": "integer", "year": "integer"}
SQL = "SELECT dept, COUNT(*) FROM stays WHERE stay >= 2 GROUP BY dept"
ROWS = [
    {"pid": i // 3, "dept": ("ER", "ICU", "Ward")[i % 3], "stay": i % 11, "year": 2020}
    for i in range(600)
]


@pytest.fixture(
    scope="module", params=["sqlite", "duckdb", "postgres", *engines.IN_PROCESS_ENGINES]
)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str | None]]:
    """(URL, schema) of a database holding ``stays``."""
    yield from engines.table_on(request.param, tmp_path_factory, "stays", STAYS, ROWS)


def _deadline_ms(url: str) -> int:
    return SPARK_DEADLINE_MS if url.startswith("spark") else DEADLINE_MS


def _gateway(backend: tuple[str, str | None], tmp_path: Path) -> Gateway:
    url, schema = backend
    table: dict[str, Any] = {
        "privacy_unit": "pid",
        "max_rows_per_unit": 3,
        "rows": len(ROWS),
        "columns": {
            "pid": {"type": "integer"},
            "dept": {"type": "text", "values": ["ER", "ICU", "Ward"]},
            "stay": {"type": "integer", "lower": 0, "upper": 30},
            "year": {"type": "integer", "lower": 2019, "upper": 2025},
        },
    }
    if schema:
        table["schema"] = schema
    config = parse_config(
        {
            "database": {"url": url},
            "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
            "execution": {"timing": "deadline", "deadline_ms": _deadline_ms(url)},
            "audit": {"mode": "off"},
            "tables": {"stays": table},
        }
    )
    gw = Gateway(config)
    gw.ledger.create_analyst("erin", 100.0, 1e-6)
    return gw


def _ask(gw: Gateway, epsilon: float) -> tuple[float, Any]:
    started = time.monotonic()
    try:
        outcome: Any = gw.query("erin", QueryRequest(SQL, epsilon, 0.0, "laplace"))
    except DatabaseUnavailable as e:
        outcome = e
    return time.monotonic() - started, outcome


def _sample(name: str, **labels: str) -> float:
    return sum(
        s.value
        for m in REGISTRY.collect()
        for s in m.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _misses() -> float:
    return _sample("dpgate_deadline_misses_total", stage="statement")


def _abandoned() -> tuple[float, float, float]:
    """(abandoned statements of ``stays`` running now, those that ended after their
    deadline, the seconds by which they did in all)."""
    return (
        _sample("dpgate_abandoned_statements_running", table="stays"),
        _sample("dpgate_abandoned_statement_overrun_seconds_count", table="stays"),
        _sample("dpgate_abandoned_statement_overrun_seconds_sum", table="stays"),
    )


def test_an_engine_that_answers_late_is_reported_at_the_release_moment(
    backend: tuple[str, str | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = _gateway(backend, tmp_path)
    deadline = _deadline_ms(backend[0]) / 1000
    held = deadline if backend[0].startswith("spark") else HELD_S
    _ask(gw, 0.4)  # warm-up, whatever it comes to: a cold JVM plans for long under load
    # the statement, on time: answered, at its release moment
    elapsed, answer = _ask(gw, 0.5)
    assert not isinstance(answer, Exception), answer
    assert elapsed >= deadline

    real = gateway.pipeline.gateway.run_aggregate

    def late(engine: Any, sql: str, *, timeout_ms: int) -> Any:
        rows = real(engine, sql, timeout_ms=timeout_ms)
        time.sleep(held)
        return rows

    monkeypatch.setattr(gateway.pipeline.gateway, "run_aggregate", late)
    before = _misses()
    running, ended, overrun = _abandoned()
    elapsed, failure = _ask(gw, 0.6)  # another ε: not the cached answer
    assert isinstance(failure, DatabaseUnavailable), failure
    assert failure.to_dict()["error"]["message"] == CHARGED_FAILURE_MESSAGE
    # at the release moment, not when the engine's late answer came
    assert deadline <= elapsed < deadline + held / 2, elapsed
    assert _misses() == before + 1
    # the abandoned statement runs on: counted as running until it ends, then as one
    # that ended after its deadline, by about what the slowing added past the deadline
    assert _abandoned()[:2] == (running + 1, ended)
    for _ in range(int(held * 10) + 600):
        if _abandoned()[1] > ended:
            break
        time.sleep(0.1)
    now_running, now_ended, now_overrun = _abandoned()
    assert (now_running, now_ended) == (running, ended + 1)
    # it ended when the slowing let it: ``held`` after the engine's answer, which came
    # after the statement's deadline (the release moment less the time kept after it)
    assert held - deadline <= now_overrun - overrun < held + 60, now_overrun - overrun
    outcomes = [h.outcome for h in gw.ledger.history("erin")]
    assert outcomes[1:] == ["answered", "withheld"]
