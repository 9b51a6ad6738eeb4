"""sqlglot dialects by name, one instance each.

``expression.sql(dialect="sqlite")`` or ``Dialect.get_or_raise("postgres")`` builds a new
``Dialect`` on every call (its settings, tokenizer and generator classes): ~20 µs each,
several times per query. Dialects hold no per-statement state, so dpgate keeps one of
each and passes the instance.
"""

from __future__ import annotations

from functools import cache

from sqlglot.dialects.dialect import Dialect


@cache
def dialect(name: str | None) -> Dialect:
    """The shared ``Dialect`` of ``name`` (``None``: sqlglot's default)."""
    return Dialect.get_or_raise(name)
