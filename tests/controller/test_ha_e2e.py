"""Two controllers with Lease leader election: only the leader writes; the standby takes
over when the leader stops and finishes the pods still gated."""

from __future__ import annotations

from typing import Any

from podplacement.kubeclient import KubeAPI
from tests.controller.conftest import (
    Images,
    StartController,
    create_pod,
    eventually,
    gated_pod,
    wait_ungated,
)


async def test_only_the_leader_writes_and_the_standby_takes_over(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    election = {
        "leader_election": True,
        "namespace": ns,
        "lease_duration": 3,
        "renew_deadline": 2.0,
        "retry_period": 1.0,
    }
    a = await start_controller(identity="ctl-a", **election)
    b = await start_controller(identity="ctl-b", **election)

    async def one_leader() -> bool:
        return a.leading != b.leading

    await eventually(one_leader)
    leader, standby = (a, b) if a.leading else (b, a)
    for i in range(5):
        await create_pod(api, ns, gated_pod(f"ha{i}", [images.arm]))
    for i in range(5):
        await wait_ungated(api, ns, f"ha{i}")
    # the pod is ungated at the API server before the controller's coroutine counts it
    await eventually(lambda: _placed_count_is(leader, 5))
    assert standby.metrics.processed.labels("set")._value.get() == 0

    await leader.stop()  # graceful: the lease is released
    await eventually(lambda: _leading(standby))
    for i in range(5, 8):
        await create_pod(api, ns, gated_pod(f"ha{i}", [images.arm]))
    for i in range(5, 8):
        await wait_ungated(api, ns, f"ha{i}")
    await eventually(lambda: _placed_count_is(standby, 3))


async def _leading(ctl: object) -> bool:
    return bool(getattr(ctl, "leading", False))


async def _placed_count_is(ctl: Any, count: int) -> bool:
    """The controller counted ``count`` pods placed (``podplacement_pods_processed{result=
    "set"}``)."""
    return bool(ctl.metrics.processed.labels("set")._value.get() == count)
