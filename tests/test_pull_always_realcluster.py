"""Pods pulled with ``imagePullPolicy: Always``, placed inside the API server from a recent
check (docs/how-it-decides.md "Placement inside the API server", rules/freshness.py),
on the real control plane v1.36.2 with podplacement installed from deploy/ and the sample config
(``pullAlwaysFreshness: 5s``).

- The first pod of a tag pulled with Always goes through the webhook (which checks its
  digest); the controller then keeps checking the tag and publishes it in the params'
  ``spec.fresh``; the next pods are placed by the admission policy.
- The tag re-pushed with other platforms: the catalog follows within the window's half plus
  one write, and the next pods are placed with the new platforms.
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "always")


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    yield from running_product(cluster, registry, tmp_path_factory)


def _pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image,
                                     "imagePullPolicy": "Always"}],
                     "terminationGracePeriodSeconds": 0}}


def _spec(cluster: KubeEnv) -> dict[str, Any]:
    r = cluster.request("GET", PARAMS)
    return dict(r.json().get("spec") or {}) if r.is_success else {}


def _placed(cluster: KubeEnv, ns: str, name: str) -> dict[str, Any]:
    """The decision record of the pod once our gate is gone."""
    path = f"/api/v1/namespaces/{ns}/pods/{name}"

    def record() -> dict[str, Any] | None:
        pod = cluster.get(path)
        if any(g.get("name") == SCHEDULING_GATE for g in pod["spec"].get("schedulingGates")
               or []):
            return None
        out: dict[str, Any] = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
        return out

    return dict(wait_for(record, 30))


def test_always_pods_are_placed_by_the_policy_from_a_recent_check(
        cluster: KubeEnv, product: Product, registry: Registry, make_pusher: Any) -> None:
    ns = "always"
    cluster.ensure_namespace(ns)
    pusher = make_pusher(registry)
    first = pusher.multiarch("always/app", "v1", ["linux/amd64", "linux/arm64"])
    image = f"{registry.host}/always/app:v1"
    cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod("first", image))
    assert _placed(cluster, ns, "first").get("path") == "webhook"
    # the controller saw it placed, checked the tag and published it as fresh
    wait_for(lambda: _spec(cluster).get("fresh", {}).get(image) == first.digest, 20)
    paths = []
    for i in range(10):
        cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"next-{i}", image))
        paths.append(_placed(cluster, ns, f"next-{i}").get("path"))
    assert paths.count("admission") >= 9, paths

    # the tag re-pushed arm64 only: the catalog follows, then the pods
    pushed = time.monotonic()
    second = pusher.image("always/app", "v1", architecture="arm64")
    assert second.digest != first.digest
    wait_for(lambda: _spec(cluster).get("fresh", {}).get(image) == second.digest
             and flat_catalog(_spec(cluster))[0].get(image) == "linux/arm64", 15, every=0.1)
    print(f"the re-pushed tag was in the catalog {time.monotonic() - pushed:.1f} s after "
          f"the push (pullAlwaysFreshness 5s)")
    for i in range(3):
        cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"after-{i}", image))
        record = _placed(cluster, ns, f"after-{i}")
        assert record.get("archs") == ["arm64"], record
