"""The pure decision for one gated pod: outcome, patch, labels, annotation, events."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from podplacement.rules.config import (
    AFFINITY_LABEL,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
    HOSTNAME_LABEL,
    NO_SUPPORTED_PLATFORM_KEY,
    NUMA_LABEL,
    OS_LABEL,
    ImageInspectionConfig,
    PlacementConfig,
    PlatformWeight,
    TopologyConfig,
)
from podplacement.rules.place import decision as d
from podplacement.rules.place.affinity import expression
from podplacement.rules.place.placement import PlacementInputs
from podplacement.rules.platforms import NodeInventory
from tests.controller._pods import apply, assert_kep3838, gated_pod, img, required, terms_of

CFG = PlacementConfig()
ZONE = expression("topology.kubernetes.io/zone", "In", ["a"])


def _apply(pod: dict[str, Any], dec: d.Decision) -> dict[str, Any]:
    new = apply(pod, list(dec.patch))
    assert_kep3838(pod, new)
    return new


def _annotation(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])


def test_single_arch_image_sets_affinity_and_ungates() -> None:
    pod = gated_pod()
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("reg/app:1", "linux/arm64")}, CFG))
    assert dec.outcome == d.Outcome.SET and dec.ungate
    new = _apply(pod, dec)
    assert terms_of(new) == [{"matchExpressions": [
        expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]}]
    assert "schedulingGates" not in new["spec"]
    assert new["metadata"]["labels"][GATE_LABEL] == "removed"
    assert new["metadata"]["labels"][AFFINITY_LABEL] == "set"
    ann = _annotation(new)
    assert ann["archs"] == ["arm64"] and ann["result"] == "set"
    assert ann["images"][0]["platforms"] == ["linux/arm64"]
    assert ann["images"][0]["digest"].startswith("sha256:")
    assert [e.reason for e in dec.events] == [d.PLACEMENT_DECIDED]


def test_containers_and_init_containers_intersect() -> None:
    pod = gated_pod(images=("a", "b"), init_images=("i",))
    images = {
        "a": img("a", "linux/amd64", "linux/arm64", "linux/s390x"),
        "b": img("b", "linux/amd64", "linux/arm64"),
        "i": img("i", "linux/arm64", "linux/s390x", "linux/amd64"),
    }
    dec = d.decide(PlacementInputs(pod, images, CFG))
    assert dec.architectures == ("amd64", "arm64")
    assert [i["image"] for i in json.loads(dec.annotation)["images"]] == ["i", "a", "b"]


def _with_image_volume(pod: dict[str, Any], reference: str, **source: str) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}},
                              {"name": "models", "image": {"reference": reference, **source}}]
    return pod


def test_an_image_volume_is_one_of_the_pods_images() -> None:
    """KEP-4639: the kubelet pulls ``volumes[].image.reference`` for the node's platform,
    with ``pullPolicy`` as the volume's imagePullPolicy; it comes after the containers."""
    pod = _with_image_volume(gated_pod(images=("a",), init_images=("i",)), "vol:1",
                             pullPolicy="Always")
    pod["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "e:1"}]
    assert [(c.container, c.image, c.pull_policy, c.init, c.volume)
            for c in d.pod_images(pod)] == [
        ("i0", "i", "IfNotPresent", True, False), ("c0", "a", "IfNotPresent", False, False),
        ("models", "vol:1", "Always", False, True)]
    assert d.unique_images(pod) == {"i": False, "a": False, "vol:1": True}


def test_odd_volumes_are_no_images() -> None:
    for volumes in ("x", ["x"], [{"name": "v", "image": "r:1"}], [{"name": "v", "image": {}}],
                    [{"name": "v", "image": {"reference": ""}}], [{"name": "v", "emptyDir": {}}]):
        pod = gated_pod(images=("a",))
        pod["spec"]["volumes"] = volumes
        assert d.unique_images(pod) == {"a": False}, volumes


def test_an_image_volume_narrows_the_architectures_and_is_named_in_the_annotation() -> None:
    """A multi-arch container image and an arm64-only image volume: arm64 only, and the
    annotation names the volume's image like a container's."""
    pod = _with_image_volume(gated_pod(images=("multi:1",)), "armonly:1")
    images = {"multi:1": img("multi:1", "linux/amd64", "linux/arm64"),
              "armonly:1": img("armonly:1", "linux/arm64")}
    dec = d.decide(PlacementInputs(pod, images, CFG))
    assert dec.outcome == d.Outcome.SET and dec.architectures == ("arm64",)
    new = _apply(pod, dec)
    assert terms_of(new) == [{"matchExpressions": [
        expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]}]
    ann = _annotation(new)
    assert [(i["image"], i["platforms"]) for i in ann["images"]] == [
        ("multi:1", ["linux/amd64", "linux/arm64"]), ("armonly:1", ["linux/arm64"])]
    # the volume's image not inspected: the pod is not placed from the container's alone
    missing = d.decide(PlacementInputs(pod, {"multi:1": images["multi:1"]}, CFG))
    assert missing.outcome == d.Outcome.RETRY and not missing.ungate


def test_empty_intersection_requires_the_marker_and_warns() -> None:
    pod = gated_pod(images=("a", "b"), affinity=required([ZONE]))
    dec = d.decide(
        PlacementInputs(pod, {"a": img("a", "linux/amd64"), "b": img("b", "linux/arm64")}, CFG),
    )
    assert dec.outcome == d.Outcome.NO_SUPPORTED_PLATFORM and dec.ungate
    new = _apply(pod, dec)
    assert terms_of(new)[0]["matchExpressions"][-1] == {
        "key": NO_SUPPORTED_PLATFORM_KEY,
        "operator": "Exists",
    }
    assert dec.events[0].type == "Warning" and dec.events[0].reason == d.NO_SUPPORTED_PLATFORM_EVENT


def test_compatible_node_selector_pin_keeps_affinity() -> None:
    pod = gated_pod(node_selector={ARCH_LABEL: "arm64"}, affinity=required([ZONE]))
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64", "linux/arm64")}, CFG))
    new = _apply(pod, dec)
    # the arch pin is the user's; only the OS (not pinned) is narrowed
    assert terms_of(new) == [{"matchExpressions": [
        *terms_of(pod)[0]["matchExpressions"], expression(OS_LABEL, "In", ["linux"])]}]
    assert dec.architectures == ("amd64", "arm64")
    assert dec.events[0].reason == d.PLACEMENT_DECIDED


def test_incompatible_node_selector_pin_warns() -> None:
    pod = gated_pod(node_selector={ARCH_LABEL: "s390x"})
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64")}, CFG))
    assert dec.ungate and dec.events[0].reason == d.INCOMPATIBLE_NODE_SELECTOR


def test_weights_become_preferred_terms_for_supported_archs() -> None:
    cfg = replace(
        CFG, preferred_platforms=(PlatformWeight("arm64", 80), PlatformWeight("s390x", 10))
    )
    pod = gated_pod()
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64", "linux/arm64")}, cfg))
    new = _apply(pod, dec)
    pref = new["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert pref == [
        {
            "weight": 80,
            "preference": {"matchExpressions": [expression(ARCH_LABEL, "In", ["arm64"])]},
        }
    ]


def test_user_arch_preference_is_kept() -> None:
    cfg = replace(CFG, preferred_platforms=(PlatformWeight("arm64", 80),))
    mine = {
        "weight": 3,
        "preference": {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"])]},
    }
    pod = gated_pod(
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [mine]}}
    )
    new = _apply(pod, d.decide(
        PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64", "linux/arm64")}, cfg),
    ))
    assert new["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ] == [mine]


def test_windows_image_adds_an_os_requirement() -> None:
    pod = gated_pod()
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("w", "windows/amd64")}, CFG))
    exprs = terms_of(_apply(pod, dec))[0]["matchExpressions"]
    assert exprs == [
        expression(ARCH_LABEL, "In", ["amd64"]),
        expression(OS_LABEL, "In", ["windows"]),
    ]


def test_inspection_error_retries_then_falls_back_to_the_default_os_requirement() -> None:
    cfg = replace(CFG, image_inspection=ImageInspectionConfig(max_retries=2))
    pod = gated_pod()
    err = {"reg/app:1": ConnectionError("registry down")}
    first = d.decide(PlacementInputs(pod, err, cfg, failures=0))
    assert first.outcome == d.Outcome.RETRY and not first.patch
    assert first.events[0].reason == d.IMAGE_INSPECTION_FAILED
    assert d.decide(
        PlacementInputs(pod, err, cfg, failures=1),
    ).events == ()  # one warning, not one per retry
    last = d.decide(PlacementInputs(pod, err, cfg, failures=2))
    assert last.outcome == d.Outcome.FALLBACK and last.ungate
    new = _apply(pod, last)
    # never released to any node: no fallbackArchitecture, still Linux only
    assert terms_of(new) == [{"matchExpressions": [expression(OS_LABEL, "In", ["linux"])]}]
    assert new["metadata"]["labels"][AFFINITY_LABEL] == "set"
    ann = _annotation(new)
    assert ann["result"] == "fallback" and ann["fallback"] is None and ann["archs"] == []
    assert "registry down" in ann["images"][0]["error"]
    assert ann["reason"] == (
        "image inspection failed after 3 attempts (reg/app:1); fallback: required "
        "kubernetes.io/os In [linux] (fallbackOperatingSystems); any kubernetes.io/arch "
        "(no fallbackArchitecture)")
    assert last.events[0].reason == d.PLACEMENT_FALLBACK
    assert last.events[0].message == ann["reason"]


def test_fallback_architecture_is_required_when_configured() -> None:
    cfg = replace(
        CFG, fallback_architecture="amd64", image_inspection=ImageInspectionConfig(max_retries=0)
    )
    pod = gated_pod()
    dec = d.decide(PlacementInputs(pod, {}, cfg))  # image missing from the map counts as an error
    new = _apply(pod, dec)
    assert terms_of(new) == [{"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                                                   expression(OS_LABEL, "In", ["linux"])]}]
    assert _annotation(new)["fallback"] == "amd64"
    assert "required kubernetes.io/arch In [amd64] (fallbackArchitecture), kubernetes.io/os " \
        "In [linux] (fallbackOperatingSystems)" in dec.events[0].message


def test_a_platform_no_node_has_is_placed_and_told_not_warned() -> None:
    """A pool at zero (docs/pools/autoscalers.md): placed for s390x as usual, a Normal
    ``PlatformNotInCluster`` after ``PlacementDecided``, no Warning."""
    nodes = NodeInventory(frozenset({"amd64"}), frozenset({("linux", "amd64")}), 3)
    dec = d.decide(
        PlacementInputs(gated_pod(), {"reg/app:1": img("x", "linux/s390x")}, CFG, nodes=nodes),
    )
    assert dec.outcome == d.Outcome.SET and not dec.warnings
    assert [(e.type, e.reason) for e in dec.events] == [
        (d.NORMAL, d.PLACEMENT_DECIDED), (d.NORMAL, d.PLATFORM_NOT_IN_CLUSTER)]


def test_pod_without_our_gate_is_skipped() -> None:
    dec = d.decide(PlacementInputs(gated_pod(gates=("other",)), {}, CFG))
    assert dec.outcome == d.Outcome.SKIP and not dec.patch


def test_other_gate_stays() -> None:
    pod = gated_pod(gates=("podplacement.io/scheduling-gate", "example.com/x"))
    new = _apply(pod, d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64")}, CFG)))
    assert new["spec"]["schedulingGates"] == [{"name": "example.com/x"}]


@dataclass(frozen=True)
class Verdict:
    name: str
    policy: str = "single-numa-node"


@dataclass(frozen=True)
class Numa:
    needed: bool
    candidates: tuple[str, ...] = ()
    hostnames: tuple[str, ...] = ()
    scores: dict[str, int] = field(default_factory=dict)
    strategy: str = "LeastAllocated"
    verdicts: tuple[Verdict, ...] = ()

    def node_policies(self) -> tuple[str, ...]:
        return tuple(sorted({v.policy for v in self.verdicts}))


TOPO = replace(CFG, topology=TopologyConfig(enabled=True, max_wait_seconds=60))


def test_numa_candidates_become_hostname_affinity() -> None:
    numa = Numa(True, ("n2", "n1"), ("h2", "h1"), {"n2": 90, "n1": 0}, verdicts=(Verdict("n1"),))
    pod = gated_pod(affinity=required([ZONE], [ZONE]))
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64")}, TOPO, numa=numa))
    new = _apply(pod, dec)
    for term in terms_of(new):
        assert term["matchExpressions"][-1] == expression(HOSTNAME_LABEL, "In", ["h2", "h1"])
    pref = new["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert [(p["weight"], p["preference"]["matchExpressions"][0]["values"]) for p in pref] == [
        (90, ["h2"]),
        (1, ["h1"]),
    ]
    ann = _annotation(new)
    assert ann["numa"] == {
        "strategy": "LeastAllocated",
        "candidates": ["n2", "n1"],
        "policy": "single-numa-node",
    }
    assert new["metadata"]["labels"][NUMA_LABEL] == "placed"


def test_numa_without_candidates_waits_then_ungates_arch_only() -> None:
    pod = gated_pod()
    images = {"reg/app:1": img("x", "linux/amd64")}
    wait = d.decide(PlacementInputs(pod, images, TOPO, numa=Numa(True), numa_waited_seconds=5))
    assert wait.outcome == d.Outcome.WAIT_NUMA and not wait.ungate
    waiting = apply(pod, list(wait.patch))
    assert waiting["metadata"]["labels"][NUMA_LABEL] == "waiting"
    assert waiting["spec"]["schedulingGates"]
    assert wait.events[0].reason == d.WAITING_FOR_NUMA
    # already waiting: nothing to write, no second event
    again = d.decide(PlacementInputs(waiting, images, TOPO, numa=Numa(True), numa_waited_seconds=6))
    assert again.outcome == d.Outcome.WAIT_NUMA and again.patch == () and again.events == ()
    done = d.decide(PlacementInputs(waiting, images, TOPO, numa=Numa(True), numa_waited_seconds=61))
    assert done.ungate and done.events[0].reason == d.PLACEMENT_FALLBACK
    new = _apply(waiting, done)
    assert NUMA_LABEL not in new["metadata"]["labels"]
    assert terms_of(new) == [{"matchExpressions": [
        expression(ARCH_LABEL, "In", ["amd64"]), expression(OS_LABEL, "In", ["linux"])]}]


def test_waiting_pod_that_gets_candidates_is_labelled_placed() -> None:
    """The one write turns ``numa=waiting`` into ``numa=placed`` (the binding feed's
    selector) and ungates; an arch-only decision never carries the label."""
    pod = gated_pod()
    images = {"reg/app:1": img("x", "linux/amd64")}
    waiting = apply(pod, list(d.decide(PlacementInputs(pod, images, TOPO, numa=Numa(True))).patch))
    numa = Numa(True, ("n1",), ("h1",), {"n1": 50})
    dec = d.decide(PlacementInputs(waiting, images, TOPO, numa=numa))
    assert dec.ungate and dec.labels[NUMA_LABEL] == "placed"
    new = _apply(waiting, dec)
    assert new["metadata"]["labels"][NUMA_LABEL] == "placed"
    assert "schedulingGates" not in new["spec"]
    plain = d.decide(PlacementInputs(pod, images, TOPO))
    assert NUMA_LABEL not in _apply(pod, plain)["metadata"]["labels"]
    unneeded = d.decide(PlacementInputs(pod, images, TOPO, numa=Numa(False)))
    assert NUMA_LABEL not in _apply(pod, unneeded)["metadata"]["labels"]


def test_numa_unsatisfiable_ungate_does_not_wait() -> None:
    cfg = replace(TOPO, topology=replace(TOPO.topology, unsatisfiable="Ungate"))
    dec = d.decide(
        PlacementInputs(gated_pod(), {"reg/app:1": img("x", "linux/amd64")}, cfg, numa=Numa(True)),
    )
    assert dec.ungate


def test_fallback_ungate_keeps_the_fallback_requirement_anded_into_the_terms() -> None:
    """The ordered uninstall's release of a pod it could not place: the same fallback
    requirement as after the last retry, ANDed into the user's term, with its Warning."""
    pod = gated_pod(affinity=required([ZONE]))
    cfg = replace(CFG, fallback_architecture="arm64")
    dec = d.fallback_ungate(pod, "podplacement is being uninstalled", cfg)
    assert dec.outcome == d.Outcome.FALLBACK and dec.ungate
    new = _apply(pod, dec)
    assert terms_of(new) == [{"matchExpressions": [
        ZONE, expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]}]
    assert "schedulingGates" not in new["spec"]
    ann = _annotation(new)
    assert ann["result"] == "fallback" and ann["fallback"] == "arm64"
    assert ann["reason"].startswith("podplacement is being uninstalled; fallback: required ")
    assert [(e.reason, e.message) for e in dec.events] == [(d.PLACEMENT_FALLBACK, ann["reason"])]
    assert d.fallback_ungate(gated_pod(gates=("other",)), "x", cfg).outcome == d.Outcome.SKIP


def test_plain_ungate_only_removes_the_gate() -> None:
    pod = gated_pod(affinity=required([ZONE]))
    dec = d.plain_ungate(pod, "uninstall")
    new = _apply(pod, dec)
    assert terms_of(new) == terms_of(pod) and "schedulingGates" not in new["spec"]
    assert _annotation(new) == {"result": "not-set", "reason": "uninstall"}


def test_os_pin_outside_linux_images_warns() -> None:
    pod = gated_pod(node_selector={OS_LABEL: "windows"})
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64")}, CFG))
    assert dec.ungate and dec.events[0].reason == d.INCOMPATIBLE_NODE_SELECTOR
    # the arch requirement still goes in (only the pinned key is left to the user)
    assert terms_of(_apply(pod, dec)) == [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"])]}
    ]


def test_decision_never_raises_on_odd_specs() -> None:
    pod = gated_pod()
    pod["spec"]["nodeSelector"] = "not-a-map"
    pod["spec"]["containers"].append({"name": "noimage"})
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [None, {"weight": 1}]}
    }
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/amd64")}, CFG))
    assert dec.ungate and dec.outcome == d.Outcome.SET


def test_outcomes_serialise_as_the_plain_strings() -> None:
    """``Outcome`` is a StrEnum: the annotation JSON, metric labels and log text are
    byte-identical to what the plain strings gave."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    assert [o.value for o in d.Outcome] == [
        "set", "not-set", "fallback", "no-supported-platform", "wait-numa", "retry", "skip"]
    for outcome in d.Outcome:
        assert json.dumps(outcome) == json.dumps(outcome.value)
        # logging formats with %s
        assert str(outcome) == f"{outcome}" == "%s" % outcome == outcome.value  # noqa: UP031
        assert type(str(outcome)) is str
    pod = gated_pod()
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("reg/app:1", "linux/arm64")}, CFG))
    assert isinstance(dec.outcome, d.Outcome) and dec.outcome == "set"
    record = json.loads(dec.annotation)
    assert record["result"] == "set" and '"result":"set"' in dec.annotation
    assert json.dumps(record, separators=(",", ":")) == dec.annotation  # plain str round trip
    ungate = d.plain_ungate(pod, "why")
    assert ungate.annotation == '{"result":"not-set","reason":"why"}'
    registry = CollectorRegistry()
    counter = Counter("processed", "x", ["outcome"], registry=registry)
    counter.labels(dec.outcome).inc()
    assert b'processed_total{outcome="set"} 1.0' in generate_latest(registry)


# --- exact (os, arch) pairs ---------------------------------------------------------------

MIXED = {"reg/app:1": img("reg/app:1", "windows/amd64", "linux/arm64")}
WORKER = expression("node-role.kubernetes.io/worker", "Exists")


def test_windows_amd64_and_linux_arm64_give_two_exact_terms_never_the_cross_product() -> None:
    pod = gated_pod()
    dec = d.decide(PlacementInputs(pod, MIXED, CFG))
    assert dec.outcome == d.Outcome.SET
    new = _apply(pod, dec)
    assert terms_of(new) == [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["arm64"]),
                              expression(OS_LABEL, "In", ["linux"])]},
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                              expression(OS_LABEL, "In", ["windows"])]},
    ]
    ann = _annotation(new)
    assert ann["pairs"] == ["linux/arm64", "windows/amd64"]
    assert ann["platforms"] == ["linux/arm64", "windows/amd64"]
    assert ann["reason"] == "required platforms linux/arm64, windows/amd64"
    assert [e.reason for e in dec.events] == [d.PLACEMENT_DECIDED]


def test_three_oses_decide_three_terms() -> None:
    images = {"a": img("a", "linux/amd64", "linux/arm64", "windows/amd64", "freebsd/amd64",
                       "freebsd/riscv64"),
              "b": img("b", "linux/arm64", "windows/amd64", "freebsd/riscv64", "linux/amd64")}
    pod = gated_pod(images=("a", "b"))
    new = _apply(pod, d.decide(PlacementInputs(pod, images, CFG)))
    assert [(t["matchExpressions"][0]["values"], t["matchExpressions"][1]["values"])
            for t in terms_of(new)] == [
        (["riscv64"], ["freebsd"]), (["amd64", "arm64"], ["linux"]), (["amd64"], ["windows"])]
    assert _annotation(new)["pairs"] == [
        "freebsd/riscv64", "linux/amd64", "linux/arm64", "windows/amd64"]


def test_linux_only_decision_is_the_one_term_and_the_annotation_of_before() -> None:
    pod = gated_pod()
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("x", "linux/arm64", "linux/amd64")}, CFG))
    new = _apply(pod, dec)
    assert terms_of(new) == [{"matchExpressions": [
        expression(ARCH_LABEL, "In", ["amd64", "arm64"]), expression(OS_LABEL, "In", ["linux"])]}]
    ann = _annotation(new)
    assert "pairs" not in ann
    assert [k for k in ann] == ["images", "platforms", "oses", "archs", "result", "reason"]
    assert ann["reason"] == "required architectures amd64, arm64"


def test_existing_term_is_narrowed_to_linux_and_the_left_out_pairs_are_warned() -> None:
    pod = gated_pod(affinity=required([ZONE]))
    dec = d.decide(PlacementInputs(pod, MIXED, CFG))
    new = _apply(pod, dec)
    assert terms_of(new) == [{"matchExpressions": [
        ZONE, expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]}]
    (event,) = dec.events
    assert event.type == d.WARNING and event.reason == d.PLATFORMS_LEFT_OUT
    assert event.message == (
        "each required nodeSelectorTerm keeps the platforms of one OS (a gated pod's terms "
        "can only be narrowed, KEP-3838): left out windows/amd64 from nodeSelectorTerms 0")
    assert _annotation(new)["pairs"] == ["linux/arm64"]
    assert dec.requirement is not None and dec.requirement.excluded == (("windows", "amd64"),)


def test_several_terms_and_a_windows_pin_keep_every_pair_reachable() -> None:
    pod = gated_pod(affinity=required(
        [ZONE], [WORKER], [expression(OS_LABEL, "In", ["windows"])]))
    dec = d.decide(PlacementInputs(pod, MIXED, CFG))
    new = _apply(pod, dec)
    terms = terms_of(new)
    assert terms[0]["matchExpressions"][1:] == terms[1]["matchExpressions"][1:] == [
        expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]
    assert terms[2]["matchExpressions"] == [
        expression(OS_LABEL, "In", ["windows"]), expression(ARCH_LABEL, "In", ["amd64"])]
    assert dec.events[0].reason == d.PLATFORMS_LEFT_OUT
    assert dec.events[0].message.endswith("left out windows/amd64 from nodeSelectorTerms 0, 1")
    assert _annotation(new)["pairs"] == ["linux/arm64", "windows/amd64"]


def test_node_selector_naming_a_pair_no_image_has_warns() -> None:
    pod = gated_pod(node_selector={OS_LABEL: "linux", ARCH_LABEL: "amd64"})
    dec = d.decide(PlacementInputs(pod, MIXED, CFG))
    assert dec.events[0].reason == d.INCOMPATIBLE_NODE_SELECTOR
    assert dec.events[0].message == (
        "nodeSelector kubernetes.io/os=linux, kubernetes.io/arch=amd64 names no platform every "
        "image supports (linux/arm64, windows/amd64); the pod cannot run there")


def test_term_pins_naming_only_unsupported_pairs_warn_incompatible() -> None:
    pod = gated_pod(affinity=required([expression(ARCH_LABEL, "In", ["amd64"]),
                                       expression(OS_LABEL, "In", ["linux"])]))
    dec = d.decide(PlacementInputs(pod, MIXED, CFG))
    assert dec.outcome == d.Outcome.NOT_SET
    assert terms_of(_apply(pod, dec)) == terms_of(pod)
    assert dec.events[0].reason == d.INCOMPATIBLE_NODE_AFFINITY
    assert "(linux/arm64, windows/amd64)" in dec.events[0].message


def test_a_pinned_pair_beside_a_compatible_term_is_partially_compatible() -> None:
    pod = gated_pod(affinity=required([expression(OS_LABEL, "In", ["windows"])],
                                      [expression(ARCH_LABEL, "In", ["amd64"]),
                                       expression(OS_LABEL, "In", ["linux"])]))
    dec = d.decide(PlacementInputs(pod, MIXED, CFG))
    assert dec.events[0].reason == d.PARTIALLY_COMPATIBLE_AFFINITY
    assert "(linux/amd64; supported: linux/arm64, windows/amd64)" in dec.events[0].message
