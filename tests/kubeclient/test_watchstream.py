"""The watch stream's lines (kubeclient/client.py ``KubeAPI.watch``): whatever the chunks
the server's writes arrive in (a line split over several, several lines in one, blank
lines, the last line without its newline), each event is decoded once, whole and in
order. A real HTTP server on 127.0.0.1 (aiohttp) writes the stream in the chunks given."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from podplacement.kubeclient import KubeAPI

EVENTS = [{"type": "ADDED", "object": {"metadata": {"name": f"p-{i}", "resourceVersion": str(i)},
                                       "data": "x" * (i * 37)}} for i in range(12)]


def _stream() -> bytes:
    lines = [json.dumps(e).encode() for e in EVENTS]
    # blank lines between some events; the last line without its newline
    return b"\n".join(lines[:5]) + b"\n\n" + b"\n".join(lines[5:]) + b"\n\n" + b"\n".join(
        [json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "99"}}})
         .encode()])


def _splits(data: bytes, mode: str) -> list[bytes]:
    if mode == "whole":
        return [data]
    if mode == "bytes":
        return [data[i:i + 1] for i in range(len(data))]
    if mode == "odd":  # chunk boundaries everywhere but at the newlines
        sizes, out, i, n = [7, 300, 1, 64, 1000, 3], [], 0, 0
        while i < len(data):
            out.append(data[i:i + sizes[n % len(sizes)]])
            i += sizes[n % len(sizes)]
            n += 1
        return out
    raise ValueError(mode)


@pytest.mark.parametrize("mode", ["whole", "bytes", "odd"])
async def test_every_event_is_decoded_whole_and_in_order_whatever_the_chunks(mode: str) -> None:
    chunks = _splits(_stream(), mode)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
            if mode != "bytes":
                await asyncio.sleep(0.001)  # separate reads
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/pods", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = KubeAPI(f"http://127.0.0.1:{port}")
    try:
        got: list[dict[str, Any]] = [e async for e in api.watch("/api/v1/pods")]
    finally:
        await api.close()
        await runner.cleanup()
    assert got[:-1] == EVENTS
    assert got[-1]["type"] == "BOOKMARK"
