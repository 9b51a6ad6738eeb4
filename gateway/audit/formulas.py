"""The formulas the auditor reads predicates into: Kleene logic over dimension conditions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

DimKind = Literal["ordered", "categorical", "opaque"]
CompareOp = Literal["in", "lt", "le", "gt", "ge", "isnull", "true", "prefix"]


@dataclass(frozen=True, slots=True)
class Prefix:
    """``x LIKE 'text%'``: the text values starting with ``text`` (as a constant of a
    condition); as a piece's sample, the values starting with it and with no longer
    prefix seen, none of them named."""

    text: str


@dataclass(frozen=True, slots=True)
class DimensionKey:
    """Names one dimension of the cell space.

    ``kind`` says how its domain is partitioned: ``ordered`` (numbers, dates: intervals
    between constants), ``categorical`` (text, booleans: the values, and "anything else"
    where none are declared) or ``opaque`` (a condition the auditor cannot decompose:
    true, false, and unknown when it ``nullable``). ``column`` is set when the dimension
    is a declared column; ``columns`` are the table columns it reads (its claim).
    """

    kind: DimKind
    sql: str
    column: str | None = None
    columns: frozenset[str] = frozenset()
    nullable: bool = False


@dataclass(frozen=True, slots=True)
class Condition:
    """A leaf: ``dimension op values`` (``op == "true"`` for an opaque dimension)."""

    dimension: DimensionKey
    op: CompareOp
    values: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Formula:
    """AND / OR / NOT / IS TRUE over conditions; ``const`` is a Kleene truth value
    (0 F, 1 U, 2 T)."""

    op: Literal["and", "or", "not", "istrue", "leaf", "const"]
    children: tuple[Formula, ...] = ()
    leaf: Condition | None = None
    const: int = 2

    def __reduce__(self) -> tuple[Any, ...]:
        # TRUE, FALSE and NULL are compared by identity (``conj``): read back as themselves
        if self.op == "const":
            return (_constant, (self.const,))
        return (Formula, (self.op, self.children, self.leaf, self.const))

    def conditions(self) -> list[Condition]:
        if self.leaf is not None:
            return [self.leaf]
        return [c for ch in self.children for c in ch.conditions()]


@dataclass(frozen=True, slots=True)
class DomainConstraint:
    """A condition every row of the table meets because the compiled SQL reads no row
    that breaks it (``gateway/core/domain.py``, ``row_filter``): a column declared NULL
    exactly when a condition holds (``null_when``). Cells where ``formula`` is not TRUE
    hold no row: the cell space leaves them out of every region (``space``).
    ``dimensions`` are those it reads, ``columns`` the table columns they claim."""

    formula: Formula
    dimensions: frozenset[DimensionKey]
    columns: frozenset[str]


TRUE = Formula("const", const=2)
FALSE = Formula("const", const=0)
NULL = Formula("const", const=1)
_CONSTS = {0: FALSE, 1: NULL, 2: TRUE}


def _constant(value: int) -> Formula:
    return _CONSTS[value]


def conj(*parts: Formula) -> Formula:
    """The conjunction of formulas (TRUE when empty)."""
    kept = tuple(p for p in parts if p is not TRUE)
    if not kept:
        return TRUE
    return kept[0] if len(kept) == 1 else Formula("and", kept)


def disj(*parts: Formula) -> Formula:
    """The disjunction of formulas (FALSE when empty)."""
    kept = tuple(p for p in parts if p is not FALSE)
    if not kept:
        return FALSE
    return kept[0] if len(kept) == 1 else Formula("or", kept)


def neg(f: Formula) -> Formula:
    if f.op == "const":
        return _CONSTS[2 - f.const]
    return Formula("not", (f,))


def is_true(f: Formula) -> Formula:
    """TRUE where ``f`` is TRUE, FALSE elsewhere (SQL's ``f IS TRUE``)."""
    if f.op == "const":
        return TRUE if f.const == 2 else FALSE
    return Formula("istrue", (f,))


def leaf(dim: DimensionKey, op: CompareOp, values: tuple[Any, ...] = ()) -> Formula:
    return Formula("leaf", leaf=Condition(dim, op, values))
