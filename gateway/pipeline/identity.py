"""Who is calling: one authentication path for analysts and the admin, on every front end.

The bootstrap admin key is ``DPGATE_ADMIN_KEY`` (compared in constant time); an
analyst's key is looked up by its hash in the ledger, in the same read that finds a
reusable release for the request (``budget.Ledger.lookup``); a key no analyst holds may
be a named admin's (``budget.Ledger.admin_by_key``), with its role. A bearer token
(a JWT: ``gateway.pipeline.sso``) names its analyst or admin by a claim instead, and brings its
groups; an analyst it names that the ledger does not know is refused, or provisioned
with ``sso.provision``'s budget (audit-logged under the actor ``sso``).
"""

from __future__ import annotations

import contextlib
import hmac
import uuid
from dataclasses import dataclass, field

import budget
from gateway.core.config_access import SsoConfig
from gateway.core.errors import Forbidden, Unauthenticated
from gateway.pipeline.charges import ledger_errors
from gateway.pipeline.sso import TokenIdentity, TokenVerifier, looks_like_token


@dataclass(frozen=True)
class Principal:
    """Who is calling: an analyst (by name) or an admin (the bootstrap ``admin`` of
    ``DPGATE_ADMIN_KEY``, or a named admin of the ledger) with its role: ``admin`` may
    do everything, ``auditor`` only read."""

    name: str
    is_admin: bool
    role: str | None = None
    groups: frozenset[str] = field(default=frozenset())  # a token's groups claim

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
    *,
    access: bool = False,
    groups: bool = True,
    tokens: TokenVerifier | None = None,
) -> tuple[Principal, budget.Lookup | None]:
    """The caller behind a bearer key (or token), with what the ledger holds for
    ``probe`` and, with ``access``, the stored grants and the analyst's groups (without
    ``groups``, only when some grant is stored: ``budget.Ledger.lookup``).

    Raises ``Unauthenticated`` (no key, unknown key, a token refused) or ``Forbidden``
    (a disabled analyst). The admin gets no lookup: it has no budget and no cache.
    """
    if not key:
        raise Unauthenticated("send your API key as 'Authorization: Bearer <key>'")
    if is_admin_key(key, admin_key):
        return ADMIN, None
    if tokens is not None and looks_like_token(key):
        return _token_caller(ledger, tokens, tokens.verify(key), probe, access, groups)
    with ledger_errors():
        found = ledger.lookup(key, probe, access=access, groups=groups)
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


def _token_caller(
    ledger: budget.Ledger,
    tokens: TokenVerifier,
    who: TokenIdentity,
    probe: budget.CacheProbe | None,
    access: bool,
    groups: bool,
) -> tuple[Principal, budget.Lookup | None]:
    """The caller a verified token names: an admin of the role its groups give, or an
    analyst of the ledger (provisioned when the config says so)."""
    if who.role is not None:
        return Principal(name=who.name, is_admin=True, role=who.role, groups=who.groups), None
    with ledger_errors():
        found = ledger.lookup(None, probe, access=access, groups=groups, name=who.name)
        if found.analyst is None and provision(ledger, tokens.config, who):
            found = ledger.lookup(None, probe, access=access, groups=groups, name=who.name)
    if found.analyst is None:
        raise Unauthenticated(
            f"the token names analyst {who.name!r}, whom dpgate does not know: ask an "
            "admin to add them",
            reason="unknown_subject",
        )
    if found.analyst.disabled:
        raise Forbidden(f"analyst '{found.analyst.name}' is disabled")
    return Principal(name=found.analyst.name, is_admin=False, groups=who.groups), found


def provision(ledger: budget.Ledger, sso: SsoConfig, who: TokenIdentity) -> bool:
    """Create the analyst a token names with ``sso.provision``'s budget, if the config
    says so (``unknown_subject: provision``): an admin action of the actor ``sso``, in
    the audit log. Whether the analyst now exists."""
    if sso.unknown_subject != "provision" or sso.provision_epsilon is None:
        return False
    caller = budget.AdminCaller(
        actor="sso", request_id=uuid.uuid4().hex, endpoint=f"sso {who.issuer}"[:200], status=201
    )
    with contextlib.suppress(budget.AnalystExists):  # a concurrent request provisioned them
        ledger.create_analyst(
            who.name,
            sso.provision_epsilon,
            sso.provision_delta,
            sso.provision_period,  # type: ignore[arg-type]
            caller=caller,
        )
    return True
