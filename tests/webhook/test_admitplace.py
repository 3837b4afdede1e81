"""A controller runs and the webhook places gated pods at admission itself when it can learn
their images within the config's ``inspectionBudget`` (webhook.admitplace), over ASGI against
the real registry behind a counting fault proxy: a pod of an image never seen is inspected
and placed; a registry slower than the budget leaves the pod gated and the next pod of that
image is placed from the cache; an image pulled with ``Always`` costs one manifest HEAD while
its digest holds and a new inspection once the tag moved; a dry run makes no registry
request; each result is counted in the path metric."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from podplacement.imageinspect import Inspector
from podplacement.rules.config import GATE_LABEL, SCHEDULING_GATE, PlacementConfig
from podplacement.webhook.admitinspect import AdmissionInspector
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.placecache import PlaceCache
from tests.harness.faults import FaultProxy
from tests.harness.registry import Registry
from tests.imageinspect.conftest import insecure
from tests.webhook.test_app import metric
from tests.webhook.test_outage import (
    MANIFESTS,
    applied,
    decision,
    required_archs,
    review_of,
)

PATHS = "podplacement_webhook_admissions_total"


@dataclass
class Webhook:
    client: httpx.AsyncClient
    cache: PlaceCache
    at_admission: AdmissionInspector
    source: StaticConfigSource
    proxy: FaultProxy

    async def review(self, image: str, *, gated: bool = True, dry_run: bool = False,
                     always: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """POST a pod of ``image`` (gated by the admission policy unless ``gated=False``);
        (the pod sent, the AdmissionReview response)."""
        body = review_of(image, gated=gated, dry_run=dry_run)
        if always:
            body["request"]["object"]["spec"]["containers"][0]["imagePullPolicy"] = "Always"
        answer = (await self.client.post("/mutate", json=body)).json()["response"]
        return body["request"]["object"], answer

    async def paths(self) -> dict[str, float]:
        """``admissions_total`` by path (only the non-zero ones)."""
        out = {}
        for path in ("webhook-placed", "webhook-inspected", "webhook-revalidated", "gated",
                     "gated-over-budget", "gated-inspection-failed",
                     "gated-needs-credentials", "skipped"):
            value = await metric(self.client, PATHS, path=path)
            if value:
                out[path] = value
        return out

    async def flights_done(self, limit: float = 10.0) -> None:
        await asyncio.wait_for(self.at_admission.idle(), limit)


@pytest.fixture
def proxy(registry: Registry, make_fault_proxy: Any) -> FaultProxy:
    front: FaultProxy = make_fault_proxy(registry)
    return front


@pytest.fixture
async def webhook(proxy: FaultProxy) -> AsyncIterator[Webhook]:
    """The app as ``podplacement webhook`` wires it (place cache + admission inspector on
    one registry inspector); no lease: a controller runs."""
    inspector = Inspector(registries=insecure(proxy.host), retries=0, timeout=10.0)
    cache = PlaceCache(inspector)
    # The inspector's own budget is the outage one; the config's budget applies here.
    at_admission = AdmissionInspector(inspector, cache=cache, budget=3.0)
    source = StaticConfigSource(PlacementConfig())
    app = create_app(source, own_namespace="podplacement-system", place_cache=cache,
                     admission_inspector=at_admission)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://webhook") as c:
        yield Webhook(c, cache, at_admission, source, proxy)
    await at_admission.aclose()
    await cache.aclose()
    await inspector.aclose()


@pytest.fixture(scope="module")
def push(registry: Registry, make_pusher: Any) -> Iterator[Any]:
    """``push(repo, arch="amd64") -> "repo:v1"``: a single-manifest image (re-pushing the
    tag with another architecture moves it to a new digest)."""
    pusher = make_pusher(registry)

    def push_image(repo: str, arch: str = "amd64") -> str:
        pusher.image(repo, "v1", architecture=arch)
        return f"{repo}:v1"

    yield push_image


def _gated(pod: dict[str, Any], response: dict[str, Any]) -> bool:
    """The pod leaves admission with our gate (the policy's, or the webhook's patch)."""
    out = applied(pod, response) if "patch" in response else pod
    return {"name": SCHEDULING_GATE} in (out["spec"].get("schedulingGates") or [])


async def test_a_pod_of_an_image_never_seen_is_placed_at_admission(
        webhook: Webhook, push: Any) -> None:
    image = f"{webhook.proxy.host}/{push('admit/new')}"
    pod, response = await webhook.review(image)  # gated by the policy
    placed = applied(pod, response)
    assert not placed["spec"].get("schedulingGates")
    assert placed["metadata"]["labels"][GATE_LABEL] == "removed"
    assert required_archs(placed) == [["amd64"], ["amd64"]]
    record = decision(placed)
    assert record["path"] == "webhook" and record["result"] == "set"
    assert webhook.proxy.count("GET", MANIFESTS) == 1
    # the next pod (ungated: no policy on this server) is placed from the cache
    pod, response = await webhook.review(image, gated=False)
    assert decision(applied(pod, response))["path"] == "webhook"
    assert webhook.proxy.count("GET", MANIFESTS) == 1
    assert await webhook.paths() == {"webhook-inspected": 1, "webhook-placed": 1}
    assert await metric(webhook.client, "podplacement_webhook_requests_total",
                        outcome="placed", reason="inspected") == 1


async def test_a_registry_slower_than_the_budget_leaves_the_pod_gated_then_the_cache_places(
        webhook: Webhook, push: Any) -> None:
    image = f"{webhook.proxy.host}/{push('admit/slow')}"
    webhook.source.set(PlacementConfig(admission_inspection_budget=0.2))
    webhook.proxy.add_rule(path_regex=MANIFESTS, method="GET", delay=1.0)
    t0 = time.monotonic()
    pod, response = await webhook.review(image)
    assert time.monotonic() - t0 < 0.9  # the budget, not the registry, set the pace
    assert "patch" not in response and _gated(pod, response)  # left to the controller
    # ... and a pod the webhook gates itself gets the gate
    pod, response = await webhook.review(image, gated=False)
    assert _gated(pod, response)
    assert await webhook.paths() == {"gated-over-budget": 2}
    # the inspection went on without the reviews (one flight for both) and filled the cache
    await webhook.flights_done()
    pod, response = await webhook.review(image)
    assert decision(applied(pod, response))["result"] == "set"
    assert webhook.proxy.count("GET", MANIFESTS) == 1
    assert webhook.at_admission.stats.flights_started == 1


async def test_an_always_pulled_image_costs_one_head_while_its_digest_holds(
        webhook: Webhook, push: Any) -> None:
    image = f"{webhook.proxy.host}/{push('admit/always')}"
    pod, response = await webhook.review(image, always=True)
    assert required_archs(applied(pod, response)) == [["amd64"], ["amd64"]]
    assert await webhook.paths() == {"webhook-inspected": 1}
    webhook.proxy.reset_requests()
    pod, response = await webhook.review(image, always=True)
    placed = applied(pod, response)
    assert required_archs(placed) == [["amd64"], ["amd64"]]
    assert not placed["spec"].get("schedulingGates")
    assert webhook.proxy.requests == [("HEAD", "/v2/admit/always/manifests/v1")]
    assert await webhook.paths() == {"webhook-inspected": 1, "webhook-revalidated": 1}
    assert await metric(webhook.client, "podplacement_webhook_requests_total",
                        outcome="placed", reason="revalidated") == 1


async def test_an_always_pulled_tag_that_moved_is_inspected_again(
        webhook: Webhook, push: Any) -> None:
    image = f"{webhook.proxy.host}/{push('admit/moved')}"
    pod, response = await webhook.review(image, always=True)
    assert required_archs(applied(pod, response)) == [["amd64"], ["amd64"]]
    old = decision(applied(pod, response))["images"][0]["digest"]
    push("admit/moved", "arm64")  # the tag now names another manifest
    webhook.proxy.reset_requests()
    pod, response = await webhook.review(image, always=True)
    placed = applied(pod, response)
    assert required_archs(placed) == [["arm64"], ["arm64"]]
    assert decision(placed)["images"][0]["digest"] != old
    assert webhook.proxy.count("HEAD", MANIFESTS) == 1
    assert webhook.proxy.count("GET", MANIFESTS) == 1
    assert await webhook.paths() == {"webhook-inspected": 2}
    # a pod of the same image without Always is now placed from the refreshed cache
    pod, response = await webhook.review(image)
    assert required_archs(applied(pod, response)) == [["arm64"], ["arm64"]]


async def test_an_always_pulled_image_whose_registry_is_slow_stays_gated(
        webhook: Webhook, push: Any) -> None:
    image = f"{webhook.proxy.host}/{push('admit/always-slow')}"
    await webhook.review(image, always=True)
    webhook.source.set(PlacementConfig(admission_inspection_budget=0.2))
    webhook.proxy.add_rule(path_regex=MANIFESTS, method="HEAD", delay=1.0)
    pod, response = await webhook.review(image, always=True)
    assert "patch" not in response and _gated(pod, response)
    assert await webhook.paths() == {"webhook-inspected": 1, "gated-over-budget": 1}


async def test_a_failed_inspection_leaves_the_pod_to_the_controller(
        webhook: Webhook) -> None:
    # the recorded pod names a pull secret: an image the registry does not show
    # anonymously (404 here) may need it; the controller reads it, the webhook does not
    pod, response = await webhook.review(f"{webhook.proxy.host}/admit/missing:v1")
    assert "patch" not in response and _gated(pod, response)
    assert await webhook.paths() == {"gated-needs-credentials": 1}
    # a registry error is a failed inspection, whatever the pod's secrets
    webhook.proxy.add_rule(path_regex=MANIFESTS, method="GET", status=500, times=0)
    pod, response = await webhook.review(f"{webhook.proxy.host}/admit/broken:v1")
    assert "patch" not in response and _gated(pod, response)
    assert await webhook.paths() == {"gated-needs-credentials": 1,
                                     "gated-inspection-failed": 1}


async def test_a_private_image_is_never_placed_at_admission(
        basic_registry: Registry, make_pusher: Any) -> None:
    """The webhook reads no Secret: a private image (htpasswd registry, 401 without
    credentials) is inspected anonymously, refused, and its pod left gated for the
    controller with nothing of the image in the answer; nothing is stored."""
    assert basic_registry.ca_pem is not None
    make_pusher(basic_registry).image("admit/private", "v1", architecture="s390x")
    image = f"{basic_registry.host}/admit/private:v1"
    inspector = Inspector(ca_bundles={basic_registry.host: basic_registry.ca_pem}, retries=0)
    cache = PlaceCache(inspector)
    at_admission = AdmissionInspector(inspector, cache=cache, budget=3.0)
    app = create_app(StaticConfigSource(PlacementConfig()),
                     own_namespace="podplacement-system", place_cache=cache,
                     admission_inspector=at_admission)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://webhook") as c:
            for _ in range(2):
                body = review_of(image)
                answer = (await c.post("/mutate", json=body)).json()["response"]
                assert "patch" not in answer and "s390x" not in str(answer)
            assert await metric(c, PATHS, path="gated-needs-credentials") == 2
        assert len(cache) == 0
    finally:
        await at_admission.aclose()
        await cache.aclose()
        await inspector.aclose()


async def test_a_dry_run_makes_no_registry_request(webhook: Webhook, push: Any) -> None:
    image = f"{webhook.proxy.host}/{push('admit/dry')}"
    pod, response = await webhook.review(image, dry_run=True)
    assert _gated(pod, response)
    pod, response = await webhook.review(image, gated=False, dry_run=True)
    assert _gated(pod, response)
    await webhook.flights_done()
    await webhook.cache.idle()
    assert webhook.proxy.requests == [] and len(webhook.cache) == 0
    assert webhook.cache.stats.fills_scheduled == 0
    # once known: a dry run is answered from the cache, but an Always image is not
    # revalidated (no HEAD) and stays gated
    await webhook.review(image)
    seen = len(webhook.proxy.requests)
    entries = list(webhook.cache._entries.items())
    pod, response = await webhook.review(image, dry_run=True)
    assert decision(applied(pod, response))["result"] == "set"
    pod, response = await webhook.review(image, dry_run=True, always=True)
    assert _gated(pod, response)
    await webhook.flights_done()
    assert len(webhook.proxy.requests) == seen
    assert list(webhook.cache._entries.items()) == entries


async def test_a_budget_of_zero_inspects_nothing_at_admission(
        webhook: Webhook, push: Any) -> None:
    image = f"{webhook.proxy.host}/{push('admit/zero')}"
    webhook.source.set(PlacementConfig(admission_inspection_budget=0.0))
    pod, response = await webhook.review(image)
    assert _gated(pod, response)
    assert webhook.at_admission.stats.flights_started == 0
    await webhook.cache.idle()  # the background fill, as before the budget existed
    assert webhook.cache.stats.fills_scheduled == 1
    pod, response = await webhook.review(image)
    assert decision(applied(pod, response))["path"] == "webhook"
    assert await webhook.paths() == {"gated": 1, "webhook-placed": 1}
