"""Who may read which table: analysts' group memberships and the groups a table is granted
to, as the ledger stores them (schema v10).

The ledger keeps only the grants given through the admin API or CLI; the gateway adds
those of its config (``tables.<t>.grants``) and decides what a caller may read
(``gateway.pipeline.access``). Each change is an admin action, audit-logged in its own
transaction (``Ledger._record_admin``); a change is seen by the next request of every
gateway process sharing the ledger, since every check reads the ledger afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from budget import schema
from budget.prepared import Prepared

_members = schema.group_members
_grants = schema.table_grants

# Read on every request (the hot path): compiled once, run on the raw cursor.
GRANTS = Prepared(sa.select(_grants.c.table_name, _grants.c.group_name))
GROUPS_OF = Prepared(
    sa.select(_members.c.group_name).where(_members.c.analyst == sa.bindparam("analyst"))
)


@dataclass(frozen=True)
class StoredAccess:
    """The grants the ledger holds (table → groups) and one analyst's groups, read in one
    transaction."""

    grants: dict[str, frozenset[str]]
    groups: frozenset[str]


def read_grants(conn: Connection) -> dict[str, frozenset[str]]:
    """Every stored grant: table → the groups that may read it."""
    out: dict[str, set[str]] = {}
    for table, group in GRANTS.rows(conn):
        out.setdefault(str(table), set()).add(str(group))
    return {t: frozenset(g) for t, g in out.items()}


def read_access(conn: Connection, analyst: str | None, *, groups: bool = True) -> StoredAccess:
    """The stored grants and, when ``analyst`` is given, that analyst's groups — unless
    ``groups`` is false and no grant is stored (nothing they could be used for)."""
    grants = read_grants(conn)
    if analyst is None or not (groups or grants):
        return StoredAccess(grants, frozenset())
    return StoredAccess(
        grants, frozenset(str(g) for (g,) in GROUPS_OF.rows(conn, {"analyst": analyst}))
    )


def members(conn: Connection) -> dict[str, list[str]]:
    """Every group with stored members: group → analysts, by name."""
    out: dict[str, list[str]] = {}
    rows = conn.execute(
        sa.select(_members.c.group_name, _members.c.analyst).order_by(
            _members.c.group_name, _members.c.analyst
        )
    )
    for group, analyst in rows:
        out.setdefault(str(group), []).append(str(analyst))
    return out


def has_member(conn: Connection, group: str, analyst: str) -> bool:
    row = conn.execute(
        sa.select(_members.c.analyst).where(
            _members.c.group_name == group, _members.c.analyst == analyst
        )
    ).first()
    return row is not None


def has_grant(conn: Connection, table: str, group: str) -> bool:
    row = conn.execute(
        sa.select(_grants.c.group_name).where(
            _grants.c.table_name == table, _grants.c.group_name == group
        )
    ).first()
    return row is not None


__all__ = ["StoredAccess", "has_grant", "has_member", "members", "read_access", "read_grants"]
