"""/mutate with the cache of anonymous results (issue 14 items 3 and 5), in-process over ASGI:
the first pod of an image is gated and a background fill is scheduled, the next identical
pod is placed in the answer (the controller's decision, no gate, ``"path":"webhook"``)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from localkube.patch import apply_patch
from podplacement.rules.config import (
    AFFINITY_LABEL,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    FAST_PATHS_DISABLED,
    GATE_LABEL,
    GATE_LABEL_GATED,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.rules.place.admission import admission_placement
from podplacement.rules.place.decision import unique_images
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.placecache import PlaceCache
from tests.controller._pods import img
from tests.webhook.reference import raw_body
from tests.webhook.test_app import metric


class _Inspector:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def inspect(self, image: str, credentials: Sequence[Any] = (), *,
                      pull_always: bool = False, max_age: float | None = None) -> Any:
        self.calls.append(image)
        return img(image, "linux/arm64/v8")


@pytest.fixture
def cache() -> PlaceCache:
    return PlaceCache(_Inspector())


@pytest.fixture
async def placing(source: StaticConfigSource, cache: PlaceCache
                  ) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(source, own_namespace="podplacement-system", place_cache=cache)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as c:
        yield c


def _review(**object_changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(raw_body("a-plain-pod"))
    body["request"]["object"]["spec"].update(object_changes)
    return body


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def _applied(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return apply_patch("application/json-patch+json", obj, json.dumps(ops).encode(),
                       strategic=True)


async def test_first_pod_is_gated_and_filled_the_next_is_placed(
        placing: httpx.AsyncClient, cache: PlaceCache) -> None:
    review = _review()
    pod = review["request"]["object"]
    first = (await placing.post("/mutate", json=review)).json()["response"]
    gated = _applied(pod, _patch(first))
    assert gated["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    assert cache.stats.fills_scheduled == 1
    await cache.idle()

    second = (await placing.post("/mutate", json=review)).json()["response"]
    assert second["allowed"] is True and "warnings" not in second
    ops = _patch(second)
    expected = admission_placement(pod, {i: img(i, "linux/arm64/v8")
                                         for i in unique_images(pod)}, PlacementConfig())
    assert expected is not None and ops == list(expected.patch)
    placed = _applied(pod, ops)
    assert "schedulingGates" not in placed["spec"]
    terms = placed["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]} in terms[0][
        "matchExpressions"]
    labels = placed["metadata"]["labels"]
    assert labels[GATE_LABEL] == "removed" and labels[AFFINITY_LABEL] == "set"
    record = json.loads(placed["metadata"]["annotations"][DECISION_ANNOTATION])
    assert record["path"] == "webhook" and record["result"] == "set"
    assert await metric(placing, "podplacement_webhook_admissions_total",
                        path="webhook-placed") == 1
    assert await metric(placing, "podplacement_webhook_admissions_total", path="gated") == 1
    assert await metric(placing, "podplacement_webhook_gated_pods_total") == 1
    assert await metric(placing, "podplacement_webhook_requests_total",
                        outcome="placed", reason="") == 1


async def test_a_pod_the_policy_gated_is_placed_and_ungated(
        placing: httpx.AsyncClient, cache: PlaceCache) -> None:
    review = _review(schedulingGates=[{"name": SCHEDULING_GATE}])
    review["request"]["object"]["metadata"].setdefault("labels", {})[GATE_LABEL] = (
        GATE_LABEL_GATED)
    pod = review["request"]["object"]
    first = (await placing.post("/mutate", json=review)).json()["response"]
    assert "patch" not in first  # already gated: left to the controller, fill scheduled
    await cache.idle()
    second = (await placing.post("/mutate", json=review)).json()["response"]
    placed = _applied(pod, _patch(second))
    assert placed["spec"].get("schedulingGates") in (None, [])
    assert placed["metadata"]["labels"][GATE_LABEL] == "removed"


async def test_a_pin_the_images_cannot_run_on_is_warned(
        placing: httpx.AsyncClient, cache: PlaceCache) -> None:
    review = _review(nodeSelector={ARCH_LABEL: "amd64"})
    await placing.post("/mutate", json=review)
    await cache.idle()
    second = (await placing.post("/mutate", json=review)).json()["response"]
    assert len(second["warnings"]) == 1
    assert second["warnings"][0].startswith(
        "podplacement: nodeSelector kubernetes.io/arch=amd64 is not among")


async def test_fast_paths_disabled_always_gate(
        placing: httpx.AsyncClient, cache: PlaceCache, source: StaticConfigSource) -> None:
    source.set(PlacementConfig(admission_fast_paths=FAST_PATHS_DISABLED))
    review = _review()
    for _ in range(2):
        resp = (await placing.post("/mutate", json=review)).json()["response"]
        assert _patch(resp)[0]["value"] == [{"name": SCHEDULING_GATE}]
        await cache.idle()
    assert cache.stats.fills_scheduled == 0


async def test_skipped_pods_neither_look_up_nor_fill(
        placing: httpx.AsyncClient, cache: PlaceCache) -> None:
    review = _review()
    review["request"]["namespace"] = "kube-system"
    resp = (await placing.post("/mutate", json=review)).json()["response"]
    assert "patch" not in resp
    assert cache.stats.fills_scheduled == 0 and cache.stats.misses == 0


async def test_a_cache_error_leaves_the_pod_gated(
        source: StaticConfigSource) -> None:
    class Broken:
        def lookup(self, *args: Any) -> Any:
            raise RuntimeError("boom")

        def schedule_fill(self, *args: Any) -> None:
            raise AssertionError("not reached")

        async def aclose(self) -> None:
            pass

    app = create_app(source, place_cache=Broken())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://webhook") as c:
        resp = (await c.post("/mutate", json=_review())).json()["response"]
        assert _patch(resp)[0]["value"] == [{"name": SCHEDULING_GATE}]
        assert await metric(c, "podplacement_webhook_errors_total") == 1


async def test_the_cache_path_applies_the_namespaces_policy(
        source: StaticConfigSource, cache: PlaceCache) -> None:
    """A PodPlacementPolicy of the pod's namespace matching its labels applies on the cache
    path: its limit removes nothing here (arm64 images), its weights replace the config's,
    and the annotation and label name it; a policy of another namespace changes nothing."""
    from podplacement.rules.config import POLICY_LABEL
    from podplacement.webhook.policysource import StaticPolicySource

    def policy(ns: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": ns, "name": name},
                "spec": {"priority": 1, "podSelector": {"matchLabels": {"app": "refcap"}},
                         "allowedArchitectures": ["arm64"],
                         "nodeAffinityScoring": {"platforms": [
                             {"architecture": "arm64", "weight": 42}]}}}

    review = _review(affinity={})  # no preference of its own: the weights apply
    namespace = review["request"]["namespace"]
    for policies, want in (([policy(namespace, "mine")], "mine"),
                           ([policy("elsewhere", "theirs")], None)):
        app = create_app(source, own_namespace="podplacement-system", place_cache=cache,
                         policies=StaticPolicySource(policies))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://webhook") as c:
            await c.post("/mutate", json=review)
            await cache.idle()
            answer = (await c.post("/mutate", json=review)).json()["response"]
        placed = _applied(review["request"]["object"], _patch(answer))
        record = json.loads(placed["metadata"]["annotations"][DECISION_ANNOTATION])
        assert record["path"] == "webhook" and record.get("policy") == want
        assert placed["metadata"]["labels"].get(POLICY_LABEL) == want
        preferred = placed["spec"]["affinity"]["nodeAffinity"].get(
            "preferredDuringSchedulingIgnoredDuringExecution", [])
        assert ({"weight": 42, "preference": {"matchExpressions": [
            {"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]}]}} in preferred) \
            == (want is not None)
