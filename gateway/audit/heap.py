"""Keep freed memory in the process, so the span's arrays are not page-faulted afresh.

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

Nothing here touches data or decisions: the same arrays hold the same values.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

RETAIN_BYTES = 64 * 1024 * 1024
"""Arrays up to this size come from the heap, and up to this much freed memory is kept."""
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_done = False


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to ``RETAIN_BYTES`` (once per process);
    False where the C library is not glibc (nothing is changed there)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, RETAIN_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, RETAIN_BYTES)
    )
    _done = ok
    return ok
