"""Nothing the product leaves in the API server outlives it: the real control plane
(kube-apiserver, kube-scheduler, kube-controller-manager v1.36.2), podplacement installed
from deploy/ with ``kubectl apply -k`` and its processes running with deploy/'s
ServiceAccount tokens (:mod:`podplacement.sandbox.product`).

Each test installs the product afresh, has pods gated when it goes (the controller is
SIGSTOPped while they are created), and then takes it away as an operator would:

- ``kubectl delete -k deploy/`` (all at once: RBAC, ServiceAccounts, namespace, CRDs);
- ``kubectl delete namespace podplacement-system`` with the product running;
- the namespace deleted after every process of the product died without a word;
- both Deployments scaled to 0 (the processes get SIGTERM and nobody takes over).

There is no kubelet: where a kubelet would, the test sends SIGTERM to the processes whose
pods are being deleted and force-deletes those pods, so the namespace deletion can finish.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    AFFINITY_LABEL,
    CONFIG_FINALIZER,
    GATE_LABEL,
    SCHEDULING_GATE,
    WEBHOOK_CONFIGURATION_NAME,
)
from podplacement.rules.ownership import UNINSTALL_RBAC_NAME
from podplacement.sandbox.product import (
    CONTROLLER_SA,
    NAMESPACE,
    Product,
    install_manifests,
    kubectl,
    start_product,
)
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import REPO, real_cluster, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

_ADM = "/apis/admissionregistration.k8s.io/v1"
_RBAC = "/apis/rbac.authorization.k8s.io/v1"
CONFIG_PATH = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
#: Every object of ours that must not outlive the product, by a short name.
OURS: dict[str, str] = {
    "policy": f"{_ADM}/mutatingadmissionpolicies/{ADMISSION_POLICY_NAME}",
    "binding": f"{_ADM}/mutatingadmissionpolicybindings/{ADMISSION_POLICY_NAME}",
    "webhook configuration": f"{_ADM}/mutatingwebhookconfigurations/{WEBHOOK_CONFIGURATION_NAME}",
    "params": params_path(NAMESPACE),
    "uninstall role": f"{_RBAC}/clusterroles/{UNINSTALL_RBAC_NAME}",
    "uninstall binding": f"{_RBAC}/clusterrolebindings/{UNINSTALL_RBAC_NAME}",
    "namespace": f"/api/v1/namespaces/{NAMESPACE}",
}
CRDS = {
    "config CRD": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                  "podplacementconfigs.podplacement.io",
    "params CRD": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                  "imageplatformcatalogs.podplacement.io",
}
SA_PATH = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{CONTROLLER_SA}"
#: The bound the issue sets for an uninstall, and docs/guide/uninstall.md states.
UNINSTALL_LIMIT = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from real_cluster(tmp_path_factory, "uninstall")


@pytest.fixture(scope="module")
def image(registry: Registry, make_pusher: Any) -> str:
    make_pusher(registry).multiarch("uninstall/multi", "v1", ["linux/amd64", "linux/arm64"])
    return f"{registry.host}/uninstall/multi:v1"


@pytest.fixture
def installed(cluster: KubeEnv, registry: Registry, tmp_path: Path) -> Iterator[Product]:
    """deploy/ applied afresh and the product running; whatever is left is removed after
    the test (with the finalizers of ours cleared by hand, should a test fail half-way)."""
    assert cluster.plane is not None
    _wait_gone(cluster, OURS["namespace"], 120)
    install_manifests(cluster.plane, REPO / "deploy")
    product = start_product(cluster.plane, tmp_path / "product",
                            controller_options=["--insecure-registry", registry.host])
    try:
        yield product
    finally:
        product.stop()
        _clear_finalizers(cluster)
        kubectl(cluster.plane, "delete", "-k", str(REPO / "deploy"), "--wait=false",
                "--ignore-not-found", check=False)
        _force_delete_product_pods(cluster)


def _user_namespace(cluster: KubeEnv) -> str:
    name = f"u-{uuid.uuid4().hex[:8]}"
    cluster.ensure_namespace(name)
    return name


def _pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0}}


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _create_gated(cluster: KubeEnv, product: Product, image: str, count: int) -> str:
    """``count`` pods in a new namespace, created while the controller is stopped, so that
    they are all gated when the test takes the product away. Returns the namespace."""
    ns = _user_namespace(cluster)
    product.controllers[0].popen.send_signal(signal.SIGSTOP)

    def one(i: int) -> dict[str, Any]:
        return cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"p-{i}", image))

    with ThreadPoolExecutor(8) as pool:
        pods = list(pool.map(one, range(count)))
    assert all(_gated(p) for p in pods), "every pod is gated while the controller is stopped"
    return ns


def _gated_anywhere(cluster: KubeEnv) -> list[str]:
    r = cluster.request("GET", "/api/v1/pods", params={"labelSelector": f"{GATE_LABEL}=gated"})
    r.raise_for_status()
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in r.json()["items"]
            if _gated(p)]


def _present(cluster: KubeEnv, paths: dict[str, str]) -> list[str]:
    return [name for name, path in paths.items() if cluster.request("GET", path).status_code
            != 404]


def _wait_gone(cluster: KubeEnv, path: str, within: float) -> None:
    deadline = time.monotonic() + within
    while cluster.request("GET", path).status_code != 404:
        _force_delete_product_pods(cluster)
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} still there after {within} s")
        time.sleep(0.5)


def _force_delete_product_pods(cluster: KubeEnv) -> None:
    """What a kubelet does for the product's own pods when they are deleted (they never run
    here: the Deployments are scaled to 0, but pods made before the scale-down may be
    bound to a fake node): confirm their deletion, so the namespace deletion can finish."""
    r = cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    if r.status_code != 200:
        return
    for pod in r.json()["items"]:
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/"
                        f"{pod['metadata']['name']}", params={"gracePeriodSeconds": "0"})


def _clear_finalizers(cluster: KubeEnv) -> None:
    for path in (SA_PATH, CONFIG_PATH):
        r = cluster.request("GET", path)
        if r.status_code == 200 and CONFIG_FINALIZER in (r.json()["metadata"].get(
                "finalizers") or []):
            cluster.request("PATCH", path, json={"metadata": {"finalizers": None}},
                            headers={"Content-Type": "application/merge-patch+json"})


def _untouched(cluster: KubeEnv, image: str) -> dict[str, Any]:
    """A pod created now in a new namespace: neither gated, nor placed, nor labelled."""
    ns = _user_namespace(cluster)
    pod = cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod("late", image))
    labels = pod["metadata"].get("labels") or {}
    assert not _gated(pod) and GATE_LABEL not in labels and AFFINITY_LABEL not in labels, pod
    assert "affinity" not in pod["spec"], pod["spec"]
    return pod


def _terminate(product: Product, sig: int = signal.SIGTERM) -> None:
    """What a kubelet does to the processes of pods being deleted (SIGTERM), without
    waiting for them to exit."""
    for proc in [*product.controllers, product.webhook]:
        if proc.alive():
            proc.popen.send_signal(signal.SIGCONT)
            proc.popen.send_signal(sig)


def _exited(product: Product, within: float) -> None:
    deadline = time.monotonic() + within
    for proc in [*product.controllers, product.webhook]:
        try:
            proc.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{proc.name} still running:\n{proc.log()[-3000:]}") from exc


def test_kubectl_delete_k_deploy_releases_every_pod_and_leaves_nothing(
        cluster: KubeEnv, installed: Product, image: str) -> None:
    """``kubectl delete -k deploy/`` with 30 pods gated: within 60 s no pod carries our gate,
    none of our objects is left (no CRD stuck Terminating, the namespace gone), and a pod
    created afterwards is untouched. The controller's ServiceAccount finalizer keeps its
    token valid and its own uninstall ClusterRole keeps its rights, while kubectl deletes
    deploy/'s RBAC in the same breath."""
    assert cluster.plane is not None
    ns = _create_gated(cluster, installed, image, 30)
    # the guards are in place before the operator acts
    sa = cluster.get(SA_PATH)
    assert CONFIG_FINALIZER in sa["metadata"]["finalizers"], sa["metadata"]
    assert _present(cluster, {k: OURS[k] for k in ("uninstall role", "uninstall binding")})
    started = time.monotonic()
    kubectl(cluster.plane, "delete", "-k", str(REPO / "deploy"), "--wait=false",
            check=False)
    _terminate(installed)  # their pods are being deleted: the kubelet says SIGTERM
    wait_for(lambda: not _gated_anywhere(cluster), UNINSTALL_LIMIT, every=0.5)
    released = time.monotonic() - started
    deadline = started + UNINSTALL_LIMIT
    while _present(cluster, {**OURS, **CRDS}) and time.monotonic() < deadline:
        _force_delete_product_pods(cluster)
        time.sleep(0.5)
    left = _present(cluster, {**OURS, **CRDS})
    empty = time.monotonic() - started
    assert left == [], f"left after {UNINSTALL_LIMIT} s: {left}"
    _exited(installed, 30)
    # The leader-election Lease is the one thing kubectl takes away on purpose (deploy/'s Role
    # in the namespace; the namespace's deletion deletes the Lease anyway): its renewal may be
    # refused, which ends the term, and the uninstall goes on without it. Any other denial
    # means the uninstall lost its rights half-way.
    denied = [line for line in installed.forbidden()
              if "resource lock" not in line and "leases" not in line]
    assert denied == [], "the uninstall lost its rights half-way"
    pods = cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    assert len(pods) == 30 and not any(_gated(p) for p in pods)
    placed = [p for p in pods if (p["spec"].get("affinity") or {}).get("nodeAffinity")]
    _untouched(cluster, image)
    print(f"kubectl delete -k deploy/: 30 gated pods released in {released:.1f} s "
          f"({len(placed)} with a placement), nothing of ours left after {empty:.1f} s")


def test_namespace_deleted_with_the_product_running_is_an_ordered_uninstall(
        cluster: KubeEnv, installed: Product, image: str) -> None:
    """``kubectl delete namespace podplacement-system``: its pods get SIGTERM; the
    controller runs the ordered uninstall (the namespace's deletion also deletes the
    leader's Lease), so every pod is released, the admission objects go and the namespace
    finishes deleting; the PodPlacementConfig stays (the operator did not delete it) but
    without our finalizer, and a new pod is untouched."""
    assert cluster.plane is not None
    ns = _create_gated(cluster, installed, image, 20)
    started = time.monotonic()
    kubectl(cluster.plane, "delete", "namespace", NAMESPACE, "--wait=false")
    _terminate(installed)
    wait_for(lambda: not _gated_anywhere(cluster), UNINSTALL_LIMIT, every=0.5)
    released = time.monotonic() - started
    deadline = started + UNINSTALL_LIMIT
    while _present(cluster, OURS) and time.monotonic() < deadline:
        _force_delete_product_pods(cluster)
        time.sleep(0.5)
    assert _present(cluster, OURS) == []
    config = cluster.get(CONFIG_PATH)
    assert CONFIG_FINALIZER not in (config["metadata"].get("finalizers") or [])
    _exited(installed, 30)
    assert not any(_gated(p) for p in cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"])
    _untouched(cluster, image)
    print(f"namespace deleted: 20 gated pods released in {released:.1f} s, "
          f"namespace and admission objects gone after {time.monotonic() - started:.1f} s")


def test_namespace_deleted_after_the_product_died_gates_no_new_pod(
        cluster: KubeEnv, installed: Product, image: str) -> None:
    """Every process of the product killed without a word (SIGKILL: no stand-down), then the
    namespace deleted: the namespace controller deletes the params object at once, the API
    server then skips the admission policy, and no new pod anywhere is gated. The
    controller's ServiceAccount keeps our finalizer (no controller is left to remove it),
    so the namespace waits for the one-line fix of docs/guide/uninstall.md; after it, the
    garbage collector deletes the admission objects owned by the namespace."""
    assert cluster.plane is not None
    _terminate(installed, signal.SIGKILL)
    _exited(installed, 10)
    started = time.monotonic()
    kubectl(cluster.plane, "delete", "namespace", NAMESPACE, "--wait=false")

    def params_gone() -> bool:
        # KEP-5080 (ordered namespace deletion, on in v1.36): the namespace controller
        # deletes the namespace's pods first, and the rest once they are gone; a kubelet
        # confirms the deletion of pods whose containers are dead at once, as done here.
        _force_delete_product_pods(cluster)
        return cluster.request("GET", OURS["params"]).status_code == 404

    wait_for(params_gone, 30, every=0.2)
    # the API server drops the policy's params from its informer within a moment
    wait_for(lambda: not _gated(cluster.create(
        f"/api/v1/namespaces/{_user_namespace(cluster)}/pods", _pod("probe", image))), 30,
        every=0.5)
    free = time.monotonic() - started
    _untouched(cluster, image)
    # docs/guide/uninstall.md: the one line for a namespace left Terminating by a dead controller
    kubectl(cluster.plane, "patch", "serviceaccount", CONTROLLER_SA, "-n", NAMESPACE,
            "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    deadline = time.monotonic() + UNINSTALL_LIMIT
    while _present(cluster, OURS) and time.monotonic() < deadline:
        _force_delete_product_pods(cluster)
        time.sleep(0.5)
    assert _present(cluster, OURS) == []
    print(f"namespace deleted after the product died: new pods not gated after {free:.1f} s")


def test_deployments_at_zero_the_last_controller_stands_down(
        cluster: KubeEnv, installed: Product, image: str, tmp_path: Path,
        registry: Registry) -> None:
    """Both Deployments scaled to 0: the processes get SIGTERM and no controller takes the
    lease, so the last one stands down: every gated pod is released (placed) within the bound
    docs/guide/uninstall.md states, the params object is deleted so the API server gates no new
    pod, and ``kubectl get ppc`` says why. A controller started again restores gating."""
    assert cluster.plane is not None
    ns = _create_gated(cluster, installed, image, 20)
    started = time.monotonic()
    _terminate(installed)
    wait_for(lambda: not _gated_anywhere(cluster), 30, every=0.5)
    released = time.monotonic() - started
    _exited(installed, 30)
    assert cluster.request("GET", OURS["params"]).status_code == 404
    pods = cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    assert all((p["spec"].get("affinity") or {}).get("nodeAffinity") for p in pods), (
        "the stand-down places the pods it releases")
    wait_for(lambda: not _gated(cluster.create(
        f"/api/v1/namespaces/{_user_namespace(cluster)}/pods", _pod("probe", image))), 30,
        every=0.5)
    shown = kubectl(cluster.plane, "get", "ppc", "cluster").stdout
    assert "NoController" in shown, shown
    for path in (SA_PATH, CONFIG_PATH):
        assert CONFIG_FINALIZER not in (cluster.get(path)["metadata"].get("finalizers") or [])
    # scaled up again: the next leader restores the params object and gating
    again = start_product(cluster.plane, tmp_path / "again",
                          controller_options=["--insecure-registry", registry.host])
    try:
        assert cluster.request("GET", OURS["params"]).status_code == 200
        assert "AsExpected" in kubectl(cluster.plane, "get", "ppc", "cluster").stdout
    finally:
        again.stop()
    print(f"Deployments at 0: 20 gated pods released (placed) {released:.1f} s after SIGTERM")
