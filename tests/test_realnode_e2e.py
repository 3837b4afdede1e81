"""Exec format errors and pull secrets on the real node (kubelet v1.36.2, containerd 1.6,
runc 1.1; :mod:`podplacement.sandbox.realnode`), with podplacement installed from deploy/ on
the real control plane beside fake arm64, ppc64le, s390x and Windows nodes.

The lying image is built from real binaries: an index whose linux/amd64 entry (config:
amd64) holds Debian's arm64 ``busybox-static``, and whose linux/arm64 entry holds the same
arm64 binary (honest). On the real node the container starts and the exec fails: what
runc 1.1 leaves is ``terminated {exitCode: 1, reason: Error}`` with no message unless
``terminationMessagePolicy: FallbackToLogsOnError`` copies the log's ``exec /bin/sh: exec
format error``. Each shape is detected (the message, or verification on suspicion), the
(digest, linux/amd64) pair is learned, and the next replica is placed arm64-only: bound to
a fake arm64 node, where a kubelet would run the arm64 binary (no arm64 machine here, so it
stays Pending). An honest image of real binaries runs on the real node and changes nothing;
an image of a private registry (TLS, basic auth) is inspected with the pod's pull secret
and pulled by the kubelet with the same secret.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.rules.config import (
    DECISION_ANNOTATION,
    EXEC_FORMAT_ANNOTATION,
    EXEC_FORMAT_LABEL,
    EXEC_FORMAT_REASON,
)
from podplacement.sandbox.product import Product, install_manifests, start_product
from podplacement.sandbox.realnode import NODE_NAME
from tests.harness.oci import Pusher
from tests.harness.realcluster import NO_STAND_DOWN, REPO, checked_namespace
from tests.harness.realnode import (
    NodeCluster,
    busybox_layer,
    cluster_with_real_node,
    wait_for,
)
from tests.harness.registry import Registry

pytestmark = [pytest.mark.realcluster, pytest.mark.realnode]

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
ARM_NODES = ("node-arm64-a", "node-arm64-b")
#: What every container of these tests runs: a line on stdout, then it waits.
SCRIPT = "echo running on $(uname -m); sleep 3600"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, registry: Registry,
          basic_registry: Registry) -> Iterator[NodeCluster]:
    gen = cluster_with_real_node(tmp_path_factory, "realnode-e2e",
                                 registries=(registry, basic_registry))
    cluster = next(gen)
    try:
        assert cluster.kube.plane is not None
        install_manifests(cluster.kube.plane, REPO / "deploy")
        yield cluster
    finally:
        gen.close()


@pytest.fixture(scope="module")
def product(nodes: NodeCluster, registry: Registry, basic_registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    assert nodes.kube.plane is not None and basic_registry.ca_pem is not None
    workdir = tmp_path_factory.mktemp("realnode-product")
    ca = workdir / "registry-ca.pem"
    ca.write_bytes(basic_registry.ca_pem)
    options = ["--insecure-registry", registry.host, "--ca-file", f"{basic_registry.host}={ca}"]
    prod = start_product(nodes.kube.plane, workdir, controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


@pytest.fixture
def ns(nodes: NodeCluster, product: Product) -> Iterator[str]:
    yield from checked_namespace(nodes.kube, "rn")


# --- images ---------------------------------------------------------------------------------


def _index(pusher: Any, registry: Registry, repo: str, binaries: dict[str, str]) -> str:
    """``HOST/repo:v1``: an index with one entry per platform architecture whose
    ``bin/busybox`` is the real busybox of ``binaries[arch]``; a file unique to the call
    makes its digests new (a new image: no exclusion learned earlier applies)."""
    p: Pusher = pusher(registry)
    build = {"etc/build-id": uuid.uuid4().hex.encode()}
    from podplacement.sandbox.oci import layer_tar

    children = []
    for arch, binary_arch in binaries.items():
        img = p.image(repo, None, architecture=arch, fmt="oci",
                      layers=[busybox_layer(binary_arch), layer_tar(build)],
                      process={"Entrypoint": ["/bin/sh", "-c"], "Cmd": [SCRIPT]})
        children.append((img, {"os": "linux", "architecture": arch}))
    p.index(repo, "v1", children)
    return f"{registry.host}/{repo}:v1"


def lying_image(pusher: Any, registry: Registry, name: str) -> str:
    """linux/amd64 holds the arm64 busybox (the lie); linux/arm64 holds it too (true)."""
    return _index(pusher, registry, f"realnode/{name}-{uuid.uuid4().hex[:6]}",
                  {"amd64": "arm64", "arm64": "arm64"})


def honest_image(pusher: Any, registry: Registry, name: str) -> str:
    """Each entry holds the busybox of its own architecture."""
    return _index(pusher, registry, f"realnode/{name}-{uuid.uuid4().hex[:6]}",
                  {"amd64": "amd64", "arm64": "arm64"})


# --- objects and reads ----------------------------------------------------------------------


def _container(image: str, message_policy: str) -> dict[str, Any]:
    return {"name": "app", "image": image, "terminationMessagePolicy": message_policy}


def _deployment(ns: str, name: str, image: str, message_policy: str = "File",
                replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "terminationGracePeriodSeconds": 0,
                         "containers": [_container(image, message_policy)]}}}}


def _bare_pod(name: str, image: str, message_policy: str, restart: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {
        "app": name}}, "spec": {"terminationGracePeriodSeconds": 0, "restartPolicy": restart,
                                "containers": [_container(image, message_policy)]}}


def _cordon(cluster: NodeCluster, on: bool) -> None:
    for node in ARM_NODES:
        cluster.kube.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": on}})


def _pods(cluster: NodeCluster, ns: str, app: str) -> list[dict[str, Any]]:
    items = cluster.kube.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _pod(cluster: NodeCluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")


def _on_real_node(cluster: NodeCluster, ns: str, app: str,
                  create: dict[str, Any], path: str) -> dict[str, Any]:
    """Create ``create`` at ``path`` while the arm64 nodes are cordoned: its first pod is
    placed for amd64 and arm64 and bound to the real node (the only amd64 node)."""
    _cordon(cluster, True)
    try:
        cluster.kube.create(path, create)
        pod: dict[str, Any] = wait_for(
            lambda: next((p for p in _pods(cluster, ns, app) if p["spec"].get("nodeName")),
                         None), 60)
    finally:
        _cordon(cluster, False)
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert _archs(pod) == {"amd64", "arm64"}
    return pod


def _archs(pod: dict[str, Any]) -> set[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {v for t in terms for e in t["matchExpressions"]
            if e["key"] == "kubernetes.io/arch" for v in e["values"]}


def _events(cluster: NodeCluster, ns: str, name: str) -> list[dict[str, Any]]:
    items = cluster.kube.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == EXEC_FORMAT_REASON
            and (e.get("regarding") or {}).get("name") == name]


def _note(event: dict[str, Any]) -> str:
    return str(event.get("note") or event.get("message") or "")


def _excluded(cluster: NodeCluster, image: str) -> list[dict[str, Any]]:
    status = cluster.kube.get(CONFIG).get("status") or {}
    return [x for x in (status.get("execFormatErrorMonitor") or {}).get("excluded") or []
            if x.get("image") == image]


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The container's terminated state, current or last, as the API returned it."""
    for status in pod["status"].get("containerStatuses") or []:
        for key in ("state", "lastState"):
            found = (status.get(key) or {}).get("terminated")
            if found:
                return dict(found)
    return None


def _detected(cluster: NodeCluster, ns: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait for the pod's label, record and Event; returns (pod, its Detect Event)."""
    def labelled() -> dict[str, Any] | None:
        pod = _pod(cluster, ns, name)
        return pod if pod["metadata"].get("labels", {}).get(EXEC_FORMAT_LABEL) else None

    pod: dict[str, Any] = wait_for(labelled, 60, every=0.5)
    detect = wait_for(lambda: [e for e in _events(cluster, ns, name)
                               if e.get("action") == "Detect"], 30)
    return pod, detect[0]


def _print_status(what: str, pod: dict[str, Any]) -> None:
    """The container status as the API returned it (``pytest -s`` shows it; the runtime
    table of docs/exec-format-errors.md quotes it)."""
    status = (pod["status"].get("containerStatuses") or [{}])[0]
    shown = {k: status.get(k) for k in ("state", "lastState", "restartCount", "imageID")}
    print(f"\n{what}: phase {pod['status'].get('phase')}: {json.dumps(shown)}")


def _next_replica_without_the_pair(cluster: NodeCluster, ns: str, app: str, image: str,
                                   known: set[str]) -> dict[str, Any]:
    """A pod of ``app`` not in ``known``, bound: placed arm64-only, on a fake arm64 node,
    its decision naming the excluded linux/amd64 entry."""
    new: dict[str, Any] = wait_for(
        lambda: next((p for p in _pods(cluster, ns, app)
                      if p["metadata"]["name"] not in known and p["spec"].get("nodeName")),
                     None), 90, every=0.5)
    assert _archs(new) == {"arm64"}
    assert new["spec"]["nodeName"] in ARM_NODES
    decision = json.loads(new["metadata"]["annotations"][DECISION_ANNOTATION])
    assert decision["images"][0]["excluded"][0]["platform"] == "linux/amd64"
    assert f"linux/amd64 of {image} excluded" in decision["reason"]
    return new


# --- the tests ------------------------------------------------------------------------------


def test_a_deployment_of_a_lying_image_restart_always_file_policy_keeps_its_pod_without_delete(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any) -> None:
    """runc's shape without words (``File``): verification on suspicion proves it; learned;
    ``deleteFailedPods`` off: the failing pod stays, the next replica goes arm64-only."""
    image = lying_image(pusher, registry, "always-file")
    first = _on_real_node(nodes, ns, "always-file", _deployment(ns, "always-file", image),
                          f"/apis/apps/v1/namespaces/{ns}/deployments")
    name = first["metadata"]["name"]
    failed = wait_for(lambda: _terminated(p := _pod(nodes, ns, name)) and p, 60)
    _print_status("restartPolicy Always, terminationMessagePolicy File", failed)
    terminated = _terminated(failed)
    assert terminated is not None
    assert (terminated["reason"], terminated["exitCode"]) == ("Error", 1)
    assert not terminated.get("message")  # runc's words went to the log only
    pod, detect = _detected(nodes, ns, name)
    assert "proven by verification" in _note(detect) and "exit code 1" in _note(detect)
    assert f"on node {NODE_NAME} of architecture amd64" in _note(detect)
    record = json.loads(pod["metadata"]["annotations"][EXEC_FORMAT_ANNOTATION])
    assert record["containers"]["app"]["proof"] == "verification"
    (x,) = wait_for(lambda: _excluded(nodes, image), 30)
    assert (x["platform"], x["proof"]) == ("linux/amd64", "verification")
    nodes.kube.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/always-file",
                     {"spec": {"replicas": 2}})
    _next_replica_without_the_pair(nodes, ns, "always-file", image, {name})
    still = _pod(nodes, ns, name)  # deleteFailedPods is off: the failing pod stays
    assert still["spec"]["nodeName"] == NODE_NAME and not still["metadata"].get(
        "deletionTimestamp")
    logs = nodes.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}/log",
                              params={"previous": "true"}).text
    assert "exec format error" in logs or "exec format error" in nodes.kube.request(
        "GET", f"/api/v1/namespaces/{ns}/pods/{name}/log").text


def test_a_deployment_of_a_lying_image_fallback_to_logs_with_delete_failed_pods_is_replaced(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any) -> None:
    """``FallbackToLogsOnError``: runc's words reach the status; ``deleteFailedPods`` on:
    the failing pod is deleted and its ReplicaSet's new pod is placed arm64-only."""
    nodes.kube.patch(CONFIG, {"spec": {"plugins": {"execFormatErrorMonitor": {
        "deleteFailedPods": True}}}})
    try:
        image = lying_image(pusher, registry, "always-logs")
        first = _on_real_node(
            nodes, ns, "always-logs",
            _deployment(ns, "always-logs", image, "FallbackToLogsOnError"),
            f"/apis/apps/v1/namespaces/{ns}/deployments")
        name = first["metadata"]["name"]
        pod, detect = _detected(nodes, ns, name)
        _print_status("restartPolicy Always, terminationMessagePolicy FallbackToLogsOnError",
                      pod)
        terminated = _terminated(pod)
        assert terminated is not None and (terminated["reason"], terminated["exitCode"]) == (
            "Error", 1)
        assert "exec /bin/sh: exec format error" in terminated["message"]
        assert "proven by verification" not in _note(detect)
        assert "running /bin/sh" in _note(detect)
        _next_replica_without_the_pair(nodes, ns, "always-logs", image, {name})
        wait_for(lambda: nodes.kube.request(
            "GET", f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 404, 30)
        deleted = [e for e in _events(nodes, ns, name) if e.get("action") == "Delete"]
        assert len(deleted) == 1 and "ReplicaSet always-logs-" in _note(deleted[0])
    finally:
        nodes.kube.patch(CONFIG, {"spec": {"plugins": {"execFormatErrorMonitor": {
            "deleteFailedPods": False}}}})


@pytest.mark.parametrize("message_policy", ["File", "FallbackToLogsOnError"])
def test_a_bare_pod_of_a_lying_image_restart_never_is_detected(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any,
        message_policy: str) -> None:
    """``restartPolicy: Never``: the pod fails once (phase Failed); the exec format error is
    detected from the words (``FallbackToLogsOnError``) or on suspicion (``File``)."""
    app = f"never-{message_policy.lower()}"
    image = lying_image(pusher, registry, app)
    _on_real_node(nodes, ns, app, _bare_pod(app, image, message_policy, "Never"),
                  f"/api/v1/namespaces/{ns}/pods")
    pod, detect = _detected(nodes, ns, app)
    pod = wait_for(lambda: (p := _pod(nodes, ns, app))["status"].get("phase") == "Failed"
                   and p, 30)
    _print_status(f"restartPolicy Never, terminationMessagePolicy {message_policy}", pod)
    status = pod["status"]["containerStatuses"][0]
    terminated = status["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"], status["restartCount"]) == (
        "Error", 1, 0)
    if message_policy == "File":
        assert not terminated.get("message")
        assert "proven by verification" in _note(detect)
    else:
        assert "exec /bin/sh: exec format error" in terminated["message"]
        assert "running /bin/sh" in _note(detect)
    (x,) = wait_for(lambda: _excluded(nodes, image), 30)
    assert x["platform"] == "linux/amd64"


def test_an_honest_multiarch_image_runs_on_the_real_node_and_changes_nothing(
        nodes: NodeCluster, ns: str, registry: Registry, pusher: Any) -> None:
    image = honest_image(pusher, registry, "honest")
    first = _on_real_node(nodes, ns, "honest", _deployment(ns, "honest", image),
                          f"/apis/apps/v1/namespaces/{ns}/deployments")
    name = first["metadata"]["name"]
    running = wait_for(lambda: (p := _pod(nodes, ns, name))["status"].get("phase")
                       == "Running" and p, 60)
    _print_status("honest image", running)
    log = wait_for(lambda: nodes.kube.request(
        "GET", f"/api/v1/namespaces/{ns}/pods/{name}/log").text, 20)
    assert log.splitlines() == ["running on x86_64"]
    nodes.kube.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/honest",
                     {"spec": {"replicas": 2}})
    second = wait_for(lambda: next((p for p in _pods(nodes, ns, "honest")
                                    if p["metadata"]["name"] != name
                                    and p["spec"].get("nodeName")), None), 60)
    assert _archs(second) == {"amd64", "arm64"}
    again = _pod(nodes, ns, name)
    assert again["status"]["containerStatuses"][0]["restartCount"] == 0
    assert EXEC_FORMAT_LABEL not in again["metadata"].get("labels", {})
    assert _events(nodes, ns, name) == [] and _excluded(nodes, image) == []


def test_a_private_image_is_inspected_and_pulled_with_the_pods_pull_secret(
        nodes: NodeCluster, ns: str, basic_registry: Registry, pusher: Any) -> None:
    """TLS + basic auth: the product reads the image's platforms with the pod's pull
    secret, the kubelet pulls it with the same secret (containerd trusts the registry's CA
    through its hosts.toml), and the pod runs."""
    image = honest_image(pusher, basic_registry, "private")
    auth = base64.b64encode(
        f"{basic_registry.username}:{basic_registry.password}".encode()).decode()
    config = {"auths": {basic_registry.host: {"auth": auth}}}
    nodes.kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}})
    pod = _bare_pod("private", image, "File", "Always")
    pod["spec"]["imagePullSecrets"] = [{"name": "pull"}]
    placed = _on_real_node(nodes, ns, "private", pod, f"/api/v1/namespaces/{ns}/pods")
    decision = json.loads(placed["metadata"]["annotations"][DECISION_ANNOTATION])
    assert decision["images"][0]["image"] == image
    assert decision["images"][0]["digest"].startswith("sha256:")
    running = wait_for(lambda: (p := _pod(nodes, ns, "private"))["status"].get("phase")
                       == "Running" and p, 60)
    status = running["status"]["containerStatuses"][0]
    assert status["imageID"] == f"{image.rsplit(':', 1)[0]}@{decision['images'][0]['digest']}"
    log = wait_for(lambda: nodes.kube.request(
        "GET", f"/api/v1/namespaces/{ns}/pods/private/log").text, 20)
    assert log.splitlines() == ["running on x86_64"]
