"""What the gateway answers, as frozen values: released answers, budgets, the public schema.

Parsing is lenient about fields it does not know (they stay in ``raw``) and strict
about the ones it needs, so a newer gateway does not break an older client.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dpgate_client.errors import InterfaceError

__all__ = [
    "Accuracy",
    "Budget",
    "ColumnSchema",
    "Privacy",
    "QueryResult",
    "ResultColumn",
    "Schema",
    "TableSchema",
]


def _frozen(mapping: Any) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping)) if isinstance(mapping, Mapping) else MappingProxyType({})


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _convert(value: Any, type_name: str) -> Any:
    """Turn a JSON value into the Python value its gateway type promises."""
    if value is None:
        return None
    if type_name == "date" and isinstance(value, str):
        try:
            return dt.date.fromisoformat(value[:10]) if len(value) >= 10 else value
        except ValueError:
            return value
    if type_name in ("timestamp", "datetime") and isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            return value
    if type_name == "boolean" and isinstance(value, int) and not isinstance(value, bool):
        return bool(value)
    if type_name == "real" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


@dataclass(frozen=True)
class ResultColumn:
    """One column of a released answer; ``type`` is the gateway's type name."""

    name: str
    type: str


@dataclass(frozen=True)
class Accuracy:
    """How far a released value may be from the exact one, from the noise alone.

    A COUNT or SUM column has one ``ci95_halfwidth`` (± this, with 95 % probability)
    and ``stddev``, the same for every row. An AVG column is a noisy SUM over a noisy
    COUNT, so its error depends on the row: ``ci95_intervals`` holds one 95 % interval
    ``(low, high)`` per released row, in row order (None where the noisy count was not
    positive), and ``sum`` and ``count`` the accuracy of its two parts (a dry run, which
    has no rows, gives only those). VARIANCE and STDDEV columns are alike, with a third
    part, ``sum_squares``. A quantile (PERCENTILE_CONT, MEDIAN, MIN, MAX) has a rank
    interval instead: with 95 % probability the released value's bucket holds a value
    whose rank is within ± ``rank_ci95_halfwidth`` of the target rank ``quantile``·(n−1),
    or is empty and lies between two such values.
    """

    ci95_halfwidth: float | None
    stddev: float | None
    ci95_intervals: tuple[tuple[float, float] | None, ...] | None = None
    sum: Accuracy | None = None
    count: Accuracy | None = None
    sum_squares: Accuracy | None = None
    quantile: float | None = None
    rank_ci95_halfwidth: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> Accuracy:
        data = data if isinstance(data, Mapping) else {}
        intervals = data.get("ci95_intervals")
        return cls(
            _float(data.get("ci95_halfwidth")),
            _float(data.get("stddev")),
            ci95_intervals=(
                tuple(_interval(i) for i in intervals)
                if isinstance(intervals, Sequence) and not isinstance(intervals, str)
                else None
            ),
            sum=cls.from_json(data["sum"]) if isinstance(data.get("sum"), Mapping) else None,
            count=cls.from_json(data["count"]) if isinstance(data.get("count"), Mapping) else None,
            sum_squares=cls.from_json(data["sum_squares"])
            if isinstance(data.get("sum_squares"), Mapping)
            else None,
            quantile=_float(data.get("quantile")),
            rank_ci95_halfwidth=int(data["rank_ci95_halfwidth"])
            if isinstance(data.get("rank_ci95_halfwidth"), int)
            else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what ``to_pandas`` puts in ``df.attrs["accuracy"]``)."""
        out: dict[str, Any] = {"ci95_halfwidth": self.ci95_halfwidth, "stddev": self.stddev}
        if self.ci95_intervals is not None:
            out["ci95_intervals"] = [list(i) if i else None for i in self.ci95_intervals]
        if self.sum is not None:
            out["sum"] = self.sum.to_dict()
        if self.count is not None:
            out["count"] = self.count.to_dict()
        if self.sum_squares is not None:
            out["sum_squares"] = self.sum_squares.to_dict()
        if self.rank_ci95_halfwidth is not None:
            out["quantile"] = self.quantile
            out["rank_ci95_halfwidth"] = self.rank_ci95_halfwidth
        return out


def _interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        low, high = _float(value[0]), _float(value[1])
        if low is not None and high is not None:
            return (low, high)
    return None


@dataclass(frozen=True)
class Privacy:
    """What one answer cost: the mechanism and its (ε, δ) and zCDP ρ."""

    mechanism: str
    epsilon: float
    delta: float
    rho: float | None = None

    @classmethod
    def from_json(cls, data: Any) -> Privacy | None:
        if not isinstance(data, Mapping):
            return None
        return cls(
            mechanism=str(data.get("mechanism") or "none"),
            epsilon=_float(data.get("epsilon")) or 0.0,
            delta=_float(data.get("delta")) or 0.0,
            rho=_float(data.get("rho")),
        )


@dataclass(frozen=True)
class Budget:
    """The analyst's privacy budget as the gateway reports it (missing fields are None).

    ``epsilon_spent`` is in the budget's own units (the smaller of the basic-composition
    and zCDP totals: ``basis`` says which); ``period`` is ``day``, ``week``, ``month`` or
    ``none``, and ``period_ends_at`` when the budget renews (None without a period).
    """

    epsilon_total: float | None = None
    epsilon_spent: float | None = None
    epsilon_remaining: float | None = None
    delta_total: float | None = None
    delta_spent: float | None = None
    delta_remaining: float | None = None
    composition: str | None = None
    analyst: str | None = None
    queries: int | None = None
    max_next_laplace_epsilon: float | None = None
    period: str | None = None
    period_ends_at: dt.datetime | None = None
    basis: str | None = None
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Budget | None:
        if not isinstance(data, Mapping):
            return None
        if isinstance(data.get("budget"), Mapping):
            merged = {**data["budget"], **{k: v for k, v in data.items() if k != "budget"}}
            data = merged

        def pick(*names: str) -> float | None:
            for name in names:
                value = data.get(name)
                if isinstance(value, Mapping):
                    continue
                if value is not None:
                    return _float(value)
            return None

        def nested(group: str, key: str) -> float | None:
            inner = data.get(group)
            return _float(inner.get(key)) if isinstance(inner, Mapping) else None

        composition = data.get("composition")
        analyst = data.get("name", data.get("analyst"))
        queries = data.get("queries")
        return cls(
            epsilon_total=_first(pick("epsilon_total", "epsilon"), nested("total", "epsilon")),
            epsilon_spent=_first(pick("epsilon_spent"), nested("spent", "epsilon")),
            epsilon_remaining=_first(pick("epsilon_remaining"), nested("remaining", "epsilon")),
            delta_total=_first(pick("delta_total", "delta"), nested("total", "delta")),
            delta_spent=_first(pick("delta_spent"), nested("spent", "delta")),
            delta_remaining=_first(pick("delta_remaining"), nested("remaining", "delta")),
            composition=str(composition) if isinstance(composition, str) else None,
            analyst=str(analyst) if isinstance(analyst, str) else None,
            queries=queries if isinstance(queries, int) and not isinstance(queries, bool) else None,
            max_next_laplace_epsilon=pick("max_next_laplace_epsilon"),
            period=str(data["period"]) if isinstance(data.get("period"), str) else None,
            period_ends_at=_time(data.get("period_ends_at")),
            basis=str(data["basis"]) if isinstance(data.get("basis"), str) else None,
            raw=_frozen({k: v for k, v in data.items() if k != "ok"}),
        )


def _time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class QueryResult:
    """One released answer: rows and columns plus what it cost and how accurate it is.

    ``accuracy`` maps a noisy column's name to its ``Accuracy``; exact columns (group
    keys released from a declared domain) have none. ``privacy`` is the cost of this
    answer (``epsilon == 0`` for cached answers and free probes), ``budget`` the
    analyst's budget after it, and ``charge`` what it added to the budget's ε and δ spent
    (``{"epsilon", "delta"}``, in the budget's units; None for cached answers). A dry run
    has no rows; its plan is in ``plan``, ``would_fit`` says whether the budget admits it
    now, ``charge`` what it would add and ``queries_remaining`` how many such queries the
    budget still admits. ``accuracy_target`` is set for a query asked with ``accuracy=``:
    the half-width asked for and the ε chosen. ``partition_selection`` is set
    when the groups were released through DP partition selection (GROUP BY keys whose
    values are not declared public): ``threshold`` is the noisy number of people a group
    needed to be released, and ``note`` says so in words. ``audit_left_out`` is set when
    the auditor left rows out of the answer: ``groups`` names them by their group keys,
    ``reason`` says why (the groups they would single out) and what to ask instead.
    """

    columns: tuple[ResultColumn, ...]
    rows: tuple[tuple[Any, ...], ...]
    accuracy: Mapping[str, Accuracy]
    privacy: Privacy | None
    budget: Budget | None
    query_id: str | None = None
    cached: bool = False
    dry_run: bool = False
    plan: Mapping[str, Any] | None = None
    would_fit: bool | None = None
    partition_selection: Mapping[str, Any] | None = None
    charge: Mapping[str, Any] | None = None
    queries_remaining: int | None = None
    accuracy_target: Mapping[str, Any] | None = None
    audit_left_out: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, dry_run: bool = False) -> QueryResult:
        columns_json = data.get("columns") or []
        rows_json = data.get("rows") or []
        if not isinstance(columns_json, Sequence) or not isinstance(rows_json, Sequence):
            raise InterfaceError("the gateway's answer has malformed columns or rows")
        columns = tuple(
            ResultColumn(str(c.get("name")), str(c.get("type") or "text"))
            if isinstance(c, Mapping)
            else ResultColumn(str(c), "text")
            for c in columns_json
        )
        types = [c.type for c in columns]
        rows = []
        for row in rows_json:
            if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != len(types):
                raise InterfaceError("the gateway's answer has a row that does not fit its columns")
            rows.append(tuple(_convert(v, t) for v, t in zip(row, types, strict=True)))
        accuracy_json = data.get("accuracy")
        accuracy = {
            str(name): Accuracy.from_json(value)
            for name, value in (accuracy_json.items() if isinstance(accuracy_json, Mapping) else ())
        }
        plan = data.get("plan")
        selection = data.get("partition_selection")
        would_fit = data.get("would_fit")
        charge = data.get("charge")
        remaining = data.get("queries_remaining")
        target = data.get("accuracy_target")
        left_out = data.get("audit_left_out")
        return cls(
            columns=columns,
            rows=tuple(rows),
            accuracy=MappingProxyType(accuracy),
            privacy=Privacy.from_json(data.get("privacy") or data.get("cost")),
            budget=Budget.from_json(data.get("budget")),
            query_id=str(data["query_id"]) if data.get("query_id") is not None else None,
            cached=bool(data.get("cached", False)),
            dry_run=bool(data.get("dry_run", dry_run)),
            plan=_frozen(plan) if isinstance(plan, Mapping) else None,
            would_fit=would_fit if isinstance(would_fit, bool) else None,
            partition_selection=_frozen(selection) if isinstance(selection, Mapping) else None,
            charge=_frozen(charge) if isinstance(charge, Mapping) else None,
            queries_remaining=remaining
            if isinstance(remaining, int) and not isinstance(remaining, bool)
            else None,
            accuracy_target=_frozen(target) if isinstance(target, Mapping) else None,
            audit_left_out=_frozen(left_out) if isinstance(left_out, Mapping) else None,
            raw=_frozen({k: v for k, v in data.items() if k != "ok"}),
        )

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def cost(self) -> Privacy | None:
        """The privacy this answer cost (alias of ``privacy``)."""
        return self.privacy

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        names = self.column_names
        return [dict(zip(names, row, strict=True)) for row in self.rows]

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame``; cost and accuracy in ``df.attrs``.

        ``df.attrs["accuracy"]`` maps column → ``{"ci95_halfwidth", "stddev"}``, and for
        an AVG column also its per-row ``"ci95_intervals"`` and the ``"sum"`` and
        ``"count"`` it is the ratio of (see ``Accuracy``); ``df.attrs["privacy"]`` and
        ``df.attrs["budget"]`` are plain dicts.
        """
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - exercised only without pandas
            raise ImportError("to_pandas() needs pandas: pip install 'dpgate[pandas]'") from exc
        frame = pd.DataFrame.from_records(list(self.rows), columns=list(self.column_names))
        frame.attrs["accuracy"] = {name: a.to_dict() for name, a in self.accuracy.items()}
        frame.attrs["privacy"] = _plain(self.privacy)
        frame.attrs["budget"] = _plain(self.budget)
        frame.attrs["query_id"] = self.query_id
        frame.attrs["cached"] = self.cached
        return frame


def _plain(value: Privacy | Budget | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return {k: v for k, v in vars(value).items() if k != "raw"}


@dataclass(frozen=True)
class ColumnSchema:
    """One public column: its gateway type and what the admin declared public about it."""

    name: str
    type: str
    nullable: bool = True
    lower: float | None = None
    upper: float | None = None
    values: tuple[Any, ...] | None = None
    #: the condition on the table's other columns under which this one is NULL (and
    #: only then), as the admin declared it (``null_when``); None: not declared
    null_when: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ColumnSchema:
        values = data.get("values")
        nullable = data.get("nullable")
        null_when = data.get("null_when")
        return cls(
            name=str(data.get("name")),
            type=str(data.get("type") or "text"),
            nullable=True if nullable is None else bool(nullable),
            lower=_float(data.get("lower")),
            upper=_float(data.get("upper")),
            values=tuple(values)
            if isinstance(values, Sequence) and not isinstance(values, str)
            else None,
            null_when=null_when if isinstance(null_when, str) else None,
        )

    def describe(self) -> str | None:
        """A one-line comment for BI tools: the declared bounds, value domain and when the
        column is NULL."""
        parts = []
        if self.lower is not None or self.upper is not None:
            parts.append(f"clamped to [{self.lower}, {self.upper}]")
        if self.values is not None:
            parts.append("values: " + ", ".join(str(v) for v in self.values))
        if self.null_when is not None:
            parts.append(f"NULL exactly when {self.null_when}")
        return "; ".join(parts) or None


@dataclass(frozen=True)
class TableSchema:
    """One protected table as published: its columns and its privacy unit."""

    name: str
    columns: tuple[ColumnSchema, ...]
    schema: str | None = None
    privacy_unit: str | None = None
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableSchema:
        columns = data.get("columns") or []
        if isinstance(columns, Mapping):  # {"age": {...}} form
            columns = [
                {"name": k, **(v if isinstance(v, Mapping) else {})} for k, v in columns.items()
            ]
        unit = data.get("privacy_unit")
        return cls(
            name=str(data.get("name")),
            columns=tuple(ColumnSchema.from_json(c) for c in columns if isinstance(c, Mapping)),
            schema=str(data["schema"]) if data.get("schema") else None,
            privacy_unit=str(unit) if isinstance(unit, str) else None,
            raw=_frozen(data),
        )

    def column(self, name: str) -> ColumnSchema | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None


@dataclass(frozen=True)
class Schema:
    """The public metadata of every protected table the analyst may query."""

    tables: tuple[TableSchema, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Schema:
        tables = data.get("tables") or []
        if isinstance(tables, Mapping):  # {"patients": {...}} form
            tables = [
                {"name": k, **(v if isinstance(v, Mapping) else {})} for k, v in tables.items()
            ]
        return cls(tuple(TableSchema.from_json(t) for t in tables if isinstance(t, Mapping)))

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def table(self, name: str, schema: str | None = None) -> TableSchema | None:
        for t in self.tables:
            if t.name == name and (schema is None or t.schema in (None, schema)):
                return t
        return None
