"""Held reads of a watch (kubeclient/readhold.py, ``KubeAPI.watch(coalesce=...)``): over real
TLS (aiohttp on 127.0.0.1, a fresh CA) every event still arrives whole and in order, one
larger than a TLS record included, and events written apart arrive in batches; a transport
already paused is left alone, and a cancelled hold reads again."""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from podplacement.certs import generate_ca, issue_serving_cert
from podplacement.kubeclient import KubeAPI
from podplacement.kubeclient.readhold import FULL_READ, hold_reading
from tests.harness.aioserver import serving, streaming

EVENTS = [{"type": "MODIFIED", "object": {"metadata": {"name": f"p-{i}",
                                                       "resourceVersion": str(i)},
                                          "data": "x" * (40_000 if i == 7 else 3_000)}}
          for i in range(30)]


@pytest.fixture
async def tls_stream(tmp_path: Path) -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    """A TLS server whose ``/api/v1/pods`` writes :data:`EVENTS` one per write, 10 ms
    apart; yields its URL and a client context trusting its CA."""
    ca = generate_ca("watchcoalesce-ca")
    cert = issue_serving_cert(ca, [], ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    app = web.Application()
    app.router.add_get("/api/v1/pods", streaming(
        [orjson.dumps(event) + b"\n" for event in EVENTS], 0.010))
    async with serving(app, ssl_context=server_ctx) as url:
        yield url, ssl.create_default_context(cadata=ca.cert_pem.decode())


async def _read(url: str, ctx: ssl.SSLContext, coalesce: float
                ) -> list[tuple[float, dict[str, Any]]]:
    api = KubeAPI(url, ssl_context=ctx)
    try:
        return [(time.monotonic(), e)
                async for e in api.watch("/api/v1/pods", coalesce=coalesce)]
    finally:
        await api.close()


def _batches(arrivals: list[float], gap: float = 0.005) -> int:
    """Groups of events yielded less than ``gap`` seconds after the one before (events
    written 10 ms apart and read as they come are each a group of their own)."""
    return 1 + sum(1 for a, b in itertools.pairwise(arrivals) if b - a > gap)


async def test_held_reads_deliver_every_event_whole_in_order_and_in_batches(
        tls_stream: tuple[str, ssl.SSLContext]) -> None:
    url, ctx = tls_stream
    got = await _read(url, ctx, coalesce=0.1)
    assert [e for _, e in got] == EVENTS
    # 30 events written over about 300 ms, read at most every 100 ms: a few batches, where
    # reads as they come make 30
    assert _batches([t for t, _ in got]) <= 8, [round(t - got[0][0], 3) for t, _ in got]


async def test_without_holding_every_event_arrives_as_written(
        tls_stream: tuple[str, ssl.SSLContext]) -> None:
    url, ctx = tls_stream
    got = await _read(url, ctx, coalesce=0.0)
    assert [e for _, e in got] == EVENTS


class _Transport:
    """Records the flow-control calls hold_reading makes."""

    def __init__(self, *, reading: bool = True, limits: bool = True) -> None:
        self.reading = reading
        self.calls: list[Any] = []
        if limits:
            self.set_read_buffer_limits = self._limits

    def _limits(self, high: int | None = None, low: int | None = None) -> None:
        self.calls.append(("limits", high, low))

    def is_closing(self) -> bool:
        return False

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.reading = True
        self.calls.append("resume")


async def test_a_transport_paused_by_its_client_is_neither_held_nor_waited_on() -> None:
    t = _Transport(reading=False)
    started = time.monotonic()
    await hold_reading(t, 5.0)
    assert t.calls == [] and time.monotonic() - started < 1.0


async def test_after_a_full_read_the_reader_reads_on() -> None:
    t = _Transport()
    started = time.monotonic()
    await hold_reading(t, 5.0, last_read=FULL_READ)
    assert t.calls == [] and time.monotonic() - started < 1.0
    await hold_reading(t, 0.01, last_read=FULL_READ - 1)
    assert "pause" in t.calls


async def test_a_tls_transport_holds_its_socket_too_and_gets_its_defaults_back() -> None:
    t = _Transport()
    await hold_reading(t, 0.01)
    assert t.calls == [("limits", 1, 0), "pause", ("limits", None, None), "resume"]
    plain = _Transport(limits=False)
    await hold_reading(plain, 0.01)
    assert plain.calls == ["pause", "resume"]


async def test_a_cancelled_hold_reads_again() -> None:
    t = _Transport()
    task = asyncio.create_task(hold_reading(t, 30.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert t.calls[-2:] == [("limits", None, None), "resume"] and t.reading
