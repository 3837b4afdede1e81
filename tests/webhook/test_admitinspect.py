"""Inspection at admission (webhook.admitinspect): the budget, one flight per (credentials,
image) however many reviews ask, results stored in the place cache, dry runs that touch
nothing, revalidation of ``imagePullPolicy: Always`` images, and the bounds."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from typing import Any

import pytest

from podplacement.imageinspect import Credential
from podplacement.rules.config import ImageInspectionConfig, PlacementConfig
from podplacement.webhook.admitinspect import (
    AdmissionInspector,
    NotInspected,
    NotInspectedInTime,
    TooManyInspections,
)
from podplacement.webhook.placecache import PlaceCache, cache_keys
from tests.controller._pods import img

CFG = PlacementConfig(image_inspection=ImageInspectionConfig(cache_ttl_seconds=60.0))


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _secret(ns: str, name: str, registry: str, user: str) -> dict[str, Any]:
    auth = base64.b64encode(f"{user}:pw".encode()).decode()
    config = json.dumps({"auths": {registry: {"auth": auth}}}).encode()
    return {"metadata": {"namespace": ns, "name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()}}


class _Client:
    """Pull Secrets by (namespace, name); counts reads; may hold them on ``gate``."""

    def __init__(self, secrets: dict[tuple[str, str], Any] | None = None) -> None:
        self.secrets = secrets or {}
        self.reads: list[str] = []
        self.gate: asyncio.Event | None = None

    async def request(self, method: str, path: str) -> Any:
        self.reads.append(path)
        if self.gate is not None:
            await self.gate.wait()
        parts = path.split("/")
        value = self.secrets.get((parts[4], parts[6]), _Status(404))
        if isinstance(value, Exception):
            raise value
        return value


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


def _setup(**kwargs: Any) -> tuple[AdmissionInspector, _Inspector, _Client, PlaceCache]:
    inspector, client = _Inspector(), _Client(kwargs.pop("secrets", None))
    cache = PlaceCache(client, inspector, clock=kwargs.pop("clock", _Clock()))
    return AdmissionInspector(client, inspector, cache=cache, **kwargs), inspector, client, cache


async def test_concurrent_reviews_of_one_image_and_credentials_share_one_inspection() -> None:
    secrets = {("ns", "pull"): _secret("ns", "pull", "reg.example", "alice")}
    at, inspector, client, cache = _setup(secrets=secrets)
    inspector.gate = asyncio.Event()
    pod = _pod("reg.example/app:1", "reg.example/side:1", secrets=("pull",))

    async def review() -> Any:
        return await at.pod_images(pod, "ns", CFG, budget=5.0)

    reviews = [asyncio.ensure_future(review()) for _ in range(25)]
    await asyncio.sleep(0.05)
    inspector.gate.set()
    found = await asyncio.gather(*reviews)
    # one inspection per image, one read of the Secret for both flights
    assert sorted(c[0] for c in inspector.calls) == ["reg.example/app:1", "reg.example/side:1"]
    assert {c[1] for c in inspector.calls} == {("alice",)}
    assert client.reads == ["/api/v1/namespaces/ns/secrets/pull"]
    assert all(f.complete and set(f.inspected) == set(f.results) for f in found)
    assert at.stats.flights_started == 2 and at.stats.flights_joined == 48
    # stored for the pod's credentials: the next review is answered from the cache
    assert cache.lookup(pod, "ns", CFG) is not None
    again = await at.pod_images(pod, "ns", CFG)
    assert again.complete and set(again.from_cache) == set(again.results)
    assert len(inspector.calls) == 2 and at.in_flight() == 0


async def test_a_flight_asks_for_a_result_younger_than_the_cache_ttl() -> None:
    """The webhook's inspector caches for its own (longer) TTL: a flight must not place a
    pod with a copy of a registry answer older than the config's cacheTTL."""
    at, inspector, _, _ = _setup()
    await at.pod_images(_pod("reg.example/app:1"), "ns", CFG, budget=5.0)
    assert inspector.max_ages == [CFG.image_inspection.cache_ttl_seconds]


async def test_other_credentials_are_another_flight() -> None:
    at, inspector, _, cache = _setup()
    inspector.gate = asyncio.Event()
    pod = _pod("reg.example/app:1")
    a = asyncio.ensure_future(at.pod_images(pod, "a", CFG, budget=5.0))
    b = asyncio.ensure_future(at.pod_images(pod, "b", CFG, budget=5.0))
    await asyncio.sleep(0.01)
    inspector.gate.set()
    await asyncio.gather(a, b)
    assert len(inspector.calls) == 2 and at.stats.flights_joined == 0
    assert cache.lookup(pod, "a", CFG) is not None and cache.lookup(pod, "b", CFG) is not None


async def test_a_review_leaves_after_its_budget_and_the_flight_fills_the_cache() -> None:
    at, inspector, _, cache = _setup(budget=0.05)
    inspector.gate = asyncio.Event()
    pod = _pod("reg.example/slow:1")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    found = await at.pod_images(pod, "ns", CFG)
    assert loop.time() - t0 < 1.0
    error = found.results["reg.example/slow:1"]
    assert isinstance(error, NotInspectedInTime) and not found.complete
    assert at.stats.budget_exceeded == 1 and at.in_flight() == 1
    assert cache.lookup(pod, "ns", CFG) is None
    inspector.gate.set()
    await asyncio.wait_for(at.idle(), 5)
    assert cache.lookup(pod, "ns", CFG) is not None
    assert (await at.pod_images(pod, "ns", CFG)).complete and len(inspector.calls) == 1


async def test_a_dry_run_reads_the_cache_only_and_leaves_it_untouched() -> None:
    clock = _Clock()
    at, inspector, client, cache = _setup(clock=clock)
    new = _pod("reg.example/new:1", secrets=("pull",))
    found = await at.pod_images(new, "ns", CFG, dry_run=True)
    assert isinstance(found.results["reg.example/new:1"], NotInspected)
    assert inspector.calls == [] and client.reads == [] and len(cache) == 0
    # a cached image answers; an expired entry is neither used nor dropped
    known = _pod("reg.example/known:1", "reg.example/old:1")
    keys = cache_keys(known, "ns", CFG)
    cache.store(keys["reg.example/old:1"], img("reg.example/old:1", "linux/amd64"))
    clock.now += 61
    cache.store(keys["reg.example/known:1"], img("reg.example/known:1", "linux/amd64"))
    before = list(cache._entries.items())
    found = await at.pod_images(known, "ns", CFG, dry_run=True)
    assert found.from_cache == ("reg.example/known:1",)
    assert isinstance(found.results["reg.example/old:1"], NotInspected)
    assert list(cache._entries.items()) == before
    assert inspector.calls == [] and client.reads == []


async def test_always_pulled_images_are_revalidated_not_answered_from_the_cache() -> None:
    at, inspector, _, cache = _setup()
    pod = _pod("reg.example/app:latest", always=True)
    cache.store(cache_keys(pod, "ns", CFG)["reg.example/app:latest"],
                img("reg.example/app:latest", "linux/arm64"))
    plain = await at.pod_images(pod, "ns", CFG)
    assert plain.from_cache == ("reg.example/app:latest",) and inspector.calls == []
    fresh = await at.pod_images(pod, "ns", CFG, revalidate=True)
    assert inspector.calls == [("reg.example/app:latest", (), True)]
    assert fresh.inspected == ("reg.example/app:latest",)
    dry = await at.pod_images(pod, "ns", CFG, revalidate=True, dry_run=True)
    assert isinstance(dry.results["reg.example/app:latest"], NotInspected)
    assert len(inspector.calls) == 1


async def test_failures_are_results_and_are_not_stored() -> None:
    at, inspector, _, cache = _setup(secrets={("ns", "pull"): _Status(500)})
    with_secret = await at.pod_images(_pod("reg.example/a:1", secrets=("pull",)), "ns", CFG)
    error = with_secret.results["reg.example/a:1"]
    assert isinstance(error, _Status) and error.status == 500 and inspector.calls == []
    inspector.fail = _Status(404)
    found = await at.pod_images(_pod("reg.example/b:1"), "ns", CFG)
    assert isinstance(found.results["reg.example/b:1"], _Status)
    assert len(cache) == 0 and at.stats.flights_failed == 2


async def test_flights_are_bounded_in_number_and_time() -> None:
    at, inspector, _, _ = _setup(max_flights=2, flight_timeout=0.2)
    inspector.gate = asyncio.Event()
    found = await at.pod_images(_pod("r/a:1", "r/b:1", "r/c:1"), "ns", CFG, budget=0.01)
    kinds = [type(found.results[i]) for i in ("r/a:1", "r/b:1", "r/c:1")]
    assert kinds == [NotInspectedInTime, NotInspectedInTime, TooManyInspections]
    assert at.stats.refused == 1
    await asyncio.sleep(0.4)  # the flights' own timeout ended them
    assert at.in_flight() == 0 and at.stats.flights_failed == 2


async def test_aclose_cancels_the_flights() -> None:
    at, inspector, _, cache = _setup()
    inspector.gate = asyncio.Event()
    await at.pod_images(_pod("r/a:1"), "ns", CFG, budget=0.0)
    assert at.in_flight() == 1
    await at.aclose()
    assert at.in_flight() == 0 and len(cache) == 0


def test_bounds_must_be_positive() -> None:
    for kwargs in ({"budget": 0.0}, {"max_flights": 0}, {"flight_timeout": -1.0}):
        with pytest.raises(ValueError):
            AdmissionInspector(_Client(), _Inspector(), **kwargs)
