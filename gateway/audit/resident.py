"""Which scopes' knowledge stays in this process's memory: a byte budget, the rest on disk.

An auditor's knowledge of a scope grows with the scope's releases (answered regions,
their noisy counts, the span's blocks), and a worker serves many scopes. So the memory a
worker gives to audit knowledge is capped (``audit.memory_mb``): once the scopes held in
memory exceed it, the least recently used ones are written to a private directory of
this process and dropped; a scope asked for again is read back, byte for byte the same
objects, before anything is decided on it. Writing a scope out and reading it back
changes no decision: the auditor sees the very knowledge it had (the same rows in the
same order, the same blocks), not a re-derivation of it. The scope in use is never
written out while it is in use (its decision holds the auditor's lock), so the memory
held is at most the cap plus the scopes decided on at that moment.

The files are pickles written and read only by this process, in a directory only its
user can read (``tempfile.mkdtemp``), removed when the auditor goes away. What they hold
is what the auditor holds in memory: query texts' regions, the public schema and noisy
answers (invariant 8) — nothing read from the protected database.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

from gateway.audit.components import TableKnowledge

ROW_BYTES = 900
"""Python objects behind one answered row (its ``RowInfo``, noise terms, the region's
formula share), measured on the demo's mixed load (``bench/soak.py``): numpy arrays are
counted exactly, the rest by this estimate."""
PIECE_BYTES = 400
"""One piece of a dimension (its sample, bounds, the conditions that split it)."""


def footprint(tk: TableKnowledge) -> int:
    """An estimate of the bytes one table's knowledge holds (arrays exactly)."""
    total = 0
    for kn in tk.parts:
        total += kn.space.atom_of.nbytes + kn.block_of.nbytes
        total += PIECE_BYTES * sum(len(d.pieces) for d in kn.space.dims)
        total += ROW_BYTES * len(kn.info)
        for b in kn.blocks:
            total += b.basis.nbytes + b.origin.nbytes + b.asked.nbytes
            total += b.cols.nbytes + b.pivots.nbytes + 16 * (len(b.members) + len(b.asked_ids))
    return total + ROW_BYTES * len(tk.constant_rows) + 64 * len(tk.query_ids)


class ResidentScopes:
    """The scopes in memory, in order of use, and the files of the others."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self._order: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._sizes: dict[tuple[str, str], tuple[int, int]] = {}  # key → (id(tk), bytes)
        self._on_disk: set[str] = set()
        self._dir: Path | None = None
        self._pid = os.getpid()

    def used(self, scope: str) -> None:
        """Mark ``scope`` as the most recently used."""
        self._order[scope] = None
        self._order.move_to_end(scope)

    def on_disk(self, scope: str) -> bool:
        return scope in self._on_disk

    def held_bytes(self, state: dict[tuple[str, str], TableKnowledge]) -> int:
        """The estimated bytes of every scope held in memory."""
        return sum(self._size(key, tk) for key, tk in state.items())

    def to_write(self, state: dict[tuple[str, str], TableKnowledge], keep: str) -> list[str]:
        """The least recently used scopes (never ``keep``) to write out so that what
        stays fits ``max_bytes``."""
        if self.max_bytes is None:
            return []
        per_scope: dict[str, int] = {}
        for key, tk in state.items():
            per_scope[key[0]] = per_scope.get(key[0], 0) + self._size(key, tk)
        total = sum(per_scope.values())
        out: list[str] = []
        for scope in list(self._order):
            if total <= self.max_bytes:
                break
            if scope == keep or scope not in per_scope:
                continue
            out.append(scope)
            total -= per_scope[scope]
        return out

    def write(self, scope: str, payload: Any) -> None:
        """Keep ``payload`` (the scope's knowledge) on disk until it is read back."""
        path = self._path(scope)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        self._on_disk.add(scope)
        self._order.pop(scope, None)
        for key in [k for k in self._sizes if k[0] == scope]:
            del self._sizes[key]

    def read(self, scope: str) -> Any:
        """The payload written for ``scope`` (the file is removed)."""
        path = self._path(scope)
        with path.open("rb") as f:
            payload = pickle.load(f)  # written by this process, in its private directory
        path.unlink()
        self._on_disk.discard(scope)
        return payload

    def drop(self, scope: str | None = None) -> None:
        """Forget one scope's file (or every file)."""
        scopes = list(self._on_disk) if scope is None else [scope]
        for s in scopes:
            if s in self._on_disk:
                self._path(s).unlink(missing_ok=True)
                self._on_disk.discard(s)
            self._order.pop(s, None)
            for key in [k for k in self._sizes if k[0] == s]:
                del self._sizes[key]

    def _size(self, key: tuple[str, str], tk: TableKnowledge) -> int:
        known = self._sizes.get(key)
        if known is not None and known[0] == id(tk):
            return known[1]
        size = footprint(tk)
        self._sizes[key] = (id(tk), size)
        return size

    def _path(self, scope: str) -> Path:
        if self._dir is None or os.getpid() != self._pid:
            # one directory per process: a forked worker never reads its parent's files
            self._dir = Path(tempfile.mkdtemp(prefix="dpgate-audit-"))
            self._pid = os.getpid()
            weakref.finalize(self, shutil.rmtree, self._dir, True)
        name = hashlib.sha256(scope.encode()).hexdigest()[:32]
        return self._dir / f"{name}.pickle"
