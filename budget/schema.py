"""The ledger's tables and their migrations.

Every table is append-only except ``dpgate_analysts`` (budget totals and period, key hash,
disabled flag: configuration, not spending) and ``dpgate_global`` (the dataset-wide budget
an admin set, if any). What was spent is always derived from
``dpgate_ledger``: a ``charge`` row carries the cost, a ``refund`` row carries the same
cost negated, ``answered``/``withheld`` rows carry the outcome and cost nothing. The
unique ``settles`` column holds the reservation id on outcome rows (NULL on charges), so
a reservation gets at most one outcome.

``dpgate_schema_version`` has one row per applied migration; ``migrate`` applies the
missing ones in order, inside one transaction that holds the database's write lock
(SQLite ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock), so concurrent starts are safe.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

metadata = sa.MetaData()

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# The charge time of ledger rows appended by a dpgate older than schema v4 (see ledger).
FAR_FUTURE = "9999-12-31 00:00:00.000000"

schema_version = sa.Table(
    "dpgate_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", sa.DateTime, nullable=False),
)

analysts = sa.Table(
    "dpgate_analysts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(64), nullable=False, unique=True),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("epsilon", sa.Float, nullable=False),
    sa.Column("delta", sa.Float, nullable=False),
    sa.Column("disabled", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    # schema v4: none, day, week or month (budget/periods.py)
    sa.Column("period", sa.String(8), nullable=False, server_default="none"),
)

# One row (id = 1): what a charge locks when a global budget is configured, so charges of
# different analysts serialize against the dataset-wide budget. Since schema v4 it also
# holds the global budget an admin set (NULL epsilon: none set; the config's applies).
global_lock = sa.Table(
    "dpgate_global",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("epsilon", sa.Float, nullable=True),
    sa.Column("delta", sa.Float, nullable=True),
    sa.Column("period", sa.String(8), nullable=True),
    sa.Column("updated_at", sa.DateTime, nullable=True),
)

ledger = sa.Table(
    "dpgate_ledger",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("reservation_id", sa.String(32), nullable=False),
    sa.Column("settles", sa.String(32), nullable=True, unique=True),
    sa.Column("analyst_id", sa.Integer, sa.ForeignKey("dpgate_analysts.id"), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("epsilon", sa.Float, nullable=False),
    sa.Column("delta", sa.Float, nullable=False),
    sa.Column("rho", sa.Float, nullable=False),
    sa.Column("selection_delta", sa.Float, nullable=False),
    sa.Column("mechanism", sa.String(16), nullable=False),
    sa.Column("query_key", sa.Text, nullable=False),
    sa.Column("sql", sa.Text, nullable=False),
    sa.Column("data_version", sa.String(200), nullable=False),
    sa.Column("release", sa.Text, nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # schema v4: when the reservation's charge was made (a refund or an outcome row copies
    # its charge's): the budget period a cost belongs to. Written on every row; a row an
    # older dpgate appends gets the far-future default, which every period counts (the
    # safe side).
    sa.Column("charged_at", sa.DateTime, nullable=False, server_default=FAR_FUTURE),
    sa.CheckConstraint(
        "kind IN ('charge', 'answered', 'withheld', 'refund')", name="dpgate_ledger_kind"
    ),
    # Covering, in ledger order per analyst: a charge sums the rows after the analyst's
    # latest checkpoint from this index alone.
    sa.Index(
        "dpgate_ledger_analyst_seq",
        "analyst_id",
        "id",
        "kind",
        "rho",
        "epsilon",
        "delta",
        "selection_delta",
    ),
    sa.Index("dpgate_ledger_reservation", "reservation_id"),
    # schema v6: a release of one analyst is found by seeking all four columns. The
    # earlier (query_key, data_version, kind) made a cache miss read every analyst's
    # release of the same query text: the lookup grew with the ledger.
    sa.Index("dpgate_ledger_release", "query_key", "data_version", "kind", "analyst_id"),
    # schema v4, covering: a budget with a period sums the rows charged since its start.
    sa.Index(
        "dpgate_ledger_analyst_charged",
        "analyst_id",
        "charged_at",
        "kind",
        "mechanism",
        "rho",
        "epsilon",
        "delta",
        "selection_delta",
    ),
    sa.Index(
        "dpgate_ledger_charged",
        "charged_at",
        "kind",
        "mechanism",
        "rho",
        "epsilon",
        "delta",
        "selection_delta",
    ),
)

audit_log = sa.Table(
    "dpgate_audit_log",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("request_id", sa.String(64), nullable=False),
    sa.Column("analyst", sa.String(64), nullable=True),
    sa.Column("endpoint", sa.String(200), nullable=False),
    sa.Column("sql", sa.Text, nullable=True),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("error_code", sa.String(64), nullable=True),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # schema v8: who acted (an admin principal, the CLI's OS user or --actor, the analyst),
    # the admin action and its parameters (JSON; never a key), and the hash chain
    # (budget/audit_chain.py): position, previous row's hash, this row's hash.
    sa.Column("actor", sa.String(64), nullable=True),
    sa.Column("action", sa.String(64), nullable=True),
    sa.Column("params", sa.Text, nullable=True),
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("prev_hash", sa.String(64), nullable=True),
    sa.Column("hash", sa.String(64), nullable=True),
    sa.Index("dpgate_audit_log_time", "created_at"),
    sa.Index("dpgate_audit_log_analyst", "analyst", "created_at"),
    sa.Index("dpgate_audit_log_seq", "seq", unique=True),
)


def _partial_sums() -> list[sa.Column[Any]]:
    """A checkpoint's sums: the cost components and live charges of the rows it covers."""
    return [
        sa.Column("upto_id", sa.BigInteger, nullable=False),
        *(
            sa.Column(c, sa.Float, nullable=False)
            for c in ("epsilon", "delta", "rho", "selection_delta")
        ),
        sa.Column("charges", sa.Integer, nullable=False),
    ]


# Partial sums of one analyst's charge and refund rows up to ``upto_id`` (schema v2): a
# cache of what the ledger already says, written under the analyst's lock, so a charge
# sums only the rows after the latest checkpoint. Deleting them changes nothing but speed.
checkpoints = sa.Table(
    "dpgate_checkpoints",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("analyst_id", sa.Integer, sa.ForeignKey("dpgate_analysts.id"), nullable=False),
    *_partial_sums(),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # schema v4: the sums cover the rows charged at or after ``since`` (NULL: all rows),
    # and ``gaussian`` counts the live Gaussian charges among them (NULL: unknown).
    sa.Column("since", sa.DateTime, nullable=True),
    sa.Column("gaussian", sa.Integer, nullable=True),
    sa.Index("dpgate_checkpoints_analyst", "analyst_id", "id"),
)


# The same partial sums over every analyst's rows (schema v7), for the global budget: a
# charge under a global budget sums only the rows after the latest one. Written only by a
# transaction in which no other can be appending a cost-bearing row (budget/ledger.py,
# ``_spent_global``), so that no row can ever appear below ``upto_id`` afterwards.
global_checkpoints = sa.Table(
    "dpgate_global_checkpoints",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    *_partial_sums(),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("since", sa.DateTime, nullable=True),  # as in dpgate_checkpoints
    sa.Column("gaussian", sa.Integer, nullable=False),
    sa.Index("dpgate_global_checkpoints_since", "since", "id"),
)

# Audit refusals (schema v3), append-only: a query the auditor refused, so that the same
# request (same query_key) is refused again from here, free, without being recomputed,
# and the analyst's history can say why. ``reservation_id`` is set when the refusal came
# after execution (the charge stays; its outcome row is ``withheld``).
refusals = sa.Table(
    "dpgate_refusals",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("analyst_id", sa.Integer, sa.ForeignKey("dpgate_analysts.id"), nullable=False),
    sa.Column("query_key", sa.Text, nullable=False),
    sa.Column("sql", sa.Text, nullable=False),
    sa.Column("data_version", sa.String(200), nullable=False),
    sa.Column("reservation_id", sa.String(32), nullable=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("combined_with", sa.Text, nullable=False),  # JSON list of query ids
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Index("dpgate_refusals_query", "analyst_id", "query_key", "data_version"),
    sa.Index("dpgate_refusals_analyst", "analyst_id", "id"),
)


# SCRAM-SHA-256 verifiers of the analysts' API keys (schema v5), for the PostgreSQL
# front end: made with the key (create, rotate), replaced when it is rotated. Keys made
# before this table existed have none: such an analyst rotates the key to log in over
# the PostgreSQL protocol (docs/connect.md). Configuration, like the key hash.
scram_verifiers = sa.Table(
    "dpgate_scram_verifiers",
    metadata,
    sa.Column(
        "analyst_id",
        sa.Integer,
        sa.ForeignKey("dpgate_analysts.id"),
        primary_key=True,
        autoincrement=False,
    ),
    sa.Column("salt", sa.String(64), nullable=False),  # base64
    sa.Column("iterations", sa.Integer, nullable=False),
    sa.Column("stored_key", sa.String(64), nullable=False),  # base64
    sa.Column("server_key", sa.String(64), nullable=False),  # base64
    sa.Column("created_at", sa.DateTime, nullable=False),
)


# Named admin principals (schema v9), each with its own key (stored as its hash, as an
# analyst's) and a role: ``admin`` (everything) or ``auditor`` (read the audit log,
# budgets and spend; change nothing). DPGATE_ADMIN_KEY stays the bootstrap admin.
admins = sa.Table(
    "dpgate_admins",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(64), nullable=False, unique=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("disabled", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    sa.CheckConstraint("role IN ('admin', 'auditor')", name="dpgate_admins_role"),
)


# Access (schema v10): which groups an analyst belongs to, and which groups may read a
# table (grants given through the admin API or CLI; those of the config are added to them
# by the gateway, never stored). Configuration, not spending: rows are added and removed,
# and each change is an audit-logged admin action.
group_members = sa.Table(
    "dpgate_group_members",
    metadata,
    sa.Column("group_name", sa.String(64), primary_key=True),
    sa.Column("analyst", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Index("dpgate_group_members_analyst", "analyst"),
)

table_grants = sa.Table(
    "dpgate_table_grants",
    metadata,
    sa.Column("table_name", sa.String(128), primary_key=True),
    sa.Column("group_name", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
)


def utcnow() -> datetime:
    """Now, as the naive UTC datetime every table stores."""
    return datetime.now(UTC).replace(tzinfo=None)


def as_utc(value: datetime) -> datetime:
    """A stored naive-UTC datetime, made timezone-aware."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _create_ledger_indexes(conn: Connection, *names: str) -> None:
    """Create the ledger table's indexes of these names, as the table declares them
    today (those that exist already are left alone)."""
    for index in ledger.indexes:
        if index.name in names:
            index.create(conn, checkfirst=True)


def _v1_initial(conn: Connection) -> None:
    for table in (analysts, global_lock, ledger, audit_log):
        table.create(conn, checkfirst=True)
    conn.execute(sa.insert(global_lock).values(id=1))


def _v2_checkpoints(conn: Connection) -> None:
    # v1 indexed (analyst_id, kind, …); summing from a checkpoint needs (analyst_id, id, …).
    conn.exec_driver_sql("DROP INDEX IF EXISTS dpgate_ledger_analyst")
    _create_ledger_indexes(conn, "dpgate_ledger_analyst_seq")
    checkpoints.create(conn, checkfirst=True)


def _v3_refusals(conn: Connection) -> None:
    refusals.create(conn, checkfirst=True)


def _add_missing_columns(conn: Connection, table: sa.Table, names: tuple[str, ...]) -> None:
    """ALTER TABLE … ADD COLUMN for each of ``names`` the table lacks (a database created
    by an earlier migration from today's table definitions already has them)."""
    present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    for name in names:
        if name in present:
            continue
        column = table.c[name]
        ddl = f"ALTER TABLE {table.name} ADD COLUMN {name} {column.type.compile(conn.dialect)}"
        if column.server_default is not None:
            ddl += f" NOT NULL DEFAULT '{column.server_default.arg}'"  # type: ignore[attr-defined]
        conn.exec_driver_sql(ddl)


def _v4_periods(conn: Connection) -> None:
    # Budget periods (analysts, global budget), the global budget set by an admin, the
    # charge time of every ledger row, and period-aware checkpoints with a Gaussian count.
    _add_missing_columns(conn, analysts, ("period",))
    _add_missing_columns(conn, global_lock, ("epsilon", "delta", "period", "updated_at"))
    _add_missing_columns(conn, ledger, ("charged_at",))
    _add_missing_columns(conn, checkpoints, ("since", "gaussian"))
    charge = ledger.alias("c")
    charged = (
        sa.select(charge.c.created_at)
        .where(charge.c.reservation_id == ledger.c.reservation_id, charge.c.kind == "charge")
        .limit(1)
        .scalar_subquery()
    )
    conn.execute(
        sa.update(ledger).values(charged_at=sa.func.coalesce(charged, ledger.c.created_at))
    )
    # The earlier checkpoints carry no Gaussian count: they are a cache, so drop them.
    conn.execute(sa.delete(checkpoints))
    _create_ledger_indexes(conn, "dpgate_ledger_analyst_charged", "dpgate_ledger_charged")


def _v5_scram_verifiers(conn: Connection) -> None:
    # Independent of every earlier migration but the first (dpgate_analysts): it is the
    # fifth, after v4 (budgets), and creates only its own table.
    scram_verifiers.create(conn, checkfirst=True)


def _v6_release_index(conn: Connection) -> None:
    # The cache lookup's index gains analyst_id (see the ledger table).
    conn.exec_driver_sql("DROP INDEX IF EXISTS dpgate_ledger_query")
    _create_ledger_indexes(conn, "dpgate_ledger_release")


def _v7_global_checkpoints(conn: Connection) -> None:
    global_checkpoints.create(conn, checkfirst=True)


def _v8_audit_chain(conn: Connection) -> None:
    # Actor, action and parameters on every audit row, and the hash chain over them: the
    # rows written before it are chained here, in id order (budget/audit_chain.py).
    from budget import audit_chain

    _add_missing_columns(conn, audit_log, ("actor", "action", "params", "seq", "prev_hash", "hash"))
    for index in audit_log.indexes:
        if index.name == "dpgate_audit_log_seq":
            index.create(conn, checkfirst=True)
    audit_chain.chain_existing(conn)


def _v9_admins(conn: Connection) -> None:
    admins.create(conn, checkfirst=True)


def _v10_access(conn: Connection) -> None:
    group_members.create(conn, checkfirst=True)
    table_grants.create(conn, checkfirst=True)


# Append new migrations here; never edit an applied one.
MIGRATIONS: tuple[Callable[[Connection], None], ...] = (
    _v1_initial,
    _v2_checkpoints,
    _v3_refusals,
    _v4_periods,
    _v5_scram_verifiers,
    _v6_release_index,
    _v7_global_checkpoints,
    _v8_audit_chain,
    _v9_admins,
    _v10_access,
)
SCHEMA_VERSION = len(MIGRATIONS)

_PG_MIGRATION_LOCK = 0x64706761  # "dpga": serializes concurrent migrate() on PostgreSQL


class SchemaTooNew(RuntimeError):
    """The ledger database was migrated by a newer dpgate than this one."""


def migrate(conn: Connection) -> int:
    """Apply the missing migrations inside the caller's write transaction; the new version."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
    schema_version.create(conn, checkfirst=True)
    current = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar() or 0
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the ledger schema is at version {current}; this dpgate knows up to "
            f"{SCHEMA_VERSION}: upgrade dpgate"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version - 1](conn)
        conn.execute(sa.insert(schema_version).values(version=version, applied_at=utcnow()))
    return SCHEMA_VERSION
