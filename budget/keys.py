"""API keys: 256 random bits shown once; only their SHA-256 is stored.

A key has 256 bits of entropy, so an unsalted fast hash is enough: nobody can search
the key space from the stored hash, and lookups stay one indexed equality.

For the PostgreSQL front end (``gateway/pgwire``) the ledger also keeps each key's
SCRAM-SHA-256 verifier, made when the key is made (created or rotated): the key itself
is never stored, and a SCRAM login never sends it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

KEY_PREFIX = "dpg_"


def new_api_key() -> str:
    """A fresh analyst API key (``dpg_`` + 43 url-safe characters, 256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """The hex SHA-256 the ledger stores and looks keys up by."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


#: PBKDF2 iterations of a SCRAM-SHA-256 verifier: PostgreSQL's default. A key has 256
#: random bits, so the count adds nothing against guessing; it stays at the value every
#: client library expects, and costs each connecting client a few milliseconds.
SCRAM_ITERATIONS = 4096
SCRAM_SALT_BYTES = 16


@dataclass(frozen=True)
class ScramVerifier:
    """What a server keeps to check SCRAM-SHA-256 logins (RFC 5802, RFC 7677) for a key.

    ``stored_key`` = H(HMAC(SaltedPassword, "Client Key")) lets the server check a
    client's proof; ``server_key`` = HMAC(SaltedPassword, "Server Key") lets it prove
    itself to the client. Neither lets anyone log in as the analyst.
    """

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_verifier(
    key: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> ScramVerifier:
    """The SCRAM-SHA-256 verifier of an API key, with a fresh random salt by default.

    API keys are ASCII (``dpg_`` + url-safe base64), so SASLprep leaves them unchanged.
    """
    salt = secrets.token_bytes(SCRAM_SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", key.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return ScramVerifier(
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.sha256(client_key).digest(),
        server_key=hmac.new(salted, b"Server Key", hashlib.sha256).digest(),
    )
