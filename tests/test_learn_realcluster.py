"""Learning from exec format errors with podplacement installed from deploy/ on the real
control plane v1.36.2 (its RBAC, the admission policy, the webhook, kube-scheduler and the
ReplicaSet controller). The plane has no kubelet: the test writes container statuses
through ``pods/status`` as a kubelet would.

- A lying image (an index whose arm64 entry holds the amd64 busybox binary): one exec format
  error (containerd's words) on an arm64 node; then a new replica is placed amd64-only and
  bound to an amd64 node; the Event, the metric, the config's status and ``explain`` say why;
  the admission policy's catalog no longer holds the image.
- Another lying image, the runc shape only (exit 255, no message, no run time) on an arm64
  node, with ``deleteFailedPods``: verification proves it, the pod is deleted, and the
  ReplicaSet's replacement is placed amd64-only.
- An honest multi-arch image: the same runc shape is verified and found fine, an exit 1 after
  running a while is not even verified; no finding, no exclusion, replicas keep both
  architectures.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import (
    DECISION_ANNOTATION,
    EXEC_FORMAT_LABEL,
    EXEC_FORMAT_REASON,
    SCHEDULING_GATE,
)
from podplacement.sandbox.product import NAMESPACE, Product, install_manifests
from tests.harness.kube import KubeEnv
from tests.harness.oci import Pusher
from tests.harness.realcluster import (
    REPO,
    checked_namespace,
    product_with_metrics,
    real_cluster,
    wait_for,
)
from tests.harness.registry import Registry
from tests.imageinspect._images import elf, file, layer, symlink

pytestmark = pytest.mark.realcluster

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
PARAMS = params_path(NAMESPACE)
AMD_NODES = ("node-amd64-a", "node-amd64-b")
NOW = "2026-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    plane = real_cluster(tmp_path_factory, "learn")
    env = next(plane)
    try:
        assert env.plane is not None
        install_manifests(env.plane, REPO / "deploy")
        yield env
    finally:
        plane.close()


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Product, int]]:
    """The installed product; the controller's /metrics on 127.0.0.1 (its port returned)."""
    yield from product_with_metrics(cluster, registry, tmp_path_factory, "learn")


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    yield from checked_namespace(cluster, "learn")


def _image(registry: Registry, pusher: Any, repo: str, *, honest: bool) -> str:
    """``HOST/repo:v1``: an index of amd64 and arm64 whose arm64 entry holds an amd64
    /bin/busybox unless ``honest``; a file unique to this call makes the digests new."""
    p: Pusher = pusher(registry)
    children = []
    for arch in ("amd64", "arm64"):
        binary = elf(arch if honest else "amd64")
        files = layer([file("bin/busybox", binary), symlink("bin/sh", "busybox"),
                       file("etc/build-id", uuid.uuid4().hex.encode())])
        img = p.image(repo, None, architecture=arch, fmt="oci", layers=[files],
                      process={"Cmd": ["sh"]})
        children.append((img, {"os": "linux", "architecture": arch}))
    p.index(repo, "v1", children)
    return f"{registry.host}/{repo}:v1"


def _cordon(cluster: KubeEnv, on: bool) -> None:
    for node in AMD_NODES:
        cluster.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": on}})


def _replicaset(cluster: KubeEnv, ns: str, name: str, image: str, replicas: int) -> None:
    cluster.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": image}]}}}})


def _scale(cluster: KubeEnv, ns: str, name: str, replicas: int) -> None:
    cluster.patch(f"/apis/apps/v1/namespaces/{ns}/replicasets/{name}",
                  {"spec": {"replicas": replicas}})


def _pods(cluster: KubeEnv, ns: str, app: str) -> list[dict[str, Any]]:
    return [p for p in cluster.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")
            ["items"] if not p["metadata"].get("deletionTimestamp")]


def _bound(cluster: KubeEnv, ns: str, app: str, count: int) -> list[dict[str, Any]]:
    """Wait until ``count`` pods of ``app`` are bound; returns them."""
    def ready() -> list[dict[str, Any]] | None:
        pods = [p for p in _pods(cluster, ns, app) if p["spec"].get("nodeName")]
        return pods if len(pods) >= count else None

    found: list[dict[str, Any]] = wait_for(ready, 60, every=0.3)
    return found


def _arch(cluster: KubeEnv, node: str) -> str:
    return str(cluster.get(f"/api/v1/nodes/{node}")["metadata"]["labels"]["kubernetes.io/arch"])


def _required_archs(pod: dict[str, Any]) -> set[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {v for t in terms for e in t["matchExpressions"]
            if e["key"] == "kubernetes.io/arch" for v in e["values"]}


def _decision(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    return out


def _write_status(cluster: KubeEnv, ns: str, pod: dict[str, Any],
                  last: dict[str, Any]) -> None:
    """What the kubelet writes after the first restart of container ``app``."""
    image = pod["spec"]["containers"][0]["image"]
    digest = _decision(pod)["images"][0]["digest"]
    repo = image.rsplit(":", 1)[0]
    cluster.patch(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status", {
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "app", "image": image, "imageID": f"{repo}@{digest}", "ready": False,
            "started": False, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                                  "message": "back-off 10s restarting failed container"}},
            "lastState": {"terminated": last}}]}})


def _terminated(reason: str, code: int, message: str, started: str = NOW) -> dict[str, Any]:
    return {"reason": reason, "exitCode": code, "message": message, "startedAt": started,
            "finishedAt": NOW}


def _events(cluster: KubeEnv, ns: str, name: str) -> list[dict[str, Any]]:
    items = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == EXEC_FORMAT_REASON
            and (e.get("regarding") or {}).get("name") == name]


def _note(event: dict[str, Any]) -> str:
    return str(event.get("note") or event.get("message") or "")


def _metric(port: int, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + ("{" if labels else " ")) and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _excluded(cluster: KubeEnv, image: str) -> list[dict[str, Any]]:
    status = cluster.get(CONFIG).get("status") or {}
    return [x for x in (status.get("execFormatErrorMonitor") or {}).get("excluded") or []
            if x.get("image") == image]


def _catalog(cluster: KubeEnv) -> dict[str, str]:
    found: dict[str, str] = flat_catalog(cluster.get(PARAMS).get("spec") or {})[0]
    return found


def _first_on_arm64(cluster: KubeEnv, ns: str, app: str, image: str) -> dict[str, Any]:
    """Create ReplicaSet ``app`` (1 replica) while the amd64 nodes are cordoned: its pod is
    placed for both architectures and bound to an arm64 node."""
    _cordon(cluster, True)
    try:
        _replicaset(cluster, ns, app, image, 1)
        (pod,) = _bound(cluster, ns, app, 1)
    finally:
        _cordon(cluster, False)
    assert _required_archs(pod) == {"amd64", "arm64"}
    assert _arch(cluster, pod["spec"]["nodeName"]) == "arm64"
    return pod


def _explain(cluster: KubeEnv, registry: Registry, ns: str, pod: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "podplacement", "explain", f"pod/{pod}", "--kubeconfig",
         str(cluster.kubeconfig), "-n", ns, "--insecure-registry", registry.host, "-o",
         "json"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_one_exec_format_error_then_the_next_replica_lands_on_amd64_also_after_a_restart(
        cluster: KubeEnv, ns: str, product: tuple[Product, int], registry: Registry,
        pusher: Any) -> None:
    _, port = product
    image = _image(registry, pusher, f"learn/lying-{uuid.uuid4().hex[:6]}", honest=False)
    first = _first_on_arm64(cluster, ns, "lying", image)
    # the controller publishes what it inspected anonymously for the policy's catalog
    try:
        published = bool(wait_for(lambda: image in _catalog(cluster), 10))
    except AssertionError:
        published = False  # placed at admission by the webhook: nothing was published
    errors_before = _metric(port, "podplacement_exec_format_errors_total", 'arch="arm64"')

    _write_status(cluster, ns, first, _terminated(
        "StartError", 128, 'failed to start containerd task "0123": OCI runtime start failed: '
        "exec /bin/sh: exec format error: unknown"))
    name = first["metadata"]["name"]
    (event,) = wait_for(lambda: _events(cluster, ns, name), 30)
    assert "of architecture arm64" in _note(event)
    (x,) = wait_for(lambda: _excluded(cluster, image), 60)
    assert x["platform"] == "linux/arm64" and x["proof"] == "verification"
    assert _decision(first)["images"][0]["digest"] in x["digests"]
    assert cluster.get(f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]["labels"][
        EXEC_FORMAT_LABEL] == "true"
    assert _metric(port, "podplacement_exec_format_errors_total",
                   'arch="arm64"') == errors_before + 1
    assert _metric(port, "podplacement_exec_format_exclusions") >= 1
    if published:
        wait_for(lambda: image not in _catalog(cluster), 30)  # the catalog lets it go

    _scale(cluster, ns, "lying", 2)
    pods = _bound(cluster, ns, "lying", 2)
    (new,) = [p for p in pods if p["metadata"]["name"] != name]
    assert not any(g["name"] == SCHEDULING_GATE for g in new["spec"].get("schedulingGates") or [])
    assert _required_archs(new) == {"amd64"}
    assert _arch(cluster, new["spec"]["nodeName"]) == "amd64"
    decision = _decision(new)
    assert decision["images"][0]["excluded"][0]["platform"] == "linux/arm64"
    assert "linux/arm64 of " + image + " excluded" in decision["reason"]
    report = _explain(cluster, registry, ns, new["metadata"]["name"])
    assert report["architectures"] == ["amd64"]
    assert report["images"][0]["excluded"][0]["proof"] == "verification"

    # the controller killed and started again: it takes the exclusion back from the status
    # (same expiry: a restart does not make it young), and the next replica is amd64-only
    prod, _ = product
    for proc in prod.controllers:
        proc.stop(signal.SIGKILL)
    prod.start_controller(identity=f"after-restart-{uuid.uuid4().hex[:4]}")
    _scale(cluster, ns, "lying", 3)
    pods = _bound(cluster, ns, "lying", 3)
    (third,) = [p for p in pods if p["metadata"]["name"] not in {name, new["metadata"]["name"]}]
    assert _required_archs(third) == {"amd64"}
    assert _arch(cluster, third["spec"]["nodeName"]) == "amd64"
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/podplacement-controller"
    wait_for(lambda: str(cluster.get(lease)["spec"].get("holderIdentity") or "").startswith(
        "after-restart-"), 60, every=0.5)
    time.sleep(3)  # a few rounds of the new leader's learn loop
    (again,) = _excluded(cluster, image)
    assert again["expires"] == x["expires"] and again["lastSeen"] == x["lastSeen"]


def test_the_runc_shape_is_verified_and_the_failing_pod_replaced(
        cluster: KubeEnv, ns: str, product: tuple[Product, int], registry: Registry,
        pusher: Any) -> None:
    _, port = product
    cluster.patch(CONFIG, {"spec": {"plugins": {"execFormatErrorMonitor": {
        "deleteFailedPods": True}}}})
    try:
        image = _image(registry, pusher, f"learn/runc-{uuid.uuid4().hex[:6]}", honest=False)
        first = _first_on_arm64(cluster, ns, "runc", image)
        name = first["metadata"]["name"]
        deleted_before = _metric(port, "podplacement_exec_format_pods_deleted_total",
                                 'owner_kind="ReplicaSet"')
        # runc 1.2: init exits 255 at once; terminationMessagePolicy File: no message
        _write_status(cluster, ns, first, _terminated("Error", 255, ""))

        def replaced() -> list[dict[str, Any]] | None:
            pods = [p for p in _pods(cluster, ns, "runc")
                    if p["metadata"]["name"] != name and p["spec"].get("nodeName")]
            return pods or None

        (new,) = wait_for(replaced, 90, every=0.5)
        assert cluster.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}").status_code \
            == 404
        events = _events(cluster, ns, name)
        detect = [e for e in events if e.get("action") == "Detect"]
        delete = [e for e in events if e.get("action") == "Delete"]
        assert len(detect) == 1 and "proven by verification" in _note(detect[0])
        assert "exit code 255" in _note(detect[0])
        assert len(delete) == 1 and "ReplicaSet runc" in _note(delete[0])
        assert _required_archs(new) == {"amd64"}
        assert _arch(cluster, new["spec"]["nodeName"]) == "amd64"
        assert _decision(new)["images"][0]["excluded"][0]["platform"] == "linux/arm64"
        assert _metric(port, "podplacement_exec_format_pods_deleted_total",
                       'owner_kind="ReplicaSet"') == deleted_before + 1
        status = cluster.get(CONFIG)["status"]["execFormatErrorMonitor"]
        assert any(d["pod"] == name and d["owner"]["kind"] == "ReplicaSet"
                   for d in status["deletedPods"])
    finally:
        cluster.patch(CONFIG, {"spec": {"plugins": {"execFormatErrorMonitor": {
            "deleteFailedPods": False}}}})


def test_an_honest_image_and_an_unrelated_error_change_nothing(
        cluster: KubeEnv, ns: str, product: tuple[Product, int], registry: Registry,
        pusher: Any) -> None:
    prod, port = product
    image = _image(registry, pusher, f"learn/honest-{uuid.uuid4().hex[:6]}", honest=True)
    _cordon(cluster, True)
    try:
        _replicaset(cluster, ns, "honest", image, 2)
        pods = _bound(cluster, ns, "honest", 2)
    finally:
        _cordon(cluster, False)
    assert all(_arch(cluster, p["spec"]["nodeName"]) == "arm64" for p in pods)
    quick, slow = pods
    ok_before = _metric(port, "podplacement_image_verifications_total", 'status="ok"')
    _write_status(cluster, ns, quick, _terminated("Error", 255, ""))  # a suspicion
    _write_status(cluster, ns, slow, _terminated("Error", 1, "", started="2025-12-31T23:59:30Z"))
    # the suspicion is verified (the node's platform, fine), the slow exit not even suspected
    wait_for(lambda: _metric(port, "podplacement_image_verifications_total",
                             'status="ok"') >= ok_before + 1, 60, every=0.5)
    log = "".join(c.log() for c in prod.controllers)
    assert log.count(f"verified {image.rsplit(':', 1)[0]}@") == 1
    for pod in pods:
        name = pod["metadata"]["name"]
        assert _events(cluster, ns, name) == []
        assert EXEC_FORMAT_LABEL not in cluster.get(
            f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"].get("labels", {})
    assert _excluded(cluster, image) == []
    _scale(cluster, ns, "honest", 3)
    new = [p for p in _bound(cluster, ns, "honest", 3)
           if p["metadata"]["name"] not in {q["metadata"]["name"] for q in pods}]
    assert len(new) == 1 and _required_archs(new[0]) == {"amd64", "arm64"}
    assert "excluded" not in json.dumps(_decision(new[0]))


def test_rbac_grants_delete_on_pods_only_to_the_controller(cluster: KubeEnv,
                                                           product: tuple[Product, int]) -> None:
    """RBAC is static: the controller may delete pods (deleteFailedPods), the webhook may
    not (SubjectAccessReview against the installed roles)."""
    def allowed(user: str) -> bool:
        review = cluster.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": f"system:serviceaccount:{NAMESPACE}:{user}",
                     "resourceAttributes": {"verb": "delete", "resource": "pods",
                                            "namespace": "team-a"}}})
        return bool(review["status"].get("allowed"))

    assert allowed("podplacement-controller")
    assert not allowed("podplacement-webhook")
