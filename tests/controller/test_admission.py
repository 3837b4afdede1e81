"""The webhook's fast path decides as the controller does (docs/how-it-decides.md "The webhook
after the policy"), and so does its answer while no controller runs (``outage_placement``: the
controller's decision after its last retry).

For generated pods as the webhook receives them (with or without our gate, other gates,
labels or none, existing required terms with and without arch pins, nodeSelector pins,
preferred terms) and generated configs, the pod the webhook's patch makes of the admission
object must be the pod the controller's PATCH makes of the gated pod created from it: same
affinity, labels, gates and decision annotation (but ``"path"``).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localkube.patch import apply_patch
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    FAST_PATHS_DISABLED,
    GATE_LABEL,
    GATE_LABEL_GATED,
    OS_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
    PlatformWeight,
    TopologyConfig,
)
from podplacement.rules.place.admission import (
    PATH_WEBHOOK,
    admission_placement,
    fast_path_applies,
    outage_placement,
)
from podplacement.rules.place.affinity import expression
from podplacement.rules.place.decision import (
    INCOMPATIBLE_NODE_AFFINITY,
    INCOMPATIBLE_NODE_SELECTOR,
    NO_SUPPORTED_PLATFORM_EVENT,
    PARTIALLY_COMPATIBLE_AFFINITY,
    PLATFORMS_LEFT_OUT,
    WARNING,
    decide,
)
from podplacement.rules.place.placement import PlacementInputs
from podplacement.rules.place.plan import plan
from podplacement.webhook.patch import gate_patch
from tests.controller._pods import apply, img

IMAGES = {
    i.reference: i
    for i in (
        img("reg/multi:1", "linux/amd64", "linux/arm64/v8"),
        img("reg/amd:1", "linux/amd64"),
        img("reg/arm:1", "linux/arm64/v8"),
        img("reg/s390:1", "linux/s390x"),
        img("reg/win:1", "windows/amd64"),
        img("reg/mixed:1", "windows/amd64", "linux/arm64"),
        img("reg/winlin:1", "windows/amd64", "linux/amd64", "linux/arm64"),
        img("reg/all:1", "linux/amd64", "linux/arm64", "linux/s390x", "linux/ppc64le"),
    )
}
ZONE = expression("topology.kubernetes.io/zone", "In", ["a"])

expr_st = st.sampled_from([
    ZONE,
    expression(ARCH_LABEL, "In", ["amd64"]),
    expression(ARCH_LABEL, "In", ["arm64", "s390x"]),
    expression(ARCH_LABEL, "NotIn", ["s390x"]),
    {"key": ARCH_LABEL, "operator": "Exists"},
    expression(OS_LABEL, "In", ["linux"]),
    expression(OS_LABEL, "In", ["windows"]),
    expression(OS_LABEL, "In", ["linux", "windows"]),
])


@st.composite
def admission_pod_st(draw: st.DrawFn) -> dict[str, Any]:
    """A pod as ``request.object`` carries it: no resourceVersion, maybe gated by the
    admission policy (gate + label), maybe with other gates, terms, pins, preferences."""
    images = draw(st.lists(st.sampled_from(sorted(IMAGES)), min_size=1, max_size=3))
    spec: dict[str, Any] = {
        "containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)]}
    if draw(st.booleans()):
        spec["initContainers"] = [{"name": "init", "image": draw(st.sampled_from(
            sorted(IMAGES)))}]
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if draw(st.booleans()):
        meta["labels"] = {"app": "x"}
    if draw(st.booleans()):
        meta["annotations"] = {"note": "y"}
    gates = []
    if draw(st.booleans()):
        gates.append({"name": "other.io/gate"})
    if draw(st.booleans()):  # the admission policy gated it
        gates.append({"name": SCHEDULING_GATE})
        meta.setdefault("labels", {})[GATE_LABEL] = GATE_LABEL_GATED
        if draw(st.booleans()):
            gates.append({"name": "later.io/gate"})
    if gates:
        spec["schedulingGates"] = gates
    node_affinity: dict[str, Any] = {}
    terms = draw(st.lists(st.lists(expr_st, min_size=1, max_size=3, unique_by=json.dumps),
                          max_size=3))
    if terms:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    if draw(st.booleans()):
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 5, "preference": {"matchExpressions": [draw(expr_st)]}}]
    if node_affinity:
        spec["affinity"] = {"nodeAffinity": node_affinity}
    selector = draw(st.sampled_from([None, {"disk": "ssd"}, {ARCH_LABEL: "amd64"},
                                     {ARCH_LABEL: "ppc64le"}, {OS_LABEL: "windows"}]))
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


config_st = st.builds(
    lambda weights, fallback, oses: PlacementConfig(
        preferred_platforms=tuple(PlatformWeight(a, w) for a, w in weights),
        fallback_architecture=fallback, fallback_operating_systems=oses),
    st.sampled_from([(), (("amd64", 10),), (("amd64", 30), ("arm64", 60))]),
    st.sampled_from([None, "amd64"]),
    st.sampled_from([("linux",), ("linux", "windows")]),
)


def _json_patch(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply ``ops`` as the API server applies an admission patch (RFC 6902)."""
    out = apply_patch("application/json-patch+json", pod, json.dumps(ops).encode(),
                      strategic=True)
    if (out.get("spec") or {}).get("schedulingGates") == []:
        del out["spec"]["schedulingGates"]
    return out


def _controller_path(admission: dict[str, Any], config: PlacementConfig,
                     images: dict[str, Any] | None = None, failures: int = 0
                     ) -> tuple[Any, dict[str, Any]]:
    """The pod created with the webhook's gate, then the controller's decision and PATCH
    (after ``failures`` failed rounds)."""
    created = (admission if any(g.get("name") == SCHEDULING_GATE
                                for g in admission["spec"].get("schedulingGates") or [])
               else _json_patch(admission, gate_patch(admission)))
    created = copy.deepcopy(created)
    created["metadata"]["resourceVersion"] = "41"
    created["metadata"]["uid"] = "u-1"
    decision = plan(
        PlacementInputs(created, IMAGES if images is None else images, config, failures=failures),
        nodes=None, nrts={}, now=0.0,
    )
    return decision, apply(created, list(decision.patch))


def _record(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    return out


def _view(pod: dict[str, Any]) -> dict[str, Any]:
    meta, spec = pod["metadata"], pod["spec"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != DECISION_ANNOTATION}
    record = _record(pod)
    record.pop("path", None)
    return {"affinity": spec.get("affinity"), "labels": meta.get("labels"),
            "gates": spec.get("schedulingGates"), "annotations": annotations,
            "decision": record, "nodeSelector": spec.get("nodeSelector")}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(admission=admission_pod_st(), config=config_st)
def test_webhook_placement_is_the_controllers_placement(
        admission: dict[str, Any], config: PlacementConfig) -> None:
    placement = admission_placement(admission, IMAGES, config)
    decision, by_controller = _controller_path(admission, config)
    placed = decision.outcome in ("set", "not-set", "no-supported-platform")
    assert (placement is not None) == placed, decision.reason
    if placement is None:
        return
    assert placement.outcome == decision.outcome
    by_webhook = _json_patch(admission, list(placement.patch))
    assert _view(by_webhook) == _view(by_controller)
    assert _record(by_webhook)["path"] == PATH_WEBHOOK
    assert "path" not in _record(by_controller)
    assert SCHEDULING_GATE not in [g["name"] for g in
                                   by_webhook["spec"].get("schedulingGates") or []]
    assert not any(op["path"] == "/metadata/resourceVersion" for op in placement.patch)
    warned = [e for e in decision.events if e.type == WARNING and e.reason in {
        INCOMPATIBLE_NODE_AFFINITY, INCOMPATIBLE_NODE_SELECTOR, PARTIALLY_COMPATIBLE_AFFINITY,
        PLATFORMS_LEFT_OUT, NO_SUPPORTED_PLATFORM_EVENT}]
    assert len(placement.warnings) == len(warned)
    for line, event in zip(placement.warnings, warned, strict=True):
        assert line.startswith("podplacement: ") and "\n" not in line
        assert line[len("podplacement: "):][:40] == event.message[:40]


def _pod(*images: str, gated: bool = False, selector: dict[str, str] | None = None
         ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": im}
                                           for i, im in enumerate(images)]}
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        meta["labels"] = {GATE_LABEL: GATE_LABEL_GATED}
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": meta, "spec": spec}


def test_ungated_pod_gets_no_gate_ops_and_a_whole_label_map() -> None:
    placement = admission_placement(_pod("reg/amd:1"), IMAGES, PlacementConfig())
    assert placement is not None and placement.outcome == "set"
    paths = [op["path"] for op in placement.patch]
    assert paths == ["/spec/affinity", "/metadata/labels", "/metadata/annotations"]
    assert placement.patch[1]["value"] == {GATE_LABEL: "removed",
                                           "podplacement.io/node-affinity": "set"}
    assert json.loads(placement.annotation)["path"] == "webhook"
    assert placement.warnings == ()


def test_policy_gated_pod_loses_our_gate_with_a_test() -> None:
    placement = admission_placement(_pod("reg/amd:1", gated=True), IMAGES, PlacementConfig())
    assert placement is not None
    assert list(placement.patch[-2:]) == [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": SCHEDULING_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/0"}]


def test_pin_outside_the_images_gives_a_warning() -> None:
    placement = admission_placement(_pod("reg/arm:1", selector={ARCH_LABEL: "amd64"}),
                                    IMAGES, PlacementConfig())
    assert placement is not None  # kubernetes.io/os In [linux] is still required
    assert len(placement.warnings) == 1
    assert placement.warnings[0].startswith("podplacement: nodeSelector kubernetes.io/arch=amd64")


def test_two_oses_are_placed_as_two_exact_terms() -> None:
    placement = admission_placement(_pod("reg/mixed:1"), IMAGES, PlacementConfig())
    assert placement is not None and placement.outcome == "set" and placement.warnings == ()
    terms = placement.patch[0]["value"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["arm64"]),
                              expression(OS_LABEL, "In", ["linux"])]},
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                              expression(OS_LABEL, "In", ["windows"])]}]
    assert json.loads(placement.annotation)["pairs"] == ["linux/arm64", "windows/amd64"]


def test_existing_terms_narrowed_to_one_os_give_a_warning_naming_the_pairs() -> None:
    pod = _pod("reg/mixed:1", gated=True)
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                {"nodeSelectorTerms": [
                                                    {"matchExpressions": [ZONE]}]}}}
    placement = admission_placement(pod, IMAGES, PlacementConfig())
    assert placement is not None and placement.outcome == "set"
    assert [op["value"] for op in placement.patch[:2]] == [
        expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]
    (warning,) = placement.warnings
    assert warning.startswith("podplacement: each required nodeSelectorTerm keeps the "
                              "platforms of one OS")
    assert warning.endswith("left out windows/amd64 from nodeSelectorTerms 0")


def test_no_supported_platform_is_placed_with_the_marker_and_warned() -> None:
    placement = admission_placement(_pod("reg/amd:1", "reg/s390:1"), IMAGES, PlacementConfig())
    assert placement is not None and placement.outcome == "no-supported-platform"
    assert "podplacement.io/no-supported-platform" in json.dumps(placement.patch[0])
    assert placement.warnings[0].startswith("podplacement: no platform is supported")


@pytest.mark.parametrize("config", [
    PlacementConfig(admission_fast_paths=FAST_PATHS_DISABLED),
    PlacementConfig(topology=TopologyConfig(enabled=True)),
])
def test_fast_paths_off_and_numa_never_place(config: PlacementConfig) -> None:
    assert not fast_path_applies(config)
    assert admission_placement(_pod("reg/amd:1"), IMAGES, config) is None


def test_an_unknown_or_failed_image_is_left_to_the_controller() -> None:
    assert admission_placement(_pod("reg/amd:1", "reg/new:1"), IMAGES,
                               PlacementConfig()) is None
    failed: dict[str, Any] = {**IMAGES, "reg/new:1": RuntimeError("401")}
    assert admission_placement(_pod("reg/amd:1", "reg/new:1"), failed,
                               PlacementConfig()) is None


def test_an_image_pulled_always_is_left_to_the_controller_unless_revalidated() -> None:
    """The controller revalidates such a tag with the registry for every pod; the webhook
    may place it only with results it revalidated for this admission."""
    pod = _pod("reg/amd:1", "reg/multi:1")
    warm = admission_placement(pod, IMAGES, PlacementConfig())
    assert warm is not None
    pod["spec"]["containers"][1]["imagePullPolicy"] = "Always"
    assert admission_placement(pod, IMAGES, PlacementConfig()) is None
    checked = admission_placement(pod, IMAGES, PlacementConfig(), revalidated=True)
    assert checked is not None and checked.patch == warm.patch


def test_decide_without_path_writes_no_path() -> None:
    pod = _pod("reg/amd:1", gated=True)
    pod["metadata"]["resourceVersion"] = "3"
    plain = decide(PlacementInputs(pod, IMAGES, PlacementConfig()))
    marked = decide(PlacementInputs(pod, IMAGES, PlacementConfig(), path="webhook"))
    assert "path" not in json.loads(plain.annotation)
    record = json.loads(marked.annotation)
    assert next(iter(record)) == "path"
    record.pop("path")
    assert record == json.loads(plain.annotation)
    assert plain.patch[:-3] == marked.patch[:-3]


# --- while no controller runs ---------------------------------------------------------------

GIVE_UP = "at admission (no podplacement controller has renewed its Lease for 61 s)"
#: reg/down:1 could not be inspected (registry down, or not within the budget)
WITH_FAILURES: dict[str, Any] = {**IMAGES, "reg/down:1": ConnectionError("registry down")}


@st.composite
def outage_pod_st(draw: st.DrawFn) -> dict[str, Any]:
    """An admission pod, one of its containers maybe of an image that could not be
    inspected."""
    pod = draw(admission_pod_st())
    if draw(st.booleans()):
        pod["spec"]["containers"].append({"name": "down", "image": "reg/down:1"})
    return pod


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(admission=outage_pod_st(), config=config_st)
def test_outage_placement_is_the_controllers_decision_after_its_last_retry(
        admission: dict[str, Any], config: PlacementConfig) -> None:
    placement = outage_placement(admission, WITH_FAILURES, config, give_up=GIVE_UP)
    decision, by_controller = _controller_path(
        admission, config, WITH_FAILURES, failures=config.image_inspection.max_retries)
    assert placement is not None and placement.outcome == decision.outcome
    by_webhook = _json_patch(admission, list(placement.patch))
    webhook_view, controller_view = _view(by_webhook), _view(by_controller)
    if decision.outcome == "fallback":
        # the same fallback; only the sentence says when inspection was given up
        webhook_reason = webhook_view["decision"].pop("reason")
        controller_reason = controller_view["decision"].pop("reason")
        assert webhook_reason == controller_reason.replace(
            f"after {config.image_inspection.max_retries + 1} attempts", GIVE_UP)
        assert placement.warnings[0].startswith(
            "podplacement: image inspection failed at admission")
    else:
        assert placement == admission_placement(admission, WITH_FAILURES, config)
    assert webhook_view == controller_view
    assert _record(by_webhook)["path"] == PATH_WEBHOOK


def test_outage_fallback_requires_the_fallback_architecture_and_os_in_every_term() -> None:
    pod = _pod("reg/down:1", gated=True)
    pod["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [ZONE]},
            {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}]}}}
    placement = outage_placement(pod, WITH_FAILURES,
                                 PlacementConfig(fallback_architecture="arm64"),
                                 give_up=GIVE_UP)
    assert placement is not None and placement.outcome == "fallback"
    placed = _json_patch(pod, list(placement.patch))
    terms = placed["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][1:] for t in terms] == [
        [expression(ARCH_LABEL, "In", ["arm64"]), expression(OS_LABEL, "In", ["linux"])]] * 2
    assert "schedulingGates" not in placed["spec"]
    record = _record(placed)
    assert record["fallback"] == "arm64" and record["reason"] == (
        f"image inspection failed {GIVE_UP} (reg/down:1); fallback: required "
        "kubernetes.io/arch In [arm64] (fallbackArchitecture), kubernetes.io/os In [linux] "
        "(fallbackOperatingSystems)")


@pytest.mark.parametrize("config", [
    PlacementConfig(admission_fast_paths=FAST_PATHS_DISABLED),
    PlacementConfig(topology=TopologyConfig(enabled=True)),
])
def test_outage_placement_places_whatever_fast_paths_and_numa_say(
        config: PlacementConfig) -> None:
    pod = _pod("reg/amd:1", "reg/multi:1")
    pod["spec"]["containers"][1]["imagePullPolicy"] = "Always"  # revalidated by the caller
    placement = outage_placement(pod, IMAGES, config, give_up=GIVE_UP)
    assert placement is not None and placement.outcome == "set"
    assert json.loads(placement.annotation)["archs"] == ["amd64"]
