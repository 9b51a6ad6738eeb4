"""Password login on the PostgreSQL front end (``postgres_wire.login: password``).

The client sends its password in the clear (PostgreSQL's AuthenticationCleartextPassword,
as for ``password`` in pg_hba.conf: use TLS). The password is the analyst's API key or a
bearer token of a configured SSO issuer (``gateway.pipeline.sso``); either way it must name the
analyst the client logs in as (the startup ``user``). A token's groups then count for the
session's grants. A key of another analyst, the admin key, or an admin's token fails
with the same message as a wrong password: the answer says nothing about other names.
"""

from __future__ import annotations

from gateway.core.errors import Unauthenticated
from gateway.pipeline.gateway import Gateway
from gateway.pipeline.identity import Principal


def check_password(gateway: Gateway, user: str, password: str) -> Principal:
    """The analyst ``user`` whose key or token ``password`` is; raises
    ``Unauthenticated`` (a token's refusal keeps its ``reason``), ``Forbidden`` (the
    analyst is disabled) or ``LedgerUnavailable``."""
    if not user or not password:
        raise Unauthenticated("no user or no password")
    principal = gateway.authenticate(password)
    if principal.is_admin or principal.name != user:
        raise Unauthenticated("the password does not belong to this user")
    return principal
