"""The logical cell space: per dimension, the declared domain split at every constant used.

Each dimension of a scope's space is partitioned into *pieces* on which every condition
the scope's queries used is constant. The pieces follow the domain model the compiled
SQL enforces (``gateway/core/domain.py``): for an ordered column, the points and open
intervals between its constants, within the declared bounds (the SQL clamps to them;
empty integer intervals dropped), or its declared values; for a categorical column, its
declared values (or the constants seen plus "anything else"); for an opaque condition,
TRUE / FALSE (and UNKNOWN where it may be NULL). A column that may hold NULL (declared or
catalogued ``nullable``) has a NULL piece, and SQL's three-valued logic decides what a
predicate does with it; a column that may not has none (the SQL reads no such rows).

Each axis of the space groups the pieces that no condition seen so far tells apart
(``age > 30`` needs two groups, ``age IN (20, 40)`` puts 20 and 40 in one). The space is
the product of these groups over the dimensions the scope has used, kept as a dense
grid that maps each cell to its *atom*: cells no answered region tells apart are one atom.

A product cannot say that one column is NULL exactly when another says so (a declared
``null_when``): a space that holds such a constraint's dimensions also holds the
constraint (``DomainConstraint``), and every region leaves out the cells where it is not
TRUE, as the compiled SQL reads no row there. Those cells are in no region, so no
combination of answers determines them, and they never count as a group.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from math import floor
from typing import Any

import numpy as np

from gateway.audit.formulas import TRUE, Condition, DimensionKey, DomainConstraint, Formula, Prefix
from gateway.core.config import ColumnConfig, TableConfig
from gateway.core.domain import clamped, declared_values

MAX_CELLS = 2_000_000
"""Beyond this many cells the auditor refuses rather than guess (doubt refuses)."""


class SpaceTooLarge(Exception):
    """The scope's cell space would exceed ``MAX_CELLS``."""


class _Other:
    """The "any value not named" piece of a categorical dimension."""

    def __reduce__(self) -> str:
        return "OTHER"  # compared by identity: read back (unpickled) as the one instance

    def __repr__(self) -> str:
        return "OTHER"


OTHER = _Other()
F, U, T = 0, 1, 2  # Kleene truth values: AND is min, OR is max, NOT is 2 − x


@dataclass(frozen=True)
class Piece:
    """One piece of a dimension: ``sample`` is a value inside it (None: the NULL piece)."""

    sample: Any
    low: Fraction | None = None  # open interval (low, high); None = unbounded
    high: Fraction | None = None
    point: bool = True


class Dimension:
    """One axis of the cell space and its current partition."""

    def __init__(self, key: DimensionKey, table: TableConfig) -> None:
        self.key = key
        col = table.columns.get(key.column) if key.column else None
        self.integer = col is not None and col.type == "integer"
        # The domain model (gateway/core/domain.py): the compiled SQL clamps bounded numbers,
        # so an ordered axis ends at the bounds; it keeps only declared values; NULL is a
        # piece exactly where the column (or the expression) may be NULL.
        self.lower: Fraction | None = None
        self.upper: Fraction | None = None
        if col is not None and clamped(col):
            assert col.lower is not None and col.upper is not None
            self.lower, self.upper = Fraction(col.lower), Fraction(col.upper)
        self.nullable = key.nullable
        self.declared: tuple[Any, ...] | None = None
        self.points: tuple[Fraction, ...] | None = None
        values = declared_values(col) if col is not None else None
        if values is not None and key.kind == "categorical":
            self.declared = tuple(values)
        elif values is not None and key.kind == "ordered":
            self.points = tuple(sorted({_ordered_value(v, col) for v in values}))
        self.constants: set[Any] = set()
        self.pieces: list[Piece] = self._pieces()
        # the axis is coarser than the elementary pieces: pieces no condition seen so far
        # tells apart form one group (``age > 30`` needs two groups, not three pieces)
        self.conditions: set[Condition] = set()
        self.group_of = np.zeros(len(self.pieces), dtype=np.intp)
        self.n_groups = 1
        self.representative = np.zeros(1, dtype=np.intp)

    def refine_groups(self, conditions: Iterable[Condition]) -> np.ndarray | None:
        """Make every condition constant on groups; per new group, its old group (or None
        when nothing changed)."""
        new = [c for c in conditions if c not in self.conditions]
        if not new:
            return None
        constants = {v for c in new for v in c.values}
        elem_parents = self.refine(constants)
        base = self.group_of if elem_parents is None else self.group_of[elem_parents]
        columns = [base] + [self.evaluate(c).astype(np.intp) for c in new]
        self.conditions |= set(new)
        keys = np.stack(columns, axis=1)
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        self.group_of = inverse.reshape(-1).astype(np.intp)
        self.n_groups = len(first)
        self.representative = first.astype(np.intp)
        return base[first].astype(np.intp)

    def group_evaluate(self, cond: Condition) -> np.ndarray:
        """The Kleene value of a condition already seen, on each group."""
        return self.evaluate(cond)[self.representative]

    def locate_group(self, value: Any) -> int:
        """Index of the group holding ``value``."""
        return int(self.group_of[self.locate(value)])

    # -- partitions ----------------------------------------------------------------

    def _pieces(self) -> list[Piece]:
        if self.key.kind == "opaque":
            return [Piece(T), Piece(F), Piece(U)] if self.nullable else [Piece(T), Piece(F)]
        if self.key.kind == "categorical":
            if self.declared is not None:
                out = [Piece(v) for v in self.declared]
            else:
                named = sorted((c for c in self.constants if not isinstance(c, Prefix)), key=repr)
                prefixes = sorted(c.text for c in self.constants if isinstance(c, Prefix))
                out = [Piece(v) for v in named] + [Piece(Prefix(p)) for p in prefixes]
                out.append(Piece(OTHER))
            return [*out, Piece(None)] if self.nullable else out
        if self.points is not None:  # declared values: nothing else exists
            fixed = [Piece(v, v, v) for v in self.points]
            return [*fixed, Piece(None)] if self.nullable else fixed
        points = set(self.constants)
        if self.lower is not None:
            points.add(self.lower)
        if self.upper is not None:
            points.add(self.upper)
        bps = sorted(points)
        cands: list[Piece] = []
        edges: list[Fraction | None] = [None, *bps, None]
        for i in range(len(edges) - 1):
            lo, hi = edges[i], edges[i + 1]
            sample = self._interval_sample(lo, hi)
            if sample is not None:
                cands.append(Piece(sample, lo, hi, point=False))
            if hi is not None and self._point_ok(hi):
                cands.append(Piece(hi, hi, hi))
        return [*cands, Piece(None)] if self.nullable else cands

    def _point_ok(self, v: Fraction) -> bool:
        if self.integer and v.denominator != 1:
            return False
        return not (
            (self.lower is not None and v < self.lower)
            or (self.upper is not None and v > self.upper)
        )

    def _interval_sample(self, lo: Fraction | None, hi: Fraction | None) -> Fraction | None:
        """A value strictly inside (lo, hi) and inside the declared domain, or None. The
        bounds are breakpoints, so an interval is wholly inside them or wholly outside."""
        sample = self._inside(lo, hi)
        if sample is None:
            return None
        if (self.lower is not None and sample < self.lower) or (
            self.upper is not None and sample > self.upper
        ):
            return None
        return sample

    def _inside(self, lo: Fraction | None, hi: Fraction | None) -> Fraction | None:
        if lo is None and self.lower is not None:
            return None
        if hi is None and self.upper is not None:
            return None
        if self.integer:
            start = (floor(lo) + 1) if lo is not None else (floor(hi) - 1 if hi is not None else 0)
            if hi is not None and start >= hi:
                return None
            return Fraction(start)
        if lo is None and hi is None:
            return Fraction(0)
        if lo is None:
            assert hi is not None
            return hi - 1
        if hi is None:
            return lo + 1
        return (lo + hi) / 2

    def _ordered_samples(self) -> list[Fraction]:
        return [p.sample for p in self.pieces if p.sample is not None]

    def locate(self, value: Any) -> int:
        """Index of the piece holding ``value`` (a sample of a finer partition)."""
        if self.key.kind == "ordered" and value is not None:
            # pieces are in ascending order; the NULL piece (if any) is last
            samples = self._ordered_samples()
            i = bisect.bisect_right(samples, value) - 1
            for j in (i, i + 1):
                if 0 <= j < len(samples) and self._holds(self.pieces[j], value):
                    return j
            raise KeyError(value)
        if self.key.kind == "categorical" and self.declared is None:
            return self._locate_open(value)
        for i, p in enumerate(self.pieces):
            if value is None or p.sample is None:
                if value is None and p.sample is None:
                    return i
                continue
            if self.key.kind != "ordered":
                if p.sample is OTHER and value is OTHER:
                    return i
                if p.sample is not OTHER and value is not OTHER and p.sample == value:
                    return i
                continue
            if p.point:
                if value == p.sample:
                    return i
            elif (p.low is None or value > p.low) and (p.high is None or value < p.high):
                return i
        if self.key.kind == "categorical" and self.declared is None:
            return next(i for i, p in enumerate(self.pieces) if p.sample is OTHER)
        raise KeyError(value)

    def _locate_open(self, value: Any) -> int:
        """``locate`` on a categorical axis without declared values: a named value, or
        the "other" piece under the longest prefix seen that it starts with."""
        index = self._categorical_index()
        if value is None:
            return len(self.pieces) - 1  # the NULL piece is last
        if value is not OTHER and not isinstance(value, Prefix) and value in index:
            return index[value]
        text = (
            value.text if isinstance(value, Prefix) else value if isinstance(value, str) else None
        )
        best: int | None = None
        best_len = -1
        if text is not None:
            for i, p in enumerate(self.pieces):
                s = p.sample
                if isinstance(s, Prefix) and text.startswith(s.text) and len(s.text) > best_len:
                    best, best_len = i, len(s.text)
        if best is not None:
            return best
        return next(i for i, p in enumerate(self.pieces) if p.sample is OTHER)

    def _categorical_index(self) -> dict[Any, int]:
        cached = getattr(self, "_index", None)
        if cached is None or cached[0] is not self.pieces:
            table = {
                p.sample: i
                for i, p in enumerate(self.pieces)
                if p.sample is not None and p.sample is not OTHER
            }
            cached = (self.pieces, table)
            self._index = cached
        return cached[1]

    @staticmethod
    def _holds(p: Piece, value: Any) -> bool:
        if p.point:
            return bool(value == p.sample)
        return (p.low is None or value > p.low) and (p.high is None or value < p.high)

    def refine(self, constants: Iterable[Any]) -> np.ndarray | None:
        """Add constants; returns, per new piece, the old piece containing it (or None)."""
        if self.key.kind == "opaque":
            return None
        new = {c for c in constants if c is not None} - self.constants
        if self.declared is not None or self.points is not None:
            new = set()  # declared values: the pieces are fixed
        if not new:
            return None
        old = list(self.pieces)
        self.constants |= new
        self.pieces = self._pieces()
        keep, self.pieces = self.pieces, old
        parents = np.array([self.locate(p.sample) for p in keep], dtype=np.intp)
        self.pieces = keep
        return parents

    # -- evaluation ----------------------------------------------------------------

    def evaluate(self, cond: Condition) -> np.ndarray:
        """The Kleene value of ``cond`` on each piece (int8: 0 F, 1 U, 2 T)."""
        out = np.empty(len(self.pieces), dtype=np.int8)
        has_null_const = any(v is None for v in cond.values)
        if self.key.kind == "ordered" and cond.op not in ("isnull", "true"):
            samples = self._ordered_samples()
            m = len(samples)
            out[:] = U  # the NULL piece, if any, stays UNKNOWN
            out[:m] = F
            if cond.op == "in":
                for v in cond.values:
                    if v is None:
                        continue
                    j = bisect.bisect_left(samples, v)
                    if j < m and samples[j] == v:
                        out[j] = T
                if has_null_const:
                    out[:m][out[:m] == F] = U
                return out
            v = cond.values[0]
            lo, hi = bisect.bisect_left(samples, v), bisect.bisect_right(samples, v)
            if cond.op == "lt":
                out[:lo] = T
            elif cond.op == "le":
                out[:hi] = T
            elif cond.op == "gt":
                out[hi:m] = T
            else:
                out[lo:m] = T
            return out
        if cond.op == "prefix":
            start = cond.values[0].text
            for i, p in enumerate(self.pieces):
                s = p.sample
                if s is None:
                    out[i] = U
                elif isinstance(s, Prefix):
                    out[i] = T if s.text.startswith(start) else F
                elif isinstance(s, str):
                    out[i] = T if s.startswith(start) else F
                else:
                    out[i] = F
            return out
        if self.key.kind == "categorical" and cond.op == "in":
            index = self._categorical_index()
            out[:] = U if has_null_const else F
            if self.nullable:
                out[-1] = U
            for v in cond.values:
                hit = index.get(v) if v is not None else None
                if hit is not None:
                    out[hit] = T
            return out
        for i, p in enumerate(self.pieces):
            s = p.sample
            if cond.op == "true":
                out[i] = s
            elif cond.op == "isnull":
                out[i] = T if s is None else F
            elif s is None:
                out[i] = U
            elif cond.op == "in":
                hit = s is not OTHER and any(v is not None and v == s for v in cond.values)
                out[i] = T if hit else (U if has_null_const else F)
            else:
                v = cond.values[0]
                ok = {
                    "lt": s < v,
                    "le": s <= v,
                    "gt": s > v,
                    "ge": s >= v,
                }[cond.op]
                out[i] = T if ok else F
        return out


class CellSpace:
    """The grid of one (scope, table): dimensions and the atom id of every cell.

    ``constraints``: the declared domain constraints this space holds, its dimensions
    refined for them from the start, so that every region it ever computes leaves out
    the cells they rule out (a region computed before they were there would keep them)."""

    def __init__(self, table: TableConfig, constraints: tuple[DomainConstraint, ...] = ()) -> None:
        self.table = table
        self.dims: list[Dimension] = []
        self.index: dict[DimensionKey, int] = {}
        self.atom_of = np.zeros((), dtype=np.int32)
        self.n_atoms = 1
        self.constraints = constraints
        if constraints:
            self.ensure(c.formula for c in constraints)

    def copy(self) -> CellSpace:
        other = CellSpace(self.table)
        other.constraints = self.constraints
        other.dims = [_copy_dim(d) for d in self.dims]
        other.index = dict(self.index)
        other.atom_of = self.atom_of
        other.n_atoms = self.n_atoms
        return other

    @property
    def n_cells(self) -> int:
        return int(self.atom_of.size)

    def needs(self, formulas: Iterable[Formula]) -> bool:
        """Whether ``ensure(formulas)`` would refine anything: a condition on a dimension
        the space does not have, or one its dimension was not refined for."""
        for f in formulas:
            for c in f.conditions():
                axis = self.index.get(c.dimension)
                if axis is None or c not in self.dims[axis].conditions:
                    return True
        return False

    def aligned(self, label: np.ndarray) -> np.ndarray | None:
        """Per atom, the label of its cells when ``label`` is constant on every atom
        (``split`` would change nothing), else ``None``."""
        of_atom = np.zeros(self.n_atoms, dtype=label.dtype)
        of_atom[self.atom_of.ravel()] = label.ravel()
        return of_atom if np.array_equal(of_atom[self.atom_of], label) else None

    def ensure(self, formulas: Iterable[Formula]) -> None:
        """Refine the space so that every condition of ``formulas`` is constant on cells."""
        wanted: dict[DimensionKey, list[Condition]] = {}
        for f in formulas:
            for c in f.conditions():
                wanted.setdefault(c.dimension, []).append(c)
        steps: list[tuple[int | None, Dimension, np.ndarray | None]] = []
        shape = list(self.atom_of.shape)
        for key, conds in wanted.items():
            if key not in self.index:
                d = Dimension(key, self.table)
                d.refine_groups(conds)
                steps.append((None, d, None))
                shape.append(d.n_groups)
            else:
                axis = self.index[key]
                d = self.dims[axis]
                parents = d.refine_groups(conds)
                if parents is not None:
                    steps.append((axis, d, parents))
                    shape[axis] = d.n_groups
        if int(np.prod(shape, dtype=np.float64)) > MAX_CELLS:
            raise SpaceTooLarge
        atom_of = self.atom_of
        for at, d, parents in steps:
            if at is None:
                self.index[d.key] = len(self.dims)
                self.dims.append(d)
                atom_of = np.repeat(atom_of[..., None], d.n_groups, axis=-1)
            else:
                assert parents is not None
                atom_of = np.take(atom_of, parents, axis=at)
        self.atom_of = np.require(atom_of, requirements="C")

    def truth(self, f: Formula, memo: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """The Kleene value of ``f`` on every cell (the space must be refined for it).
        ``memo`` shares the values of sub-formulas common to several calls (by identity)."""
        if memo is None:
            return self._truth(f, {})
        return self._truth(f, memo)

    def _truth(self, f: Formula, memo: dict[int, np.ndarray]) -> np.ndarray:
        hit = memo.get(id(f))
        if hit is None:
            hit = memo[id(f)] = self._truth_of(f, memo)
        return hit

    def _truth_of(self, f: Formula, memo: dict[int, np.ndarray]) -> np.ndarray:
        nd = len(self.dims)
        if f.op == "const":
            return np.full((1,) * nd, f.const, dtype=np.int8)
        if f.op == "leaf":
            assert f.leaf is not None
            axis = self.index[f.leaf.dimension]
            vals = self.dims[axis].group_evaluate(f.leaf)
            shape = [1] * nd
            shape[axis] = len(vals)
            return vals.reshape(shape)
        if f.op == "not":
            return (T - self._truth(f.children[0], memo)).astype(np.int8)
        if f.op == "istrue":
            return np.where(self._truth(f.children[0], memo) == T, T, F).astype(np.int8)
        parts = [self._truth(c, memo) for c in f.children]
        out = parts[0]
        for p in parts[1:]:
            out = np.minimum(out, p) if f.op == "and" else np.maximum(out, p)
        return out

    def mask(self, f: Formula, memo: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """Cells where the predicate is TRUE (the rows a WHERE keeps), among those the
        space's domain constraints leave (the rows the SQL reads at all)."""
        memo = {} if memo is None else memo
        kept = self.truth(f, memo) == T
        for c in self.constraints:
            kept = kept & (self.truth(c.formula, memo) == T)
        return np.broadcast_to(kept, self.atom_of.shape)

    def possible_atoms(self) -> np.ndarray:
        """Per atom, whether it holds a cell the domain constraints leave (one that rows
        can fill): the others are empty by declaration."""
        out = np.zeros(self.n_atoms, dtype=bool)
        out[self.atom_of[self.mask(TRUE)]] = True
        return out

    def split(self, label: np.ndarray, n_labels: int) -> np.ndarray:
        """Split atoms by a labelling of cells (0..n_labels); returns the parent atom of
        each new atom."""
        key = self.atom_of.astype(np.int64) * (n_labels + 1) + label
        uniq, inverse = np.unique(key.ravel(), return_inverse=True)
        self.atom_of = inverse.reshape(self.atom_of.shape).astype(np.int32)
        self.n_atoms = len(uniq)
        return (uniq // (n_labels + 1)).astype(np.intp)

    def atoms_in(self, mask: np.ndarray) -> np.ndarray:
        """The atoms (sorted ids) of a region; the space must already be split by it."""
        return np.unique(self.atom_of[mask])


def _ordered_value(value: Any, col: ColumnConfig | None) -> Fraction:
    """A declared value of an ordered column, in the axis's terms (dates as day numbers)."""
    if col is not None and col.type == "date":
        from gateway.audit.predicates import date_number

        return date_number(value)
    return Fraction(value)


def _copy_dim(d: Dimension) -> Dimension:
    c = Dimension.__new__(Dimension)
    c.__dict__.update(d.__dict__)
    c.constants = set(d.constants)
    c.pieces = list(d.pieces)
    c.conditions = set(d.conditions)
    c.__dict__.pop("_index", None)
    return c
