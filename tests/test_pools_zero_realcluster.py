"""Pools that start at zero (docs/pools/autoscalers.md), with podplacement
installed from deploy/ on the real control plane v1.36.2 whose only nodes are amd64 ones.

An arm64-only image's pods are placed for arm64 on every path (the controller's, the
admission policy's once the catalog has the image, the webhook's), with no fallback and no
hold: ungated, required ``kubernetes.io/arch In [arm64]``, and left Pending (the scheduler
reports them Unschedulable, the condition cluster-autoscaler and Karpenter act on). Each gets
one Normal ``PlatformNotInCluster`` Event, the controller's decision records
``noNodeYet``, and ``podplacement explain`` says that no node of linux/arm64 exists yet.
When a (fake, Ready) arm64 node registers, the scheduler binds every one of them to it.
Pods of platforms some node has get no such Event.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.rules.place.decision import PLACEMENT_DECIDED, PLATFORM_NOT_IN_CLUSTER
from podplacement.sandbox.controlplane import FakeNode, add_nodes
from podplacement.sandbox.product import NAMESPACE, Product, install_manifests
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import (
    REPO,
    checked_namespace,
    real_cluster,
    running_product,
    wait_for,
)
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
PARAMS = params_path(NAMESPACE)
#: The cluster's nodes at first: amd64 only (the arm64 pool is at zero).
AMD_NODES = (FakeNode("node-amd64-a", "amd64"), FakeNode("node-amd64-b", "amd64"))
#: The node "the autoscaler" adds later.
ARM_NODE = FakeNode("node-arm64-new", "arm64")
WAITING = ("no node of linux/arm64 exists yet: the pod waits for one (an autoscaler can "
           "create it)")
REPORTER = "podplacement.io/controller"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    plane = real_cluster(tmp_path_factory, "zero", nodes=AMD_NODES)
    env = next(plane)
    try:
        assert env.plane is not None
        install_manifests(env.plane, REPO / "deploy")
        yield env
    finally:
        plane.close()


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    yield from running_product(cluster, registry, tmp_path_factory)


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    yield from checked_namespace(cluster, "z")


def _set_budget(cluster: KubeEnv, budget: str) -> None:
    """``spec.admission.inspectionBudget`` (the webhook's watch takes it within moments)."""
    cluster.request("PATCH", CONFIG, json={"spec": {"admission": {"inspectionBudget": budget}}},
                    content_type="application/merge-patch+json").raise_for_status()
    time.sleep(1.0)


def _pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0}}


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in pod["spec"].get("schedulingGates") or [])


def _record(pod: dict[str, Any]) -> dict[str, Any] | None:
    raw = (pod["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
    return None if raw is None else dict(json.loads(raw))


def _path(pod: dict[str, Any]) -> str | None:
    record = _record(pod)
    return None if record is None else str(record.get("path", "controller"))


def _required_archs(pod: dict[str, Any]) -> list[set[str]]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [{v for e in t["matchExpressions"] if e["key"] == "kubernetes.io/arch"
             for v in e["values"]} for t in terms]


def _events(cluster: KubeEnv, ns: str, reason: str) -> dict[str, list[tuple[str, str]]]:
    """Pod UID → (type, note) of each of its ``reason`` Events by podplacement."""
    out: dict[str, list[tuple[str, str]]] = {}
    for ev in cluster.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]:
        if ev.get("reason") == reason and ev.get("reportingController") == REPORTER:
            out.setdefault(ev["regarding"]["uid"], []).append((ev["type"], ev["note"]))
    return out


def _told(cluster: KubeEnv, ns: str, uids: set[str], reason: str
          ) -> dict[str, list[tuple[str, str]]]:
    """Wait until each pod of ``uids`` has a ``reason`` Event; returns them all."""
    deadline = time.monotonic() + 20
    while True:
        told = _events(cluster, ns, reason)
        if uids <= set(told):
            return told
        assert time.monotonic() < deadline, f"not told {reason}: {uids - set(told)}; {told}"
        time.sleep(0.5)


def _unschedulable(pod: dict[str, Any]) -> bool:
    """Not bound, and kube-scheduler reported it Unschedulable (PodScheduled False): the
    state cluster-autoscaler and Karpenter scale up for (a gated pod is reported
    SchedulingGated instead)."""
    return not pod["spec"].get("nodeName") and any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or [])


def _explain(cluster: KubeEnv, ns: str, pod: str, registry: Registry, output: str) -> str:
    """``podplacement explain pod/NAME`` against the cluster (admin kubeconfig), inspecting
    the images in the test registry as the controller does."""
    proc = subprocess.run(
        [sys.executable, "-m", "podplacement", "explain", f"pod/{pod}", "--kubeconfig",
         str(cluster.kubeconfig), "-n", ns, "--insecure-registry", registry.host,
         "-o", output], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_arm64_pods_wait_placed_for_a_node_that_does_not_exist_yet_then_bind_to_it(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        make_pusher: Any) -> None:
    pusher = make_pusher(registry)
    pusher.image("zero/arm", "v1", architecture="arm64")
    image = f"{registry.host}/zero/arm:v1"
    pods_path = f"/api/v1/namespaces/{ns}/pods"

    # the controller's path: nothing inspected at admission, the pod is gated, then placed
    _set_budget(cluster, "0s")
    created = cluster.create(pods_path, _pod("by-controller", image))
    assert _gated(created)
    ctl = wait_for(lambda: (lambda p: p if not _gated(p) else None)(
        cluster.get(f"{pods_path}/by-controller")), 30)
    record = _record(ctl)
    assert record is not None and _path(ctl) == "controller"
    assert record["archs"] == ["arm64"] and record["result"] == "set"
    assert record["noNodeYet"] == ["linux/arm64"] and "fallback" not in record
    assert _required_archs(ctl) == [{"arm64"}]

    # the admission policy's path, once the controller published the image in the catalog
    wait_for(lambda: image in flat_catalog(cluster.get(PARAMS).get("spec") or {})[0],
             30)

    def by_policy() -> dict[str, Any] | None:
        made = cluster.create(pods_path, {**_pod("", image), "metadata": {
            "generateName": "by-policy-"}})
        return made if _path(made) == "admission" else None

    adm = wait_for(by_policy, 30, every=0.5)
    assert not _gated(adm) and _required_archs(adm) == [{"arm64"}]
    assert "noNodeYet" not in (_record(adm) or {})  # the policy sees no node

    # the webhook's path: an image never seen, inspected at admission
    pusher.image("zero/arm-new", "v1", architecture="arm64")
    _set_budget(cluster, "2s")  # the bound, not this machine's speed, is not under test
    hook = cluster.create(pods_path, _pod("by-webhook", f"{registry.host}/zero/arm-new:v1"))
    assert _path(hook) == "webhook" and not _gated(hook)
    assert _required_archs(hook) == [{"arm64"}]

    # one Normal PlatformNotInCluster per pod, whichever path placed it
    placed = {p["metadata"]["uid"]: p["metadata"]["name"] for p in (ctl, adm, hook)}
    told = _told(cluster, ns, set(placed), PLATFORM_NOT_IN_CLUSTER)
    for uid in placed:
        assert told[uid] == [("Normal", WAITING)], (placed[uid], told[uid])
    # no Warning about it: the pod is where it should be, waiting
    assert not set(placed) & set(_events(cluster, ns, "ArchitectureNotInCluster"))

    # explain says why the pod is pending
    table = _explain(cluster, ns, "by-controller", registry, "table")
    assert f"Nodes: {WAITING}\n" in table, table
    report = json.loads(_explain(cluster, ns, "by-webhook", registry, "json"))
    assert report["waiting"] == WAITING and report["noNodeYet"] == ["linux/arm64"]
    assert report["architectures"] == ["arm64"]

    # left Pending for the autoscaler: the scheduler reports every one Unschedulable
    names = list(placed.values())
    wait_for(lambda: all(_unschedulable(cluster.get(f"{pods_path}/{n}")) for n in names), 30)

    # "the autoscaler" registers an arm64 node: the scheduler binds each pod to it
    assert cluster.plane is not None
    add_nodes(cluster.plane, [ARM_NODE])
    bound = wait_for(lambda: (lambda ps: ps if all(p["spec"].get("nodeName") for p in ps)
                              else None)([cluster.get(f"{pods_path}/{n}") for n in names]), 60)
    assert {p["spec"]["nodeName"] for p in bound} == {ARM_NODE.name}


def test_pods_of_a_platform_some_node_has_get_no_such_event(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        make_pusher: Any) -> None:
    pusher = make_pusher(registry)
    pusher.multiarch("zero/multi", "v1", ["linux/amd64", "linux/arm64"])
    pusher.image("zero/amd", "v1", architecture="amd64")
    _set_budget(cluster, "0s")
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    made = [cluster.create(pods_path, _pod(name, f"{registry.host}/zero/{name}:v1"))
            for name in ("multi", "amd")]
    uids = {p["metadata"]["uid"] for p in made}
    _told(cluster, ns, uids, PLACEMENT_DECIDED)  # the decision's own Event was sent ...
    assert not uids & set(_events(cluster, ns, PLATFORM_NOT_IN_CLUSTER))  # ... and no other
    for name in ("multi", "amd"):
        pod = wait_for(lambda name=name: (lambda p: p if p["spec"].get("nodeName") else None)(
            cluster.get(f"{pods_path}/{name}")), 30)
        assert "noNodeYet" not in (_record(pod) or {})
    # (checked_namespace checks that each is bound to a node of its images' platforms)
