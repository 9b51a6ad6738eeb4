"""sqlglot dialects by name, one instance each, and generators that are reused.

``expression.sql(dialect="sqlite")`` or ``Dialect.get_or_raise("postgres")`` builds a new
``Dialect`` on every call (its settings, tokenizer and generator classes): ~20 µs each,
several times per query. Dialects hold no per-statement state, so dpgate keeps one of
each and passes the instance.

Each ``.sql()`` also builds a new ``Generator``, and with sqlglot's compiled build
(sqlglotc 30.30, which dpgate installs for its speed) every ``Generator`` built leaks one
56-byte block: ``tree.sql(dialect=d)`` 20,000 times kept 20,000 more blocks (1.1 MB)
under tracemalloc, where the pure-Python build keeps none. At several per query that
was the largest thing a long-running worker grew by (issue 36). The shared dialects
therefore hand out one generator per thread and set of options, reused: a generator
keeps no state from one ``generate`` to the next (it resets its messages each time), but
it is not safe to share between threads. ``Dialect.get_or_raise`` is pointed at the shared
dialects too, for a name without settings or none (what ``.sql()``, ``.sql(dialect=
"sqlite")`` and ``parse_one(…, read=…)`` look up), so every such call in the process
reuses them — this module changes that one sqlglot class method, on import.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.generator import Generator

_local = threading.local()
_get_or_raise: Any = Dialect.__dict__["get_or_raise"].__func__  # sqlglot's: a new one per call


def dialect(name: str | None) -> Dialect:
    """The shared ``Dialect`` of ``name`` (``None`` or ``""``: sqlglot's default), whose
    ``generate`` (what ``expression.sql(dialect=…)`` calls) reuses its generators."""
    return _shared(name or None)


@cache
def _shared(name: str | None) -> Dialect:
    shared = _get_or_raise(Dialect, name)

    def generate(expression: exp.Expr, copy: bool = True, **opts: Any) -> str:
        return _generator(shared, opts).generate(expression, copy=copy)

    shared.generate = generate
    return shared


def _generator(shared: Dialect, opts: dict[str, Any]) -> Generator:
    """This thread's generator of ``shared`` with ``opts``."""
    generators: dict[tuple[int, tuple[tuple[str, Any], ...]], Generator] | None = getattr(
        _local, "generators", None
    )
    if generators is None:
        generators = _local.generators = {}
    key = (id(shared), tuple(sorted(opts.items())))
    found = generators.get(key)
    if found is None:
        found = generators[key] = shared.generator(**opts)
    return found


def _get_or_raise_shared(cls: type[Dialect], name: Any) -> Dialect:
    """``Dialect.get_or_raise``, answered from the shared dialects where it can be."""
    if cls is Dialect and (not name or (isinstance(name, str) and "," not in name)):
        return dialect(name)
    found: Dialect = _get_or_raise(cls, name)
    return found


Dialect.get_or_raise = classmethod(_get_or_raise_shared)  # type: ignore[method-assign,assignment]
