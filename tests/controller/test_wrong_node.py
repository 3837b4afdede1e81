"""Never a pod on a node its images can't run (docs/how-it-decides.md, item 4): the
decision's affinity, checked by evaluating it against node labels the way kube-scheduler's
NodeAffinity filter does. A node is admissible only when its (os, arch) *pair* is one every
image supports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podplacement.rules.config import (
    ARCH_LABEL,
    HOSTNAME_LABEL,
    OS_LABEL,
    PlacementConfig,
)
from podplacement.rules.place import decision as d
from podplacement.rules.place.affinity import expression
from podplacement.rules.place.placement import PlacementInputs
from tests.controller._pods import apply, assert_kep3838, gated_pod, img, required, terms_of

CFG = PlacementConfig()
ARCHS = ("amd64", "arm64", "ppc64le", "s390x")
OSES = ("linux", "windows", "freebsd")


def _expr_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement against node labels (k8s.io/component-helpers
    nodeaffinity semantics; Gt/Lt are not generated here)."""
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not generated")


def admits(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """True when ``pod``'s nodeSelector and required node affinity admit ``node``
    (terms ORed, expressions ANDed; a term with no expressions and no fields matches
    nothing)."""
    labels = node["labels"]
    spec = pod["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = terms_of(pod)
    if not terms:
        return True
    for term in terms:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_expr_matches(e, labels) for e in exprs) and all(
            node["name"] in f["values"] for f in fields
        ):
            return True
    return False


def _node(name: str, arch: str, os: str = "linux") -> dict[str, Any]:
    return {"name": name, "labels": {ARCH_LABEL: arch, OS_LABEL: os, HOSTNAME_LABEL: name}}


NODES = [_node("amd", "amd64"), _node("arm", "arm64"), _node("ibm", "s390x"),
         _node("win", "amd64", "windows")]


def _decide(pod: dict[str, Any], *plats: str) -> tuple[d.Decision, dict[str, Any]]:
    dec = d.decide(PlacementInputs(pod, {"reg/app:1": img("reg/app:1", *plats)}, CFG))
    new = apply(pod, list(dec.patch))
    assert_kep3838(pod, new)
    return dec, new


def _admitted(pod: dict[str, Any]) -> set[str]:
    return {n["name"] for n in NODES if admits(pod, n)}


def test_a_term_with_notin_on_arch_gets_the_supported_set_appended() -> None:
    # Three ORed terms, one of them with NotIn on arch: once seen bound to an arm64 node.
    pod = gated_pod(affinity=required(
        [expression(HOSTNAME_LABEL, "In", ["arm"]), expression(ARCH_LABEL, "In", ["amd64"])],
        [expression(ARCH_LABEL, "NotIn", ["s390x"])],
        [expression(ARCH_LABEL, "In", ["amd64"])],
    ))
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][2]["matchFields"] = [
            {"key": "metadata.name", "operator": "In", "values": ["amd"]}]
    assert _admitted(pod) == {"amd", "arm", "win"}
    dec, new = _decide(pod, "linux/amd64")
    assert dec.outcome == d.Outcome.SET and dec.events[0].reason == d.PLACEMENT_DECIDED
    assert _admitted(new) == {"amd"}
    notin = terms_of(new)[1]["matchExpressions"]
    assert expression(ARCH_LABEL, "In", ["amd64"]) in notin


def test_only_term_notin_or_exists_on_arch_is_narrowed() -> None:
    for expr in (expression(ARCH_LABEL, "NotIn", ["s390x"]), expression(ARCH_LABEL, "Exists")):
        pod = gated_pod(affinity=required([expr]))
        _, new = _decide(pod, "linux/amd64")
        assert _admitted(new) == {"amd"}


def test_partly_compatible_pin_is_kept_with_a_warning_naming_the_others() -> None:
    pod = gated_pod(affinity=required([expression(ARCH_LABEL, "In", ["amd64", "arm64"])]))
    dec, new = _decide(pod, "linux/amd64")
    assert dec.events[0].reason == d.PARTIALLY_COMPATIBLE_AFFINITY
    assert "arm64" in dec.events[0].message and "amd64" in dec.events[0].message
    # the user's pin stays (emulation is their call); the OS is still narrowed
    assert _admitted(new) == {"amd", "arm"}


def test_pin_outside_the_supported_set_warns_incompatible_and_keeps_the_pod_as_written() -> None:
    pod = gated_pod(affinity=required([expression(ARCH_LABEL, "In", ["arm64"])]))
    dec, new = _decide(pod, "linux/amd64")
    assert dec.events[0].reason == d.INCOMPATIBLE_NODE_AFFINITY
    assert _admitted(new) == {"arm"}
    assert terms_of(new)[0]["matchExpressions"][0] == expression(ARCH_LABEL, "In", ["arm64"])


def test_a_pin_in_one_term_and_a_free_term_is_partial_not_incompatible() -> None:
    pod = gated_pod(affinity=required(
        [expression(ARCH_LABEL, "In", ["s390x"])], [expression("zone", "Exists")]))
    dec, _ = _decide(pod, "linux/amd64")
    assert dec.events[0].reason == d.PARTIALLY_COMPATIBLE_AFFINITY


def test_node_selector_pin_outside_the_set_warns() -> None:
    pod = gated_pod(node_selector={ARCH_LABEL: "arm64"})
    dec, new = _decide(pod, "linux/amd64")
    assert dec.events[0].reason == d.INCOMPATIBLE_NODE_SELECTOR
    assert _admitted(new) == {"arm"}


def test_linux_images_never_admit_a_windows_node() -> None:
    _, new = _decide(gated_pod(), "linux/amd64", "linux/arm64")
    assert _admitted(new) == {"amd", "arm"}
    _, win = _decide(gated_pod(), "windows/amd64")
    assert _admitted(win) == {"win"}


def test_windows_amd64_and_linux_arm64_never_admit_linux_amd64() -> None:
    # The real-server case: the cross product admitted the linux/amd64 node.
    _, new = _decide(gated_pod(), "windows/amd64", "linux/arm64")
    assert _admitted(new) == {"arm", "win"}


def test_with_terms_each_term_admits_only_its_os_pairs() -> None:
    pod = gated_pod(affinity=required([expression("zone", "DoesNotExist")],
                                      [expression(OS_LABEL, "In", ["windows"])]))
    assert _admitted(pod) == {"amd", "arm", "ibm", "win"}
    dec, new = _decide(pod, "windows/amd64", "linux/arm64")
    assert _admitted(new) == {"arm", "win"}
    assert dec.events[0].reason == d.PLATFORMS_LEFT_OUT  # term 0 left windows/amd64 out


_keys = st.sampled_from([ARCH_LABEL, ARCH_LABEL, OS_LABEL, "zone"])
_ops = st.sampled_from(["In", "In", "NotIn", "Exists", "DoesNotExist"])
_values = st.lists(st.sampled_from([*ARCHS, *OSES, "a"]), min_size=1, max_size=3, unique=True)


@st.composite
def _exprs(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(_ops)
    key = draw(_keys)
    return expression(key, op, draw(_values) if op in ("In", "NotIn") else None)


_terms = st.lists(st.lists(_exprs(), min_size=1, max_size=3), min_size=0, max_size=3)
#: Mostly several OSes with different architectures: the case one term cannot name exactly.
_plats = st.lists(
    st.tuples(st.sampled_from(OSES), st.sampled_from(ARCHS)).map("/".join),
    min_size=1, max_size=5, unique=True,
)
#: Every (os, arch) pair of the cluster has a node.
ALL_NODES = [_node(f"{o}-{a}", a, o) for o in OSES for a in ARCHS]


def _explicit(pod: Mapping[str, Any], key: str) -> set[str]:
    out = {str(v) for t in terms_of(pod) for e in t.get("matchExpressions") or []
           if e["key"] == key and e["operator"] == "In" for v in e.get("values") or []}
    pin = (pod["spec"].get("nodeSelector") or {}).get(key)
    return out | ({pin} if pin else set())


@settings(max_examples=600, deadline=None)
@given(_terms, _plats, st.sampled_from([None, *ARCHS]), st.sampled_from([None, *OSES]))
def test_property_no_admitted_node_outside_supported_pairs_or_the_users_pins(
    terms: Sequence[list[dict[str, Any]]], plats: list[str],
    selector_arch: str | None, selector_os: str | None,
) -> None:
    """For every node of every (os, arch): a node the written affinity admits runs a pair
    every image supports, unless the user's own pins name its arch or os (then the pair is
    reported); a supported pair the user's terms admitted stays admitted unless a term
    left it out, which is reported and warned."""
    selector = {k: v for k, v in ((ARCH_LABEL, selector_arch), (OS_LABEL, selector_os)) if v}
    pod = gated_pod(affinity=required(*terms) if terms else None,
                    node_selector=selector or None)
    dec, new = _decide(pod, *plats)
    assert dec.outcome in (d.Outcome.SET, d.Outcome.NOT_SET)
    requirement = dec.requirement
    assert requirement is not None
    pairs = {tuple(p.split("/")) for p in plats}
    archs = {a for _, a in pairs}
    oses = {o for o, _ in pairs}
    pinned_arch, pinned_os = _explicit(pod, ARCH_LABEL), _explicit(pod, OS_LABEL)
    left_out = {p for t in requirement.terms for p in t.left_out}
    cannot_run = dec.events[0].reason in (d.INCOMPATIBLE_NODE_SELECTOR,
                                          d.INCOMPATIBLE_NODE_AFFINITY)
    for node in ALL_NODES:
        labels = node["labels"]
        pair = (labels[OS_LABEL], labels[ARCH_LABEL])
        if admits(new, node):
            assert pair[1] in archs | pinned_arch, (node, terms_of(new))
            assert pair[0] in oses | pinned_os, (node, terms_of(new))
            if pair not in pairs:
                assert pair[1] in pinned_arch or pair[0] in pinned_os, (node, terms_of(new))
                if pair[1] in archs and pair[0] in oses:
                    assert cannot_run or pair in requirement.outside_pairs, (node, terms_of(new))
            else:
                assert pair in requirement.pairs
        if pair in pairs and admits(pod, node) and not admits(new, node):
            assert pair in left_out, (node, terms_of(pod), terms_of(new))
    if not terms and not selector:
        # no pins at all: exactly the supported pairs
        assert {(n["labels"][OS_LABEL], n["labels"][ARCH_LABEL])
                for n in ALL_NODES if admits(new, n)} == pairs
    if left_out and not cannot_run:
        assert dec.events[0].reason == d.PLATFORMS_LEFT_OUT
        assert all(f"{o}/{a}" in dec.events[0].message for o, a in left_out)
