"""The ledger's principals: analysts (keys, budgets, periods), named admins, group
memberships and table grants, and the dataset-wide budget (``Ledger``'s methods).

A mixin of ``budget.ledger.Ledger``: it runs on ``LedgerCore``'s transactions and sums.
"""

from __future__ import annotations

import base64
import math
import re
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from budget import audit_chain, grants, reads, schema
from budget import statements as st
from budget.errors import (
    AnalystExists,
    UnknownAnalyst,
)
from budget.journal import _audit_row
from budget.keys import ScramVerifier, key_hash, new_api_key, scram_verifier
from budget.periods import Period, check_period, period_start
from budget.records import (
    ADMIN_ROLES,
    AdminCaller,
    AdminPrincipal,
    AdminRole,
    Analyst,
    BudgetStatus,
    CacheProbe,
    Lookup,
)

if TYPE_CHECKING:  # the base the methods run on (budget/ledger.py)
    from budget.ledger import LedgerCore

    _Base = LedgerCore
else:
    _Base = object

GLOBAL_NAME = "(global)"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")

t_analysts = schema.analysts


def _check_budget(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError("epsilon must be a finite number >= 0")
    if not (math.isfinite(delta) and 0 <= delta < 1):
        raise ValueError("delta must be a number in [0, 1)")


def _store_verifier(conn: Connection, analyst_id: int, verifier: ScramVerifier) -> None:
    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    conn.execute(
        sa.insert(schema.scram_verifiers).values(
            analyst_id=analyst_id,
            salt=b64(verifier.salt),
            iterations=verifier.iterations,
            stored_key=b64(verifier.stored_key),
            server_key=b64(verifier.server_key),
            created_at=schema.utcnow(),
        )
    )


def _period_of(row: Any) -> Period:
    return check_period(row.period or "none")


class Principals(_Base):
    """Analysts, admins, groups and grants, and the budgets they are held to."""

    def create_analyst(
        self,
        name: str,
        epsilon: float,
        delta: float,
        period: Period = "none",
        *,
        caller: AdminCaller | None = None,
    ) -> str:
        """Create an analyst with budget (ε, δ), renewed every ``period`` (``none``:
        never); returns their API key (shown only once). ``caller``: the admin change is
        audit-logged (``analyst.create``) in the same transaction."""
        if not _NAME.match(name):
            raise ValueError(
                "an analyst name is 1-64 letters, digits, '_', '.', '@' or '-', "
                "starting with a letter or digit"
            )
        _check_budget(epsilon, delta)
        check_period(period)
        key = new_api_key()
        now = self._now()
        try:
            with self._transaction(write=True) as conn:
                exists = conn.execute(
                    sa.select(t_analysts.c.id).where(t_analysts.c.name == name)
                ).first()
                if exists is not None:
                    raise AnalystExists(f"an analyst named {name!r} already exists")
                inserted = conn.execute(
                    sa.insert(t_analysts).values(
                        name=name,
                        key_hash=key_hash(key),
                        epsilon=float(epsilon),
                        delta=float(delta),
                        period=period,
                        disabled=False,
                        created_at=now,
                        updated_at=now,
                    )
                ).inserted_primary_key
                assert inserted is not None
                _store_verifier(conn, int(inserted[0]), scram_verifier(key))
                self._record_admin(
                    conn,
                    caller,
                    "analyst.create",
                    {"name": name, "epsilon": epsilon, "delta": delta, "period": period},
                )
        except sa.exc.IntegrityError as exc:  # a concurrent create won the race
            raise AnalystExists(f"an analyst named {name!r} already exists") from exc
        return key

    def ensure_analyst(
        self, name: str, epsilon: float, delta: float, period: Period = "none"
    ) -> str | None:
        """Create the analyst unless one of that name exists (config bootstrap).

        Returns the new key if created, ``None`` if the analyst already existed (the
        ledger, not the config, is the source of truth: an existing budget is kept).
        """
        try:
            return self.create_analyst(name, epsilon, delta, period)
        except AnalystExists:
            return None

    def authenticate(self, key: str) -> Analyst | None:
        """The analyst holding this API key (possibly disabled), or ``None``."""
        if not key or len(key) > 256:
            return None
        with self._transaction(write=False) as conn:
            row = conn.execute(st.ANALYST_BY_KEY, {"key_hash": key_hash(key)}).first()
        if row is None:
            return None
        return Analyst(row.name, bool(row.disabled), row.epsilon, row.delta, _period_of(row))

    def lookup(
        self,
        key: str | None,
        probe: CacheProbe | None = None,
        *,
        access: bool = False,
        groups: bool = True,
        name: str | None = None,
    ) -> Lookup:
        """Authenticate ``key`` (or, for a caller already authenticated elsewhere — a
        verified token — find the analyst ``name``) and, for its analyst, find the release
        ``probe`` names and the analyst's budget; with ``access``, also the stored grants
        and the analyst's groups (``budget.grants``; without ``groups``, only when some
        grant is stored) — in one read transaction (a request's only read)."""
        if name is None and (not key or len(key) > 256):
            return Lookup(None)
        if probe is not None:
            self._await_outcome(probe.query_key)
        now = self._now()
        with self._transaction(write=False) as conn:
            if name is not None:
                row = st.HOT_ANALYST_BY_NAME.first(conn, {"name": name})
            else:
                row = st.HOT_ANALYST_BY_KEY.first(conn, {"key_hash": key_hash(key or "")})
            if row is None:
                return Lookup(None)
            analyst = Analyst(row.name, bool(row.disabled), row.epsilon, row.delta, _period_of(row))
            stored = grants.read_access(conn, row.name, groups=groups) if access else None
            if probe is None or analyst.disabled:
                return Lookup(analyst, access=stored)
            release = reads.find_release(
                conn, probe.query_key, None if probe.any_analyst else row.name, probe.data_version
            )
            if release is None:
                return Lookup(analyst, access=stored)
            return Lookup(analyst, release, self._row_status(conn, row, now), stored)

    def rotate_key(self, name: str, *, caller: AdminCaller | None = None) -> str:
        """Replace the analyst's API key; returns the new key (the old one stops working).
        ``caller``: audit-logged (``key.rotate``; the key is not) in the same transaction."""
        key = new_api_key()
        verifier = scram_verifier(key)
        with self._transaction(write=True) as conn:
            row = self._analyst_row(conn, name, lock=True)
            conn.execute(
                sa.update(t_analysts)
                .where(t_analysts.c.name == name)
                .values(key_hash=key_hash(key), updated_at=self._now())
            )
            conn.execute(
                sa.delete(schema.scram_verifiers).where(
                    schema.scram_verifiers.c.analyst_id == row.id
                )
            )
            _store_verifier(conn, row.id, verifier)
            self._record_admin(conn, caller, "key.rotate", {"name": name})
        return key

    def create_admin(self, name: str, role: AdminRole, *, caller: AdminCaller | None = None) -> str:
        """Create a named admin with ``role`` (``admin`` or ``auditor``); returns their key
        (shown once; only its hash is kept). ``admin`` is the bootstrap admin's name
        (``DPGATE_ADMIN_KEY``) and cannot be taken. Audit-logged as ``admin.create``."""
        if not _NAME.match(name) or name == "admin":
            raise ValueError(
                "an admin name is 1-64 letters, digits, '_', '.', '@' or '-', starting "
                "with a letter or digit, and not 'admin' (the bootstrap admin)"
            )
        if role not in ADMIN_ROLES:
            raise ValueError(f"role must be one of {', '.join(ADMIN_ROLES)}")
        key = new_api_key()
        now = self._now()
        t = schema.admins
        try:
            with self._transaction(write=True) as conn:
                if conn.execute(sa.select(t.c.id).where(t.c.name == name)).first():
                    raise AnalystExists(f"an admin named {name!r} already exists")
                conn.execute(
                    sa.insert(t).values(
                        name=name,
                        role=role,
                        key_hash=key_hash(key),
                        disabled=False,
                        created_at=now,
                        updated_at=now,
                    )
                )
                self._record_admin(conn, caller, "admin.create", {"name": name, "role": role})
        except sa.exc.IntegrityError as exc:
            raise AnalystExists(f"an admin named {name!r} already exists") from exc
        return key

    def update_admin(
        self,
        name: str,
        *,
        role: AdminRole | None = None,
        disabled: bool | None = None,
        caller: AdminCaller | None = None,
    ) -> AdminPrincipal:
        """Change a named admin's role or disable / enable them (``admin.update``)."""
        if role is not None and role not in ADMIN_ROLES:
            raise ValueError(f"role must be one of {', '.join(ADMIN_ROLES)}")
        t = schema.admins
        with self._transaction(write=True) as conn:
            row = conn.execute(sa.select(t).where(t.c.name == name)).first()
            if row is None:
                raise UnknownAnalyst(f"no admin named {name!r}")
            new_role = row.role if role is None else role
            new_disabled = bool(row.disabled) if disabled is None else bool(disabled)
            conn.execute(
                sa.update(t)
                .where(t.c.id == row.id)
                .values(role=new_role, disabled=new_disabled, updated_at=self._now())
            )
            given = {"role": role, "disabled": disabled}
            changed = {k: v for k, v in given.items() if v is not None}
            self._record_admin(conn, caller, "admin.update", {"name": name, **changed})
        return AdminPrincipal(name, new_role, new_disabled)

    def admin_by_key(self, key: str) -> AdminPrincipal | None:
        """The named admin holding this key (possibly disabled), or ``None``."""
        if not key or len(key) > 256:
            return None
        t = schema.admins
        with self._transaction(write=False) as conn:
            row = conn.execute(sa.select(t).where(t.c.key_hash == key_hash(key))).first()
        return None if row is None else AdminPrincipal(row.name, row.role, bool(row.disabled))

    def list_admins(self) -> list[AdminPrincipal]:
        """Every named admin, by name."""
        t = schema.admins
        with self._transaction(write=False) as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.name)).all()
        return [AdminPrincipal(r.name, r.role, bool(r.disabled)) for r in rows]

    def access(self, analyst: str | None = None) -> grants.StoredAccess:
        """The stored table grants and ``analyst``'s groups, in one read."""
        with self._transaction(write=False) as conn:
            return grants.read_access(conn, analyst)

    def group_members(self) -> dict[str, list[str]]:
        """Every group with members: group → analysts."""
        with self._transaction(write=False) as conn:
            return grants.members(conn)

    def add_member(self, group: str, analyst: str, *, caller: AdminCaller | None = None) -> None:
        """Put an existing analyst in ``group`` (``group.add_member``); ``AnalystExists``
        if they are in it already."""
        if not _NAME.match(group):
            raise ValueError(
                "a group name is 1-64 letters, digits, '_', '.', '@' or '-', starting with "
                "a letter or digit"
            )
        with self._transaction(write=True) as conn:
            self._analyst_row(conn, analyst)
            if grants.has_member(conn, group, analyst):
                raise AnalystExists(f"analyst {analyst!r} is in group {group!r} already")
            conn.execute(
                sa.insert(schema.group_members).values(
                    group_name=group, analyst=analyst, created_at=self._now()
                )
            )
            self._record_admin(
                conn, caller, "group.add_member", {"group": group, "analyst": analyst}
            )

    def remove_member(self, group: str, analyst: str, *, caller: AdminCaller | None = None) -> None:
        """Take ``analyst`` out of ``group`` (``group.remove_member``)."""
        t = schema.group_members
        with self._transaction(write=True) as conn:
            if not grants.has_member(conn, group, analyst):
                raise UnknownAnalyst(f"analyst {analyst!r} is not in group {group!r}")
            conn.execute(sa.delete(t).where(t.c.group_name == group, t.c.analyst == analyst))
            self._record_admin(
                conn, caller, "group.remove_member", {"group": group, "analyst": analyst}
            )

    def grant(self, table: str, group: str, *, caller: AdminCaller | None = None) -> None:
        """Let ``group`` read ``table`` (``grant.add``); ``AnalystExists`` if it may
        already. The table's name is the gateway's to check."""
        if not _NAME.match(group):
            raise ValueError(
                "a group name is 1-64 letters, digits, '_', '.', '@' or '-', starting with "
                "a letter or digit"
            )
        with self._transaction(write=True) as conn:
            if grants.has_grant(conn, table, group):
                raise AnalystExists(f"table {table!r} is granted to {group!r} already")
            conn.execute(
                sa.insert(schema.table_grants).values(
                    table_name=table, group_name=group, created_at=self._now()
                )
            )
            self._record_admin(conn, caller, "grant.add", {"table": table, "group": group})

    def revoke(self, table: str, group: str, *, caller: AdminCaller | None = None) -> None:
        """Take back ``group``'s grant on ``table`` (``grant.remove``)."""
        t = schema.table_grants
        with self._transaction(write=True) as conn:
            if not grants.has_grant(conn, table, group):
                raise UnknownAnalyst(f"table {table!r} is not granted to {group!r}")
            conn.execute(sa.delete(t).where(t.c.table_name == table, t.c.group_name == group))
            self._record_admin(conn, caller, "grant.remove", {"table": table, "group": group})

    def scram_login(self, name: str) -> tuple[Analyst, ScramVerifier] | None:
        """The analyst named ``name`` and their key's SCRAM-SHA-256 verifier, or ``None``
        when there is no such analyst or their key predates verifiers (rotate it)."""
        if not _NAME.match(name):
            return None
        v = schema.scram_verifiers
        with self._transaction(write=False) as conn:
            row = conn.execute(
                sa.select(t_analysts, v.c.salt, v.c.iterations, v.c.stored_key, v.c.server_key)
                .join(v, v.c.analyst_id == t_analysts.c.id)
                .where(t_analysts.c.name == name)
            ).first()
        if row is None:
            return None
        verifier = ScramVerifier(
            salt=base64.b64decode(row.salt),
            iterations=int(row.iterations),
            stored_key=base64.b64decode(row.stored_key),
            server_key=base64.b64decode(row.server_key),
        )
        return Analyst(row.name, bool(row.disabled), row.epsilon, row.delta), verifier

    def update_analyst(
        self,
        name: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        disabled: bool | None = None,
        period: Period | None = None,
        caller: AdminCaller | None = None,
    ) -> BudgetStatus:
        """Change an analyst's budget totals, period or disabled flag; the new status.
        ``caller``: audit-logged in the same transaction (``analyst.disable``,
        ``analyst.enable``, ``budget.set``, or ``analyst.update`` for several at once).

        Lowering a budget below what is spent is allowed: nothing more is admitted. A new
        period counts the charges made since the start of the current one.
        """
        with self._transaction(write=True) as conn:
            row = self._analyst_row(conn, name, lock=True)
            new_eps = row.epsilon if epsilon is None else float(epsilon)
            new_delta = row.delta if delta is None else float(delta)
            _check_budget(new_eps, new_delta)
            new_period = _period_of(row) if period is None else check_period(period)
            new_disabled = bool(row.disabled) if disabled is None else bool(disabled)
            now = self._now()
            conn.execute(
                sa.update(t_analysts)
                .where(t_analysts.c.id == row.id)
                .values(
                    epsilon=new_eps,
                    delta=new_delta,
                    period=new_period,
                    disabled=new_disabled,
                    updated_at=now,
                )
            )
            spent, n = self._spent(conn, row.id, since=period_start(new_period, now))
            given = {"epsilon": epsilon, "delta": delta, "period": period}
            changed: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
            if disabled is None:
                action = "budget.set"
            elif changed:
                action = "analyst.update"
            else:
                action = "analyst.disable" if disabled else "analyst.enable"
            if disabled is not None:
                changed["disabled"] = disabled
            self._record_admin(conn, caller, action, {"name": name, **changed})
        return self._status(name, new_disabled, new_eps, new_delta, new_period, spent, n, now)

    def budget_status(self, name: str) -> BudgetStatus:
        """The analyst's budget, in their current period, as the accountant reports it."""
        now = self._now()
        with self._transaction(write=False) as conn:
            return self._row_status(conn, self._analyst_row(conn, name), now)

    def global_status(self) -> BudgetStatus | None:
        """The dataset-wide budget (named ``(global)``), or ``None`` if there is none."""
        now = self._now()
        with self._transaction(write=False) as conn:
            budget = self._global(conn)
            if budget is None:
                return None
            epsilon, delta, period = budget
            spent, n = self._spent(conn, None, since=period_start(period, now))
        return self._status(GLOBAL_NAME, False, epsilon, delta, period, spent, n, now)

    def set_global_budget(
        self,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        period: Period | None = None,
        caller: AdminCaller | None = None,
    ) -> BudgetStatus:
        """Set the dataset-wide budget in the ledger (it then wins over the config's).
        ``caller``: audit-logged (``budget.set_global``) in the same transaction.

        Fields left ``None`` keep their current value; without a global budget yet,
        ``epsilon`` and ``delta`` are required. Returns the new status.
        """
        now = self._now()
        with self._transaction(write=True) as conn:
            current = self._global(conn, lock=True)
            if current is None and (epsilon is None or delta is None):
                raise ValueError("there is no global budget yet: give both epsilon and delta")
            old_eps, old_delta, old_period = current or (0.0, 0.0, "none")
            new_eps = old_eps if epsilon is None else float(epsilon)
            new_delta = old_delta if delta is None else float(delta)
            new_period = old_period if period is None else check_period(period)
            _check_budget(new_eps, new_delta)
            conn.execute(
                sa.update(schema.global_lock)
                .where(schema.global_lock.c.id == 1)
                .values(epsilon=new_eps, delta=new_delta, period=new_period, updated_at=now)
            )
            spent, n = self._spent(conn, None, since=period_start(new_period, now), locked=True)
            given = {"epsilon": epsilon, "delta": delta, "period": period}
            self._record_admin(
                conn,
                caller,
                "budget.set_global",
                {k: v for k, v in given.items() if v is not None},
            )
        return self._status(GLOBAL_NAME, False, new_eps, new_delta, new_period, spent, n, now)

    def list_analysts(self) -> list[BudgetStatus]:
        """Every analyst's budget status, by name."""
        now = self._now()
        with self._transaction(write=False) as conn:
            rows = conn.execute(sa.select(t_analysts).order_by(t_analysts.c.name)).all()
            return [self._row_status(conn, r, now) for r in rows]

    def _record_admin(
        self, conn: Connection, caller: AdminCaller | None, action: str, params: dict[str, Any]
    ) -> None:
        """Append an admin change's audit row in the change's transaction (durable with
        it). The chain's lock is the last this transaction takes (budget/audit_chain)."""
        if caller is None:
            return
        row = _audit_row(
            request_id=caller.request_id,
            actor=caller.actor,
            analyst=None,
            endpoint=caller.endpoint,
            action=action,
            params=params,
            sql=None,
            outcome="admin",
            error_code=None,
            status=caller.status,
            created_at=self._now(),
        )
        audit_chain.append(conn, row, st.INSERT_REQUEST.run)
