"""A serving process's startup heap, set aside from the cyclic garbage collector.

After imports, the config and the app are built, a process holds some 125,000 tracked
objects (sqlglot, SQLAlchemy, Flask and dpgate's own modules) that live as long as it
does. CPython's full (generation 2) collection walks all of them: 40–120 ms of CPU, on
whichever request happened to trigger it, whatever that request was (issue 36: refusing
any input must cost at most 100 ms). ``gc.freeze()`` moves them to a permanent
generation that collections skip, so a full collection walks only what requests
allocated since; the objects are still freed by reference counting as usual. At exit
they are handed back (``gc.unfreeze``), so the interpreter's last collection can free
what they hold (native handles such as DuckDB connections included) instead of leaving
them for extension modules to report as leaked.

The servers call ``freeze_startup_heap`` once their app or Gateway is built: each
gunicorn worker and waitress (``gateway.serve``), and the PostgreSQL wire process
(``gateway.pgwire.server.serve``).
"""

from __future__ import annotations

import atexit
import gc

_frozen = False


def freeze_startup_heap() -> None:
    """Collect once, then move every object tracked so far out of the collector's reach
    for the life of the process (idempotent; undone at exit)."""
    global _frozen
    gc.collect()
    gc.freeze()
    if not _frozen:
        _frozen = True
        atexit.register(gc.unfreeze)
