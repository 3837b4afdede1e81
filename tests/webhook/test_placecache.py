"""The webhook's cache of anonymous results: background fills, TTL counted from when a
registry answered (the result's fetched_at, not the fill), LRU, deduplication, bounds, and
no credentials ever: a private image is never stored."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from podplacement.imageinspect import Credential, Unauthorized
from podplacement.rules.config import ImageInspectionConfig, ObjectRef, PlacementConfig
from podplacement.webhook.placecache import PlaceCache, cache_keys
from tests.controller._pods import img

CFG = PlacementConfig(image_inspection=ImageInspectionConfig(cache_ttl_seconds=60.0))


class _Inspector:
    """Answers only when the credentials contain the user the image needs (None: public)."""

    def __init__(self, needs: dict[str, str | None] | None = None) -> None:
        self.needs = needs or {}
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.max_ages: list[float | None] = []
        #: image → the fetched_at its results carry (a copy from the inspector's cache)
        self.fetched_at: dict[str, float] = {}
        self.gate: asyncio.Event | None = None
        self.running = 0
        self.max_running = 0

    async def inspect(self, image: str, credentials: Sequence[Credential] = (), *,
                      pull_always: bool = False, max_age: float | None = None) -> Any:
        users = tuple(c.username for c in credentials)
        self.calls.append((image, users))
        self.max_ages.append(max_age)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.gate is not None:
                await self.gate.wait()
            need = self.needs.get(image)
            if need is not None and need not in users:
                raise Unauthorized("authentication required", status=401)
            if image in self.fetched_at:
                return _Aged(image, self.fetched_at[image])
            return img(image, "linux/arm64")
        finally:
            self.running -= 1


@dataclasses.dataclass(frozen=True)
class _Aged:
    """A result with the time a registry answered for it (as imageinspect.ImageInfo)."""

    reference: str
    fetched_at: float
    platforms: tuple[Any, ...] = img("x", "linux/arm64").platforms


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pod(*images: str, secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": im}
                                           for i, im in enumerate(images)]}
    if secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in secrets]
    return {"metadata": {"name": "p"}, "spec": spec}


async def test_miss_then_background_fill_then_hit() -> None:
    inspector, clock = _Inspector(), _Clock()
    cache = PlaceCache(inspector, clock=clock)
    pod = _pod("reg/a:1", "reg/b:1")
    assert cache.lookup(pod, CFG) is None
    assert cache.schedule_fill(pod, CFG) is True
    assert inspector.calls == []  # nothing on the caller's path
    await cache.idle()
    found = cache.lookup(pod, CFG)
    assert found is not None and sorted(found) == ["reg/a:1", "reg/b:1"]
    assert cache.stats.hits == 1 and cache.stats.misses == 1


async def test_entries_expire_after_the_configs_ttl() -> None:
    clock = _Clock()
    cache = PlaceCache(_Inspector(), clock=clock)
    pod = _pod("reg/a:1")
    cache.schedule_fill(pod, CFG)
    await cache.idle()
    clock.now += 59.0
    assert cache.lookup(pod, CFG) is not None
    clock.now += 1.0
    assert cache.lookup(pod, CFG) is None
    shorter = PlacementConfig(image_inspection=ImageInspectionConfig(cache_ttl_seconds=10.0))
    cache.schedule_fill(pod, CFG)
    await cache.idle()
    clock.now += 10.0
    assert cache.lookup(pod, shorter) is None


async def test_entries_age_from_the_registry_answer_not_from_the_fill() -> None:
    """A fill at 1000 gets a copy the inspector fetched at 950 (from its own cache): with a
    60 s TTL the entry expires at 1010, not 1060."""
    inspector, clock = _Inspector(), _Clock()
    inspector.fetched_at["reg/a:1"] = 950.0
    cache = PlaceCache(inspector, clock=clock)
    pod = _pod("reg/a:1")
    cache.schedule_fill(pod, CFG)
    await cache.idle()
    clock.now = 1009.9
    assert cache.lookup(pod, CFG) is not None
    clock.now = 1010.0
    assert cache.lookup(pod, CFG) is None


async def test_fills_ask_the_inspector_for_results_younger_than_the_ttl() -> None:
    inspector = _Inspector()
    cache = PlaceCache(inspector)
    cache.schedule_fill(_pod("reg/a:1"), CFG)
    await cache.idle()
    assert inspector.max_ages == [60.0]


async def test_a_fetch_time_in_the_future_counts_as_the_fill_time() -> None:
    inspector, clock = _Inspector(), _Clock()
    inspector.fetched_at["reg/a:1"] = 5000.0
    cache = PlaceCache(inspector, clock=clock)
    pod = _pod("reg/a:1")
    cache.schedule_fill(pod, CFG)
    await cache.idle()
    clock.now = 1059.9
    assert cache.lookup(pod, CFG) is not None
    clock.now = 1060.0
    assert cache.lookup(pod, CFG) is None


async def test_least_recently_used_entries_go_first() -> None:
    cache = PlaceCache(_Inspector(), max_entries=2)
    for ref in ("reg/a:1", "reg/b:1"):
        cache.schedule_fill(_pod(ref), CFG)
    await cache.idle()
    assert cache.lookup(_pod("reg/a:1"), CFG) is not None  # a is now the newest
    cache.schedule_fill(_pod("reg/c:1"), CFG)
    await cache.idle()
    assert len(cache) == 2 and cache.stats.evicted == 1
    assert cache.lookup(_pod("reg/b:1"), CFG) is None
    assert cache.lookup(_pod("reg/a:1"), CFG) is not None
    assert cache.lookup(_pod("reg/c:1"), CFG) is not None


async def test_concurrent_fills_of_the_same_key_are_deduplicated() -> None:
    inspector = _Inspector()
    inspector.gate = asyncio.Event()
    cache = PlaceCache(inspector)
    pod = _pod("reg/a:1")
    assert cache.schedule_fill(pod, CFG) is True
    for _ in range(5):
        assert cache.schedule_fill(pod, CFG) is False
    await asyncio.sleep(0)
    inspector.gate.set()
    await cache.idle()
    assert [c[0] for c in inspector.calls] == ["reg/a:1"]
    assert cache.stats.fills_deduplicated == 5
    # stored now: nothing more to fill
    assert cache.schedule_fill(pod, CFG) is False


async def test_fills_are_bounded_in_concurrency_and_queue() -> None:
    inspector = _Inspector()
    inspector.gate = asyncio.Event()
    cache = PlaceCache(inspector, max_concurrent_fills=2, max_queued_fills=3)
    results = [cache.schedule_fill(_pod(f"reg/i{i}:1"), CFG) for i in range(10)]
    assert results == [True] * 3 + [False] * 7  # the workers have not run yet
    await asyncio.sleep(0.01)
    assert inspector.max_running <= 2
    assert cache.schedule_fill(_pod("reg/late:1"), CFG) is True  # queue drained
    assert cache.stats.fills_dropped == 7
    inspector.gate.set()
    await cache.idle()
    assert inspector.max_running == 2 and len(cache) == 4


async def test_fills_are_anonymous_and_a_private_image_is_never_stored() -> None:
    """The webhook reads no Secret: a pod's pull secrets change nothing, the inspector is
    never given credentials, and an image the registry refuses without them (401) is not
    stored, for any namespace."""
    cfg = PlacementConfig(image_inspection=ImageInspectionConfig(
        cache_ttl_seconds=60.0, global_pull_secret=ObjectRef("ops", "global")))
    inspector = _Inspector({"priv.example/app:1": "alice"})
    cache = PlaceCache(inspector)
    private = _pod("priv.example/app:1", secrets=("pull",))
    cache.schedule_fill(private, cfg)
    await cache.idle()
    assert inspector.calls == [("priv.example/app:1", ())]
    assert cache.lookup(private, cfg) is None and len(cache) == 0
    assert cache.stats.fills_failed == 1


async def test_one_anonymous_result_answers_every_pod_of_the_image() -> None:
    inspector = _Inspector()
    cache = PlaceCache(inspector)
    cache.schedule_fill(_pod("reg/a:1", secrets=("pull",)), CFG)
    await cache.idle()
    assert inspector.calls == [("reg/a:1", ())]
    # with other secrets, or none: the same anonymous answer (whatever the namespace)
    assert cache.lookup(_pod("reg/a:1"), CFG) is not None
    assert cache.lookup(_pod("reg/a:1", secrets=("x", "y")), CFG) is not None
    assert cache.schedule_fill(_pod("reg/a:1", secrets=("z",)), CFG) is False


def test_keys_are_the_image_references_as_written() -> None:
    assert cache_keys(_pod("reg/a:1", "reg/a:1", "reg/b", secrets=("z", "b"))) == {
        "reg/a:1": "reg/a:1", "reg/b": "reg/b"}


async def test_aclose_cancels_running_fills() -> None:
    inspector = _Inspector()
    inspector.gate = asyncio.Event()
    cache = PlaceCache(inspector)
    cache.schedule_fill(_pod("reg/a:1"), CFG)
    await asyncio.sleep(0.01)
    await cache.aclose()
    assert len(cache) == 0 and inspector.running == 0


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PlaceCache(_Inspector(), max_queued_fills=0)
