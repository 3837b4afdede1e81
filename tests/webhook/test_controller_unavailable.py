"""No cluster-wide stall when no controller runs (docs/how-it-decides.md "No cluster-wide
stall when the controller is down"): the webhook watches the controller's Lease and, once it
has not been renewed for the threshold, holds no pod at the gate. Placing them at admission is
tests/webhook/test_outage.py; here, without an inspector, they are released with the
fallback."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from localkube.patch import apply_patch
from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import (
    DECISION_ANNOTATION,
    GATE_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.leasewatch import ControllerLease, lease_record
from podplacement.webhook.patch import release_patch
from tests.webhook.asgi import asgi_post
from tests.webhook.reference import raw_body


def _apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return apply_patch("application/json-patch+json", obj, json.dumps(ops).encode(),
                       strategic=False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lease(clock: FakeClock, threshold: float = 60.0) -> ControllerLease:
    api = KubeAPI.from_url("https://127.0.0.1:1")  # never started: no connection made
    return ControllerLease(api, "podplacement-system", threshold=threshold, clock=clock)


def _lease_obj(renew: str, holder: str = "c-1") -> dict[str, Any]:
    return {"spec": {"holderIdentity": holder, "renewTime": renew, "leaseTransitions": 1}}


def test_availability_follows_observed_renewals_not_the_lease_timestamps() -> None:
    clock = FakeClock()
    lease = _lease(clock)
    assert lease.available()  # the webhook just started
    clock.now += 61
    assert not lease.available()  # no Lease at all for a minute
    lease._apply(_lease_obj("2000-01-01T00:00:00.000000Z"))  # any timestamp: a change
    assert lease.available()
    clock.now += 30
    lease._apply(_lease_obj("2000-01-01T00:00:00.000000Z"))  # same record: not a renewal
    clock.now += 31
    assert not lease.available() and lease.seconds_since_renewal() == 61
    lease._apply(_lease_obj("2000-01-01T00:00:02.000000Z"))
    assert lease.available()
    # a released Lease (no holder) is no running controller
    assert lease_record({"spec": {"holderIdentity": ""}}) is None


def test_a_released_or_missing_lease_means_no_controller_after_the_grace() -> None:
    """A stopping leader releases the Lease. A standby takes it within one retry period (a
    handover: keep gating); the last controller stands down after longer than the grace.
    So past the grace (4 s, not the 60 s threshold) the webhook places pods itself. A
    holder again makes the controller available again."""
    clock = FakeClock()
    lease = _lease(clock)
    lease._apply(_lease_obj("2000-01-01T00:00:00.000000Z"))
    assert lease.available()
    clock.now += 1
    lease._apply({"spec": {"holderIdentity": "", "renewTime": "2000-01-01T00:00:01Z"}})
    clock.now += 2
    lease._apply({"spec": {"holderIdentity": "", "renewTime": "2000-01-01T00:00:01Z"}})
    assert lease.available()  # a handover takes this long
    clock.now += 2.5
    assert not lease.available()  # 4.5 s without a holder
    lease._apply(_lease_obj("2000-01-01T00:00:03.000000Z", holder="c-2"))
    assert lease.available()
    lease._apply(None)  # deleted (its namespace is being deleted)
    clock.now += 4.5
    assert not lease.available()


def _gated_pod() -> dict[str, Any]:
    review = json.loads(raw_body("a-plain-pod"))
    pod = review["request"]["object"]
    pod["spec"]["schedulingGates"] = [{"name": "other"}, {"name": SCHEDULING_GATE}]
    pod["metadata"].setdefault("labels", {})[GATE_LABEL] = "gated"
    return review


def test_release_patch_removes_only_our_gate_and_records_why() -> None:
    pod = _gated_pod()["request"]["object"]
    new = _apply(pod, release_patch(pod, "no controller"))
    assert new["spec"]["schedulingGates"] == [{"name": "other"}]
    assert new["metadata"]["labels"][GATE_LABEL] == "removed"
    # the placement record every path writes: not an escape
    assert new["metadata"]["labels"]["podplacement.io/node-affinity"] == "not-set"
    decision = json.loads(new["metadata"]["annotations"][DECISION_ANNOTATION])
    assert decision == {"result": "controller-unavailable", "reason": "no controller"}
    bare = copy.deepcopy(pod)
    del bare["metadata"]["labels"]
    assert _apply(bare, release_patch(bare, "x"))["metadata"]["labels"] == {
        GATE_LABEL: "removed", "podplacement.io/node-affinity": "not-set"}
    del pod["spec"]["schedulingGates"]
    assert release_patch(pod, "x") == []


async def test_without_an_inspector_pods_are_released_with_the_fallback_while_no_controller_runs(
) -> None:
    clock = FakeClock()
    lease = _lease(clock, threshold=10)
    lease._apply(_lease_obj("t1"))
    app = create_app(StaticConfigSource(PlacementConfig()), controller_lease=lease)
    review = _gated_pod()
    body = json.dumps(review).encode()
    status, answer = await asgi_post(app, body)
    assert status == 200 and "patch" not in answer["response"]  # held: already gated
    clock.now += 11
    status, answer = await asgi_post(app, body)
    response = answer["response"]
    assert status == 200 and response["allowed"] is True
    assert ("image inspection failed at admission (no podplacement controller has renewed "
            "its Lease for 11 s)") in response["warnings"][0]
    ops = json.loads(base64.b64decode(response["patch"]))
    new = _apply(review["request"]["object"], ops)
    assert [g["name"] for g in new["spec"]["schedulingGates"]] == ["other"]
    decision = json.loads(new["metadata"]["annotations"][DECISION_ANNOTATION])
    assert decision["result"] == "fallback" and decision["path"] == "webhook"
    # no fallbackArchitecture, and the pod's nodeSelector pins kubernetes.io/os=linux
    # itself: the fallback has nothing to add, the affinity is unchanged
    assert decision["fallback"] is None
    assert decision["reason"].endswith("; fallback: any kubernetes.io/arch (no "
                                       "fallbackArchitecture); kubernetes.io/os as the pod "
                                       "pins it")
    assert new["spec"].get("affinity") == review["request"]["object"]["spec"].get("affinity")
    # a pod the policy did not gate is not gated by the webhook either
    plain = json.loads(raw_body("a-plain-pod"))
    status, answer = await asgi_post(app, json.dumps(plain).encode())
    new = _apply(plain["request"]["object"],
                 json.loads(base64.b64decode(answer["response"]["patch"])))
    assert not new["spec"].get("schedulingGates") and answer["response"]["warnings"]
    assert new["metadata"]["labels"][GATE_LABEL] == "removed"
    # the Lease is renewed: normal gating again
    lease._apply(_lease_obj("t2"))
    status, answer = await asgi_post(app, json.dumps(plain).encode())
    assert "patch" in answer["response"] and "warnings" not in answer["response"]
