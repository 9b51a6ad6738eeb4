"""Bearer-key authentication, one path for the analyst and admin endpoints, and the
request record (``gateway.pipeline.observation``) the endpoints fill in."""

from __future__ import annotations

from flask import current_app, g, request

from gateway.core.errors import Forbidden, Unauthenticated
from gateway.pipeline.gateway import Gateway
from gateway.pipeline.identity import Principal
from gateway.pipeline.observation import RequestRecord


def gateway() -> Gateway:
    """The Gateway this app serves."""
    gw: Gateway = current_app.extensions["dpgate"]
    return gw


def record() -> RequestRecord:
    """This request's record (created by the operations hook before anything else)."""
    rec: RequestRecord = g.record
    return rec


def bearer_key() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


def admitted(principal: Principal) -> None:
    """The caller is known: record them and count the request against their limit."""
    record().principal = principal
    if not principal.is_admin:
        from gateway.http.ops import check_rate_limit

        check_rate_limit(principal.name)


def current_principal() -> Principal:
    """Who is calling, authenticated once per request (and rate-limited as that analyst)."""
    principal = record().principal
    if principal is None:
        principal = gateway().authenticate(bearer_key())
        admitted(principal)
    return principal


def require_analyst() -> str:
    """The calling analyst's name; the admin key is refused (it has no budget)."""
    principal = current_principal()
    if principal.is_admin:
        raise Forbidden("the admin key cannot run queries: use an analyst's key")
    return principal.name


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def require_admin() -> None:
    """Let only admin keys through, with errors that say what an admin must send; an
    ``auditor`` only for reads (any other method is ``forbidden``)."""
    if bearer_key() is None:
        raise Unauthenticated("the admin endpoints need 'Authorization: Bearer <admin key>'")
    try:
        principal = gateway().authenticate(bearer_key())
    except Forbidden as exc:  # a disabled analyst's or admin's key
        if str(exc).startswith("admin "):
            raise
        raise Forbidden("an analyst key cannot use the admin endpoints") from None
    except Unauthenticated as exc:
        if "reason" in exc.detail:  # a token refused: say why (gateway.pipeline.sso)
            raise
        if gateway().config.admin_key is None:
            raise Unauthenticated(
                "the admin endpoints are disabled: DPGATE_ADMIN_KEY is not set"
            ) from None
        raise Unauthenticated("invalid admin key") from None
    if not principal.is_admin:
        record().caller = principal.name
        raise Forbidden("an analyst key cannot use the admin endpoints")
    record().principal = principal
    if request.method not in READ_METHODS and not principal.may_write:
        raise Forbidden(
            f"admin '{principal.name}' has the {principal.role} role: it reads, it changes nothing"
        )
