"""The watch stream's lines (kubeclient/client.py ``KubeAPI.watch``): whatever the chunks
the server's writes arrive in (a line split over several, several lines in one, blank
lines, the last line without its newline), each event is decoded once, whole and in
order. A real HTTP server on 127.0.0.1 (aiohttp) writes the stream in the chunks given."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from podplacement.kubeclient import KubeAPI
from tests.harness.aioserver import serving, streaming

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

    app = web.Application()
    # "bytes": one write each, no pause; otherwise a pause after each, so separate reads
    app.router.add_get("/api/v1/pods", streaming(chunks, 0.0 if mode == "bytes" else 0.001))
    async with serving(app) as url, KubeAPI.from_url(url) as api:
        got: list[dict[str, Any]] = [e async for e in api.watch("/api/v1/pods")]
    assert got[:-1] == EVENTS
    assert got[-1]["type"] == "BOOKMARK"
