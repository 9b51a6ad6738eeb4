"""The audit log's hash chain: every row carries the SHA-256 of its own content and of the
row before it, so that a row altered, removed, inserted or moved is found by ``verify``.

A row's hash is ``SHA-256(canonical(row))`` where ``canonical`` is the UTF-8 JSON array
``["dpgate-audit-1", prev_hash, seq, request_id, actor, analyst, endpoint, action,
params, sql, outcome, error_code, status, created_at]`` (no spaces, non-ASCII kept,
``created_at`` as ``YYYY-MM-DDTHH:MM:SS.ffffff``, naive UTC; ``params`` the stored JSON
text itself). ``seq`` numbers the chain 1, 2, 3, … with no gap (a unique column), and
``prev_hash`` is the previous row's hash (``GENESIS`` before the first row).

Appending reads the head and inserts after it inside the caller's write transaction,
which must be the only one appending: SQLite's write lock gives that (every write
transaction is ``BEGIN IMMEDIATE``); on PostgreSQL ``append`` first takes a
transaction-level advisory lock (``CHAIN_LOCK``), held to commit. Lock order: that lock
is always the last a transaction takes (after an analyst's row and the global row), and
the request-log rows are appended in transactions of their own that take no other lock,
so an admin change that writes its audit row cannot deadlock with them. The unique
``seq`` makes a fork impossible even for a writer that skipped the lock: its insert fails.

What the chain cannot show alone: rows removed from the end, or the whole log rewritten
with new hashes by someone who can write the database. Against both, keep the chain's
head (``verify`` prints it) or an export (``dpgate audit-log export``) outside: ``verify``
checks the ledger against a kept head or export.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from budget import schema

GENESIS = "0" * 64
FORMAT = "dpgate-audit-1"
CHAIN_LOCK = 0x64706163  # "dpac": serializes audit-log appends on PostgreSQL
# The fields of a row that its hash covers, in the canonical order (after prev_hash).
FIELDS = (
    "seq",
    "request_id",
    "actor",
    "analyst",
    "endpoint",
    "action",
    "params",
    "sql",
    "outcome",
    "error_code",
    "status",
    "created_at",
)
_t = schema.audit_log


def _timestamp(value: datetime) -> str:
    return schema.as_utc(value).replace(tzinfo=None).isoformat(timespec="microseconds")


def canonical(row: Mapping[str, Any], prev_hash: str) -> bytes:
    """The bytes a row's hash is taken over (see the module docstring)."""
    values: list[Any] = [FORMAT, prev_hash]
    for name in FIELDS:
        value = row[name]
        if name == "created_at" and not isinstance(value, str):
            value = _timestamp(value)
        elif name in ("seq", "status"):
            value = int(value)
        values.append(value)
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def row_hash(row: Mapping[str, Any], prev_hash: str) -> str:
    """The hex SHA-256 of a row chained after ``prev_hash``."""
    return hashlib.sha256(canonical(row, prev_hash)).hexdigest()


def params_text(params: Mapping[str, Any] | None) -> str | None:
    """An admin action's parameters as the stored JSON text (keys sorted)."""
    if params is None:
        return None
    return json.dumps(dict(params), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def lock(conn: Connection) -> None:
    """Become the only appender until this transaction ends (PostgreSQL; SQLite's write
    transaction already is)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(CHAIN_LOCK)))


def head(conn: Connection) -> tuple[int, str]:
    """The chain's last (seq, hash); (0, GENESIS) when it is empty."""
    row = conn.execute(
        sa.select(_t.c.seq, _t.c.hash)
        .where(_t.c.seq.is_not(None))
        .order_by(_t.c.seq.desc())
        .limit(1)
    ).first()
    return (0, GENESIS) if row is None else (int(row.seq), str(row.hash))


def append(conn: Connection, row: Mapping[str, Any], insert: Any = None) -> dict[str, Any]:
    """Append ``row`` (every field of ``FIELDS`` but ``seq``) to the chain in the caller's
    write transaction; returns the row as stored. ``insert(conn, values)`` writes it
    (default: SQLAlchemy's insert)."""
    lock(conn)
    seq, prev = head(conn)
    full = dict(row)
    full["seq"] = seq + 1
    full["prev_hash"] = prev
    full["hash"] = row_hash(full, prev)
    if insert is None:
        conn.execute(sa.insert(_t).values(full))
    else:
        insert(conn, full)
    return full


def chain_existing(conn: Connection, batch: int = 1000) -> int:
    """Chain the rows written before the chain existed (schema v8), in id order; returns
    how many. Runs inside the migration's transaction, which holds the write lock."""
    lock(conn)
    seq, prev = head(conn)
    done = 0
    while True:
        rows = (
            conn.execute(sa.select(_t).where(_t.c.seq.is_(None)).order_by(_t.c.id).limit(batch))
            .mappings()
            .all()
        )
        if not rows:
            return done
        updates = []
        for r in rows:
            seq += 1
            full = dict(r)
            full["seq"] = seq
            full["actor"] = full.get("actor") or full.get("analyst")
            digest = row_hash(full, prev)
            updates.append(
                {
                    "rid": r["id"],
                    "b_seq": seq,
                    "b_prev": prev,
                    "b_hash": digest,
                    "b_actor": full["actor"],
                }
            )
            prev = digest
        conn.execute(
            sa.update(_t)
            .where(_t.c.id == sa.bindparam("rid"))
            .values(
                seq=sa.bindparam("b_seq"),
                prev_hash=sa.bindparam("b_prev"),
                hash=sa.bindparam("b_hash"),
                actor=sa.bindparam("b_actor"),
            ),
            updates,
        )
        done += len(rows)


@dataclass(frozen=True)
class Break:
    """Where the chain stops being what was written: the first row found altered, the
    first position a row is missing from, or a row of a kept export no longer there."""

    seq: int
    row_id: int | None
    kind: str  # altered, removed, unchained, mismatch
    detail: str


@dataclass(frozen=True)
class Verdict:
    """What ``verify`` found: the rows checked, the head (seq, hash) and the first break."""

    rows: int
    head_seq: int
    head_hash: str
    first_break: Break | None

    @property
    def ok(self) -> bool:
        return self.first_break is None


def _rows(conn: Connection, after: int = 0, batch: int = 5000) -> Iterator[Mapping[str, Any]]:
    while True:
        query = (
            sa.select(_t)
            .where(_t.c.seq.is_not(None), _t.c.seq > after)
            .order_by(_t.c.seq)
            .limit(batch)
        )
        rows = conn.execute(query).mappings().all()
        if not rows:
            return
        for r in rows:
            yield dict(r)
        after = rows[-1]["seq"]


def verify(
    conn: Connection,
    *,
    anchor: tuple[int, str] | None = None,
    kept: Sequence[Mapping[str, Any]] = (),
) -> Verdict:
    """Walk the chain from its first row; the first row altered or removed.

    A row is *altered* when its stored hash is not the hash of its content after the
    previous row's; a row is *removed* when ``seq`` skips (or the next row's
    ``prev_hash`` is not the hash of the row before it: a row taken out and the rest
    renumbered, or a row rehashed after an edit). ``anchor`` (seq, hash), a head kept
    outside, must still be in the chain; so must every row of ``kept`` (an export read
    back), field for field.
    """
    unchained = conn.execute(sa.select(sa.func.min(_t.c.id)).where(_t.c.seq.is_(None))).scalar()
    expected_seq, prev = 1, GENESIS
    count = 0
    first: Break | None = None
    by_seq: dict[int, str] = {}
    wanted = {int(r["seq"]) for r in kept}
    if anchor is not None:
        wanted.add(anchor[0])
    for r in _rows(conn):
        seq = int(r["seq"])
        if first is None:
            if seq != expected_seq:
                first = Break(
                    expected_seq,
                    None,
                    "removed",
                    f"row {expected_seq} is missing (the next row is {seq})",
                )
            elif r["prev_hash"] != prev:
                first = Break(
                    seq,
                    r["id"],
                    "removed",
                    f"row {seq} does not follow row {seq - 1}: a row before it was "
                    "removed, or rewritten with a new hash",
                )
            elif row_hash(r, prev) != r["hash"]:
                first = Break(seq, r["id"], "altered", f"row {seq} was altered")
        if seq in wanted:
            by_seq[seq] = row_hash(r, r["prev_hash"]) if first is not None else r["hash"]
        prev = r["hash"]
        expected_seq = seq + 1
        count += 1
    head_seq, head_hash = expected_seq - 1, prev
    if first is None and unchained is not None:
        first = Break(0, int(unchained), "unchained", f"row id {unchained} is not in the chain")
    if first is None and anchor is not None and by_seq.get(anchor[0]) != anchor[1]:
        first = Break(
            anchor[0],
            None,
            "mismatch",
            f"the kept head, row {anchor[0]}, is not in the chain as kept",
        )
    if first is None:
        for kept_row in kept:
            seq = int(kept_row["seq"])
            if (
                by_seq.get(seq) != kept_row["hash"]
                or row_hash(kept_row, kept_row["prev_hash"]) != kept_row["hash"]
            ):
                first = Break(
                    seq,
                    None,
                    "mismatch",
                    f"row {seq} of the export is not in the chain as exported",
                )
                break
    return Verdict(count, head_seq, head_hash, first)


def export_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """One row as a JSON-ready dict (``created_at`` as hashed): a line of an export,
    which ``canonical`` accepts back."""
    out = {name: r[name] for name in FIELDS}
    out["created_at"] = _timestamp(r["created_at"])
    out["prev_hash"] = r["prev_hash"]
    out["hash"] = r["hash"]
    return out


def export(conn: Connection, after: int = 0) -> Iterator[dict[str, Any]]:
    """The chain's rows after ``seq`` = ``after``, in order, as ``export_row``."""
    for r in _rows(conn, after):
        yield export_row(r)
