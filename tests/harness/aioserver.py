"""An aiohttp application served on 127.0.0.1 for the length of a test (the tests' HTTP and
TLS doubles of kube-apiserver and of webhooks)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(app: web.Application, *, ssl_context: ssl.SSLContext | None = None,
                  shutdown_timeout: float = 60.0) -> AsyncIterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1 (TLS with ``ssl_context``); yields its base
    URL (``http://127.0.0.1:PORT`` or ``https://...``); stops it on exit."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def streaming(chunks: Sequence[bytes], pause: float = 0.0
              ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler that answers with ``chunks`` as a chunked ``application/json`` body, one
    write each, ``pause`` seconds after each (0: no pause), then ends it (a watch stream
    the server closes)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
            if pause > 0:
                await asyncio.sleep(pause)
        await resp.write_eof()
        return resp

    return handler
