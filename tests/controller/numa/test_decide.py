"""The per-pod decision: candidates, ranking, hostnames, eligibility and the cache."""

from __future__ import annotations

from typing import Any

import pytest

from podplacement.rules.config import TopologyConfig
from podplacement.rules.numa import TopologyCache, decide_numa
from tests.controller.numa._build import ctr, gpod, node, nrt, pod


def _cluster(avail_cpu: dict[str, int]) -> tuple[list[dict[str, Any]],
                                                 dict[str, dict[str, Any]]]:
    nodes = [node(n, hostname=f"host-{n}") for n in avail_cpu]
    nrts = {n: nrt(n, [{"cpu": c, "memory": "64Gi"}], scope="pod") for n, c in avail_cpu.items()}
    return nodes, nrts


def test_candidates_best_score_first_ties_by_name() -> None:
    nodes, nrts = _cluster({"d": 8, "c": 16, "b": 8, "a": 4})
    decision = decide_numa(gpod("4", "1Gi"), nodes, nrts, TopologyConfig(enabled=True),
                           cache=TopologyCache())
    # c: cpu (16-4)*100//16=75, mem 98 -> 86; b, d: 50, 98 -> 74; a: 0 cpu score -> 49
    assert decision.scores == {"a": 49, "b": 74, "c": 86, "d": 74}
    assert decision.candidates == ("c", "b", "d", "a")
    assert decision.hostnames == ("host-c", "host-b", "host-d", "host-a")
    assert [v.name for v in decision.verdicts] == ["a", "b", "c", "d"]
    assert decision.needed and decision.feasible


def test_max_candidate_nodes_keeps_the_best() -> None:
    nodes, nrts = _cluster({"d": 8, "c": 16, "b": 8, "a": 4})
    cfg = TopologyConfig(enabled=True, max_candidate_nodes=2)
    decision = decide_numa(gpod("4", "1Gi"), nodes, nrts, cfg, cache=TopologyCache())
    assert decision.candidates == ("c", "b")
    assert len(decision.scores) == 4


def test_hostname_falls_back_to_node_name() -> None:
    n = node("n1")
    del n["metadata"]["labels"]["kubernetes.io/hostname"]
    decision = decide_numa(gpod("1"), [n], {"n1": nrt("n1", [{"cpu": 4, "memory": "8Gi"}])},
                           TopologyConfig(enabled=True), cache=TopologyCache())
    assert decision.hostnames == ("n1",)


def test_only_eligible_nodes_are_judged() -> None:
    nodes = [node("x86", arch="amd64"), node("arm", arch="arm64")]
    nrts = {n["metadata"]["name"]: nrt(n["metadata"]["name"], [{"cpu": 8, "memory": "8Gi"}])
            for n in nodes}
    decision = decide_numa(
        gpod("1"), nodes, nrts, TopologyConfig(enabled=True), cache=TopologyCache(),
        node_eligible=lambda n: n["metadata"]["labels"]["kubernetes.io/arch"] == "arm64")
    assert [v.name for v in decision.verdicts] == ["arm"]
    assert decision.candidates == ("arm",)


def test_needed_only_when_some_node_aligns_this_pod() -> None:
    nodes = [node("n1")]
    snn = {"n1": nrt("n1", [{"cpu": 8, "memory": "8Gi"}])}
    none = {"n1": nrt("n1", [{"cpu": 8, "memory": "8Gi"}], policy="best-effort")}
    cfg = TopologyConfig(enabled=True)
    assert decide_numa(gpod("1"), nodes, snn, cfg).needed
    assert not decide_numa(gpod("1"), nodes, none, cfg).needed
    assert not decide_numa(gpod("1"), nodes, {}, cfg).needed
    assert not decide_numa(pod([ctr("a")]), nodes, snn, cfg).needed  # BestEffort


def test_disabled_topology_decides_nothing() -> None:
    decision = decide_numa(gpod("1"), [node("n1")], {}, TopologyConfig(enabled=False))
    assert not decision.needed and decision.candidates == () and decision.verdicts == ()


def test_unknown_strategy_is_an_error() -> None:
    with pytest.raises(ValueError, match="MostRequested"):
        decide_numa(gpod("1"), [], {},
                    TopologyConfig(enabled=True, scoring_strategy="MostRequested"))


def test_invalid_nrt_makes_only_that_node_infeasible() -> None:
    bad = nrt("n1", [{"cpu": "lots", "memory": "8Gi"}])
    good = nrt("n2", [{"cpu": 8, "memory": "8Gi"}])
    decision = decide_numa(gpod("1"), [node("n1"), node("n2")], {"n1": bad, "n2": good},
                           TopologyConfig(enabled=True), cache=TopologyCache())
    assert decision.candidates == ("n2",)
    assert decision.verdicts[0].reason == \
        "invalid NodeResourceTopology: invalid resource quantity 'lots'"


def test_annotation_names_candidates_strategy_and_policies() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    nrts = {"n1": nrt("n1", [{"cpu": 8, "memory": "8Gi"}], scope="pod"),
            "n2": nrt("n2", [{"cpu": 8, "memory": "8Gi"}], policy="restricted")}
    decision = decide_numa(gpod("1"), nodes, nrts,
                           TopologyConfig(enabled=True, scoring_strategy="MostAllocated"))
    assert decision.annotation() == {
        "candidates": ["n1", "n2", "n3"],
        "strategy": "MostAllocated",
        "policies": ["restricted/container", "single-numa-node/pod"],
    }


def test_cache_reparses_on_a_new_resource_version_only() -> None:
    cache = TopologyCache()
    cfg = TopologyConfig(enabled=True)
    topo = nrt("n1", [{"cpu": 8, "memory": "8Gi"}], rv="1")
    assert decide_numa(gpod("4"), [node("n1")], {"n1": topo}, cfg, cache=cache).candidates
    shrunk = nrt("n1", [{"cpu": 2, "memory": "8Gi"}], rv="2")
    assert not decide_numa(gpod("4"), [node("n1")], {"n1": shrunk}, cfg, cache=cache).candidates
    # a replica of the same pod reuses verdicts, and sees the same answer
    assert not decide_numa(gpod("4", name="q"), [node("n1")], {"n1": shrunk}, cfg,
                           cache=cache).candidates


def test_memo_never_mixes_up_pod_shapes_across_trims() -> None:
    cache = TopologyCache(max_memo=2)
    cfg = TopologyConfig(enabled=True)
    nodes = [node("n1"), node("n2")]
    nrts = {n: nrt(n, [{"cpu": 8, "memory": "8Gi"}], rv="1") for n in ("n1", "n2")}
    for _ in range(3):
        assert len(decide_numa(gpod("4"), nodes, nrts, cfg, cache=cache).candidates) == 2
        assert decide_numa(gpod("9"), nodes, nrts, cfg, cache=cache).candidates == ()
