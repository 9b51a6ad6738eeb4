"""SCRAM-SHA-256, the server side (RFC 5802 and RFC 7677, as PostgreSQL speaks it).

The analyst's password is their API key; the server holds only the key's verifier
(``budget.keys.ScramVerifier``), so neither the wire nor the ledger ever carries the key.
Channel binding is not offered (the client's GS2 header must be ``n`` or ``y``).

An unknown analyst, or one whose key has no verifier yet, gets the same exchange as a
real one — a salt derived from a per-process secret and the name, so repeated attempts
see the same one — and fails at the proof, exactly like a wrong key: the exchange does
not say which names exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from budget.keys import SCRAM_ITERATIONS, ScramVerifier

MECHANISM = "SCRAM-SHA-256"
NONCE_BYTES = 18
_MOCK_SECRET = secrets.token_bytes(32)


class ScramFailed(Exception):
    """The exchange failed: malformed message, wrong nonce, or a proof that does not check."""


@dataclass(frozen=True)
class ClientFirst:
    gs2_header: str
    bare: str
    nonce: str


def parse_client_first(message: str) -> ClientFirst:
    """``n,,n=user,r=nonce`` (the user is ignored: PostgreSQL takes the startup's user)."""
    parts = message.split(",", 2)
    if len(parts) != 3 or parts[0] not in ("n", "y") or parts[1] != "":
        raise ScramFailed("unsupported SCRAM GS2 header (channel binding is not offered)")
    bare = parts[2]
    attrs = _attributes(bare)
    nonce = attrs.get("r")
    if not nonce or "m" in attrs:
        raise ScramFailed("malformed SCRAM client-first message")
    return ClientFirst(gs2_header=f"{parts[0]},,", bare=bare, nonce=nonce)


def mock_verifier(name: str) -> ScramVerifier:
    """A verifier nobody can satisfy, stable for a name within this process."""
    salt = hmac.new(_MOCK_SECRET, name.encode("utf-8"), hashlib.sha256).digest()[:16]
    return ScramVerifier(
        salt=salt,
        iterations=SCRAM_ITERATIONS,
        stored_key=secrets.token_bytes(32),
        server_key=secrets.token_bytes(32),
    )


class ScramExchange:
    """One server-side SCRAM-SHA-256 exchange against a verifier."""

    def __init__(self, verifier: ScramVerifier, client_first: ClientFirst) -> None:
        self.verifier = verifier
        self.client_first = client_first
        server_nonce = base64.b64encode(secrets.token_bytes(NONCE_BYTES)).decode("ascii")
        self.nonce = client_first.nonce + server_nonce
        salt = base64.b64encode(verifier.salt).decode("ascii")
        self.server_first = f"r={self.nonce},s={salt},i={verifier.iterations}"

    def finish(self, client_final: str) -> str:
        """Check the client's proof; the server-final message (``v=…``) if it holds."""
        without_proof, sep, proof_part = client_final.rpartition(",p=")
        if not sep:
            raise ScramFailed("malformed SCRAM client-final message")
        attrs = _attributes(without_proof)
        binding = base64.b64encode(self.client_first.gs2_header.encode("ascii")).decode("ascii")
        if attrs.get("c") != binding:
            raise ScramFailed("SCRAM channel binding does not match")
        if not hmac.compare_digest(attrs.get("r", "").encode(), self.nonce.encode()):
            raise ScramFailed("SCRAM nonce does not match")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise ScramFailed("malformed SCRAM proof") from None
        auth_message = f"{self.client_first.bare},{self.server_first},{without_proof}".encode()
        signature = hmac.new(self.verifier.stored_key, auth_message, hashlib.sha256).digest()
        if len(proof) != len(signature):
            raise ScramFailed("malformed SCRAM proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self.verifier.stored_key):
            raise ScramFailed("wrong key")
        server_signature = hmac.new(self.verifier.server_key, auth_message, hashlib.sha256)
        return "v=" + base64.b64encode(server_signature.digest()).decode("ascii")


def _attributes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ScramFailed("malformed SCRAM message")
        out[key] = value
    return out
