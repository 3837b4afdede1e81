"""controller.leader on localkube: Lease leader election through kubernetes.aio.leaderelection.
Two candidates, one leader; graceful stop hands over at once (lease released); a crashed leader
is replaced after the lease expires; leadership terms never overlap; the Lease carries
MicroTimes the API server accepts (localkube checks the format as in leases.json)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from podplacement.controller.leader import LeaderElector, micro_time
from podplacement.kubeclient import KubeAPI
from tests.harness.kube import KubeEnv

NS = "podplacement-system"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/podplacement-controller"
MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
# the library's minimum: retry >= 1 s, renew_deadline > 1.2 * retry, lease > renew_deadline
FAST_LEASE, FAST_RENEW, FAST_RETRY = 3, 2.0, 1.0


@pytest.fixture
async def client(fresh_localkube: KubeEnv) -> AsyncIterator[KubeAPI]:
    fresh_localkube.ensure_namespace(NS)
    api = KubeAPI.from_url(fresh_localkube.url)
    try:
        yield api
    finally:
        await api.close()


class Timeline:
    """Start/stop events of every candidate, to check that terms never overlap."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []

    def elector(self, client: KubeAPI, identity: str) -> LeaderElector:
        elector: LeaderElector

        async def started() -> None:
            self.events.append((time.monotonic(), identity, "start"))
            await asyncio.Event().wait()  # leads until cancelled, like the controller

        async def stopped() -> None:
            self.events.append((time.monotonic(), identity,
                                "stop-graceful" if elector.shutting_down else "stop-lost"))

        elector = LeaderElector(client, NS, identity=identity, on_started_leading=started,
                                on_stopped_leading=stopped, lease_duration=FAST_LEASE,
                                renew_deadline=FAST_RENEW, retry_period=FAST_RETRY)
        return elector

    def assert_no_overlap(self) -> None:
        leader: str | None = None
        for _, who, what in sorted(self.events):
            if what == "start":
                assert leader is None, f"{who} started while {leader} was leading"
                leader = who
            else:
                assert leader == who, f"{who} stopped but {leader} was leading"
                leader = None


async def _until(predicate: Any, attempts: int = 150, interval: float = 0.1) -> None:
    for _ in range(attempts):
        if predicate():
            return
        await asyncio.sleep(interval)
    raise AssertionError("condition not reached")


def _start(elector: LeaderElector) -> asyncio.Task[None]:
    return asyncio.create_task(elector.run())


async def test_one_leader_and_graceful_handover(fresh_localkube: KubeEnv,
                                                client: KubeAPI) -> None:
    timeline = Timeline()
    a, b = timeline.elector(client, "a"), timeline.elector(client, "b")
    tasks = [_start(a), _start(b)]
    try:
        await _until(lambda: a.is_leader or b.is_leader)
        # both keep campaigning for several retry periods: never two leaders
        for _ in range(25):
            assert not (a.is_leader and b.is_leader)
            await asyncio.sleep(0.1)
        leader, standby = (a, b) if a.is_leader else (b, a)
        lease = fresh_localkube.get(LEASE)["spec"]
        assert lease["holderIdentity"] == leader.identity
        assert lease["leaseDurationSeconds"] == FAST_LEASE
        assert MICROTIME.match(lease["renewTime"]) and MICROTIME.match(lease["acquireTime"])
        first_acquire = lease["acquireTime"]
        await _until(lambda: fresh_localkube.get(LEASE)["spec"]["renewTime"] != lease["renewTime"])
        assert fresh_localkube.get(LEASE)["spec"]["acquireTime"] == first_acquire  # renewal

        await leader.stop()  # graceful: runs on_stopped_leading, releases the lease
        assert not leader.is_leader
        released = fresh_localkube.get(LEASE)["spec"]
        if released.get("holderIdentity") != standby.identity:  # not taken over yet
            assert "holderIdentity" not in released
            assert released["leaseDurationSeconds"] == 1
        await _until(lambda: standby.is_leader)
        after = fresh_localkube.get(LEASE)["spec"]
        assert after["holderIdentity"] == standby.identity
        assert after["leaseTransitions"] == lease.get("leaseTransitions", 0) + 1
        assert after["leaseDurationSeconds"] == FAST_LEASE
    finally:
        for e in (a, b):
            await e.stop()
        await asyncio.gather(*tasks)
    kinds = [(who, what) for _, who, what in sorted(timeline.events)]
    assert kinds[0] == (leader.identity, "start")
    assert (leader.identity, "stop-graceful") in kinds
    assert (standby.identity, "start") in kinds
    timeline.assert_no_overlap()


async def test_crashed_leader_is_replaced_after_the_lease_expires(
    fresh_localkube: KubeEnv, client: KubeAPI
) -> None:
    timeline = Timeline()
    a = timeline.elector(client, "a")
    task_a = _start(a)
    await _until(lambda: a.is_leader)
    b = timeline.elector(client, "b")
    task_b = _start(b)
    try:
        await asyncio.sleep(1.5)  # b campaigns as a follower while a renews
        await a.stop(release=False)  # a crash: the lease is left as it was
        await _until(lambda: b.is_leader)
        assert fresh_localkube.get(LEASE)["spec"]["holderIdentity"] == "b"
    finally:
        await a.stop()
        await b.stop()
        await asyncio.gather(task_a, task_b)
    timeline.assert_no_overlap()


async def test_leader_that_cannot_renew_steps_down(fresh_localkube: KubeEnv,
                                                   client: KubeAPI) -> None:
    """The API server refuses the leader's renewals (injected 409s): it gives up leading
    after renew_deadline, before a follower may take over, and campaigns again."""
    timeline = Timeline()
    a = timeline.elector(client, "a")
    task = _start(a)
    try:
        await _until(lambda: a.is_leader)
        assert fresh_localkube.server is not None
        fresh_localkube.server.inject_fault(409, 4, method="PUT", plural="leases")
        await _until(lambda: not a.is_leader, attempts=60)
        assert [w for _, _, w in timeline.events] == ["start", "stop-lost"]
        await _until(lambda: a.is_leader, attempts=100)  # re-acquires once writes succeed
    finally:
        await a.stop()
        await task
    assert a.terms == 2
    timeline.assert_no_overlap()


def test_micro_time_format() -> None:
    import datetime as dt

    t = dt.datetime(2026, 11, 22, 5, 55, 15, tzinfo=dt.UTC)
    assert micro_time(t) == "2026-11-22T05:55:15.000000Z"  # fraction kept when zero
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert micro_time(dt.datetime(2026, 1, 1, 2, 0, 0, 5, tzinfo=plus2)) == (
        "2026-01-01T00:00:00.000005Z")


def test_invalid_durations_are_rejected(fresh_localkube: KubeEnv) -> None:
    api = KubeAPI.from_url(fresh_localkube.url)
    with pytest.raises(ValueError):
        LeaderElector(api, NS, lease_duration=5, renew_deadline=5, retry_period=1)
    with pytest.raises(ValueError):
        LeaderElector(api, NS, lease_duration=5, renew_deadline=2, retry_period=2)
