"""Each stage of the admission pipeline (webhook.pipeline) alone, on plain data: a review
decoded from the recorded bodies, the stage's answer (status, bytes) or what it hands on, and
the counters it moved. The whole /mutate is tests/webhook/test_app.py."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from time import perf_counter
from typing import Any

import orjson
import pytest
from fastapi.responses import Response
from starlette.requests import Request

from podplacement.rules.config import (
    GATE_LABEL,
    GATE_LABEL_GATED,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.rules.podspec import gate_label_ops
from podplacement.webhook.admitplace import GATED, GATED_OVER_BUDGET
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.gating import REASON_ALREADY_GATED, REASON_GATED
from podplacement.webhook.metrics import WebhookMetrics
from podplacement.webhook.patch import gate_patch
from podplacement.webhook.pipeline import (
    INTERNAL_ERROR_WARNING,
    AdmissionPipeline,
    PodToGate,
    Review,
)
from podplacement.webhook.placecache import PlaceCache
from podplacement.webhook.review import (
    ADMISSION_V1,
    ADMISSION_V1BETA1,
    BadReview,
    allowed,
    parse_review,
    patch_members,
    warnings_members,
)
from tests.webhook.reference import raw_body
from tests.webhook.test_app_placement import _Inspector

OWN = "podplacement-system"


class Lease:
    """A controller Lease that says what the test wants."""

    def __init__(self, available: bool) -> None:
        self.up = available

    def available(self) -> bool:
        return self.up

    def seconds_since_renewal(self) -> float:
        return 120.0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def pipeline(config: PlacementConfig | None = PlacementConfig(), **kwargs: Any
             ) -> AdmissionPipeline:
    return AdmissionPipeline(StaticConfigSource(config), WebhookMetrics(), own_namespace=OWN,
                             **kwargs)


def count(p: AdmissionPipeline, name: str, **labels: str) -> float:
    value = p.metrics.registry.get_sample_value(f"podplacement_webhook_{name}", labels)
    return value or 0.0


def body_of(change: Callable[[dict[str, Any]], None] | None = None,
            case: str = "a-plain-pod") -> bytes:
    doc = json.loads(raw_body(case))
    if change is not None:
        change(doc)
    return orjson.dumps(doc)


def reviewed(p: AdmissionPipeline, body: bytes) -> Review:
    """The :class:`Review` decode would hand on for ``body``."""
    api_version, request = parse_review(body)
    return Review(body, api_version, request, p.config_source.current, perf_counter())


def http_request(body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/mutate", "query_string": b"",
             "headers": headers or [(b"content-type", b"application/json")]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    return Request(scope, receive)


def answer_of(response: Response) -> dict[str, Any]:
    assert response.status_code == 200
    doc: dict[str, Any] = json.loads(bytes(response.body))
    answer: dict[str, Any] = doc["response"]
    assert doc["kind"] == "AdmissionReview" and answer["allowed"] is True
    return answer


def ops_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def gated_pod(labelled: bool) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        pod = doc["request"]["object"]
        pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        if labelled:
            pod["metadata"].setdefault("labels", {})[GATE_LABEL] = GATE_LABEL_GATED
    return change


# --- decode -----------------------------------------------------------------------------------


async def test_decode_hands_on_the_review_with_the_config_read_with_it() -> None:
    p = pipeline()
    body = raw_body("b-deployment-pod")
    review = await p.decode(http_request(body), 12.5)
    assert isinstance(review, Review)
    assert review.body == body and review.api_version == ADMISSION_V1
    assert review.uid == json.loads(body)["request"]["uid"]
    assert review.config is p.config_source.current and review.started == 12.5
    assert count(p, "requests_total", outcome="bad_request", reason="") == 0


@pytest.mark.parametrize(("body", "headers", "status", "error", "reason"), [
    (b"{nope", None, 400, "body is not JSON: ", ""),
    (b"[]", None, 400, "body is not a JSON object", ""),
    (raw_body("a-plain-pod"), [(b"content-length", b"12x")], 400,
     "Content-Length b'12x' is not a number", ""),
    (raw_body("a-plain-pod"), [(b"content-length", b"99999999")], 413,
     "body of 99999999 bytes is over the limit", "body_too_large"),
    (raw_body("a-plain-pod"), None, 413, "body is over the limit", "body_too_large"),
])
async def test_decode_answers_a_body_it_cannot_use(
        body: bytes, headers: list[tuple[bytes, bytes]] | None, status: int, error: str,
        reason: str) -> None:
    p = pipeline(max_body_bytes=4096)
    response = await p.decode(http_request(body, headers), perf_counter())
    assert isinstance(response, Response) and response.status_code == status
    assert json.loads(bytes(response.body))["error"].startswith(error)
    assert (response.headers.get("connection") == "close") is (status == 413)
    assert count(p, "requests_total", outcome="bad_request", reason=reason) == 1


async def test_decode_answers_400_when_the_config_cannot_be_read() -> None:
    class Broken(StaticConfigSource):
        @property
        def current(self) -> PlacementConfig | None:
            raise RuntimeError("boom")

    p = AdmissionPipeline(Broken(None), WebhookMetrics(), own_namespace=OWN)
    response = await p.decode(http_request(raw_body("a-plain-pod")), perf_counter())
    assert isinstance(response, Response) and response.status_code == 400
    assert json.loads(bytes(response.body)) == {"error": "could not read the request: RuntimeError"}


def test_the_limits_are_checked_when_the_pipeline_is_built() -> None:
    with pytest.raises(ValueError, match="max_body_bytes must be >= 1"):
        pipeline(max_body_bytes=0)
    with pytest.raises(ValueError, match="body_timeout must be > 0"):
        pipeline(body_timeout=0)


# --- skip -------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", [
    lambda d: d["request"].__setitem__("operation", "UPDATE"),
    lambda d: d["request"]["kind"].__setitem__("kind", "Deployment"),
    lambda d: d["request"].__setitem__("subResource", "status"),
], ids=["update", "deployment", "subresource"])
def test_skip_allows_what_is_not_a_pod_create_unchanged(
        change: Callable[[dict[str, Any]], None]) -> None:
    p = pipeline()
    review = reviewed(p, body_of(change))
    response = p.skip(review)
    assert isinstance(response, Response)
    assert response.body == allowed(ADMISSION_V1, review.uid).body
    assert count(p, "requests_total", outcome="ignored", reason="not_pod_create") == 1


@pytest.mark.parametrize(("change", "config", "reason"), [
    (lambda d: d["request"].__setitem__("namespace", OWN), PlacementConfig(), "own_namespace"),
    (lambda d: d["request"]["object"]["spec"].__setitem__("nodeName", "n1"),
     PlacementConfig(), "node_name_set"),
    (None, None, "no_config"),
])
def test_skip_allows_a_pod_the_rules_do_not_gate_and_counts_why(
        change: Callable[[dict[str, Any]], None] | None, config: PlacementConfig | None,
        reason: str) -> None:
    p = pipeline(config)
    review = reviewed(p, body_of(change))
    response = p.skip(review)
    assert isinstance(response, Response)
    assert "patch" not in answer_of(response)
    assert count(p, "requests_total", outcome="skipped", reason=reason) == 1
    assert count(p, "admissions_total", path="skipped") == 1


@pytest.mark.parametrize(("change", "reason", "dry_run"), [
    (None, REASON_GATED, False),
    (lambda d: d["request"].__setitem__("dryRun", True), REASON_GATED, True),
    (gated_pod(labelled=True), REASON_ALREADY_GATED, False),
])
def test_skip_hands_on_a_pod_to_hold_without_counting_it(
        change: Callable[[dict[str, Any]], None] | None, reason: str, dry_run: bool) -> None:
    p = pipeline()
    review = reviewed(p, body_of(change))
    pod = p.skip(review)
    assert isinstance(pod, PodToGate)
    assert pod.decision.reason == reason and pod.dry_run is dry_run
    assert pod.namespace == review.request["namespace"]
    assert pod.pod is review.request["object"]
    assert count(p, "requests_total", outcome="gated", reason="gated") == 0
    assert count(p, "requests_total", outcome="skipped", reason=reason) == 0


def test_skip_raises_bad_review_for_a_pod_create_without_a_pod() -> None:
    p = pipeline()
    review = reviewed(p, body_of(lambda d: d["request"].__setitem__("object", None)))
    with pytest.raises(BadReview, match=r"request\.object is missing"):
        p.skip(review)


# --- outage -----------------------------------------------------------------------------------


def _to_gate(p: AdmissionPipeline, change: Callable[[dict[str, Any]], None] | None = None
             ) -> tuple[Review, PodToGate]:
    review = reviewed(p, body_of(change))
    pod = p.skip(review)
    assert isinstance(pod, PodToGate)
    return review, pod


@pytest.mark.parametrize("lease", [None, Lease(available=True)], ids=["no-lease", "held"])
async def test_outage_goes_on_while_a_controller_runs(lease: Lease | None) -> None:
    p = pipeline(controller_lease=lease)
    review, pod = _to_gate(p)
    assert await p.outage(review, pod) is None
    assert count(p, "requests_total", outcome="released", reason="controller_unavailable") == 0


@pytest.mark.parametrize(("change", "unplaced"), [
    (None, "not_inspected"),
    (lambda d: d["request"].__setitem__("dryRun", True), "dry_run"),
])
async def test_outage_releases_a_pod_with_the_fallback_when_no_controller_runs(
        change: Callable[[dict[str, Any]], None] | None, unplaced: str) -> None:
    p = pipeline(controller_lease=Lease(available=False))
    review, pod = _to_gate(p, change)
    response = await p.outage(review, pod)
    assert response is not None
    ops = ops_of(answer_of(response))
    assert not any(op["path"].startswith("/spec/schedulingGates") for op in ops)
    assert count(p, "requests_total", outcome="released", reason="controller_unavailable") == 1
    assert count(p, "admissions_total", path="released") == 1
    assert count(p, "released_unplaced_total", reason=unplaced) == 1


# --- place ------------------------------------------------------------------------------------


async def test_place_without_a_cache_leaves_the_pod_gated() -> None:
    p = pipeline()
    review, pod = _to_gate(p)
    assert await p.place(review, pod) == GATED


async def test_place_answers_from_the_cache_once_it_knows_the_images() -> None:
    cache = PlaceCache(_Inspector())
    p = pipeline(place_cache=cache)
    try:
        review, pod = _to_gate(p)
        assert await p.place(review, pod) == GATED  # a miss schedules a fill
        await cache.idle()
        response = await p.place(review, pod)
    finally:
        await cache.aclose()
    assert isinstance(response, Response)
    ops = ops_of(answer_of(response))
    assert {"op": "add", "path": f"/metadata/labels/{GATE_LABEL.replace('/', '~1')}",
            "value": "removed"} in ops
    assert count(p, "requests_total", outcome="placed", reason="") == 1
    assert count(p, "admissions_total", path="webhook-placed") == 1


# --- gate -------------------------------------------------------------------------------------


def test_gate_patches_the_gate_and_label_in() -> None:
    p = pipeline()
    review, pod = _to_gate(p)
    response = p.gate(review, pod)
    assert ops_of(answer_of(response)) == gate_patch(pod.pod)
    assert count(p, "requests_total", outcome="gated", reason="gated") == 1
    assert count(p, "gated_pods_total") == 1
    assert count(p, "admissions_total", path="gated") == 1


def test_gate_counts_a_pod_left_gated_by_why_it_was_not_placed() -> None:
    p = pipeline()
    review, pod = _to_gate(p)
    p.gate(review, pod, GATED_OVER_BUDGET)
    assert count(p, "admissions_total", path="gated-over-budget") == 1
    assert count(p, "admissions_total", path="gated") == 0


@pytest.mark.parametrize("labelled", [False, True])
def test_gate_only_fixes_the_label_of_a_pod_that_came_gated(labelled: bool) -> None:
    p = pipeline()
    review, pod = _to_gate(p, gated_pod(labelled))
    response = answer_of(p.gate(review, pod))
    if labelled:
        assert "patch" not in response
    else:
        assert ops_of(response) == gate_label_ops(pod.pod) != []
    assert count(p, "requests_total", outcome="skipped", reason="already_gated") == 1
    assert count(p, "gated_pods_total") == 0


# --- the runner -------------------------------------------------------------------------------


@pytest.fixture
async def failing() -> AsyncIterator[AdmissionPipeline]:
    cache = PlaceCache(_Inspector())
    yield pipeline(controller_lease=Lease(available=False), place_cache=cache)
    await cache.aclose()


@pytest.mark.parametrize("stage", ["skip", "outage", "place", "gate"])
async def test_an_error_in_any_stage_allows_the_pod_unchanged_with_a_warning(
        failing: AdmissionPipeline, stage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    if stage == "outage":  # reached only while no controller runs: keep it, break it
        monkeypatch.setattr(failing, "outage", broken)
    else:
        failing.controller_lease = Lease(available=True)
        monkeypatch.setattr(failing, stage, broken)
    body = raw_body("a-plain-pod")
    response = await failing.answer(http_request(body))
    uid = json.loads(body)["request"]["uid"]
    expected = {"apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": True,
                             "warnings": [INTERNAL_ERROR_WARNING]}}
    assert response.status_code == 200 and response.body == orjson.dumps(expected)
    assert count(failing, "errors_total") == 1
    assert count(failing, "requests_total", outcome="error", reason="") == 1
    assert count(failing, "request_duration_seconds_count") == 1


async def test_bad_review_from_a_stage_is_answered_400() -> None:
    def no_namespace(doc: dict[str, Any]) -> None:
        doc["request"].pop("namespace")
        doc["request"]["object"]["metadata"].pop("namespace", None)

    p = pipeline()
    body = body_of(no_namespace)
    response = await p.answer(http_request(body))
    assert response.status_code == 400
    assert json.loads(bytes(response.body)) == {"error": "request.namespace is missing for a pod "
                                                  "CREATE"}
    assert count(p, "requests_total", outcome="bad_request", reason="") == 1


# --- the encoding shared by every answer ------------------------------------------------------


@pytest.mark.parametrize("api_version", [ADMISSION_V1, ADMISSION_V1BETA1])
@pytest.mark.parametrize("warnings", [(), ("podplacement: a \"pin\" ü\u2028",)])
def test_spliced_members_are_the_bytes_of_the_answer_dict(
        api_version: str, warnings: tuple[str, ...]) -> None:
    """The placed and outage answers used to be built as dicts; the members spliced now
    must give the same bytes."""
    ops = [{"op": "add", "path": "/metadata/labels/a~1b", "value": "x"}]
    response: dict[str, Any] = {
        "uid": "u-1", "allowed": True, "patchType": "JSONPatch",
        "patch": base64.b64encode(orjson.dumps(ops)).decode()}
    tail = patch_members(tuple(ops))
    if warnings:
        response["warnings"] = list(warnings)
        tail += warnings_members(warnings)
    expected = {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
    assert allowed(api_version, "u-1", tail).body == orjson.dumps(expected)
