"""Reading the ledger: an analyst's history, released answers (cache, auditor), the audit log.

Functions of an open connection; ``Ledger`` wraps each in a read transaction.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from budget import schema
from budget.prepared import Prepared
from budget.records import AuditEntry, HistoryEntry, Refusal, ReleaseEntry
from mechanisms.types import PrivacyCost

t_analysts = schema.analysts
t_ledger = schema.ledger
t_audit = schema.audit_log
_c = t_ledger.c

_charge = t_ledger.alias("charge")
_outcome = t_ledger.alias("outcome")

_HISTORY = (
    sa.select(
        _charge.c.reservation_id,
        _charge.c.sql,
        _charge.c.mechanism,
        _charge.c.epsilon,
        _charge.c.delta,
        _charge.c.rho,
        _charge.c.selection_delta,
        _charge.c.created_at,
        _outcome.c.kind.label("outcome"),
        _outcome.c.release,
        _outcome.c.reason,
        _outcome.c.created_at.label("settled_at"),
    )
    .select_from(_charge.outerjoin(_outcome, _outcome.c.settles == _charge.c.reservation_id))
    .where(_charge.c.kind == "charge", _charge.c.analyst_id == sa.bindparam("analyst_id"))
    .order_by(_charge.c.id.desc())
)

# The cache lookup runs on every query: built once, bound parameters only.
_FIND = (
    sa.select(_c.release)
    .where(
        _c.kind == "answered",
        _c.query_key == sa.bindparam("query_key"),
        _c.data_version == sa.bindparam("data_version"),
    )
    .order_by(_c.id)
    .limit(1)
)
_FIND_RELEASE = Prepared(_FIND)
_FIND_RELEASE_OF = Prepared(
    _FIND.where(
        _c.analyst_id
        == sa.select(t_analysts.c.id)
        .where(t_analysts.c.name == sa.bindparam("analyst"))
        .scalar_subquery()
    )
)

_RELEASES = (
    sa.select(
        _outcome.c.settles,
        t_analysts.c.name,
        _outcome.c.query_key,
        _outcome.c.sql,
        _outcome.c.data_version,
        _outcome.c.kind,
        _outcome.c.release,
        _charge.c.epsilon,
        _charge.c.delta,
        _charge.c.rho,
        _charge.c.selection_delta,
        _outcome.c.created_at,
        _outcome.c.id,
    )
    .select_from(
        _outcome.join(t_analysts, t_analysts.c.id == _outcome.c.analyst_id).join(
            _charge,
            sa.and_(_charge.c.reservation_id == _outcome.c.settles, _charge.c.kind == "charge"),
        )
    )
    .where(
        _outcome.c.kind.in_(("answered", "withheld")),
        _outcome.c.data_version == sa.bindparam("data_version"),
    )
    .order_by(_outcome.c.id)
)


t_refusals = schema.refusals
_r = t_refusals.c
# Refusals before spending: post-audit ones are already in the history as withheld charges
_REFUSED = (
    sa.select(_r.query_key, _r.sql, _r.reason, _r.combined_with, _r.created_at, _r.id)
    .where(_r.analyst_id == sa.bindparam("analyst_id"), _r.reservation_id.is_(None))
    .order_by(_r.id.desc())
)
_FIND_REFUSAL = (
    sa.select(_r.query_key, _r.sql, _r.reason, _r.combined_with, _r.reservation_id, _r.created_at)
    .where(
        _r.analyst_id == sa.bindparam("analyst_id"),
        _r.query_key == sa.bindparam("query_key"),
        _r.data_version == sa.bindparam("data_version"),
    )
    .order_by(_r.reservation_id.is_(None), _r.id)  # a withheld answer's refusal first
    .limit(1)
)


def find_refusal(
    conn: Connection, analyst_id: int, query_key: str, data_version: str
) -> Refusal | None:
    """The first refusal of this request (key and data version) for the analyst: the
    first after execution (an answer withheld) if there is one, else the first before."""
    params = {"analyst_id": analyst_id, "query_key": query_key, "data_version": data_version}
    r = conn.execute(_FIND_REFUSAL, params).first()
    if r is None:
        return None
    return Refusal(
        query_key=r.query_key,
        sql=r.sql,
        reason=r.reason,
        combined_with=tuple(json.loads(r.combined_with)),
        reservation_id=r.reservation_id,
        created_at=schema.as_utc(r.created_at),
    )


_REFUSED_KEYS = (
    sa.select(_r.id, t_analysts.c.name, _r.query_key)
    .join(t_analysts, t_analysts.c.id == _r.analyst_id)
    .where(_r.data_version == sa.bindparam("data_version"))
    .order_by(_r.id)
)


def refused_keys(
    conn: Connection, analyst: str | None, data_version: str, after: int | None
) -> list[tuple[int, str, str]]:
    """(id, analyst, query key) of every refusal for ``data_version`` (of one analyst, or
    all), in ledger order, after ``id``."""
    query = _REFUSED_KEYS
    if analyst is not None:
        query = query.where(t_analysts.c.name == analyst)
    if after is not None:
        query = query.where(_r.id > after)
    rows = conn.execute(query, {"data_version": data_version}).all()
    return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


def history(conn: Connection, analyst_id: int, limit: int | None) -> list[HistoryEntry]:
    """The analyst's charges with their outcomes, and the queries refused before
    spending, oldest first (the last ``limit``)."""
    entries = _charges(conn, analyst_id, limit) + _refused(conn, analyst_id, limit)
    entries.sort(key=lambda e: e.created_at)
    return entries if limit is None else entries[len(entries) - min(limit, len(entries)) :]


def _refused(conn: Connection, analyst_id: int, limit: int | None) -> list[HistoryEntry]:
    query = _REFUSED if limit is None else _REFUSED.limit(limit)
    return [
        HistoryEntry(
            reservation_id=f"refused-{r.id}",
            sql=r.sql,
            mechanism="none",
            cost=PrivacyCost(0.0, 0.0, 0.0, 0.0),
            outcome="refused",
            release=None,
            reason=r.reason,
            created_at=schema.as_utc(r.created_at),
            settled_at=schema.as_utc(r.created_at),
        )
        for r in conn.execute(query, {"analyst_id": analyst_id}).all()
    ]


def _charges(conn: Connection, analyst_id: int, limit: int | None) -> list[HistoryEntry]:
    query = _HISTORY if limit is None else _HISTORY.limit(limit)
    rows = conn.execute(query, {"analyst_id": analyst_id}).all()
    return [
        HistoryEntry(
            reservation_id=r.reservation_id,
            sql=r.sql,
            mechanism=r.mechanism,
            cost=PrivacyCost(r.epsilon, r.delta, r.rho, r.selection_delta),
            outcome="pending"
            if r.outcome is None
            else "refunded"
            if r.outcome == "refund"
            else r.outcome,
            release=None if r.release is None else json.loads(r.release),
            reason=r.reason,
            created_at=schema.as_utc(r.created_at),
            settled_at=None if r.settled_at is None else schema.as_utc(r.settled_at),
        )
        for r in reversed(rows)
    ]


def find_release(
    conn: Connection, query_key: str, analyst: str | None, data_version: str
) -> dict[str, Any] | None:
    """The first answered release with this key and data version (of ``analyst`` or any)."""
    params = {"query_key": query_key, "data_version": data_version}
    if analyst is None:
        release = _FIND_RELEASE.scalar(conn, params)
    else:
        release = _FIND_RELEASE_OF.scalar(conn, {**params, "analyst": analyst})
    return None if release is None else dict(json.loads(release))


def releases(
    conn: Connection, analyst: str | None, data_version: str, after: int | None
) -> list[ReleaseEntry]:
    """Answered and withheld entries in ledger order (of one analyst or all; after ``seq``)."""
    query = _RELEASES
    if analyst is not None:
        query = query.where(t_analysts.c.name == analyst)
    if after is not None:
        query = query.where(_outcome.c.id > after)
    rows = conn.execute(query, {"data_version": data_version}).all()
    return [
        ReleaseEntry(
            reservation_id=r[0],
            analyst=r[1],
            query_key=r[2],
            sql=r[3],
            data_version=r[4],
            outcome=r[5],
            release=None if r[6] is None else json.loads(r[6]),
            cost=PrivacyCost(r[7], r[8], r[9], r[10]),
            created_at=schema.as_utc(r[11]),
            seq=int(r[12]),
        )
        for r in rows
    ]


def audit_log(
    conn: Connection,
    analyst: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    actor: str | None = None,
) -> list[AuditEntry]:
    """Logged requests, newest first, optionally of one analyst or actor, in [since, until)."""
    c = t_audit.c
    query = sa.select(t_audit).order_by(c.id.desc()).limit(max(0, int(limit)))
    if analyst is not None:
        query = query.where(c.analyst == analyst)
    if actor is not None:
        query = query.where(c.actor == actor)
    if since is not None:
        query = query.where(c.created_at >= _naive_utc(since))
    if until is not None:
        query = query.where(c.created_at < _naive_utc(until))
    return [
        AuditEntry(
            id=r.id,
            request_id=r.request_id,
            analyst=r.analyst,
            endpoint=r.endpoint,
            sql=r.sql,
            outcome=r.outcome,
            error_code=r.error_code,
            status=r.status,
            created_at=schema.as_utc(r.created_at),
            actor=r.actor,
            action=r.action,
            params=None if r.params is None else json.loads(r.params),
            seq=r.seq,
            hash=r.hash,
        )
        for r in conn.execute(query).all()
    ]


def _naive_utc(value: datetime) -> datetime:
    return schema.as_utc(value).replace(tzinfo=None)
