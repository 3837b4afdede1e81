"""``podplacement demo``: the sample objects are valid Kubernetes objects whose expectations
follow from the pushed images and the NUMA model, the report renders known pods and events,
and (slow) the whole demo runs end to end with real processes and leaves nothing running."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from podplacement.demo import report, workloads
from podplacement.demo.workloads import DemoRegistries, Expectation
from podplacement.rules.config import (
    AFFINITY_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
    NUMA_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.sandbox.controlplane import AssetsNotFound, locate_assets
from tests.harness.realnode import missing_arm64_node, missing_real_node

REPO = Path(__file__).resolve().parents[1]
REGISTRIES = DemoRegistries("127.0.0.1:5000", "127.0.0.1:5443", "user", "pass")


def _platform_pairs(tag: str) -> set[tuple[str, str]]:
    return {tuple(p.split("/")[:2]) for p in workloads.IMAGE_PLATFORMS[tag]}  # type: ignore[misc]


def _tag_of(image: str) -> str:
    return image.split("/", 1)[1]


# --- workloads (pure) ---------------------------------------------------------------------


def test_every_workload_is_a_valid_pod_for_the_pod_rules() -> None:
    from localkube.podrules import prepare_pod_create

    items = workloads.workloads(REGISTRIES)
    assert len({w.name for w in items}) == len(items)
    for w in items:
        pod = copy.deepcopy(dict(w.pod))
        prepare_pod_create(pod)  # raises StatusError for an invalid pod
        assert pod["metadata"]["name"] == w.name
        assert pod["metadata"]["namespace"] == workloads.DEMO_NAMESPACE
        expected_qos = "Guaranteed" if w.name.startswith("numa-") else "BestEffort"
        assert pod["status"]["qosClass"] == expected_qos, w.name


def test_images_point_at_the_right_registry_and_only_the_private_one_has_a_pull_secret() -> None:
    for w in workloads.workloads(REGISTRIES):
        spec = w.pod["spec"]
        images = [c["image"] for c in spec.get("initContainers", []) + spec["containers"]]
        private = [i for i in images if i.startswith(REGISTRIES.private + "/")]
        public = [i for i in images if i.startswith(REGISTRIES.public + "/")]
        assert len(private) + len(public) == len(images)
        if private:
            assert spec["imagePullSecrets"] == [{"name": workloads.PULL_SECRET_NAME}]
        else:
            assert "imagePullSecrets" not in spec


def test_arch_expectations_are_the_intersection_of_the_image_platforms() -> None:
    for w in workloads.workloads(REGISTRIES):
        if w.expect.waiting:
            assert w.expect.archs is None  # nothing is injected while it waits
            continue
        spec = w.pod["spec"]
        tags = [_tag_of(c["image"]) for c in spec.get("initContainers", []) + spec["containers"]]
        common = set.intersection(*(_platform_pairs(t) for t in tags))
        chosen = (spec.get("nodeSelector") or {}).get(ARCH)
        if chosen is not None:  # the pod's own arch selector decides: nothing is added
            assert ("linux", chosen) in common and w.expect.archs is None, w.name
            continue
        if not common:
            assert w.expect.no_supported_platform and w.expect.archs is None, w.name
            assert w.expect.event == "NoSupportedPlatform"
        else:
            assert {os_ for os_, _ in common} == {"linux"}
            assert tuple(sorted(a for _, a in common)) == tuple(sorted(w.expect.archs or ())), (
                w.name
            )


def test_pull_secret_holds_the_private_registry_credentials() -> None:
    import base64

    from podplacement.imageinspect import credentials_from_pull_secrets, match_credentials

    secret = workloads.pull_secret(REGISTRIES)
    raw = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert raw["auths"][REGISTRIES.private]["username"] == "user"
    creds = credentials_from_pull_secrets([secret])
    private_repo = REGISTRIES.ref(workloads.PRIVATE).rsplit(":", 1)[0]
    public_repo = REGISTRIES.ref(workloads.MULTI).rsplit(":", 1)[0]
    assert match_credentials(private_repo, creds), "the secret must match the private image"
    assert not match_credentials(public_repo, creds)


def test_config_parses_with_the_product_model() -> None:
    config = PlacementConfig.from_object(workloads.placement_config(max_wait_seconds=17))
    assert config.topology.enabled
    assert config.topology.nodes_without_topology == "Deny"
    assert config.topology.max_wait_seconds == 17
    assert {p.architecture: p.weight for p in config.preferred_platforms} == (
        workloads.PREFERRED_WEIGHTS
    )


def test_numa_pods_fit_as_the_demo_claims_under_the_product_numa_model() -> None:
    from podplacement.rules.numa import decide_numa

    config = PlacementConfig.from_object(workloads.placement_config()).topology
    nodes = workloads.node_objects()
    for node, demo in zip(nodes, workloads.NODES, strict=True):
        node.update(workloads.node_status(demo))
    nrts = {n["metadata"]["name"]: n for n in workloads.nrt_objects()}
    by_name = {w.name: w for w in workloads.workloads(REGISTRIES)}
    fits_one = decide_numa(dict(by_name["numa-fits-one"].pod), nodes, nrts, config)
    assert fits_one.needed
    assert fits_one.candidates == by_name["numa-fits-one"].expect.hostnames
    nowhere = decide_numa(dict(by_name["numa-fits-nowhere"].pod), nodes, nrts, config)
    assert nowhere.needed and nowhere.candidates == ()
    plain = decide_numa(dict(by_name["multi-arch"].pod), nodes, nrts, config)
    assert not plain.needed  # BestEffort pods are not NUMA-placed
    # second act: one zone of the freed node reports more free CPUs
    freed = dict(nrts)
    name = workloads.FREED_NODE.name
    freed[name] = {**nrts[name], **workloads.freed_capacity_patch()}
    now = decide_numa(dict(by_name[workloads.WAITING_POD].pod), nodes, freed, config)
    assert now.candidates == workloads.AFTER_FREEING.hostnames
    assert by_name[workloads.WAITING_POD].expect.waiting


def test_the_fake_arm64_node_is_tainted_only_while_the_real_arm64_node_runs() -> None:
    """Issue #41: with the emulated arm64 node, the fake ``demo-arm64`` must not take the
    pods placed on arm64 (they would never run); without it, it must (else they'd pend)."""
    by_name = {n.name: n for n in workloads.NODES}
    taint = [workloads.SIMULATED_TAINT]
    assert workloads.node_taints(by_name["demo-arm64"], True, real_arm64=True) == taint
    assert workloads.node_taints(by_name["demo-arm64"], True) is None
    assert workloads.node_taints(by_name["demo-arm64"], False) is None
    assert workloads.node_taints(by_name["demo-ppc64le"], True, real_arm64=True) is None
    assert workloads.node_taints(by_name["demo-amd64-a"], True, real_arm64=True) == taint
    # the pods placed on arm64 only tolerate no taint
    for w in workloads.workloads(REGISTRIES):
        if w.name in ("arm64-only", "multi-arch-arm64"):
            assert "tolerations" not in w.pod["spec"], w.name


def test_nodes_line_names_every_real_node() -> None:
    nodes = [{"metadata": {"name": name, "labels": {ARCH: arch}}}
             for name, arch in (("127.0.0.1", "amd64"), ("127.0.0.2", "arm64"),
                                ("demo-arm64", "arm64"))]
    assert report.nodes_line(nodes, ["127.0.0.1", "127.0.0.2"]) == (
        "nodes: real: 127.0.0.1 (amd64), 127.0.0.2 (arm64); simulated (no kubelet): "
        "demo-arm64 (arm64)")
    assert report.nodes_line(nodes, []) == (
        "nodes: real: none; simulated (no kubelet): 127.0.0.1 (amd64), 127.0.0.2 (arm64), "
        "demo-arm64 (arm64)")


def test_nrt_requires_zones() -> None:
    with pytest.raises(ValueError, match="no NUMA zones"):
        workloads.nrt_object(workloads.DemoNode("x", "arm64"))


def test_all_demo_objects_are_accepted_by_the_api_server(fresh_localkube: Any) -> None:
    kube = fresh_localkube
    kube.apply_crds()
    kube.create("/api/v1/namespaces", workloads.namespace_object())
    kube.create("/api/v1/namespaces/demo/serviceaccounts", workloads.service_account_object())
    kube.create("/api/v1/namespaces/demo/secrets", workloads.pull_secret(REGISTRIES))
    for node in workloads.node_objects():
        kube.create("/api/v1/nodes", node)
    for nrt in workloads.nrt_objects():
        kube.create("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies", nrt)
    stored = kube.create("/apis/podplacement.io/v1beta1/podplacementconfigs",
                         workloads.placement_config())
    assert stored["spec"]["topology"]["nodesWithoutTopology"] == "Deny"  # not pruned
    for w in workloads.workloads(REGISTRIES):
        pod = kube.create("/api/v1/namespaces/demo/pods", dict(w.pod))
        assert pod["status"]["phase"] == "Pending"


# --- report (pure) ------------------------------------------------------------------------


def _pod(name: str, *, images: list[str], init: list[str] | None = None,
         affinity: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
         decision: dict[str, Any] | None = None, gated: bool = False,
         node: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "demo", "labels": labels or {}}
    if decision is not None:
        meta["annotations"] = {DECISION_ANNOTATION: json.dumps(decision)}
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": im}
                                           for i, im in enumerate(images)]}
    if init:
        spec["initContainers"] = [{"name": f"i{i}", "image": im} for i, im in enumerate(init)]
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec}


def _req(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}


ARCH = "kubernetes.io/arch"
HOST = "kubernetes.io/hostname"


def _known_pods() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    set_labels = {GATE_LABEL: "removed", AFFINITY_LABEL: "set"}
    multi = _pod(
        "multi", images=["127.0.0.1:5000/demo/busybox:multi"], labels=set_labels, node="n1",
        affinity={
            **_req([{"key": ARCH, "operator": "In", "values": ["amd64", "arm64"]}]),
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "preference": {"matchExpressions": [
                    {"key": ARCH, "operator": "In", "values": ["amd64"]}]}},
                {"weight": 7, "preference": {"matchExpressions": [
                    {"key": HOST, "operator": "In", "values": ["n1"]}]}},
            ],
        },
        decision={"platforms": ["linux/amd64", "linux/arm64/v8"],
                  "numa": {"candidates": ["n1", "n2"]}},
    )
    two_terms = _pod(
        "two-terms", images=["docker.io/library/busybox:1"], init=["localhost/x:1"],
        labels=set_labels,
        affinity=_req(
            [{"key": "zone", "operator": "In", "values": ["a"]},
             {"key": ARCH, "operator": "In", "values": ["s390x"]}],
            [{"key": ARCH, "operator": "In", "values": ["s390x"]}],
        ),
        decision={"platforms": ["linux/s390x", "windows/amd64"]},
    )
    none = _pod(
        "none", images=["r:1/a/win:1"], init=["r:1/a/s390x:2"], labels=set_labels,
        affinity=_req([{"key": "podplacement.io/no-supported-platform", "operator": "Exists"}]),
        decision={"platforms": [], "images": [
            {"image": "r:1/a/s390x:2", "platforms": ["linux/s390x"]},
            {"image": "r:1/a/win:1", "platforms": ["windows/amd64"]}]},
    )
    waiting = _pod("waiting", images=["busybox"], gated=True,
                   labels={GATE_LABEL: "gated", NUMA_LABEL: "waiting"})
    fresh = _pod("fresh", images=["busybox"], gated=True, labels={GATE_LABEL: "gated"})
    events = [
        # core/v1 and events.k8s.io/v1 shapes; the same reason twice is shown once
        {"involvedObject": {"kind": "Pod", "namespace": "demo", "name": "multi"},
         "reason": "PlacementDecided", "lastTimestamp": "2026-01-01T00:00:02Z"},
        {"regarding": {"kind": "Pod", "namespace": "demo", "name": "multi"},
         "reason": "PlacementDecided", "eventTime": "2026-01-01T00:00:02.000000Z"},
        {"regarding": {"kind": "Pod", "namespace": "demo", "name": "multi"},
         "reason": "Scheduled", "eventTime": "2026-01-01T00:00:03.000000Z"},
        {"regarding": {"kind": "Pod", "namespace": "demo", "name": "none"},
         "reason": "NoSupportedPlatform", "eventTime": "2026-01-01T00:00:01.000000Z"},
        {"involvedObject": {"kind": "Pod", "namespace": "other", "name": "waiting"},
         "reason": "Elsewhere", "lastTimestamp": "2026-01-01T00:00:01Z"},
        {"involvedObject": {"kind": "Node", "namespace": "demo", "name": "waiting"},
         "reason": "NodeThing", "lastTimestamp": "2026-01-01T00:00:01Z"},
        {"regarding": {"kind": "Pod", "namespace": "demo", "name": "waiting"},
         "reason": "WaitingForNUMAResources", "eventTime": "2026-01-01T00:00:04.000000Z"},
    ]
    return [multi, two_terms, none, waiting, fresh], events


def test_rows_show_images_platforms_affinity_numa_node_and_events() -> None:
    pods, events = _known_pods()
    rows = {r.pod: r for r in report.build_rows(pods, events)}
    assert list(rows) == ["multi", "two-terms", "none", "waiting", "fresh"]
    multi = rows["multi"]
    assert multi.cells() == (
        "multi", "ungated", "demo/busybox:multi", "amd64,arm64/v8",
        "arch In [amd64,arm64]; prefer(amd64:50)", "n1,n2", "n1", "PlacementDecided, Scheduled",
    )
    two = rows["two-terms"]
    assert two.images == "init:x:1, library/busybox:1"
    assert two.platforms == "s390x,windows/amd64"
    assert two.affinity == "zone In [a] & arch In [s390x] | arch In [s390x]"
    assert (two.numa, two.node, two.events) == ("-", "-", "-")
    assert rows["none"].platforms == "none (s390x:2=s390x | win:1=windows/amd64)"
    assert rows["none"].affinity == "no-supported-platform Exists"
    assert rows["none"].events == "NoSupportedPlatform"
    waiting = rows["waiting"]
    assert (waiting.state, waiting.platforms, waiting.affinity, waiting.numa, waiting.events) == (
        "waiting", "-", "-", "waiting", "WaitingForNUMAResources")
    assert rows["fresh"].state == "gated"
    assert report.state_cell({"metadata": {"name": "x"}, "spec": {}}) == "not-gated"


def parse_table(text: str,
                headers: tuple[str, ...] = report.HEADERS) -> dict[str, dict[str, str]]:
    """Read a rendered table back: pod -> header -> cell (continuation lines joined with a
    space), slicing each line at the header's column offsets."""
    lines = text.splitlines()
    header = lines[0]
    starts = [header.index(h) for h in headers]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    table: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in lines[1:]:
        cells = [line[a:b].strip() if b else line[a:].strip() for a, b in bounds]
        if cells[0]:
            current = table.setdefault(cells[0], {})
            current.update(zip(headers, cells, strict=True))
        else:
            assert current is not None, line
            for h, cell in zip(headers, cells, strict=True):
                if cell:
                    current[h] = f"{current[h]} {cell}"
    return table


def test_table_aligns_columns_under_the_headers() -> None:
    pods, events = _known_pods()
    rows = report.build_rows(pods, events)
    text = report.render_table(rows, max_widths={})
    lines = text.splitlines()
    assert len(lines) == 1 + len(rows)
    assert lines[0].split() == list(report.HEADERS)
    starts = [lines[0].index(h) for h in report.HEADERS]
    for line, row in zip(lines[1:], rows, strict=True):
        for start, cell in zip(starts, row.cells(), strict=True):
            assert line[start:start + len(cell)] == cell
        assert line == line.rstrip()


def test_long_cells_wrap_within_their_column_and_read_back_whole() -> None:
    pods, events = _known_pods()
    rows = report.build_rows(pods, events)
    text = report.render_table(rows, max_widths={"AFFINITY": 12, "PLATFORMS": 10})
    lines = text.splitlines()
    assert len(lines) > 1 + len(rows)
    start = lines[0].index("AFFINITY")
    end = lines[0].index("NUMA")
    for line in lines[1:]:
        assert len(line[start:end].rstrip()) <= 12 or " " not in line[start:end].strip()
    parsed = parse_table(text)
    assert list(parsed) == [r.pod for r in rows]
    for row in rows:
        assert tuple(parsed[row.pod][h] for h in report.HEADERS) == row.cells()


def test_wrap_keeps_long_words_whole() -> None:
    assert report.wrap_cell("a b c", None) == ["a b c"]
    assert report.wrap_cell("abcdefgh ij", 4) == ["abcdefgh", "ij"]
    assert report.wrap_cell("ab cd ef", 5) == ["ab cd", "ef"]


def test_short_image_drops_only_a_registry_domain() -> None:
    assert report.short_image("127.0.0.1:5000/demo/busybox:multi") == "demo/busybox:multi"
    assert report.short_image("localhost/a:1") == "a:1"
    assert report.short_image("library/busybox:1") == "library/busybox:1"
    assert report.short_image("busybox") == "busybox"


def test_check_accepts_what_was_expected_and_names_every_mismatch() -> None:
    pods, _ = _known_pods()
    multi, two, none, waiting, fresh = pods
    ok = Expectation(("amd64", "arm64"))
    assert report.check(multi, ["PlacementDecided"], ok) == []
    problems = report.check(multi, [], Expectation(("s390x",), hostnames=("n9",)))
    assert any("arch requirement" in p for p in problems)
    assert any("hostname requirement" in p for p in problems)
    assert any("no PlacementDecided event" in p for p in problems)
    assert report.check(two, ["PlacementDecided"], Expectation(("s390x",))) == []
    assert report.check(none, ["NoSupportedPlatform"], Expectation(
        None, no_supported_platform=True, event="NoSupportedPlatform")) == []
    assert report.check(none, ["NoSupportedPlatform"], Expectation(
        ("amd64",), event="NoSupportedPlatform")) != []
    wait = Expectation(None, waiting=True, event="WaitingForNUMAResources")
    assert report.check(waiting, ["WaitingForNUMAResources"], wait) == []
    assert report.check(fresh, ["WaitingForNUMAResources"], wait) == [
        "expected to wait for NUMA resources, state gated"]
    assert report.check(waiting, ["WaitingForNUMAResources"], ok)[0].startswith(
        "expected to be ungated")


def test_registries_conf_marks_only_the_public_registry_insecure() -> None:
    from types import SimpleNamespace

    from podplacement.demo.install import registries_conf
    from podplacement.imageinspect import RegistriesConfig

    pair = SimpleNamespace(public=SimpleNamespace(host="127.0.0.1:5000"),
                           private=SimpleNamespace(host="127.0.0.1:5443"))
    conf = RegistriesConfig.from_toml(registries_conf(pair))  # type: ignore[arg-type]
    assert conf.is_insecure("127.0.0.1:5000")
    assert not conf.is_insecure("127.0.0.1:5443")


def test_child_that_ignores_sigterm_is_killed_and_reaped(tmp_path: Path) -> None:
    from podplacement.demo.common import start_child

    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    child = start_child("stubborn", [sys.executable, "-c", code], tmp_path)
    deadline = time.monotonic() + 30
    while "ready" not in child.tail():
        assert child.alive() and time.monotonic() < deadline
        time.sleep(0.05)
    child.stop(timeout=0.5)
    assert child.popen.returncode == -signal.SIGKILL
    assert not child.alive()
    child.stop()  # idempotent


async def test_waiting_stops_when_a_watched_process_dies(tmp_path: Path) -> None:
    from podplacement.demo.common import DemoError, start_child, wait_for

    child = start_child("short", [sys.executable, "-c", "print('bye')"], tmp_path)
    child.popen.wait(timeout=30)

    async def never() -> bool:
        return False

    with pytest.raises(DemoError, match="short exited while waiting for the moon"):
        await wait_for("the moon", never, 30.0, alive=[child])
    with pytest.raises(DemoError, match="timed out after 0 s waiting for the sun"):
        await wait_for("the sun", never, 0.0)
    child.stop()


def test_only_the_demo_namespace_is_ever_deleted() -> None:
    assert workloads.made_by_demo(workloads.namespace_object())
    assert not workloads.made_by_demo({"metadata": {"name": "demo", "labels": {}}})
    assert not workloads.made_by_demo({"metadata": {"name": "demo"}})


METRICS_TEXT = """\
# HELP podplacement_pods_processed_total Gated pods processed, by outcome
# TYPE podplacement_pods_processed_total counter
podplacement_pods_processed_total{outcome="set"} 5.0
podplacement_pods_processed_total{outcome="wait-numa"} 2.0
podplacement_pods_processed_total{outcome="retry"} 0.0
# HELP podplacement_api_requests_total Kubernetes API requests by verb and HTTP code
# TYPE podplacement_api_requests_total counter
podplacement_api_requests_total{code="200",verb="patch"} 6.0
podplacement_api_requests_total{code="422",verb="patch"} 1.0
podplacement_api_requests_total{code="200",verb="list"} 4.0
# HELP podplacement_registry_requests_total HTTP requests sent to registries
# TYPE podplacement_registry_requests_total counter
podplacement_registry_requests_total 11.0
# HELP podplacement_image_cache_hits_total Image inspections from the cache
# TYPE podplacement_image_cache_hits_total counter
podplacement_image_cache_hits_total 3.0
# HELP podplacement_ungate_seconds Seconds from pod creationTimestamp to the ungating patch
# TYPE podplacement_ungate_seconds histogram
podplacement_ungate_seconds_bucket{le="+Inf"} 4.0
podplacement_ungate_seconds_count 4.0
podplacement_ungate_seconds_sum 2.0
"""


def test_metrics_summary_reads_outcomes_verbs_registry_and_latency() -> None:
    assert report.metrics_summary(METRICS_TEXT) == (
        "pods processed set=5 wait-numa=2; API requests list=4 patch=7; "
        "registry requests 11 (image cache 3 hits, 0 misses); creation to ungate 0.50 s mean"
    )
    assert report.metrics_summary("") == ""
    assert report.metrics_summary(
        "# TYPE podplacement_registry_requests_total counter\n"
        "podplacement_registry_requests_total 2\n"
    ) == "registry requests 2 (image cache 0 hits, 0 misses)"


# --- the whole demo -----------------------------------------------------------------------

DEMO_PIECES = ("localkube.__main__", "podplacement.webhook.cli", "podplacement.controller.cli",
               "podplacement.certs.cli", "podplacement.imageinspect",
               "podplacement.rules.numa")


def _debs_dir() -> Path | None:
    from podplacement.demo.images import user_cache_dir

    candidates = [os.environ.get("PODPLACEMENT_DEMO_DEBS"), str(REPO / ".demo-cache" / "debs"),
                  str(user_cache_dir() / "debs")]
    for c in candidates:
        if c and list(Path(c).glob("busybox-static_*_s390x.deb")):
            return Path(c)
    return None


def _processes_with_marker(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker.encode() in environ:
            found.append(f"{proc.name}: {cmdline}")
    return found


def _demo_env(marker: str) -> dict[str, str]:
    return {**os.environ, "PODPLACEMENT_DEMO_TEST_MARKER": marker}


def _demo_cmd(debs: Path, api_server: str = "localkube") -> list[str]:
    return [sys.executable, "-m", "podplacement", "--log-format", "text", "demo", "--debs",
            str(debs), "--no-download", "--api-server", api_server]


def _assert_cleaned_up(marker: str, stderr: str) -> None:
    leftovers = _processes_with_marker(marker)
    assert leftovers == [], f"processes left running: {leftovers}"
    work = re.search(r"work directory (\S+)", stderr)
    assert work is not None, stderr
    assert not Path(work.group(1)).exists()


def test_without_real_binaries_the_first_line_says_localkube_and_how_to_get_them(
        tmp_path: Path) -> None:
    broken = tmp_path / "debs"
    broken.mkdir()
    (broken / "busybox-static_1_amd64.deb").write_bytes(b"not a package")
    marker = f"demo-test-{uuid.uuid4().hex}"
    env = {**_demo_env(marker), "PODPLACEMENT_K8S_BIN": str(tmp_path / "no-k8s-bin"),
           "PODPLACEMENT_CACHE": str(tmp_path / "empty-cache")}
    env.pop("KUBEBUILDER_ASSETS", None)
    proc = subprocess.run(_demo_cmd(broken, "auto"), capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120, check=False)
    first = proc.stderr.splitlines()[0]
    assert "API server: localkube, the API double, not the real control plane" in first
    assert "KUBEBUILDER_ASSETS" in first and "shared/k8s-bin" in first and "to get one" in first
    # the package that is not one fails the run, which stops what it started
    assert proc.returncode == 2, proc.stderr
    assert "dpkg-deb could not read" in proc.stderr
    assert proc.stdout == ""
    _assert_cleaned_up(marker, proc.stderr)


def test_real_required_but_not_found_fails_with_the_reason(tmp_path: Path) -> None:
    env = {**_demo_env("unused"), "PODPLACEMENT_K8S_BIN": str(tmp_path / "none"),
           "PODPLACEMENT_CACHE": str(tmp_path / "empty-cache")}
    env.pop("KUBEBUILDER_ASSETS", None)
    proc = subprocess.run(_demo_cmd(tmp_path, "real"), capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "demo failed: --api-server real: no control plane" in proc.stderr


def test_in_a_checkout_the_demo_starts_localkube_through_its_imported_entry_point(
        tmp_path: Path) -> None:
    """The fallback of a source checkout: podplacement.demo.apidouble builds the command from
    localkube's imported entry point; the process serves the demo's CRDs on 127.0.0.1."""
    import httpx
    import yaml

    from podplacement.demo import apidouble, cluster, common
    from podplacement.rules.config import API_VERSION, CONFIG_PLURAL

    assert apidouble.localkube_available()
    command = apidouble.localkube_command(tmp_path / "kc", common.CRD_FILES)
    assert command[1:3] == ["-m", "localkube"]
    server = cluster.start_localkube(tmp_path, tmp_path / "logs")
    try:
        assert server.kind == "localkube" and not server.scheduler
        kubeconfig = yaml.safe_load(server.kubeconfig.read_text())
        url = kubeconfig["clusters"][0]["cluster"]["server"]
        assert url.startswith("http://127.0.0.1:"), url
        got = httpx.get(f"{url}/apis/{API_VERSION}/{CONFIG_PLURAL}", timeout=10)
        assert got.status_code == 200, got.text
        assert got.json()["items"] == []
    finally:
        assert server.stop is not None
        server.stop()
    assert server.child is not None and not server.child.alive()


# --- busybox binaries: packages, downloads, stand-ins ----------------------------------


def test_missing_packages_are_downloaded_then_stood_in_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from podplacement.demo import images

    asked: list[list[str]] = []
    source = _debs_dir()

    def fetch(deb_dir: Path, archs: list[str]) -> str:
        asked.append(list(archs))
        if source is not None:  # "downloads" arm64 only
            shutil.copy(next(source.glob("busybox-static_*_arm64.deb")), deb_dir)
        return "E: Unable to locate package busybox-static:s390x"

    caplog.set_level("WARNING", logger="podplacement.demo")
    got = images.prepare_busybox(tmp_path, fetch=fetch)
    assert asked == [["amd64", "arm64", "ppc64el", "s390x"]]
    assert set(got) == {"amd64", "arm64", "ppc64le", "s390x"}
    for arch, binary in got.items():
        real = arch == "arm64" and source is not None
        assert binary.source.startswith("busybox-static_") if real else (
            binary.source == "stand-in"), (arch, binary.source)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "generated stand-in" in warning and "Unable to locate package" in warning
    assert "dpkg --add-architecture" in warning


#: ELF e_machine by architecture (System V gABI), written out here rather than imported.
ELF = {"amd64": 62, "arm64": 183, "ppc64le": 21, "s390x": 22}


@pytest.mark.parametrize("arch", sorted(ELF))
def test_a_stand_in_is_a_static_elf_executable_of_its_architecture(arch: str,
                                                                   tmp_path: Path) -> None:
    from podplacement.demo import images

    binary = images.standin_binary(arch)
    assert images.elf_machine(binary) == ELF[arch]
    readelf = shutil.which("readelf")
    if readelf:
        path = tmp_path / arch
        path.write_bytes(binary)
        out = subprocess.run([readelf, "-h", "-l", str(path)], capture_output=True, text=True,
                             check=True).stdout
        assert "EXEC (Executable file)" in out and "LOAD" in out
    if arch == "amd64" and os.uname().machine == "x86_64":
        path = tmp_path / "run"
        path.write_bytes(binary)
        path.chmod(0o755)
        assert subprocess.run([str(path)], check=False, timeout=10).returncode == 0


def test_no_download_means_no_apt_get(tmp_path: Path) -> None:
    from podplacement.demo import images

    def fetch(deb_dir: Path, archs: list[str]) -> str:
        raise AssertionError("asked to download")

    got = images.prepare_busybox(tmp_path, download=False, fetch=fetch)
    assert {b.source for b in got.values()} == {"stand-in"}


def _skip_unless_demo_can_run() -> Path:
    debs = _debs_dir()
    if debs is None:
        pytest.skip("busybox-static .debs not found: run hack/fetch-debs.sh (fills "
                    ".demo-cache/debs) or podplacement demo once, or set PODPLACEMENT_DEMO_DEBS")
    missing = [m for m in DEMO_PIECES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"demo pieces not importable yet: {', '.join(missing)}")
    if shutil.which("dpkg-deb") is None or not Path("/usr/bin/docker-registry").exists():
        pytest.skip("dpkg-deb or /usr/bin/docker-registry missing (hack/setup.sh installs them)")
    return debs


@pytest.mark.slow
def test_ctrl_c_stops_everything_the_demo_started(tmp_path: Path) -> None:
    debs = _skip_unless_demo_can_run()
    marker = f"demo-test-{uuid.uuid4().hex}"
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen(_demo_cmd(debs), stdout=subprocess.DEVNULL, stderr=err,
                                cwd=REPO, env=_demo_env(marker))
        try:
            deadline = time.monotonic() + 120
            # Early enough that the demo is still running: with placement at admission it
            # finishes about 3 s after the controller starts.
            while "started webhook" not in err_path.read_text():
                assert proc.poll() is None, err_path.read_text()
                assert time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = err_path.read_text()
    assert code == 130, stderr
    assert "interrupted; stopping everything" in stderr
    _assert_cleaned_up(marker, stderr)


#: The real nodes' names (:mod:`podplacement.sandbox.realnode`).
REAL_NODE = "127.0.0.1"
REAL_ARM64_NODE = "127.0.0.2"
#: The pods placed on arm64 only (the emulated arm64 node runs them).
ARM64_PODS = ("arm64-only", "multi-arch-arm64")


def _check_demo_output(out: str, *, scheduler: bool, real_node: bool = False,
                       real_arm64: bool = False) -> None:
    """The table and summary of a full demo run on the demo's fake cluster; with a
    ``real_node``, the pods bound to it run and their log lines are shown; with
    ``real_arm64`` (issue #41) the pods placed on arm64 run on the emulated arm64 node
    (``uname -m``: ``aarch64``), the multi-arch image's on both real nodes."""
    table_text = out.split("\n\n", 1)[0]
    assert table_text.splitlines()[0].split() == list(report.HEADERS)
    table = parse_table(table_text)
    all_archs = "arch In [amd64,arm64,ppc64le,s390x] & os In [linux]"
    prefer = "prefer(amd64:50,arm64:30)"
    expected = {
        "multi-arch": {"IMAGES": "demo/busybox:multi", "PLATFORMS": "amd64,arm64,ppc64le,s390x",
                       "AFFINITY": f"{all_archs}; {prefer}", "NUMA": "-",
                       "EVENTS": "PlacementDecided"},
        "single-arch": {"PLATFORMS": "s390x", "AFFINITY": "arch In [s390x] & os In [linux]",
                        "EVENTS": "PlacementDecided"},
        "arm64-only": {"IMAGES": "demo/busybox:arm64", "PLATFORMS": "arm64",
                       "AFFINITY": "arch In [arm64] & os In [linux]; prefer(arm64:30)",
                       "EVENTS": "PlacementDecided"},
        # its own nodeSelector kubernetes.io/arch=arm64 decides the architecture
        "multi-arch-arm64": {"IMAGES": "demo/busybox:multi",
                             "PLATFORMS": "amd64,arm64,ppc64le,s390x",
                             "AFFINITY": "os In [linux]", "EVENTS": "PlacementDecided"},
        "mixed-init": {"IMAGES": "init:demo/busybox:list, demo/busybox:multi",
                       "PLATFORMS": "amd64,arm64",
                       "AFFINITY": f"arch In [amd64,arm64] & os In [linux]; {prefer}"},
        "no-common-platform": {
            "PLATFORMS": "none (busybox:s390x=s390x | winonly:1=windows/amd64)",
            "AFFINITY": "no-supported-platform Exists", "EVENTS": "NoSupportedPlatform"},
        "private-image": {"IMAGES": "private/busybox:1", "PLATFORMS": "amd64,arm64",
                          "AFFINITY": f"arch In [amd64,arm64] & os In [linux]; {prefer}"},
        "numa-fits-one": {
            "AFFINITY": f"{all_archs} & hostname In [demo-amd64-b]; {prefer}",
            "NUMA": "demo-amd64-b", "EVENTS": "PlacementDecided"},
        "numa-fits-nowhere": {"STATE": "waiting", "AFFINITY": "-", "NUMA": "waiting",
                              "EVENTS": "WaitingForNUMAResources"},
    }
    nodes_by_arch: dict[str, set[str]] = {}
    for n in workloads.NODES:
        # with a real node, the NUMA nodes are tainted for the NUMA pods only, and with the
        # real arm64 node the fake arm64 one
        if not (real_node and n.zones) and not (real_arm64 and n.architecture == "arm64"):
            nodes_by_arch.setdefault(n.architecture, set()).add(n.name)
    if real_node:
        nodes_by_arch["amd64"] = {REAL_NODE}
    if real_arm64:
        nodes_by_arch["arm64"] = {REAL_ARM64_NODE}
    # where a scheduler may bind each pod (its required affinity), "-" when it cannot
    bindable = {
        "multi-arch": set().union(*nodes_by_arch.values()),
        "single-arch": nodes_by_arch["s390x"],
        "arm64-only": nodes_by_arch["arm64"],
        "multi-arch-arm64": nodes_by_arch["arm64"],
        "mixed-init": nodes_by_arch["amd64"] | nodes_by_arch["arm64"],
        "no-common-platform": {"-"},
        "private-image": nodes_by_arch["amd64"] | nodes_by_arch["arm64"],
        "numa-fits-one": {"demo-amd64-b"},
        "numa-fits-nowhere": {"-"},
    }
    assert list(table) == list(expected)
    for pod, cells in expected.items():
        row = table[pod]
        assert row["STATE"] == cells.get("STATE", "ungated"), row
        if scheduler:
            assert row["NODE"] in bindable[pod], row
        else:
            assert row["NODE"] == "-", row
        for header, value in cells.items():
            if header == "EVENTS" and scheduler:  # Scheduled/FailedScheduling come too
                assert value in row[header].split(", "), row
            else:
                assert row[header] == value, f"{pod} {header}: {row[header]!r} != {value!r}"
    assert "9 of 9 workloads placed as expected" in out
    why = out.split("why numa-fits-nowhere waits (podplacement explain):\n", 1)
    assert len(why) == 2, out
    assert "demo-amd64-b" in why[1].split("\n\n\n", 1)[0]
    assert f"scheduler: {'yes' if scheduler else 'no'})" in out

    second = out.split(" free CPUs (NodeResourceTopology update):\n", 1)
    assert len(second) == 2, out
    freed = parse_table(second[1].split("\n\n", 1)[0])["numa-fits-nowhere"]
    host = workloads.FREED_NODE.name
    assert freed["STATE"] == "ungated", freed
    assert freed["AFFINITY"] == f"{all_archs} & hostname In [{host}]; {prefer}"
    assert freed["NUMA"] == host
    assert freed["NODE"] == (host if scheduler else "-")
    assert {"WaitingForNUMAResources", "PlacementDecided"} <= set(freed["EVENTS"].split(", "))
    assert "numa-fits-nowhere    placed once a zone can hold it: ok" in out

    nodes = re.search(r"^nodes: real: (.*?); simulated \(no kubelet\): (.*)$", out, re.M)
    assert nodes is not None, out
    assert nodes.group(1) == (", ".join(
        [f"{REAL_NODE} (amd64)"] * real_node + [f"{REAL_ARM64_NODE} (arm64)"] * real_arm64
    ) or "none")
    assert {n.name for n in workloads.NODES} == {
        x.split(" (")[0] for x in nodes.group(2).split(", ")}
    running = out.split("(phase, first line of their log):\n")
    assert len(running) == 1 + real_node + real_arm64, out
    real = [(REAL_NODE, "amd64", "x86_64")] * real_node + [
        (REAL_ARM64_NODE, "arm64", "aarch64")] * real_arm64
    for (node, arch, machine), text in zip(real, running[1:], strict=True):
        # the pods bound to each real node run their own entry and say so in their log
        assert f"on the real {arch} node {node} (" in running[0 if arch == "amd64" else 1], out
        rows = parse_table(text.split("\n\n", 1)[0], report.RUN_HEADERS)
        on_real = [name for name, row in table.items() if row["NODE"] == node]
        assert on_real and sorted(rows) == sorted(on_real), (rows, on_real)
        for name, row in rows.items():
            assert (row["NODE"], row["PHASE"], row["LOG"]) == (
                node, "Running", f"{name}: busybox on {machine}"), row
            assert f"{name:<20} runs on the real node: ok" in out
        if arch == "arm64":  # the arm64-only image, and the multi-arch image on both nodes
            assert set(rows) == set(ARM64_PODS), rows
            assert table["multi-arch"]["NODE"] == REAL_NODE
    if not real:
        assert "runs on the real node" not in out
    assert out.rstrip().splitlines()[-1] == "real nodes: " + (
        ", ".join(arch for _, arch, _ in real) or "none")

    metrics = re.search(r"^controller: pods processed (.*?);", out, re.M)
    assert metrics is not None, out
    outcomes = dict(kv.split("=") for kv in metrics.group(1).split())
    # five pods placed at once, the waiting one after the NRT update (a decision retried
    # after a conflicting write may count twice)
    assert int(outcomes["set"]) >= 6 and int(outcomes["no-supported-platform"]) >= 1, outcomes
    assert int(outcomes["wait-numa"]) >= 1


@pytest.mark.slow
def test_demo_runs_end_to_end_and_leaves_nothing_running() -> None:
    debs = _skip_unless_demo_can_run()
    marker = f"demo-test-{uuid.uuid4().hex}"
    proc = subprocess.run(_demo_cmd(debs), capture_output=True, text=True, cwd=REPO,
                          env=_demo_env(marker), timeout=240, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    _assert_cleaned_up(marker, proc.stderr)
    _check_demo_output(proc.stdout, scheduler=False)
    assert proc.stderr.rstrip().splitlines()[-1].endswith("; real nodes: none")


@pytest.mark.slow
@pytest.mark.realcluster
def test_demo_on_the_real_control_plane_binds_pods_where_they_can_run() -> None:
    try:
        assets = locate_assets()
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    debs = _skip_unless_demo_can_run()
    marker = f"demo-test-{uuid.uuid4().hex}"
    # found by itself, as a newcomer runs it: no KUBEBUILDER_ASSETS needed
    proc = subprocess.run(_demo_cmd(debs, "auto"), capture_output=True, text=True, cwd=REPO,
                          env=_demo_env(marker), timeout=300, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "API server: the real control plane" in proc.stderr.splitlines()[0]
    _assert_cleaned_up(marker, proc.stderr)
    real_node = missing_real_node() is None
    real_arm64 = real_node and missing_arm64_node() is None
    last = proc.stderr.rstrip().splitlines()[-1]
    archs = ["amd64"] * real_node + ["arm64"] * real_arm64
    assert last.endswith(f"; real nodes: {', '.join(archs) or 'none'}"), last
    if not real_node:  # one line says why
        assert len([line for line in proc.stderr.splitlines()
                    if "real node: none" in line]) == 1, proc.stderr
    if real_node and not real_arm64:  # one line says why, and the demo goes on
        assert len([line for line in proc.stderr.splitlines()
                    if "arm64 node: none" in line]) == 1, proc.stderr
    _check_demo_output(proc.stdout, scheduler=assets.binary("kube-scheduler") is not None,
                       real_node=real_node, real_arm64=real_arm64)
    # every component's start and stop is logged, and the API server stops within seconds
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager",
                 "webhook", "controller"):
        assert f"started {name} (pid " in proc.stderr and f"stopped {name} (pid " in proc.stderr
    stop = re.search(r"stopped kube-apiserver \(pid \d+, exit code (\S+), ([\d.]+) s\)",
                     proc.stderr)
    assert stop is not None and stop.group(1) == "0" and float(stop.group(2)) < 5, proc.stderr
    # the sample run of docs/guide/demo.md is this one: its verdicts and explain's reasons
    # are printed
    page = (REPO / "docs" / "guide" / "demo.md").read_text()
    sample = page.split("A run looks like this", 1)[1].split("```", 2)[1]
    claims = [line.strip() for line in sample.splitlines()
              if ("cannot align" in line or " of 9 workloads placed" in line
                  or line.endswith(": ok"))
              and (real_node or "on the real node" not in line)
              and (real_arm64 or "on the real node" not in line
                   or line.split()[0] not in ARM64_PODS)]
    assert len(claims) >= 10, sample
    printed = {" ".join(line.split()) for line in proc.stdout.splitlines()}
    for claim in claims:
        assert " ".join(claim.split()) in printed, f"docs/guide/demo.md claims {claim!r}"


@pytest.mark.slow
def test_existing_cluster_mode_fakes_nothing_and_deletes_its_namespace(
    fresh_localkube: Any,
) -> None:
    debs = _skip_unless_demo_can_run()
    kube = fresh_localkube
    # "installed": the config exists, but no webhook or controller runs for this cluster
    kube.create("/apis/podplacement.io/v1beta1/podplacementconfigs",
                workloads.placement_config())
    marker = f"demo-test-{uuid.uuid4().hex}"
    proc = subprocess.run(
        [*_demo_cmd(debs), "--kubeconfig", str(kube.kubeconfig), "--timeout", "5"],
        capture_output=True, text=True, cwd=REPO, env=_demo_env(marker), timeout=180,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    table = parse_table(proc.stdout.split("\n\n", 1)[0])
    assert list(table) == [w.name for w in workloads.workloads(REGISTRIES)]
    assert {row["STATE"] for row in table.values()} == {"not-gated"}
    assert "0 of 9 workloads decided (API server: existing" in proc.stdout
    assert kube.get("/api/v1/nodes")["items"] == []
    nrts = kube.get("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies")
    assert nrts["items"] == []
    gone = kube.request("GET", "/api/v1/namespaces/demo")
    assert gone.status_code == 404 or gone.json()["metadata"].get("deletionTimestamp")
    _assert_cleaned_up(marker, proc.stderr)


@pytest.mark.slow
def test_existing_cluster_mode_never_touches_a_foreign_demo_namespace(
    fresh_localkube: Any,
) -> None:
    debs = _skip_unless_demo_can_run()
    kube = fresh_localkube
    kube.create("/apis/podplacement.io/v1beta1/podplacementconfigs",
                workloads.placement_config())
    kube.ensure_namespace("demo", {"team": "someone-else"})
    marker = f"demo-test-{uuid.uuid4().hex}"
    proc = subprocess.run(
        [*_demo_cmd(debs), "--kubeconfig", str(kube.kubeconfig)],
        capture_output=True, text=True, cwd=REPO, env=_demo_env(marker), timeout=180,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "namespace demo exists and was not created by the demo" in proc.stderr
    ns = kube.get("/api/v1/namespaces/demo")
    assert ns["metadata"]["labels"]["team"] == "someone-else"
    assert not ns["metadata"].get("deletionTimestamp")
    assert kube.get("/api/v1/namespaces/demo/pods")["items"] == []
    _assert_cleaned_up(marker, proc.stderr)
