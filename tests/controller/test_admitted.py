"""Pods placed at admission (rules.monitor.admitted): which images the controller learns
from them for the catalog, and the Warning Event of their decision, which must be the one
the controller sends for the same pod on its own path (same reason, same text), recomputed
from the pod as stored and the platforms the decision was taken with."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings

from podplacement.rules.admit.admissionpolicy import admission_record
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    OS_LABEL,
    ExcludedPlatform,
    ImageInspectionConfig,
    ObjectRef,
    PlacementConfig,
    PlatformWeight,
)
from podplacement.rules.monitor.admitted import (
    MAX_CANDIDATES,
    admission_events,
    admission_path,
    admission_warning,
    before_placement,
    consistent_cuts,
    decision_record,
    images_to_learn,
    recently_created,
)
from podplacement.rules.place.admission import admission_placement
from podplacement.rules.place.affinity import expression
from podplacement.rules.place.decision import (
    INCOMPATIBLE_NODE_SELECTOR,
    NO_SUPPORTED_PLATFORM_EVENT,
    PARTIALLY_COMPATIBLE_AFFINITY,
    PLATFORM_NOT_IN_CLUSTER,
    PLATFORMS_LEFT_OUT,
    WARNING,
    EventSpec,
)
from podplacement.rules.place.placement import PlacementInputs, compact_json, placement_facts
from podplacement.rules.place.plan import plan
from podplacement.rules.place.render import admission_patch
from podplacement.rules.platforms import node_inventory
from tests.controller._pods import img
from tests.controller.test_admission import (
    IMAGES,
    _controller_path,
    _json_patch,
    admission_pod_st,
    config_st,
)

NO_CATALOG: dict[str, str] = {}


def _pod(*images: str, node_selector: dict[str, str] | None = None,
         affinity: dict[str, Any] | None = None, secrets: tuple[str, ...] = ()
         ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": im}
                                           for i, im in enumerate(images)]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity:
        spec["affinity"] = affinity
    if secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in secrets]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": spec}


def _by_webhook(admission: dict[str, Any], config: PlacementConfig,
                images: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The pod as stored after the webhook placed ``admission`` (None: it would not)."""
    placement = admission_placement(admission, IMAGES if images is None else images, config)
    return None if placement is None else _json_patch(admission, list(placement.patch))


def _by_policy(admission: dict[str, Any], catalog: dict[str, str],
               config: PlacementConfig) -> dict[str, Any]:
    """The pod as stored after the policy placed ``admission`` from ``catalog``: the
    controller's facts rendered with the policy's record (the CEL writes both exactly:
    tests/controller/test_admissionpolicy_place_realcluster.py)."""
    results = {i: img(i, *v.split(",")) for i, v in catalog.items()}
    facts = placement_facts(PlacementInputs(admission, results, config))
    placed = _json_patch(admission, list(admission_patch(admission, facts)))
    placed["metadata"]["annotations"][DECISION_ANNOTATION] = compact_json(
        admission_record(facts))
    return placed


def _warning(pod: dict[str, Any], config: PlacementConfig, catalog: dict[str, str] = NO_CATALOG,
             **kw: Any) -> EventSpec | None:
    return admission_warning(pod, decision_record(pod), config, catalog=catalog.get, **kw)


# --- the Warning: the controller's own, recomputed ------------------------------------------


ZONE_A = expression("topology.kubernetes.io/zone", "In", ["a"])
#: Found by Hypothesis (fails on main): three terms, each ending in expressions on the keys
#: a placement appends, give 84 candidates before placement, past MAX_CANDIDATES before the
#: true one; the recomputation told nothing where the controller warns.
WINDOWS_PIN_TERMS = _pod("reg/all:1", node_selector={OS_LABEL: "windows"}, affinity={
    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [ZONE_A, expression(ARCH_LABEL, "In", ["amd64"]),
                              expression(ARCH_LABEL, "In", ["arm64", "s390x"])]},
        {"matchExpressions": [expression(ARCH_LABEL, "NotIn", ["s390x"])]},
        {"matchExpressions": [expression(ARCH_LABEL, "NotIn", ["s390x"])]}]}}})
#: Its sibling (same cause): a windows term among linux-only images, PartiallyCompatible.
WINDOWS_TERM = _pod("reg/all:1", affinity={
    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                              expression(OS_LABEL, "In", ["windows"])]},
        {"matchExpressions": [ZONE_A, expression(ARCH_LABEL, "In", ["amd64"])]},
        {"matchExpressions": [ZONE_A]}]}}})
PREFERRING = PlacementConfig(preferred_platforms=(PlatformWeight("amd64", 30),
                                                  PlatformWeight("arm64", 60)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(admission=admission_pod_st(), config=config_st)
@example(admission=WINDOWS_PIN_TERMS, config=PREFERRING)
@example(admission=WINDOWS_TERM, config=PREFERRING)
def test_the_warning_of_a_webhook_placement_is_the_controllers(
        admission: dict[str, Any], config: PlacementConfig) -> None:
    placed = _by_webhook(admission, config)
    if placed is None:
        return
    decision, _ = _controller_path(admission, config)
    expected = next((e for e in decision.events if e.type == WARNING), None)
    assert _warning(placed, config) == expected


@pytest.mark.parametrize(("admission", "reason"), [
    (WINDOWS_PIN_TERMS, INCOMPATIBLE_NODE_SELECTOR),
    (WINDOWS_TERM, PARTIALLY_COMPATIBLE_AFFINITY),
])
def test_the_warning_is_found_behind_many_terms(admission: dict[str, Any], reason: str) -> None:
    """Each term's cut is judged by what the placement appends to it (consistent_cuts):
    the pod before placement is found however many terms end in appendable keys."""
    placed = _by_webhook(admission, PREFERRING)
    assert placed is not None
    decision, _ = _controller_path(admission, PREFERRING)
    event = _warning(placed, PREFERRING)
    assert event is not None and event.reason == reason
    assert decision.events == (event,)


def test_consistent_cuts_are_what_the_placement_appended() -> None:
    placed = _by_webhook(WINDOWS_PIN_TERMS, PREFERRING)
    assert placed is not None
    results = {i: IMAGES[i] for i in ("reg/all:1",)}

    def appends(candidate: dict[str, Any]) -> Any:
        p = placement_facts(PlacementInputs(candidate, results, PREFERRING, path="webhook"))
        return [t.expressions for t in p.required], p.preferred

    # the first term restricted the architecture with In: nothing was appended to it; the
    # others got one `arch In` (or their creator wrote it: then nothing is appended
    # either); both preferences were appended (or written): the likeliest first, and never
    # a cut that removes what the placement would not have written (2 for the NotIn terms)
    assert consistent_cuts(placed, appends) == ([[0], [1, 0], [1, 0]], [2, 0])


def test_incompatible_node_selector_on_the_webhook_path() -> None:
    """An arm64 pin with an amd64-only image: the webhook writes an os term, which the
    recomputation must take off again (on the stored pod alone the decision differs)."""
    config = PlacementConfig()
    admission = _pod("reg/amd:1", node_selector={ARCH_LABEL: "arm64"})
    placed = _by_webhook(admission, config)
    assert placed is not None and placed["spec"]["affinity"]
    event = _warning(placed, config)
    assert event is not None and event.reason == INCOMPATIBLE_NODE_SELECTOR
    assert event.message == ("nodeSelector kubernetes.io/arch=arm64 is not among the "
                             "architectures supported by every image (amd64); the pod cannot "
                             "run there")


def test_platforms_left_out_needs_the_pod_as_it_was_created() -> None:
    """A term the placement narrowed to one OS group no longer admits the others: only the
    pod before placement says what was left out."""
    config = PlacementConfig()
    admission = _pod("reg/winlin:1", affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [expression("topology.kubernetes.io/zone", "In", ["a"])]}]}}})
    placed = _by_webhook(admission, config)
    assert placed is not None
    event = _warning(placed, config)
    assert event is not None and event.reason == PLATFORMS_LEFT_OUT
    assert "windows/amd64 from nodeSelectorTerms 0" in event.message
    decision, _ = _controller_path(admission, config)
    assert decision.events == (event,)


def test_no_warning_for_a_plain_placement() -> None:
    config = PlacementConfig()
    placed = _by_webhook(_pod("reg/multi:1"), config)
    assert placed is not None and _warning(placed, config) is None


def test_platform_not_in_cluster_as_the_controller_tells_it() -> None:
    """No node of the pod's only platform: the controller tells a pod placed by the webhook
    (which saw no node) the Normal ``PlatformNotInCluster`` of its own decision, same
    text; there is no Warning to tell."""
    config = PlacementConfig()
    admission = _pod("reg/s390:1")
    placed = _by_webhook(admission, config)
    assert placed is not None
    assert "noNodeYet" not in decision_record(placed)  # type: ignore[operator]
    nodes = [{"metadata": {"name": "n", "labels": {ARCH_LABEL: "amd64"}}}]
    told = admission_events(placed, decision_record(placed), config,
                            catalog=NO_CATALOG.get, nodes=node_inventory(nodes))
    gated = {**copy.deepcopy(admission), "metadata": {
        **admission["metadata"], "resourceVersion": "1"}}
    gated["spec"]["schedulingGates"] = [{"name": "podplacement.io/scheduling-gate"}]
    decision = plan(PlacementInputs(gated, IMAGES, config), nodes=nodes, nrts={}, now=0.0)
    assert [e.reason for e in told] == [PLATFORM_NOT_IN_CLUSTER]
    assert told[0] in decision.events
    assert _warning(placed, config, nodes=node_inventory(nodes)) is None
    assert admission_events(placed, decision_record(placed), config,
                            catalog=NO_CATALOG.get) == ()  # nodes unknown: nothing to say


def test_an_excluded_platform_is_excluded_again_in_the_recomputation() -> None:
    amd_arm = IMAGES["reg/multi:1"]
    excluded = ExcludedPlatform(digests=(amd_arm.digest,), os="linux", architecture="amd64",
                                proof="exec-format-errors", errors=3, last_seen=100.0,
                                expires=10_000.0, image="reg/multi:1", reason="x")
    config = PlacementConfig(excluded=(excluded,))
    admission = _pod("reg/multi:1", "reg/amd:1")
    placed = _by_webhook(admission, config)
    assert placed is not None and '"excluded"' in placed["metadata"]["annotations"][
        DECISION_ANNOTATION]
    event = _warning(placed, config)
    assert event is not None and event.reason == NO_SUPPORTED_PLATFORM_EVENT
    assert "(excluded linux/amd64)" in event.message
    # with the exclusion gone since, the decision is not reproduced: nothing is said
    assert _warning(placed, PlacementConfig()) is None


def test_a_policy_placement_without_a_common_platform_warns_from_the_catalog() -> None:
    config = PlacementConfig()
    catalog = {"reg/amd:1": "linux/amd64", "reg/arm:1": "linux/arm64"}
    admission = _pod("reg/amd:1", "reg/arm:1")
    placed = _by_policy(admission, catalog, config)
    assert admission_path(decision_record(placed)) == "admission"
    event = _warning(placed, config, catalog)
    assert event == EventSpec(WARNING, NO_SUPPORTED_PLATFORM_EVENT, (
        "no platform is supported by every image of the pod: reg/amd:1: linux/amd64; "
        "reg/arm:1: linux/arm64"))
    # an image gone from the catalog since: the decision cannot be recomputed
    assert _warning(placed, config, {"reg/amd:1": "linux/amd64"}) is None
    plain = _by_policy(_pod("reg/amd:1"), catalog, config)
    assert _warning(plain, config, catalog) is None


@pytest.mark.parametrize("forge", [
    lambda r: r["images"][0].update(platforms=["linux/arm64"]),  # not what the pod says
    lambda r: r["images"][0].update(platforms=["linux/<b>evil</b>"]),
    lambda r: r["images"][0].update(platforms="linux/amd64"),
    lambda r: r.update(path="controller"),
    lambda r: r["images"].pop(),
])
def test_an_annotation_that_is_not_the_decision_tells_nothing(forge: Any) -> None:
    config = PlacementConfig()
    placed = _by_webhook(_pod("reg/amd:1", node_selector={ARCH_LABEL: "arm64"}), config)
    assert placed is not None and _warning(placed, config) is not None
    record = decision_record(placed)
    assert record is not None
    forge(record)
    placed["metadata"]["annotations"][DECISION_ANNOTATION] = json.dumps(record)
    assert _warning(placed, config) is None


def test_an_unreadable_annotation_tells_nothing() -> None:
    pod = _pod("reg/amd:1")
    pod["metadata"]["annotations"] = {DECISION_ANNOTATION: "{not json"}
    assert decision_record(pod) is None and _warning(pod, PlacementConfig()) is None


def test_the_candidates_before_placement_are_bounded() -> None:
    terms = [{"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                                   expression("kubernetes.io/os", "In", ["linux"])]}
             for _ in range(8)]
    pod = _pod("reg/amd:1", affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
    candidates = list(before_placement(pod, "webhook"))
    assert len(candidates) == MAX_CANDIDATES
    assert "affinity" not in candidates[0]["spec"]  # the likeliest: no affinity of its own
    assert len(list(before_placement(pod, "admission"))) == 1


# --- the images the controller learns ----------------------------------------------------------


def test_images_of_an_anonymous_pod_placed_at_admission_are_learned_when_unknown() -> None:
    config = PlacementConfig()
    placed = _by_webhook(_pod("reg/amd:1", "reg/multi:1", "reg/amd:1"), config)
    assert placed is not None
    record = decision_record(placed)
    assert images_to_learn(placed, record, config, lambda i: False) == (
        "reg/amd:1", "reg/multi:1")
    assert images_to_learn(placed, record, config, lambda i: i == "reg/amd:1") == (
        "reg/multi:1",)


def test_images_needing_a_pull_secret_are_never_learned() -> None:
    config = PlacementConfig()
    placed = _by_webhook(_pod("reg/amd:1", secrets=("pull",)), config)
    assert placed is not None
    assert images_to_learn(placed, decision_record(placed), config, lambda i: False) == ()
    anonymous = _by_webhook(_pod("reg/amd:1"), config)
    assert anonymous is not None
    assert images_to_learn(anonymous, decision_record(anonymous), config,
                           lambda i: False) == ("reg/amd:1",)
    with_global = PlacementConfig(image_inspection=ImageInspectionConfig(
        global_pull_secret=ObjectRef("ops", "pull")))
    assert images_to_learn(anonymous, decision_record(anonymous), with_global,
                           lambda i: False) == ()


def test_pods_the_controller_placed_teach_nothing_here() -> None:
    config = PlacementConfig()
    _, by_controller = _controller_path(_pod("reg/amd:1"), config)
    record = decision_record(by_controller)
    assert record is not None and admission_path(record) is None
    assert images_to_learn(by_controller, record, config, lambda i: False) == ()
    assert _warning(by_controller, config) is None


@pytest.mark.parametrize(("created", "recent"), [
    ("2026-01-01T00:00:00Z", True),
    ("2025-12-31T23:59:01Z", True),
    ("2025-12-31T23:58:59Z", False),
    ("2026-01-01T00:05:00Z", True),  # the API server's clock ahead
    ("", False),
    ("yesterday", False),
])
def test_recently_created(created: str, recent: bool) -> None:
    pod = {"metadata": {"creationTimestamp": created}}
    assert recently_created(pod, 1_767_225_600.0, 60.0) is recent
