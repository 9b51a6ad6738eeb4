"""Bearer-key authentication for the analyst and admin endpoints."""

from __future__ import annotations

from flask import current_app, g, request

from gateway.errors import Forbidden
from gateway.pipeline import Gateway, Principal


def gateway() -> Gateway:
    """The Gateway this app serves."""
    gw: Gateway = current_app.extensions["dpgate"]
    return gw


def bearer_key() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


def current_principal() -> Principal:
    """Who is calling, authenticated once per request (and rate-limited as that analyst)."""
    principal: Principal | None = g.get("principal")
    if principal is None:
        principal = gateway().authenticate(bearer_key())
        g.principal = principal
        if not principal.is_admin:
            g.analyst_name = principal.name
            from gateway.http.ops import check_rate_limit

            check_rate_limit(principal.name)
    return principal


def require_analyst() -> str:
    """The calling analyst's name; the admin key is refused (it has no budget)."""
    principal = current_principal()
    if principal.is_admin:
        raise Forbidden("the admin key cannot run queries: use an analyst's key")
    return principal.name


def require_admin() -> None:
    principal = current_principal()
    if not principal.is_admin:
        raise Forbidden("this endpoint needs the admin key")
