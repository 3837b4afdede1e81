"""The inspection cache: TTL, LRU, negative TTL, single-flight."""

from __future__ import annotations

import asyncio

import pytest

from podplacement.imageinspect._cache import AsyncCache


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Boom(Exception):
    pass


def _fetcher(calls: list[str], value: str, ttl: float | None = 10.0):  # type: ignore[no-untyped-def]
    async def fetch() -> tuple[str, float | None]:
        calls.append(value)
        return value, ttl

    return fetch


async def test_ttl_expiry_refetches() -> None:
    clock = FakeClock()
    cache: AsyncCache[str] = AsyncCache(clock=clock)
    calls: list[str] = []
    assert await cache.get_or_fetch("k", _fetcher(calls, "a", 10)) == "a"
    assert await cache.get_or_fetch("k", _fetcher(calls, "b", 10)) == "a"
    clock.now += 10
    assert await cache.get_or_fetch("k", _fetcher(calls, "c", 10)) == "c"
    assert calls == ["a", "c"]
    assert (cache.stats.hits, cache.stats.misses) == (1, 2)


async def test_entries_without_ttl_never_expire() -> None:
    clock = FakeClock()
    cache: AsyncCache[str] = AsyncCache(clock=clock)
    calls: list[str] = []
    await cache.get_or_fetch("digest", _fetcher(calls, "a", None))
    clock.now += 10**9
    assert await cache.get_or_fetch("digest", _fetcher(calls, "b", None)) == "a"
    assert calls == ["a"]


async def test_lru_evicts_least_recently_used() -> None:
    cache: AsyncCache[str] = AsyncCache(max_entries=2, clock=FakeClock())
    calls: list[str] = []
    await cache.get_or_fetch("a", _fetcher(calls, "a"))
    await cache.get_or_fetch("b", _fetcher(calls, "b"))
    await cache.get_or_fetch("a", _fetcher(calls, "a2"))  # touch a: b is now LRU
    await cache.get_or_fetch("c", _fetcher(calls, "c"))
    assert len(cache) == 2
    assert cache.peek("b") is None and cache.peek("a") == "a"
    assert cache.stats.evictions == 1
    assert await cache.get_or_fetch("b", _fetcher(calls, "b2")) == "b2"


async def test_failures_are_cached_for_the_negative_ttl() -> None:
    clock = FakeClock()
    cache: AsyncCache[str] = AsyncCache(negative_ttl=5, cache_errors=(Boom,), clock=clock)
    attempts = 0

    async def failing() -> tuple[str, float | None]:
        nonlocal attempts
        attempts += 1
        raise Boom("no")

    for _ in range(3):
        with pytest.raises(Boom):
            await cache.get_or_fetch("k", failing)
    assert attempts == 1
    assert cache.stats.negative_hits == 2
    clock.now += 5
    with pytest.raises(Boom):
        await cache.get_or_fetch("k", failing)
    assert attempts == 2


async def test_uncached_error_types_are_not_remembered() -> None:
    cache: AsyncCache[str] = AsyncCache(cache_errors=(Boom,), clock=FakeClock())
    attempts = 0

    async def failing() -> tuple[str, float | None]:
        nonlocal attempts
        attempts += 1
        raise KeyError("x")

    for _ in range(2):
        with pytest.raises(KeyError):
            await cache.get_or_fetch("k", failing)
    assert attempts == 2


async def test_concurrent_lookups_share_one_fetch() -> None:
    cache: AsyncCache[str] = AsyncCache(clock=FakeClock())
    started = 0
    release = asyncio.Event()

    async def slow() -> tuple[str, float | None]:
        nonlocal started
        started += 1
        await release.wait()
        return "v", 10.0

    waiters = [asyncio.create_task(cache.get_or_fetch("k", slow)) for _ in range(50)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiters) == ["v"] * 50
    assert started == 1
    assert cache.stats.misses == 1 and cache.stats.joins == 49


async def test_cancelled_waiter_does_not_cancel_the_shared_fetch() -> None:
    cache: AsyncCache[str] = AsyncCache(clock=FakeClock())
    release = asyncio.Event()

    async def slow() -> tuple[str, float | None]:
        await release.wait()
        return "v", 10.0

    first = asyncio.create_task(cache.get_or_fetch("k", slow))
    second = asyncio.create_task(cache.get_or_fetch("k", slow))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == "v"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert cache.peek("k") == "v"


async def test_use_cached_false_refetches_and_keys_are_isolated() -> None:
    cache: AsyncCache[str] = AsyncCache(clock=FakeClock())
    calls: list[str] = []
    await cache.get_or_fetch(("ref", ("cred-a",)), _fetcher(calls, "private"))
    assert await cache.get_or_fetch(("ref", ()), _fetcher(calls, "anon")) == "anon"
    assert await cache.get_or_fetch(("ref", ()), _fetcher(calls, "x"), use_cached=False) == "x"
    assert calls == ["private", "anon", "x"]
