"""The admission feed (controller.admissionfeed) with a real registry and the controller's
real inspector: a pod placed at admission makes the controller inspect its images itself,
anonymously, and record what the registry says (never the annotation); pods with pull
Secrets teach nothing; every placed pod marks its images used; the Warning of a decision
taken at admission is sent once per pod, and a relist tells only about recent pods."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from podplacement.controller.admissionfeed import DROPPED, FAILED, INSPECTED, AdmissionFeed
from podplacement.controller.metrics import Metrics
from podplacement.imageinspect import Inspector
from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    PlacementConfig,
)
from podplacement.rules.place.admission import admission_placement
from podplacement.rules.place.decision import INCOMPATIBLE_NODE_SELECTOR, EventSpec
from podplacement.rules.platforms import image_platform_pairs
from tests.controller.conftest import eventually
from tests.controller.test_admission import _json_patch
from tests.harness.registry import Registry

CONFIG = PlacementConfig()
NOW = "2026-01-01T00:00:00Z"
T_NOW = 1_767_225_600.0


async def _until(check: Callable[[], Any]) -> None:
    async def once() -> Any:
        return check()

    await eventually(once, within=10.0)


class Events:
    """The Event sink's surface the feed uses, recording."""

    enabled = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, EventSpec]] = []

    def emit(self, pod: dict[str, Any], spec: EventSpec) -> None:
        self.sent.append((pod["metadata"]["uid"], spec))


class Feed:
    """An :class:`AdmissionFeed` over a store, with the inspector counted."""

    def __init__(self, inspector: Inspector, *, publishing: bool = True) -> None:
        self.store = ParamsStore(3600)
        self.events = Events()
        self.metrics = Metrics()
        self.inspected: list[str] = []
        self.listing = False
        self.adopted = asyncio.Event()
        self.adopted.set()
        outer = self

        class Counting:
            async def inspect(self, image: str, credentials: Any = ()) -> Any:
                assert credentials == ()  # anonymous only
                outer.inspected.append(image)
                return await inspector.inspect(image)

        def publish(image: str, result: Any) -> None:
            self.store.record(image, image_platform_pairs(result), time.time(),
                              learned=result.fetched_at)

        self.feed = AdmissionFeed(
            store=self.store, inspector=Counting, publish=publish,
            publishing=lambda: publishing, config_source=lambda: (CONFIG, None),
            events=self.events, metrics=self.metrics,  # type: ignore[arg-type]
            listing=lambda: self.listing, adopted=self.adopted, clock=lambda: T_NOW)

    def count(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "podplacement_admission_feed_inspections_total", {"result": result})
        return value or 0.0


def _placed(uid: str, *images: str, node_selector: dict[str, str] | None = None,
            secrets: tuple[str, ...] = (), created: str = NOW,
            platforms: tuple[str, ...] = ("linux/amd64",)) -> dict[str, Any]:
    """A pod as stored once the webhook placed it, believing each image has ``platforms``."""
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": im}
                                           for i, im in enumerate(images)]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in secrets]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"p-{uid}", "namespace": "ns", "uid": uid, "creationTimestamp": created},
        "spec": spec}
    results = {im: _Result(tuple(_Platform(*p.split("/")) for p in platforms))
               for im in images}
    placement = admission_placement(pod, results, CONFIG)
    assert placement is not None
    return _json_patch(pod, list(placement.patch))


class _Platform:
    def __init__(self, os: str, architecture: str) -> None:
        self.os, self.architecture, self.variant = os, architecture, None


class _Result:
    def __init__(self, platforms: tuple[_Platform, ...]) -> None:
        self.platforms, self.digest = platforms, "sha256:" + "0" * 64


def _by_controller(uid: str, image: str) -> dict[str, Any]:
    record = {"images": [{"image": image, "platforms": ["linux/amd64"]}],
              "archs": ["amd64"], "result": "set", "reason": "required architectures amd64"}
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid,
                         "creationTimestamp": NOW,
                         "annotations": {DECISION_ANNOTATION: json.dumps(record)}},
            "spec": {"containers": [{"name": "c", "image": image}]}}


async def test_a_pod_placed_at_admission_feeds_the_catalog_with_what_the_registry_says(
        registry: Registry, make_pusher: Any, inspector: Inspector) -> None:
    make_pusher(registry).multiarch("feed/multi", "v1", ["linux/amd64", "linux/arm64"])
    image = f"{registry.host}/feed/multi:v1"
    f = Feed(inspector)
    f.feed.start()
    try:
        # the annotation says amd64 only (anyone may write it): the catalog gets the truth
        for i in range(5):
            f.feed.on_pod("ADDED", _placed(f"u{i}", image), None)
        await _until(lambda: image in f.store)
        assert f.store.get(image) == "linux/amd64,linux/arm64"
        assert f.inspected == [image] and f.count(INSPECTED) == 1
        # known now: the next pods inspect nothing
        f.feed.on_pod("ADDED", _placed("u9", image), None)
        await asyncio.sleep(0.1)
        assert f.inspected == [image]
    finally:
        await f.feed.stop()


async def test_inspections_wait_until_the_live_catalog_is_adopted(
        registry: Registry, make_pusher: Any, inspector: Inspector) -> None:
    make_pusher(registry).image("feed/adopted", "v1", architecture="arm64")
    image = f"{registry.host}/feed/adopted:v1"
    f = Feed(inspector)
    f.adopted.clear()
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", image), None)
        await asyncio.sleep(0.2)
        assert f.inspected == []
        f.store.adopt({image: "linux/arm64"}, now=time.time(), learned={image: time.time()})
        f.adopted.set()
        await asyncio.sleep(0.2)
        assert f.inspected == []  # the live object had it
    finally:
        await f.feed.stop()


async def test_pods_with_pull_secrets_and_the_controllers_own_teach_nothing(
        registry: Registry, make_pusher: Any, inspector: Inspector) -> None:
    make_pusher(registry).image("feed/quiet", "v1")
    image = f"{registry.host}/feed/quiet:v1"
    f = Feed(inspector)
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", image, secrets=("pull",)), None)
        f.feed.on_pod("ADDED", _by_controller("u2", image), None)
        f.feed.on_pod("MODIFIED", _placed("u3", image), None)
        await asyncio.sleep(0.2)
        assert f.inspected == [] and image not in f.store
    finally:
        await f.feed.stop()
    # nor while the controller does not publish the catalog (no place branch, Webhook)
    off = Feed(inspector, publishing=False)
    off.feed.start()
    try:
        off.feed.on_pod("ADDED", _placed("u4", image), None)
        await asyncio.sleep(0.2)
        assert off.inspected == []
    finally:
        await off.feed.stop()


async def test_a_failed_anonymous_inspection_records_nothing(inspector: Inspector,
                                                             registry: Registry) -> None:
    image = f"{registry.host}/feed/missing:v1"
    f = Feed(inspector)
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", image), None)
        await _until(lambda: f.count(FAILED) == 1)
        assert image not in f.store
    finally:
        await f.feed.stop()


async def test_too_many_images_waiting_are_dropped(inspector: Inspector) -> None:
    from podplacement.controller import admissionfeed

    f = Feed(inspector)
    f.adopted.clear()  # nothing leaves the queue
    f.feed.start()
    try:
        for i in range(admissionfeed.MAX_PENDING + 3):
            f.feed.on_pod("ADDED", _placed(f"u{i}", f"reg.invalid/many/i{i}:v1"), None)
        assert f.count(DROPPED) == 3
    finally:
        await f.feed.stop()


def test_every_placed_pod_marks_its_images_used(inspector: Inspector) -> None:
    f = Feed(inspector)
    f.store.max_entries = 2
    f.store.record("r/a:1", [("linux", "amd64")], now=T_NOW)
    f.store.record("r/b:1", [("linux", "amd64")], now=T_NOW)
    f.store.mark_clean(f.store.version)
    f.feed.on_pod("ADDED", _by_controller("u1", "r/a:1"), None)  # any path
    assert not f.store.dirty  # no write for a use
    f.store.record("r/c:1", [("linux", "amd64")], now=T_NOW)
    assert set(f.store.images()) == {"r/a:1", "r/c:1"}


def test_the_warning_of_a_webhook_decision_is_sent_once_per_pod(inspector: Inspector) -> None:
    f = Feed(inspector)
    pinned = _placed("u1", "reg/amd:1", node_selector={ARCH_LABEL: "arm64"})
    f.feed.on_pod("ADDED", pinned, None)
    f.feed.on_pod("MODIFIED", pinned, None)
    f.listing = True
    f.feed.on_pod("ADDED", pinned, None)  # a relist hands it on again
    assert [(uid, e.reason) for uid, e in f.events.sent] == [("u1", INCOMPATIBLE_NODE_SELECTOR)]
    assert f.events.sent[0][1].message.startswith("nodeSelector kubernetes.io/arch=arm64 ")
    assert f.metrics.registry.get_sample_value(
        "podplacement_events_total", {"type": "Warning"}) == 1
    # a pod a relist hands on is told only when recent; the watch tells as it is placed
    old = "2025-12-31T23:00:00Z"
    f.feed.on_pod("ADDED", _placed("u2", "reg/amd:1", node_selector={ARCH_LABEL: "arm64"},
                                   created=old), None)
    f.feed.on_pod("ADDED", _placed("u3", "reg/amd:1", node_selector={ARCH_LABEL: "arm64"}),
                  None)
    f.listing = False
    f.feed.on_pod("ADDED", _placed("u4", "reg/amd:1", node_selector={ARCH_LABEL: "arm64"},
                                   created=old), None)
    f.feed.on_pod("ADDED", _placed("u5", "reg/multi:1"), None)  # no warning to tell
    assert [uid for uid, _ in f.events.sent] == ["u1", "u3", "u4"]


async def test_a_relist_uses_and_learns_only_from_recent_pods(inspector: Inspector) -> None:
    """A relist hands on every placed pod; only those created within the window are uses
    and teach the catalog (an old pod's tag is what the LRU evicted: learning it back at
    each leader change would evict what is in use now)."""
    f = Feed(inspector)
    f.adopted.clear()  # nothing leaves the queue: what is queued stays pending
    f.feed.start()
    try:
        f.store.max_entries = 2
        f.store.record("r/a:1", [("linux", "amd64")], now=T_NOW)
        f.store.record("r/b:1", [("linux", "amd64")], now=T_NOW)
        old = "2025-12-31T23:00:00Z"
        f.listing = True
        f.feed.on_pod("ADDED", _placed("u1", "r/a:1", created=old), None)
        f.feed.on_pod("ADDED", _placed("u2", "r/old:1", created=old), None)
        f.store.record("r/c:1", [("linux", "amd64")], now=T_NOW)
        assert set(f.store.images()) == {"r/b:1", "r/c:1"}  # the old pod's a was no use
        f.feed.on_pod("ADDED", _placed("u3", "r/new:1"), None)  # recent: learned
        assert f.feed._pending == {"r/new:1"}
        f.listing = False
        f.feed.on_pod("ADDED", _placed("u4", "r/b:1", created=old), None)  # the watch: a use
        f.store.record("r/d:1", [("linux", "amd64")], now=T_NOW)
        assert set(f.store.images()) == {"r/b:1", "r/d:1"}
    finally:
        await f.feed.stop()
