"""Run the webhook app on uvicorn (httptools parser, uvloop in the CLI) over TLS 1.2+, with the
serving certificate reloaded from disk while the listener stays up (see :mod:`webhook.tls`)
and a header timeout and cap on open connections (see :mod:`webhook.limits`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podplacement.webhook.limits import ConnectionLimits
from podplacement.webhook.tls import CertReloader, server_ssl_context

log = logging.getLogger(__name__)


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening-ready TCP socket bound to ``host:port`` (``port=0``: a free port).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header read timeout, a cap on open connections and
    no reading on after an early answer (see :mod:`webhook.limits` for why each lives here).

    Bind the limits with :func:`limited_protocol`; uvicorn constructs one instance per
    accepted connection (``Config(http=<the class>)``). It overrides only the parser and
    transport callbacks it needs and calls uvicorn's for everything else.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._abort_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Abort the connection if ``max_connections`` are open; else start the header clock."""
        if len(self.connections) >= self.limits.max_connections:
            self._refused = True
            self.limits.stats.refused += 1
            log.debug("connection refused: %d open", len(self.connections))
            transport.abort()
            return
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the clocks; nothing else to undo for a refused connection."""
        self._cancel_header_timer()
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None
        if self._refused:
            return
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        """A request's first byte: start its header clock (the first request keeps the one
        started with the connection)."""
        super().on_message_begin()
        if self._header_timer is None:
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        """Headers complete: stop the clock; the body's is the app's (408)."""
        self._cancel_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        """Close the connection if the answer went out before the request body was read
        whole, instead of reading and discarding the rest with no time limit."""
        # With requests pipelined behind it, self.cycle is the next one and this request's
        # body was complete (the parser had moved on): nothing to do.
        cycle = self.cycle
        if (not self.pipeline and cycle is not None and cycle.more_body
                and not self.transport.is_closing()):
            self.limits.stats.early_closes += 1
            self.transport.close()
        super().on_response_complete()
        if self.transport.is_closing():  # also after a "Connection: close" answer (413, 408)
            self._abort_later()

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's keep-alive timeout (a TLS close), bounded like the other closes."""
        super().timeout_keep_alive_handler()
        self._abort_later()

    def _abort_later(self) -> None:
        """Bound a TLS close: ``transport.close()`` sends close_notify and then waits for the
        peer's (asyncio's ``ssl_shutdown_timeout``: 30 s) before the connection is released,
        so a client that stopped reading would keep its slot; abort it after
        ``header_timeout`` seconds instead."""
        if self._abort_timer is None:
            self._abort_timer = self.loop.call_later(self.limits.header_timeout,
                                                     self.transport.abort)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.limits.header_timeout,
                                                  self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.limits.stats.header_timeouts += 1
            log.debug("connection closed: headers incomplete after %s s",
                      self.limits.header_timeout)
            self.transport.abort()


def limited_protocol(limits: ConnectionLimits) -> type[LimitedHttpToolsProtocol]:
    """A :class:`LimitedHttpToolsProtocol` subclass bound to ``limits`` (one per server), for
    uvicorn's ``Config(http=...)``."""

    class BoundProtocol(LimitedHttpToolsProtocol):
        pass

    BoundProtocol.limits = limits
    return BoundProtocol


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal capture: it re-raises a captured SIGTERM after
    shutdown (exit status -15); :meth:`WebhookServer.serve` installs loop handlers instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WebhookServer:
    """uvicorn serving an ASGI app over TLS with certificate reload.

    Args:
        app: the ASGI app (:func:`webhook.app.create_app`).
        cert_file / key_file: PEM serving chain and key, watched for changes.
        host / port: where to listen when ``sock`` is not given.
        sock: an already bound socket (tests bind port 0 and read the port from it).
        reload_interval: seconds between certificate file polls.
        graceful_shutdown: seconds to wait for open connections at shutdown; a kept-alive TLS
            connection whose peer does not answer close_notify would otherwise hold it up.
        log_level: uvicorn's log level (``warning`` keeps access logs off).
        limits: header timeout and cap on open connections, enforced by the HTTP protocol
            (:class:`webhook.limits.LimitedHttpToolsProtocol`); defaults when None. The body
            limits are the app's (:func:`webhook.app.create_app`).

    Raises (from the constructor):
        OSError / ssl.SSLError: the certificate files cannot be loaded.
    """

    def __init__(
        self,
        app: Any,
        *,
        cert_file: str | Path,
        key_file: str | Path,
        host: str = "127.0.0.1",
        port: int = 9443,
        sock: socket.socket | None = None,
        reload_interval: float = 2.0,
        graceful_shutdown: float = 5.0,
        log_level: str = "warning",
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.limits = limits or ConnectionLimits()
        self.sock = sock or bind_socket(host, port)
        self.ssl_context = server_ssl_context(cert_file, key_file)
        self.reloader = CertReloader(self.ssl_context, cert_file, key_file,
                                     interval=reload_interval)
        config = uvicorn.Config(
            app,
            http=limited_protocol(self.limits),
            lifespan="on",
            log_level=log_level,
            access_log=False,
            ssl_certfile=str(cert_file),
            ssl_keyfile=str(key_file),
            timeout_keep_alive=30,
            timeout_graceful_shutdown=graceful_shutdown,  # type: ignore[arg-type]
        )
        config.load()
        # Serve with our context object so CertReloader can reload it in place.
        config.ssl = self.ssl_context
        self.server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return int(self.sock.getsockname()[1])

    @property
    def certs_loaded(self) -> bool:
        """True: the constructor loaded the chain (``/readyz`` input)."""
        return True

    async def serve(self, *, handle_signals: bool = False) -> None:
        """Serve until :meth:`stop`; with ``handle_signals`` also until SIGINT or SIGTERM
        (graceful shutdown, then return normally)."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._request_exit)
        self.reloader.start()
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            await self.reloader.stop()
            for sig in signals:
                loop.remove_signal_handler(sig)

    def _request_exit(self) -> None:
        self.server.should_exit = True

    async def start(self, start_within: float = 10.0) -> None:
        """Run :meth:`serve` in a background task and wait until it accepts connections.

        Raises:
            RuntimeError: the server did not start within ``start_within`` seconds.
        """
        self._task = asyncio.create_task(self.serve())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + start_within
        while not self.server.started:
            if self._task.done() or loop.time() > deadline:
                await self.stop()
                raise RuntimeError("webhook server did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Ask uvicorn to exit and wait for the background task."""
        self.server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                timeout = (self.server.config.timeout_graceful_shutdown or 0) + 10
                await asyncio.wait_for(self._task, timeout)
            self._task = None
        self.sock.close()
