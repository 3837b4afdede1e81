"""Which placement records spare a labelled pod the escape check (rules/monitor/escape.py
``record_doubt``, ``placement_doubt``, ``skip_reason``): every pod the product really placed,
on every path and with every shape of node affinity, reproduces from its spec (the placement
is computed and rendered by the product's own code here, then applied); what a pod's creator
can write alone (the label, a decision copied from a placed pod, a release without affinity,
an affinity copied too but a node named with ``spec.nodeName``) does not."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, Platform, RegistryError
from podplacement.rules.admit.admissionpolicy import admission_record
from podplacement.rules.config import (
    AFFINITY_LABEL,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    ESCAPE_LABEL,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
    PlatformWeight,
)
from podplacement.rules.monitor.escape import (
    DOUBT_AFFINITY,
    DOUBT_FALLBACK,
    DOUBT_MARKER,
    DOUBT_NO_RECORD,
    DOUBT_NOTHING_WRITTEN,
    DOUBT_PLATFORMS,
    MAX_RECORDED_PLATFORMS,
    Verdict,
    event_spec,
    placement_doubt,
    record_doubt,
    record_patch,
    skip_reason,
)
from podplacement.rules.monitor.explain import apply_patch
from podplacement.rules.place.decision import decide, fallback_ungate, plain_ungate
from podplacement.rules.place.placement import PlacementInputs, compact_json

NS = "podplacement-system"
CONFIG_CREATED = 1_800_000_000.0  # 2027-01-15T08:00:00Z
IMAGE = "reg.example/app:1"
OTHER = "reg.example/sidecar:1"


def image(ref: str, *platforms: str) -> ImageInfo:
    return ImageInfo(ref, "sha256:" + "a" * 64, "application/vnd.oci.image.index.v1+json",
                     tuple(Platform(*p.split("/")) for p in platforms))


def gated(spec: dict[str, Any] | None = None, images: tuple[str, ...] = (IMAGE,)
          ) -> dict[str, Any]:
    """A gated pod as created (``spec`` merged in), after the config."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-x", "namespace": "team-a", "uid": "pod-1",
                     "resourceVersion": "7", "creationTimestamp": "2027-01-15T08:00:05Z",
                     "labels": {"app": "web"}},
        "spec": {"containers": [{"name": f"c{i}", "image": ref}
                                for i, ref in enumerate(images)],
                 "schedulingGates": [{"name": SCHEDULING_GATE}], **copy.deepcopy(spec or {})},
        "status": {"phase": "Pending"},
    }


def placed(pod: dict[str, Any], ops: Any, node: str = "node-1") -> dict[str, Any]:
    """``pod`` after the product's patch ``ops``, then bound to ``node`` by the scheduler."""
    out: dict[str, Any] = apply_patch(pod, [o for o in ops if o["op"] != "test"])
    out["spec"]["nodeName"] = node
    return out


def node(name: str, arch: str, os: str = "linux") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  ARCH_LABEL: arch, OS_LABEL: os}}}


def term(*exprs: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(exprs)}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


ZONE = "topology.kubernetes.io/zone"
#: Pod shapes as users write them (the spec merged into a gated pod).
SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "selector-arch": {"nodeSelector": {ARCH_LABEL: "amd64"}},
    "selector-both": {"nodeSelector": {ARCH_LABEL: "amd64", OS_LABEL: "linux"}},
    "selector-unsupported": {"nodeSelector": {ARCH_LABEL: "riscv64"}},
    "zone-term": required(term(expr(ZONE, "In", "a"))),
    "two-terms": required(term(expr(ZONE, "In", "a")), term(expr(ZONE, "In", "b"))),
    "emulation-pin": required(term(expr(ARCH_LABEL, "In", "amd64", "s390x"))),
    "not-in": required(term(expr(ARCH_LABEL, "NotIn", "arm64"))),
    "pinned-both": required(term(expr(ARCH_LABEL, "In", "amd64"),
                                 expr(OS_LABEL, "In", "linux"))),
    "incompatible-pin": required(term(expr(ARCH_LABEL, "In", "riscv64"))),
    "fields-only": required({"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}),
    "preferred-only": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "preference": term(expr(ZONE, "In", "a"))}]}}},
}
#: Platform sets of the images (one image, or two whose intersection is empty).
PLATFORMS: dict[str, dict[str, ImageInfo]] = {
    "amd64": {IMAGE: image(IMAGE, "linux/amd64")},
    "amd64-arm64": {IMAGE: image(IMAGE, "linux/amd64", "linux/arm64")},
    "linux-windows": {IMAGE: image(IMAGE, "linux/amd64", "windows/amd64")},
    "two-groups": {IMAGE: image(IMAGE, "linux/amd64", "linux/arm64", "windows/amd64")},
}
CONFIGS = {
    "defaults": PlacementConfig(),
    "scoring-fallback": replace(PlacementConfig(), fallback_architecture="arm64",
                                preferred_platforms=(PlatformWeight("amd64", 10),
                                                     PlatformWeight("arm64", 5))),
}


# --- what the product writes reproduces ------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("platforms", PLATFORMS, ids=list(PLATFORMS))
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_every_placement_the_product_writes_reproduces_from_the_spec(
        shape: str, platforms: str, config: str) -> None:
    pod = gated(SHAPES[shape])
    for path in (None, "webhook"):  # the controller's PATCH, the webhook's patch
        decision = decide(PlacementInputs(pod, PLATFORMS[platforms], CONFIGS[config], path=path))
        assert decision.ungate and decision.record, decision.reason
        assert record_doubt(placed(pod, decision.patch)) is None, (path, decision.reason)


def test_the_admission_policys_record_reproduces_too() -> None:
    pod = gated()
    decision = decide(PlacementInputs(pod, PLATFORMS["amd64-arm64"], PlacementConfig()))
    after = placed(pod, decision.patch)
    after["metadata"]["annotations"][DECISION_ANNOTATION] = compact_json(
        admission_record(decision, "uid-1"))
    assert record_doubt(after) is None


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_no_supported_platform_and_fallback_placements_reproduce(shape: str) -> None:
    pod = gated(SHAPES[shape], images=(IMAGE, OTHER))
    disjoint = {IMAGE: image(IMAGE, "linux/amd64"), OTHER: image(OTHER, "linux/arm64")}
    none = decide(PlacementInputs(pod, disjoint, PlacementConfig()))
    assert none.record["result"] == "no-supported-platform"
    assert record_doubt(placed(pod, none.patch)) is None
    failed = {IMAGE: RegistryError("registry down"), OTHER: image(OTHER, "linux/arm64")}
    for config in CONFIGS.values():
        fallback = decide(PlacementInputs(pod, failed, config, give_up="at admission"))
        assert fallback.record["result"] == "fallback"
        assert record_doubt(placed(pod, fallback.patch)) is None
        released = fallback_ungate(pod, "uninstall", config)
        assert record_doubt(placed(pod, released.patch)) is None


def test_an_honest_pod_on_a_node_its_affinity_admits_is_placed() -> None:
    pod = gated()
    decision = decide(PlacementInputs(pod, PLATFORMS["amd64-arm64"], PlacementConfig()))
    after = placed(pod, decision.patch, node="node-arm64")
    after["metadata"]["labels"].update({AFFINITY_LABEL: "set"})
    assert placement_doubt(after, node("node-arm64", "arm64")) is None
    assert placement_doubt(after, None) is None  # node not known: not judged
    assert skip_reason(after, own_namespace=NS, config_created=CONFIG_CREATED,
                       node=node("node-arm64", "arm64")) == "placed"


# --- what a creator writes alone does not ------------------------------------------------------


def labelled(spec: dict[str, Any] | None = None, annotation: str | None = None,
             node_name: str = "node-windows") -> dict[str, Any]:
    """A pod created with the placement label (and ``annotation`` as its decision) and
    ``spec.nodeName`` set: never gated, never placed."""
    pod = gated(spec)
    pod["spec"].pop("schedulingGates")
    pod["spec"]["nodeName"] = node_name
    pod["metadata"]["labels"][AFFINITY_LABEL] = "set"
    if annotation is not None:
        pod["metadata"]["annotations"] = {DECISION_ANNOTATION: annotation}
    return pod


def _copied() -> tuple[str, dict[str, Any]]:
    """The decision annotation and the node affinity of a pod the product placed."""
    pod = gated()
    after = placed(pod, decide(PlacementInputs(pod, PLATFORMS["amd64"], PlacementConfig())).patch)
    return (after["metadata"]["annotations"][DECISION_ANNOTATION],
            {"affinity": after["spec"]["affinity"]})


WINDOWS = node("node-windows", "amd64", os="windows")


def test_the_label_alone_or_with_a_copied_decision_is_not_trusted() -> None:
    annotation, _ = _copied()
    assert record_doubt(labelled()) == DOUBT_NO_RECORD
    assert record_doubt(labelled(annotation="not json")) == DOUBT_NO_RECORD
    assert record_doubt(labelled(annotation="[1]")) == DOUBT_NO_RECORD
    assert record_doubt(labelled(annotation=annotation)) == DOUBT_AFFINITY
    for pod in (labelled(), labelled(annotation=annotation)):
        assert skip_reason(pod, own_namespace=NS, config_created=CONFIG_CREATED,
                           node=WINDOWS) is None


def test_a_copied_affinity_does_not_cover_a_node_named_by_the_creator() -> None:
    annotation, affinity = _copied()
    pod = labelled(affinity, annotation)
    assert record_doubt(pod) is None
    doubt = placement_doubt(pod, WINDOWS)
    assert doubt is not None and "windows/amd64" in doubt
    assert skip_reason(pod, own_namespace=NS, config_created=CONFIG_CREATED,
                       node=WINDOWS) is None
    # the same pod where the scheduler could have put it
    assert placement_doubt(pod, node("node-amd64", "amd64")) is None


def test_a_node_selector_is_judged_against_the_node_too() -> None:
    record = compact_json({"platforms": ["linux/amd64"], "archs": ["amd64"],
                           "result": "not-set"})
    pod = labelled({"nodeSelector": {ARCH_LABEL: "amd64", OS_LABEL: "linux"}}, record)
    assert record_doubt(pod) is None
    assert placement_doubt(pod, node("node-amd64", "amd64")) is None
    assert placement_doubt(pod, WINDOWS) is not None
    assert placement_doubt(pod, {"metadata": {"name": "bare", "labels": {}}}) is not None


def test_releases_without_affinity_prove_nothing() -> None:
    pod = gated()
    ungated = placed(pod, plain_ungate(pod, "the API server refused the affinity").patch)
    assert record_doubt(ungated) == DOUBT_PLATFORMS  # "not-set", nothing written
    webhook_release = labelled(annotation=compact_json(
        {"result": "controller-unavailable", "reason": "no controller"}))
    assert record_doubt(webhook_release) == DOUBT_NOTHING_WRITTEN
    no_images = labelled(annotation=compact_json(
        {"archs": [], "result": "not-set", "reason": "pod has no container images"}))
    assert record_doubt(no_images) == DOUBT_PLATFORMS


@pytest.mark.parametrize(("spec", "record", "doubt"), [
    # platforms the affinity does not restrict to
    (required(term(expr(ARCH_LABEL, "In", "amd64"))),
     {"platforms": ["linux/amd64"], "result": "set"}, DOUBT_AFFINITY),
    (required(term(expr(ARCH_LABEL, "In", "amd64"), expr(OS_LABEL, "In", "linux")),
              term(expr(ZONE, "In", "b"))),
     {"platforms": ["linux/amd64"], "result": "set"}, DOUBT_AFFINITY),
    ({}, {"platforms": [], "result": "set"}, DOUBT_PLATFORMS),
    ({}, {"platforms": "linux/amd64", "result": "set"}, DOUBT_PLATFORMS),
    ({}, {"platforms": ["linux/amd64/v2"], "result": "set"}, DOUBT_PLATFORMS),
    ({}, {"platforms": ["Linux/AMD64"], "result": "set"}, DOUBT_PLATFORMS),
    ({}, {"platforms": [f"linux/a{i}" for i in range(MAX_RECORDED_PLATFORMS + 1)],
          "result": "set"}, DOUBT_PLATFORMS),
    # the marker in some terms only, or none
    (required(term(expr(NO_SUPPORTED_PLATFORM_KEY, "Exists")), term(expr(ZONE, "In", "a"))),
     {"platforms": [], "result": "no-supported-platform"}, DOUBT_MARKER),
    ({}, {"platforms": [], "result": "no-supported-platform"}, DOUBT_MARKER),
    # the fallback's OS term missing, or the architecture it records
    ({}, {"archs": [], "result": "fallback"}, DOUBT_FALLBACK),
    (required(term(expr(OS_LABEL, "In", "linux"))),
     {"archs": ["arm64"], "result": "fallback"}, DOUBT_FALLBACK),
    ({}, {"result": ["set"]}, DOUBT_NOTHING_WRITTEN),
    ({}, {}, DOUBT_NOTHING_WRITTEN),
])
def test_records_the_spec_does_not_bear_out(spec: dict[str, Any], record: dict[str, Any],
                                            doubt: str) -> None:
    assert record_doubt(labelled(spec, compact_json(record))) == doubt


def test_a_marked_pod_is_never_admitted_to_a_node() -> None:
    record = compact_json({"platforms": [], "result": "no-supported-platform"})
    pod = labelled(required(term(expr(NO_SUPPORTED_PLATFORM_KEY, "Exists"))), record)
    assert record_doubt(pod) is None
    assert placement_doubt(pod, node("node-amd64", "amd64")) is not None


@pytest.mark.parametrize("odd", [
    {"metadata": {"labels": {AFFINITY_LABEL: "set"}, "annotations": {DECISION_ANNOTATION: 5}}},
    {"metadata": {"labels": {AFFINITY_LABEL: "set"}, "annotations": "x"}, "spec": []},
    {"metadata": {"annotations": {DECISION_ANNOTATION: '{"result":"set","platforms":[1]}'}},
     "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
         "nodeSelectorTerms": [5, {"matchExpressions": [7]}]}}}}},
    {"metadata": {"annotations": {DECISION_ANNOTATION: '{"result":"fallback","archs":"x"}'}},
     "spec": {"nodeSelector": ["x"]}},
])
def test_odd_pods_never_raise(odd: dict[str, Any]) -> None:
    assert record_doubt(odd) is not None
    assert placement_doubt(odd, {"metadata": {"labels": {ARCH_LABEL: 5}}}) is not None


# --- what the Event and the record say -----------------------------------------------------------


def test_the_event_and_the_record_name_the_doubted_label() -> None:
    verdict = Verdict("unfit", "node-windows", "windows/amd64", ("linux/amd64",),
                      "its images support only linux/amd64: it can't run on the node's "
                      "windows/amd64")
    doubt = placement_doubt(labelled(), WINDOWS)
    assert doubt == DOUBT_NO_RECORD
    spec = event_spec(verdict, not_repaired="no ReplicaSet", doubt=doubt)
    assert spec.reason == "PlacementEscaped" and spec.type == "Warning"
    assert AFFINITY_LABEL in spec.message and DOUBT_NO_RECORD in spec.message
    assert "no podplacement.io/node-affinity label" not in spec.message
    patch = record_patch(labelled(), verdict, now=1.0, doubt=doubt)
    assert patch["metadata"]["labels"] == {ESCAPE_LABEL: "unfit"}
    record = json.loads(patch["metadata"]["annotations"]["podplacement.io/placement-escaped"])
    assert record["labelDoubted"] == DOUBT_NO_RECORD
    plain = json.loads(record_patch(labelled(), verdict, now=1.0)["metadata"]["annotations"][
        "podplacement.io/placement-escaped"])
    assert "labelDoubted" not in plain


# --- the escape monitor's memo of placement_doubt (controller/escapemonitor.py) ---------------


def _replica(pod: dict[str, Any], i: int) -> dict[str, Any]:
    """``pod`` as another replica of its workload: its own name, uid, creation time and
    resourceVersion, the same spec and record."""
    out = copy.deepcopy(pod)
    out["metadata"].update({"name": f"web-{i}", "uid": f"uid-{i}", "resourceVersion": str(i),
                            "creationTimestamp": f"2027-01-15T08:{i % 60:02d}:00Z"})
    # the API server's token volume, named anew for every pod
    token = f"kube-api-access-{i:05d}"
    out["spec"]["volumes"] = [{"name": token, "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}]
    for c in out["spec"]["containers"]:
        c["volumeMounts"] = [{"name": token, "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    return out


def test_the_doubt_memo_judges_each_distinct_input_once_and_as_placement_doubt() -> None:
    from podplacement.controller.escapemonitor import DoubtMemo

    pod = gated()
    decision = decide(PlacementInputs(pod, PLATFORMS["amd64-arm64"], PlacementConfig()))
    honest = placed(pod, decision.patch, node="node-arm64")
    honest["metadata"]["labels"].update({AFFINITY_LABEL: "set"})
    arm, ppc = node("node-arm64", "arm64"), node("node-ppc", "ppc64le")
    memo = DoubtMemo()
    # the replicas of one workload, placed alike, are judged once
    for i in range(50):
        assert memo(_replica(honest, i), arm) is None
    assert (memo.memo.misses, memo.memo.hits) == (1, 49)
    # what differs in what placement_doubt reads is judged again, never served stale
    copied = _replica(honest, 99)  # the record copied, the affinity not
    del copied["spec"]["affinity"]
    other_node = _replica(honest, 98)
    other_node["spec"]["nodeName"] = "node-ppc"
    forged = _replica(honest, 97)
    forged["metadata"]["annotations"][DECISION_ANNOTATION] = forged["metadata"]["annotations"][
        DECISION_ANNOTATION].replace("arm64", "ppc64le")
    cases = [(copied, arm), (other_node, ppc), (honest, ppc), (honest, None), (forged, arm)]
    for case, where in cases:
        assert memo(case, where) == placement_doubt(case, where)
        assert memo(case, where) == placement_doubt(case, where)  # from the memo now
    assert memo(copied, arm) == DOUBT_AFFINITY
    assert memo(honest, ppc) is not None
    assert memo.memo.misses == 1 + len(cases)
    assert skip_reason(_replica(honest, 3), own_namespace=NS, config_created=CONFIG_CREATED,
                       node=arm, doubt=memo) == "placed"
    assert skip_reason(copied, own_namespace=NS, config_created=CONFIG_CREATED, node=arm,
                       doubt=memo) is None


def test_the_doubt_memo_is_bounded() -> None:
    from podplacement.controller.escapemonitor import DoubtMemo

    memo = DoubtMemo(size=2)
    pods = [gated(required(term(expr(ARCH_LABEL, "In", arch)))) for arch in
            ("amd64", "arm64", "s390x")]
    for pod in pods:
        memo(pod, None)
    assert len(memo.memo) == 2
    memo(pods[0], None)  # evicted first, judged again
    assert memo.memo.misses == 4
