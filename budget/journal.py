"""The ledger's journal: audit refusals, history and releases (the answer cache's
store), and the hash-chained request audit log (``Ledger``'s methods).

A mixin of ``budget.ledger.Ledger``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from budget import audit_chain, reads, schema
from budget import statements as st
from budget.records import (
    AuditEntry,
    HistoryEntry,
    Refusal,
    ReleaseEntry,
)
from budget.writer import flush_all

if TYPE_CHECKING:  # the base the methods run on (budget/ledger.py)
    from budget.ledger import LedgerCore

    _Base = LedgerCore
else:
    _Base = object


def _audit_row(
    *,
    request_id: str,
    actor: str | None,
    analyst: str | None,
    endpoint: str,
    action: str | None,
    params: dict[str, Any] | None,
    sql: str | None,
    outcome: str,
    error_code: str | None,
    status: int,
    created_at: datetime,
) -> dict[str, Any]:
    """An audit-log row's fields, cut to their columns' sizes (what is hashed is what is
    stored)."""
    return {
        "request_id": request_id[:64],
        "actor": None if actor is None else actor[:64],
        "analyst": None if analyst is None else analyst[:64],
        "endpoint": endpoint[:200],
        "action": None if action is None else action[:64],
        "params": audit_chain.params_text(params),
        "sql": sql,
        "outcome": outcome[:32],
        "error_code": None if error_code is None else error_code[:64],
        "status": int(status),
        "created_at": created_at.replace(tzinfo=None),
    }


class Journal(_Base):
    """Refusals, history, releases and the request audit log."""

    def record_refusal(
        self,
        analyst: str,
        *,
        query_key: str,
        sql: str,
        data_version: str,
        reason: str,
        combined_with: tuple[str, ...] = (),
        reservation_id: str | None = None,
    ) -> None:
        """Append an audit refusal of this request (its cost, if any, is the charge of
        ``reservation_id``, recorded apart)."""

        def refuse(conn: Connection) -> None:
            row = self._analyst_row(conn, analyst)
            conn.execute(
                sa.insert(schema.refusals).values(
                    analyst_id=row.id,
                    query_key=query_key,
                    sql=sql,
                    data_version=data_version,
                    reservation_id=reservation_id,
                    reason=reason,
                    combined_with=json.dumps(list(combined_with)),
                    created_at=now,
                )
            )

        now = self._now()
        self.write(refuse, durable=False)

    def find_refusal(self, query_key: str, analyst: str, data_version: str) -> Refusal | None:
        """The auditor's refusal of this request for this analyst, if it was refused."""
        with self._transaction(write=False) as conn:
            row = self._analyst_row(conn, analyst)
            return reads.find_refusal(conn, row.id, query_key, data_version)

    def refused_keys(
        self, analyst: str | None, data_version: str, *, after: int | None = None
    ) -> list[tuple[int, str, str]]:
        """(id, analyst, query key) of the auditor's refusals for ``data_version`` (of one
        analyst, or all), in ledger order; ``after``: only ids past it (incremental)."""
        with self._transaction(write=False) as conn:
            return reads.refused_keys(conn, analyst, data_version, after)

    @contextmanager
    def scope_lock(self, scope: str) -> Iterator[int | None]:
        """Hold the audit lock of ``scope`` (``locks``): across processes and hosts
        sharing this ledger, one query of a scope is audited and answered at a time.
        Yields the holder's turn (``locks``: turn = previous turn + 1 means nobody else
        held it in between; None: not known)."""
        with self._locks.hold(scope) as turn:
            yield turn

    def history(self, analyst: str, *, limit: int | None = None) -> list[HistoryEntry]:
        """The analyst's charged queries with their outcomes, oldest first (last ``limit``)."""
        self._await_outcome()
        with self._transaction(write=False) as conn:
            row = self._analyst_row(conn, analyst)
            return reads.history(conn, row.id, limit)

    def find_release(
        self, query_key: str, analyst: str | None, data_version: str
    ) -> dict[str, Any] | None:
        """The first released answer of an answered query with this key and data version,
        for that analyst (or any analyst when ``None``); ``None`` if there is none."""
        self._await_outcome(query_key)
        with self._transaction(write=False) as conn:
            return reads.find_release(conn, query_key, analyst, data_version)

    def releases(
        self, analyst: str | None, data_version: str, *, after: int | None = None
    ) -> list[ReleaseEntry]:
        """Answered and withheld queries (of one analyst, or all), in ledger order.

        ``after``: only entries whose ``seq`` is greater (incremental replay).
        """
        self._await_outcome()
        with self._transaction(write=False) as conn:
            return reads.releases(conn, analyst, data_version, after)

    def log_request(
        self,
        *,
        request_id: str,
        analyst: str | None,
        endpoint: str,
        sql: str | None,
        outcome: str,
        error_code: str | None,
        status: int,
        actor: str | None = None,
        action: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        """Append one request, answered or not, to the audit log's hash chain (written
        after this returns: on a SQLite ledger in the writer's next batch, on a server in
        a transaction of request-log rows only). ``actor``: who called (default: the
        analyst); ``action``/``params``: an admin request's (never a key)."""
        row = _audit_row(
            request_id=request_id,
            actor=actor if actor is not None else analyst,
            analyst=analyst,
            endpoint=endpoint,
            action=action,
            params=params,
            sql=sql,
            outcome=outcome,
            error_code=error_code,
            status=status,
            created_at=self._now(),
        )

        def append(conn: Connection) -> None:
            audit_chain.append(conn, row, st.INSERT_REQUEST.run)

        if self._audit_rows is not None:
            self._audit_rows.submit(append, durable=False, savepoint=True)
            return
        self.write(append, durable=False, wait=False, savepoint=False)

    def audit_log(
        self,
        analyst: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 1000,
        actor: str | None = None,
    ) -> list[AuditEntry]:
        """Logged requests, newest first, optionally of one analyst or one actor, in
        [since, until).

        Rows another process queued in its last ``budget.writer.LINGER_S`` may not be
        written yet; this process's are (``flush_all``)."""
        flush_all()
        with self._transaction(write=False) as conn:
            return reads.audit_log(conn, analyst, since, until, limit, actor)

    def verify_audit_log(
        self,
        *,
        anchor: tuple[int, str] | None = None,
        kept: Sequence[Mapping[str, Any]] = (),
    ) -> audit_chain.Verdict:
        """Check the audit log's hash chain (``budget.audit_chain.verify``): the first
        row altered or removed; with ``anchor`` or ``kept``, also against a head or an
        export kept outside."""
        flush_all()
        with self._transaction(write=False) as conn:
            return audit_chain.verify(conn, anchor=anchor, kept=kept)

    def export_audit_log(self, after: int = 0) -> Iterator[dict[str, Any]]:
        """The audit log's rows after chain position ``after``, in chain order, each with
        its hashes (``budget.audit_chain.export_row``): JSON lines for an outside copy."""
        flush_all()
        with self._transaction(write=False) as conn:
            yield from audit_chain.export(conn, after)
