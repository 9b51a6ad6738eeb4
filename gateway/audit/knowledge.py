"""What one scope has learnt about one table: answered regions and their span.

``Knowledge`` is persistent in the functional sense: ``with_rows`` returns a new value
and leaves the old one intact, so an audit can try a query and throw the result away
(or keep it for ``remember`` when nothing changed in between).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from gateway.audit.confidence import CountNoise
from gateway.audit.predicates import Formula
from gateway.audit.space import CellSpace
from gateway.audit.span import Block, merge

_T = TypeVar("_T")

NoiseTerms = tuple[tuple[tuple[str, int], float, CountNoise], ...]
"""A count's noise as a combination of released noises: ((query id, cell), coefficient,
distribution) per source; the same source in two rows is the same random variable."""


class RowInfo:
    """One answered region (a query's cell): who asked it and its noisy count.

    A scope keeps one per released cell for as long as it audits (issue 36: the
    auditor's memory per release), so it is kept compact: slots instead of an instance
    dictionary, and a count whose noise is its own release's (``noise`` is
    ``(((query_id, cell), 1.0, distribution),)``, every answered cell's) keeps only the
    distribution — ``noise`` hands back the same terms, equal value for value. Immutable
    like the frozen dataclass it replaces (``with_formula`` makes a new one)."""

    __slots__ = ("_noise", "cell", "count", "formula", "pending", "query_id", "stats")
    query_id: str
    cell: int
    count: float | None
    pending: bool  # in a pre-audit: part of the query being audited, unanswered
    formula: Formula | None  # the region, kept to rebuild merged components
    _noise: NoiseTerms | CountNoise | None  # a CountNoise: the row's own release's noise
    # what the row releases about its region: "count", "sum:<expr>", … (None: anything)
    stats: frozenset[str] | None

    def __init__(
        self,
        query_id: str,
        cell: int,
        count: float | None,
        pending: bool = False,
        formula: Formula | None = None,
        noise: NoiseTerms | None = None,  # None: the noise of this count is not known
        stats: frozenset[str] | None = None,
    ) -> None:
        compact: NoiseTerms | CountNoise | None = noise
        if noise is not None and len(noise) == 1:
            source, coef, dist = noise[0]
            if coef == 1.0 and source == (query_id, cell):
                compact = dist
        for name, value in (
            ("query_id", query_id),
            ("cell", cell),
            ("count", count),
            ("pending", pending),
            ("formula", formula),
            ("_noise", compact),
            ("stats", stats),
        ):
            object.__setattr__(self, name, value)

    @property
    def noise(self) -> NoiseTerms | None:
        """The count's noise as released noises ((query id, cell), coefficient, noise)."""
        own = self._noise
        if isinstance(own, CountNoise):
            return (((self.query_id, self.cell), 1.0, own),)
        return own

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RowInfo is immutable (cannot set {name})")

    def _fields(self) -> tuple[object, ...]:
        return (
            self.query_id,
            self.cell,
            self.count,
            self.pending,
            self.formula,
            self.noise,
            self.stats,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RowInfo):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"RowInfo(query_id={self.query_id!r}, cell={self.cell!r}, count={self.count!r}, "
            f"pending={self.pending!r}, formula={self.formula!r}, noise={self.noise!r}, "
            f"stats={self.stats!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (RowInfo, self._fields())

    def with_formula(self, formula: Formula) -> RowInfo:
        """The same row carrying its region (a copy of the slots: this runs for every
        released cell)."""
        row = object.__new__(RowInfo)
        for name in RowInfo.__slots__:
            object.__setattr__(row, name, getattr(self, name))
        object.__setattr__(row, "formula", formula)
        return row


INTERN_SIZE = 1024
"""Distinct values ``shared`` remembers before starting afresh (a bound, not a need: a
scope sees a few noise scales and a few kinds of statistic)."""
_shared: dict[object, object] = {}


def shared(value: _T) -> _T:
    """One object for equal values (a released count's noise distribution, the set of
    statistics a query releases): rows of many answers point to it instead of holding
    a copy each. Values must be immutable and hashable."""
    hit = _shared.get(value)
    if hit is not None:
        return hit  # type: ignore[return-value]
    if len(_shared) >= INTERN_SIZE:
        _shared.clear()
    _shared[value] = value
    return value


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
        """The same knowledge over a space refined for ``formulas`` (atoms not split);
        itself when the space already is (the common case once a session's conditions
        have been seen: nothing is copied)."""
        if not self.space.needs(formulas):
            return self
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
