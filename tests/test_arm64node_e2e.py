"""Pods that really run on arm64: the emulated arm64 node (:func:`podplacement.sandbox.
realnode.start_real_node` with ``arch="arm64"``: Debian's arm64 containerd under
qemu-user, containers in a user namespace whose own ``binfmt_misc`` runs arm64 programs,
x86 programs refused with ``exec format error`` by the exec guard) beside the real amd64
node, with podplacement installed from deploy/ on the real control plane. The only other
nodes are fake ppc64le, s390x and Windows ones: an arm64 pod can only go to the emulated
node.

Issue #41, items 2 and 3: an arm64-only image runs there (``uname -m`` says ``aarch64``);
a multi-arch image runs its own entry on each node; the lying image's replacement replica
(placed arm64-only once the lie is learned on the amd64 node) is Running there; an image
whose linux/arm64 entry holds x86-64 programs, on the arm64 node by the pod's own
``nodeSelector`` or ``nodeName``, fails with runc's words; the placed pod is detected and
(digest, linux/arm64) learned.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.rules.config import DECISION_ANNOTATION, EXEC_FORMAT_LABEL
from podplacement.sandbox.oci import layer_tar
from podplacement.sandbox.product import Product, install_manifests, start_product
from podplacement.sandbox.realnode import ARM64_NODE_NAME, NODE_NAME
from tests.harness.oci import Pusher
from tests.harness.realcluster import NO_STAND_DOWN, REPO, checked_namespace
from tests.harness.realnode import NodeCluster, busybox_layer, cluster_with_real_node, wait_for
from tests.harness.registry import Registry

pytestmark = [pytest.mark.realcluster, pytest.mark.realnode]

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
SCRIPT = "echo running on $(uname -m); sleep 3600"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[NodeCluster]:
    gen = cluster_with_real_node(tmp_path_factory, "arm64node-e2e", registries=(registry,),
                                 arm64=True)
    cluster = next(gen)
    try:
        assert cluster.kube.plane is not None
        install_manifests(cluster.kube.plane, REPO / "deploy")
        yield cluster
    finally:
        gen.close()


@pytest.fixture(scope="module")
def product(nodes: NodeCluster, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    assert nodes.kube.plane is not None
    options = ["--insecure-registry", registry.host]
    prod = start_product(nodes.kube.plane, tmp_path_factory.mktemp("arm64node-product"),
                         controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


@pytest.fixture
def ns(nodes: NodeCluster, product: Product) -> Iterator[str]:
    yield from checked_namespace(nodes.kube, "a64")


def _index(pusher: Any, registry: Registry, name: str, binaries: dict[str, str]) -> str:
    """``HOST/arm64node/NAME-RANDOM:v1``: an index with one entry per key of ``binaries``
    whose ``bin/busybox`` is Debian's busybox of the value's architecture."""
    p: Pusher = pusher(registry)
    repo = f"arm64node/{name}-{uuid.uuid4().hex[:6]}"
    build = {"etc/build-id": uuid.uuid4().hex.encode()}
    children = []
    for arch, binary_arch in binaries.items():
        img = p.image(repo, None, architecture=arch, fmt="oci",
                      layers=[busybox_layer(binary_arch), layer_tar(build)],
                      process={"Entrypoint": ["/bin/sh", "-c"], "Cmd": [SCRIPT]})
        children.append((img, {"os": "linux", "architecture": arch}))
    p.index(repo, "v1", children)
    return f"{registry.host}/{repo}:v1"


def _pod_spec(image: str, **extra: Any) -> dict[str, Any]:
    return {"terminationGracePeriodSeconds": 0, "containers": [{
        "name": "app", "image": image, "terminationMessagePolicy": "FallbackToLogsOnError"}],
            **extra}


def _pods(cluster: NodeCluster, ns: str, app: str) -> list[dict[str, Any]]:
    items = cluster.kube.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _pod(cluster: NodeCluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")


def _archs(pod: dict[str, Any]) -> set[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {v for t in terms for e in t["matchExpressions"]
            if e["key"] == "kubernetes.io/arch" for v in e["values"]}


def _running_log(cluster: NodeCluster, ns: str, name: str) -> str:
    """Wait until the pod is Running with a first log line and no restart; returns that
    line (the pod's status and previous log in the message when it does not come)."""
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    try:
        wait_for(lambda: (s := _pod(cluster, ns, name)["status"]).get("phase") == "Running"
                 and all(c.get("restartCount") == 0 and c.get("ready")
                         for c in s.get("containerStatuses") or [{}]), 120, every=0.5)
        text: str = wait_for(lambda: cluster.kube.request("GET", f"{path}/log").text, 30,
                             every=0.5)
    except AssertionError as exc:
        status = json.dumps(_pod(cluster, ns, name)["status"].get("containerStatuses"))
        previous = cluster.kube.request("GET", f"{path}/log",
                                        params={"previous": "true"}).text
        raise AssertionError(f"{exc}; status {status}; previous log {previous!r}") from exc
    return text.splitlines()[0]


def _excluded(cluster: NodeCluster, image: str) -> list[dict[str, Any]]:
    status = cluster.kube.get(CONFIG).get("status") or {}
    return [x for x in (status.get("execFormatErrorMonitor") or {}).get("excluded") or []
            if x.get("image") == image]


def test_the_arm64_node_is_registered_as_arm64(nodes: NodeCluster) -> None:
    assert nodes.arm64 is not None and nodes.arm64.name == ARM64_NODE_NAME
    node = nodes.kube.get(f"/api/v1/nodes/{ARM64_NODE_NAME}")
    assert node["metadata"]["labels"]["kubernetes.io/arch"] == "arm64"
    assert node["status"]["nodeInfo"]["architecture"] == "arm64"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.2"
    assert nodes.kube.get(f"/api/v1/nodes/{NODE_NAME}")["metadata"]["labels"][
        "kubernetes.io/arch"] == "amd64"


def test_an_arm64_only_image_runs_on_the_arm64_node(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any) -> None:
    image = _index(pusher, registry, "arm-only", {"arm64": "arm64"})
    nodes.kube.create(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "arm-only"},
        "spec": _pod_spec(image)})
    pod = wait_for(lambda: (p := _pod(nodes, ns, "arm-only"))["spec"].get("nodeName") and p, 90)
    assert _archs(pod) == {"arm64"} and pod["spec"]["nodeName"] == ARM64_NODE_NAME
    assert _running_log(nodes, ns, "arm-only") == "running on aarch64"


def test_a_multiarch_image_runs_its_own_entry_on_each_node(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any) -> None:
    image = _index(pusher, registry, "multi", {"amd64": "amd64", "arm64": "arm64"})
    spread = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": "multi"}},
        "topologyKey": "kubernetes.io/hostname"}]}}
    nodes.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "multi"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "multi"}},
                 "template": {"metadata": {"labels": {"app": "multi"}},
                              "spec": _pod_spec(image, affinity=spread)}}})
    pods = wait_for(lambda: len(b := [p for p in _pods(nodes, ns, "multi")
                                      if p["spec"].get("nodeName")]) == 2 and b, 60)
    logs = {p["spec"]["nodeName"]: _running_log(nodes, ns, p["metadata"]["name"])
            for p in pods}
    assert logs == {NODE_NAME: "running on x86_64", ARM64_NODE_NAME: "running on aarch64"}
    for p in pods:
        status = _pod(nodes, ns, p["metadata"]["name"])["status"]["containerStatuses"][0]
        assert status["restartCount"] == 0


def test_the_lying_images_replacement_replica_runs_on_the_arm64_node(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any) -> None:
    """The linux/amd64 entry holds the arm64 busybox: on the amd64 node it fails with an
    exec format error, which is learned; the next replica is placed arm64-only and runs
    on the arm64 node."""
    image = _index(pusher, registry, "lying", {"amd64": "arm64", "arm64": "arm64"})
    arm = f"/api/v1/nodes/{ARM64_NODE_NAME}"
    nodes.kube.patch(arm, {"spec": {"unschedulable": True}})
    try:
        nodes.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "lying"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "lying"}},
                     "template": {"metadata": {"labels": {"app": "lying"}},
                                  "spec": _pod_spec(image)}}})
        first = wait_for(lambda: next((p for p in _pods(nodes, ns, "lying")
                                       if p["spec"].get("nodeName")), None), 60)
    finally:
        nodes.kube.patch(arm, {"spec": {"unschedulable": False}})
    assert first["spec"]["nodeName"] == NODE_NAME
    name = first["metadata"]["name"]
    wait_for(lambda: EXEC_FORMAT_LABEL in _pod(nodes, ns, name)["metadata"].get("labels", {}),
             60, every=0.5)
    (x,) = wait_for(lambda: _excluded(nodes, image), 30)
    assert x["platform"] == "linux/amd64"
    nodes.kube.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/lying",
                     {"spec": {"replicas": 2}})
    new = wait_for(lambda: next((p for p in _pods(nodes, ns, "lying")
                                 if p["metadata"]["name"] != name
                                 and p["spec"].get("nodeName")), None), 90, every=0.5)
    assert _archs(new) == {"arm64"} and new["spec"]["nodeName"] == ARM64_NODE_NAME
    decision = json.loads(new["metadata"]["annotations"][DECISION_ANNOTATION])
    assert decision["images"][0]["excluded"][0]["platform"] == "linux/amd64"
    assert _running_log(nodes, ns, new["metadata"]["name"]) == "running on aarch64"


def test_x86_programs_on_the_arm64_node_fail_with_runcs_words_and_are_learned(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any) -> None:
    """The linux/arm64 entry holds the x86-64 busybox. A pod sent to the arm64 node by its
    own ``nodeSelector`` (placed by podplacement for amd64 and arm64) and one naming the
    node itself (``nodeName``: not placed, so not watched by the monitor) both fail as on
    an arm64 machine: runc's words, exit 1. The placed one is detected on a node of
    architecture arm64 and (digest, linux/arm64) is learned."""
    image = _index(pusher, registry, "x86-in-arm", {"amd64": "amd64", "arm64": "amd64"})
    for name, extra in (("chosen", {"nodeSelector": {"kubernetes.io/hostname": ARM64_NODE_NAME}}),
                        ("forced", {"nodeName": ARM64_NODE_NAME})):
        nodes.kube.create(f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {
                "app": name}}, "spec": _pod_spec(image, restartPolicy="Never", **extra)})
    for name in ("chosen", "forced"):
        pod = wait_for(lambda n=name: (p := _pod(nodes, ns, n))["status"].get("phase")
                       == "Failed" and p, 90, every=0.5)
        assert pod["spec"]["nodeName"] == ARM64_NODE_NAME
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["reason"], terminated["exitCode"]) == ("Error", 1)
        assert "exec /bin/sh: exec format error" in terminated["message"]
    assert _archs(_pod(nodes, ns, "chosen")) == {"amd64", "arm64"}
    wait_for(lambda: EXEC_FORMAT_LABEL in _pod(nodes, ns, "chosen")["metadata"].get(
        "labels", {}), 60, every=0.5)
    (x,) = wait_for(lambda: _excluded(nodes, image), 30)
    assert x["platform"] == "linux/arm64"
