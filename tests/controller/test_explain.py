"""``podplacement explain``: the report (pure), its renderings, and the CLI on files, a real
registry and a Kubernetes API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.cli import main
from podplacement.imageinspect import ImageInfo, Platform
from podplacement.rules.config import PlacementConfig, TopologyConfig
from podplacement.rules.monitor.explain import apply_patch, explain, render
from tests.controller.numa._build import gpod, node, nrt
from tests.harness.kube import KubeEnv
from tests.harness.registry import Registry

IMAGE = "example.test/app:1"
AMD_ARM = ImageInfo(f"{IMAGE}", "sha256:" + "a" * 64, "application/vnd.oci.image.index.v1+json",
                    (Platform("linux", "amd64"), Platform("linux", "arm64", "v8"),
                     Platform("unknown", "unknown")))
NUMA = PlacementConfig(topology=TopologyConfig(enabled=True))


def _pod(cpu: str = "9") -> dict[str, Any]:
    p = gpod(cpu, "1Gi", name="web", namespace="shop")
    p["spec"]["containers"][0]["image"] = IMAGE
    return p


def _cluster() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    nodes = [node("big", hostname="big.example"), node("small"), node("pi", arch="arm64"),
             node("ibm", arch="s390x")]
    nrts = {
        "big": nrt("big", [{"cpu": 16, "memory": "64Gi"}, {"cpu": 4, "memory": "64Gi"}]),
        "small": nrt("small", [{"cpu": 8, "memory": "64Gi"}, {"cpu": 6, "memory": "64Gi"}]),
        "pi": nrt("pi", [{"cpu": 10, "memory": "8Gi"}], scope="pod"),
    }
    return nodes, nrts


def test_report_shape_and_node_rows() -> None:
    nodes, nrts = _cluster()
    report = explain(_pod(), nodes, nrts, {IMAGE: AMD_ARM}, NUMA)
    assert report["pod"] == "shop/web"
    assert report["images"] == [{"image": IMAGE, "digest": "sha256:" + "a" * 64,
                                 "platforms": ["linux/amd64", "linux/arm64/v8",
                                               "unknown/unknown"]}]
    assert report["architectures"] == ["amd64", "arm64"]
    rows = {r["name"]: r for r in report["nodes"]}
    assert list(rows) == ["big", "ibm", "pi", "small"]
    # big: cpu (16-9)*100//16=43, mem (64-1)*100//64=98 -> 70 on node-0; node-1 (4 cpus) gives
    # cpu 0 + mem 98 -> 49: min non-zero 49
    assert rows["big"] == {"name": "big", "feasible": True, "reason": None, "score": 49,
                           "policy": "single-numa-node", "scope": "container"}
    assert rows["small"]["reason"] == \
        "cannot align container app: cpu 9 > 8 available in best zone"
    assert rows["ibm"]["feasible"] is False
    assert rows["ibm"]["reason"].startswith("platform linux/s390x is not supported")
    # pi: cpu (10-9)*100//10=10, memory (8-1)*100//8=87 -> 48
    assert rows["pi"]["score"] == 48
    assert set(report) >= {"pod", "images", "architectures", "nodes", "affinity"}
    json.dumps(report)  # JSON-serialisable as is


def test_affinity_is_exactly_what_would_be_injected() -> None:
    nodes, nrts = _cluster()
    report = explain(_pod(), nodes, nrts, {IMAGE: AMD_ARM}, NUMA)
    required = report["affinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["big.example", "pi"]},
    ]}]}
    preferred = report["affinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["weight"], t["preference"]["matchExpressions"][0]["values"]) for t in preferred] \
        == [(49, ["big.example"]), (48, ["pi"])]
    assert report["numa"]["candidates"] == ["big", "pi"]
    assert report["outcome"] == "set"


def test_user_terms_keep_their_expressions_and_get_ours_appended() -> None:
    nodes, nrts = _cluster()
    pod = _pod("2")
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    report = explain(pod, nodes, nrts, {IMAGE: AMD_ARM}, PlacementConfig())
    terms = report["affinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]
    # topology disabled: no NUMA part, eligible nodes are feasible without a score
    assert report["numa"] is None
    assert {r["name"]: (r["feasible"], r["score"]) for r in report["nodes"]} == {
        "big": (True, None), "ibm": (False, None), "pi": (True, None), "small": (True, None)}


MIXED = ImageInfo(IMAGE, "sha256:" + "b" * 64, "application/vnd.oci.image.index.v1+json",
                  (Platform("windows", "amd64"), Platform("linux", "arm64")))


def _os_nodes() -> list[dict[str, Any]]:
    win = node("win")
    win["metadata"]["labels"]["kubernetes.io/os"] = "windows"
    return [node("amd"), node("arm", arch="arm64"), win]


def test_two_oses_are_explained_as_exact_pairs() -> None:
    report = explain(_pod("1"), _os_nodes(), {}, {IMAGE: MIXED}, PlacementConfig())
    assert report["pairs"] == ["linux/arm64", "windows/amd64"]
    assert report["affinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]},
            {"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                {"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]}]}
    rows = {r["name"]: (r["feasible"], r["reason"]) for r in report["nodes"]}
    assert rows == {
        "amd": (False, "platform linux/amd64 is not supported by every image "
                       "(supported: linux/arm64, windows/amd64)"),
        "arm": (True, None), "win": (True, None)}
    table = render(report, "table")
    assert "Platforms: linux/arm64, windows/amd64\n" in table
    assert "Outcome: set (required platforms linux/arm64, windows/amd64)" in table


def test_a_platform_left_out_of_every_term_is_an_infeasible_row() -> None:
    pod = _pod("1")
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": ["b"]}]}]}}}
    report = explain(pod, _os_nodes(), {}, {IMAGE: MIXED}, PlacementConfig())
    assert report["pairs"] == ["linux/arm64"]
    rows = {r["name"]: (r["feasible"], r["reason"]) for r in report["nodes"]}
    assert rows["arm"] == (True, None)
    assert rows["win"] == (False, "platform windows/amd64 is left out of the pod's required "
                                  "nodeSelectorTerms (each keeps one OS: a gated pod's terms "
                                  "can only be narrowed, KEP-3838)")
    assert report["reason"] == "required platforms linux/arm64"


def test_numa_candidates_skip_a_platform_left_out_of_every_term() -> None:
    """A node of a supported pair that the narrowed terms no longer admit is no NUMA
    candidate (plan's node eligibility uses the pairs the written terms keep)."""
    pod = _pod("2")
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": ["b"]}]}]}}}
    nrts = {n: nrt(n, [{"cpu": 8, "memory": "64Gi"}]) for n in ("amd", "arm", "win")}
    report = explain(pod, _os_nodes(), nrts, {IMAGE: MIXED}, NUMA)
    assert report["numa"]["candidates"] == ["arm"]
    without_terms = explain(_pod("2"), _os_nodes(), nrts, {IMAGE: MIXED}, NUMA)
    assert sorted(without_terms["numa"]["candidates"]) == ["arm", "win"]


def test_linux_only_table_has_no_platforms_line() -> None:
    nodes, nrts = _cluster()
    table = render(explain(_pod(), nodes, nrts, {IMAGE: AMD_ARM}, PlacementConfig()), "table")
    assert "Platforms:" not in table and "Architectures: amd64, arm64\n" in table


def test_no_feasible_node_waits_and_injects_nothing() -> None:
    nodes, nrts = _cluster()
    report = explain(_pod("40"), nodes, nrts, {IMAGE: AMD_ARM}, NUMA)
    assert report["outcome"] == "wait-numa"
    assert report["affinity"] == {}
    assert report["numa"]["candidates"] == []


def test_failed_image_is_reported_and_decided_like_the_controller_fallback() -> None:
    nodes, nrts = _cluster()
    report = explain(_pod(), nodes, nrts, {IMAGE: LookupError("manifest unknown")}, NUMA)
    assert report["images"] == [{"image": IMAGE, "digest": None, "platforms": [],
                                 "error": "manifest unknown"}]
    assert report["outcome"] == "fallback"
    assert report["architectures"] == []


def test_table_output() -> None:
    nodes, nrts = _cluster()
    text = render(explain(_pod(), nodes, nrts, {IMAGE: AMD_ARM}, NUMA), "table")
    lines = text.splitlines()
    assert lines[0] == "Pod: shop/web"
    assert "Architectures: amd64, arm64" in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("NODE"))
    assert lines[header].split() == ["NODE", "FEASIBLE", "SCORE", "POLICY", "REASON"]
    small = next(line for line in lines if line.startswith("small "))
    assert small.split()[:4] == ["small", "no", "-", "single-numa-node/container"]
    assert small.endswith("cannot align container app: cpu 9 > 8 available in best zone")
    big = next(line for line in lines if line.startswith("big "))
    assert big.split() == ["big", "yes", "49", "single-numa-node/container"]
    affinity = yaml.safe_load("\n".join(lines[lines.index("nodeAffinity:") + 1:]))
    assert "requiredDuringSchedulingIgnoredDuringExecution" in affinity


def test_apply_patch_ops() -> None:
    doc = {"a": {"b": [1, 2]}, "c~d/e": 1}
    out = apply_patch(doc, [{"op": "test", "path": "/a/b/0", "value": 1},
                            {"op": "add", "path": "/a/b/-", "value": 3},
                            {"op": "add", "path": "/a/b/0", "value": 0},
                            {"op": "remove", "path": "/c~0d~1e"},
                            {"op": "replace", "path": "/a/x", "value": True}])
    assert out == {"a": {"b": [0, 1, 2, 3], "x": True}}
    assert doc == {"a": {"b": [1, 2]}, "c~d/e": 1}
    with pytest.raises(ValueError):
        apply_patch(doc, [{"op": "test", "path": "/a/b/0", "value": 5}])


# --- CLI -------------------------------------------------------------------------------

def _write_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    nodes, nrts = _cluster()
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(_pod()))
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    nrt_file = tmp_path / "nrts.yaml"
    nrt_file.write_text(yaml.safe_dump_all(list(nrts.values())))  # multi-document form
    return pod_file, nodes_file, nrt_file


def test_cli_files_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod_file, nodes_file, nrt_file = _write_inputs(tmp_path)
    code = main(["explain", str(pod_file), "--nodes", str(nodes_file), "--nrt", str(nrt_file),
                 "--assume-platforms", "linux/amd64,linux/arm64", "-o", "json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == [{"image": IMAGE, "digest": None,
                                 "platforms": ["linux/amd64", "linux/arm64"]}]
    assert report["numa"]["candidates"] == ["big", "pi"]  # NRTs given: NUMA on by default


def test_cli_config_and_strategy_override(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    pod_file, nodes_file, nrt_file = _write_inputs(tmp_path)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"apiVersion": "podplacement.io/v1beta1",
                                   "kind": "PodPlacementConfig", "metadata": {"name": "cluster"},
                                   "spec": {"topology": {"enabled": True,
                                                         "maxCandidateNodes": 1}}}))
    code = main(["explain", str(pod_file), "--nodes", str(nodes_file), "--nrt", str(nrt_file),
                 "--config", str(cfg), "--assume-platforms", "linux/amd64,linux/arm64",
                 "--scoring-strategy", "MostAllocated", "-o", "yaml"])
    assert code == 0
    report = yaml.safe_load(capsys.readouterr().out)
    assert report["numa"]["strategy"] == "MostAllocated"
    # MostAllocated: big node-0 cpu 9*100//16=56, mem 1*100//64=1 -> 28; node-1 cpu 0, mem 1
    # -> 0 (min non-zero 28); pi: 90, 12 -> 51. Best single candidate: pi
    assert report["numa"]["candidates"] == ["pi"]


def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod_file, _, _ = _write_inputs(tmp_path)
    assert main(["explain", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["explain", str(pod_file), "--assume-platforms", "amd64"]) == 2
    assert "os/architecture" in capsys.readouterr().err


def test_cli_inspects_images_in_a_real_registry(registry: Registry, make_pusher: Any,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    pushed = make_pusher(registry).multiarch("explain/app", "v1", ["linux/arm64", "linux/s390x"])
    image = f"{registry.host}/explain/app:v1"
    pod = _pod("1")
    pod["spec"]["containers"][0]["image"] = image
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(pod))
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text(yaml.safe_dump_all(_cluster()[0]))
    code = main(["explain", str(pod_file), "--nodes", str(nodes_file),
                 "--insecure-registry", registry.host, "-o", "json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"][0]["digest"] == pushed.digest
    assert report["images"][0]["platforms"][:2] == ["linux/arm64", "linux/s390x"]
    assert report["architectures"] == ["arm64", "s390x"]
    feasible = sorted(r["name"] for r in report["nodes"] if r["feasible"])
    assert feasible == ["ibm", "pi"]


def test_cli_reads_nodes_and_nrts_through_kubeconfig(fresh_localkube: KubeEnv, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    kube = fresh_localkube
    nodes, nrts = _cluster()
    for n in nodes:
        kube.create("/api/v1/nodes", n)
    for obj in nrts.values():
        kube.create("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies", obj)
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(_pod()))
    code = main(["explain", str(pod_file), "--kubeconfig", str(kube.kubeconfig),
                 "--assume-platforms", "linux/amd64,linux/arm64", "-o", "json"])
    assert code == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["numa"]["candidates"] == ["big", "pi"]
    rows = {r["name"]: r for r in report["nodes"]}
    assert rows["small"]["reason"] == "cannot align container app: cpu 9 > 8 available in best zone"


def test_cli_kubeconfig_without_the_nrt_crd(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from localkube import LocalKube
    from tests.harness.kube import CRD_FILES

    crds = [p for p in CRD_FILES if "noderesourcetopolog" not in p.name]
    server = LocalKube(crds).start()
    try:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        env = KubeEnv(url=server.url, kubeconfig=kubeconfig, kind="localkube", server=server)
        env.create("/api/v1/nodes", node("n1"))
        env.close()
        pod_file = tmp_path / "pod.yaml"
        pod_file.write_text(yaml.safe_dump(_pod()))
        code = main(["explain", str(pod_file), "--kubeconfig", str(kubeconfig),
                     "--assume-platforms", "linux/amd64", "-o", "json"])
        assert code == 0, capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
    finally:
        server.stop()
    # no NRTs: topology stays off by default, the node is feasible on architecture alone
    assert report["numa"] is None
    assert report["nodes"] == [{"name": "n1", "feasible": True, "reason": None, "score": None,
                                "policy": None, "scope": None}]
    assert report["architectures"] == ["amd64"]


def test_the_exec_format_error_record_is_shown() -> None:
    from podplacement.rules.config import EXEC_FORMAT_ANNOTATION

    nodes, nrts = _cluster()
    assert explain(_pod(), nodes, nrts, {IMAGE: AMD_ARM}, NUMA)["execFormatErrors"] is None
    digest = "sha256:" + "a" * 64
    record = {"containers": {"app": {"restartCount": 2, "imageID": f"{IMAGE}@{digest}",
                                     "digest": digest, "arch": "arm64", "node": "pi"}},
              "verified": {digest: {"status": "mismatch", "mismatched": ["linux/arm64"],
                                    "reason": "/bin/app is ELF 64-bit LSB EM_X86_64 (amd64), "
                                              "not arm64"}}}
    pod = _pod()
    pod["metadata"].setdefault("annotations", {})[EXEC_FORMAT_ANNOTATION] = json.dumps(record)
    report = explain(pod, nodes, nrts, {IMAGE: AMD_ARM}, NUMA)
    assert report["execFormatErrors"] == record
    text = render(report, "table")
    assert f"container app: restart 2, digest {digest}, node pi (arm64)" in text
    assert "platforms flagged: linux/arm64" in text and "EM_X86_64" in text


def test_an_image_volume_is_explained_like_a_container_image() -> None:
    """KEP-4639: the image volume's image is listed and narrows the architectures."""
    nodes, nrts = _cluster()
    pod = _pod()
    pod["spec"]["volumes"] = [{"name": "models", "image": {"reference": "example.test/m:1"}}]
    arm = ImageInfo("example.test/m:1", "sha256:" + "b" * 64,
                    "application/vnd.oci.image.manifest.v1+json", (Platform("linux", "arm64"),))
    report = explain(pod, nodes, nrts, {IMAGE: AMD_ARM, "example.test/m:1": arm}, NUMA)
    assert [i["image"] for i in report["images"]] == [IMAGE, "example.test/m:1"]
    assert report["architectures"] == ["arm64"]
    rows = {r["name"]: r for r in report["nodes"]}
    assert rows["big"]["feasible"] is False and rows["pi"]["feasible"] is True
