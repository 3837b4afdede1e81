"""The fallback requirement of a pod released without its images' platforms
(rules.place.fallback), on plain data, and as every release path writes it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podplacement.rules.config import ARCH_LABEL, OS_LABEL, PlacementConfig
from podplacement.rules.place.admission import outage_placement
from podplacement.rules.place.affinity import expression
from podplacement.rules.place.decision import fallback_ungate
from podplacement.rules.place.fallback import fallback_requirement
from podplacement.rules.place.placement import PlacementInputs, placement_facts
from podplacement.rules.place.render import controller_patch
from podplacement.rules.policy import PlacementPolicy, parse_policy
from tests.controller._pods import apply, assert_kep3838, gated_pod, required, terms_of

CLUSTER = PlacementConfig()
FAILED = {"reg/app:1": LookupError("manifest unknown")}
ZONE = expression("topology.kubernetes.io/zone", "In", ["a"])
LINUX = expression(OS_LABEL, "In", ["linux"])


def _arch(*archs: str) -> dict[str, Any]:
    return expression(ARCH_LABEL, "In", list(archs))


def _policy(name: str = "p", **spec: Any) -> PlacementPolicy:
    return parse_policy({"metadata": {"namespace": "ns", "name": name},
                         "spec": {"priority": 1, **spec}})


def _released(pod: dict[str, Any], config: PlacementConfig,
              policy: PlacementPolicy | None = None) -> dict[str, Any]:
    """``pod`` after the controller's fallback (retries used up), KEP-3838 checked."""
    facts = placement_facts(
        PlacementInputs(pod, FAILED, replace(config, image_inspection=replace(
        config.image_inspection, max_retries=0)), policy=policy),
    )
    decision = fallback_ungate(pod, "x", config, policy)  # the uninstall's release
    by_controller = apply(pod, list(controller_patch(pod, facts)))
    assert_kep3838(pod, by_controller)
    assert terms_of(apply(pod, list(decision.patch))) == terms_of(by_controller)
    return by_controller


def test_without_any_fallback_architecture_the_default_os_is_required() -> None:
    fb = fallback_requirement(gated_pod(), CLUSTER)
    assert fb.expressions == (LINUX,)
    assert (fb.architectures, fb.oses, fb.fallback_architecture) == ((), ("linux",), None)
    assert fb.text == ("fallback: required kubernetes.io/os In [linux] "
                       "(fallbackOperatingSystems); any kubernetes.io/arch "
                       "(no fallbackArchitecture)")
    assert terms_of(_released(gated_pod(), CLUSTER)) == [{"matchExpressions": [LINUX]}]


def test_the_cluster_fallback_architecture_is_anded_with_the_os() -> None:
    config = PlacementConfig(fallback_architecture="arm64")
    fb = fallback_requirement(gated_pod(), config)
    assert fb.expressions == (_arch("arm64"), LINUX) and fb.fallback_architecture == "arm64"
    assert fb.text == ("fallback: required kubernetes.io/arch In [arm64] "
                       "(fallbackArchitecture), kubernetes.io/os In [linux] "
                       "(fallbackOperatingSystems)")
    assert terms_of(_released(gated_pod(), config)) == [
        {"matchExpressions": [_arch("arm64"), LINUX]}]


def test_the_policy_fallback_architecture_replaces_the_clusters() -> None:
    config = PlacementConfig(fallback_architecture="amd64")
    policy = _policy("arm", fallbackArchitecture="arm64")
    fb = fallback_requirement(gated_pod(), config, policy)
    assert fb.expressions == (_arch("arm64"), LINUX)
    assert "(fallbackArchitecture of placement policy arm)" in fb.text
    # placement_facts passes the policy's view of the config: the same requirement
    assert fallback_requirement(gated_pod(), policy.applied_to(config), policy) == fb
    assert terms_of(_released(gated_pod(), config, policy)) == [
        {"matchExpressions": [_arch("arm64"), LINUX]}]


def test_allowed_architectures_hold_when_no_fallback_lies_inside_them() -> None:
    config = PlacementConfig(fallback_architecture="amd64")
    policy = _policy("limit", allowedArchitectures=["s390x", "arm64"])
    fb = fallback_requirement(gated_pod(), config, policy)
    assert fb.expressions == (_arch("arm64", "s390x"), LINUX)
    assert fb.fallback_architecture is None
    assert "(allowedArchitectures of placement policy limit)" in fb.text


def test_the_configured_operating_systems_are_required() -> None:
    config = PlacementConfig(fallback_operating_systems=("windows", "linux"))
    fb = fallback_requirement(gated_pod(), config)
    assert fb.expressions == (expression(OS_LABEL, "In", ["linux", "windows"]),)
    assert "kubernetes.io/os In [linux, windows]" in fb.text


def test_a_node_selector_os_pin_is_the_users_and_gets_nothing() -> None:
    config = PlacementConfig(fallback_architecture="amd64")
    pod = gated_pod(node_selector={OS_LABEL: "windows"})
    fb = fallback_requirement(pod, config)
    assert fb.expressions == (_arch("amd64"),) and fb.oses == ()
    assert fb.text.endswith("; kubernetes.io/os as the pod pins it")
    assert terms_of(_released(pod, config)) == [{"matchExpressions": [_arch("amd64")]}]


def test_a_node_selector_arch_pin_is_the_users_and_gets_nothing() -> None:
    config = PlacementConfig(fallback_architecture="amd64")
    pod = gated_pod(node_selector={ARCH_LABEL: "arm64"})
    fb = fallback_requirement(pod, config)
    assert fb.expressions == (LINUX,) and fb.architectures == ()
    assert fb.fallback_architecture is None
    assert terms_of(_released(pod, config)) == [{"matchExpressions": [LINUX]}]


def test_existing_terms_get_the_requirement_anded_never_a_new_term() -> None:
    """Two ORed terms: each gets the expressions whose key it does not pin with In; the
    user's own os pin (In [windows]) is kept as written; no third term appears."""
    config = PlacementConfig(fallback_architecture="amd64")
    windows = expression(OS_LABEL, "In", ["windows"])
    not_arm = expression(ARCH_LABEL, "NotIn", ["arm64"])  # NotIn restricts to no set
    pod = gated_pod(affinity=required([ZONE], [windows, not_arm]))
    assert terms_of(_released(pod, config)) == [
        {"matchExpressions": [ZONE, _arch("amd64"), LINUX]},
        {"matchExpressions": [windows, not_arm, _arch("amd64")]},
    ]
    # a pin in every term is the user's decision: nothing to write for that key
    pinned = gated_pod(affinity=required([windows], [expression(OS_LABEL, "In", ["linux"])]))
    fb = fallback_requirement(pinned, config)
    assert fb.expressions == (_arch("amd64"),) and fb.oses == ()


def test_the_webhooks_outage_release_writes_the_same_requirement() -> None:
    config = PlacementConfig(fallback_architecture="arm64")
    pod = gated_pod(affinity=required([ZONE]))
    placement = outage_placement(pod, FAILED, config, give_up="at admission")
    assert placement is not None and placement.outcome == "fallback"
    assert terms_of(apply(pod, list(placement.patch))) == terms_of(_released(pod, config))


@settings(max_examples=200, deadline=None)
@given(oses=st.sampled_from([("linux",), ("linux", "windows")]),
       arch=st.sampled_from([None, "amd64"]),
       policy=st.sampled_from([None, {"fallbackArchitecture": "arm64"},
                               {"allowedArchitectures": ["s390x"]}]),
       terms=st.lists(st.sampled_from([
           [ZONE], [expression(OS_LABEL, "NotIn", ["windows"])],
           [expression(OS_LABEL, "Exists")], [expression(ARCH_LABEL, "In", ["amd64"])]]),
           max_size=3))
def test_a_released_pod_never_admits_an_os_outside_the_fallback(
        oses: tuple[str, ...], arch: str | None, policy: dict[str, Any] | None,
        terms: list[list[dict[str, Any]]]) -> None:
    """Whatever the fallbacks and the user's terms (none pinning the OS with In), every
    required term of the released pod restricts kubernetes.io/os to the fallback OSes, and
    the terms stay as many as the user's (one for a pod without)."""
    config = PlacementConfig(fallback_architecture=arch, fallback_operating_systems=oses)
    pod = gated_pod(affinity=required(*terms) if terms else None)
    released = terms_of(_released(pod, config, _policy(**policy) if policy else None))
    assert len(released) == max(1, len(terms))
    for term in released:
        assert expression(OS_LABEL, "In", list(oses)) in term["matchExpressions"]
