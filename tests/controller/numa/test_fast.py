"""The fast (numpy) decision equals the reference (node-by-node) decision, and the arrays it
keeps follow the cluster as Nodes and NRTs change."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podplacement.rules.config import TopologyConfig
from podplacement.rules.numa import InFlight, NumaDecision, TopologyCache, decide_numa
from tests.controller.numa._build import ctr, gpod, node, nrt, pod

SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

RESOURCES = ("cpu", "memory", "example.com/nic", "hugepages-2Mi", "ephemeral-storage")
# Mostly small amounts (so fits and misfits both happen); now and then one beyond int64 range.
amount_st = st.integers(0, 60).map(lambda v: 2**62 if v == 60 else v % 13)
zone_st = st.dictionaries(st.sampled_from(RESOURCES), amount_st, max_size=4)
# Zones that can hold a pod: cpu and memory always listed.
dense_zone_st = st.fixed_dictionaries({"cpu": amount_st, "memory": amount_st},
                                      optional={"example.com/nic": st.integers(0, 3)})
policy_st = st.sampled_from(["single-numa-node", "single-numa-node", "single-numa-node",
                             "best-effort", "restricted", "none"])


def _quantity(name: str, value: int) -> str | int:
    """cpu in half cores (so whole-core rounding in scores matters), memory in Gi."""
    if name == "cpu":
        return f"{value * 500}m"
    return f"{value}Gi" if name == "memory" else value


def _amount(name: str, value: int) -> int:
    """:func:`_quantity` as the integer the code works with (millicores, bytes)."""
    return value * 500 if name == "cpu" else value * 2**30 if name == "memory" else value


@st.composite
def cluster_st(draw: st.DrawFn, dense: bool = False
               ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """1..6 nodes: each without NRT, with an unreadable NRT or with 1..4 zones (``dense``:
    every node has a single-numa-node NRT with 2..4 zones, so every rule is exercised)."""
    nodes: list[dict[str, Any]] = []
    nrts: dict[str, dict[str, Any]] = {}
    for i in range(draw(st.integers(1, 6))):
        name = f"n{i}"
        alloc: dict[str, str] = {"cpu": "64", "memory": "64Gi"}
        if draw(st.booleans()):
            alloc["example.com/nic"] = "8"
        if draw(st.booleans()):
            alloc["hugepages-2Mi"] = "1Gi"
        n = node(name, alloc, hostname=f"host-{i}")
        n["metadata"]["resourceVersion"] = str(draw(st.integers(1, 3)))
        nodes.append(n)
        kind = "nrt" if dense else draw(st.sampled_from(["nrt", "nrt", "nrt", "none",
                                                          "invalid"]))
        if kind == "none":
            continue
        zones = draw(st.lists(dense_zone_st, min_size=2, max_size=4) if dense
                     else st.lists(zone_st, min_size=1, max_size=4))
        obj = nrt(name, [{k: _quantity(k, v) for k, v in z.items()} for z in zones],
                  policy="single-numa-node" if dense else draw(policy_st),
                  scope=draw(st.sampled_from(["pod", "container"])),
                  rv=draw(st.sampled_from([None, "7", "8"])))
        if draw(st.booleans()):  # zone order in the object must not matter
            obj["zones"].reverse()
        if kind == "invalid":
            obj["zones"][0]["resources"].append({"name": "cpu", "available": "lots"})
        nrts[name] = obj
    return nodes, nrts


request_st = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 8), max_size=4)
dense_request_st = st.fixed_dictionaries({"cpu": st.integers(1, 8), "memory": st.integers(1, 8)},
                                         optional={"example.com/nic": st.integers(0, 2)})


@st.composite
def pod_st(draw: st.DrawFn, dense: bool = False) -> dict[str, Any]:
    """A Guaranteed, Burstable or BestEffort pod with app, init and sidecar containers
    (``dense``: Guaranteed or Burstable, at least two app containers)."""
    qos = draw(st.sampled_from(["guaranteed", "guaranteed", "burstable"] if dense else
                               ["guaranteed", "guaranteed", "guaranteed", "burstable",
                                "besteffort"]))

    def container(name: str, sidecar: bool = False) -> dict[str, Any]:
        if qos == "besteffort":
            extra = draw(st.sampled_from([{}, {}, {"example.com/nic": "1"}]))
            return ctr(name, extra or None, guaranteed=bool(extra), sidecar=sidecar)
        raw = draw(dense_request_st if dense else request_st)
        reqs = {k: str(_quantity(k, v)) for k, v in raw.items()}
        reqs.setdefault("cpu", "1")
        reqs.setdefault("memory", "1Gi")
        if qos == "guaranteed":
            return ctr(name, reqs, sidecar=sidecar)
        limits = {k: v for k, v in reqs.items() if k not in ("cpu", "memory")}
        return ctr(name, reqs, limits or None, guaranteed=False, sidecar=sidecar)

    apps = [container(f"app{i}") for i in range(draw(st.integers(2 if dense else 1, 3)))]
    inits = [container(f"init{i}", sidecar=draw(st.booleans()))
             for i in range(draw(st.integers(0, 2)))]
    return pod(apps, init=inits)


config_st = st.builds(
    lambda strategy, without, limit: TopologyConfig(
        enabled=True, scoring_strategy=strategy, nodes_without_topology=without,
        max_candidate_nodes=limit),
    st.sampled_from(["LeastAllocated", "LeastAllocated", "MostAllocated",
                     "BalancedAllocation", "LeastNUMANodes"]),
    st.sampled_from(["Allow", "Deny"]),
    st.integers(0, 3),
)


def _same(fast: NumaDecision, ref: NumaDecision) -> None:
    assert fast.needed == ref.needed
    assert fast.candidates == ref.candidates
    assert fast.hostnames == ref.hostnames
    assert fast.scores == ref.scores
    assert fast.verdicts == ref.verdicts  # reasons included, built lazily on the fast side
    assert fast.policies() == ref.policies()
    assert fast.node_policies() == ref.node_policies() == tuple(sorted(
        {v.policy for v in ref.verdicts}))
    assert fast.annotation() == ref.annotation()


@SETTINGS
@given(cluster=st.one_of(cluster_st(), cluster_st(dense=True)), p=st.one_of(pod_st(),
       pod_st(dense=True)), config=config_st, data=st.data())
def test_fast_decision_equals_the_reference(
        cluster: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]], p: dict[str, Any],
        config: TopologyConfig, data: st.DataObject) -> None:
    nodes, nrts = cluster
    names = [n["metadata"]["name"] for n in nodes]
    eligible = set(data.draw(st.lists(st.sampled_from(names), unique=True), label="eligible")
                   if data.draw(st.integers(0, 3), label="filter") == 0 else names)
    inflight = InFlight()
    for i, held in enumerate(data.draw(st.lists(st.tuples(
            request_st, st.lists(st.sampled_from(names), min_size=1, unique=True)),
            max_size=2), label="inflight")):
        inflight.add(f"uid-{i}", f"ns/held-{i}", {k: _amount(k, v) for k, v in held[0].items()},
                     held[1])
    kwargs: dict[str, Any] = {"node_eligible": lambda n: n["metadata"]["name"] in eligible,
                              "inflight": inflight}
    fast = decide_numa(p, nodes, nrts, config, cache=TopologyCache(), **kwargs)
    ref = decide_numa(p, nodes, nrts, config, cache=TopologyCache(), reference=True, **kwargs)
    _same(fast, ref)


@SETTINGS
@given(first=cluster_st(), second=cluster_st(), p=pod_st(), config=config_st)
def test_kept_arrays_follow_changed_objects(
        first: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]],
        second: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]], p: dict[str, Any],
        config: TopologyConfig) -> None:
    """One cache sees a cluster, then other objects under the same node names (rows re-read
    in place), then the first ones again, and must decide like a fresh reference each time.
    Each version of an object has its own resourceVersion, as the API server guarantees."""
    cache = TopologyCache()
    for tag, (nodes, nrts) in (("a", first), ("b", second), ("a", first)):
        nodes = [_versioned(n, tag) for n in nodes]
        nrts = {k: _versioned(v, tag) for k, v in nrts.items()}
        fast = decide_numa(p, nodes, nrts, config, cache=cache)
        ref = decide_numa(p, nodes, nrts, config, cache=TopologyCache(), reference=True)
        _same(fast, ref)


def _versioned(obj: dict[str, Any], tag: str) -> dict[str, Any]:
    meta = obj["metadata"]
    if "resourceVersion" not in meta:
        return obj
    return {**obj, "metadata": {**meta, "resourceVersion": f"{meta['resourceVersion']}{tag}"}}


def _cluster(cpus: list[int], rv: str = "1") -> tuple[list[dict[str, Any]],
                                                      dict[str, dict[str, Any]]]:
    nodes = [node(f"n{i}") for i in range(len(cpus))]
    for n in nodes:
        n["metadata"]["resourceVersion"] = "1"
    nrts = {f"n{i}": nrt(f"n{i}", [{"cpu": c, "memory": "64Gi"}], scope="pod", rv=rv)
            for i, c in enumerate(cpus)}
    return nodes, nrts


def test_a_new_nrt_version_is_read_and_an_unchanged_one_is_not() -> None:
    cache = TopologyCache()
    cfg = TopologyConfig(enabled=True)
    nodes, nrts = _cluster([8, 8, 8])
    assert decide_numa(gpod("4"), nodes, nrts, cfg, cache=cache).candidates == ("n0", "n1", "n2")
    arrays = cache.arrays
    # Same resourceVersion, different content: an informer never does this, and the cached
    # row is kept (proof that unchanged versions are not re-read).
    nrts["n1"] = nrt("n1", [{"cpu": 2, "memory": "64Gi"}], scope="pod", rv="1")
    assert decide_numa(gpod("4"), nodes, nrts, cfg, cache=cache).candidates == ("n0", "n1", "n2")
    nrts["n1"] = nrt("n1", [{"cpu": 2, "memory": "64Gi"}], scope="pod", rv="2")
    assert decide_numa(gpod("4"), nodes, nrts, cfg, cache=cache).candidates == ("n0", "n2")
    assert cache.arrays is arrays  # updated in place, not rebuilt


def test_a_new_resource_or_a_removed_node_rebuilds_the_arrays() -> None:
    cache = TopologyCache()
    cfg = TopologyConfig(enabled=True)
    nodes, nrts = _cluster([8, 8])
    decide_numa(gpod("4"), nodes, nrts, cfg, cache=cache)
    arrays = cache.arrays
    nodes[1]["status"]["allocatable"]["example.com/nic"] = "2"
    nodes[1]["metadata"]["resourceVersion"] = "2"
    nrts["n1"] = nrt("n1", [{"cpu": 8, "memory": "64Gi", "example.com/nic": 1}], scope="pod",
                     rv="2")
    nic = gpod("4", extra={"example.com/nic": "1"})
    assert decide_numa(nic, nodes, nrts, cfg, cache=cache).candidates == ("n1",)
    assert cache.arrays is not arrays
    arrays = cache.arrays
    assert decide_numa(nic, nodes[1:], nrts, cfg, cache=cache).candidates == ("n1",)
    assert cache.arrays is not arrays


def test_reasons_are_built_when_read_and_match_the_reference() -> None:
    nodes, nrts = _cluster([2, 8])
    cfg = TopologyConfig(enabled=True)
    fast = decide_numa(gpod("4"), nodes, nrts, cfg, cache=TopologyCache())
    assert fast.candidates == ("n1",)
    first = fast.verdicts[0]
    assert not first.feasible and first.score is None
    assert first.reason == "cannot align pod: cpu 4 > 2 available in best zone"
    ref = decide_numa(gpod("4"), nodes, nrts, cfg, cache=TopologyCache(), reference=True)
    assert fast.verdicts == ref.verdicts


def test_duplicate_node_names_are_judged_by_the_reference_code() -> None:
    nodes, nrts = _cluster([8])
    twice = [nodes[0], dict(nodes[0])]
    cfg = TopologyConfig(enabled=True)
    fast = decide_numa(gpod("4"), twice, nrts, cfg, cache=TopologyCache())
    ref = decide_numa(gpod("4"), twice, nrts, cfg, cache=TopologyCache(), reference=True)
    assert len(fast.verdicts) == 2
    _same(fast, ref)


def test_verdicts_and_decisions_are_immutable() -> None:
    nodes, nrts = _cluster([8])
    decision = decide_numa(gpod("4"), nodes, nrts, TopologyConfig(enabled=True),
                           cache=TopologyCache())
    for obj, attr in ((decision, "candidates"), (decision.verdicts[0], "score")):
        try:
            setattr(obj, attr, None)
        except AttributeError:
            continue
        raise AssertionError(f"{type(obj).__name__}.{attr} could be set")


def test_amounts_beyond_int64_arithmetic_are_judged_exactly() -> None:
    # 2**62 bytes * 100 overflows int64: that node goes to the reference code, the other
    # stays in the arrays; both are scored exactly.
    nodes, nrts = _cluster([8, 8])
    nrts["n0"] = nrt("n0", [{"cpu": 8, "memory": 2**62}], scope="pod", rv="1")
    cfg = TopologyConfig(enabled=True)
    fast = decide_numa(gpod("4", "1Gi"), nodes, nrts, cfg, cache=TopologyCache())
    # n0: cpu (8-4)*100//8=50, memory (2**62-2**30)*100//2**62=99 -> 74;
    # n1: cpu 50, memory (64-1)*100//64=98 -> 74
    assert fast.scores == {"n0": 74, "n1": 74}
    ref = decide_numa(gpod("4", "1Gi"), nodes, nrts, cfg, cache=TopologyCache(), reference=True)
    _same(fast, ref)
