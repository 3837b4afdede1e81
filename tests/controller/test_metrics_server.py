"""The controller's ``/metrics``, ``/healthz`` and ``/readyz`` server
(:class:`controller.metrics.HealthServer`) over real HTTP on 127.0.0.1."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from podplacement.controller.metrics import METRICS_CONTENT_TYPE, HealthServer, Metrics


async def test_serves_metrics_health_and_readiness_as_ready_says() -> None:
    metrics = Metrics()
    metrics.processed.labels(outcome="set").inc(3)
    ready = False
    server = HealthServer(metrics, port=0, ready=lambda: ready)
    await server.start()
    try:
        assert server.port != 0
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/readyz") as r:
                assert (r.status, await r.text()) == (503, "not ready")
            ready = True
            async with s.get(base + "/readyz") as r:
                assert (r.status, await r.text()) == (200, "ok")
            async with s.get(base + "/healthz") as r:
                assert (r.status, await r.text()) == (200, "ok")
            async with s.get(base + "/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"] == METRICS_CONTENT_TYPE
                text = await r.text()
            async with s.get(base + "/nothing") as r:
                assert r.status == 404
            async with s.post(base + "/metrics") as r:
                assert r.status == 405
    finally:
        await server.stop()
    assert 'podplacement_pods_processed_total{outcome="set"} 3.0' in text
    await server.stop()  # idempotent
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as s, s.get(base + "/healthz"):
            pass


async def test_healthz_names_the_unhealthy_runnables() -> None:
    failing: dict[str, str] = {}
    server = HealthServer(Metrics(), port=0, unhealthy=lambda: failing)
    await server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/healthz") as r:
                assert (r.status, await r.text()) == (200, "ok")
            failing["bindings"] = "died: RuntimeError: boom"
            failing["events"] = "returned before it was stopped"
            async with s.get(base + "/healthz") as r:
                assert r.status == 500
                assert await r.text() == ("unhealthy: bindings: died: RuntimeError: boom; "
                                          "events: returned before it was stopped")
    finally:
        await server.stop()


async def test_a_port_in_use_raises_oserror() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = HealthServer(Metrics(), port=taken.getsockname()[1])
        with pytest.raises(OSError):
            await server.start()
