"""The webhook's per-credential cache: background fills, TTL counted from when a registry
answered (the result's fetched_at, not the fill), LRU, deduplication, bounds, and results
never crossing namespaces or pull secrets."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import posixpath
from collections.abc import Sequence
from typing import Any

import pytest

from podplacement.imageinspect import Credential
from podplacement.rules.config import ImageInspectionConfig, ObjectRef, PlacementConfig
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
    def __init__(self, secrets: dict[tuple[str, str], Any]) -> None:
        self.secrets = secrets
        self.reads: list[str] = []

    async def request(self, method: str, path: str) -> Any:
        assert method == "GET"
        self.reads.append(path)
        parts = path.split("/")
        value = self.secrets.get((parts[4], parts[6]), _Status(404))
        if isinstance(value, Exception):
            raise value
        return value


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
                raise _Status(401)
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
    cache = PlaceCache(_Client({}), inspector, clock=clock)
    pod = _pod("reg/a:1", "reg/b:1")
    assert cache.lookup(pod, "ns", CFG) is None
    assert cache.schedule_fill(pod, "ns", CFG) is True
    assert inspector.calls == []  # nothing on the caller's path
    await cache.idle()
    found = cache.lookup(pod, "ns", CFG)
    assert found is not None and sorted(found) == ["reg/a:1", "reg/b:1"]
    assert cache.stats.hits == 1 and cache.stats.misses == 1


async def test_entries_expire_after_the_configs_ttl() -> None:
    clock = _Clock()
    cache = PlaceCache(_Client({}), _Inspector(), clock=clock)
    pod = _pod("reg/a:1")
    cache.schedule_fill(pod, "ns", CFG)
    await cache.idle()
    clock.now += 59.0
    assert cache.lookup(pod, "ns", CFG) is not None
    clock.now += 1.0
    assert cache.lookup(pod, "ns", CFG) is None
    shorter = PlacementConfig(image_inspection=ImageInspectionConfig(cache_ttl_seconds=10.0))
    cache.schedule_fill(pod, "ns", CFG)
    await cache.idle()
    clock.now += 10.0
    assert cache.lookup(pod, "ns", shorter) is None


async def test_entries_age_from_the_registry_answer_not_from_the_fill() -> None:
    """A fill at 1000 gets a copy the inspector fetched at 950 (from its own cache): with a
    60 s TTL the entry expires at 1010, not 1060."""
    inspector, clock = _Inspector(), _Clock()
    inspector.fetched_at["reg/a:1"] = 950.0
    cache = PlaceCache(_Client({}), inspector, clock=clock)
    pod = _pod("reg/a:1")
    cache.schedule_fill(pod, "ns", CFG)
    await cache.idle()
    clock.now = 1009.9
    assert cache.lookup(pod, "ns", CFG) is not None
    clock.now = 1010.0
    assert cache.lookup(pod, "ns", CFG) is None


async def test_fills_ask_the_inspector_for_results_younger_than_the_ttl() -> None:
    inspector = _Inspector()
    cache = PlaceCache(_Client({}), inspector)
    cache.schedule_fill(_pod("reg/a:1"), "ns", CFG)
    await cache.idle()
    assert inspector.max_ages == [60.0]


async def test_a_fetch_time_in_the_future_counts_as_the_fill_time() -> None:
    inspector, clock = _Inspector(), _Clock()
    inspector.fetched_at["reg/a:1"] = 5000.0
    cache = PlaceCache(_Client({}), inspector, clock=clock)
    pod = _pod("reg/a:1")
    cache.schedule_fill(pod, "ns", CFG)
    await cache.idle()
    clock.now = 1059.9
    assert cache.lookup(pod, "ns", CFG) is not None
    clock.now = 1060.0
    assert cache.lookup(pod, "ns", CFG) is None


async def test_least_recently_used_entries_go_first() -> None:
    cache = PlaceCache(_Client({}), _Inspector(), max_entries=2)
    for ref in ("reg/a:1", "reg/b:1"):
        cache.schedule_fill(_pod(ref), "ns", CFG)
    await cache.idle()
    assert cache.lookup(_pod("reg/a:1"), "ns", CFG) is not None  # a is now the newest
    cache.schedule_fill(_pod("reg/c:1"), "ns", CFG)
    await cache.idle()
    assert len(cache) == 2 and cache.stats.evicted == 1
    assert cache.lookup(_pod("reg/b:1"), "ns", CFG) is None
    assert cache.lookup(_pod("reg/a:1"), "ns", CFG) is not None
    assert cache.lookup(_pod("reg/c:1"), "ns", CFG) is not None


async def test_concurrent_fills_of_the_same_key_are_deduplicated() -> None:
    inspector = _Inspector()
    inspector.gate = asyncio.Event()
    cache = PlaceCache(_Client({}), inspector)
    pod = _pod("reg/a:1")
    assert cache.schedule_fill(pod, "ns", CFG) is True
    for _ in range(5):
        assert cache.schedule_fill(pod, "ns", CFG) is False
    await asyncio.sleep(0)
    inspector.gate.set()
    await cache.idle()
    assert [c[0] for c in inspector.calls] == ["reg/a:1"]
    assert cache.stats.fills_deduplicated == 5
    # stored now: nothing more to fill
    assert cache.schedule_fill(pod, "ns", CFG) is False


async def test_fills_are_bounded_in_concurrency_and_queue() -> None:
    inspector = _Inspector()
    inspector.gate = asyncio.Event()
    cache = PlaceCache(_Client({}), inspector, max_concurrent_fills=2, max_queued_fills=3)
    results = [cache.schedule_fill(_pod(f"reg/i{i}:1"), "ns", CFG) for i in range(10)]
    assert results == [True] * 3 + [False] * 7  # the workers have not run yet
    await asyncio.sleep(0.01)
    assert inspector.max_running <= 2
    assert cache.schedule_fill(_pod("reg/late:1"), "ns", CFG) is True  # queue drained
    assert cache.stats.fills_dropped == 7
    inspector.gate.set()
    await cache.idle()
    assert inspector.max_running == 2 and len(cache) == 4


async def test_a_result_learned_with_a_secret_never_answers_another_namespace() -> None:
    secret_a = _secret("a", "pull", "priv.example", "alice")
    client = _Client({("a", "pull"): secret_a})
    inspector = _Inspector({"priv.example/app:1": "alice"})
    cache = PlaceCache(client, inspector)
    pod_a = _pod("priv.example/app:1", secrets=("pull",))
    cache.schedule_fill(pod_a, "a", CFG)
    await cache.idle()
    assert cache.lookup(pod_a, "a", CFG) is not None
    assert inspector.calls == [("priv.example/app:1", ("alice",))]
    # Same pod spec in namespace b: another key; its own fill reads b's (missing) secret.
    assert cache.lookup(pod_a, "b", CFG) is None
    cache.schedule_fill(pod_a, "b", CFG)
    await cache.idle()
    assert cache.lookup(pod_a, "b", CFG) is None  # 401 without alice's secret: not stored
    assert client.reads[-1] == "/api/v1/namespaces/b/secrets/pull"
    # In namespace a, other secrets (or none) are other keys too.
    assert cache.lookup(_pod("priv.example/app:1"), "a", CFG) is None
    assert cache.lookup(_pod("priv.example/app:1", secrets=("pull", "x")), "a", CFG) is None
    assert cache.lookup(_pod("priv.example/app:1", secrets=("pull", "pull")), "a",
                        CFG) is not None


def test_keys_name_namespace_the_controllers_secrets_in_order_and_image() -> None:
    cfg = PlacementConfig(image_inspection=ImageInspectionConfig(
        global_pull_secret=ObjectRef("ops", "global")))
    keys = cache_keys(_pod("reg/a:1", "reg/a:1", secrets=("z", "b", "z")), "ns", cfg)
    assert keys == {"reg/a:1": ((("", "ns"), ("ns", "z"), ("ns", "b"), ("ops", "global")),
                                "reg/a:1")}
    assert cache_keys(_pod("reg/a:1"), "ns", CFG) == {"reg/a:1": ((("", "ns"),), "reg/a:1")}
    # a pod of another namespace naming no secret never shares a key with this one
    assert cache_keys(_pod("reg/a:1"), "other", CFG) != cache_keys(_pod("reg/a:1"), "ns", CFG)


async def test_global_secret_is_read_and_forbidden_secrets_are_skipped() -> None:
    cfg = PlacementConfig(image_inspection=ImageInspectionConfig(
        global_pull_secret=ObjectRef("ops", "global")))
    client = _Client({("ops", "global"): _secret("ops", "global", "priv.example", "ops"),
                      ("ns", "denied"): _Status(403)})
    inspector = _Inspector({"priv.example/app:1": "ops"})
    cache = PlaceCache(client, inspector)
    pod = _pod("priv.example/app:1", secrets=("denied",))
    cache.schedule_fill(pod, "ns", cfg)
    await cache.idle()
    assert client.reads == ["/api/v1/namespaces/ns/secrets/denied",
                            "/api/v1/namespaces/ops/secrets/global"]
    assert cache.lookup(pod, "ns", cfg) is not None


async def test_a_secret_read_error_abandons_the_fill_and_frees_the_key() -> None:
    client = _Client({("ns", "pull"): _Status(500)})
    inspector = _Inspector()
    cache = PlaceCache(client, inspector)
    pod = _pod("reg/a:1", secrets=("pull",))
    cache.schedule_fill(pod, "ns", CFG)
    await cache.idle()
    assert inspector.calls == [] and cache.stats.fills_failed == 1
    assert cache.lookup(pod, "ns", CFG) is None
    client.secrets[("ns", "pull")] = _secret("ns", "pull", "reg", "u")
    assert cache.schedule_fill(pod, "ns", CFG) is True
    await cache.idle()
    assert cache.lookup(pod, "ns", CFG) is not None


async def test_aclose_cancels_running_fills() -> None:
    inspector = _Inspector()
    inspector.gate = asyncio.Event()
    cache = PlaceCache(_Client({}), inspector)
    cache.schedule_fill(_pod("reg/a:1"), "ns", CFG)
    await asyncio.sleep(0.01)
    await cache.aclose()
    assert len(cache) == 0 and inspector.running == 0


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PlaceCache(_Client({}), _Inspector(), max_queued_fills=0)


class _ResolvingClient(_Client):
    """Resolves ``.`` and ``..`` segments before answering, as the HTTP client does
    (yarl normalises a URL's path): a name with ``..`` pasted into a path reads elsewhere."""

    async def request(self, method: str, path: str) -> Any:
        return await super().request(method, posixpath.normpath(path))


@pytest.mark.parametrize("name", ["../../b/secrets/pull", "x/../../../b/secrets/pull", ".."])
async def test_a_pull_secret_name_is_never_a_path_into_another_namespace(name: str) -> None:
    client = _ResolvingClient({("b", "pull"): _secret("b", "pull", "priv.example", "bob")})
    inspector = _Inspector({"priv.example/app:1": "bob"})
    cache = PlaceCache(client, inspector)
    pod = _pod("priv.example/app:1", secrets=(name,))
    cache.schedule_fill(pod, "a", CFG)
    await cache.idle()
    assert client.reads == []  # the name is refused before any request
    assert inspector.calls == [("priv.example/app:1", ())]  # anonymous: 401, not stored
    assert cache.lookup(pod, "a", CFG) is None
