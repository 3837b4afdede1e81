"""Node-affinity JSON-patch builders obey KEP-3838 (appends only) and AND into every term."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podplacement.rules.config import (
    ARCH_LABEL,
    HOSTNAME_LABEL,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
)
from podplacement.rules.place.affinity import (
    AffinityPlan,
    PlatformRequirement,
    arch_preferences,
    expression,
    hostname_requirement,
    platform_requirement,
    require_architectures,
    require_oses,
    unsatisfiable_marker,
)
from tests.controller._pods import apply, assert_kep3838, gated_pod, required, terms_of

ZONE = expression("topology.kubernetes.io/zone", "In", ["zone-a", "zone-b"])
WORKER = expression("node-role.kubernetes.io/worker", "Exists")
ARCH2 = expression(ARCH_LABEL, "In", ["amd64", "arm64"])


def test_arch_requirement_is_anded_into_every_term() -> None:
    pod = gated_pod(affinity=required([ZONE], [WORKER]))
    ops = require_architectures(pod, ["arm64", "amd64"])
    # exactly the recorded "one write" ops: append with /- to each term
    assert ops == [
        {
            "op": "add",
            "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
            "/nodeSelectorTerms/0/matchExpressions/-",
            "value": ARCH2,
        },
        {
            "op": "add",
            "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
            "/nodeSelectorTerms/1/matchExpressions/-",
            "value": ARCH2,
        },
    ]
    new = apply(pod, ops)
    assert_kep3838(pod, new)
    assert terms_of(new) == [
        {"matchExpressions": [ZONE, ARCH2]},
        {"matchExpressions": [WORKER, ARCH2]},
    ]


def test_term_with_an_arch_expression_is_untouched() -> None:
    own = expression(ARCH_LABEL, "In", ["s390x"])
    pod = gated_pod(affinity=required([ZONE, own], [WORKER]))
    new = apply(pod, require_architectures(pod, ["amd64"]))
    assert terms_of(new)[0] == {"matchExpressions": [ZONE, own]}
    assert terms_of(new)[1]["matchExpressions"][-1] == expression(ARCH_LABEL, "In", ["amd64"])


def test_no_affinity_creates_one_term_in_a_new_affinity() -> None:
    pod = gated_pod()
    ops = require_architectures(pod, ["amd64", "arm64"])
    assert [o["path"] for o in ops] == ["/spec/affinity"]
    assert terms_of(apply(pod, ops)) == [{"matchExpressions": [ARCH2]}]


def test_affinity_without_node_affinity_adds_node_affinity_only() -> None:
    pod_affinity: dict[str, Any] = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
    }
    pod = gated_pod(affinity=pod_affinity)
    ops = require_architectures(pod, ["amd64"])
    assert [o["path"] for o in ops] == ["/spec/affinity/nodeAffinity"]
    new = apply(pod, ops)
    assert new["spec"]["affinity"]["podAntiAffinity"] == pod_affinity["podAntiAffinity"]


def test_only_preferred_present_adds_required_object() -> None:
    pref = [{"weight": 5, "preference": {"matchExpressions": [ZONE]}}]
    pod = gated_pod(
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": pref}}
    )
    ops = require_architectures(pod, ["amd64"])
    assert [o["path"] for o in ops] == [
        "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    ]
    new = apply(pod, ops)
    assert (
        new["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == pref
    )


def test_term_with_only_match_fields_gets_match_expressions_created() -> None:
    fields = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    aff = required([ZONE])
    aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ].append(fields)
    pod = gated_pod(affinity=aff)
    ops = require_architectures(pod, ["amd64"])
    assert ops[1]["path"].endswith("/nodeSelectorTerms/1/matchExpressions")
    new = apply(pod, ops)
    assert_kep3838(pod, new)
    assert terms_of(new)[1] == {
        **fields,
        "matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"])],
    }


def test_several_requirements_combine_into_a_new_term() -> None:
    pod = gated_pod()
    plan = AffinityPlan(pod)
    plan.require(expression(ARCH_LABEL, "In", ["amd64"]))
    plan.require(expression(OS_LABEL, "In", ["linux", "windows"]))
    plan.require(hostname_requirement(["h1", "h2"]), unless_key="")
    plan.prefer(250, [expression(HOSTNAME_LABEL, "In", ["h1"])])
    new = apply(pod, plan.ops())
    assert [e["key"] for e in terms_of(new)[0]["matchExpressions"]] == [
        ARCH_LABEL,
        OS_LABEL,
        HOSTNAME_LABEL,
    ]
    pref = new["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert pref == [
        {
            "weight": 100,
            "preference": {"matchExpressions": [expression(HOSTNAME_LABEL, "In", ["h1"])]},
        }
    ]
    assert plan.result_terms() == terms_of(new)


def test_preferred_terms_append_after_the_users() -> None:
    mine = {"weight": 7, "preference": {"matchExpressions": [ZONE]}}
    pod = gated_pod(
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [mine]}}
    )
    plan = AffinityPlan(pod)
    for term in arch_preferences(pod, ["amd64", "arm64"], {"arm64": 60, "ppc64le": 3}):
        plan.prefer(term["weight"], term["preference"]["matchExpressions"])
    new = apply(pod, plan.ops())
    pref = new["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert pref[0] == mine
    assert pref[1:] == [
        {
            "weight": 60,
            "preference": {"matchExpressions": [expression(ARCH_LABEL, "In", ["arm64"])]},
        }
    ]


def test_user_arch_preference_suppresses_ours() -> None:
    mine = {
        "weight": 7,
        "preference": {"matchExpressions": [expression(ARCH_LABEL, "In", ["s390x"])]},
    }
    pod = gated_pod(
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [mine]}}
    )
    assert arch_preferences(pod, ["amd64", "s390x"], {"amd64": 10, "s390x": 10}) == []


def test_marker_and_os_requirements() -> None:
    pod = gated_pod(affinity=required([ZONE]))
    plan = AffinityPlan(pod)
    assert plan.require(unsatisfiable_marker(), unless_key="") == 1
    assert plan.require(unsatisfiable_marker(), unless_key="") == 0  # never twice
    new = apply(pod, plan.ops())
    assert terms_of(new)[0]["matchExpressions"][-1] == {
        "key": NO_SUPPORTED_PLATFORM_KEY,
        "operator": "Exists",
    }
    os_ops = require_oses(pod, ["windows", "linux"])
    assert os_ops[0]["value"] == expression(OS_LABEL, "In", ["linux", "windows"])


def test_every_term_already_constrained_means_no_ops() -> None:
    pod = gated_pod(affinity=required([ARCH2], [WORKER, ARCH2]))
    assert require_architectures(pod, ["amd64"]) == []
    assert AffinityPlan(pod).ops() == []


_key = st.sampled_from(["a", "b", ARCH_LABEL, "c"])
_expr = st.builds(lambda k, v: expression(k, "In", [v]), _key, st.sampled_from(["x", "y"]))
_term = st.lists(_expr, min_size=0, max_size=3).map(lambda es: {"matchExpressions": es})


@given(
    st.lists(_term, min_size=0, max_size=4),
    st.lists(st.sampled_from(["amd64", "arm64", "s390x"]), min_size=1, max_size=3),
)
def test_property_only_appends_and_every_term_gets_an_arch(
    terms: list[dict[str, Any]], archs: list[str]
) -> None:
    aff = None
    if terms:
        aff = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    pod = gated_pod(affinity=aff)
    new = apply(pod, require_architectures(pod, archs))
    assert_kep3838(pod, new)
    for term in terms_of(new):
        assert any(e["key"] == ARCH_LABEL for e in term["matchExpressions"])
    assert all(op["op"] == "add" for op in require_architectures(pod, archs))


@pytest.mark.parametrize("weight,expected", [(0, 1), (55, 55), (101, 100)])
def test_preferred_weight_is_clamped_to_the_api_range(weight: int, expected: int) -> None:
    plan = AffinityPlan(gated_pod())
    plan.prefer(weight, [ZONE])
    ops = plan.ops()
    assert (
        ops[0]["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
            "weight"
        ]
        == expected
    )


# --- the platform requirement: exact (os, arch) pairs -------------------------------------

WIN_AMD_LINUX_ARM = [("windows", "amd64"), ("linux", "arm64")]


def _arch(*archs: str) -> dict[str, Any]:
    return expression(ARCH_LABEL, "In", list(archs))


def _os(*oses: str) -> dict[str, Any]:
    return expression(OS_LABEL, "In", list(oses))


def _planned(pod: dict[str, Any], pairs: list[tuple[str, str]]
             ) -> tuple[PlatformRequirement, dict[str, Any]]:
    plan = AffinityPlan(pod)
    requirement = plan.require_platforms(pairs)
    new = apply(pod, plan.ops())
    assert_kep3838(pod, new)
    assert plan.result_terms() == terms_of(new)
    return requirement, new


def test_two_oses_without_terms_get_one_exact_term_each() -> None:
    # The real-server case: arch In [amd64, arm64] AND os In [linux, windows] admitted
    # linux/amd64, which the image index does not have.
    pod = gated_pod()
    requirement, new = _planned(pod, WIN_AMD_LINUX_ARM)
    assert terms_of(new) == [
        {"matchExpressions": [_arch("arm64"), _os("linux")]},
        {"matchExpressions": [_arch("amd64"), _os("windows")]},
    ]
    assert requirement.pairs == (("linux", "arm64"), ("windows", "amd64"))
    assert requirement.excluded == () and requirement.appended == 4
    assert [t.index for t in requirement.terms] == [None, None]


def test_three_oses_get_three_terms_in_os_order() -> None:
    pairs = [("linux", "amd64"), ("linux", "arm64"), ("windows", "amd64"),
             ("freebsd", "riscv64")]
    _, new = _planned(gated_pod(), pairs)
    assert terms_of(new) == [
        {"matchExpressions": [_arch("riscv64"), _os("freebsd")]},
        {"matchExpressions": [_arch("amd64", "arm64"), _os("linux")]},
        {"matchExpressions": [_arch("amd64"), _os("windows")]},
    ]


def test_oses_with_the_same_architectures_share_one_exact_term() -> None:
    pairs = [("linux", "amd64"), ("windows", "amd64"), ("linux", "arm64"), ("windows", "arm64")]
    _, new = _planned(gated_pod(), pairs)
    assert terms_of(new) == [{"matchExpressions": [_arch("amd64", "arm64"),
                                                   _os("linux", "windows")]}]


def test_linux_only_stays_the_one_term_arch_then_os() -> None:
    pod = gated_pod()
    plan = AffinityPlan(pod)
    plan.require_platforms([("linux", "arm64"), ("linux", "amd64")])
    assert plan.ops() == [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [_arch("amd64", "arm64"), _os("linux")]}]}}}}]


def test_one_existing_term_keeps_the_linux_pairs_and_reports_the_rest() -> None:
    pod = gated_pod(affinity=required([ZONE]))
    requirement, new = _planned(pod, WIN_AMD_LINUX_ARM)
    assert terms_of(new) == [{"matchExpressions": [ZONE, _arch("arm64"), _os("linux")]}]
    (term,) = requirement.terms
    assert term.index == 0 and term.pairs == (("linux", "arm64"),)
    assert term.left_out == (("windows", "amd64"),)
    assert requirement.excluded == (("windows", "amd64"),)


def test_several_terms_each_keep_one_os_and_an_os_pin_keeps_its_own() -> None:
    pod = gated_pod(affinity=required([ZONE], [WORKER], [_os("windows")]))
    requirement, new = _planned(pod, WIN_AMD_LINUX_ARM)
    assert terms_of(new) == [
        {"matchExpressions": [ZONE, _arch("arm64"), _os("linux")]},
        {"matchExpressions": [WORKER, _arch("arm64"), _os("linux")]},
        {"matchExpressions": [_os("windows"), _arch("amd64")]},  # the user's pin, kept
    ]
    assert [t.left_out for t in requirement.terms] == [
        (("windows", "amd64"),), (("windows", "amd64"),), ()]
    # windows/amd64 is still admitted through the third term: not excluded overall
    assert requirement.excluded == ()
    assert requirement.pairs == (("linux", "arm64"), ("windows", "amd64"))


def test_an_os_pin_on_several_oses_is_narrowed_to_one() -> None:
    pod = gated_pod(affinity=required([_os("linux", "windows")]))
    requirement, new = _planned(pod, WIN_AMD_LINUX_ARM)
    assert terms_of(new) == [{"matchExpressions": [
        _os("linux", "windows"), _arch("arm64"), _os("linux")]}]
    assert requirement.terms[0].left_out == (("windows", "amd64"),)


def test_a_term_excluding_linux_keeps_the_other_os() -> None:
    pod = gated_pod(affinity=required([expression(OS_LABEL, "NotIn", ["linux"])]))
    requirement, new = _planned(pod, WIN_AMD_LINUX_ARM)
    assert terms_of(new)[0]["matchExpressions"][1:] == [_arch("amd64"), _os("windows")]
    assert requirement.terms[0].left_out == ()


def test_without_linux_a_term_keeps_the_os_that_sorts_first() -> None:
    pod = gated_pod(affinity=required([ZONE]))
    requirement, new = _planned(pod, [("windows", "amd64"), ("freebsd", "arm64")])
    assert terms_of(new)[0]["matchExpressions"][1:] == [_arch("arm64"), _os("freebsd")]
    assert requirement.excluded == (("windows", "amd64"),)


def test_an_exact_group_of_several_oses_is_kept_whole_in_a_term() -> None:
    # arch In [amd64] leaves linux/amd64 and windows/amd64: one exact group, nothing left out
    pairs = [("linux", "amd64"), ("linux", "arm64"), ("windows", "amd64")]
    pod = gated_pod(affinity=required([_arch("amd64")]))
    requirement, new = _planned(pod, pairs)
    assert terms_of(new) == [{"matchExpressions": [_arch("amd64"), _os("linux", "windows")]}]
    assert requirement.terms[0].left_out == ()


def test_an_arch_pin_spanning_two_oses_is_narrowed_and_keeps_its_unsupported_values() -> None:
    pairs = [("linux", "amd64"), ("windows", "arm64")]
    pod = gated_pod(affinity=required([_arch("amd64", "arm64", "s390x")]))
    requirement, new = _planned(pod, pairs)
    # s390x is no image's: the user's explicit choice (emulation) stays
    assert terms_of(new)[0]["matchExpressions"][1:] == [_arch("amd64", "s390x"), _os("linux")]
    assert requirement.outside_architectures == ("s390x",)
    assert requirement.terms[0].left_out == (("windows", "arm64"),)


def test_pins_naming_no_supported_pair_are_kept_and_reported() -> None:
    pairs = [("linux", "amd64"), ("windows", "arm64")]
    pod = gated_pod(affinity=required([_arch("arm64"), _os("linux")]))
    requirement, new = _planned(pod, pairs)
    assert terms_of(new) == terms_of(pod)
    assert not requirement.compatible
    assert requirement.outside_pairs == (("linux", "arm64"),)


def test_node_selector_arch_pin_over_two_oses_needs_only_the_os() -> None:
    pairs = [("linux", "amd64"), ("linux", "arm64"), ("windows", "amd64")]
    pod = gated_pod(node_selector={ARCH_LABEL: "amd64"})
    requirement, new = _planned(pod, pairs)
    assert terms_of(new) == [{"matchExpressions": [_os("linux", "windows")]}]
    assert requirement.selected == (("linux", "amd64"), ("windows", "amd64"))


def test_later_requirements_go_into_every_new_term() -> None:
    pod = gated_pod()
    plan = AffinityPlan(pod)
    plan.require_platforms(WIN_AMD_LINUX_ARM)
    assert plan.require(hostname_requirement(["h1"]), unless_key="") == 2
    new = apply(pod, plan.ops())
    assert [t["matchExpressions"][-1] for t in terms_of(new)] == [
        hostname_requirement(["h1"])] * 2


def test_no_supported_pairs_give_no_terms() -> None:
    requirement = platform_requirement(gated_pod(), [])
    assert requirement.terms == () and requirement.pairs == ()
