"""Windows builds (issue #38, item 2) on the real control plane v1.36.2 with podplacement
installed from ``deploy/`` as shipped (webhook + controller of this checkout).

A process-isolated Windows container runs only on a host of its image's build, and the
kubelet labels Windows nodes ``node.kubernetes.io/windows-build`` (kubernetes.io, "Windows
containers in Kubernetes"; "Well-Known Labels"). Fake Windows nodes of builds 10.0.17763
(ltsc2019) and 10.0.20348 (ltsc2022, also the default ``node-windows``); images pushed to the
real registry whose index entries carry those ``os.version``\\ s. On main every windows/amd64
node was fit for every windows/amd64 image: the ltsc2019 pod could bind to a 2022 host. Now:

- each pod's windows term requires its build, and the real scheduler binds it only to a
  node of that build (several pods each, the scheduler breaks ties at random);
- a Windows image without ``os.version`` keeps today's rule (no build term) and binds to
  either build;
- a pod whose images share windows/amd64 but no build gets the unsatisfiable marker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.rules.config import (
    DECISION_ANNOTATION,
    NO_SUPPORTED_PLATFORM_KEY,
    SCHEDULING_GATE,
    WINDOWS_BUILD_LABEL,
)
from podplacement.sandbox.controlplane import WINDOWS_BUILD_2022, FakeNode, add_nodes
from podplacement.sandbox.product import Product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import installed_cluster, running_product, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

BUILD_2019 = "10.0.17763"
WIN_2019 = FakeNode("win-ltsc2019", "amd64", os="windows",
                    labels={WINDOWS_BUILD_LABEL: BUILD_2019})
WIN_2022 = FakeNode("win-ltsc2022", "amd64", os="windows",
                    labels={WINDOWS_BUILD_LABEL: WINDOWS_BUILD_2022})
#: The default fake nodes' windows node (build 10.0.20348) and the two above.
BUILD_OF = {WIN_2019.name: BUILD_2019, WIN_2022.name: WINDOWS_BUILD_2022,
            "node-windows": WINDOWS_BUILD_2022}
NS = "winbuilds"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    for env in installed_cluster(tmp_path_factory, "winbuilds"):
        assert env.plane is not None
        add_nodes(env.plane, [WIN_2019, WIN_2022])
        yield env


@pytest.fixture(scope="module")
def images(registry: Registry, make_pusher: Any) -> dict[str, str]:
    """ltsc2019 / ltsc2022 / both builds / no os.version, each a windows/amd64 index."""
    pusher = make_pusher(registry)
    pusher.multiarch("win/ltsc2019", "v1", [f"windows/amd64@{BUILD_2019}.5458"])
    pusher.multiarch("win/ltsc2022", "v1", [f"windows/amd64@{WINDOWS_BUILD_2022}.2340"])
    pusher.multiarch("win/noversion", "v1", ["windows/amd64@"])
    return {name: f"{registry.host}/win/{name}:v1"
            for name in ("ltsc2019", "ltsc2022", "noversion")}


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    yield from running_product(cluster, registry, tmp_path_factory)


@pytest.fixture(scope="module")
def ns(cluster: KubeEnv, product: Product) -> str:
    cluster.ensure_namespace(NS)
    cluster.wait_default_service_account(NS)
    return NS


def _pod(name: str, *images: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": f"c{i}", "image": image}
                                    for i, image in enumerate(images)],
                     "terminationGracePeriodSeconds": 0}}


def _settled(cluster: KubeEnv, name: str, within: float = 40) -> dict[str, Any]:
    """The pod once our gate is gone (by any path)."""
    def ungated() -> dict[str, Any] | None:
        pod = cluster.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        gates = pod["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else pod

    return dict(wait_for(ungated, within))


def _node(cluster: KubeEnv, name: str, within: float = 30) -> str:
    def bound() -> str | None:
        node = cluster.get(f"/api/v1/namespaces/{NS}/pods/{name}")["spec"].get("nodeName")
        return str(node) if node else None

    return str(wait_for(bound, within, every=0.2))


def _terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    na = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(req.get("nodeSelectorTerms") or [])


def _builds(pod: dict[str, Any]) -> list[list[str]]:
    """Per required term, the values of its windows-build expression ([] when none)."""
    return [[v for e in t.get("matchExpressions") or [] if e["key"] == WINDOWS_BUILD_LABEL
             for v in e["values"]] for t in _terms(pod)]


def _create(cluster: KubeEnv, name: str, *images: str) -> None:
    cluster.create(f"/api/v1/namespaces/{NS}/pods", _pod(name, *images))


def _cordon(cluster: KubeEnv, node: str, unschedulable: bool) -> None:
    cluster.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": unschedulable}})


def test_each_windows_pod_binds_only_to_its_build(cluster: KubeEnv, ns: str,
                                                  images: dict[str, str]) -> None:
    pods = {f"{build}-{i}": build for build in ("ltsc2019", "ltsc2022") for i in range(4)}
    for name, build in pods.items():
        _create(cluster, name, images[build])
    wanted = {"ltsc2019": BUILD_2019, "ltsc2022": WINDOWS_BUILD_2022}
    wrong, placed = {}, {}
    for name, build in pods.items():
        placed[name] = _settled(cluster, name)
        node = _node(cluster, name)
        if BUILD_OF.get(node) != wanted[build]:
            wrong[name] = node
    assert wrong == {}, f"bound to a host of another build: {wrong}"
    for name, pod in placed.items():
        build = wanted[pods[name]]
        record = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
        assert _builds(pod) == [[build]], (name, _terms(pod))
        assert record["windowsBuilds"] == {"windows/amd64": [build]}, record


def test_windows_image_without_os_version_binds_to_either_build(
        cluster: KubeEnv, ns: str, images: dict[str, str]) -> None:
    # only the ltsc2019 host schedulable: an image without os.version still goes there
    _cordon(cluster, WIN_2022.name, True)
    _cordon(cluster, "node-windows", True)
    try:
        _create(cluster, "noversion-a", images["noversion"])
        pod = _settled(cluster, "noversion-a")
        assert _builds(pod) == [[]], _terms(pod)
        record = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
        assert "windowsBuilds" not in record, record
        assert _node(cluster, "noversion-a") == WIN_2019.name
    finally:
        _cordon(cluster, WIN_2022.name, False)
        _cordon(cluster, "node-windows", False)
    # and only a 2022 host schedulable: there too
    _cordon(cluster, WIN_2019.name, True)
    try:
        _create(cluster, "noversion-b", images["noversion"])
        _settled(cluster, "noversion-b")
        assert BUILD_OF[_node(cluster, "noversion-b")] == WINDOWS_BUILD_2022
    finally:
        _cordon(cluster, WIN_2019.name, False)


def test_images_of_disjoint_builds_get_the_unsatisfiable_marker(
        cluster: KubeEnv, ns: str, images: dict[str, str]) -> None:
    _create(cluster, "both", images["ltsc2019"], images["ltsc2022"])
    pod = _settled(cluster, "both")
    keys = [{e["key"] for e in t.get("matchExpressions") or []} for t in _terms(pod)]
    assert keys and all(NO_SUPPORTED_PLATFORM_KEY in k for k in keys), _terms(pod)
    record = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    assert record["result"] == "no-supported-platform", record
