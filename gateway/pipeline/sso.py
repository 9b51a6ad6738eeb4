"""Single sign-on: an OIDC/JWT bearer token in place of an API key.

The token is verified with PyJWT against the issuer the config declares for its ``iss``
(``gateway.core.config_access.SsoConfig``): its signature with the issuer's published keys
(JWKS, fetched from its URL or read from a file), only with the asymmetric algorithms
the config allows (never ``none``, never an HMAC secret), its audience, its expiry and
not-before with the configured clock skew. A claim names the analyst (``sub``,
``preferred_username``, …) and another lists their groups, which count for table grants
(``gateway.pipeline.access``) beside those the ledger holds; membership of a group of
``sso.admin_groups`` makes the caller an admin of that role instead.

Every refusal is ``unauthenticated`` (401) with ``detail.reason`` one of
``malformed``, ``wrong_issuer``, ``algorithm_not_allowed``, ``unknown_key``,
``bad_signature``, ``expired``, ``not_yet_valid``, ``wrong_audience``,
``missing_claim``, ``jwks_unavailable`` (the issuer's keys could not be fetched: never a
500) or ``unknown_subject``.

Keys are cached per issuer for ``jwks_ttl_s``; a token signed with a key id the cache
does not hold triggers one early refetch (an issuer rotating keys), at most every
``REFETCH_MIN_S`` so that made-up key ids cannot make dpgate hammer the issuer. A failed
fetch keeps serving the keys it had.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import jwt

from gateway.core.config_access import GROUP_NAME, Issuer, SsoConfig
from gateway.core.errors import Unauthenticated

log = logging.getLogger("dpgate.sso")

FETCH_TIMEOUT_S = 5.0
REFETCH_MIN_S = 10.0
MAX_JWKS_BYTES = 1 << 20


def looks_like_token(key: str) -> bool:
    """A JWS in compact form (header.payload.signature, the header a JSON object);
    dpgate's own API keys never contain a dot."""
    return key.count(".") == 2 and key.startswith("eyJ")


@dataclass(frozen=True)
class TokenIdentity:
    """Who a verified token names: the analyst (or admin), their groups, the issuer, and
    the admin role their groups give them (``None``: an analyst)."""

    name: str
    groups: frozenset[str]
    issuer: str
    role: str | None = None


def refused(reason: str, message: str) -> Unauthenticated:
    return Unauthenticated(message, reason=reason)


class JwksCache:
    """One issuer's signing keys, fetched (or read) at most every ``ttl_s``."""

    def __init__(self, issuer: Issuer, ttl_s: float) -> None:
        self.issuer = issuer
        self.ttl_s = ttl_s
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at = float("-inf")
        self._tried_at = float("-inf")
        self._lock = threading.Lock()

    def key(self, kid: str | None) -> jwt.PyJWK:
        now = time.monotonic()
        with self._lock:
            if now - self._fetched_at >= self.ttl_s:
                self._refresh(now)
            found = self._find(kid)
            if found is None and now - self._tried_at >= REFETCH_MIN_S:
                self._refresh(now)  # the issuer may have rotated its keys
                found = self._find(kid)
        if found is None:
            if not self._keys and self._fetched_at == float("-inf"):
                raise refused(
                    "jwks_unavailable",
                    "the identity provider's signing keys could not be fetched; try again "
                    "later (the operator's log says why)",
                )
            raise refused(
                "unknown_key", "the token is signed with a key its issuer does not publish"
            )
        return found

    def _find(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid)

    def _refresh(self, now: float) -> None:
        self._tried_at = now
        try:
            document = self._read()
            keys: dict[str | None, jwt.PyJWK] = {}
            for raw in document.get("keys", []):
                if not isinstance(raw, dict) or raw.get("kty") == "oct":
                    continue  # a symmetric key is a shared secret, never a public key
                if raw.get("use", "sig") != "sig":
                    continue
                try:
                    keys[raw.get("kid")] = jwt.PyJWK.from_dict(raw)
                except jwt.PyJWTError:
                    continue  # a key of an algorithm PyJWT cannot use
        except Exception as e:  # any failure: keep the keys we had
            log.warning("JWKS of %s could not be fetched: %s", self.issuer.issuer, e)
            return
        self._keys = keys
        self._fetched_at = now

    def _read(self) -> dict[str, Any]:
        if self.issuer.jwks_file is not None:
            text = self.issuer.jwks_file.read_bytes()[:MAX_JWKS_BYTES]
        else:
            assert self.issuer.jwks_url is not None
            request = urllib.request.Request(
                self.issuer.jwks_url, headers={"Accept": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
                text = response.read(MAX_JWKS_BYTES + 1)
            if len(text) > MAX_JWKS_BYTES:
                raise ValueError("the JWKS document is larger than 1 MiB")
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("the JWKS document is not a JSON object")
        return document


class TokenVerifier:
    """Verifies bearer tokens against the configured issuers."""

    def __init__(self, config: SsoConfig) -> None:
        self.config = config
        self.issuers = {i.issuer: i for i in config.issuers}
        self._keys = {i.issuer: JwksCache(i, config.jwks_ttl_s) for i in config.issuers}

    def verify(self, token: str) -> TokenIdentity:
        """The identity a valid token names; ``Unauthenticated`` (with ``reason``) else."""
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except (jwt.PyJWTError, ValueError, TypeError):
            raise refused("malformed", "the bearer token is not a well-formed JWT") from None
        issuer = self.issuers.get(str(unverified.get("iss")))
        if issuer is None:
            raise refused("wrong_issuer", "the token's issuer (iss) is not one dpgate trusts")
        algorithm = header.get("alg")
        if algorithm not in issuer.algorithms:
            raise refused(
                "algorithm_not_allowed",
                f"the token is signed with {str(algorithm)[:16]!r}; this issuer's tokens "
                f"must use {', '.join(issuer.algorithms)}",
            )
        kid = header.get("kid")
        key = self._keys[issuer.issuer].key(kid if isinstance(kid, str) else None)
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=list(issuer.algorithms),
                audience=issuer.audience,
                issuer=issuer.issuer,
                leeway=self.config.clock_skew_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.InvalidSignatureError:
            raise refused("bad_signature", "the token's signature does not verify") from None
        except jwt.ExpiredSignatureError:
            raise refused("expired", "the token has expired: sign in again") from None
        except jwt.ImmatureSignatureError:
            raise refused("not_yet_valid", "the token is not valid yet (nbf / iat)") from None
        except jwt.InvalidAudienceError:
            raise refused(
                "wrong_audience",
                f"the token is not meant for dpgate (aud is not {issuer.audience!r})",
            ) from None
        except jwt.InvalidIssuerError:
            raise refused(
                "wrong_issuer", "the token's issuer (iss) is not one dpgate trusts"
            ) from None
        except jwt.MissingRequiredClaimError as e:
            raise refused("missing_claim", f"the token has no {e.claim!r} claim") from None
        except jwt.InvalidAlgorithmError:
            raise refused("algorithm_not_allowed", "the token's algorithm is not allowed") from None
        except (jwt.InvalidKeyError, ValueError, TypeError):
            # the token parsed above: its key is not one for its algorithm (an ES256
            # token whose key id names an RSA key)
            raise refused("bad_signature", "the token's signature does not verify") from None
        except jwt.PyJWTError:
            raise refused("malformed", "the bearer token is not a well-formed JWT") from None
        return self._identity(issuer, claims)

    def _identity(self, issuer: Issuer, claims: dict[str, Any]) -> TokenIdentity:
        name = claims.get(issuer.analyst_claim)
        if not isinstance(name, str) or not GROUP_NAME.match(name):
            raise refused(
                "missing_claim",
                f"the token's {issuer.analyst_claim!r} claim does not name an analyst "
                "(1-64 letters, digits, '_', '.', '@' or '-')",
            )
        groups: set[str] = set()
        raw = claims.get(issuer.groups_claim) if issuer.groups_claim else None
        if isinstance(raw, list):
            for g in raw:
                if isinstance(g, str):
                    g = g.rsplit("/", 1)[-1]  # Keycloak's full group path: /hospital/oncology
                    if GROUP_NAME.match(g):
                        groups.add(g)
        role = None
        for candidate in ("admin", "auditor"):
            if groups & set(self.config.admin_groups.get(candidate, ())):
                role = candidate
                break
        return TokenIdentity(name, frozenset(groups), issuer.issuer, role)


__all__ = ["TokenIdentity", "TokenVerifier", "looks_like_token"]
