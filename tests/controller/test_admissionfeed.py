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


# --- the webhook's inspection report (issue 39 item 4) -------------------------------------
class Reported(Feed):
    """A :class:`Feed` reading the webhook's reports through the real
    :class:`controller.inspectionreports.InspectionReports` (its watch handler fed with the
    ConfigMap as the API server would hand it on; nothing is sent)."""

    def __init__(self, inspector: Inspector, *, wait: float = 5.0) -> None:
        from podplacement.controller.inspectionreports import InspectionReports
        from podplacement.kubeclient import KubeAPI

        super().__init__(inspector)
        self.reports = InspectionReports(KubeAPI.from_url("http://127.0.0.1:9"), "ns",
                                         ttl=lambda: 3600.0)
        self.feed.reports = self.reports
        self.feed.report_wait = wait
        self.reports.subscribe(self.feed._reported)
        self.data: dict[str, str] = {}

    def report(self, key: str, images: dict[str, Any]) -> None:
        """The webhook replica ``key`` reports ``images`` (image → result)."""
        from podplacement.rules.admit.inspectionreport import (
            REPORT_CONFIGMAP,
            encode_report,
            report_entry,
        )

        entries = {i: e for i, r in images.items() if (e := report_entry(r)) is not None}
        self.data[key] = encode_report(entries, time.time())[0]
        self.reports._on_event("MODIFIED", {"metadata": {"name": REPORT_CONFIGMAP},
                                            "data": dict(self.data)}, None)


async def test_an_image_the_webhook_reported_is_published_without_a_fetch(
        registry: Registry, make_pusher: Any, inspector: Inspector) -> None:
    from podplacement.controller.admissionfeed import REPORTED

    make_pusher(registry).multiarch("feed/reported", "v1", ["linux/amd64", "linux/s390x"])
    image = f"{registry.host}/feed/reported:v1"
    webhook_result = await inspector.inspect(image)  # what the webhook fetched
    f = Reported(inspector)
    f.report("webhook-a", {image: webhook_result})
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", image), None)
        await _until(lambda: image in f.store)
        assert f.store.get(image) == "linux/amd64,linux/s390x"
        assert f.store.learned_at(image) == int(webhook_result.fetched_at)
        assert f.inspected == [] and f.count(REPORTED) == 1 and f.count(INSPECTED) == 0
    finally:
        await f.feed.stop()


async def test_an_image_waits_for_its_report_then_is_fetched_when_none_comes(
        registry: Registry, make_pusher: Any, inspector: Inspector) -> None:
    from podplacement.controller.admissionfeed import REPORTED

    pusher = make_pusher(registry)
    pusher.image("feed/late", "v1", architecture="arm64")
    pusher.image("feed/never", "v1", architecture="amd64")
    pusher.image("feed/other", "v1", architecture="amd64")
    late, never = f"{registry.host}/feed/late:v1", f"{registry.host}/feed/never:v1"
    other = f"{registry.host}/feed/other:v1"
    f = Reported(inspector, wait=0.5)
    f.report("webhook-a", {other: await inspector.inspect(other)})  # a replica reports
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", late), None)
        f.feed.on_pod("ADDED", _placed("u2", never), None)
        await asyncio.sleep(0.2)
        assert f.inspected == [] and late not in f.store  # waiting for the report
        f.report("webhook-a", {other: await inspector.inspect(other),
                               late: await inspector.inspect(late)})
        await _until(lambda: late in f.store)
        assert f.count(REPORTED) == 1
        await _until(lambda: never in f.store)  # no report within the wait: fetched
        assert f.inspected == [never] and f.count(INSPECTED) == 1
        # the entry no placed pod names was never published
        assert other not in f.store
    finally:
        await f.feed.stop()


async def test_without_a_reporting_webhook_the_image_is_fetched_at_once(
        registry: Registry, make_pusher: Any, inspector: Inspector) -> None:
    make_pusher(registry).image("feed/upgrade", "v1", architecture="arm64")
    image = f"{registry.host}/feed/upgrade:v1"
    f = Reported(inspector, wait=60.0)  # an older webhook writes no report
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", image), None)
        await _until(lambda: image in f.store)
        assert f.inspected == [image]
    finally:
        await f.feed.stop()


async def test_a_malformed_report_is_ignored_and_the_image_fetched(
        registry: Registry, make_pusher: Any, inspector: Inspector,
        caplog: Any) -> None:
    from podplacement.rules.admit.inspectionreport import REPORT_CONFIGMAP

    make_pusher(registry).image("feed/bad", "v1", architecture="arm64")
    image = f"{registry.host}/feed/bad:v1"
    f = Reported(inspector, wait=0.3)  # "liar" is a replica that reports: a short wait
    bad = {"broken": "{not json", "newer": json.dumps({"v": 2, "written": 1, "images": {}}),
           "liar": json.dumps({"v": 1, "written": int(time.time()), "images": {
               image: ["linux/amd64,LINUX/x", "sha256:" + "0" * 64, int(time.time())]}})}
    f.reports._on_event("ADDED", {"metadata": {"name": REPORT_CONFIGMAP}, "data": bad}, None)
    f.reports._on_event("MODIFIED", {"metadata": {"name": REPORT_CONFIGMAP}, "data": bad},
                        None)
    assert sum("inspection report of webhook replica" in r.message
               for r in caplog.records) == 2  # once per key and reason, not per event
    assert f.reports.get(image) is None and f.reports.skipped == 1
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", image), None)
        await _until(lambda: image in f.store)
        assert f.inspected == [image] and f.store.get(image) == "linux/arm64"
    finally:
        await f.feed.stop()


async def test_with_a_registries_configmap_the_controller_fetches_itself(
        registry: Registry, make_pusher: Any, inspector: Inspector) -> None:
    """The config's registriesConfigMapRef (blocked registries, mirrors) is applied by the
    controller's inspector only: its reports are not taken then."""
    make_pusher(registry).image("feed/rules", "v1", architecture="arm64")
    image = f"{registry.host}/feed/rules:v1"
    f = Reported(inspector, wait=60.0)
    f.feed.use_reports = lambda: False
    f.report("webhook-a", {image: await inspector.inspect(image)})
    f.feed.start()
    try:
        f.feed.on_pod("ADDED", _placed("u1", image), None)
        await _until(lambda: image in f.store)
        assert f.inspected == [image]
    finally:
        await f.feed.stop()
