"""Windows builds (issue #38, item 2): ``os.version`` read from index entries and configs,
the build rule of :mod:`rules.platforms`, the ``node.kubernetes.io/windows-build`` term of
:func:`rules.place.affinity.platform_requirement`, the escape classification, explain and the
decision annotation (pure code; the real-cluster proof is
tests/test_pools_windows_realcluster.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, InvalidManifest, Platform
from podplacement.imageinspect._manifest import parse_config, platforms_from_index
from podplacement.rules.config import (
    ARCH_LABEL,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    SCHEDULING_GATE,
    WINDOWS_BUILD_LABEL,
    PlacementConfig,
)
from podplacement.rules.monitor.admitted import _platform as annotation_platform
from podplacement.rules.monitor.escape import FIT, UNFIT, classify, record_doubt
from podplacement.rules.monitor.explain import apply_patch, explain, render_table
from podplacement.rules.place.affinity import AffinityPlan, expression, platform_requirement
from podplacement.rules.place.placement import PlacementInputs
from podplacement.rules.place.plan import plan
from podplacement.rules.platforms import supported_platforms, windows_build
from podplacement.rules.podspec import node_ineligibility

V2019 = "10.0.17763.5458"
V2022 = "10.0.20348.2340"


def win(version: str | None, arch: str = "amd64") -> Platform:
    return Platform("windows", arch, None, version)


def image(name: str, *platforms: Platform) -> ImageInfo:
    return ImageInfo(name, "sha256:" + "0" * 64, "", platforms)


def node(name: str, os_: str = "windows", arch: str = "amd64",
         build: str | None = None) -> dict[str, Any]:
    labels = {ARCH_LABEL: arch, OS_LABEL: os_, "kubernetes.io/hostname": name}
    if build:
        labels[WINDOWS_BUILD_LABEL] = build
    return {"metadata": {"name": name, "labels": labels}}


def pod(*images: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1"},
            "spec": {"containers": [{"name": f"c{i}", "image": im}
                                    for i, im in enumerate(images)],
                     "schedulingGates": [{"name": SCHEDULING_GATE}], **spec}}


# --- parsing --------------------------------------------------------------------------------


def decide(p: dict[str, Any], images: dict[str, ImageInfo]) -> Any:
    return plan(PlacementInputs(p, images, PlacementConfig()), nodes=None, nrts={}, now=0.0)


def _terms(p: dict[str, Any]) -> Any:
    return p["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def _index(*platforms: dict[str, Any]) -> dict[str, Any]:
    return {"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": "sha256:" + f"{i}" * 64, "size": 1, "platform": p}
        for i, p in enumerate(platforms)]}


def test_index_entries_keep_the_windows_os_version() -> None:
    found = platforms_from_index(_index(
        {"os": "windows", "architecture": "amd64", "os.version": V2019},
        {"os": "windows", "architecture": "amd64", "os.version": V2022},
        {"os": "linux", "architecture": "amd64", "os.version": "6.1"}))
    assert found == (win(V2019), win(V2022), Platform("linux", "amd64"))


@pytest.mark.parametrize("version", ["10.0.17763.1.2", "10.0.x", "", "10..0", "1e3",
                                     "10.0.17763 ", "-1", "12345678901.0"])
def test_a_malformed_os_version_is_not_read(version: str) -> None:
    found = platforms_from_index(_index(
        {"os": "windows", "architecture": "amd64", "os.version": version}))
    assert found == (win(None),)


def test_an_os_version_over_the_bound_is_refused() -> None:
    with pytest.raises(InvalidManifest):
        platforms_from_index(_index(
            {"os": "windows", "architecture": "amd64", "os.version": "1" * 200}))


def test_a_single_manifest_config_gives_its_os_version() -> None:
    config = {"os": "windows", "architecture": "amd64", "os.version": V2022,
              "rootfs": {"type": "layers", "diff_ids": []}}
    assert parse_config(json.dumps(config).encode()) == (win(V2022),)


def test_platform_text_and_parse_round_trip() -> None:
    assert str(win(V2019)) == "windows/amd64"  # the form every cache and catalog keeps
    assert win(V2019).text() == f"windows/amd64@{V2019}"
    assert Platform.parse(win(V2019).text()) == win(V2019)
    assert Platform.parse("linux/arm64/v8") == Platform("linux", "arm64", "v8")
    with pytest.raises(ValueError):
        Platform.parse("windows/amd64@10.0.x")
    # the annotation's per-image form, and that of the previous release
    assert annotation_platform(f"windows/amd64@{V2022}") == win(V2022)
    assert annotation_platform("windows/amd64") == win(None)
    assert annotation_platform("windows/amd64@bad") is None


# --- the rule -------------------------------------------------------------------------------


def test_windows_build_is_major_minor_build() -> None:
    assert windows_build(V2019) == "10.0.17763"
    assert windows_build("10.0.17763") == "10.0.17763"
    assert windows_build("10.0") is None
    assert windows_build(None) is None


def test_builds_every_image_supports() -> None:
    both = image("both", win(V2019), win(V2022))
    only_2019 = image("2019", win("10.0.17763.1"))
    any_build = image("any", win(None))
    assert supported_platforms([both]).builds == (
        (("windows", "amd64"), ("10.0.17763", "10.0.20348")),)
    assert supported_platforms([both, only_2019]).builds == (
        (("windows", "amd64"), ("10.0.17763",)),)
    # an image without os.version supports any build: it adds no constraint
    assert supported_platforms([both, any_build]).builds == supported_platforms([both]).builds
    assert supported_platforms([any_build]).builds == ()
    assert supported_platforms([any_build]).pairs == (("windows", "amd64"),)


def test_images_of_no_common_build_support_no_windows_pair() -> None:
    found = supported_platforms([image("a", win(V2019), Platform("linux", "amd64")),
                                 image("b", win(V2022), Platform("linux", "amd64"))])
    assert found.pairs == (("linux", "amd64"),)
    assert supported_platforms([image("a", win(V2019)), image("b", win(V2022))]).empty


def test_a_pod_without_terms_gets_one_term_per_windows_arch_build_list() -> None:
    found = supported_platforms([image("a", win(V2019), win(V2022, "arm64"),
                                       Platform("linux", "amd64"))])
    plan = AffinityPlan(pod("a"))
    requirement = plan.require_platforms(found.pairs, dict(found.builds))
    assert plan.result_terms() == [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                              expression(OS_LABEL, "In", ["linux"])]},
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                              expression(OS_LABEL, "In", ["windows"]),
                              expression(WINDOWS_BUILD_LABEL, "In", ["10.0.17763"])]},
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["arm64"]),
                              expression(OS_LABEL, "In", ["windows"]),
                              expression(WINDOWS_BUILD_LABEL, "In", ["10.0.20348"])]},
    ]
    assert [t.builds for t in requirement.terms] == [(), ("10.0.17763",), ("10.0.20348",)]


def test_windows_arches_of_the_same_builds_share_a_term() -> None:
    found = supported_platforms([image("a", win(V2022), win(V2022, "arm64"))])
    plan = AffinityPlan(pod("a"))
    plan.require_platforms(found.pairs, dict(found.builds))
    assert plan.result_terms() == [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64", "arm64"]),
                              expression(OS_LABEL, "In", ["windows"]),
                              expression(WINDOWS_BUILD_LABEL, "In", ["10.0.20348"])]}]


def test_without_os_version_the_rule_of_before() -> None:
    found = supported_platforms([image("a", win(None), Platform("linux", "amd64"))])
    assert (platform_requirement(pod("a"), found.pairs, dict(found.builds))
            == platform_requirement(pod("a"), found.pairs))
    terms = AffinityPlan(pod("a"))
    terms.require_platforms(found.pairs, dict(found.builds))
    assert terms.result_terms() == [{"matchExpressions": [
        expression(ARCH_LABEL, "In", ["amd64"]), expression(OS_LABEL, "In", ["linux", "windows"])]}]


def test_an_existing_windows_term_is_narrowed_to_the_build() -> None:
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expression(OS_LABEL, "In", ["windows"])]}]}}}
    found = supported_platforms([image("a", win(V2019), Platform("linux", "amd64"))])
    plan = AffinityPlan(pod("a", affinity=own))
    requirement = plan.require_platforms(found.pairs, dict(found.builds))
    assert plan.result_terms() == [{"matchExpressions": [
        expression(OS_LABEL, "In", ["windows"]), expression(ARCH_LABEL, "In", ["amd64"]),
        expression(WINDOWS_BUILD_LABEL, "In", ["10.0.17763"])]}]
    assert requirement.terms[0].builds == ("10.0.17763",)
    # placed, the pod's terms reproduce: nothing more to append
    placed = pod("a", affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": plan.result_terms()}}})
    assert platform_requirement(placed, found.pairs, dict(found.builds)).appended == 0


def test_an_existing_term_mixing_linux_and_constrained_windows_keeps_linux() -> None:
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            expression("topology.kubernetes.io/zone", "In", ["a"])]}]}}}
    found = supported_platforms([image("a", win(V2019), Platform("linux", "amd64"))])
    requirement = platform_requirement(pod("a", affinity=own), found.pairs, dict(found.builds))
    assert requirement.terms[0].expressions == (
        expression(ARCH_LABEL, "In", ["amd64"]), expression(OS_LABEL, "In", ["linux"]))
    assert requirement.excluded == (("windows", "amd64"),)


# --- the paths: controller decision, escape, explain -----------------------------------------


def test_the_decision_writes_the_build_term_and_records_it() -> None:
    images = {"a": image("a", win(V2019), win(V2022)), "b": image("b", win("10.0.17763.9"))}
    decision = decide(pod("a", "b"), images)
    assert _terms(apply_patch(pod("a", "b"), decision.patch)) == [{"matchExpressions": [
        expression(ARCH_LABEL, "In", ["amd64"]), expression(OS_LABEL, "In", ["windows"]),
        expression(WINDOWS_BUILD_LABEL, "In", ["10.0.17763"])]}], decision.patch
    record = decision.record
    assert record["windowsBuilds"] == {"windows/amd64": ["10.0.17763"]}
    assert record["images"][0]["platforms"] == [f"windows/amd64@{V2019}",
                                                f"windows/amd64@{V2022}"]


def test_disjoint_builds_get_the_unsatisfiable_marker() -> None:
    images = {"a": image("a", win(V2019)), "b": image("b", win(V2022))}
    decision = decide(pod("a", "b"), images)
    assert NO_SUPPORTED_PLATFORM_KEY in json.dumps(decision.patch)
    assert decision.record["result"] == "no-supported-platform"


def _placed(images: dict[str, ImageInfo], node_name: str) -> dict[str, Any]:
    p = apply_patch(pod(*images), decide(pod(*images), images).patch)
    p["spec"]["nodeName"] = node_name
    return p


def test_escape_a_windows_node_of_another_build_is_unfit() -> None:
    images = {"a": image("a", win(V2019))}
    placed = _placed(images, "w")
    unfit = classify(placed, node("w", build="10.0.20348"), images)
    assert unfit.outcome == UNFIT
    assert "windows build 10.0.20348 not supported" in unfit.reason
    assert classify(placed, node("w", build="10.0.17763"), images).outcome == FIT
    # without os.version: any build is fit (the rule of before)
    assert classify(placed, node("w", build="10.0.20348"),
                    {"a": image("a", win(None))}).outcome == FIT
    # the placed pod's record and affinity agree (the build term included)
    assert record_doubt(placed) is None


def test_explain_shows_the_build_and_the_nodes_of_other_builds() -> None:
    images = {"a": image("a", win(V2019))}
    nodes = [node("w2019", build="10.0.17763"), node("w2022", build="10.0.20348"),
             node("lin", os_="linux")]
    report = explain(pod("a"), nodes, {}, images, PlacementConfig())
    assert report["windowsBuilds"] == {"windows/amd64": ["10.0.17763"]}
    rows = {r["name"]: r for r in report["nodes"]}
    assert rows["w2019"]["feasible"] is True
    assert rows["w2022"]["feasible"] is False
    assert rows["w2022"]["reason"] == "windows build 10.0.20348 not supported (supported: " \
        "10.0.17763)"
    assert rows["lin"]["feasible"] is False
    table = render_table(report)
    assert "Windows builds: windows/amd64 on node.kubernetes.io/windows-build 10.0.17763" in table
    assert "windows build 10.0.20348 not supported" in table


def test_node_ineligibility_without_builds_is_unchanged() -> None:
    assert node_ineligibility(node("w", build="10.0.20348"), {}, {("windows", "amd64")}) is None
    assert node_ineligibility(node("w"), {}, {("windows", "amd64")},
                              {("windows", "amd64"): ("10.0.17763",)}) == (
        "windows build unknown not supported (supported: 10.0.17763)")


def test_explain_assume_platforms_takes_an_os_version() -> None:
    from podplacement.controller.explain_cli import InputError, parse_platforms

    (p,) = parse_platforms(f"windows/amd64@{V2019}")
    assert (p.os, p.architecture, p.os_version) == ("windows", "amd64", V2019)
    found = supported_platforms([image("a", p)])  # type: ignore[arg-type]
    assert found.builds == ((("windows", "amd64"), ("10.0.17763",)),)
    with pytest.raises(InputError):
        parse_platforms("windows/amd64@ltsc2019")


def test_demo_report_shows_per_image_platforms_without_the_os_version() -> None:
    from podplacement.demo.report import platforms_cell

    record = {"platforms": [], "images": [
        {"image": "r:1/demo/busybox:s390x", "platforms": ["linux/s390x"]},
        {"image": "r:1/demo/winonly:1", "platforms": [f"windows/amd64@{V2022}"]}]}
    assert platforms_cell(record) == "none (busybox:s390x=s390x | winonly:1=windows/amd64)"
