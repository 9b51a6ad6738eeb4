"""Who is calling: one authentication path for analysts and the admin, on every front end.

The bootstrap admin key is ``DPGATE_ADMIN_KEY`` (compared in constant time); an
analyst's key is looked up by its hash in the ledger, in the same read that finds a
reusable release for the request (``budget.Ledger.lookup``); a key no analyst holds may
be a named admin's (``budget.Ledger.admin_by_key``), with its role.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

import budget
from gateway.charges import ledger_errors
from gateway.errors import Forbidden, Unauthenticated


@dataclass(frozen=True)
class Principal:
    """Who is calling: an analyst (by name) or an admin (the bootstrap ``admin`` of
    ``DPGATE_ADMIN_KEY``, or a named admin of the ledger) with its role: ``admin`` may
    do everything, ``auditor`` only read."""

    name: str
    is_admin: bool
    role: str | None = None

    @property
    def may_write(self) -> bool:
        """An admin allowed to change things (not an ``auditor``)."""
        return self.is_admin and self.role == "admin"


ADMIN = Principal(name="admin", is_admin=True, role="admin")


def is_admin_key(key: str, admin_key: str | None) -> bool:
    return admin_key is not None and hmac.compare_digest(key.encode(), admin_key.encode())


def identify(
    ledger: budget.Ledger,
    key: str | None,
    admin_key: str | None,
    probe: budget.CacheProbe | None = None,
) -> tuple[Principal, budget.Lookup | None]:
    """The caller behind a bearer key, with what the ledger holds for ``probe``.

    Raises ``Unauthenticated`` (no key, unknown key) or ``Forbidden`` (a disabled
    analyst). The admin gets no lookup: it has no budget and no cache.
    """
    if not key:
        raise Unauthenticated("send your API key as 'Authorization: Bearer <key>'")
    if is_admin_key(key, admin_key):
        return ADMIN, None
    with ledger_errors():
        found = ledger.lookup(key, probe)
    if found.analyst is None:
        with ledger_errors():
            admin = ledger.admin_by_key(key)
        if admin is None:
            raise Unauthenticated("unknown API key")
        if admin.disabled:
            raise Forbidden(f"admin '{admin.name}' is disabled")
        return Principal(name=admin.name, is_admin=True, role=admin.role), None
    if found.analyst.disabled:
        raise Forbidden(f"analyst '{found.analyst.name}' is disabled")
    return Principal(name=found.analyst.name, is_admin=False), found
