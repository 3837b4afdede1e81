"""Tainted architecture pools (docs/pools/tainted-pools.md), with podplacement installed from
deploy/ as shipped on the real control plane v1.36.2 and its real scheduler.

Two fake nodes: ``amd64-full`` (allocatable ``pods: 0``: the amd64 pool is full) and
``arm64-pool``, tainted ``kubernetes.io/arch=arm64:NoSchedule`` as GKE taints every Arm node.

- The API server's facts: a gated pod created without tolerations carries the default
  ``not-ready``/``unreachable`` ones (DefaultTolerationSeconds), a JSON patch appending to
  ``spec.tolerations`` is accepted, one changing an existing entry is refused (422).
- The controller (``fastPaths: Disabled``): a multi-arch pod is placed with the arm64
  toleration and binds to the arm64 node; an amd64-only pod gets none; a pod with its own
  toleration keeps it, with no duplicate.
- The webhook (a pod with a term of its own, which the policy never places): the same
  toleration, from the taints the controller publishes in the config's status.
- The admission policy (catalog warmed first): ``"path":"admission"`` and the same
  toleration, from the taints published in the params object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.sandbox.controlplane import FakeNode
from podplacement.sandbox.product import NAMESPACE, Product, install_manifests, start_product
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

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
PARAMS = params_path(NAMESPACE)
ARM_TAINT = {"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoSchedule"}
ARM_TOLERATION = {"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64",
                  "effect": "NoSchedule"}
NODES = (FakeNode("amd64-full", "amd64", pods="0"), FakeNode("arm64-pool", "arm64"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    plane = real_cluster(tmp_path_factory, "pooltaints", nodes=NODES)
    env = next(plane)
    try:
        assert env.plane is not None
        env.patch("/api/v1/nodes/arm64-pool", {"spec": {"taints": [ARM_TAINT]}})
        install_manifests(env.plane, REPO / "deploy")
        # the controller's path first (the webhook's and the policy's are switched on below)
        env.patch(CONFIG, {"spec": {"admission": {"fastPaths": "Disabled"}}})
        yield env
    finally:
        plane.close()


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    assert cluster.plane is not None
    options = ["--insecure-registry", registry.host]
    prod = start_product(cluster.plane, tmp_path_factory.mktemp("product"),
                         controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


@pytest.fixture(scope="module")
def images(registry: Registry, make_pusher: Any) -> dict[str, str]:
    pusher = make_pusher(registry)
    pusher.multiarch("pools/multi", "v1", ["linux/amd64", "linux/arm64"])
    pusher.image("pools/amd64", "v1", architecture="amd64")
    return {"multi": f"{registry.host}/pools/multi:v1",
            "amd64": f"{registry.host}/pools/amd64:v1"}


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    yield from checked_namespace(cluster, "taint")


def _pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0, **spec}}


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in pod["spec"].get("schedulingGates") or [])


def _placed(cluster: KubeEnv, ns: str, name: str) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    return dict(wait_for(lambda: (lambda p: None if _gated(p) else p)(cluster.get(path)), 30))


def _bound(cluster: KubeEnv, ns: str, name: str) -> str:
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    return str(wait_for(lambda: cluster.get(path)["spec"].get("nodeName"), 30))


def _arch_tolerations(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in pod["spec"].get("tolerations") or []
            if t.get("key") == "kubernetes.io/arch"]


def _record(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    return out


def test_the_api_server_accepts_appended_tolerations_on_a_gated_pod(
        cluster: KubeEnv, ns: str) -> None:
    """What the controller's PATCH relies on (checked on v1.36.2): a pod created without
    tolerations has the DefaultTolerationSeconds ones, so the controller appends with
    ``/spec/tolerations/-``; appending is accepted while gated, changing an entry is not."""
    pod = _pod("raw", "busybox", schedulingGates=[{"name": "example.test/hold"}])
    created = cluster.create(f"/api/v1/namespaces/{ns}/pods", pod)
    keys = {t.get("key") for t in created["spec"].get("tolerations") or []}
    assert keys == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    path = f"/api/v1/namespaces/{ns}/pods/raw"
    patch = {"Content-Type": "application/json-patch+json"}
    r = cluster.request("PATCH", path, headers=patch, content=json.dumps(
        [{"op": "add", "path": "/spec/tolerations/-", "value": ARM_TOLERATION}]))
    assert r.status_code == 200, r.text
    assert _arch_tolerations(r.json()) == [ARM_TOLERATION]
    # changing an existing toleration is refused (a changed default one is not: the
    # DefaultTolerationSeconds plugin adds it back on the update, so nothing went missing)
    index = len(r.json()["spec"]["tolerations"]) - 1
    r = cluster.request("PATCH", path, headers=patch, content=json.dumps(
        [{"op": "replace", "path": f"/spec/tolerations/{index}/value", "value": "amd64"}]))
    assert r.status_code == 422, r.text
    cluster.delete(path)


def test_the_controller_tolerates_the_arm64_pool_for_multi_arch_pods_only(
        cluster: KubeEnv, product: Product, images: dict[str, str], ns: str) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    own = {"key": "kubernetes.io/arch", "operator": "Exists"}
    cluster.create(pods, _pod("multi", images["multi"]))
    cluster.create(pods, _pod("amd64", images["amd64"]))
    cluster.create(pods, _pod("own", images["multi"], tolerations=[own]))
    multi = _placed(cluster, ns, "multi")
    assert "path" not in _record(multi)  # the controller's
    assert _arch_tolerations(multi) == [ARM_TOLERATION]
    assert _record(multi)["tolerations"] == ["kubernetes.io/arch=arm64:NoSchedule"]
    # the amd64 pool is full: only the toleration lets it bind, to the tainted arm64 node
    assert _bound(cluster, ns, "multi") == "arm64-pool"
    amd64 = _placed(cluster, ns, "amd64")
    assert _arch_tolerations(amd64) == [] and "tolerations" not in _record(amd64)
    assert not cluster.get(f"{pods}/amd64")["spec"].get("nodeName")  # amd64 full: Pending
    kept = _placed(cluster, ns, "own")
    assert _arch_tolerations(kept) == [own]  # kept as written, nothing added
    assert "tolerations" not in _record(kept)
    assert _bound(cluster, ns, "own") == "arm64-pool"
    cluster.delete(f"{pods}/amd64")  # it can never bind here (checked_namespace's check)


def test_the_webhook_and_the_policy_add_the_same_toleration(
        cluster: KubeEnv, product: Product, images: dict[str, str], ns: str) -> None:
    """Both admission paths, once the controller published the Nodes' taint (the config's
    status for the webhook, the params object for the policy) and the catalog knows the
    image (the previous test placed it)."""
    pods = f"/api/v1/namespaces/{ns}/pods"
    cluster.patch(CONFIG, {"spec": {"admission": {"fastPaths": "Enabled"}}})
    # a first pod of the image: placed by the webhook or the controller (with the
    # toleration either way), after which the controller publishes the image in the catalog
    cluster.create(pods, _pod("warm", images["multi"]))
    assert _arch_tolerations(_placed(cluster, ns, "warm")) == [ARM_TOLERATION]

    def published() -> bool:
        status = cluster.get(CONFIG).get("status") or {}
        observed = (status.get("architectureTaints") or {}).get("observed")
        params = cluster.get(PARAMS)["spec"]
        return (observed == [{"value": "arm64", "effect": "NoSchedule"}]
                and params.get("architectureTaints") == observed
                and images["multi"] in flat_catalog(params)[0])

    wait_for(published, 30, every=0.5)

    def policy_places() -> bool:
        r = cluster.request("POST", f"{pods}?dryRun=All", json=_pod("probe", images["multi"]))
        annotation = (r.json()["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
        return bool(annotation) and json.loads(annotation).get("path") == "admission"

    wait_for(policy_places, 30, every=0.5)
    cluster.create(pods, _pod("by-policy", images["multi"]))
    linux = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}
    cluster.create(pods, _pod("by-webhook", images["multi"], affinity=linux))
    for name, path in (("by-policy", "admission"), ("by-webhook", "webhook")):
        pod = _placed(cluster, ns, name)
        assert _record(pod)["path"] == path, _record(pod)
        assert _arch_tolerations(pod) == [ARM_TOLERATION], name
        assert _record(pod)["tolerations"] == ["kubernetes.io/arch=arm64:NoSchedule"]
        assert _bound(cluster, ns, name) == "arm64-pool"


def test_a_pod_with_thousands_of_tolerations_is_never_admitted_unplaced(
        cluster: KubeEnv, product: Product, images: dict[str, str], ns: str) -> None:
    """The policy's toleration check costs (published taints) x (the pod's tolerations): a
    pod with 20,000 of its own is still placed within the CEL cost limits (checked on
    v1.36.2: placed by the policy itself, ``"path":"admission"``), never admitted ungated
    and unplaced by a CEL cost error (failurePolicy Ignore). Runs after the test above (the
    policy places this image)."""
    many = [{"key": f"example.test/t{i}", "operator": "Exists"} for i in range(20000)]
    r = cluster.request("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                        json=_pod("many", images["multi"], tolerations=many))
    assert r.status_code == 201, r.text[:500]
    pod = r.json()
    annotation = (pod["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
    assert _gated(pod) or annotation, "admitted with neither gate nor placement"
    if annotation:
        assert _arch_tolerations(pod) == [ARM_TOLERATION]
