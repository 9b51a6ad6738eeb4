"""Workers sharing a ledger audit one history, without re-reading it when nobody else
held the scope (gateway/pipeline/audit_policy.py ``_sync``, budget/locks.py turns).

Two ``Gateway`` objects on one SQLite file ledger stand for two workers. The pair's
halves are the Crohn pair of tests/test_audit_http.py (k = 40, ε = 1: a one-patient
difference passes only if two discrete Laplace noises of scale 1 differ by more than
39 + the margin, probability below 1e-7).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config_load import parse_config
from gateway.core.errors import AuditRefused
from gateway.core.plan import QueryRequest
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY, demo_config_dict

WHOLE = "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'"
HALF = "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND city <> 'Eger'"


@pytest.fixture
def workers(
    demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Gateway, Gateway]:
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    raw = demo_config_dict(
        demo_db, tmp_path / "ledger.db", audit={"mode": "refuse", "min_group_size": 40}
    )
    first = Gateway(parse_config(raw))
    first.ledger.create_analyst("alice", 100.0, 1e-6)
    return first, Gateway(parse_config(raw))


def ask(gateway: Gateway, sql: str) -> Any:
    return gateway.query("alice", QueryRequest(sql, 1.0, 0.0, "laplace"))


def count_reads(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the history reads of ``gateway``'s auditor (``Ledger.releases``)."""
    reads: list[int] = []
    real = gateway.ledger.releases

    def releases(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gateway.ledger, "releases", releases)
    return reads


def test_the_other_half_of_a_pair_sent_to_another_worker_is_refused(
    workers: tuple[Gateway, Gateway],
) -> None:
    first, second = workers
    ask(second, "SELECT COUNT(*) FROM patients")  # the second worker has synced once
    ask(first, WHOLE)
    with pytest.raises(AuditRefused):
        ask(second, HALF)  # it held the scope before: it must re-read, and see WHOLE


def test_the_history_is_read_only_after_another_worker_held_the_scope(
    workers: tuple[Gateway, Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = workers
    reads = count_reads(first, monkeypatch)
    ask(first, "SELECT COUNT(*) FROM patients WHERE age < 30")
    assert len(reads) == 1  # the first time: everything before it
    ask(first, "SELECT COUNT(*) FROM patients WHERE age < 50")
    ask(first, "SELECT COUNT(*) FROM patients WHERE age < 70")
    assert len(reads) == 1  # nobody else held alice's scope: nothing new to read
    ask(second, "SELECT COUNT(*) FROM patients WHERE sex = 'F'")
    ask(first, "SELECT COUNT(*) FROM patients WHERE smoker")
    assert len(reads) == 2  # the second worker took a turn in between
    known = first.auditor.knowledge("alice", "patients").query_ids
    assert len(known) == 5  # its own four answers and the other worker's one


def test_a_failed_read_is_read_again(
    workers: tuple[Gateway, Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = workers
    ask(first, "SELECT COUNT(*) FROM patients WHERE age < 30")
    ask(second, WHOLE)
    real: Callable[..., Any] = first.ledger.releases
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the ledger went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(first.ledger, "releases", failing)
    with pytest.raises(Exception):  # noqa: B017 - whatever the failure becomes
        ask(first, HALF)
    with pytest.raises(AuditRefused):  # the next turn reads what the failed one missed
        ask(first, HALF)


def test_a_refusal_recorded_by_another_worker_is_refused_again_free(
    workers: tuple[Gateway, Gateway],
) -> None:
    first, second = workers
    ask(first, "SELECT COUNT(*) FROM patients WHERE age < 30")  # it has read alice's refusals
    ask(second, WHOLE)
    with pytest.raises(AuditRefused):
        ask(second, HALF)  # recorded by the second worker
    with pytest.raises(AuditRefused) as again:
        ask(first, HALF)
    assert again.value.detail.get("refused_before") is True


def test_no_refusal_is_looked_up_for_a_request_never_refused(
    workers: tuple[Gateway, Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = workers
    lookups: list[int] = []
    real = first.ledger.find_refusal

    def find_refusal(*args: Any, **kwargs: Any) -> Any:
        lookups.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(first.ledger, "find_refusal", find_refusal)
    ask(first, WHOLE)
    ask(first, "SELECT COUNT(*) FROM patients WHERE age < 30")
    assert lookups == []
    with pytest.raises(AuditRefused):
        ask(first, HALF)
    with pytest.raises(AuditRefused) as again:
        ask(first, HALF)  # its own refusal, kept in memory: looked up for its reason
    assert again.value.detail.get("refused_before") is True
    assert lookups == [1]


def test_a_forgotten_scope_is_read_again_whole(workers: tuple[Gateway, Gateway]) -> None:
    first, _ = workers
    ask(first, WHOLE)
    first.audit.forget("alice")
    assert not first.auditor.knows("alice", "anything")
    with pytest.raises(AuditRefused):  # WHOLE was read again from the ledger
        ask(first, HALF)
