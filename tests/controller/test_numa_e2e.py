"""NUMA wiring end to end (issue 6 items 5-7): NRT candidates become hostname affinity;
without candidates the pod stays gated with ``podplacement.io/numa=waiting`` and a Warning
until an NRT change makes room."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import (
    ARCH_LABEL,
    HOSTNAME_LABEL,
    NUMA_LABEL,
    NUMA_LABEL_PLACED,
    OS_LABEL,
    SCHEDULING_GATE,
)
from podplacement.rules.place.affinity import expression
from podplacement.sandbox.controlplane import FakeNode, add_nodes
from tests.controller.conftest import (
    Images,
    StartController,
    check_bindings,
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

#: On the real control plane this module adds its own nodes (with NRTs) only.
FAKE_NODES: tuple[FakeNode, ...] = ()

NRT_PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
CONFIG_PATH = "/apis/podplacement.io/v1beta1/podplacementconfigs"


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {ARCH_LABEL: "amd64", OS_LABEL: "linux", HOSTNAME_LABEL: f"host-{name}"},
        },
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
        },
    }


def _nrt(name: str, cpu_free: tuple[int, int]) -> dict[str, Any]:
    zones = []
    for i, cpu in enumerate(cpu_free):
        zones.append(
            {
                "name": f"node-{i}",
                "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": 32, "allocatable": 32, "available": cpu},
                    {
                        "name": "memory",
                        "capacity": "64Gi",
                        "allocatable": "64Gi",
                        "available": "32Gi",
                    },
                ],
            }
        )
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "pod"},
        ],
        "zones": zones,
    }


def _guaranteed(pod: dict[str, Any], cpu: str) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "1Gi"}
    for c in pod["spec"]["containers"]:
        c["resources"] = {"requests": dict(res), "limits": dict(res)}
    return pod


@pytest.fixture
async def topology(api: KubeAPI, ckube: KubeEnv, namespace: str) -> AsyncIterator[None]:
    """Two amd64 nodes with NRTs (numa-a: 2+2 free cpus, numa-b: 2+8) and a config with
    topology enabled; all removed afterwards."""
    for name, free in (("numa-a", (2, 2)), ("numa-b", (2, 8))):
        if ckube.plane is not None:  # real: Ready and untainted, so the scheduler binds
            add_nodes(ckube.plane, [FakeNode(name, "amd64", cpu="64", memory="256Gi",
                                             labels={HOSTNAME_LABEL: f"host-{name}"})])
        else:
            await api.request("POST", "/api/v1/nodes", body=_node(name))
        await api.request("POST", NRT_PATH, body=_nrt(name, free))
    await api.request(
        "POST",
        CONFIG_PATH,
        body={
            "apiVersion": "podplacement.io/v1beta1",
            "kind": "PodPlacementConfig",
            "metadata": {"name": "cluster"},
            "spec": {
                "topology": {
                    "enabled": True,
                    "scoringStrategy": "LeastAllocated",
                    "maxWaitSeconds": 300,
                    "unsatisfiable": "Wait",
                }
            },
        },
    )
    try:
        yield
        if ckube.kind == "real":  # before the nodes go (the namespace's own check is later)
            check_bindings(ckube, namespace)
    finally:
        for path in (
            f"{CONFIG_PATH}/cluster",
            f"{NRT_PATH}/numa-a",
            f"{NRT_PATH}/numa-b",
            "/api/v1/nodes/numa-a",
            "/api/v1/nodes/numa-b",
        ):
            try:
                await api.request("DELETE", path)
            except ApiError:
                pass


async def _topology_on(ctl: Any) -> bool:
    return ctl.config_source()[0].topology.enabled and len(ctl.nrts.cache) == 2


async def test_candidates_become_hostname_affinity(
    api: KubeAPI,
    namespace: str,
    images: Images,
    topology: None,
    start_controller: StartController,
) -> None:
    ns = namespace
    ctl = await start_controller()
    await eventually(lambda: _topology_on(ctl))
    await create_pod(api, ns, _guaranteed(gated_pod("fits", [images.amd_arm]), "4"))
    pod = await wait_ungated(api, ns, "fits")
    host = expression(HOSTNAME_LABEL, "In", ["host-numa-b"])
    assert required_terms(pod) == [
        {"matchExpressions": [expression(ARCH_LABEL, "In", ["amd64", "arm64"]),
                              expression("kubernetes.io/os", "In", ["linux"]), host]}
    ]
    assert decision_of(pod)["numa"]["candidates"] == ["numa-b"]


async def test_no_candidate_waits_then_an_nrt_change_releases_it(
    api: KubeAPI,
    namespace: str,
    images: Images,
    topology: None,
    start_controller: StartController,
) -> None:
    ns = namespace
    ctl = await start_controller()
    await eventually(lambda: _topology_on(ctl))
    await create_pod(api, ns, _guaranteed(gated_pod("big", [images.amd_arm]), "9"))

    async def waiting() -> bool:
        pod = await get_pod(api, ns, "big")
        return pod["metadata"]["labels"].get(NUMA_LABEL) == "waiting" and pod["spec"].get(
            "schedulingGates"
        ) == [{"name": SCHEDULING_GATE}]

    await eventually(waiting)
    events = await eventually(lambda: events_for(api, ns, "big"))
    assert events[0]["reason"] == "WaitingForNUMAResources"
    # capacity frees up on numa-a: the NRT watch requeues the waiting pod
    nrt = await api.request("GET", f"{NRT_PATH}/numa-a")
    nrt["zones"] = _nrt("numa-a", (2, 10))["zones"]
    await api.request("PUT", f"{NRT_PATH}/numa-a", body=nrt)
    pod = await wait_ungated(api, ns, "big")
    assert pod["metadata"]["labels"][NUMA_LABEL] == NUMA_LABEL_PLACED
    assert required_terms(pod)[0]["matchExpressions"][-1] == expression(
        HOSTNAME_LABEL, "In", ["host-numa-a"]
    )


def _bind(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def _spy_observed(ctl: Any) -> list[tuple[str, str, bool]]:
    """Record (pod name, spec.nodeName, deleted) of every pod the binding feed hands to the
    in-flight accounting (then let the real method run)."""
    seen: list[tuple[str, str, bool]] = []
    real = ctl.inflight.observe_pod

    def observe(pod: dict[str, Any], *, deleted: bool = False) -> None:
        seen.append((pod["metadata"]["name"], str(pod["spec"].get("nodeName") or ""), deleted))
        real(pod, deleted=deleted)

    ctl.inflight.observe_pod = observe
    return seen


async def test_binding_narrows_the_in_flight_hold_to_the_chosen_node(
    api: KubeAPI,
    ckube: KubeEnv,
    namespace: str,
    images: Images,
    topology: None,
    start_controller: StartController,
) -> None:
    ns = namespace
    nrt = await api.request("GET", f"{NRT_PATH}/numa-a")
    nrt["zones"] = _nrt("numa-a", (2, 8))["zones"]
    await api.request("PUT", f"{NRT_PATH}/numa-a", body=nrt)
    ctl = await start_controller()
    await eventually(lambda: _topology_on(ctl))
    seen = _spy_observed(ctl)
    # A pod ungated without NUMA placement (BestEffort: no alignment needed), bound first.
    await create_pod(api, ns, gated_pod("plain", [images.amd_arm]))
    plain = await wait_ungated(api, ns, "plain")
    assert NUMA_LABEL not in plain["metadata"]["labels"]
    await create_pod(api, ns, _guaranteed(gated_pod("two", [images.amd_arm]), "4"))
    pod = await wait_ungated(api, ns, "two")
    assert pod["metadata"]["labels"][NUMA_LABEL] == NUMA_LABEL_PLACED
    assert sorted(decision_of(pod)["numa"]["candidates"]) == ["numa-a", "numa-b"]
    chosen = "numa-b"
    if ckube.kind == "real":
        # kube-scheduler binds both pods itself, maybe before the hold is read here.
        async def bound() -> str:
            return str((await get_pod(api, ns, "two"))["spec"].get("nodeName") or "")

        chosen = await eventually(bound)
        assert chosen in {"numa-a", "numa-b"}
    else:
        held = ctl.inflight.reservations()
        assert set(held) == {"numa-a", "numa-b"} and held["numa-a"]["cpu"] == 4000
        await api.request("POST", f"/api/v1/namespaces/{ns}/pods/plain/binding",
                          body=_bind("plain", "numa-a"))
        await api.request("POST", f"/api/v1/namespaces/{ns}/pods/two/binding",
                          body=_bind("two", "numa-b"))

    async def narrowed() -> bool:
        return set(ctl.inflight.reservations()) == {chosen}

    await eventually(narrowed)
    # The feed selects podplacement.io/numa=placed: it delivered "two" bound to its node and,
    # although "plain" was bound earlier (one watch stream, in order), never "plain".
    assert ("two", chosen, False) in seen
    assert not any(name == "plain" for name, _, _ in seen), seen
    if ckube.kind == "localkube":  # on the real one, earlier tests' pods may bind meanwhile
        assert all(name == "two" for name, _, _ in seen), seen


async def test_deleting_an_unbound_placed_pod_releases_its_hold(
    api: KubeAPI,
    namespace: str,
    images: Images,
    topology: None,
    start_controller: StartController,
) -> None:
    ns = namespace
    ctl = await start_controller()
    await eventually(lambda: _topology_on(ctl))
    seen = _spy_observed(ctl)
    await create_pod(api, ns, _guaranteed(gated_pod("gone", [images.amd_arm]), "4"))
    pod = await wait_ungated(api, ns, "gone")
    assert pod["metadata"]["labels"][NUMA_LABEL] == NUMA_LABEL_PLACED
    assert set(ctl.inflight.reservations()) == {"numa-b"}
    await api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/gone",
                      params={"gracePeriodSeconds": "0"})

    async def released() -> bool:
        return ctl.inflight.reservations() == {}

    await eventually(released)
    # unbound on localkube; on the real control plane kube-scheduler may have bound it first
    assert ("gone", "", True) in seen or ("gone", "numa-b", True) in seen
