"""A region of the cell space, said as a WHERE clause over the declared columns.

A refusal names the group it would determine in the analyst's own terms, e.g.
``city = 'Budapest' AND income IS NULL``, so that "ask for that group directly" can be
followed. The text is built from the cell space alone — the dimensions, their pieces and
the constants the analyst's queries used — so it is public: a function of query texts
and the declared schema, never of a count or a row (docs/design.md, invariant 8).

The clause is exact: the rows it selects, read through the domain model (clamped bounds,
declared values, NULL only where the column is nullable), are the region's rows.
"""

from __future__ import annotations

import datetime as dt
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp

from gateway.audit.formulas import Prefix
from gateway.audit.space import OTHER, CellSpace, Dimension, Piece

MAX_TERMS = 6
"""An OR of more boxes than this is summarised (the clause would not help anyone)."""


def describe_region(space: CellSpace, atoms: np.ndarray) -> str:
    """The WHERE clause selecting exactly the cells of ``atoms`` (atom ids of ``space``)."""
    if not space.dims:
        return "TRUE"
    region = np.isin(space.atom_of, atoms)
    terms = _boxes(space, region, list(range(len(space.dims))))
    if terms is None:
        return "a combination of the conditions above that no short WHERE clause states"
    if not terms:
        return "FALSE"
    if len(terms) == 1:
        return terms[0] or "TRUE"
    return " OR ".join(f"({t})" if " AND " in t or " OR " in t else t for t in terms)


def _boxes(space: CellSpace, region: np.ndarray, axes: list[int]) -> list[str] | None:
    """``region`` (over the grid's group axes; axes not in ``axes`` have length 1) as
    an OR of AND-clauses, or None when it takes more than ``MAX_TERMS`` of them."""
    if not region.any():
        return []
    classes = {d: _classes(region, d) for d in axes}
    varying = [d for d in axes if len(classes[d]) > 1]
    if not varying:  # every axis's non-empty slices agree: a product, one AND-clause
        parts = []
        for d in axes:
            kept = np.zeros(region.shape[d], dtype=bool)
            for groups, _ in classes[d]:
                kept[groups] = True
            parts.append(_axis(space, d, kept))
        return [" AND ".join(p for p in parts if p)]
    d = min(varying, key=lambda a: len(classes[a]))
    rest = [a for a in axes if a != d]
    out: list[str] = []
    for groups, piece in classes[d]:
        inner = _boxes(space, piece, rest)
        if inner is None:
            return None
        chosen = np.zeros(region.shape[d], dtype=bool)
        chosen[groups] = True
        head = _axis(space, d, chosen)
        out += [" AND ".join(p for p in (head, t) if p) for t in inner]
        if len(out) > MAX_TERMS:
            return None
    return out


def _classes(region: np.ndarray, axis: int) -> list[tuple[list[int], np.ndarray]]:
    """The non-empty slices of ``region`` along ``axis``, equal ones grouped."""
    found: dict[bytes, tuple[list[int], np.ndarray]] = {}
    for g in range(region.shape[axis]):
        piece = np.take(region, [g], axis=axis)
        if piece.any():
            found.setdefault(np.packbits(piece).tobytes(), ([], piece))[0].append(g)
    return list(found.values())


def _axis(space: CellSpace, axis: int, groups: np.ndarray) -> str:
    """The condition on one dimension selecting the pieces of the chosen groups."""
    dim = space.dims[axis]
    chosen = groups[dim.group_of]
    if chosen.all():
        return ""
    pieces = [p for p, c in zip(dim.pieces, chosen, strict=True) if c]
    null = any(p.sample is None for p in pieces)
    values = [p for p in pieces if p.sample is not None]
    subject = _subject(dim)
    if not null and all(c for p, c in zip(dim.pieces, chosen, strict=True) if p.sample is not None):
        return f"{subject} IS NOT NULL"  # everything but NULL
    if dim.key.kind == "opaque":
        said = {2: f"({subject})", 0: f"NOT ({subject})", 1: f"({subject}) IS NULL"}
        parts = [said[int(p.sample)] for p in values]
    elif dim.key.kind == "categorical":
        parts = _categorical(dim, subject, values, chosen)
    else:
        col = space.table.columns.get(dim.key.column) if dim.key.column else None
        parts = _ordered(dim, subject, chosen, date=col is not None and col.type == "date")
    if null:
        parts.append(f"{subject} IS NULL")
    if not parts:
        return "FALSE"
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def _subject(dim: Dimension) -> str:
    if dim.key.column is not None:
        return dim.key.column
    return dim.key.sql


def _categorical(
    dim: Dimension, subject: str, values: list[Piece], chosen: np.ndarray
) -> list[str]:
    named = [p.sample for p in dim.pieces if _is_named(p)]
    unnamed = [(p, c) for p, c in zip(dim.pieces, chosen, strict=True) if _is_unnamed(p)]
    kept = [p.sample for p in values if _is_named(p)]
    if unnamed and all(c for _, c in unnamed):
        # every value not named is in: say which named values are left out
        left_out = [v for v in named if v not in kept]
        if not left_out:
            return [f"{subject} IS NOT NULL"] if dim.nullable else []
        return [_not_in(subject, left_out)]
    out = [_in(subject, kept)] if kept else []
    if not any(c for _, c in unnamed):
        if dim.declared is not None and len(kept) > len(named) / 2 and len(kept) < len(named):
            return [_not_in(subject, [v for v in named if v not in kept])]
        return out
    prefixes = [p.sample.text for p, _ in unnamed if isinstance(p.sample, Prefix)]
    for piece, c in unnamed:
        if c:
            out.append(_unnamed_piece(subject, piece, prefixes, named))
    return out


def _is_named(p: Piece) -> bool:
    return p.sample is not None and p.sample is not OTHER and not isinstance(p.sample, Prefix)


def _is_unnamed(p: Piece) -> bool:
    return p.sample is OTHER or isinstance(p.sample, Prefix)


def _unnamed_piece(subject: str, piece: Piece, prefixes: list[str], named: list[Any]) -> str:
    """The values of a piece that no named value covers: those starting with its prefix
    and with no longer prefix seen (``Prefix``), or those matching no prefix (``OTHER``),
    in both cases none of the named values."""
    if isinstance(piece.sample, Prefix):
        text = piece.sample.text
        parts = [f"{subject} LIKE {_literal(piece.sample)}"]
        longer = [q for q in prefixes if q != text and q.startswith(text)]
        within = [v for v in named if isinstance(v, str) and v.startswith(text)]
    else:
        parts, longer, within = [], prefixes, named
    parts += [f"{subject} NOT LIKE {_literal(Prefix(q))}" for q in longer]
    if within:
        parts.append(_not_in(subject, within))
    if not parts:
        return f"{subject} IS NOT NULL"
    return parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"


def _ordered(dim: Dimension, subject: str, chosen: np.ndarray, *, date: bool) -> list[str]:
    """Runs of consecutive chosen pieces (in ascending order) as ranges."""
    out: list[str] = []
    ordered = [(p, c) for p, c in zip(dim.pieces, chosen, strict=True) if p.sample is not None]
    run: list[Piece] = []
    points: list[Piece] = []
    for p, c in [*ordered, (None, False)]:
        if c and p is not None:
            run.append(p)
            continue
        if run:
            if len(run) == 1 and run[0].point:
                points.append(run[0])
            else:
                out.append(_range(dim, subject, run[0], run[-1], date=date))
            run = []
    if points:
        out.insert(0, _in(subject, [_value(p.sample, date) for p in points]))
    # every value but a few single ones: `year <> 2024` says it shorter than
    # `year = 2025 OR year < 2024` (NULL, if chosen, is added by the caller)
    left_out = [p for p, c in ordered if not c]
    if left_out and all(p.point for p in left_out) and len(left_out) < len(out):
        return [_not_in(subject, [_value(p.sample, date) for p in left_out])]
    return out


def _range(dim: Dimension, subject: str, first: Piece, last: Piece, *, date: bool) -> str:
    lo_op = ">=" if first.point else ">"
    lo_v = first.sample if first.point else first.low
    hi_op = "<=" if last.point else "<"
    hi_v = last.sample if last.point else last.high
    parts = []
    at_floor = lo_v is None or (dim.lower is not None and lo_v <= dim.lower and first.point)
    at_ceiling = hi_v is None or (dim.upper is not None and hi_v >= dim.upper and last.point)
    if not at_floor:
        parts.append(f"{subject} {lo_op} {_literal(_value(lo_v, date))}")
    if not at_ceiling:
        parts.append(f"{subject} {hi_op} {_literal(_value(hi_v, date))}")
    return " AND ".join(parts) or f"{subject} IS NOT NULL"


def _value(v: Any, date: bool) -> Any:
    if isinstance(v, Fraction):
        if date:
            return dt.date.fromordinal(int(v)).isoformat()
        return int(v) if v.denominator == 1 else float(v)
    return v


def _in(subject: str, values: list[Any]) -> str:
    shown = [_literal(v) for v in values]
    if len(shown) == 1:
        return f"{subject} = {shown[0]}"
    return f"{subject} IN ({', '.join(shown)})"


def _not_in(subject: str, values: list[Any]) -> str:
    shown = [_literal(v) for v in values]
    if len(shown) == 1:
        return f"{subject} <> {shown[0]}"
    return f"{subject} NOT IN ({', '.join(shown)})"


def _literal(v: Any) -> str:
    """A constant as SQL, built by sqlglot (never by formatting it into SQL by hand)."""
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, Prefix):
        return exp.Literal.string(v.text + "%").sql()
    return str(exp.convert(v).sql())
