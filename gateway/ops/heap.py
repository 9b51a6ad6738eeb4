"""glibc malloc settings for a gateway process: how much freed memory it keeps, and in how
many arenas. Both trade memory returned to the kernel for CPU; nothing here touches data
or decisions (the same arrays hold the same values). Outside glibc nothing is changed.

``retain_freed_memory`` (the auditor's arrays):
    Each answered query rebuilds its block's reduced basis (rank × atoms floats, a few MB
    after a few hundred answers) as a new array: knowledge is persistent, the old block must
    stay intact for a refused trial. With glibc's default allocator, arrays of that size are
    mapped from the kernel and handed back when freed (``mmap`` above a threshold, ``trim``
    of the heap's top), so every new one page-faults all its pages again: on the demo's
    workload of overlapping boxes, at 300 answered queries, the block's insert took 2.3 ms
    of CPU with the faults and 0.42 ms without (``bench/README.md``). Raising both
    thresholds lets freed arrays be reused from the heap; the price is up to
    ``RETAIN_BYTES`` of freed memory kept by the process instead of returned to the kernel
    (every gateway process: the auditor is built whatever ``audit.mode``).

``limit_malloc_arenas`` (each ``dpgate serve`` worker, right after fork): see its docstring.

``freeze_startup_heap`` (Python's cyclic garbage collector, not malloc):
    After imports, the config and the app are built, a process holds some 125,000 tracked
    objects (sqlglot, SQLAlchemy, Flask and dpgate's own modules) that live as long as it
    does. CPython's full (generation 2) collection walks all of them: 40–120 ms of CPU, on
    whichever request happened to trigger it, whatever that request was (issue 36:
    refusing any input must cost at most 100 ms). ``gc.freeze()`` moves them to a
    permanent generation that collections skip, so a full collection walks only what
    requests allocated since; the objects are still freed by reference counting as
    usual. At exit they are handed back (``gc.unfreeze``), so the interpreter's last
    collection can free what they hold (native handles such as DuckDB connections
    included) instead of leaving them for extension modules to report as leaked. The
    servers call it once their app or Gateway is built: each gunicorn worker and waitress
    (``gateway.server.serve``), and the PostgreSQL wire process (``gateway.pgwire.server.serve``).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import sys
from collections.abc import Callable

RETAIN_BYTES = 64 * 1024 * 1024
"""Arrays up to this size come from the heap, and up to this much freed memory is kept."""
WORKER_MALLOC_ARENAS = 2
"""glibc malloc arenas a worker may use (``limit_malloc_arenas``); glibc's own default is
eight per core, one per thread that meets contention. ``MALLOC_ARENA_MAX`` in the
environment takes precedence."""
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_retained = False
_frozen = False


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is not glibc (musl, macOS …)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return None
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to ``RETAIN_BYTES`` (once per process);
    False where the C library is not glibc (nothing is changed there)."""
    global _retained
    if _retained:
        return True
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    _retained = bool(mallopt(_M_MMAP_THRESHOLD, RETAIN_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, RETAIN_BYTES)
    )
    return _retained


def limit_malloc_arenas(arenas: int = WORKER_MALLOC_ARENAS) -> bool:
    """Cap the calling (just forked, single-threaded) worker's glibc malloc arenas at
    ``arenas``; ``False`` where that is not done (not glibc, or ``MALLOC_ARENA_MAX`` set).

    A worker's 16 request threads each got an arena of their own, and every arena keeps
    the freed memory of the allocations made in it (numpy's span matrices, SQLite's
    statements and page caches, large Python objects): measured on the soak
    (``bench/soak.py``, 16 clients, 3 minutes), two arenas held worker RSS ~30 MB lower
    and grew a third slower per 1,000 releases (16 MB against 24 MB) than glibc's
    default. The request threads hand the GIL to one another, so two arenas are seldom
    contended; SQLite, which runs without the GIL, shares them."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    mallopt = _glibc_mallopt()
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))


def freeze_startup_heap() -> None:
    """Collect once, then move every object tracked so far out of the cyclic collector's
    reach for the life of the process (idempotent; undone at exit)."""
    global _frozen
    gc.collect()
    gc.freeze()
    if not _frozen:
        _frozen = True
        atexit.register(gc.unfreeze)
