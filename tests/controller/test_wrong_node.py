"""Never a pod on a node its images can't run (issue 13): the decision's affinity, checked
by evaluating it against node labels the way kube-scheduler's NodeAffinity filter does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller import decision as d
from controller.affinity import expression
from controller.config import ARCH_LABEL, HOSTNAME_LABEL, OS_LABEL, PlacementConfig
from tests.controller._pods import apply, assert_kep3838, gated_pod, img, required, terms_of

CFG = PlacementConfig()
ARCHS = ("amd64", "arm64", "ppc64le", "s390x")
OSES = ("linux", "windows")


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
    dec = d.decide(pod, {"reg/app:1": img("reg/app:1", *plats)}, CFG)
    new = apply(pod, list(dec.patch))
    assert_kep3838(pod, new)
    return dec, new


def _admitted(pod: dict[str, Any]) -> set[str]:
    return {n["name"] for n in NODES if admits(pod, n)}


def test_a_term_with_notin_on_arch_gets_the_supported_set_appended() -> None:
    # The three ORed terms seen bound to an arm64 node in issue 13.
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
    assert dec.outcome == d.SET and dec.events[0].reason == d.PLACEMENT_DECIDED
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


_keys = st.sampled_from([ARCH_LABEL, ARCH_LABEL, OS_LABEL, "zone"])
_ops = st.sampled_from(["In", "In", "NotIn", "Exists", "DoesNotExist"])
_values = st.lists(st.sampled_from([*ARCHS, *OSES, "a"]), min_size=1, max_size=3, unique=True)


@st.composite
def _exprs(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(_ops)
    key = draw(_keys)
    return expression(key, op, draw(_values) if op in ("In", "NotIn") else None)


_terms = st.lists(st.lists(_exprs(), min_size=1, max_size=3), min_size=0, max_size=3)
_plats = st.lists(
    st.tuples(st.sampled_from(OSES), st.sampled_from(ARCHS)).map("/".join),
    min_size=1, max_size=4, unique=True,
)
_nodes = st.lists(
    st.tuples(st.sampled_from(ARCHS), st.sampled_from(OSES)), min_size=1, max_size=8
).map(lambda pairs: [_node(f"n{i}", a, o) for i, (a, o) in enumerate(pairs)])


def _explicit(pod: Mapping[str, Any], key: str) -> set[str]:
    out = {str(v) for t in terms_of(pod) for e in t.get("matchExpressions") or []
           if e["key"] == key and e["operator"] == "In" for v in e.get("values") or []}
    pin = (pod["spec"].get("nodeSelector") or {}).get(key)
    return out | ({pin} if pin else set())


@settings(max_examples=400, deadline=None)
@given(_terms, _plats, _nodes, st.sampled_from([None, *ARCHS]))
def test_property_no_admitted_node_outside_supported_or_the_users_pins(
    terms: Sequence[list[dict[str, Any]]], plats: list[str], nodes: list[dict[str, Any]],
    selector_arch: str | None,
) -> None:
    pod = gated_pod(affinity=required(*terms) if terms else None,
                    node_selector={ARCH_LABEL: selector_arch} if selector_arch else None)
    dec, new = _decide(pod, *plats)
    archs = {p.split("/")[1] for p in plats}
    oses = {p.split("/")[0] for p in plats}
    pairs = {tuple(p.split("/")) for p in plats}
    ok_arch = archs | _explicit(pod, ARCH_LABEL)
    ok_os = oses | _explicit(pod, OS_LABEL)
    for node in nodes:
        labels = node["labels"]
        if admits(new, node):
            assert labels[ARCH_LABEL] in ok_arch, (node, terms_of(new))
            assert labels[OS_LABEL] in ok_os, (node, terms_of(new))
        runs = (labels[OS_LABEL], labels[ARCH_LABEL]) in pairs
        if runs and admits(pod, node):
            assert admits(new, node), (node, terms_of(pod), terms_of(new))
    assert dec.outcome in (d.SET, d.NOT_SET)
