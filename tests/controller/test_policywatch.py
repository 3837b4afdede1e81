"""The controller's PolicyWatch: ranking on every event, the published policies, and one
status round (patches only what differs; the placed-pods gauge), with an API double that
records requests."""

from __future__ import annotations

import asyncio
from typing import Any

from podplacement.controller.metrics import Metrics
from podplacement.controller.policywatch import POLICY_STATUS_PATH, PolicyWatch
from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.policy import params_policies


class _Api:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.sent.append((method, path, body))
        return {}


def _policy(name: str, priority: int, created: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "generation": 2,
                         "creationTimestamp": created, "resourceVersion": "1"},
            "spec": {"priority": priority, "podSelector": {"matchLabels": {"app": name}}}}


def _placed_pod(name: str, policy: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name,
                         "labels": {"podplacement.io/policy": policy}}}


def test_ranking_is_published_and_status_patched_once() -> None:
    api = _Api()
    metrics = Metrics()
    store = ParamsStore(60.0)
    watch = PolicyWatch(api, on_change=lambda r: store.set_policies(params_policies(r)),  # type: ignore[arg-type]
                        placed_gauge=metrics.policy_placed_pods)
    for obj in (_policy("a", 5, "2026-01-01T00:00:00Z"), _policy("b", 5, "2026-02-01T00:00:00Z"),
                _policy("c", 1, "2026-01-01T00:00:00Z")):
        watch.policies.cache[f"ns/{obj['metadata']['name']}"] = obj
        watch._on_policy("ADDED", obj, None)
    assert [p["name"] for p in store.policies()["ns"]] == ["a", "c"]
    assert store.dirty
    watch.placed.cache["ns/p1"] = _placed_pod("p1", "a")
    watch.placed.cache["ns/p2"] = _placed_pod("p2", "a")

    patched = asyncio.run(watch.sync_status())
    assert patched == 3
    bodies = {path: body["status"] for method, path, body in api.sent if method == "PATCH"}
    a = bodies[POLICY_STATUS_PATH.format(namespace="ns", name="a")]
    b = bodies[POLICY_STATUS_PATH.format(namespace="ns", name="b")]
    assert a["placedPods"] == 2 and a["selector"] == "app=a"
    assert a["conditions"][0]["status"] == "True"
    assert b["conditions"][0]["reason"] == "PriorityConflict"
    text = metrics.render().decode()
    assert 'podplacement_policy_placed_pods{namespace="ns",policy="a"} 2.0' in text

    # the live status now equals the desired one: nothing is patched again
    for name, status in (("a", a), ("b", b),
                         ("c", bodies[POLICY_STATUS_PATH.format(namespace="ns", name="c")])):
        watch.policies.cache[f"ns/{name}"]["status"] = status
    api.sent.clear()
    assert asyncio.run(watch.sync_status()) == 0 and api.sent == []

    # a deleted policy leaves the gauge
    del watch.policies.cache["ns/c"]
    asyncio.run(watch.sync_status())
    assert 'policy="c"' not in metrics.render().decode()
