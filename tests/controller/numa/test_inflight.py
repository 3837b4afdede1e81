"""In-flight accounting: pods ungated towards nodes hold resources until the NRT shows them."""

from __future__ import annotations

from typing import Any

from podplacement.rules.config import TopologyConfig
from podplacement.rules.numa import (
    InFlight,
    TopologyCache,
    decide_numa,
    effective_requests,
    parse_quantity,
    pod_fingerprint,
)
from tests.controller.numa._build import ctr, gpod, node, nrt, pod

CFG = TopologyConfig(enabled=True)
ZONES = [{"cpu": 6, "memory": "32Gi"}, {"cpu": 6, "memory": "32Gi"}]


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cluster(rv: str = "1") -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    nodes = [node(n) for n in ("a", "b", "c")]
    nrts = {n: nrt(n, ZONES, rv=rv) for n in ("a", "b", "c")}
    return nodes, nrts


def feasible(inflight: InFlight, p: dict[str, Any] | None = None) -> list[str]:
    nodes, nrts = cluster()
    decision = decide_numa(p or gpod("4", name="next"), nodes, nrts, CFG, inflight=inflight,
                           cache=TopologyCache())
    return sorted(decision.scores)


def ungated(inflight: InFlight, name: str, nodes: list[str], cpu: str = "4") -> dict[str, Any]:
    p = gpod(cpu, name=name, uid=f"uid-{name}")
    inflight.add(f"uid-{name}", f"default/{name}", effective_requests(p), nodes)
    return p


def test_inflight_pod_holds_every_zone_of_every_candidate() -> None:
    inflight = InFlight()
    ungated(inflight, "first", ["a", "b"])
    assert feasible(inflight) == ["c"]
    nodes, nrts = cluster()
    decision = decide_numa(gpod("4", name="next"), nodes, nrts, CFG, inflight=inflight,
                           cache=TopologyCache())
    by_name = {v.name: v for v in decision.verdicts}
    assert by_name["a"].reason == "cannot align container app: cpu 4 > 2 available in best zone"
    # a smaller pod still fits next to it: 6 - 4 = 2 cpus left in each zone
    assert feasible(inflight, gpod("2", name="small")) == ["a", "b", "c"]


def test_burst_of_pods_is_not_sent_to_one_zone() -> None:
    inflight = InFlight()
    nodes, nrts = cluster()
    chosen: list[str] = []
    for i in range(4):
        p = gpod("4", name=f"r{i}", uid=f"u{i}")
        decision = decide_numa(p, nodes, nrts, CFG, inflight=inflight, cache=TopologyCache())
        if not decision.candidates:
            break
        best = decision.candidates[0]
        chosen.append(best)
        inflight.add(f"u{i}", f"default/r{i}", effective_requests(p), [best])
    # each node has 2 zones x 6 cpus but the in-flight hold is pessimistic (all zones):
    # one 4-cpu pod per node, then nothing fits
    assert sorted(chosen) == ["a", "b", "c"]


def test_binding_narrows_the_hold_to_the_bound_node() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a", "b"])
    inflight.observe_pod({**p, "spec": {**p["spec"], "nodeName": "b"}})
    assert feasible(inflight) == ["a", "c"]
    assert inflight.pending() == [("default/first", ("b",))]


def test_nrt_update_after_binding_releases_without_fingerprint() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a"])
    inflight.observe_nrt(nrt("a", ZONES, rv="1"))  # before binding: nothing changes
    assert "default/first" in inflight
    inflight.observe_pod({**p, "spec": {**p["spec"], "nodeName": "a"}})
    inflight.observe_nrt(nrt("a", ZONES, rv="1"))  # re-delivery of the same version
    assert "default/first" in inflight
    inflight.observe_nrt(nrt("b", ZONES, rv="2"))  # another node
    assert "default/first" in inflight
    inflight.observe_nrt(nrt("a", ZONES, rv="2"))
    assert "default/first" not in inflight
    assert feasible(inflight) == ["a", "b", "c"]


def test_matching_fingerprint_releases_the_pod() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a"])
    other = gpod("1", name="other", namespace="kube-system", uid="uid-o", node_name="a",
                 phase="Running")
    inflight.observe_pod(other)
    running = {**p, "spec": {**p["spec"], "nodeName": "a"}, "status": {"phase": "Running"}}
    inflight.observe_pod(running)
    fp = pod_fingerprint([("kube-system", "other"), ("default", "first")])
    inflight.observe_nrt(nrt("a", ZONES, rv="9",
                             attrs={"nodeTopologyPodsFingerprint": fp,
                                    "nodeTopologyPodsFingerprintMethod": "all"}))
    assert len(inflight) == 0


def test_stale_fingerprint_keeps_the_hold_for_one_more_update() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a"])
    inflight.observe_pod({**p, "spec": {**p["spec"], "nodeName": "a"},
                          "status": {"phase": "Running"}})
    stale = pod_fingerprint([])  # the NRT does not count our pod yet
    attrs = {"nodeTopologyPodsFingerprint": stale}
    inflight.observe_nrt(nrt("a", ZONES, rv="9", attrs=attrs))
    assert "default/first" in inflight
    inflight.observe_nrt(nrt("a", ZONES, rv="10", attrs=attrs))
    assert "default/first" not in inflight


def test_fingerprint_with_exclusive_resources_counts_only_exclusive_pods() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a"])
    shared = pod([ctr("web", {"cpu": "500m"}, guaranteed=False)], name="web", uid="uw",
                 node_name="a", phase="Running")
    inflight.observe_pod(shared)
    inflight.observe_pod({**p, "spec": {**p["spec"], "nodeName": "a"},
                          "status": {"phase": "Running"}})
    fp = pod_fingerprint([("default", "first")])  # the burstable pod is not counted
    inflight.observe_nrt(nrt("a", ZONES, rv="9", attrs={
        "nodeTopologyPodsFingerprint": fp,
        "nodeTopologyPodsFingerprintMethod": "with-exclusive-resources"}))
    assert len(inflight) == 0


def test_deletion_and_terminal_phase_release() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a"])
    q = ungated(inflight, "second", ["b"])
    inflight.observe_pod(p, deleted=True)
    inflight.observe_pod({**q, "status": {"phase": "Failed"}})
    assert len(inflight) == 0


def test_same_name_new_uid_drops_the_old_entry() -> None:
    inflight = InFlight()
    ungated(inflight, "first", ["a"])
    recreated = gpod("4", name="first", uid="uid-new")
    inflight.observe_pod(recreated)
    assert len(inflight) == 0


def test_entries_expire_after_max_age() -> None:
    clock = Clock()
    inflight = InFlight(max_age_seconds=60, clock=clock)
    ungated(inflight, "first", ["a"])
    clock.now = 59.0
    assert feasible(inflight) == ["b", "c"]
    clock.now = 60.0
    assert feasible(inflight) == ["a", "b", "c"]
    assert len(inflight) == 0


def test_adjusted_subtracts_from_every_zone_and_leaves_others_untouched() -> None:
    inflight = InFlight()
    ungated(inflight, "first", ["a"], cpu="5")
    ungated(inflight, "second", ["a"], cpu="3")
    _, nrts = cluster()
    adjusted = inflight.adjusted(nrts)
    assert adjusted["b"] is nrts["b"]
    for zone in adjusted["a"]["zones"]:
        amounts = {r["name"]: parse_quantity(r["name"], r["available"]) for r in zone["resources"]}
        assert amounts["cpu"] == 0  # 6 - 8 clamps at 0
        assert amounts["memory"] == 30 * 1024**3
    # the input is not modified
    assert nrts["a"]["zones"][0]["resources"][0]["available"] == 6


def test_unreadable_nrt_is_ignored() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a"])
    inflight.observe_pod({**p, "spec": {**p["spec"], "nodeName": "a"}})
    inflight.observe_nrt(nrt("a", [{"cpu": "lots"}], rv="5"))
    assert "default/first" in inflight


def test_nrt_written_before_the_binding_does_not_release() -> None:
    inflight = InFlight()
    p = ungated(inflight, "first", ["a"])
    bound = {**p, "metadata": {**p["metadata"], "resourceVersion": "100"},
             "spec": {**p["spec"], "nodeName": "a"}}
    inflight.observe_pod(bound)
    inflight.observe_nrt(nrt("a", ZONES, rv="90"))  # older revision, delivered late
    assert "default/first" in inflight
    inflight.observe_nrt(nrt("a", ZONES, rv="101"))
    assert "default/first" not in inflight
