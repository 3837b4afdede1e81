"""The params object writer (controller.paramswriter) against an API server: the real
kube-apiserver v1.36.2 (marker ``realcluster``) and localkube, each with the project's CRDs
(``deploy/crds/imageplatformcatalog.yaml``). Shown: a burst of records is batched into at most a
few writes, a minimum interval apart; the object holds exactly the store's ``spec.images``,
``spec.learned`` and ``status.entries``; a full-size object (5,000 realistic references) is
accepted; TTL expiry removes keys on the server within TTL + 2 s of when they were learned,
with no record to trigger it, also after a restart (the learned times are adopted); a lost
race (409) and a deleted object are survived; an unreachable server never stops the ticks
(the work queue retries them after its backoff); an early tick writes nothing; a stopped
writer writes nothing."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest

from podplacement.controller.paramswriter import (
    PARAMS_KEY,
    ParamsWriter,
    params_collection_path,
    params_path,
)
from podplacement.controller.queue import WorkQueue
from podplacement.kubeclient import KubeAPI, NotFound
from podplacement.rules.admit.imageparams import ParamsStore, flat_catalog, platforms_value
from podplacement.rules.config import (
    DEFAULT_NAMESPACE,
    PARAMS_MAX_BYTES,
    PARAMS_MAX_ENTRIES,
)
from tests.harness.kube import KubeEnv, start_localkube
from tests.harness.realcluster import real_cluster

PARAMS_PATH = params_path(DEFAULT_NAMESPACE)
PARAMS_COLLECTION_PATH = params_collection_path(DEFAULT_NAMESPACE)
BACKENDS = ["localkube", pytest.param("real", marks=pytest.mark.realcluster)]
AMD_ARM = [("linux", "amd64"), ("linux", "arm64")]
PLATFORM_SETS = [
    [("linux", "amd64")],
    AMD_ARM,
    [("linux", "amd64"), ("linux", "arm64"), ("linux", "ppc64le"), ("linux", "s390x")],
    [("linux", "arm64"), ("linux", "amd64"), ("windows", "amd64")],
]


@pytest.fixture(scope="module", params=BACKENDS)
def pkube(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    """An API server of this module's own, with the product's namespace (where the params
    object lives)."""
    if request.param == "real":
        for env in real_cluster(tmp_path_factory, "params-real", nodes=(), scheduler=False):
            env.ensure_namespace(DEFAULT_NAMESPACE)
            yield env
        return
    _server, env = start_localkube(tmp_path_factory.mktemp("params-localkube"))
    try:
        env.ensure_namespace(DEFAULT_NAMESPACE)
        yield env
    finally:
        env.stop()


@pytest.fixture
async def api(pkube: KubeEnv) -> AsyncIterator[KubeAPI]:
    """A client, with no params object on the server to begin with."""
    client = await KubeAPI.from_kubeconfig(str(pkube.kubeconfig))
    try:
        await client.request("DELETE", PARAMS_PATH)
    except NotFound:
        pass
    try:
        yield client
    finally:
        await client.close()


class _Child:
    def __init__(self, counts: Counter[str], label: str) -> None:
        self.counts, self.label = counts, label

    def inc(self, amount: float = 1) -> None:
        self.counts[self.label] += int(amount)


class FakeCounter:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def labels(self, *labelvalues: str) -> _Child:
        return _Child(self.counts, labelvalues[0])


class FakeGauge:
    def __init__(self) -> None:
        self.value: float | None = None

    def set(self, value: float) -> None:
        self.value = value


class FakeMetrics:
    def __init__(self) -> None:
        self.entries = FakeGauge()
        self.writes = FakeCounter()


def track_writes(api: KubeAPI) -> list[tuple[str, int, float, float]]:
    """(verb, status, start time, seconds) of every create/update of the params object."""
    writes: list[tuple[str, int, float, float]] = []

    def on_request(verb: str, resource: str, status: int, seconds: float) -> None:
        if resource == "imageplatformcatalogs" and verb in ("create", "update"):
            writes.append((verb, status, time.monotonic() - seconds, seconds))

    api.on_request = on_request
    return writes


async def live(api: KubeAPI) -> dict[str, Any] | None:
    try:
        return await api.request("GET", PARAMS_PATH)
    except NotFound:
        return None


async def wait_live(api: KubeAPI, check: Callable[[dict[str, Any]], bool],
                    within: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    obj: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        obj = await live(api)
        if obj is not None and check(obj):
            return obj
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {within} s; last: {obj!r:.500}")


def images_of(obj: dict[str, Any]) -> dict[str, str]:
    """The catalog of a live object, flat (either layout: :func:`flat_catalog`)."""
    return flat_catalog(obj.get("spec") or {})[0]


def learned_of(obj: dict[str, Any]) -> dict[str, object]:
    return flat_catalog(obj.get("spec") or {})[1]


def assert_published(obj: dict[str, Any], store: ParamsStore) -> None:
    spec = obj["spec"]
    assert {k: spec.get(k) for k in store.catalog()} == store.catalog()
    assert "images" not in spec and "learned" not in spec  # only the dense layout is written
    assert images_of(obj) == store.images()
    assert learned_of(obj) == store.learned()
    assert obj["status"]["entries"] == len(store)


async def running(writer: ParamsWriter, body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` while the writer's key is served on a work queue, as the controller's
    leader serves it (a failed tick is retried after the queue's backoff, here one
    ``min_interval``); then stop the writer (a write in flight ends) and the queue."""
    queue = WorkQueue(workers=1, base_delay=writer.min_interval, max_delay=writer.min_interval,
                      jitter=0.0)
    queue.start(writer.reconcile)
    queue.add(PARAMS_KEY)
    try:
        await body()
    finally:
        await asyncio.wait_for(writer.stop(), 10)
        await queue.shutdown()


def reference(i: int, pinned: bool) -> str:
    """A realistic reference: ~125 characters by digest, ~75 by tag."""
    name = f"registry.example.internal:5000/team-{i % 97:02d}/service-{i:04d}"
    if pinned:
        return f"{name}@sha256:{hashlib.sha256(str(i).encode()).hexdigest()}"
    return f"{name}:v1.{i % 20}.{i % 7}-build.{100000 + i}"


# --- batching ---------------------------------------------------------------------------
@pytest.mark.parametrize("spread", [0.0, 1.5])
async def test_a_burst_of_200_records_is_batched_into_a_few_writes(
        api: KubeAPI, spread: float) -> None:
    """200 records over ``spread`` seconds with min_interval 1 s: at most
    ``measured spread // 1 + 2`` writes (the first tick writes what it finds), starting at
    least about a second apart."""
    store = ParamsStore(3600)
    metrics = FakeMetrics()
    writer = ParamsWriter(api, store, min_interval=1.0, metrics=metrics)
    assert await writer.load() == 0  # as the controller starts it: no GET in the first tick
    writes = track_writes(api)
    started = time.monotonic()
    recorded: list[float] = []

    async def burst() -> None:
        for i in range(200):
            store.record(reference(i, pinned=i % 2 == 0), PLATFORM_SETS[i % 4], time.time())
            await asyncio.sleep(spread / 200)
        recorded.append(time.monotonic() - started)  # longer than `spread` on a busy machine
        await wait_live(api, lambda o: o.get("status", {}).get("entries") == 200)

    await running(writer, burst)
    elapsed = time.monotonic() - started
    print(f"\n200 records over {spread} s: {len(writes)} writes "
          f"{[(w[0], round(w[2] - started, 2), round(w[3], 3)) for w in writes]} "
          "(verb, start s, took s), "
          f"all published after {elapsed:.2f} s")
    assert 1 <= len(writes) <= int(recorded[0] // 1.0) + 2
    assert all(status in (200, 201) for _verb, status, _t, _s in writes)
    assert writes[0][0] == "create" and all(w[0] == "update" for w in writes[1:])
    starts = [t for _v, _s, t, _d in writes]
    assert all(b - a >= 0.8 for a, b in itertools.pairwise(starts)), starts
    obj = await live(api)
    assert obj is not None
    assert_published(obj, store)
    assert list(images_of(obj)) == sorted(images_of(obj))
    assert images_of(obj)[reference(3, pinned=False)] == "linux/amd64,linux/arm64,windows/amd64"
    assert metrics.entries.value == 200
    assert metrics.writes.counts == Counter(
        {"created": 1, "updated": len(writes) - 1})
    assert not store.dirty


async def test_writes_are_paced_by_the_size_of_the_object(api: KubeAPI) -> None:
    """Every write replaces the whole object: after a write of N bytes the next waits
    N / write_bytes_per_second (here 20 KB at 10 KB/s: 2 s, not min_interval's 0.2 s), so
    a large catalog taking one image after another is not rewritten every second."""
    store = ParamsStore(3600)
    for i in range(200):
        store.record(reference(i, pinned=False), AMD_ARM, time.time())
    assert store.json_size > 18_000
    writer = ParamsWriter(api, store, min_interval=0.2, write_bytes_per_second=10_000)
    assert await writer.load() == 0
    writes = track_writes(api)

    async def one_by_one() -> None:
        # a new image every 0.1 s, as pods of tags never seen arrive
        for i in range(200, 240):
            store.record(reference(i, pinned=False), AMD_ARM, time.time())
            await asyncio.sleep(0.1)
        await wait_live(api, lambda o: o.get("status", {}).get("entries") == 240, 10)

    await running(writer, one_by_one)
    starts = [t for _v, _s, t, _d in writes]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    print(f"\n{len(writes)} writes of about {store.json_size} bytes, gaps {gaps}")
    assert 2 <= len(writes) <= 4, writes
    # each write held at least 18 KB: at least 1.8 s to the next (min_interval: 0.2 s)
    assert gaps and all(gap >= 1.7 for gap in gaps), gaps
    with pytest.raises(ValueError):
        ParamsWriter(api, store, write_bytes_per_second=0)


async def test_a_clean_store_is_not_written(api: KubeAPI) -> None:
    store = ParamsStore(3600)
    writer = ParamsWriter(api, store, min_interval=0.1)
    writes = track_writes(api)
    learned = time.time()
    store.record(reference(1, pinned=False), AMD_ARM, learned)
    assert await writer.flush() == "created"
    # a cached copy of the same answer: nothing new to publish
    store.record(reference(1, pinned=False), AMD_ARM, time.time(), learned=learned)
    await running(writer, lambda: asyncio.sleep(0.5))
    assert len(writes) == 1


# --- size -------------------------------------------------------------------------------
async def test_a_full_size_object_is_accepted(api: KubeAPI) -> None:
    """Realistic references (half by digest, half by tag) until the byte bound evicts: the
    API server stores the object; the store's running byte count is the size of the stored
    maps; one more record evicts the least recent entry, so the object stays within the
    byte bound (which binds before the CRD's maxProperties)."""
    store = ParamsStore(3600)
    # learned just now, one millisecond apart (the writer expires by time.time())
    base = time.time() - PARAMS_MAX_ENTRIES / 1000
    i = 0
    while not store.evictions:
        store.record(reference(i, pinned=i % 2 == 0), PLATFORM_SETS[i % 4], base + i / 1000)
        i += 1
    full = len(store)
    assert full < PARAMS_MAX_ENTRIES
    writer = ParamsWriter(api, store)
    started = time.monotonic()
    assert await writer.flush() == "created"
    write_seconds = time.monotonic() - started
    obj = await live(api)
    assert obj is not None
    assert_published(obj, store)
    size = sum(len(orjson.dumps(obj["spec"][k])) for k in store.catalog())
    assert size == store.json_size <= PARAMS_MAX_BYTES
    mean = sum(map(len, images_of(obj))) / len(store)
    whole = len(orjson.dumps(obj))
    print(f"\nfull-size params object: {len(store)} entries (mean reference {mean:.0f} chars), "
          f"catalog {size} bytes, whole object {whole} bytes "
          f"(managedFields {len(orjson.dumps(obj['metadata'].get('managedFields')))}), "
          f"created in {write_seconds:.3f} s")
    managed = obj["metadata"].get("managedFields")
    if managed is not None:  # the real server: spec.learned is an atomic map, one
        # managedFields entry instead of one per key (which would repeat every reference)
        assert '"f:learnedAt":{}' in orjson.dumps(managed).decode()
        assert '"f:repositories":{}' in orjson.dumps(managed).decode()
    assert whole < 1_572_864  # etcd's default request limit (1.5 MiB)

    newest = reference(i, pinned=True)
    store.record(newest, AMD_ARM, time.time())
    assert await writer.flush() == "updated"
    obj = await live(api)
    assert obj is not None
    assert_published(obj, store)
    assert abs(len(images_of(obj)) - full) <= 2 and store.json_size <= PARAMS_MAX_BYTES
    assert newest in images_of(obj) and reference(0, pinned=True) not in images_of(obj)
    # spec.images is an atomic map: field management tracks it as one field, so the
    # managedFields of a full-size object stay small (each key would make them ~500 KB, and
    # every write cost the API server about three times the CPU)
    managed = len(orjson.dumps(obj["metadata"].get("managedFields") or []))
    assert managed < 2_000, managed


# --- expiry -----------------------------------------------------------------------------
async def test_ttl_expiry_removes_tag_references_on_the_server(api: KubeAPI) -> None:
    store = ParamsStore(1.0)
    writer = ParamsWriter(api, store, min_interval=0.2)
    tag, pinned = reference(7, pinned=False), reference(8, pinned=True)

    async def body() -> None:
        recorded = time.time()
        store.record(tag, AMD_ARM, recorded)
        store.record(pinned, AMD_ARM, recorded)
        obj = await wait_live(api, lambda o: len(images_of(o)) == 2)
        assert learned_of(obj) == {tag: int(recorded)}  # no item for a digest
        obj = await wait_live(api, lambda o: tag not in images_of(o), within=5)
        assert time.time() - recorded >= 1.0
        assert images_of(obj) == {pinned: "linux/amd64,linux/arm64"}
        assert learned_of(obj) == {}
        assert obj["status"]["entries"] == 1

    await running(writer, body)


async def wait_gone(api: KubeAPI, image: str, within: float) -> float:
    """Poll every 0.1 s until ``image`` is not in spec.images; returns the wall time."""
    await wait_live(api, lambda o: image not in images_of(o), within=within)
    return time.time()


async def test_an_expired_entry_leaves_the_object_within_ttl_plus_2_s_with_no_record(
        api: KubeAPI) -> None:
    """Production pacing (one tick a second), TTL 3 s, one record and then none: the
    periodic tick alone expires and writes."""
    store = ParamsStore(3.0)
    writer = ParamsWriter(api, store)  # min_interval 1 s
    tag = reference(11, pinned=False)
    learned = time.time() - 0.5  # the registry answered half a second before the record

    async def body() -> None:
        store.record(tag, AMD_ARM, time.time(), learned=learned)
        await wait_live(api, lambda o: tag in images_of(o))
        gone = await wait_gone(api, tag, within=10)
        print(f"\nexpired entry gone {gone - learned:.2f} s after it was learned (TTL 3 s)")
        assert 3.0 <= gone - learned <= 3.0 + 2.0

    await running(writer, body)


async def test_a_restarted_writer_keeps_the_ages_of_the_live_entries(api: KubeAPI) -> None:
    """A controller writes an entry, stops, and a new one (new store, new writer) adopts
    the object twice over: the entry still leaves within TTL + 2 s of when it was first
    learned, and its learned time is never rewritten younger."""
    tag = reference(21, pinned=False)
    learned = time.time()
    first = ParamsStore(4.0)
    first.record(tag, AMD_ARM, learned)
    assert await ParamsWriter(api, first).flush() == "created"
    for restart in range(2):
        store = ParamsStore(4.0)
        writer = ParamsWriter(api, store)
        assert await writer.load() == 1 + restart  # tag, and the others recorded since
        # something else makes it write
        store.record(reference(22 + restart, pinned=False), AMD_ARM, time.time())
        assert await writer.flush() == "updated"
        obj = await live(api)
        assert obj is not None and learned_of(obj)[tag] == int(learned)

    async def body() -> None:
        gone = await wait_gone(api, tag, within=10)
        print(f"\nadopted entry gone {gone - learned:.2f} s after it was learned (TTL 4 s)")
        assert gone - learned <= 4.0 + 2.0

    await running(writer, body)


async def test_tag_entries_of_unknown_age_are_dropped_on_start(api: KubeAPI) -> None:
    """An object from before spec.learned: its tag references may be arbitrarily old, so a
    new leader does not adopt them (digest references stay)."""
    tag, pinned = reference(31, pinned=False), reference(32, pinned=True)
    await api.request("POST", PARAMS_COLLECTION_PATH, body={
        "apiVersion": "podplacement.io/v1beta1", "kind": "ImagePlatformCatalog",
        "metadata": {"name": "cluster"},
        "spec": {"images": {tag: "linux/amd64,linux/arm64", pinned: "linux/amd64"}},
        "status": {"entries": 2}})
    store = ParamsStore(3600)
    writer = ParamsWriter(api, store)
    assert await writer.load() == 1
    assert await writer.flush() == "updated"
    obj = await live(api)
    assert obj is not None and images_of(obj) == {pinned: "linux/amd64"}


# --- races ------------------------------------------------------------------------------
async def test_a_write_that_lost_a_race_is_retried_after_a_re_read(
        api: KubeAPI, pkube: KubeEnv) -> None:
    """Another writer changes the object between two of ours: our replace gets 409, the
    writer re-reads and replaces on the next tick; the store wins, the other writer's
    metadata (a label) is kept."""
    store = ParamsStore(3600)
    metrics = FakeMetrics()
    writer = ParamsWriter(api, store, min_interval=0.2, metrics=metrics)
    first, second = reference(1, pinned=True), reference(2, pinned=False)

    async def body() -> None:
        store.record(first, AMD_ARM, time.time())
        await wait_live(api, lambda o: first in images_of(o))
        # the other writer: a label and a foreign entry, as a merge patch (new resourceVersion)
        await api.request("PATCH", PARAMS_PATH, body={
            "metadata": {"labels": {"team": "other"}},
            "spec": {"images": {"other.example/x:1": "linux/s390x"}}})
        store.record(second, [("linux", "amd64")], time.time())
        await wait_live(api, lambda o: images_of(o) == store.images())

    await running(writer, body)
    obj = await live(api)
    assert obj is not None
    assert_published(obj, store)
    assert obj["metadata"]["labels"] == {"team": "other"}
    assert metrics.writes.counts["conflict"] == 1, metrics.writes.counts
    assert metrics.writes.counts["created"] == 1 and metrics.writes.counts["updated"] == 1


async def test_flush_retries_once_after_a_lost_race(api: KubeAPI) -> None:
    store = ParamsStore(3600)
    writer = ParamsWriter(api, store)
    store.record(reference(1, pinned=True), AMD_ARM, time.time())
    assert await writer.flush() == "created"
    await api.request("PATCH", PARAMS_PATH, body={"metadata": {"annotations": {"x": "y"}}})
    store.record(reference(2, pinned=True), AMD_ARM, time.time())
    assert await writer.flush() == "updated"
    obj = await live(api)
    assert obj is not None
    assert_published(obj, store)


async def test_a_deleted_object_is_created_again(api: KubeAPI) -> None:
    store = ParamsStore(3600)
    metrics = FakeMetrics()
    writer = ParamsWriter(api, store, min_interval=0.2, metrics=metrics)

    async def body() -> None:
        store.record(reference(1, pinned=True), AMD_ARM, time.time())
        await wait_live(api, lambda o: len(images_of(o)) == 1)
        await api.request("DELETE", PARAMS_PATH)
        store.record(reference(2, pinned=True), AMD_ARM, time.time())
        await wait_live(api, lambda o: len(images_of(o)) == 2)

    await running(writer, body)
    assert metrics.writes.counts["created"] == 2
    assert metrics.writes.counts["conflict"] == 1  # the replace that found it gone


# --- start ------------------------------------------------------------------------------
async def test_load_adopts_the_live_object_and_later_writes_replace_it(
        api: KubeAPI) -> None:
    """An object of the release before (flat ``spec.images``/``spec.learned``) is adopted
    whole, ages kept, and rewritten once in the dense layout; a new leader then adopts
    that with nothing to write."""
    live_images = {reference(i, pinned=i % 2 == 0): platforms_value(PLATFORM_SETS[i % 4])
                   for i in range(10)}
    learned = {image: int(time.time()) - 60 for image in live_images
               if not image.count("@")}
    await api.request("POST", PARAMS_COLLECTION_PATH, body={
        "apiVersion": "podplacement.io/v1beta1", "kind": "ImagePlatformCatalog",
        "metadata": {"name": "cluster"},
        "spec": {"images": live_images, "learned": learned},
        "status": {"entries": len(live_images)}})
    store = ParamsStore(3600)
    writer = ParamsWriter(api, store)
    writes = track_writes(api)
    assert await writer.load() == 10
    assert store.images() == live_images and store.learned() == learned
    assert store.dirty  # the flat layout is rewritten densely
    assert await writer.flush() == "updated"
    obj = await live(api)
    assert obj is not None
    assert_published(obj, store)
    again = ParamsStore(3600)
    assert await ParamsWriter(api, again).load() == 10
    assert again.catalog() == store.catalog() and not again.dirty
    writes.clear()
    store.record(reference(99, pinned=False), AMD_ARM, time.time())
    assert await writer.flush() == "updated"
    assert [w[0] for w in writes] == ["update"]
    obj = await live(api)
    assert obj is not None
    assert_published(obj, store)
    assert len(images_of(obj)) == 11


async def test_load_of_a_missing_object_then_create(api: KubeAPI) -> None:
    store = ParamsStore(3600)
    writer = ParamsWriter(api, store)
    assert await writer.load() == 0
    writes = track_writes(api)
    store.record(reference(1, pinned=False), AMD_ARM, time.time())
    assert await writer.flush() == "created"
    assert [w[0] for w in writes] == ["create"]


# --- failures (no server) ---------------------------------------------------------------
async def test_an_unreachable_server_never_stops_the_ticks() -> None:
    client = KubeAPI.from_url("http://127.0.0.1:9", request_timeout=1)
    store = ParamsStore(3600)
    metrics = FakeMetrics()
    writer = ParamsWriter(client, store, min_interval=0.1, metrics=metrics)
    store.record(reference(1, pinned=True), AMD_ARM, time.time())
    try:
        await running(writer, lambda: asyncio.sleep(0.5))
        assert await writer.flush() == "error"
    finally:
        await client.close()
    assert store.dirty
    assert metrics.writes.counts["error"] >= 3
    assert set(metrics.writes.counts) == {"error"}


async def test_an_early_tick_writes_nothing_and_asks_for_the_rest_of_the_interval(
        api: KubeAPI) -> None:
    """The key queued again before ``min_interval`` has passed (e.g. a new term): no
    request, and the rest of the interval as the requeue-after; on time, one write."""
    store = ParamsStore(3600)
    writer = ParamsWriter(api, store, min_interval=0.5)
    writes = track_writes(api)
    store.record(reference(1, pinned=True), AMD_ARM, time.time())
    first = await writer.reconcile(PARAMS_KEY)
    assert first is not None and 0 < first <= 0.5
    assert len(writes) == 1
    store.record(reference(2, pinned=True), AMD_ARM, time.time())
    early = await writer.reconcile(PARAMS_KEY)
    assert early is not None and 0 < early <= 0.5
    assert len(writes) == 1 and store.dirty
    await asyncio.sleep(early)
    assert await writer.reconcile(PARAMS_KEY) is not None
    assert len(writes) == 2 and not store.dirty


async def test_a_stopped_writer_writes_nothing_until_started(api: KubeAPI) -> None:
    """What the ordered uninstall relies on before it deletes the object: once ``stop()``
    returns, no tick writes (the key is done), until ``start()``."""
    store = ParamsStore(3600)
    writer = ParamsWriter(api, store, min_interval=0.1)
    writes = track_writes(api)
    store.record(reference(1, pinned=True), AMD_ARM, time.time())
    await writer.stop()
    assert writer.stopped
    assert await writer.reconcile(PARAMS_KEY) is None
    assert writes == [] and await live(api) is None
    writer.start()
    assert await writer.reconcile(PARAMS_KEY) is not None
    assert [w[0] for w in writes] == ["create"]


async def test_a_failed_tick_raises_for_the_queue_backoff() -> None:
    """A read or write that fails (here: no server) is counted and raised, so the work
    queue retries after its backoff; the pacing of ticks does not answer the retry early
    (which would reset the queue's failure count)."""
    from podplacement.controller.paramswriter import ParamsWriteError

    client = KubeAPI.from_url("http://127.0.0.1:9", request_timeout=1)
    metrics = FakeMetrics()
    writer = ParamsWriter(client, ParamsStore(3600), min_interval=10.0, metrics=metrics)
    try:
        for attempt in range(1, 3):
            with pytest.raises(ParamsWriteError):
                await writer.reconcile(PARAMS_KEY)
            assert metrics.writes.counts["error"] == attempt
    finally:
        await client.close()
