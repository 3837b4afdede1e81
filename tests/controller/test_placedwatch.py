"""The one watch of placed pods (controller.placedwatch) against localkube: only pods with
the label podplacement.io/node-affinity reach the subscribers, a switched-off subscriber
gets nothing, one switched on later sees every placed pod (the watch lists again), and the
watch stops when no subscriber wants it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from localkube import LocalKube
from podplacement.controller.placedwatch import PlacedPods
from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import AFFINITY_LABEL
from tests.controller.conftest import eventually
from tests.harness.kube import KubeEnv, start_localkube


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[LocalKube, KubeEnv]]:
    server, env = start_localkube(tmp_path)
    try:
        yield server, env
    finally:
        env.close()
        server.stop()


@pytest.fixture
async def api(kube: tuple[LocalKube, KubeEnv]) -> AsyncIterator[KubeAPI]:
    client = await KubeAPI.from_kubeconfig(str(kube[1].kubeconfig))
    await client.request("POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}})
    try:
        yield client
    finally:
        await client.close()


async def _create(api: KubeAPI, name: str, placed: bool) -> None:
    labels = {AFFINITY_LABEL: "set"} if placed else {}
    await api.request("POST", "/api/v1/namespaces/a/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "reg/app:1"}]}})


async def _until(check: Any) -> None:
    async def once() -> Any:
        return check()

    await eventually(once, within=10.0)


async def test_subscribers_see_the_placed_pods_while_switched_on(api: KubeAPI) -> None:
    always: list[tuple[str, str, bool]] = []
    later: list[str] = []
    switch = {"on": False}
    watch = PlacedPods(api, watch_timeout=5, idle_seconds=0.1)
    watch.subscribe("always",
                    lambda t, p, _: always.append((t, p["metadata"]["name"], watch.listing)))
    watch.subscribe("later", lambda t, p, _: later.append(p["metadata"]["name"]),
                    enabled=lambda: switch["on"])
    await _create(api, "placed-1", placed=True)
    await _create(api, "gated", placed=False)
    watch.start()
    try:
        await _until(lambda: ("ADDED", "placed-1", True) in always)
        await _create(api, "placed-2", placed=True)
        await _until(lambda: ("ADDED", "placed-2", False) in always)
        assert later == [] and all(name != "gated" for _, name, _ in always)
        # switched on: the watch lists again, so it sees the pods placed before
        switch["on"] = True
        watch.changed()
        await _until(lambda: sorted(later) == ["placed-1", "placed-2"])
        assert always.count(("ADDED", "placed-1", True)) == 2
        switch["on"] = False
        await asyncio.sleep(0.3)
        await _create(api, "placed-3", placed=True)
        await _until(lambda: ("ADDED", "placed-3", False) in always)
        assert "placed-3" not in later
    finally:
        await watch.stop()
    assert not watch.running


async def test_the_watch_stops_when_no_subscriber_wants_it(api: KubeAPI) -> None:
    switch = {"on": True}
    seen: list[str] = []
    watch = PlacedPods(api, watch_timeout=5, idle_seconds=0.1)
    watch.subscribe("only", lambda t, p, _: seen.append(p["metadata"]["name"]),
                    enabled=lambda: switch["on"])
    watch.start()
    try:
        await _until(lambda: watch.running)
        switch["on"] = False
        await _until(lambda: not watch.running)
        await _create(api, "placed-late", placed=True)
        await asyncio.sleep(0.3)
        assert seen == []
    finally:
        await watch.stop()
