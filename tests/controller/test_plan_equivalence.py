"""``podplacement explain`` and the controller decide alike (issue 12 item 2).

For generated cluster states (nodes of two architectures, NRTs with NUMA zones, images with
random platforms) a stream of gated pods is reconciled one after the other by the real
:class:`controller.reconciler.Reconciler` (its in-flight NUMA accounting included), with
in-memory informers and an API double that applies its PATCH. Before each reconcile,
:func:`rules.monitor.explain.explain` is asked about the same pod, with the in-flight holds
rebuilt from the pods placed so far (:func:`rules.place.plan.inflight_from_pods`, as the
explain command does): its outcome and nodeAffinity must be what the controller then writes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localkube.patch import apply_patch
from podplacement.controller.metrics import Metrics
from podplacement.controller.reconciler import Reconciler, pod_key
from podplacement.rules.config import DECISION_ANNOTATION, PlacementConfig, TopologyConfig
from podplacement.rules.monitor.explain import explain
from podplacement.rules.numa import InFlight
from podplacement.rules.place.decision import EventSpec
from podplacement.rules.place.plan import inflight_from_pods
from tests.controller._pods import img
from tests.controller.numa._build import ctr, node, nrt, pod

ARCHS = ("amd64", "arm64")
#: NRT resourceVersions unique in the process: the NUMA memo keys verdicts by node and NRT
#: resourceVersion, as the API server guarantees a new one for new content.
_RV = itertools.count(10**9)


class _Cache:
    def __init__(self, objs: Mapping[str, dict[str, Any]]) -> None:
        self.cache = dict(objs)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.cache.get(key)


class _Api:
    """Applies PATCHes to the pods of ``pods`` (an RFC 6902 patch, as the API server does)."""

    def __init__(self, pods: _Cache) -> None:
        self.pods = pods
        self.patches = 0

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str | None = None, **_: Any) -> dict[str, Any]:
        assert method == "PATCH", (method, path)
        ns, name = path.split("/")[4], path.split("/")[6]
        key = f"{ns}/{name}"
        patched = apply_patch("application/json-patch+json", self.pods.cache[key],
                              json.dumps(body).encode(), strategic=True)
        self.pods.cache[key] = patched
        self.patches += 1
        return patched


class _Inspector:
    def __init__(self, images: Mapping[str, Any]) -> None:
        self.images = images

    async def inspect(self, image: str, credentials: Any, *, pull_always: bool = False) -> Any:
        return self.images[image]


class _Events:
    def emit(self, pod: Mapping[str, Any], spec: EventSpec) -> None:
        pass


@st.composite
def cluster_st(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    nodes, nrts = [], {}
    for i in range(draw(st.integers(1, 3))):
        name = f"n{i}"
        arch = draw(st.sampled_from(ARCHS))
        nodes.append(node(name, {"cpu": "32", "memory": "64Gi", "pods": "110"},
                          hostname=f"host-{i}", arch=arch))
        if arch == "arm64" and draw(st.booleans()):  # a tainted arm64 pool (GKE's taint)
            nodes[-1]["spec"] = {"taints": [{"key": "kubernetes.io/arch", "value": "arm64",
                                             "effect": "NoSchedule"}]}
        if draw(st.integers(0, 4)):
            zones = [{"cpu": str(draw(st.integers(0, 8))), "memory": "16Gi"}
                     for _ in range(draw(st.integers(1, 3)))]
            nrts[name] = nrt(name, zones, policy=draw(st.sampled_from(
                ["single-numa-node", "single-numa-node", "restricted", "none"])),
                scope=draw(st.sampled_from(["pod", "container"])), rv=str(next(_RV)))
    return nodes, nrts


image_st = st.sampled_from([
    img("reg/multi:1", "linux/amd64", "linux/arm64"),
    img("reg/amd:1", "linux/amd64"),
    img("reg/arm:1", "linux/arm64/v8"),
    img("reg/s390:1", "linux/s390x"),
])


@st.composite
def pods_st(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    images: dict[str, Any] = {}
    pods = []
    for i in range(draw(st.integers(2, 6))):
        image = draw(image_st)
        images[image.reference] = image
        cpu = str(draw(st.integers(1, 6)))
        guaranteed = draw(st.integers(0, 3)) > 0
        c = ctr("app", {"cpu": cpu, "memory": "1Gi"}, guaranteed=guaranteed)
        c["image"] = image.reference
        p = pod([c], name=f"p{i}", uid=f"uid-{i}")
        p["metadata"]["resourceVersion"] = str(100 + i)
        p["spec"]["schedulingGates"] = [{"name": "podplacement.io/scheduling-gate"}]
        pods.append(p)
    return pods, images


config_st = st.builds(
    lambda strategy, unsat, limit: PlacementConfig(topology=TopologyConfig(
        enabled=True, scoring_strategy=strategy, unsatisfiable=unsat,
        max_candidate_nodes=limit)),
    st.sampled_from(["LeastAllocated", "MostAllocated", "BalancedAllocation",
                     "LeastNUMANodes"]),
    st.sampled_from(["Wait", "Ungate"]),
    st.integers(1, 3),
)


def _affinity(p: Mapping[str, Any]) -> Any:
    return ((p.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}


def _run(nodes: list[dict[str, Any]], nrts: dict[str, dict[str, Any]],
         pods: list[dict[str, Any]], images: dict[str, Any], config: PlacementConfig
         ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Explain, then reconcile, each pod in turn: [(explain's report, the pod after)]."""
    informer = _Cache({f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
                       for p in pods})
    inflight = InFlight()
    reconciler = Reconciler(
        _Api(informer), informer, _Inspector(images),  # type: ignore[arg-type]
        lambda: (config, None), _Events(), Metrics(),  # type: ignore[arg-type]
        nodes=_Cache({n["metadata"]["name"]: n for n in nodes}),  # type: ignore[arg-type]
        nrts=_Cache(nrts), inflight=inflight)  # type: ignore[arg-type]
    out = []
    placed_holds = 0
    for p in pods:
        key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        others = [q for k, q in informer.cache.items() if k != key]
        report = explain(informer.cache[key], nodes, nrts, images, config,
                         inflight=inflight_from_pods(others, nrts))
        asyncio.run(reconciler.reconcile(pod_key(informer.cache[key])))
        after = informer.cache[key]
        out.append((report, after))
        if _record(after).get("numa", {}).get("candidates") and "result" not in _record(
                after)["numa"]:
            placed_holds += 1
    # The controller's own accounting holds exactly the pods it placed toward candidates.
    assert len(inflight) == placed_holds
    return out


def _record(p: Mapping[str, Any]) -> dict[str, Any]:
    raw = (p["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION, "{}")
    record: dict[str, Any] = json.loads(raw)
    return record


def _same(report: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    record = _record(after)
    outcome = record.get("result", "wait-numa")
    assert report["outcome"] == outcome, (report["reason"], record)
    assert report["affinity"] == _affinity(after)
    # the tolerations explain says are added are those the controller's PATCH appended
    added = [t for t in after["spec"].get("tolerations") or []
             if t.get("key") == "kubernetes.io/arch"]
    assert report["tolerations"] == record.get("tolerations", [])
    assert [f"{t['key']}={t['value']}:{t['effect']}" for t in added] == report["tolerations"]
    numa = report["numa"]
    if numa and numa["needed"] and numa["candidates"] and outcome != "wait-numa":
        assert numa["candidates"] == record["numa"]["candidates"]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=cluster_st(), stream=pods_st(), config=config_st)
def test_explain_agrees_with_the_controller_pod_after_pod(
        cluster: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]],
        stream: tuple[list[dict[str, Any]], dict[str, Any]],
        config: PlacementConfig) -> None:
    nodes, nrts = cluster
    pods, images = stream
    for report, after in _run(nodes, nrts, pods, images, config):
        _same(report, after)


def test_explain_holds_the_pods_the_controller_just_placed() -> None:
    """One zone of 4 CPUs, three pods of 3: the first is placed, the NRT does not show it
    yet, so the others wait, and explain says so too (without the holds it would say
    ``set``: the case the old copy of the pipeline got wrong)."""
    image = img("reg/amd:1", "linux/amd64")
    nodes = [node("n0", {"cpu": "32", "memory": "64Gi", "pods": "110"}, hostname="h0")]
    nrts = {"n0": nrt("n0", [{"cpu": "4", "memory": "16Gi"}], rv=str(next(_RV)))}
    pods = []
    for i in range(3):
        c = ctr("app", {"cpu": "3", "memory": "1Gi"})
        c["image"] = image.reference
        p = pod([c], name=f"p{i}", uid=f"uid-{i}")
        p["metadata"]["resourceVersion"] = "5"
        p["spec"]["schedulingGates"] = [{"name": "podplacement.io/scheduling-gate"}]
        pods.append(p)
    config = PlacementConfig(topology=TopologyConfig(enabled=True))
    runs = _run(nodes, nrts, pods, {image.reference: image}, config)
    assert [r["outcome"] for r, _ in runs] == ["set", "wait-numa", "wait-numa"]
    for report, after in runs:
        _same(report, after)
    unheld = explain(runs[1][1], nodes, nrts, {image.reference: image}, config)
    assert unheld["outcome"] == "set"
