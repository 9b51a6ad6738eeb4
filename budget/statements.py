"""The statements of the ledger's hot path, built once.

Those a request runs (``HOT_*``) are ``Prepared``: compiled once per dialect and run on
the driver's cursor (``budget/prepared.py``); the others go through SQLAlchemy, which
caches their compiled form. Every value is a bound parameter.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from budget import schema
from budget.prepared import Prepared

t_analysts = schema.analysts
t_ledger = schema.ledger

_c = t_ledger.c
ANALYST = sa.select(t_analysts).where(t_analysts.c.name == sa.bindparam("name"))
ANALYST_FOR_UPDATE = ANALYST.with_for_update()
ANALYST_BY_KEY = sa.select(t_analysts).where(t_analysts.c.key_hash == sa.bindparam("key_hash"))
# What a request reads of its analyst (no DateTime column: see budget/prepared.py).
_a = t_analysts.c
_BUDGET_COLUMNS = (_a.id, _a.name, _a.disabled, _a.epsilon, _a.delta, _a.period)
HOT_ANALYST_BY_KEY = Prepared(
    sa.select(*_BUDGET_COLUMNS).where(_a.key_hash == sa.bindparam("key_hash"))
)
HOT_ANALYST_BY_NAME = Prepared(sa.select(*_BUDGET_COLUMNS).where(_a.name == sa.bindparam("name")))
HOT_ANALYST_FOR_UPDATE = Prepared(
    sa.select(*_BUDGET_COLUMNS).where(_a.name == sa.bindparam("name")).with_for_update()
)

# Live charges: a charge row counts +1, its refund row −1 (costs: refunds are negated).
_LIVE = sa.case((_c.kind == "charge", 1), else_=-1)
_GAUSSIAN = sa.case((_c.mechanism == "gaussian", _LIVE), else_=0)
_COST_ROW = sa.or_(_c.kind == "charge", _c.kind == "refund")  # no expanding IN: Prepared
# Rows of the current budget period: charged at or after ``since``.
_IN_PERIOD = _c.charged_at >= sa.bindparam("since")


def _sums() -> list[sa.ColumnElement[object]]:
    return [
        sa.func.coalesce(sa.func.sum(_c.epsilon), 0.0).label("epsilon"),
        sa.func.coalesce(sa.func.sum(_c.delta), 0.0).label("delta"),
        sa.func.coalesce(sa.func.sum(_c.rho), 0.0).label("rho"),
        sa.func.coalesce(sa.func.sum(_c.selection_delta), 0.0).label("selection_delta"),
        sa.func.coalesce(sa.func.sum(_LIVE), 0).label("n"),
        sa.func.coalesce(sa.func.sum(_GAUSSIAN), 0).label("gaussian"),
    ]


# Every cost-bearing row, all time or in one period, no checkpoint: for recomputing a sum
# from the raw rows (``Ledger.recompute_spent``).
SPENT_ALL = sa.select(*_sums()).where(_COST_ROW)
SPENT_ALL_SINCE = SPENT_ALL.where(_IN_PERIOD)
_cp = schema.checkpoints


def _spent_after_checkpoint(cp: sa.Table, *, per_analyst: bool, period: bool) -> sa.Select[Any]:
    """Σ of the rows after the latest checkpoint of ``cp`` (of the same period start), and
    that checkpoint, in one statement (so both come from one snapshot): one analyst's
    rows (``dpgate_checkpoints``), or every analyst's (``dpgate_global_checkpoints``)."""
    since = cp.c.since == sa.bindparam("since") if period else cp.c.since.is_(None)
    mine = [cp.c.analyst_id == sa.bindparam("analyst_id")] if per_analyst else []
    my_rows = [_c.analyst_id == sa.bindparam("analyst_id")] if per_analyst else []
    latest = sa.select(cp).where(*mine, since).order_by(cp.c.id.desc()).limit(1).subquery("cp")
    rows = sa.select(
        *_sums(),
        sa.func.count(_c.id).label("rows"),
        sa.func.max(_c.id).label("max_id"),
    ).where(
        _COST_ROW,
        *my_rows,
        _c.id > sa.func.coalesce(sa.select(latest.c.upto_id).scalar_subquery(), sa.literal(0)),
    )
    if period:
        rows = rows.where(_IN_PERIOD)
    after = rows.subquery("since")
    return sa.select(
        after,
        latest.c.upto_id.label("cp_upto"),
        latest.c.epsilon.label("cp_epsilon"),
        latest.c.delta.label("cp_delta"),
        latest.c.rho.label("cp_rho"),
        latest.c.selection_delta.label("cp_selection_delta"),
        latest.c.charges.label("cp_charges"),
        latest.c.gaussian.label("cp_gaussian"),
        latest.c.id.label("cp_id"),
    ).select_from(after.outerjoin(latest, sa.true()))


SPENT_ANALYST = Prepared(_spent_after_checkpoint(_cp, per_analyst=True, period=False))
SPENT_ANALYST_SINCE = Prepared(_spent_after_checkpoint(_cp, per_analyst=True, period=True))
_gcp = schema.global_checkpoints
SPENT_GLOBAL = Prepared(_spent_after_checkpoint(_gcp, per_analyst=False, period=False))
SPENT_GLOBAL_SINCE = Prepared(_spent_after_checkpoint(_gcp, per_analyst=False, period=True))
INSERT_GLOBAL_CHECKPOINT = sa.insert(_gcp)
# PostgreSQL numbers ledger rows from a sequence, so a row can commit below one already
# visible. Every cost-bearing row is therefore appended holding this advisory lock shared
# (a refund: COST_ROWS_SHARED first; a charge: INSERT_ENTRY_SHARED), and a global
# checkpoint is written only by a transaction that took it exclusively
# (COST_ROWS_EXCLUSIVE, never waited for) before summing: no row it did not see can then
# get an id below the ones it saw. (SQLite's write lock gives the same.)
COST_ROWS_LOCK = 0x64706763  # "dpgc"
_COST_ROWS_KEY = sa.literal(COST_ROWS_LOCK, sa.BigInteger)
COST_ROWS_SHARED = Prepared(sa.select(sa.func.pg_advisory_xact_lock_shared(_COST_ROWS_KEY)))
COST_ROWS_EXCLUSIVE = Prepared(
    sa.select(sa.func.pg_try_advisory_xact_lock(_COST_ROWS_KEY).label("got"))
)
INSERT_CHECKPOINT = sa.insert(_cp)
# A refund locks its analyst like a charge does: every cost-bearing row of an analyst is
# then appended under that analyst's lock, which is what makes checkpoints exact.
LOCK_ANALYST_OF_RESERVATION = (
    sa.select(t_analysts.c.id)
    .where(
        t_analysts.c.id
        == sa.select(_c.analyst_id)
        .where(_c.reservation_id == sa.bindparam("rid"), _c.kind == "charge")
        .scalar_subquery()
    )
    .with_for_update()
)
_g = schema.global_lock.c
_GLOBAL = sa.select(_g.epsilon, _g.delta, _g.period).where(_g.id == 1)
GLOBAL_BUDGET = Prepared(_GLOBAL)
LOCK_GLOBAL = Prepared(_GLOBAL.with_for_update())
# A charge's first read, under the write lock: the analyst (locked) and whether an admin
# set a global budget, in one statement (one statement fewer under SQLite's write lock).
HOT_CHARGE_ANALYST = Prepared(
    sa.select(
        *_BUDGET_COLUMNS,
        *(
            sa.select(column).where(_g.id == 1).scalar_subquery().label(f"global_{column.name}")
            for column in (_g.epsilon, _g.delta, _g.period)
        ),
    )
    .where(_a.name == sa.bindparam("name"))
    .with_for_update(of=t_analysts)
)
_ENTRY_COLUMNS = [
    "reservation_id",
    "settles",
    "analyst_id",
    "kind",
    "epsilon",
    "delta",
    "rho",
    "selection_delta",
    "mechanism",
    "query_key",
    "sql",
    "data_version",
    "release",
    "reason",
    "created_at",
    "charged_at",
]
INSERT_ENTRY = Prepared(
    sa.insert(t_ledger).values({name: sa.bindparam(name) for name in _ENTRY_COLUMNS})
)
# PostgreSQL: the same row, appended holding the cost-rows lock shared, in one statement
# (a statement of its own cost a charge 0.2 ms). The row is built from the lock's one-row
# subquery, so the lock is held before the row takes its id; PostgreSQL neither flattens
# nor prunes a subquery output that calls a volatile function.
INSERT_ENTRY_SHARED = Prepared(
    sa.insert(t_ledger).from_select(
        _ENTRY_COLUMNS,
        sa.select(
            *(sa.bindparam(name, type_=t_ledger.c[name].type) for name in _ENTRY_COLUMNS)
        ).select_from(
            sa.select(sa.func.pg_advisory_xact_lock_shared(_COST_ROWS_KEY).label("held")).subquery(
                "cost_rows_lock"
            )
        ),
    )
)
# An outcome row copies its charge's identity; a refund also negates its cost (sign −1).
SETTLE = Prepared(
    sa.insert(t_ledger).from_select(
        _ENTRY_COLUMNS,
        sa.select(
            _c.reservation_id,
            _c.reservation_id,
            _c.analyst_id,
            sa.bindparam("kind", type_=sa.String),
            _c.epsilon * sa.bindparam("sign", type_=sa.Float),
            _c.delta * sa.bindparam("sign", type_=sa.Float),
            _c.rho * sa.bindparam("sign", type_=sa.Float),
            _c.selection_delta * sa.bindparam("sign", type_=sa.Float),
            _c.mechanism,
            _c.query_key,
            _c.sql,
            _c.data_version,
            sa.bindparam("release", type_=sa.Text),
            sa.bindparam("reason", type_=sa.Text),
            sa.bindparam("now", type_=sa.DateTime),
            _c.created_at,
        ).where(_c.reservation_id == sa.bindparam("rid"), _c.kind == "charge"),
    )
)
_REQUEST_COLUMNS = (
    "request_id",
    "analyst",
    "endpoint",
    "sql",
    "outcome",
    "error_code",
    "status",
    "created_at",
    "actor",
    "action",
    "params",
    "seq",
    "prev_hash",
    "hash",
)
INSERT_REQUEST = Prepared(
    sa.insert(schema.audit_log).values({name: sa.bindparam(name) for name in _REQUEST_COLUMNS})
)
