"""Exact (os, arch) pairs on the real control plane (kube-apiserver, kube-scheduler v1.36.2).

Nodes linux/amd64, linux/arm64 and windows/amd64; an image index of windows/amd64 and
linux/arm64 (pushed to the test registry). The cross product ``arch In [amd64, arm64]`` AND
``os In [linux, windows]`` admitted linux/amd64, a platform the image does not have, and the
real scheduler bound such a pod there once the arm64 node was cordoned. With one term per OS
(docs/how-it-decides.md, item 4) the pod goes to windows/amd64 or nowhere, never to
linux/amd64; a pod with a term of its own keeps the linux pairs only (KEP-3838) and is warned.
The controller runs in-process against the real API server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from podplacement.controller.app import Controller, ControllerOptions
from podplacement.imageinspect import Inspector
from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import ARCH_LABEL, OS_LABEL, WINDOWS_BUILD_LABEL
from podplacement.rules.place.affinity import expression
from podplacement.rules.place.decision import PLATFORMS_LEFT_OUT
from podplacement.sandbox.controlplane import WINDOWS_BUILD_2022, FakeNode
from tests.controller.conftest import (
    create_pod,
    decision_of,
    events_for,
    eventually,
    gated_pod,
    get_pod,
    required_terms,
    wait_ungated,
)
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import checked_namespace, real_cluster
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

LINUX_AMD = FakeNode("pairs-linux-amd64", "amd64")
LINUX_ARM = FakeNode("pairs-linux-arm64", "arm64")
WINDOWS_AMD = FakeNode("pairs-windows-amd64", "amd64", os="windows",
                       labels={WINDOWS_BUILD_LABEL: WINDOWS_BUILD_2022})
ZONE = expression("topology.kubernetes.io/zone", "NotIn", ["zone-x"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from real_cluster(tmp_path_factory, "pairs",
                            nodes=(LINUX_AMD, LINUX_ARM, WINDOWS_AMD))


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    """A namespace whose bound pods are checked against their decision afterwards
    (``check_bindings``: the node's pair must be one of the decision's ``pairs``)."""
    yield from checked_namespace(cluster, "pairs")


@pytest.fixture
def mixed_image(registry: Registry, make_pusher: Any) -> str:
    make_pusher(registry).multiarch("pairs/app", "v1", ["windows/amd64", "linux/arm64"])
    return f"{registry.host}/pairs/app:v1"


@pytest.fixture
async def controller(cluster: KubeEnv, inspector: Inspector) -> AsyncIterator[KubeAPI]:
    api = await KubeAPI.from_kubeconfig(str(cluster.kubeconfig))
    ctl = Controller(api, ControllerOptions(leader_election=False, metrics_port=None,
                                            workers=4, retry_base_delay=0.05),
                     inspector=inspector)
    await ctl.start()
    try:
        await ctl.wait_synced(30)
        yield api
    finally:
        await asyncio.wait_for(ctl.stop(), 60)
        await api.close()


def _cordon(cluster: KubeEnv, node: FakeNode, unschedulable: bool) -> None:
    cluster.patch(f"/api/v1/nodes/{node.name}", {"spec": {"unschedulable": unschedulable}})


async def _bound_or_unschedulable(api: KubeAPI, ns: str, name: str) -> dict[str, Any]:
    """The pod once kube-scheduler bound it or reported it Unschedulable."""
    async def check() -> dict[str, Any] | None:
        pod = await get_pod(api, ns, name)
        conditions = {c.get("type"): c for c in pod.get("status", {}).get("conditions") or []}
        scheduled = conditions.get("PodScheduled") or {}
        if pod["spec"].get("nodeName") or scheduled.get("reason") == "Unschedulable":
            return pod
        return None

    result: dict[str, Any] = await eventually(check, within=30, every=0.2)
    return result


async def test_two_os_image_is_never_bound_to_linux_amd64(
    cluster: KubeEnv, ns: str, mixed_image: str, controller: KubeAPI
) -> None:
    api = controller
    cluster.wait_default_service_account(ns)
    arch_os = [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["arm64"]),
                              expression(OS_LABEL, "In", ["linux"])]},
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64"]),
                              expression(OS_LABEL, "In", ["windows"]),
                              # the pusher's windows entries carry os.version 10.0.20348.x
                              expression(WINDOWS_BUILD_LABEL, "In", [WINDOWS_BUILD_2022])]},
    ]
    _cordon(cluster, LINUX_ARM, True)
    try:
        # arm64 cordoned: among linux/amd64 and windows/amd64 only the windows node runs the
        # image. Several pods, since the scheduler breaks ties between equal nodes at random.
        names = [f"free-{i}" for i in range(4)]
        for name in names:
            await create_pod(api, ns, gated_pod(name, [mixed_image]))
        for name in names:
            pod = await wait_ungated(api, ns, name, within=30)
            assert required_terms(pod) == arch_os
            assert decision_of(pod)["pairs"] == ["linux/arm64", "windows/amd64"]
            bound = await _bound_or_unschedulable(api, ns, name)
            assert bound["spec"].get("nodeName") == WINDOWS_AMD.name, bound.get("status")

        # A term of the user's own: KEP-3838 allows no second term, so the term keeps the
        # linux pairs (arm64, cordoned) and the pod waits; windows/amd64 is warned as left out.
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [ZONE]}]}}}
        await create_pod(api, ns, gated_pod("terms", [mixed_image], affinity=affinity))
        pod = await wait_ungated(api, ns, "terms", within=30)
        linux_arm = arch_os[0]["matchExpressions"]
        assert required_terms(pod) == [{"matchExpressions": [ZONE, *linux_arm]}]
        events = await eventually(lambda: events_for(api, ns, "terms"))
        assert events[0]["reason"] == PLATFORMS_LEFT_OUT
        assert "windows/amd64" in (events[0].get("note") or events[0].get("message") or "")
        waiting = await _bound_or_unschedulable(api, ns, "terms")
        assert not waiting["spec"].get("nodeName"), waiting["spec"].get("nodeName")

        # Windows cordoned too: linux/amd64 is the only schedulable node and must stay
        # unused. Uncordoned again, the pod goes to windows/amd64.
        _cordon(cluster, WINDOWS_AMD, True)
        try:
            await create_pod(api, ns, gated_pod("late", [mixed_image]))
            await wait_ungated(api, ns, "late", within=30)
            late = await _bound_or_unschedulable(api, ns, "late")
            assert not late["spec"].get("nodeName"), late["spec"].get("nodeName")
        finally:
            _cordon(cluster, WINDOWS_AMD, False)
        late = await eventually(
            lambda: _node_of(api, ns, "late"), within=30, every=0.2)
        assert late == WINDOWS_AMD.name
        assert (await get_pod(api, ns, "terms"))["spec"].get("nodeName") is None
    finally:
        _cordon(cluster, LINUX_ARM, False)
    # arm64 back: the pod with its own term goes there (linux/arm64), never to linux/amd64
    assert await eventually(lambda: _node_of(api, ns, "terms"), within=30,
                            every=0.2) == LINUX_ARM.name


async def _node_of(api: KubeAPI, ns: str, name: str) -> str | None:
    node: str | None = (await get_pod(api, ns, name))["spec"].get("nodeName")
    return node
