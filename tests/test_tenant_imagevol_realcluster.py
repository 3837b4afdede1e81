"""Every image a pod pulls is placed, image volumes too (KEP-4639, GA in Kubernetes 1.36), on
the real control plane v1.36.2 with podplacement installed from deploy/ as shipped and the
real registry.

A pod whose container image is multi-arch (linux/amd64 + linux/arm64) and whose image volume
(``volumes[].image.reference``) is arm64-only can only run on arm64 nodes: the kubelet pulls
the volume's image for the node's platform. On each admission path the pod ends with the
required term ``kubernetes.io/arch In [arm64]`` and a decision annotation naming both images:

- controller (``inspectionBudget: 0s``: nothing inspected at admission): gated by the
  policy, placed by the controller (no ``path``); the API server defaulted the volume's
  ``pullPolicy`` like an ``imagePullPolicy``; the catalog feed publishes both images of the
  placed pod;
- admission (both images in the catalog, warmed first by a pod running both as
  containers): placed by the MutatingAdmissionPolicy in CEL (``"path":"admission"``);
- webhook (images never seen, budget 4 s): gated by the policy, placed by the webhook in the
  same admission (``"path":"webhook"``).

Before image volumes counted, each of these pods was placed on ``amd64, arm64`` and could
bind to an amd64 node, where the volume's image cannot be pulled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.sandbox.product import NAMESPACE, Product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import installed_cluster, running_product, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

PARAMS = params_path(NAMESPACE)
CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
NS = "imagevol"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "imagevol")


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    yield from running_product(cluster, registry, tmp_path_factory)


@pytest.fixture(scope="module")
def images(registry: Registry, make_pusher: Any) -> dict[str, tuple[str, str]]:
    """Per path, (multi-arch container image, arm64-only volume image): a tag of each per
    path, so no path finds another's results. The arm64-only image is an index of one
    entry, or (webhook) a single manifest."""
    pusher = make_pusher(registry)
    out = {}
    for path in PATHS:
        pusher.multiarch("imagevol/multi", path, ["linux/amd64", "linux/arm64"])
        if path == "webhook":
            pusher.image("imagevol/armonly", path, architecture="arm64", fmt="oci")
        else:
            pusher.multiarch("imagevol/armonly", path, ["linux/arm64"])
        out[path] = (f"{registry.host}/imagevol/multi:{path}",
                     f"{registry.host}/imagevol/armonly:{path}")
    return out


PATHS = ("controller", "admission", "webhook")


def _budget(cluster: KubeEnv, budget: str) -> None:
    """Set ``spec.admission.inspectionBudget`` (the webhook's watch picks it up within
    moments: give it one second, as tests/test_admission_paths_realcluster.py does)."""
    cluster.patch(CONFIG, {"spec": {"admission": {"inspectionBudget": budget}}})
    time.sleep(1.0)


def _pod(name: str, image: str, volume_image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image,
                                     "volumeMounts": [{"name": "models", "mountPath": "/m"}]}],
                     "volumes": [{"name": "scratch", "emptyDir": {}},
                                 {"name": "models", "image": {"reference": volume_image}}],
                     "terminationGracePeriodSeconds": 0}}


def _settled(cluster: KubeEnv, name: str, within: float = 30) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{NS}/pods/{name}"

    def ungated() -> dict[str, Any] | None:
        pod = cluster.get(path)
        gates = pod["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else pod

    return dict(wait_for(ungated, within))


def _required(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])


def _record(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION]))


ARM64_ONLY = [{"matchExpressions": [
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]


def _catalog(cluster: KubeEnv) -> dict[str, str]:
    r = cluster.request("GET", PARAMS)
    return dict(flat_catalog(r.json().get("spec") or {})[0]) if r.is_success else {}


@pytest.fixture(scope="module")
def by_controller(cluster: KubeEnv, product: Product,
                  images: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """The pod of the controller's images, created with nothing inspected at admission,
    once settled."""
    cluster.ensure_namespace(NS)
    _budget(cluster, "0s")
    try:
        cluster.create(f"/api/v1/namespaces/{NS}/pods", _pod("by-controller",
                                                              *images["controller"]))
        return _settled(cluster, "by-controller")
    finally:
        _budget(cluster, "300ms")


def test_the_controller_places_by_the_image_volume_too(
        by_controller: dict[str, Any], images: dict[str, tuple[str, str]]) -> None:
    image, volume_image = images["controller"]
    pod = by_controller
    # the API server defaults an image volume's pullPolicy as it does imagePullPolicy
    assert pod["spec"]["volumes"][1]["image"]["pullPolicy"] == "IfNotPresent"
    record = _record(pod)
    assert "path" not in record, record
    assert _required(pod) == ARM64_ONLY, record
    assert record["archs"] == ["arm64"]
    assert [(i["image"], i["platforms"]) for i in record["images"]] == [
        (image, ["linux/amd64", "linux/arm64"]), (volume_image, ["linux/arm64"])]


def test_server_fact_an_image_volumes_pull_policy_is_defaulted_like_a_containers(
        cluster: KubeEnv, by_controller: dict[str, Any]) -> None:
    """The API server defaults ``volumes[].image.pullPolicy`` as ``imagePullPolicy``
    (``Always`` for ``:latest`` or no tag), before admission: the policy's CEL, the webhook
    and the controller read it as written; localkube defaults it the same way."""
    from localkube.podrules import default_pod

    refs = ["reg.example/a:1", "reg.example/a:latest", "reg.example/a",
            "reg.example/a@sha256:" + "0" * 64]
    pod = _pod("defaults", "reg.example/c:1", refs[0])
    pod["spec"]["volumes"] = [{"name": f"v{n}", "image": {"reference": r}}
                              for n, r in enumerate(refs)]
    del pod["spec"]["containers"][0]["volumeMounts"]
    r = cluster.request("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", json=pod)
    assert r.status_code == 201, r.text[:300]
    # (the ServiceAccount admission appends its token volume)
    got = [v["image"]["pullPolicy"] for v in r.json()["spec"]["volumes"] if "image" in v]
    assert got == ["IfNotPresent", "Always", "Always", "IfNotPresent"]
    default_pod(pod)
    assert [v["image"]["pullPolicy"] for v in pod["spec"]["volumes"]] == got


def test_server_fact_a_pod_create_cannot_carry_ephemeral_containers(
        cluster: KubeEnv, by_controller: dict[str, Any]) -> None:
    """Why ``ephemeralContainers`` are not among a pod's images (rules.place.placement
    ``CONTAINER_LISTS``): the API server refuses them in a create."""
    pod = _pod("ephemeral", "reg.example/c:1", "reg.example/v:1")
    pod["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "reg.example/d:1"}]
    r = cluster.request("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", json=pod)
    assert r.status_code == 422 and "ephemeralContainers" in r.text, r.text[:300]


def test_the_catalog_feed_publishes_the_volume_image(
        cluster: KubeEnv, by_controller: dict[str, Any],
        images: dict[str, tuple[str, str]]) -> None:
    image, volume_image = images["controller"]
    wait_for(lambda: {image, volume_image} <= set(_catalog(cluster)), 30)
    assert _catalog(cluster)[volume_image] == "linux/arm64"


def test_the_policy_places_by_the_image_volume_too(
        cluster: KubeEnv, by_controller: dict[str, Any],
        images: dict[str, tuple[str, str]]) -> None:
    image, volume_image = images["admission"]
    # warm the catalog: a pod running both images as containers, placed by the controller
    _budget(cluster, "0s")
    try:
        warm = _pod("warm", image, volume_image)
        warm["spec"]["containers"].append({"name": "w", "image": volume_image})
        del warm["spec"]["volumes"][1], warm["spec"]["containers"][0]["volumeMounts"]
        cluster.create(f"/api/v1/namespaces/{NS}/pods", warm)
        _settled(cluster, "warm")
        wait_for(lambda: {image, volume_image} <= set(_catalog(cluster)), 30)
    finally:
        _budget(cluster, "300ms")
    created = cluster.create(f"/api/v1/namespaces/{NS}/pods",
                             _pod("by-admission", image, volume_image))
    gates = created["spec"].get("schedulingGates") or []
    record = _record(created)
    assert gates == [] and record["path"] == "admission", (gates, record)
    assert _required(created) == ARM64_ONLY, record
    assert record["archs"] == ["arm64"]


def test_the_webhook_places_by_the_image_volume_too(
        cluster: KubeEnv, by_controller: dict[str, Any],
        images: dict[str, tuple[str, str]]) -> None:
    image, volume_image = images["webhook"]
    assert not {image, volume_image} & set(_catalog(cluster))
    _budget(cluster, "4s")
    try:
        created = cluster.create(f"/api/v1/namespaces/{NS}/pods",
                                 _pod("by-webhook", image, volume_image))
    finally:
        _budget(cluster, "300ms")
    record = _record(created)
    assert not created["spec"].get("schedulingGates"), record
    assert record["path"] == "webhook", record
    assert _required(created) == ARM64_ONLY, record
    assert [(i["image"], i["platforms"]) for i in record["images"]] == [
        (image, ["linux/amd64", "linux/arm64"]), (volume_image, ["linux/arm64"])]


def test_the_scheduler_binds_each_pod_to_an_arm64_node(cluster: KubeEnv) -> None:
    """kube-scheduler binds the three pods of an image volume only to arm64 nodes (the
    harness's fake nodes are of several architectures)."""
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"]["kubernetes.io/arch"]
             for n in cluster.get("/api/v1/nodes")["items"]}
    assert {"amd64", "arm64"} <= set(nodes.values()), nodes

    def bound() -> dict[str, str] | None:
        out = {}
        for name in ("by-controller", "by-admission", "by-webhook"):
            node = cluster.get(f"/api/v1/namespaces/{NS}/pods/{name}")["spec"].get("nodeName")
            if not node:
                return None
            out[name] = nodes[node]
        return out

    assert wait_for(bound, 30) == dict.fromkeys(("by-controller", "by-admission",
                                                 "by-webhook"), "arm64")
