"""podplacement installed for real on the real control plane (kube-apiserver, kube-scheduler,
kube-controller-manager v1.36.2), as a platform engineer installs it:

- ``kubectl apply -k deploy/`` for real; the webhook and the controller run as processes with
  the tokens of deploy/'s own ServiceAccounts, so the real authorizer enforces deploy/'s RBAC
  (any 403 in their logs fails the module); the API server calls the webhook by
  ``clientConfig.url`` on 127.0.0.1 over TLS;
- the path users take: a Deployment of 20 replicas of a multi-arch image becomes a ReplicaSet
  and pods (kube-controller-manager), every pod is placed (by the webhook, then by the
  admission policy once the controller checked the tag) and bound by kube-scheduler to a
  node of a supported architecture; then the tag moves to a single-arch image and, once the
  catalog followed (README "Always pods and spec.fresh"), the Deployment is rolled: the new
  pods (``imagePullPolicy: Always``) get the new affinity;
- the config is the operator's: ``kubectl apply -k deploy/`` again (an upgrade) leaves every
  field the operator changed as it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.config import (
    DECISION_ANNOTATION,
    GATE_LABEL,
    SCHEDULING_GATE,
    WEBHOOK_CONFIGURATION_NAME,
)
from podplacement.sandbox.product import (
    NAMESPACE,
    Product,
    install_manifests,
    kubectl,
    start_product,
)
from tests.controller.conftest import check_bindings
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import (
    NO_STAND_DOWN,
    REPO,
    checked_namespace,
    real_cluster,
    wait_for,
)
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

CONFIG_PATH = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
MWC_PATH = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
            + WEBHOOK_CONFIGURATION_NAME)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from real_cluster(tmp_path_factory, "installed")


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    assert cluster.plane is not None
    install_manifests(cluster.plane, REPO / "deploy")
    prod = start_product(cluster.plane, tmp_path_factory.mktemp("product"),
                         controller_options=["--insecure-registry", registry.host,
                                             *NO_STAND_DOWN])
    try:
        yield prod
        # least privilege for real: no request of either process was refused by RBAC
        assert prod.forbidden() == []
    finally:
        prod.stop()


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    yield from checked_namespace(cluster, "i")


def _wait(check: Any, within: float = 60.0, every: float = 0.25) -> Any:
    return wait_for(check, within, every)


def _arch_in(pod: dict[str, Any]) -> list[list[str]]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return [e["values"] for t in terms for e in t.get("matchExpressions") or []
            if e["key"] == "kubernetes.io/arch" and e["operator"] == "In"]


def test_webhook_registered_by_url_and_rbac_enforced(cluster: KubeEnv, product: Product,
                                                     ns: str, registry: Registry,
                                                     make_pusher: Any) -> None:
    mwc = cluster.get(MWC_PATH)
    assert [h["clientConfig"]["url"] for h in mwc["webhooks"]] == [
        f"https://127.0.0.1:{product.webhook_port}/mutate"]
    # the processes really are the ServiceAccounts: the controller may not read Secrets of
    # other namespaces, the webhook may not patch pods
    assert "podplacement-controller" in product.kubeconfigs["controller"].read_text()
    make_pusher(registry).multiarch("inst/one", "v1", ["linux/amd64", "linux/s390x"])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "one"},
           "spec": {"containers": [{"name": "c", "image": f"{registry.host}/inst/one:v1"}]}}
    created = cluster.create(f"/api/v1/namespaces/{ns}/pods", pod)
    assert {"name": SCHEDULING_GATE} in created["spec"]["schedulingGates"]

    def placed() -> dict[str, Any] | None:
        p = cluster.get(f"/api/v1/namespaces/{ns}/pods/one")
        return p if p["spec"].get("nodeName") else None

    bound = _wait(placed)
    assert _arch_in(bound) == [["amd64", "s390x"]]
    assert bound["metadata"]["labels"][GATE_LABEL] == "removed"
    node = cluster.get(f"/api/v1/nodes/{bound['spec']['nodeName']}")
    assert node["metadata"]["labels"]["kubernetes.io/arch"] in {"amd64", "s390x"}


def _deployment(name: str, image: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image,
                                         "imagePullPolicy": "Always"}]},
            },
        },
    }


def _pods(cluster: KubeEnv, ns: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get(
        f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def test_deployment_of_20_replicas_then_tag_moved_and_rolled(
    cluster: KubeEnv, product: Product, ns: str, registry: Registry, make_pusher: Any
) -> None:
    pusher = make_pusher(registry)
    pusher.multiarch("inst/web", "stable", ["linux/amd64", "linux/arm64"])
    image = f"{registry.host}/inst/web:stable"
    cluster.create(f"/apis/apps/v1/namespaces/{ns}/deployments", _deployment("web", image, 20))

    def all_bound(want: list[str], template_hash: str | None = None) -> Any:
        def check() -> list[dict[str, Any]] | None:
            pods = _pods(cluster, ns, "web")
            if template_hash is not None:
                pods = [p for p in pods
                        if p["metadata"]["labels"].get("pod-template-hash") != template_hash]
            ok = [p for p in pods if p["spec"].get("nodeName") and _arch_in(p) == [want]]
            return pods if len(pods) == 20 and len(ok) == 20 else None
        return check

    first = _wait(all_bound(["amd64", "arm64"]), within=90)
    for pod in first:
        assert pod["metadata"]["labels"][GATE_LABEL] == "removed"
        assert DECISION_ANNOTATION in pod["metadata"]["annotations"]
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    old_hash = first[0]["metadata"]["labels"]["pod-template-hash"]
    assert check_bindings(cluster, ns) == 20
    # the tag moves to an arm64-only image; roll the Deployment once the catalog followed:
    # pods pulled with Always are placed inside the API server from the controller's check of
    # the last pullAlwaysFreshness (5s), so a pod admitted within about half of it after the
    # push may still get the previous digest's platforms (README "Always pods and
    # spec.fresh": the documented window; the exec-format monitor is the backstop)
    moved = pusher.image("inst/web", "stable", architecture="arm64")
    _wait(lambda: (((cluster.get(params_path(NAMESPACE)).get("spec") or {}).get("fresh")
                    or {}).get(image) == moved.digest), within=20)
    cluster.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/web", {"spec": {"template": {
        "metadata": {"annotations": {"example.com/restartedAt": str(time.time())}}}}})
    rolled = _wait(all_bound(["arm64"], template_hash=old_hash), within=120)
    assert len(rolled) == 20
    assert check_bindings(cluster, ns) >= 20


def test_applying_deploy_again_keeps_the_operators_config(cluster: KubeEnv,
                                                          product: Product) -> None:
    """The documented upgrade command, ``kubectl apply -k deploy/``, run over an installed
    product whose operator changed the config: not one field of the config's spec changes
    (the install manifests hold no PodPlacementConfig; the sample was created once)."""
    assert cluster.plane is not None
    original = cluster.get(CONFIG_PATH)["spec"]
    changed = {"plugins": {"nodeAffinityScoring": {"enabled": False}},
               "admission": {"inspectionBudget": "1500ms"}}
    cluster.patch(CONFIG_PATH, {"spec": changed})
    try:
        before = cluster.get(CONFIG_PATH)
        assert before["spec"]["plugins"]["nodeAffinityScoring"]["enabled"] is False
        for args in (("apply", "-k", str(REPO / "deploy")),
                     ("apply", "--server-side", "-k", str(REPO / "deploy"))):
            out = kubectl(cluster.plane, *args).stdout
            assert "podplacementconfig.podplacement.io/cluster" not in out, out
            kubectl(cluster.plane, "scale", "deployment", "--all", "--replicas=0",
                    "-n", NAMESPACE)
            after = cluster.get(CONFIG_PATH)
            assert after["spec"] == before["spec"], args
            assert after["metadata"]["generation"] == before["metadata"]["generation"]
    finally:
        cluster.patch(CONFIG_PATH, {"spec": {
            "plugins": {"nodeAffinityScoring": original["plugins"]["nodeAffinityScoring"]},
            "admission": original["admission"]}})
