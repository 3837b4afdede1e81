"""The inspection cache: TTL + LRU bounded entries and bytes, negative entries and single-flight.

Keys are opaque hashables; the inspector uses (resolved reference, credential identities) so a
result fetched with one namespace's private credentials is never served to a lookup without
them. Entries with ``ttl=None`` never expire (digest references are immutable) but still
count toward the LRU bounds: a number of entries and an estimate of the bytes they hold
(``size``, e.g. :func:`imageinspect._manifest.estimated_bytes`), the least recently used
entries leaving first until both hold. Concurrent :meth:`AsyncCache.get_or_fetch` calls
for one key share one in-flight fetch; a cancelled waiter does not cancel the fetch for the others.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Entry(Generic[T]):
    value: T | None
    error: BaseException | None
    expires_at: float | None  # monotonic seconds, None = never
    size: int = 0  # estimated bytes


@dataclass(slots=True)
class CacheStats:
    """Counters: ``hits`` (fresh value), ``negative_hits`` (cached failure), ``misses``
    (a fetch was started), ``joins`` (waited on another caller's in-flight fetch),
    ``evictions`` (LRU drops)."""

    hits: int = 0
    negative_hits: int = 0
    misses: int = 0
    joins: int = 0
    evictions: int = 0


class AsyncCache(Generic[T]):
    """An asyncio TTL/LRU cache with negative entries and single-flight fetches.

    Args:
        max_entries: LRU bound (entries, positive and negative together); >= 1.
        max_bytes: LRU bound on the entries' estimated bytes (``size`` of each); >= 1. An
            entry larger than this on its own is not stored (its value is still returned).
        size: the estimated bytes of a value or a cached failure (default: 512 each).
        negative_ttl: seconds a failure (an exception of ``cache_errors``) stays cached.
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        *,
        max_entries: int = 10_000,
        max_bytes: int = 1 << 40,
        size: Callable[[object], int] = lambda value: 512,
        negative_ttl: float = 30.0,
        cache_errors: tuple[type[BaseException], ...] = (Exception,),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be >= 1")
        self._entries: OrderedDict[Hashable, _Entry[T]] = OrderedDict()
        self._inflight: dict[Hashable, asyncio.Future[T]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._max = max_entries
        self._max_bytes = max_bytes
        self._size = size
        self._bytes = 0
        self._negative_ttl = negative_ttl
        self._cache_errors = cache_errors
        self._clock = clock
        self.stats = CacheStats()

    async def aclose(self) -> None:
        """Cancel in-flight fetches and wait for them to finish."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: Hashable) -> T | None:
        """The fresh cached value for ``key`` (no stats, no LRU touch), else ``None``."""
        entry = self._entries.get(key)
        if entry is None or entry.value is None or self._expired(entry):
            return None
        return entry.value

    def _expired(self, entry: _Entry[T]) -> bool:
        return entry.expires_at is not None and self._clock() >= entry.expires_at

    def put(self, key: Hashable, value: T, ttl: float | None) -> None:
        """Store ``value`` for ``ttl`` seconds (``None``: no expiry), evicting the LRU entry."""
        expires = None if ttl is None else self._clock() + ttl
        self._store(key, _Entry(value, None, expires, self._size(value)))

    def put_error(self, key: Hashable, error: BaseException) -> None:
        """Store a failure for the negative TTL (nothing when the negative TTL is <= 0)."""
        if self._negative_ttl > 0:
            self._store(key, _Entry(None, error, self._clock() + self._negative_ttl,
                                    self._size(error)))

    @property
    def estimated_bytes(self) -> int:
        """The estimated bytes of the entries held (the sum of their ``size``)."""
        return self._bytes

    def _store(self, key: Hashable, entry: _Entry[T]) -> None:
        self._drop(key)
        if entry.size > self._max_bytes:
            self.stats.evictions += 1
            return
        self._entries[key] = entry
        self._bytes += entry.size
        while len(self._entries) > self._max or self._bytes > self._max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.size
            self.stats.evictions += 1

    def _drop(self, key: Hashable) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size

    def invalidate(self, key: Hashable) -> None:
        """Drop ``key`` (no error if absent)."""
        self._drop(key)

    def lookup(self, key: Hashable) -> _Entry[T] | None:
        """The fresh entry for ``key`` (counted as a hit and moved to the LRU end), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._expired(entry):
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        if entry.error is not None:
            self.stats.negative_hits += 1
        else:
            self.stats.hits += 1
        return entry

    async def get_or_fetch(
        self,
        key: Hashable,
        fetch: Callable[[], Awaitable[tuple[T, float | None]]],
        *,
        use_cached: bool = True,
    ) -> T:
        """Return the cached value for ``key`` or run ``fetch`` once for all concurrent callers.

        Args:
            fetch: coroutine factory returning ``(value, ttl_seconds_or_None)``.
            use_cached: False skips the cached entry (still joins an in-flight fetch).

        Raises:
            whatever ``fetch`` raised (cached for the negative TTL when it is one of
            ``cache_errors``), also when the failure was served from the cache.
        """
        if use_cached:
            entry = self.lookup(key)
            if entry is not None:
                if entry.error is not None:
                    raise entry.error
                assert entry.value is not None
                return entry.value
        fut = self._inflight.get(key)
        if fut is not None:
            self.stats.joins += 1
            return await asyncio.shield(fut)
        self.stats.misses += 1
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._inflight[key] = fut
        task = loop.create_task(self._run(key, fetch, fut))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(fut)

    async def _run(
        self,
        key: Hashable,
        fetch: Callable[[], Awaitable[tuple[T, float | None]]],
        fut: asyncio.Future[T],
    ) -> None:
        try:
            value, ttl = await fetch()
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            if isinstance(exc, self._cache_errors):
                self.put_error(key, exc)
            if not fut.done():
                fut.set_exception(exc)
                # Nobody may be waiting any more; mark the exception as retrieved.
                fut.exception()
        else:
            self.put(key, value, ttl)
            if not fut.done():
                fut.set_result(value)
        finally:
            self._inflight.pop(key, None)
