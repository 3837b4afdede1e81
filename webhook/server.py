"""Run the webhook app on uvicorn (httptools parser, uvloop in the CLI) over TLS 1.2+, with the
serving certificate reloaded from disk while the listener stays up (see :mod:`webhook.tls`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from webhook.tls import CertReloader, server_ssl_context


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
    ) -> None:
        self.sock = sock or bind_socket(host, port)
        self.ssl_context = server_ssl_context(cert_file, key_file)
        self.reloader = CertReloader(self.ssl_context, cert_file, key_file,
                                     interval=reload_interval)
        config = uvicorn.Config(
            app,
            http="httptools",
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
