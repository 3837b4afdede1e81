"""Node-affinity JSON-patch builders obey KEP-3838 (appends only) and AND into every term."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.affinity import (
    AffinityPlan,
    arch_preferences,
    expression,
    hostname_requirement,
    require_architectures,
    require_oses,
    unsatisfiable_marker,
)
from controller.config import ARCH_LABEL, HOSTNAME_LABEL, NO_SUPPORTED_PLATFORM_KEY, OS_LABEL
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
