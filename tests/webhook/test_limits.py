"""Request limits of the webhook served by uvicorn over real TLS on 127.0.0.1: body size (413),
body read time (408), header read time and the cap on open connections (closed connections,
never a 5xx). Bounds on elapsed times are generous upper bounds, not speed targets."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podplacement.certs import load_bundle
from podplacement.rules.config import PlacementConfig
from podplacement.webhook.app import WebhookMetrics, create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.limits import DEFAULT_MAX_BODY_BYTES, ConnectionLimits, read_body
from podplacement.webhook.server import WebhookServer
from tests.webhook.reference import raw_body
from tests.webhook.waiting import wait_until

BODY = raw_body("a-plain-pod")
#: Upper bound for "promptly" and "within the timeout" (the timeouts below are 1 s).
BOUND = 5.0

Response = tuple[int, dict[str, str], bytes]


@contextlib.asynccontextmanager
async def serving(certs: Path, *, max_body_bytes: int = len(BODY), body_timeout: float = 1.0,
                  header_timeout: float = 1.0,
                  max_connections: int = 100) -> AsyncIterator[WebhookServer]:
    metrics = WebhookMetrics()
    app = create_app(StaticConfigSource(PlacementConfig()), metrics=metrics,
                     max_body_bytes=max_body_bytes, body_timeout=body_timeout)
    srv = WebhookServer(app, cert_file=certs / "tls.crt", key_file=certs / "tls.key",
                        host="127.0.0.1", port=0, graceful_shutdown=0.5,
                        limits=ConnectionLimits(header_timeout=header_timeout,
                                                max_connections=max_connections,
                                                stats=metrics.connection_stats))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def ctx(cert_dir: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=load_bundle(cert_dir).decode())


@pytest.fixture
async def server(cert_dir: Path) -> AsyncIterator[WebhookServer]:
    """Body limit len(BODY) bytes, body and header timeouts 1 s."""
    async with serving(cert_dir) as srv:
        yield srv


async def connect(ctx: ssl.SSLContext, port: int
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                         server_hostname="127.0.0.1")


def head(length: int | None = None, *, path: str = "/mutate", method: str = "POST",
         chunked: bool = False) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> Response:
    """``(status, headers, body)`` of one HTTP/1.1 response with a Content-Length."""
    raw = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closed or aborted the connection without sending more bytes."""
    try:
        return await reader.read(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    started = time.monotonic()
    yield
    assert time.monotonic() - started < seconds


# --- body size: 413 -------------------------------------------------------------------------

async def test_a_body_at_the_limit_is_served(server: WebhookServer, ctx: ssl.SSLContext) -> None:
    async with httpx.AsyncClient(verify=ctx, timeout=BOUND) as c:
        resp = await c.post(f"https://127.0.0.1:{server.port}/mutate", content=BODY)
    assert resp.status_code == 200
    assert resp.json()["response"]["patchType"] == "JSONPatch"


async def test_a_declared_100_mb_body_gets_413_before_it_is_sent(
    cert_dir: Path, ctx: ssl.SSLContext
) -> None:
    """Default limit: Content-Length 100 MB and 5 bytes sent: refused from the header, the
    connection closed (the rest of the body is never read)."""
    async with serving(cert_dir, max_body_bytes=DEFAULT_MAX_BODY_BYTES) as srv:
        reader, writer = await connect(ctx, srv.port)
        writer.write(head(100_000_000) + b'{"api')
        with within(BOUND):
            status, headers, body = await asyncio.wait_for(read_response(reader), BOUND)
            assert await asyncio.wait_for(closed_by_server(reader), BOUND)
        writer.close()
        assert status == 413
        assert headers["connection"] == "close"
        assert b"over the limit of 6291456 bytes" in body
        assert _requests(srv, "body_too_large") == 1


async def test_one_byte_over_the_limit_gets_413(server: WebhookServer, ctx: ssl.SSLContext
                                                ) -> None:
    async with httpx.AsyncClient(verify=ctx, timeout=BOUND) as c:
        resp = await c.post(f"https://127.0.0.1:{server.port}/mutate", content=BODY + b" ")
    assert resp.status_code == 413
    assert "over the limit" in resp.json()["error"]


async def test_a_chunked_body_over_the_limit_gets_413_without_its_end(
    server: WebhookServer, ctx: ssl.SSLContext
) -> None:
    """No Content-Length: the bytes are counted as they arrive; the answer comes as soon as
    the limit is crossed, although the last chunk was never sent."""
    reader, writer = await connect(ctx, server.port)
    writer.write(head(chunked=True))
    piece = b"x" * 1000
    for _ in range(len(BODY) // len(piece) + 1):
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
    status, headers, _ = await asyncio.wait_for(read_response(reader), BOUND)
    assert status == 413
    assert headers["connection"] == "close"
    assert await asyncio.wait_for(closed_by_server(reader), BOUND)
    writer.close()
    assert _requests(server, "body_too_large") == 1


async def test_a_chunked_body_over_the_limit_via_httpx(server: WebhookServer,
                                                       ctx: ssl.SSLContext) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield BODY
        yield b"   "

    async with httpx.AsyncClient(verify=ctx, timeout=BOUND) as c:
        resp = await c.post(f"https://127.0.0.1:{server.port}/mutate", content=chunks())
        assert resp.status_code == 413
        # A chunked body within the limit is served.

        async def whole() -> AsyncIterator[bytes]:
            yield BODY[:100]
            yield BODY[100:]

        resp = await c.post(f"https://127.0.0.1:{server.port}/mutate", content=whole())
        assert resp.status_code == 200


# --- body read time: 408 --------------------------------------------------------------------

async def test_a_stalled_body_gets_408_and_the_connection_closes(
    server: WebhookServer, ctx: ssl.SSLContext
) -> None:
    """10 bytes of a 1000-byte body, then nothing: 408 after the 1 s body timeout."""
    reader, writer = await connect(ctx, server.port)
    writer.write(head(1000) + b'{"apiVersi')
    with within(BOUND):
        status, headers, body = await asyncio.wait_for(read_response(reader), BOUND)
        assert await asyncio.wait_for(closed_by_server(reader), BOUND)
    writer.close()
    assert status == 408
    assert headers["connection"] == "close"
    assert b"within 1 s" in body
    assert _requests(server, "body_timeout") == 1


async def test_fifty_stalled_bodies_are_all_closed(server: WebhookServer,
                                                   ctx: ssl.SSLContext) -> None:
    """The measured defect: 50 connections stalled after 10 bytes of body stayed open."""
    conns = [await connect(ctx, server.port) for _ in range(50)]
    for _, writer in conns:
        writer.write(head(1000) + b"0123456789")
    with within(BOUND * 2):
        statuses = await asyncio.wait_for(
            asyncio.gather(*(read_response(reader) for reader, _ in conns)), BOUND * 2)
        await wait_until(lambda: not server.server.server_state.connections, seconds=BOUND)
    assert {status for status, _, _ in statuses} == {408}
    for _, writer in conns:
        writer.close()


async def test_a_route_that_ignores_the_body_closes_the_connection(
    server: WebhookServer, ctx: ssl.SSLContext
) -> None:
    """/healthz answers without reading a body; the rest of a stalled one is not waited for."""
    reader, writer = await connect(ctx, server.port)
    writer.write(head(1000, path="/healthz", method="GET") + b"0123456789")
    status, _, body = await asyncio.wait_for(read_response(reader), BOUND)
    assert (status, body) == (200, b"ok")
    assert await asyncio.wait_for(closed_by_server(reader), BOUND)
    writer.close()
    assert server.limits.stats.early_closes == 1


# --- header read time -----------------------------------------------------------------------

@pytest.mark.parametrize("sent", [b"", b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\n"],
                         ids=["nothing", "half-the-headers"])
async def test_incomplete_headers_close_the_connection(
    server: WebhookServer, ctx: ssl.SSLContext, sent: bytes
) -> None:
    reader, writer = await connect(ctx, server.port)
    writer.write(sent)
    with within(BOUND):
        assert await asyncio.wait_for(closed_by_server(reader), BOUND)
    writer.close()
    assert server.limits.stats.header_timeouts == 1


async def test_trickled_headers_do_not_extend_the_deadline(
    server: WebhookServer, ctx: ssl.SSLContext
) -> None:
    """One header byte every 0.2 s: still closed about 1 s after the first byte."""
    reader, writer = await connect(ctx, server.port)
    closed = asyncio.create_task(closed_by_server(reader))
    with within(BOUND):
        for byte in head(len(BODY)):
            if closed.done():
                break
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                writer.write(bytes([byte]))
                await writer.drain()
            await asyncio.sleep(0.2)
        assert await asyncio.wait_for(closed, BOUND)
    writer.close()


async def test_the_next_request_on_a_kept_alive_connection_has_a_header_deadline(
    server: WebhookServer, ctx: ssl.SSLContext
) -> None:
    reader, writer = await connect(ctx, server.port)
    writer.write(head(len(BODY)) + BODY)
    status, headers, _ = await asyncio.wait_for(read_response(reader), BOUND)
    assert status == 200
    assert headers.get("connection") != "close"
    await asyncio.sleep(1.5)  # idle between requests: keep-alive (30 s), not the header clock
    writer.write(b"POST /mutate HTTP/1.1\r\n")
    with within(BOUND):
        assert await asyncio.wait_for(closed_by_server(reader), BOUND)
    writer.close()


# --- open connections -----------------------------------------------------------------------

async def test_connections_over_the_cap_are_closed_without_an_answer(
    cert_dir: Path, ctx: ssl.SSLContext
) -> None:
    """5 stalled connections fill a cap of 5; the 6th is closed before any HTTP byte (no 503);
    once the header timeout frees the slots, requests are served again."""
    async with serving(cert_dir, header_timeout=2.0, max_connections=5) as srv:
        stalled = [await connect(ctx, srv.port) for _ in range(5)]
        await wait_until(lambda: len(srv.server.server_state.connections) == 5)
        reader, writer = await connect(ctx, srv.port)
        writer.write(head(len(BODY)) + BODY)
        assert await asyncio.wait_for(closed_by_server(reader), BOUND)
        writer.close()
        assert srv.limits.stats.refused == 1
        assert len(srv.server.server_state.connections) == 5
        # The stalled ones time out; the slots are free again.
        await wait_until(lambda: not srv.server.server_state.connections, seconds=BOUND)
        async with httpx.AsyncClient(verify=ctx, timeout=BOUND) as c:
            resp = await c.post(f"https://127.0.0.1:{srv.port}/mutate", content=BODY)
            assert resp.status_code == 200
            metrics = (await c.get(f"https://127.0.0.1:{srv.port}/metrics")).text
        assert "podplacement_webhook_connections_refused_total 1.0" in metrics
        assert "podplacement_webhook_header_timeouts_total 5.0" in metrics
        for _, w in stalled:
            w.close()


# --- read_body in-process -------------------------------------------------------------------

def _requests(srv: WebhookServer, reason: str) -> float | None:
    metrics: WebhookMetrics = srv.server.config.app.state.metrics
    return metrics.registry.get_sample_value(
        "podplacement_webhook_requests_total", {"outcome": "bad_request", "reason": reason})


async def _read(messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]],
                max_bytes: int = 10) -> bytes:
    from starlette.requests import Request

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/mutate", "headers": headers}
    return await read_body(Request(scope, receive), max_bytes=max_bytes, time_limit=1.0)


async def test_read_body_joins_chunks_up_to_the_limit() -> None:
    chunks = [{"type": "http.request", "body": b"12345", "more_body": True},
              {"type": "http.request", "body": b"67890", "more_body": False}]
    assert await _read(chunks, []) == b"1234567890"


async def test_read_body_refuses_a_malformed_content_length() -> None:
    from podplacement.webhook.limits import BadContentLength

    with pytest.raises(BadContentLength, match="not a number"):
        await _read([], [(b"content-length", b"-1")])


async def test_a_client_that_stops_reading_does_not_hold_its_slot(
    server: WebhookServer, ctx: ssl.SSLContext
) -> None:
    """After the 408 the server's TLS close waits for the client's close_notify (30 s in
    asyncio); a client that never reads nor answers is aborted after a grace period instead."""
    import socket

    def open_and_send() -> ssl.SSLSocket:  # blocking: runs in a thread, the server on the loop
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=BOUND)
        tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(head(1000) + b"0123456789")
        return tls

    tls = await asyncio.to_thread(open_and_send)
    try:
        await wait_until(lambda: _requests(server, "body_timeout") == 1, seconds=BOUND)
        with within(BOUND):
            await wait_until(lambda: not server.server.server_state.connections,
                             seconds=BOUND)
    finally:
        tls.close()


def _stalled_request() -> tuple[Any, asyncio.Event]:
    """A Request whose body never completes (the first chunk, then waits forever)."""
    from starlette.requests import Request

    first = True
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"12", "more_body": True}
        await never.wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/mutate", "headers": []}
    return Request(scope, receive), never


@pytest.mark.parametrize("shared", [True, False], ids=["deadlines", "asyncio.timeout"])
async def test_read_body_times_out_a_stalled_body(shared: bool) -> None:
    from podplacement.webhook.limits import BodyDeadlines, BodyTimeout

    request, _ = _stalled_request()
    deadlines = BodyDeadlines(tick=0.05) if shared else None
    with within(BOUND), pytest.raises(BodyTimeout, match=r"within 0\.2 s"):
        await read_body(request, max_bytes=10, time_limit=0.2, deadlines=deadlines)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.3)  # the task is not cancelled later on


async def test_read_body_lets_another_cancellation_through() -> None:
    """Cancelling a read from outside (shutdown) stays a cancellation, not a 408."""
    from podplacement.webhook.limits import BodyDeadlines

    deadlines = BodyDeadlines(tick=0.05)
    request, _ = _stalled_request()
    reader = asyncio.create_task(
        read_body(request, max_bytes=10, time_limit=60, deadlines=deadlines))
    await asyncio.sleep(0.1)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert deadlines._pending == {}
