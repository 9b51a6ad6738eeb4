"""What one scope has learnt about one table: answered regions and their span.

``Knowledge`` is persistent in the functional sense: ``with_rows`` returns a new value
and leaves the old one intact, so an audit can try a query and throw the result away
(or keep it for ``remember`` when nothing changed in between).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from gateway.audit.confidence import CountNoise
from gateway.audit.predicates import Formula
from gateway.audit.space import CellSpace
from gateway.audit.span import Block, merge

NoiseTerms = tuple[tuple[tuple[str, int], float, CountNoise], ...]
"""A count's noise as a combination of released noises: ((query id, cell), coefficient,
distribution) per source; the same source in two rows is the same random variable."""


@dataclass(frozen=True)
class RowInfo:
    """One answered region (a query's cell): who asked it and its noisy count."""

    query_id: str
    cell: int
    count: float | None
    pending: bool = False  # in a pre-audit: part of the query being audited, unanswered
    formula: Formula | None = None  # the region, kept to rebuild merged components
    noise: NoiseTerms | None = None  # None: the noise of this count is not known
    # what the row releases about its region: "count", "sum:<expr>", … (None: anything)
    stats: frozenset[str] | None = None

    def with_formula(self, formula: Formula) -> RowInfo:
        """The same row carrying its region (``dataclasses.replace``, without its cost:
        this runs for every released cell)."""
        return RowInfo(
            self.query_id, self.cell, self.count, self.pending, formula, self.noise, self.stats
        )


@dataclass(frozen=True)
class Knowledge:
    """Answered rows (``info``), the cell space, and the span's blocks (``block_of``:
    atom → block index, −1 for atoms no answered region touches)."""

    space: CellSpace
    info: tuple[RowInfo, ...] = ()
    blocks: tuple[Block, ...] = ()
    block_of: np.ndarray = field(default_factory=lambda: np.full(1, -1, dtype=np.intp))
    query_ids: frozenset[str] = frozenset()

    def refined(self, formulas: list[Formula]) -> Knowledge:
        """The same knowledge over a space refined for ``formulas`` (atoms not split)."""
        space = self.space.copy()
        space.ensure(formulas)
        return replace(self, space=space)

    def split(self, label: np.ndarray, n_labels: int) -> Knowledge:
        """Atoms split by a labelling of cells (0..n_labels); blocks re-expressed."""
        space = self.space.copy()
        parents = space.split(label, n_labels)
        block_of_new = self.block_of[parents]
        order = np.argsort(block_of_new, kind="stable")
        bounds = np.searchsorted(block_of_new[order], np.arange(len(self.blocks) + 1))
        blocks: list[Block] = []
        for b_index, b in enumerate(self.blocks):
            cols = order[bounds[b_index] : bounds[b_index + 1]]
            pos = np.zeros(self.space.n_atoms, dtype=np.intp)
            pos[b.cols] = np.arange(len(b.cols))
            blocks.append(b.reordered(cols, pos[parents[cols]]))
        return replace(self, space=space, blocks=tuple(blocks), block_of=block_of_new)

    def with_rows(self, rows: list[tuple[RowInfo, np.ndarray]]) -> tuple[Knowledge, set[int]]:
        """Add answered rows (info, atom mask) to the span; returns the touched blocks."""
        info = list(self.info)
        blocks: list[Block | None] = list(self.blocks)
        cleaned: set[int] = set()  # blocks whose change flags were reset in this batch
        block_of = self.block_of.copy()
        touched: set[int] = set()
        for r, mask in rows:
            row_id = len(info)
            info.append(r)
            atoms = np.nonzero(mask)[0]
            if len(atoms) == 0:
                continue
            ids = sorted(b for b in set(block_of[atoms].tolist()) if b >= 0)
            for i in ids:
                if i not in cleaned:
                    old_block = blocks[i]
                    assert old_block is not None
                    blocks[i] = old_block.clean()
                    cleaned.add(i)
            free = atoms[block_of[atoms] < 0]
            if len(ids) == 1 and len(free) == 0:
                block = blocks[ids[0]]
                assert block is not None
                new_index = ids[0]
            else:
                parts = [blocks[i] for i in ids]
                block = merge([p for p in parts if p is not None], free)
                for i in ids:
                    blocks[i] = None
                new_index = len(blocks)
                cleaned.add(new_index)
                blocks.append(block)
                block_of[block.cols] = new_index
                touched -= set(ids)
            block, _ = block.insert(mask[block.cols].astype(float), row_id)
            blocks[new_index] = block
            touched.add(new_index)
        keep = [i for i, b in enumerate(blocks) if b is not None]
        renum = np.full(len(blocks) + 1, -1, dtype=np.intp)
        renum[keep] = np.arange(len(keep))
        new_block_of = np.where(block_of >= 0, renum[block_of], -1)
        return (
            replace(
                self,
                info=tuple(info),
                blocks=tuple(b for b in blocks if b is not None),
                block_of=new_block_of,
                query_ids=self.query_ids | {r.query_id for r, _ in rows},
            ),
            {int(renum[t]) for t in touched},
        )
