"""The work queue: dedupe, never the same key twice at once, backoff on failure, shutdown."""

from __future__ import annotations

import asyncio
from collections import Counter

from podplacement.controller.queue import TokenBucket, WorkQueue


async def test_duplicate_adds_are_processed_once() -> None:
    q = WorkQueue(workers=4, rate=0)
    seen: Counter[str] = Counter()

    async def handler(key: str) -> None:
        seen[key] += 1

    for _ in range(5):
        q.add("a")
    q.add("b")
    q.start(handler)
    await asyncio.wait_for(q.wait_idle(), 5)
    await q.shutdown()
    assert seen == Counter({"a": 1, "b": 1})


async def test_key_added_while_processing_runs_again_but_never_concurrently() -> None:
    q = WorkQueue(workers=8, rate=0)
    running: set[str] = set()
    overlaps = 0
    calls = 0
    release = asyncio.Event()

    async def handler(key: str) -> None:
        nonlocal overlaps, calls
        if key in running:
            overlaps += 1
        running.add(key)
        calls += 1
        if calls == 1:
            q.add("k")  # re-added during processing
            q.add("k")
            await release.wait()
        running.discard(key)

    q.add("k")
    q.start(handler)
    await asyncio.sleep(0.05)
    assert calls == 1  # the re-add waits for the first run
    release.set()
    await asyncio.wait_for(q.wait_idle(), 5)
    await q.shutdown()
    assert calls == 2 and overlaps == 0


async def test_failures_back_off_exponentially_then_succeed() -> None:
    q = WorkQueue(workers=2, rate=0, base_delay=0.01, max_delay=0.05, jitter=0.0)
    attempts: list[int] = []

    async def handler(key: str) -> None:
        attempts.append(q.failures(key))
        if len(attempts) < 4:
            raise RuntimeError("boom")

    q.add("x")
    q.start(handler)
    await asyncio.wait_for(q.wait_idle(), 5)
    await q.shutdown()
    assert attempts == [0, 1, 2, 3]
    assert q.failures("x") == 0 and q.errors == 3


async def test_requeue_after_and_discard() -> None:
    q = WorkQueue(workers=1, rate=0)
    calls: Counter[str] = Counter()

    async def handler(key: str) -> float | None:
        calls[key] += 1
        return 0.01 if key == "again" and calls[key] < 3 else None

    q.add("again")
    q.add_after("dropped", 30)
    q.discard("dropped")
    q.start(handler)
    await asyncio.wait_for(q.wait_idle(), 5)
    await q.shutdown()
    assert calls == Counter({"again": 3})


async def test_a_requeue_after_forgets_the_failure_count() -> None:
    """controller-runtime: ``RequeueAfter`` means ``Forget`` then ``AddAfter``: a key that
    failed twice and then asks to come back later starts from zero failures."""
    q = WorkQueue(workers=1, rate=0, base_delay=0.01, jitter=0.0)
    seen: list[int] = []

    async def handler(key: str) -> float | None:
        seen.append(q.failures(key))
        if len(seen) <= 2:
            raise RuntimeError("boom")
        return 0.01 if len(seen) == 3 else None

    q.add("k")
    q.start(handler)
    await asyncio.wait_for(q.wait_idle(), 5)
    await q.shutdown()
    assert seen == [0, 1, 2, 0]


class Stale(Exception):
    pass


async def test_stale_writes_are_retried_without_counting_as_failures() -> None:
    """A conflict (stale write) is retried with a fresh read and leaves the failure count
    alone; after ``max_quick_retries`` in a row it counts, so it cannot loop forever."""
    q = WorkQueue(workers=1, rate=0, base_delay=0.01, jitter=0.0, retry_now=(Stale,),
                  max_quick_retries=3)
    seen: list[int] = []

    async def handler(key: str) -> None:
        seen.append(q.failures(key))
        if len(seen) == 1:
            raise RuntimeError("a real failure")
        if len(seen) <= 6:
            raise Stale("409")

    q.add("k")
    q.start(handler)
    await asyncio.wait_for(q.wait_idle(), 5)
    await q.shutdown()
    # one counted failure, three free conflicts, then the fourth conflict in a row counts
    assert seen == [0, 1, 1, 1, 1, 2, 2]
    assert q.errors == 2


async def test_token_bucket_limits_the_start_rate() -> None:
    bucket = TokenBucket(rate=1000, burst=2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for _ in range(12):
        await bucket.acquire()
    # 2 from the burst, 10 more at 1000/s need at least ~10 ms of (virtual) waiting
    assert loop.time() - t0 >= 0.009


async def test_shutdown_stops_workers_and_pending_timers() -> None:
    q = WorkQueue(workers=3, rate=0)

    async def handler(key: str) -> None:
        await asyncio.sleep(10)

    q.add("slow")
    q.add_after("later", 10)
    q.start(handler)
    await asyncio.sleep(0.01)
    await asyncio.wait_for(q.shutdown(), 2)
    q.add("ignored")
    assert len(q) == 0
