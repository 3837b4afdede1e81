"""While no controller runs the webhook places pods itself (webhook.outage), over ASGI
against the real registry behind a counting fault proxy: an image never seen is inspected at
admission and the pod placed; a registry slower than the budget means the release with the
config's fallbackArchitecture, counted; concurrent reviews of one new image make one
manifest fetch; a dry run makes no registry request and fills no cache; a private image
(htpasswd registry) of a pod naming a pull secret stays gated for the controller (the
webhook reads no Secret), one of a pod naming none is released with the fallback."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from localkube.patch import apply_patch
from podplacement.imageinspect import Inspector
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
    GATE_LABEL_GATED,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.webhook.admitinspect import AdmissionInspector
from podplacement.webhook.app import INTERNAL_ERROR_WARNING, create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.leasewatch import ControllerLease
from podplacement.webhook.placecache import PlaceCache
from tests.harness.faults import FaultProxy
from tests.harness.registry import Registry
from tests.imageinspect.conftest import insecure
from tests.webhook.reference import raw_body
from tests.webhook.test_app import metric
from tests.webhook.test_controller_unavailable import FakeClock, _lease, _lease_obj

MANIFESTS = r"/v2/.+/manifests/"


@dataclass
class Webhook:
    client: httpx.AsyncClient
    lease: ControllerLease
    clock: FakeClock
    cache: PlaceCache
    at_admission: AdmissionInspector
    source: StaticConfigSource
    proxy: FaultProxy

    def stop_controller(self) -> None:
        """The Lease goes unrenewed past the threshold (10 s)."""
        self.clock.now += 11

    async def review(self, image: str, *, gated: bool = True, dry_run: bool = False
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
        """POST a pod of ``image``; (the pod sent, the AdmissionReview response)."""
        body = review_of(image, gated=gated, dry_run=dry_run)
        answer = (await self.client.post("/mutate", json=body)).json()["response"]
        return body["request"]["object"], answer

    async def flights_done(self, limit: float = 10.0) -> None:
        await asyncio.wait_for(self.at_admission.idle(), limit)


@pytest.fixture
def proxy(registry: Registry, make_fault_proxy: Any) -> FaultProxy:
    front: FaultProxy = make_fault_proxy(registry)
    return front


@pytest.fixture
async def webhook(proxy: FaultProxy) -> AsyncIterator[Webhook]:
    clock = FakeClock()
    lease = _lease(clock, threshold=10)
    lease._apply(_lease_obj("t1"))
    inspector = Inspector(registries=insecure(proxy.host), retries=0, timeout=10.0)
    cache = PlaceCache(inspector)
    at_admission = AdmissionInspector(inspector, cache=cache, budget=2.0)
    source = StaticConfigSource(PlacementConfig())
    app = create_app(source, own_namespace="podplacement-system", controller_lease=lease,
                     place_cache=cache, admission_inspector=at_admission)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://webhook") as c:
        yield Webhook(c, lease, clock, cache, at_admission, source, proxy)
    await at_admission.aclose()
    await cache.aclose()
    await inspector.aclose()


@pytest.fixture(scope="module")
def amd64_only(registry: Registry, make_pusher: Any) -> Iterator[Any]:
    """``push(repo) -> "repo:v1"`` of an amd64-only image (a single manifest) in the registry."""
    pusher = make_pusher(registry)

    def push(repo: str) -> str:
        pusher.image(repo, "v1", architecture="amd64")
        return f"{repo}:v1"

    yield push


def review_of(image: str, *, gated: bool = True, dry_run: bool = False) -> dict[str, Any]:
    """The recorded plain-pod review with one container of ``image`` (its pull secret and
    its two required nodeSelectorTerms kept); gated by the admission policy when ``gated``."""
    review: dict[str, Any] = copy.deepcopy(json.loads(raw_body("a-plain-pod")))
    request = review["request"]
    request["dryRun"] = dry_run
    spec = request["object"]["spec"]
    spec.pop("initContainers", None)
    spec["containers"] = [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent"}]
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        request["object"]["metadata"].setdefault("labels", {})[GATE_LABEL] = GATE_LABEL_GATED
    return review


def applied(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = base64.b64decode(response["patch"])
    return apply_patch("application/json-patch+json", pod, ops, strategic=False)


def required_archs(pod: dict[str, Any]) -> list[list[str]]:
    """Per required nodeSelectorTerm, the values of its ``kubernetes.io/arch In``."""
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [[v for e in t["matchExpressions"] if e["key"] == ARCH_LABEL
             and e["operator"] == "In" for v in e["values"]] for t in terms]


def decision(pod: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    return record


async def test_a_stale_lease_places_an_image_never_seen_at_admission(
        webhook: Webhook, amd64_only: Any) -> None:
    image = f"{webhook.proxy.host}/{amd64_only('outage/placed')}"
    webhook.stop_controller()
    for gated in (True, False):  # gated by the admission policy, or not (no policy)
        pod, response = await webhook.review(image, gated=gated)
        placed = applied(pod, response)
        assert not placed["spec"].get("schedulingGates")
        assert required_archs(placed) == [["amd64"], ["amd64"]]  # ANDed into both terms
        assert placed["metadata"]["labels"][GATE_LABEL] == "removed"
        record = decision(placed)
        assert record["path"] == "webhook" and record["result"] == "set"
        assert record["archs"] == ["amd64"] and record["oses"] == ["linux"]
        assert "warnings" not in response
    assert webhook.proxy.count("GET", MANIFESTS) == 1  # the second pod: from the cache
    c = webhook.client
    assert await metric(c, "podplacement_webhook_requests_total", outcome="placed",
                        reason="controller_unavailable") == 2
    assert await metric(c, "podplacement_webhook_admissions_total",
                        path="webhook-placed") == 2
    assert await metric(c, "podplacement_webhook_released_unplaced_total",
                        reason="timeout") == 0


async def test_a_registry_slower_than_the_budget_means_the_fallback_architecture(
        webhook: Webhook, amd64_only: Any) -> None:
    image = f"{webhook.proxy.host}/{amd64_only('outage/slow')}"
    webhook.source.set(PlacementConfig(fallback_architecture="arm64"))
    webhook.at_admission.budget = 0.5
    webhook.proxy.add_rule(path_regex=MANIFESTS, method="GET", delay=3.0)
    webhook.stop_controller()
    t0 = time.monotonic()
    pod, response = await webhook.review(image)
    assert time.monotonic() - t0 < 2.0  # the budget, not the registry, set the pace
    released = applied(pod, response)
    assert not released["spec"].get("schedulingGates")
    assert required_archs(released) == [["arm64"], ["arm64"]]
    record = decision(released)
    assert record["result"] == "fallback" and record["fallback"] == "arm64"
    assert "not inspected within 0.5 s at admission" in record["images"][0]["error"]
    assert record["reason"].startswith("image inspection failed at admission (no "
                                       "podplacement controller has renewed its Lease")
    assert response["warnings"][0].startswith("podplacement: image inspection failed")
    c = webhook.client
    assert await metric(c, "podplacement_webhook_released_unplaced_total",
                        reason="timeout") == 1
    assert await metric(c, "podplacement_webhook_requests_total", outcome="released",
                        reason="controller_unavailable") == 1
    # The inspection went on without the review and filled the cache: the next pod of the
    # image is placed from its platforms.
    await webhook.flights_done()
    pod, response = await webhook.review(image)
    assert decision(applied(pod, response))["result"] == "set"
    assert webhook.proxy.count("GET", MANIFESTS) == 1


async def test_concurrent_reviews_of_one_new_image_make_one_manifest_fetch(
        webhook: Webhook, amd64_only: Any) -> None:
    image = f"{webhook.proxy.host}/{amd64_only('outage/burst')}"
    webhook.proxy.add_rule(path_regex=MANIFESTS, method="GET", delay=0.3, times=0)
    webhook.stop_controller()
    answers = await asyncio.gather(*(webhook.review(image) for _ in range(40)))
    for pod, response in answers:
        assert required_archs(applied(pod, response)) == [["amd64"], ["amd64"]]
    assert webhook.proxy.count("GET", MANIFESTS) == 1
    assert webhook.proxy.count("GET", r"/blobs/") == 1  # the config blob: the platform
    assert webhook.at_admission.stats.flights_started == 1
    assert webhook.at_admission.stats.flights_joined == 39


async def test_a_dry_run_makes_no_registry_request_and_fills_no_cache(
        webhook: Webhook, amd64_only: Any) -> None:
    image = f"{webhook.proxy.host}/{amd64_only('outage/dry')}"
    c = webhook.client
    # Controller running: the miss of a dry run schedules no background fill.
    pod, response = await webhook.review(image, gated=False, dry_run=True)
    assert applied(pod, response)["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    await webhook.cache.idle()
    assert webhook.cache.stats.fills_scheduled == 0
    # No controller: a dry run is not inspected at admission; released with the fallback.
    webhook.stop_controller()
    pod, response = await webhook.review(image, dry_run=True)
    record = decision(applied(pod, response))
    assert record["result"] == "fallback" and "dry run" in record["images"][0]["error"]
    assert await metric(c, "podplacement_webhook_released_unplaced_total",
                        reason="dry_run") == 1
    await webhook.flights_done()
    assert webhook.proxy.requests == [] and len(webhook.cache) == 0
    # What is cached already still answers a dry run, and the cache stays as it was.
    await webhook.review(image)
    entries = list(webhook.cache._entries.items())
    seen = len(webhook.proxy.requests)
    pod, response = await webhook.review(image, dry_run=True)
    assert decision(applied(pod, response))["result"] == "set"
    assert list(webhook.cache._entries.items()) == entries
    assert len(webhook.proxy.requests) == seen


async def test_a_private_image_is_released_with_the_fallback_while_no_controller_runs(
        basic_registry: Registry, make_pusher: Any) -> None:
    """The webhook reads no Secret: while no controller leads, a pod naming a pull secret
    whose image the registry refuses anonymously (401) is released with the fallback, as a
    pod naming none, never held at the gate (nothing would place it) and never placed on the
    private image's platforms (the webhook never learns them)."""
    assert basic_registry.ca_pem is not None
    make_pusher(basic_registry).image("outage/private", "v1", architecture="s390x")
    image = f"{basic_registry.host}/outage/private:v1"
    clock = FakeClock()
    lease = _lease(clock, threshold=10)
    lease._apply(_lease_obj("t1"))
    inspector = Inspector(ca_bundles={basic_registry.host: basic_registry.ca_pem}, retries=0)
    cache = PlaceCache(inspector)
    at_admission = AdmissionInspector(inspector, cache=cache, budget=2.0)
    app = create_app(StaticConfigSource(PlacementConfig()), own_namespace="podplacement-system",
                     controller_lease=lease, place_cache=cache, admission_inspector=at_admission)
    clock.now += 11
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://webhook") as c:
            for secrets in (True, False):
                body = review_of(image)
                if not secrets:
                    body["request"]["object"]["spec"].pop("imagePullSecrets")
                else:
                    assert body["request"]["object"]["spec"]["imagePullSecrets"]
                answer = (await c.post("/mutate", json=body)).json()["response"]
                released = applied(body["request"]["object"], answer)
                assert not released["spec"].get("schedulingGates")
                assert decision(released)["result"] == "fallback"
                assert "s390x" not in json.dumps(answer)
            assert await metric(c, "podplacement_webhook_released_unplaced_total",
                                reason="failed") == 2
            assert await metric(c, "podplacement_webhook_admissions_total",
                                path="gated-needs-credentials") == 0
        assert len(cache) == 0
    finally:
        await at_admission.aclose()
        await cache.aclose()
        await inspector.aclose()


async def test_an_internal_error_allows_the_pod_unchanged_and_is_counted(
        proxy: FaultProxy) -> None:
    class Broken:
        budget = 1.0

        async def pod_images(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("boom")

        async def aclose(self) -> None:
            pass

    clock = FakeClock()
    lease = _lease(clock, threshold=10)
    app = create_app(StaticConfigSource(PlacementConfig()), controller_lease=lease,
                     admission_inspector=Broken())  # type: ignore[arg-type]
    clock.now += 11
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://webhook") as c:
        resp = await c.post("/mutate", json=review_of(f"{proxy.host}/x/y:1"))
        assert resp.status_code == 200
        answer = resp.json()["response"]
        assert answer["allowed"] is True and "patch" not in answer
        assert answer["warnings"] == [INTERNAL_ERROR_WARNING]
        assert await metric(c, "podplacement_webhook_errors_total") == 1


def test_the_budget_flag_stays_below_the_webhook_timeout() -> None:
    from podplacement.cli import build_parser
    from podplacement.rules.admit.webhookconfig import DEFAULT_TIMEOUT_SECONDS

    parser = build_parser()
    args = parser.parse_args(["webhook"])
    assert 0 < args.admission_inspection_budget < DEFAULT_TIMEOUT_SECONDS
    with pytest.raises(SystemExit):
        parser.parse_args(["webhook", "--admission-inspection-budget",
                           str(DEFAULT_TIMEOUT_SECONDS)])

