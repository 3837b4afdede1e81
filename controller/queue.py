"""An asyncio work queue of keys with deduplication, per-key backoff and a global rate limit.

Modelled on client-go's workqueue: a key is queued at most once; a key re-added while a
worker processes it is processed again afterwards (never twice at once); failures are
retried after an exponential per-key backoff with jitter; a token bucket caps how many
keys per second all workers together start. Watches feed keys, never objects; workers
re-read the latest object from the informer cache (STYLE.md).

The handler returns ``None`` (done: the key's failure count is reset), a number of seconds
(requeue after that delay: the failure count is reset first, as controller-runtime's
``Forget`` before ``AddAfter``) or raises. An exception of one of the queue's ``retry_now``
types (a stale write: 409 Conflict) means "read again and retry": the key is requeued after
``base_delay`` (jittered) and its failure count is left as it is, neither reset nor
counted. Any other exception is a counted failure: retry after the exponential backoff.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Handler = Callable[[str], Awaitable[float | None]]


class TokenBucket:
    """Global rate limit: ``rate`` tokens per second, at most ``burst`` saved up.
    ``rate <= 0`` disables the limit."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Wait until a token is available and take it."""
        if self.rate <= 0:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return
                await asyncio.sleep((1.0 - self._tokens) / self.rate)


class WorkQueue:
    """Deduplicating key queue served by ``workers`` concurrent tasks.

    Args:
        workers: concurrent handlers (default 32).
        rate: keys started per second across all workers (token bucket; 0 = unlimited).
        burst: token bucket size.
        base_delay: first retry delay in seconds; doubles per consecutive failure.
        max_delay: cap of the retry delay in seconds.
        jitter: the delay is multiplied by a random factor in ``[1, 1 + jitter]``.
        retry_now: exception types that mean "retry with a fresh read", not a failure
            (e.g. ``kubeclient.Conflict``: a stale write); at most ``max_quick_retries`` in a
            row per key, then they count like any failure (no endless loop).
        max_quick_retries: see ``retry_now``.
    """

    def __init__(
        self,
        *,
        workers: int = 32,
        rate: float = 500.0,
        burst: int = 1000,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
        jitter: float = 0.2,
        retry_now: tuple[type[BaseException], ...] = (),
        max_quick_retries: int = 10,
    ) -> None:
        self.workers = max(1, workers)
        self.retry_now = retry_now
        self.max_quick_retries = max_quick_retries
        self._quick: dict[str, int] = {}
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.jitter = jitter
        self._bucket = TokenBucket(rate, burst)
        self._ready: collections.deque[str] = collections.deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._shutting_down = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.processed = 0
        self.errors = 0

    # --- adding ----------------------------------------------------------------------
    def add(self, key: str) -> None:
        """Queue ``key`` now (no-op if already queued; re-run later if being processed)."""
        if self._shutting_down or key in self._dirty:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self._dirty.add(key)
        self._idle.clear()
        if key not in self._processing:
            self._ready.append(key)
            self._wakeup.set()

    def add_after(self, key: str, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds (an earlier pending add wins)."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        due = time.monotonic() + delay
        current = self._timers.get(key)
        if current is not None and current[0] <= due:
            return
        if current is not None:
            current[1].cancel()
        handle = asyncio.get_running_loop().call_later(delay, self._fire, key)
        self._timers[key] = (due, handle)
        self._idle.clear()

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)
        self._check_idle()

    def add_rate_limited(self, key: str) -> float:
        """Count a failure of ``key`` and queue it after its backoff; returns the delay."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = float(min(self.max_delay, self.base_delay * (2**n)))
        delay *= 1.0 + self.jitter * random.random()
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """Reset the failure count of ``key``."""
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        """Consecutive failures counted for ``key``."""
        return self._failures.get(key, 0)

    def discard(self, key: str) -> None:
        """Drop ``key``: pending timers, queued entry and failure count (a deleted pod)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self._failures.pop(key, None)
        self._quick.pop(key, None)
        if key in self._dirty and key not in self._processing:
            self._dirty.discard(key)
            with contextlib.suppress(ValueError):
                self._ready.remove(key)
        self._check_idle()

    # --- introspection -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ready)

    @property
    def pending(self) -> int:
        """Keys queued, waiting on a timer, or being processed."""
        return len(self._dirty | self._processing | set(self._timers))

    def is_pending(self, key: str) -> bool:
        """True when ``key`` is queued, waiting on a timer, or being processed."""
        return key in self._dirty or key in self._processing or key in self._timers

    def _check_idle(self) -> None:
        if not self._dirty and not self._processing and not self._timers:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Wait until nothing is queued, delayed or processing."""
        await self._idle.wait()

    # --- running -----------------------------------------------------------------------
    def start(self, handler: Handler) -> None:
        """Start the worker tasks calling ``handler(key)``."""
        if self._tasks:
            return
        for i in range(self.workers):
            self._tasks.append(asyncio.create_task(self._worker(handler), name=f"worker-{i}"))

    async def _next(self) -> str:
        while True:
            if self._ready:
                return self._ready.popleft()
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _worker(self, handler: Handler) -> None:
        while not self._shutting_down:
            key = await self._next()
            if self._ready:
                self._wakeup.set()  # let another worker take the next one
            await self._bucket.acquire()
            self._dirty.discard(key)
            self._processing.add(key)
            try:
                result = await handler(key)
            except asyncio.CancelledError:
                self._processing.discard(key)
                raise
            except Exception as exc:
                quick = self._quick.get(key, 0)
                if isinstance(exc, self.retry_now) and quick < self.max_quick_retries:
                    self._quick[key] = quick + 1
                    self.add_after(key, self.base_delay * (1.0 + self.jitter * random.random()))
                    log.debug("work item %s: %s; retrying with a fresh read", key, exc)
                else:
                    self._quick.pop(key, None)
                    self.errors += 1
                    delay = self.add_rate_limited(key)
                    log.info("work item %s failed (%s); retry in %.2fs", key, exc, delay)
            else:
                self.processed += 1
                self._quick.pop(key, None)
                self.forget(key)
                if result is not None:
                    self.add_after(key, float(result))
            finally:
                self._processing.discard(key)
            if key in self._dirty and key not in self._ready:
                self._ready.append(key)
                self._wakeup.set()
            self._check_idle()

    async def shutdown(self) -> None:
        """Stop taking keys, cancel timers and workers (items in flight are cancelled)."""
        self._shutting_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
