"""Pools that start at zero (docs/pools/autoscalers.md): a pod whose images need a platform
no node has yet is placed for it (no fallback, no hold), its decision and a Normal
``PlatformNotInCluster`` say that no node of it exists yet, and ``explain`` says the pod
waits for one. What must not change: disjoint platforms keep the unsatisfiable marker, a
platform some node has says nothing, the user's pins that admit other nodes say nothing,
and NUMA placement with no NRT of the pod's platform does not hold the pod."""

from __future__ import annotations

import json
from typing import Any

from podplacement.rules.admit.admissionpolicy import admission_record
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    PlacementConfig,
    TopologyConfig,
)
from podplacement.rules.monitor.admitted import admission_events, admission_warning, decision_record
from podplacement.rules.monitor.explain import explain, render
from podplacement.rules.place import decision as d
from podplacement.rules.place.affinity import expression
from podplacement.rules.place.placement import (
    PlacementInputs,
    compact_json,
    no_node_text,
    placement_facts,
)
from podplacement.rules.place.plan import plan
from podplacement.rules.place.render import admission_patch
from podplacement.rules.platforms import node_inventory
from tests.controller._pods import apply, gated_pod, img, required, terms_of
from tests.controller.numa._build import gpod, node, nrt
from tests.controller.test_admission import _json_patch

CFG = PlacementConfig()
ARM_ONLY = {"reg/app:1": img("reg/app:1", "linux/arm64")}
AMD_NODES = [node("amd-a"), node("amd-b")]
WAITING = "no node of linux/arm64 exists yet: the pod waits for one (an autoscaler can create it)"


def _decide(pod: dict[str, Any], images: dict[str, Any],
            nodes: list[dict[str, Any]] | None = AMD_NODES,
            config: PlacementConfig = CFG, nrts: dict[str, Any] | None = None) -> d.Decision:
    return plan(PlacementInputs(pod, images, config), nodes=nodes, nrts=nrts or {}, now=0.0)


def _record(pod: dict[str, Any], dec: d.Decision) -> dict[str, Any]:
    new = apply(pod, list(dec.patch))
    out: dict[str, Any] = json.loads(new["metadata"]["annotations"][DECISION_ANNOTATION])
    return out


def test_no_node_of_the_platform_places_the_pod_for_it_and_says_so() -> None:
    pod = gated_pod()
    dec = _decide(pod, ARM_ONLY)
    assert dec.outcome == d.Outcome.SET and dec.ungate
    new = apply(pod, list(dec.patch))
    assert terms_of(new) == [{"matchExpressions": [
        expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]}]
    assert "schedulingGates" not in new["spec"]
    record = _record(pod, dec)
    assert record["noNodeYet"] == ["linux/arm64"]
    assert record["result"] == "set" and "fallback" not in record
    assert list(record)[-3:] == ["noNodeYet", "result", "reason"]
    assert not dec.warnings
    assert [(e.type, e.reason, e.message) for e in dec.events][1:] == [
        ("Normal", d.PLATFORM_NOT_IN_CLUSTER, WAITING)]
    assert dec.events[0].reason == d.PLACEMENT_DECIDED
    assert "no node" not in dec.reason  # the reason stays the placement's own


def test_several_platforms_without_a_node_are_all_named() -> None:
    images = {"reg/app:1": img("reg/app:1", "linux/arm64", "linux/s390x")}
    dec = _decide(gated_pod(), images)
    assert dec.record["noNodeYet"] == ["linux/arm64", "linux/s390x"]
    assert dec.events[-1].message == no_node_text(["linux/arm64", "linux/s390x"])


def test_a_windows_image_in_a_cluster_of_linux_nodes_of_its_arch_waits_too() -> None:
    """Pairs, not architectures: amd64 nodes of Linux cannot run a windows/amd64 image."""
    images = {"reg/app:1": img("reg/app:1", "windows/amd64")}
    dec = _decide(gated_pod(), images)
    assert dec.record["noNodeYet"] == ["windows/amd64"]


def test_one_platform_with_a_node_says_nothing() -> None:
    images = {"reg/app:1": img("reg/app:1", "linux/amd64", "linux/arm64")}
    dec = _decide(gated_pod(), images)
    assert "noNodeYet" not in dec.record
    assert [e.reason for e in dec.events] == [d.PLACEMENT_DECIDED]


def test_nodes_unknown_or_none_seen_say_nothing() -> None:
    for nodes in (None, []):
        dec = _decide(gated_pod(), ARM_ONLY, nodes=nodes)
        assert dec.outcome == d.Outcome.SET and "noNodeYet" not in dec.record
        assert [e.reason for e in dec.events] == [d.PLACEMENT_DECIDED]


def test_disjoint_platforms_keep_the_unsatisfiable_marker() -> None:
    pod = gated_pod(images=("reg/a:1", "reg/b:1"))
    images = {"reg/a:1": img("reg/a:1", "linux/arm64"),
              "reg/b:1": img("reg/b:1", "linux/s390x")}
    dec = _decide(pod, images)
    assert dec.outcome == d.Outcome.NO_SUPPORTED_PLATFORM
    assert terms_of(apply(pod, list(dec.patch))) == [
        {"matchExpressions": [expression(NO_SUPPORTED_PLATFORM_KEY, "Exists")]}]
    assert "noNodeYet" not in dec.record
    assert [e.reason for e in dec.events] == [d.NO_SUPPORTED_PLATFORM_EVENT]


def test_a_nodeselector_pin_on_a_platform_no_node_has_waits_for_it() -> None:
    """Images of amd64 and arm64, pinned to arm64 by the user: only arm64 counts."""
    images = {"reg/app:1": img("reg/app:1", "linux/amd64", "linux/arm64")}
    dec = _decide(gated_pod(node_selector={ARCH_LABEL: "arm64"}), images)
    assert dec.record["noNodeYet"] == ["linux/arm64"]


def test_a_pin_admitting_a_value_no_image_supports_says_nothing() -> None:
    """The user's own ``In`` list also admits amd64 (emulation, kept as written): the pod
    can run on the amd64 nodes, so it does not wait."""
    pod = gated_pod(affinity=required([expression(ARCH_LABEL, "In", ["amd64", "arm64"])]))
    dec = _decide(pod, ARM_ONLY)
    assert "noNodeYet" not in dec.record
    assert all(e.reason != d.PLATFORM_NOT_IN_CLUSTER for e in dec.events)


def test_an_incompatible_pin_warns_and_says_nothing_else() -> None:
    dec = _decide(gated_pod(node_selector={ARCH_LABEL: "amd64"}), ARM_ONLY)
    assert [e.reason for e in dec.events] == [d.INCOMPATIBLE_NODE_SELECTOR]
    assert "noNodeYet" not in dec.record


def test_numa_placement_does_not_hold_a_pod_whose_platform_has_no_node() -> None:
    """Topology on, NRTs on the amd64 nodes only: a Guaranteed arm64-only pod has no
    eligible node, so it needs no NUMA alignment: placed at once, not ``wait-numa``."""
    pod = gpod("2", "1Gi", name="g", namespace="ns")
    pod["spec"]["containers"][0]["image"] = "reg/app:1"
    pod["metadata"]["resourceVersion"] = "1"
    pod["spec"]["schedulingGates"] = [{"name": "podplacement.io/scheduling-gate"}]
    numa = PlacementConfig(topology=TopologyConfig(enabled=True))
    nrts = {n["metadata"]["name"]: nrt(n["metadata"]["name"], [{"cpu": 8, "memory": "8Gi"}])
            for n in AMD_NODES}
    dec = _decide(pod, ARM_ONLY, config=numa, nrts=nrts)
    assert dec.outcome == d.Outcome.SET and dec.ungate
    assert dec.record["noNodeYet"] == ["linux/arm64"]
    # the same pod with an arm64 node and its NRT is NUMA-placed: the rule is unchanged
    arm = node("arm-a", arch="arm64")
    placed = _decide(pod, ARM_ONLY, nodes=[*AMD_NODES, arm], config=numa,
                     nrts={**nrts, "arm-a": nrt("arm-a", [{"cpu": 8, "memory": "8Gi"}])})
    assert placed.numa_placed and "noNodeYet" not in placed.record


def test_the_inventory_counts_pairs_with_linux_as_the_default_os() -> None:
    inventory = node_inventory([{"metadata": {"labels": {ARCH_LABEL: "arm64"}}}])
    assert inventory.pairs == frozenset({("linux", "arm64")})
    dec = d.decide(PlacementInputs(gated_pod(), ARM_ONLY, CFG, nodes=inventory))
    assert "noNodeYet" not in dec.record


def test_explain_says_the_pod_waits_for_a_node() -> None:
    report = explain(gated_pod(), AMD_NODES, {}, ARM_ONLY, CFG)
    assert report["noNodeYet"] == ["linux/arm64"]
    assert report["waiting"] == WAITING
    assert report["outcome"] == "set"
    assert all(not row["feasible"] for row in report["nodes"])
    assert f"Nodes: {WAITING}\n" in render(report, "table")
    assert json.loads(render(report, "json"))["waiting"] == WAITING
    # a node of the platform: nothing to wait for
    arm = explain(gated_pod(), [*AMD_NODES, node("arm-a", arch="arm64")], {}, ARM_ONLY, CFG)
    assert arm["noNodeYet"] == [] and arm["waiting"] is None
    assert "Nodes:" not in render(arm, "table")


# --- pods placed at admission: the controller tells the Event ----------------------------


def _admission_pod(image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
            "spec": {"containers": [{"name": "c", "image": image}]}}


def _placed_by_policy(admission: dict[str, Any], catalog: dict[str, str],
                      catalog_uid: str) -> dict[str, Any]:
    """The pod as the admission policy stores it: the controller's facts rendered with the
    policy's record, which names the params object's uid (``"catalog"``), as the CEL
    writes it (tests/controller/test_admissionpolicy_place_realcluster.py)."""
    results = {i: img(i, *v.split(",")) for i, v in catalog.items()}
    facts = placement_facts(PlacementInputs(admission, results, CFG))
    placed = _json_patch(admission, list(admission_patch(admission, facts)))
    placed["metadata"]["annotations"][DECISION_ANNOTATION] = compact_json(
        admission_record(facts, catalog_uid))
    return placed


def test_a_pod_the_policy_placed_from_a_named_catalog_is_told_its_events() -> None:
    """The policy's record names the catalog's uid; the controller reproduces the decision
    with it (a record without it would never match, and no Event would be told)."""
    catalog = {"reg/arm:1": "linux/arm64"}
    placed = _placed_by_policy(_admission_pod("reg/arm:1"), catalog, "0d4a-uid")
    record = decision_record(placed)
    assert record is not None and record["catalog"] == "0d4a-uid"
    told = admission_events(placed, record, CFG, catalog=catalog.get,
                            nodes=node_inventory(AMD_NODES))
    assert [(e.type, e.reason, e.message) for e in told] == [
        ("Normal", d.PLATFORM_NOT_IN_CLUSTER, WAITING)]
    # a node of the platform: nothing to tell
    arm = node_inventory([*AMD_NODES, node("arm-a", arch="arm64")])
    assert admission_events(placed, record, CFG, catalog=catalog.get, nodes=arm) == ()


def test_the_policys_warning_is_told_too_with_a_named_catalog() -> None:
    catalog = {"reg/arm:1": "linux/arm64", "reg/s390:1": "linux/s390x"}
    admission = _admission_pod("reg/arm:1")
    admission["spec"]["containers"].append({"name": "d", "image": "reg/s390:1"})
    placed = _placed_by_policy(admission, catalog, "0d4a-uid")
    warning = admission_warning(placed, decision_record(placed), CFG, catalog=catalog.get)
    assert warning is not None and warning.reason == d.NO_SUPPORTED_PLATFORM_EVENT
