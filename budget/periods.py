"""Budget periods: a budget that renews at the start of every day, week or month (UTC).

A budget with a period counts only the charges made since the start of the current
period; at the period's end it is whole again. Nothing is deleted: the ledger keeps every
charge, and a budget without a period (``none``, the default) counts them all.

Periods are calendar periods in UTC, as Snowflake's ``BUDGET_WINDOW`` and AWS Clean
Rooms' monthly refresh are:

- ``day``: from 00:00 UTC to the next 00:00 UTC;
- ``week``: from Monday 00:00 UTC to the next Monday 00:00 UTC (ISO weeks);
- ``month``: from the 1st 00:00 UTC to the 1st of the next month 00:00 UTC.

Times are the naive UTC datetimes the ledger stores (``budget.schema.utcnow``).

Privacy: each period is a fresh privacy filter over the same people. Over k periods the
interaction is (k·ε, k·δ)-DP (basic composition of the periods), so the total privacy
loss grows with every period (docs/accounting.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal, get_args

Period = Literal["none", "day", "week", "month"]
PERIODS: tuple[str, ...] = get_args(Period)

# Where "since the start of the period" begins for a budget without a period: before any
# charge the ledger can hold (stored times are naive UTC).
ALL_TIME = datetime(1970, 1, 1)


def check_period(value: object) -> Period:
    """``value`` as a ``Period``, or ``ValueError`` naming the choices."""
    if value not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)} (got {value!r})")
    return value  # type: ignore[return-value]


def period_start(period: Period, now: datetime) -> datetime:
    """The start of the period containing ``now`` (``ALL_TIME`` for ``none``)."""
    if period == "none":
        return ALL_TIME
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return midnight
    if period == "week":
        return midnight - timedelta(days=midnight.weekday())
    if period == "month":
        return midnight.replace(day=1)
    raise ValueError(f"unknown period {period!r}")


def period_end(period: Period, now: datetime) -> datetime | None:
    """When the period containing ``now`` ends and the budget renews (``None``: never)."""
    if period == "none":
        return None
    start = period_start(period, now)
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)
