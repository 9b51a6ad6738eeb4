"""What one scope has learnt about one table: answered regions and their span.

``Knowledge`` is persistent in the functional sense: ``with_rows`` returns a new value
and leaves the old one intact, so an audit can try a query and throw the result away
(or keep it for ``remember`` when nothing changed in between).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from gateway.audit.predicates import Formula
from gateway.audit.space import CellSpace
from gateway.audit.span import Block, Doubt, exact_block, merge


@dataclass(frozen=True)
class RowInfo:
    """One answered region (a query's cell): who asked it and its noisy count."""

    query_id: str
    cell: int
    count: float | None
    pending: bool = False  # in a pre-audit: part of the query being audited, unanswered


@dataclass(frozen=True)
class Knowledge:
    """Answered rows (``info`` + ``members``: a row × atom Boolean matrix), the cell
    space, and the span's blocks (``block_of``: atom → block index, −1 untouched)."""

    space: CellSpace
    info: tuple[RowInfo, ...] = ()
    members: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), dtype=bool))
    blocks: tuple[Block, ...] = ()
    block_of: np.ndarray = field(default_factory=lambda: np.full(1, -1, dtype=np.intp))
    query_ids: frozenset[str] = frozenset()

    def refined(self, formulas: list[Formula]) -> Knowledge:
        """The same knowledge over a space refined for ``formulas`` (atoms not split)."""
        space = self.space.copy()
        space.ensure(formulas)
        return replace(self, space=space)

    def split(self, masks: list[np.ndarray]) -> Knowledge:
        """Atoms split by disjoint region masks; rows and blocks re-expressed."""
        space = self.space.copy()
        parents = space.split(masks)
        members = self.members[:, parents]
        block_of_new = self.block_of[parents]
        blocks: list[Block] = []
        for b_index, b in enumerate(self.blocks):
            cols = np.nonzero(block_of_new == b_index)[0]
            pos = {int(a): j for j, a in enumerate(b.cols.tolist())}
            take = np.array([pos[int(parents[c])] for c in cols], dtype=np.intp)
            blocks.append(b.reordered(cols, take))
        return replace(
            self, space=space, members=members, blocks=tuple(blocks), block_of=block_of_new
        )

    def with_rows(self, rows: list[tuple[RowInfo, np.ndarray]]) -> tuple[Knowledge, set[int]]:
        """Add answered rows (info, atom mask) to the span; returns the touched blocks."""
        info = list(self.info)
        members = self.members
        if rows:
            members = np.vstack([members, np.stack([m for _, m in rows])])
        blocks: list[Block | None] = list(self.blocks)
        block_of = self.block_of.copy()
        touched: set[int] = set()
        for r, mask in rows:
            row_id = len(info)
            info.append(r)
            atoms = np.nonzero(mask)[0]
            if len(atoms) == 0:
                continue
            ids = sorted({int(b) for b in block_of[atoms] if b >= 0})
            free = atoms[block_of[atoms] < 0]
            parts = [blocks[i] for i in ids]
            if len(ids) == 1 and len(free) == 0:
                block = parts[0]
                assert block is not None
                new_index = ids[0]
            else:
                block = merge([p for p in parts if p is not None], free)
                for i in ids:
                    blocks[i] = None
                new_index = len(blocks)
                blocks.append(block)
                block_of[block.cols] = new_index
                touched = {t for t in touched if t not in ids}
            x = mask[block.cols].astype(float)
            try:
                block, _ = block.insert(x, row_id)
            except Doubt:
                block = self._exact(block, members, row_id)
            blocks[new_index] = block
            touched.add(new_index)
        # compact: drop merged-away blocks
        keep = [i for i, b in enumerate(blocks) if b is not None]
        renum = np.full(len(blocks) + 1, -1, dtype=np.intp)
        renum[keep] = np.arange(len(keep))
        new_block_of = np.where(block_of >= 0, renum[block_of], -1)
        new_blocks = tuple(b for b in blocks if b is not None)
        return (
            replace(
                self,
                info=tuple(info),
                members=members,
                blocks=new_blocks,
                block_of=new_block_of,
                query_ids=self.query_ids | {r.query_id for r, _ in rows},
            ),
            {int(renum[t]) for t in touched},
        )

    @staticmethod
    def _exact(block: Block, members: np.ndarray, last: int) -> Block:
        sub = members[: last + 1, :][:, block.cols]
        rows = [(i, sub[i]) for i in range(last + 1) if sub[i].any()]
        if len(rows) > 400:
            raise Doubt
        return exact_block(block.cols, rows)

    def asked_keys(self, upto: int | None = None) -> set[bytes]:
        """Packed atom sets of answered regions (the regions directly released)."""
        m = self.members if upto is None else self.members[:upto]
        return {np.packbits(row).tobytes() for row in m}


def empty_knowledge(space: CellSpace) -> Knowledge:
    return Knowledge(space=space)
