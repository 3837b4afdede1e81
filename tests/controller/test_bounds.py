"""Bounded by design (rules and the reconciler): what one pod's decision writes, how many of
its images are inspected, and the release of a pod whose placement PATCH the API server
refuses as too large (413) or invalid (422)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from localkube.patch import apply_patch
from podplacement.controller.metrics import Metrics
from podplacement.controller.reconciler import Reconciler, pod_key
from podplacement.kubeclient import api_error
from podplacement.rules.config import DECISION_ANNOTATION, PlacementConfig
from podplacement.rules.place import decision as d
from podplacement.rules.place.placement import (
    MAX_DECISION_BYTES,
    MAX_POD_IMAGES,
    PlacementInputs,
    bounded_record,
    compact_json,
)
from tests.controller._pods import gated_pod, img

CFG = PlacementConfig()
LINUX = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}


def _wide(ref: str, n: int) -> Any:
    return img(ref, *(f"linux/{i:03d}{'a' * 57}" for i in range(n)))


def test_a_decision_of_60_images_of_500_platforms_is_written_compact() -> None:
    images = tuple(f"reg/app:{n}" for n in range(60))
    pod = gated_pod(images=images)
    dec = d.decide(PlacementInputs(pod, {i: _wide(i, 500) for i in images}, CFG))
    assert dec.outcome == d.Outcome.SET
    full = compact_json(dec.record)
    assert len(full) > 60 * 500 * 60  # the facts: 60 x 500 platform names
    annotation = dec.annotation
    assert len(annotation.encode()) <= MAX_DECISION_BYTES
    record = json.loads(annotation)
    assert record["compact"] == 1 and record["result"] == "set"
    assert record["images"][0] == {"image": "reg/app:0",
                                   "digest": _wide("reg/app:0", 1).digest,
                                   "platformCount": 500}
    assert len(record["platforms"]) == 64 and len(record["reason"]) <= 1000
    [op] = [o for o in dec.patch if o["path"].startswith("/metadata/annotations")]
    assert json.loads(op["value"][DECISION_ANNOTATION] if isinstance(op["value"], dict)
                      else op["value"]) == record


def test_a_small_decision_is_written_whole() -> None:
    pod = gated_pod(images=("reg/a:1",))
    dec = d.decide(
        PlacementInputs(pod, {"reg/a:1": img("reg/a:1", "linux/amd64", "linux/arm64")}, CFG),
    )
    assert dec.annotation == compact_json(dec.record)
    assert "compact" not in json.loads(dec.annotation)


def test_the_second_compact_form_keeps_the_outcome_and_counts() -> None:
    record = {"images": [{"image": f"r/{n}" + "x" * 200, "error": "e" * 200}
                         for n in range(1000)],
              "fallback": None, "archs": [], "result": "fallback", "reason": "r" * 5000}
    short = bounded_record(record)
    assert short == {"fallback": None, "result": "fallback", "reason": "r" * 997 + "...",
                     "imageCount": 1000, "compact": 2}
    assert bounded_record(record, limit=10**9) is record


def test_a_pod_over_the_image_bound_is_not_inspected() -> None:
    assert d.too_many_images(gated_pod(images=tuple(f"r/i:{n}" for n in range(64)))) is None
    pod = gated_pod(images=tuple(f"r/i:{n}" for n in range(MAX_POD_IMAGES + 1)))
    error = d.too_many_images(pod)
    assert str(error) == "the pod names 65 distinct images, more than the 64 inspected"


# --- the reconciler: a PATCH the API server refuses ------------------------------------


class _Cache:
    def __init__(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.cache = {f"{meta['namespace']}/{meta['name']}": pod}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.cache.get(key)


class _Api:
    """Applies JSON patches as the API server does, but refuses with ``refuse`` (status,
    body) each PATCH ``refuses`` says no to."""

    def __init__(self, pods: _Cache, status: int, refuses: Any) -> None:
        self.pods, self.status, self.refuses = pods, status, refuses
        self.sent: list[list[dict[str, Any]]] = []

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str | None = None, **_: Any) -> dict[str, Any]:
        assert method == "PATCH"
        self.sent.append(body)
        if self.refuses(body):
            causes = {"details": {"causes": [{"field": "metadata.annotations"}]}}
            raise api_error(self.status, "Refused", "the pod's own words <script>",
                            causes if self.status == 422 else None)
        key = "/".join(path.split("/")[i] for i in (4, 6))
        patched = apply_patch("application/json-patch+json", self.pods.cache[key],
                              json.dumps(body).encode(), strategic=True)
        self.pods.cache[key] = patched
        return patched


class _Inspector:
    def __init__(self) -> None:
        self.calls = 0

    async def inspect(self, image: str, credentials: Any, *, pull_always: bool = False) -> Any:
        self.calls += 1
        return _wide(image, 20)


class _Events:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def emit(self, pod: Mapping[str, Any], spec: d.EventSpec) -> None:
        self.sent.append(spec)


def _reconcile(pod: dict[str, Any], status: int, refuses: Any,
               failures: int = 0) -> tuple[dict[str, Any], _Api, _Events, _Inspector]:
    pod["metadata"]["uid"] = "u1"
    pods = _Cache(pod)
    api, events, inspector = _Api(pods, status, refuses), _Events(), _Inspector()
    reconciler = Reconciler(api, pods, inspector,  # type: ignore[arg-type]
                            lambda: (CFG, None), events, Metrics(),  # type: ignore[arg-type]
                            failures=lambda key: failures)
    assert asyncio.run(reconciler.reconcile(pod_key(pod))) is None
    return next(iter(pods.cache.values())), api, events, inspector


def _archs_written(body: list[dict[str, Any]]) -> bool:
    """The patch writes an architecture requirement (the placement does, the fallback
    without a fallback architecture does not)."""
    return '"key": "kubernetes.io/arch"' in json.dumps(body)


def _os_terms(pod: dict[str, Any]) -> list[Any]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [[e for e in t["matchExpressions"] if e["key"] == "kubernetes.io/os"]
            for t in terms]


@pytest.mark.parametrize("status,words", [(413, "too large"), (422, "invalid")])
def test_a_placement_patch_refused_releases_the_pod_with_the_fallback(
        status: int, words: str) -> None:
    pod, api, events, _ = _reconcile(gated_pod(images=("reg/a:1",)), status, _archs_written)
    assert len(api.sent) == 2
    assert not pod["spec"].get("schedulingGates")
    assert _os_terms(pod) == [[LINUX]]
    record = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    assert record["result"] == "fallback"
    [event] = events.sent
    assert (event.type, event.reason) == ("Warning", "PlacementFallback")
    assert f"the API server refused the placement patch as {words} (HTTP {status})" in \
        event.message
    assert "<script>" not in event.message and "<script>" not in record["reason"]


def test_a_fallback_refused_for_its_annotation_is_written_without_it() -> None:
    pod, api, events, _ = _reconcile(gated_pod(images=("reg/a:1",)), 422,
                                     lambda body: DECISION_ANNOTATION in json.dumps(body))
    assert len(api.sent) == 3
    assert not pod["spec"].get("schedulingGates")
    assert _os_terms(pod) == [[LINUX]]
    assert DECISION_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    assert [e.reason for e in events.sent] == ["PlacementFallback"]


def test_another_refusal_is_left_to_the_queue() -> None:
    with pytest.raises(Exception, match="400"):
        _reconcile(gated_pod(images=("reg/a:1",)), 400, _archs_written)


def test_a_pod_of_too_many_images_falls_back_without_an_inspection() -> None:
    images = tuple(f"reg/i:{n}" for n in range(MAX_POD_IMAGES + 1))
    pod, _, _events, inspector = _reconcile(gated_pod(images=images), 0, lambda body: False,
                                           failures=CFG.image_inspection.max_retries)
    assert inspector.calls == 0
    record = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    assert record["result"] == "fallback"
    assert record["images"][0]["error"] == ("the pod names 65 distinct images, more than "
                                            "the 64 inspected")


def test_an_admission_patch_over_its_bound_leaves_the_pod_to_the_controller() -> None:
    from podplacement.rules.place.admission import MAX_ADMISSION_PATCH_BYTES, admission_placement

    terms = [{"matchExpressions": [{"key": "example.com/rack", "operator": "In",
                                    "values": [f"r{n}"]}]} for n in range(150)]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}
    pod = gated_pod(images=("reg/w:1",), affinity=affinity)
    assert admission_placement(pod, {"reg/w:1": _wide("reg/w:1", 500)}, CFG) is None
    small = admission_placement(pod, {"reg/w:1": _wide("reg/w:1", 2)}, CFG)
    assert small is not None
    assert len(compact_json({"patch": small.patch})) < MAX_ADMISSION_PATCH_BYTES
