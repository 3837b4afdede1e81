"""The Node informer's transform (:func:`rules.nodeview.node_view`): it keeps every
field the controller's readers of Nodes read, and the decisions made on its views are the
decisions made on full kubelet Nodes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from podplacement.controller.admissionfeed import _platform_labels
from podplacement.controller.execformatmonitor import ExecFormatMonitor
from podplacement.controller.gatedpods import forget_topology
from podplacement.imageinspect import ImageInfo, Platform
from podplacement.kubeclient import object_key
from podplacement.rules.config import SCHEDULING_GATE, PlacementConfig, TopologyConfig
from podplacement.rules.monitor.escape import classify
from podplacement.rules.monitor.explain import explain
from podplacement.rules.nodeview import NODE_FIELDS, node_view
from podplacement.rules.numa import TopologyCache, decide_numa
from podplacement.rules.place.placement import PlacementInputs
from podplacement.rules.place.plan import plan
from podplacement.rules.platforms import node_inventory
from podplacement.rules.podspec import node_eligible, node_ineligibility
from tests.controller.numa._build import gpod, nrt

IMAGE = "example.test/app:1"
AMD_ARM = ImageInfo(IMAGE, "sha256:" + "a" * 64, "application/vnd.oci.image.index.v1+json",
                    (Platform("linux", "amd64"), Platform("linux", "arm64", "v8")))
NUMA = PlacementConfig(topology=TopologyConfig(enabled=True))
#: resourceVersions unique in the process: the NUMA parse cache is keyed by name and
#: resourceVersion, so a node read before would not be read again.
_RV = itertools.count(10**9)


def kubelet_node(name: str, arch: str = "amd64", os: str = "linux", *, cpu: str = "16",
                 pool: str = "a", hostname: str | None = None) -> dict[str, Any]:
    """A Node with everything a kubelet and the control plane put on one."""
    now = "2026-11-27T10:00:00Z"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": f"uid-{name}", "resourceVersion": str(next(_RV)),
            "creationTimestamp": now, "generation": 1,
            "labels": {"kubernetes.io/arch": arch, "kubernetes.io/os": os,
                       "kubernetes.io/hostname": hostname or name, "node-pool": pool,
                       "beta.kubernetes.io/arch": arch},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "time": now, "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {"f:images": {}}}}],
            "finalizers": ["example.test/keep"],
        },
        "spec": {"podCIDR": "10.64.0.0/24", "podCIDRs": ["10.64.0.0/24"],
                 "providerID": f"aws:///region-1a/i-{name}", "unschedulable": False,
                 "taints": [{"key": "example.test/dedicated", "value": "x",
                             "effect": "PreferNoSchedule"},
                            *([{"key": "kubernetes.io/arch", "value": arch,
                                "effect": "NoSchedule"}] if arch != "amd64" else [])]},
        "status": {
            "capacity": {"cpu": cpu, "memory": "64Gi", "pods": "110",
                         "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": cpu, "memory": "60Gi", "pods": "110",
                            "ephemeral-storage": "90Gi", "example.test/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "0" * 32, "kernelVersion": "6.1.0",
                         "containerRuntimeVersion": "containerd://1.7.24",
                         "kubeletVersion": "v1.36.2", "operatingSystem": os,
                         "architecture": arch},
            "images": [{"names": [f"registry.example.test/app{j}:v{j}"], "sizeBytes": 10**7}
                       for j in range(5)],
            "volumesInUse": [], "phase": "Running",
        },
    }


class Recording(dict[str, Any]):
    """A dict that records, into ``reads``, the path of every key read through it (``*``
    for iteration over all its keys); nested dicts record too."""

    def __init__(self, data: dict[str, Any], reads: set[tuple[str, ...]],
                 path: tuple[str, ...] = ()) -> None:
        super().__init__(data)
        self._reads = reads
        self._path = path

    def _wrap(self, key: str, value: Any) -> Any:
        if isinstance(value, dict) and not isinstance(value, Recording):
            value = Recording(value, self._reads, (*self._path, key))
            dict.__setitem__(self, key, value)
        return value

    def __getitem__(self, key: str) -> Any:
        self._reads.add((*self._path, key))
        return self._wrap(key, dict.__getitem__(self, key))

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._reads.add((*self._path, key))
        return self._wrap(key, dict.__getitem__(self, key)) if dict.__contains__(self, key) \
            else default

    def __contains__(self, key: object) -> bool:
        self._reads.add((*self._path, str(key)))
        return dict.__contains__(self, key)

    def __iter__(self) -> Iterator[str]:
        self._reads.add((*self._path, "*"))
        return dict.__iter__(self)

    def keys(self) -> Any:
        self._reads.add((*self._path, "*"))
        return dict.keys(self)

    def items(self) -> Any:
        self._reads.add((*self._path, "*"))
        return [(k, self._wrap(k, v)) for k, v in dict.items(self)]

    def values(self) -> Any:
        self._reads.add((*self._path, "*"))
        return [self._wrap(k, v) for k, v in dict.items(self)]


def _kept(path: tuple[str, ...]) -> bool:
    """A read of ``path`` reads a kept field: inside one, or a container on the way to one."""
    return any(path[:len(field)] == field for field in NODE_FIELDS) or any(
        field[:len(path) - 1] == path[:-1] and path[-1] in (field[len(path) - 1], "*")
        for field in NODE_FIELDS if len(field) >= len(path))


def _cluster() -> list[dict[str, Any]]:
    return [kubelet_node("big", cpu="32", hostname="big.example"), kubelet_node("small"),
            kubelet_node("pi", arch="arm64", pool="b"), kubelet_node("ibm", arch="s390x"),
            kubelet_node("win", os="windows")]


def _nrts() -> dict[str, dict[str, Any]]:
    return {"big": nrt("big", [{"cpu": 16, "memory": "30Gi"}, {"cpu": 4, "memory": "30Gi"}],
                       rv=str(next(_RV))),
            "small": nrt("small", [{"cpu": 8, "memory": "30Gi"}, {"cpu": 6, "memory": "30Gi"}],
                         rv=str(next(_RV))),
            "pi": nrt("pi", [{"cpu": 10, "memory": "8Gi"}], scope="pod", rv=str(next(_RV)))}


def _pods() -> list[dict[str, Any]]:
    plain = gpod("6", "1Gi", name="web", namespace="shop")
    pinned = gpod("2", "1Gi", {"example.test/gpu": "1"}, name="gpu", namespace="shop")
    pinned["spec"]["nodeSelector"] = {"node-pool": "a"}
    for p in (plain, pinned):
        p["spec"]["containers"][0]["image"] = IMAGE
        p["metadata"]["creationTimestamp"] = "2026-11-27T10:00:00Z"
    return [plain, pinned]


def test_view_keeps_only_what_the_controller_reads() -> None:
    full = kubelet_node("n1")
    view = node_view(full)
    meta = full["metadata"]
    assert view == {"metadata": {"name": "n1", "resourceVersion": meta["resourceVersion"],
                                 "labels": meta["labels"]},
                    "status": {"allocatable": full["status"]["allocatable"]}}
    arm = kubelet_node("a1", arch="arm64")
    assert node_view(arm)["spec"] == {"taints": [
        {"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoSchedule"}]}
    assert node_view({}) == {"metadata": {}}
    assert node_view({"metadata": "odd", "status": ["odd"]}) == {"metadata": {}}
    assert node_view({"metadata": {"name": "x", "namespace": "ns"}}) == {
        "metadata": {"name": "x", "namespace": "ns"}}


def test_every_field_the_node_readers_read_is_kept() -> None:
    """Each reader of the Node informer's objects runs over full Nodes that record what is
    read: every field read must be one :func:`node_view` keeps (a new read of, say,
    ``spec.taints`` fails here until NODE_FIELDS keeps it)."""
    reads: set[tuple[str, ...]] = set()
    nodes = [Recording(n, reads) for n in _cluster()]
    images: dict[str, Any] = {IMAGE: AMD_ARM}
    for pod in _pods():
        selector = pod["spec"].get("nodeSelector") or {}
        for node in nodes:
            node_eligible(node, selector, {("linux", "amd64")})
            node_ineligibility(node, selector, {("linux", "amd64")})
        plan(PlacementInputs(pod, images, NUMA), nodes=nodes, nrts=_nrts(), now=1.8e9)
        decide_numa(pod, nodes, _nrts(), NUMA.topology, cache=TopologyCache(), reference=True)
        decide_numa(pod, nodes, _nrts(), NUMA.topology, cache=TopologyCache())
        explain(pod, nodes, _nrts(), images, NUMA)
        bound = {**pod, "spec": {**pod["spec"], "nodeName": "pi"}}
        classify(bound, nodes[2], images)
    node_inventory(nodes)
    by_name = {str(dict.__getitem__(n, "metadata")["name"]): n for n in nodes}
    monitor: Any = SimpleNamespace(nodes=SimpleNamespace(get=by_name.get))
    assert ExecFormatMonitor._node_platform(monitor, "pi") == ("linux", "arm64")
    for node in nodes:
        _platform_labels(node)
        object_key(node)
        forget_topology(node)
    # the recorder saw the readers' reads (so this test can fail)
    assert {("metadata", "labels", "node-pool"), ("status", "allocatable", "*"),
            ("metadata", "resourceVersion"), ("metadata", "name")} <= reads
    assert sorted(p for p in reads if not _kept(p)) == []


def test_a_dropped_field_is_caught_by_the_recorder() -> None:
    """The check above fails for a read outside the kept fields."""
    reads: set[tuple[str, ...]] = set()
    node = Recording(kubelet_node("n1"), reads)
    assert node["spec"].get("podCIDR")
    assert sorted(p for p in reads if not _kept(p)) == [("spec", "podCIDR")]


def test_decisions_on_views_are_the_decisions_on_full_nodes() -> None:
    images: dict[str, Any] = {IMAGE: AMD_ARM}
    for pod in _pods():
        full = _cluster()
        views = [node_view(n) for n in _cluster()]  # fresh resourceVersions: parsed again
        for config in (NUMA, PlacementConfig()):
            assert explain(pod, views, _nrts(), images, config, now=1.8e9) == \
                explain(pod, full, _nrts(), images, config, now=1.8e9)
            assert plan(
                PlacementInputs(pod, images, config),
                nodes=views, nrts=_nrts(), now=1.8e9,
            ) == \
                plan(PlacementInputs(pod, images, config), nodes=full, nrts=_nrts(), now=1.8e9)
        assert node_inventory(views) == node_inventory(full)
        # the arm64 and s390x nodes' architecture taints reach the decision from the views
        gated = {"metadata": {**pod["metadata"], "resourceVersion": "1"},
                 "spec": {**pod["spec"], "schedulingGates": [{"name": SCHEDULING_GATE}]}}
        tolerated = plan(
            PlacementInputs(gated, images, PlacementConfig()),
            nodes=views, nrts={}, now=1.8e9,
        )
        assert [t["value"] for t in tolerated.tolerations] == ["arm64"]
        bound = {**pod, "spec": {**pod["spec"], "nodeName": "ibm"}}
        assert classify(bound, views[3], images) == classify(bound, full[3], images)
