"""Which CPU a gunicorn worker is pinned to (gateway/server/serve_workers.py::pin_worker).

The rule is checked here against a pretend set of CPUs; tests/test_serve.py checks a
real server's workers."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("gunicorn")

from gateway.server.serve_workers import pin_worker


@pytest.fixture
def cpus(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A process allowed CPUs 2, 5 and 7; records what the worker pins itself to."""
    seen: dict[str, object] = {"allowed": {7, 2, 5}, "pinned": None}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(seen["allowed"]), raising=False)  # type: ignore[arg-type]

    def pin(pid: int, mask: set[int]) -> None:
        seen["pinned"] = mask

    monkeypatch.setattr(os, "sched_setaffinity", pin, raising=False)
    return seen


@pytest.mark.parametrize(("slot", "cpu"), [(0, 2), (1, 5), (2, 7), (3, 2), (5, 7)])
def test_slot_i_takes_the_ith_allowed_cpu(cpus: dict[str, object], slot: int, cpu: int) -> None:
    assert pin_worker(slot, workers=3) == cpu
    assert cpus["pinned"] == {cpu}


@pytest.mark.parametrize(
    ("slot", "workers", "setting", "allowed"),
    [
        (0, 2, "auto", {2, 5, 7}),  # fewer workers than CPUs: C work may spill over
        (0, 3, "off", {2, 5, 7}),  # DPGATE_CPU_AFFINITY=off
        (None, 3, "auto", {2, 5, 7}),  # a worker without a slot (every slot taken)
        (0, 4, "auto", {3}),  # one CPU: nothing to spread
    ],
)
def test_nothing_is_pinned_when_it_would_not_spread_the_workers(
    cpus: dict[str, object], slot: int | None, workers: int, setting: str, allowed: set[int]
) -> None:
    cpus["allowed"] = allowed
    assert pin_worker(slot, workers, setting) is None
    assert cpus["pinned"] is None
