"""Noise drawn ahead of time, so that the time of a release does not depend on the noise.

docs/design.md, invariant 4 (noise is exact, secret and timing-blind): the response time
must not depend on the noise drawn. The samplers are vectorised and their running time
depends on the values they produce only through rare events (a rejected proposal, a tail
recursion, an undecided prefix), but a sampler that runs *while* a release waits would
still leak those events. So the release path never samples: ``sample`` copies values out
of a pool that was filled earlier, an operation whose cost depends on how many values
are taken, never on what they are.

Pools are keyed by the exact ``Noise`` spec. A daemon thread refills a pool when it falls
below its low-water mark, off the request path. A release that finds its pool short (the
first release with a new spec, or a burst) fills it synchronously with a first batch
(``FIRST_BATCH`` values, or as many as it takes) and then takes from it; the refiller
then tops a pool in use up off the request path, doubling its size at each refill up to
``POOL_TARGET``. The batch's cost depends on
the values drawn only through the samplers' rare events (a tail recursion, 2^−24 per
value; an undecided prefix, about 2^−62), not through the rejections (in rejection
sampling the accepted values are independent of how many proposals were rejected). The
gateway calls ``prefill`` with the query's noises right after calibration, before it
executes the query, so even that work happens before the data is read.

Fork safety: a forked worker (gunicorn) would inherit a copy of every pool and release the
same noise as its siblings. Pools are therefore tagged with the process id and emptied in
the child after a fork.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction

from mechanisms.samplers import DiscreteGaussian, DiscreteLaplace
from mechanisms.types import Noise

# Values a pool holds after a refill; a refill starts below the low-water mark.
POOL_TARGET = 4096
POOL_LOW_WATER = 1024
# Values drawn on the request path when a pool is short (a new spec): a whole target's
# worth took ~6 ms a request (each a ``_HeapInt``) whenever an analyst picked a new ε.
FIRST_BATCH = 256
# Distinct noise specs kept (queries with the same parameters share one pool).
MAX_POOLS = 64


def make_sampler(noise: Noise) -> DiscreteLaplace | DiscreteGaussian:
    """The exact sampler for a noise spec (raises ValueError for an invalid spec)."""
    # Fraction(...) is exact for ints and floats too, so a loosely typed spec stays exact.
    if noise.mechanism == "laplace":
        return DiscreteLaplace(Fraction(noise.scale))
    if noise.mechanism == "gaussian":
        scale = Fraction(noise.scale)
        sigma2 = Fraction(noise.sigma2) if noise.sigma2 is not None else scale * scale
        return DiscreteGaussian(sigma2)
    raise ValueError(f"unknown mechanism {noise.mechanism!r}")


class _HeapInt(int):
    """An int that is never one of CPython's cached small ints (−5…256).

    Measured: with plain ints, values in the small-int cache are handled measurably (if
    minutely) differently on the release path, giving a rank correlation ≈ 0.02 between
    |noise| and call time over 20,000 calls; subclass instances are all ordinary heap
    objects and the correlation disappears. Arithmetic on them returns plain ints.
    """

    __slots__ = ()


@dataclass
class _Pool:
    sampler: DiscreteLaplace | DiscreteGaussian
    # Python ints made at refill time: taking them copies references only, so not even
    # the allocation of an int object (small ints are cached by CPython) happens on the
    # release path.
    values: list[int]
    start: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # what the refiller fills it to: ``FIRST_BATCH`` at first, doubled at each refill up
    # to the pools' target, so a spec asked once (a one-off ε) costs a first batch only
    target: int = 0

    def available(self) -> int:
        return len(self.values) - self.start


class NoisePools:
    """Per-spec pools of pre-drawn noise with a background refiller."""

    def __init__(self, target: int = POOL_TARGET, low_water: int = POOL_LOW_WATER) -> None:
        self.target = target
        self.low_water = low_water
        self._pools: OrderedDict[Noise, _Pool] = OrderedDict()
        self._registry_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def _reset_after_fork(self) -> None:
        self._pools = OrderedDict()
        self._registry_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._pid = os.getpid()

    def _pool(self, noise: Noise) -> _Pool:
        if self._pid != os.getpid():
            self._reset_after_fork()
        with self._registry_lock:
            pool = self._pools.get(noise)
            if pool is None:
                pool = _Pool(make_sampler(noise), [], target=min(FIRST_BATCH, self.target))
                self._pools[noise] = pool
                while len(self._pools) > MAX_POOLS:
                    self._pools.popitem(last=False)
            else:
                self._pools.move_to_end(noise)
            return pool

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._refill_loop, name="dpgate-noise-refill", daemon=True
            )
            self._thread.start()

    def _refill_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._registry_lock:
                pools = list(self._pools.values())
            for pool in pools:
                if self._low(pool):
                    pool.target = min(2 * pool.target, self.target)
                    self._top_up(pool, pool.target)

    @staticmethod
    def _top_up(pool: _Pool, target: int) -> None:
        """Draw outside the lock, append under it: takers never wait for a sampler."""
        missing = target - pool.available()
        if missing <= 0:
            return
        fresh: list[int] = [_HeapInt(v) for v in pool.sampler.sample(missing).tolist()]
        with pool.lock:
            pool.values = pool.values[pool.start :] + fresh
            pool.start = 0

    def prefill(self, noise: Noise, size: int) -> None:
        """Make sure at least ``size`` values of ``noise`` are ready (call before a release)."""
        pool = self._pool(noise)
        while pool.available() < size:
            self._top_up(pool, max(size, FIRST_BATCH))
        self._wake_if_low(pool)

    def take(self, noise: Noise, size: int) -> list[int]:
        """``size`` pre-drawn values, removed from the pool (never released twice)."""
        if size < 0:
            raise ValueError("size must be >= 0")
        pool = self._pool(noise)
        while True:
            with pool.lock:
                if pool.available() >= size:
                    out = pool.values[pool.start : pool.start + size]
                    pool.start += size
                    break
            self._top_up(pool, max(size, FIRST_BATCH))
        self._wake_if_low(pool)
        return out

    def _low(self, pool: _Pool) -> bool:
        """Below its low water: the pools' low water scaled to the pool's own target."""
        return pool.available() < pool.target * self.low_water // self.target

    def _wake_if_low(self, pool: _Pool) -> None:
        """Have the refiller top ``pool`` up (``_refill_loop``) if it is below its low water."""
        if self._low(pool):
            self._ensure_thread()
            self._wake.set()


POOLS = NoisePools()
os.register_at_fork(after_in_child=POOLS._reset_after_fork)
