"""Inspection at admission (webhook.admitinspect): anonymous always, the budget, one flight
per image however many reviews ask (of any namespace), results stored in the place cache,
dry runs that touch nothing, revalidation of ``imagePullPolicy: Always`` images, the bounds,
and which pods need their pull Secrets (the controller's)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from podplacement.imageinspect import Credential, Denied, NotFound, ServerError, Unauthorized
from podplacement.rules.config import ImageInspectionConfig, ObjectRef, PlacementConfig
from podplacement.webhook.admitinspect import (
    AdmissionInspector,
    NotInspected,
    NotInspectedInTime,
    PodImages,
    TooManyInspections,
    needs_credentials,
)
from podplacement.webhook.placecache import PlaceCache, cache_keys
from tests.controller._pods import img

CFG = PlacementConfig(image_inspection=ImageInspectionConfig(cache_ttl_seconds=60.0))


class _Inspector:
    """No single-flight of its own (unlike imageinspect.Inspector): every call counts."""

    def __init__(self, platform: str = "linux/amd64") -> None:
        self.platform = platform
        self.calls: list[tuple[str, tuple[str, ...], bool]] = []
        self.max_ages: list[float | None] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def inspect(self, image: str, credentials: Sequence[Credential] = (), *,
                      pull_always: bool = False, max_age: float | None = None) -> Any:
        self.calls.append((image, tuple(c.username for c in credentials), pull_always))
        self.max_ages.append(max_age)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return img(image, self.platform)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pod(*images: str, secrets: tuple[str, ...] = (), always: bool = False) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": im} for i, im in enumerate(images)]
    if always:
        for c in containers:
            c["imagePullPolicy"] = "Always"
    spec: dict[str, Any] = {"containers": containers}
    if secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in secrets]
    return {"metadata": {"name": "p"}, "spec": spec}


def _setup(**kwargs: Any) -> tuple[AdmissionInspector, _Inspector, PlaceCache]:
    inspector = _Inspector()
    cache = PlaceCache(inspector, clock=kwargs.pop("clock", _Clock()))
    return AdmissionInspector(inspector, cache=cache, **kwargs), inspector, cache


async def test_concurrent_reviews_of_one_image_share_one_anonymous_inspection() -> None:
    at, inspector, cache = _setup()
    inspector.gate = asyncio.Event()
    pod = _pod("reg.example/app:1", "reg.example/side:1", secrets=("pull",))

    async def review() -> Any:
        return await at.pod_images(pod, CFG, budget=5.0)

    reviews = [asyncio.ensure_future(review()) for _ in range(25)]
    await asyncio.sleep(0.05)
    inspector.gate.set()
    found = await asyncio.gather(*reviews)
    # one inspection per image, without credentials: the pod's pull secret is not read
    assert sorted(c[0] for c in inspector.calls) == ["reg.example/app:1", "reg.example/side:1"]
    assert {c[1] for c in inspector.calls} == {()}
    assert all(f.complete and set(f.inspected) == set(f.results) for f in found)
    assert at.stats.flights_started == 2 and at.stats.flights_joined == 48
    # stored: the next review is answered from the cache
    assert cache.lookup(pod, CFG) is not None
    again = await at.pod_images(pod, CFG)
    assert again.complete and set(again.from_cache) == set(again.results)
    assert len(inspector.calls) == 2 and at.in_flight() == 0


async def test_a_flight_asks_for_a_result_younger_than_the_cache_ttl() -> None:
    """The webhook's inspector caches for its own (longer) TTL: a flight must not place a
    pod with a copy of a registry answer older than the config's cacheTTL."""
    at, inspector, _ = _setup()
    await at.pod_images(_pod("reg.example/app:1"), CFG, budget=5.0)
    assert inspector.max_ages == [CFG.image_inspection.cache_ttl_seconds]


async def test_pods_with_other_pull_secrets_share_the_flight() -> None:
    """Anonymous results are the same for every pod: other pull secrets (in any namespace)
    join the same flight, and nobody's credentials are used."""
    at, inspector, cache = _setup()
    inspector.gate = asyncio.Event()
    a = asyncio.ensure_future(at.pod_images(_pod("reg.example/app:1", secrets=("a",)), CFG,
                                            budget=5.0))
    b = asyncio.ensure_future(at.pod_images(_pod("reg.example/app:1"), CFG, budget=5.0))
    await asyncio.sleep(0.01)
    inspector.gate.set()
    await asyncio.gather(a, b)
    assert inspector.calls == [("reg.example/app:1", (), False)]
    assert at.stats.flights_joined == 1
    assert cache.lookup(_pod("reg.example/app:1", secrets=("b",)), CFG) is not None


async def test_a_review_leaves_after_its_budget_and_the_flight_fills_the_cache() -> None:
    at, inspector, cache = _setup(budget=0.05)
    inspector.gate = asyncio.Event()
    pod = _pod("reg.example/slow:1")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    found = await at.pod_images(pod, CFG)
    assert loop.time() - t0 < 1.0
    error = found.results["reg.example/slow:1"]
    assert isinstance(error, NotInspectedInTime) and not found.complete
    assert at.stats.budget_exceeded == 1 and at.in_flight() == 1
    assert cache.lookup(pod, CFG) is None
    inspector.gate.set()
    await asyncio.wait_for(at.idle(), 5)
    assert cache.lookup(pod, CFG) is not None
    assert (await at.pod_images(pod, CFG)).complete and len(inspector.calls) == 1


async def test_a_dry_run_reads_the_cache_only_and_leaves_it_untouched() -> None:
    clock = _Clock()
    at, inspector, cache = _setup(clock=clock)
    new = _pod("reg.example/new:1", secrets=("pull",))
    found = await at.pod_images(new, CFG, dry_run=True)
    assert isinstance(found.results["reg.example/new:1"], NotInspected)
    assert inspector.calls == [] and len(cache) == 0
    # a cached image answers; an expired entry is neither used nor dropped
    known = _pod("reg.example/known:1", "reg.example/old:1")
    keys = cache_keys(known)
    cache.store(keys["reg.example/old:1"], img("reg.example/old:1", "linux/amd64"))
    clock.now += 61
    cache.store(keys["reg.example/known:1"], img("reg.example/known:1", "linux/amd64"))
    before = list(cache._entries.items())
    found = await at.pod_images(known, CFG, dry_run=True)
    assert found.from_cache == ("reg.example/known:1",)
    assert isinstance(found.results["reg.example/old:1"], NotInspected)
    assert list(cache._entries.items()) == before
    assert inspector.calls == []


async def test_always_pulled_images_are_revalidated_not_answered_from_the_cache() -> None:
    at, inspector, cache = _setup()
    pod = _pod("reg.example/app:latest", always=True)
    cache.store(cache_keys(pod)["reg.example/app:latest"],
                img("reg.example/app:latest", "linux/arm64"))
    plain = await at.pod_images(pod, CFG)
    assert plain.from_cache == ("reg.example/app:latest",) and inspector.calls == []
    fresh = await at.pod_images(pod, CFG, revalidate=True)
    assert inspector.calls == [("reg.example/app:latest", (), True)]
    assert fresh.inspected == ("reg.example/app:latest",)
    dry = await at.pod_images(pod, CFG, revalidate=True, dry_run=True)
    assert isinstance(dry.results["reg.example/app:latest"], NotInspected)
    assert len(inspector.calls) == 1


async def test_failures_are_results_and_are_not_stored() -> None:
    at, inspector, cache = _setup()
    inspector.fail = Unauthorized("authentication required", status=401)
    private = await at.pod_images(_pod("reg.example/a:1", secrets=("pull",)), CFG)
    assert isinstance(private.results["reg.example/a:1"], Unauthorized)
    assert inspector.calls == [("reg.example/a:1", (), False)]
    inspector.fail = ServerError("down", status=500)
    found = await at.pod_images(_pod("reg.example/b:1"), CFG)
    assert isinstance(found.results["reg.example/b:1"], ServerError)
    assert len(cache) == 0 and at.stats.flights_failed == 2


@pytest.mark.parametrize("error", [Unauthorized("x", status=401), Denied("x", status=403),
                                   NotFound("x", status=404)])
def test_an_image_refused_anonymously_needs_the_pods_pull_secrets(error: Exception) -> None:
    refused = PodImages({"reg/a:1": error, "reg/b:1": img("reg/b:1", "linux/amd64")})
    assert needs_credentials(_pod("reg/a:1", "reg/b:1", secrets=("pull",)), CFG, refused)
    # no pull secret: the controller could not do better, it is a failure
    assert not needs_credentials(_pod("reg/a:1", "reg/b:1"), CFG, refused)
    # the config's global pull secret counts as the controller's credentials
    glob = PlacementConfig(image_inspection=ImageInspectionConfig(
        global_pull_secret=ObjectRef("ops", "global")))
    assert needs_credentials(_pod("reg/a:1", "reg/b:1"), glob, refused)
    # a registry that failed (not refused) or a late inspection: not a matter of credentials
    for other in (ServerError("x", status=500), NotInspectedInTime("reg/a:1", 0.3)):
        assert not needs_credentials(_pod("reg/a:1", secrets=("pull",)), CFG,
                                     PodImages({"reg/a:1": other}))


async def test_flights_are_bounded_in_number_and_time() -> None:
    at, inspector, _ = _setup(max_flights=2, flight_timeout=0.2)
    inspector.gate = asyncio.Event()
    found = await at.pod_images(_pod("r/a:1", "r/b:1", "r/c:1"), CFG, budget=0.01)
    kinds = [type(found.results[i]) for i in ("r/a:1", "r/b:1", "r/c:1")]
    assert kinds == [NotInspectedInTime, NotInspectedInTime, TooManyInspections]
    assert at.stats.refused == 1
    await asyncio.sleep(0.4)  # the flights' own timeout ended them
    assert at.in_flight() == 0 and at.stats.flights_failed == 2


async def test_aclose_cancels_the_flights() -> None:
    at, inspector, cache = _setup()
    inspector.gate = asyncio.Event()
    await at.pod_images(_pod("r/a:1"), CFG, budget=0.0)
    assert at.in_flight() == 1
    await at.aclose()
    assert at.in_flight() == 0 and len(cache) == 0


def test_bounds_must_be_positive() -> None:
    for kwargs in ({"budget": 0.0}, {"max_flights": 0}, {"flight_timeout": -1.0}):
        with pytest.raises(ValueError):
            AdmissionInspector(_Inspector(), **kwargs)
