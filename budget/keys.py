"""API keys: 256 random bits shown once; only their SHA-256 is stored.

A key has 256 bits of entropy, so an unsalted fast hash is enough: nobody can search
the key space from the stored hash, and lookups stay one indexed equality.
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "dpg_"


def new_api_key() -> str:
    """A fresh analyst API key (``dpg_`` + 43 url-safe characters, 256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """The hex SHA-256 the ledger stores and looks keys up by."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()
