"""Limits on what one client can hold of the webhook: request size, read times, connections.

The kube-apiserver sends one AdmissionReview per request, whole and at once, so a body that is
very large, arrives slowly or never ends, and connections that sit idle in their headers, come
from a broken or hostile client. Without limits uvicorn reads any body whole and waits for
headers and bodies forever (measured: a 100 MB body read whole, 50 connections stalled after
10 bytes of body still open after 70 s). Where each limit is enforced, and why there:

* **Body size** (:data:`DEFAULT_MAX_BODY_BYTES`): in the app (:func:`read_body`),
  which answers HTTP 413 from ``Content-Length`` before reading anything and, for a chunked
  body, counts the bytes as they arrive and stops at the limit. uvicorn has no body limit.
* **Body read time** (:data:`DEFAULT_BODY_TIMEOUT`): in the app too, around the reads: HTTP
  408. One sweep timer per app (:class:`BodyDeadlines`) rather than an
  ``asyncio.timeout`` per request, whose timer cost about 6 us per request under uvloop.
  A route that answers without reading the body would leave the rest of it to uvicorn,
  which keeps reading and discarding it on a kept-alive connection with no time limit;
  :class:`webhook.server.LimitedHttpToolsProtocol` closes such a connection once the answer
  is written.
* **Header read time** (:data:`DEFAULT_HEADER_TIMEOUT`): in the HTTP protocol, since the app
  only runs once the headers are complete and uvicorn has no header timeout (its
  ``timeout_keep_alive`` is armed only after a response and cancelled by the first byte of
  the next request; httptools and h11 have no clock).
  :class:`webhook.server.LimitedHttpToolsProtocol`, a small subclass of uvicorn's httptools
  protocol, arms a timer when a connection is made and when a request's first byte arrives,
  cancels it when the headers are complete, and aborts the connection when it fires (no
  answer: the request is incomplete; Go's ``ReadHeaderTimeout`` does the same).
* **Open connections** (:data:`DEFAULT_MAX_CONNECTIONS`): in the same protocol, a connection
  made while the cap is reached is aborted at once, before any HTTP byte. Alternatives
  rejected: uvicorn's ``limit_concurrency`` still accepts and answers every request over the
  cap with **503**, and this webhook never answers 5xx; ``backlog`` only sizes the kernel's
  queue of connections not yet accepted, and asyncio accepts in a loop, so it bounds nothing
  once the server runs; pausing accept() needs private asyncio/uvloop server methods. The
  API server sees a refused connection as a failed call and applies ``failurePolicy: Ignore``,
  as for a timeout. Together with the timeouts above, a stalled connection holds a slot for
  at most the header or body timeout, plus ``header_timeout`` for the TLS close: a closing
  connection waits for the peer's close_notify (asyncio: up to 30 s), so the protocol aborts
  one still open ``header_timeout`` seconds after the close began.

This module holds the defaults and settings only (no uvicorn import: the CLI reads the
defaults at start-up for every subcommand); the protocol is in :mod:`webhook.server`.

What stays unbounded here: the TLS handshake runs before the protocol sees the connection, so
its time is asyncio's/uvloop's ``ssl_handshake_timeout`` (60 s; uvicorn does not expose it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect, Request

#: Default body limit, in bytes: 6 MiB. The API server refuses request bodies over 3 MiB
#: (``MaxRequestBodyBytes`` of kube-apiserver) and an AdmissionReview carries at most the
#: object and, for an UPDATE, the old object: 2 x 3 MiB.
DEFAULT_MAX_BODY_BYTES = 6 * 1024 * 1024
#: Default seconds from a request's first byte (or the connection) to its complete headers.
DEFAULT_HEADER_TIMEOUT = 10.0
#: Default seconds from complete headers to the last body byte. The API server sends the
#: body at once and waits ``timeoutSeconds`` for the answer (default 10 s, at most 30 s; this
#: project's webhook configuration sets 5 s), so a slower body is not one it waits for.
DEFAULT_BODY_TIMEOUT = 10.0
#: Default cap on open (TLS-established) connections.
DEFAULT_MAX_CONNECTIONS = 1000


@dataclass
class ConnectionStats:
    """Counts of the protocol-level limits firing (plain ints, one event loop).

    Attributes:
        refused: connections aborted because ``max_connections`` were open.
        header_timeouts: connections aborted because their headers were incomplete after
            ``header_timeout`` seconds.
        early_closes: connections closed after an answer written before the request body
            was complete (the rest of the body is not read).
    """

    refused: int = 0
    header_timeouts: int = 0
    early_closes: int = 0


@dataclass
class ConnectionLimits:
    """The protocol-level limits of one server.

    Attributes:
        header_timeout: seconds (> 0) a connection may take from being made, or from a
            request's first byte, to that request's complete headers; also the grace a
            closing connection gets to complete its TLS close before it is aborted.
        max_connections: open connections (>= 1) beyond which new ones are aborted.
        stats: counters of the limits firing.

    Raises (from the constructor):
        ValueError: a value out of range.
    """

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    stats: ConnectionStats = field(default_factory=ConnectionStats)

    def __post_init__(self) -> None:
        if not self.header_timeout > 0:
            raise ValueError(f"header_timeout must be > 0 seconds, got {self.header_timeout}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")

# --- reading a request body within its limits (the app reads bodies; uvicorn does not) -------

#: ``requests_total`` reasons of a refused body (labels of :mod:`webhook.metrics`).
REASON_BODY_TOO_LARGE = "body_too_large"
REASON_BODY_TIMEOUT = "body_timeout"


class BadContentLength(ValueError):
    """A ``Content-Length`` that is not a decimal number (answered with HTTP 400)."""


class BodyRefused(Exception):
    """The body was not read whole: too large or too slow. ``status`` is the HTTP status of
    the answer (4xx: the webhook never answers 5xx), ``reason`` the metrics label."""

    status = 400
    reason = ""


class BodyTooLarge(BodyRefused):
    """The body is over the limit (declared in ``Content-Length`` or counted): HTTP 413."""

    status = 413
    reason = REASON_BODY_TOO_LARGE


class BodyTimeout(BodyRefused):
    """The body was not received whole within the body timeout: HTTP 408."""

    status = 408
    reason = REASON_BODY_TIMEOUT


class BodyDeadlines:
    """Deadlines of the body reads in progress, enforced by one timer per ``tick`` seconds
    while any read is pending, instead of one timer per request.

    ``asyncio.timeout`` schedules and cancels a timer for every body (about 6 us per request
    under uvloop, measured; a few percent of the served cost of ``/mutate``, which is spent
    even when the body is already buffered, as it is for nearly every API server request).
    Here a read costs a dict entry; the sweep cancels the task of a read past its deadline
    and :func:`read_body` turns that cancellation into :class:`BodyTimeout`. A deadline fires
    between ``time_limit`` and ``time_limit + tick`` seconds after the read began. One
    instance per app; it works on whichever event loop is running.
    """

    def __init__(self, tick: float = 0.1) -> None:
        self.tick = tick
        #: task -> loop time of its deadline
        self._pending: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def add(self, task: asyncio.Task[Any], seconds: float) -> None:
        """Start the deadline of ``task``'s read: ``seconds`` from now."""
        loop = asyncio.get_running_loop()
        self._pending[task] = loop.time() + seconds
        if self._timer is None or self._timer_loop is not loop:
            self._timer_loop = loop
            self._timer = loop.call_later(self.tick, self._sweep)

    def discard(self, task: asyncio.Task[Any]) -> None:
        """The read ended (any way): forget its deadline."""
        self._pending.pop(task, None)
        self._expired.discard(task)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether the sweep cancelled ``task`` (its cancellation is ours to absorb)."""
        return task in self._expired

    def _sweep(self) -> None:
        loop = self._timer_loop
        assert loop is not None
        now = loop.time()
        for task, deadline in list(self._pending.items()):
            if deadline <= now:
                del self._pending[task]
                self._expired.add(task)
                task.cancel()
        self._timer = loop.call_later(self.tick, self._sweep) if self._pending else None


async def read_body(request: Request, *, max_bytes: int, time_limit: float,
                    deadlines: BodyDeadlines | None = None) -> bytes:
    """The request body, read whole as bytes, within ``max_bytes`` bytes and ``time_limit``
    seconds.

    A ``Content-Length`` over ``max_bytes`` is refused before anything is read; otherwise
    (also for a chunked body, which declares no length) the bytes are counted as they arrive
    and reading stops at the first chunk that crosses the limit. The time limit runs from the
    first read to the last body byte; it is enforced here because the app is where the body
    is read and uvicorn has no body timeout of its own: with ``deadlines`` (the app's, see
    :class:`BodyDeadlines`: cheaper, up to one tick late), else with ``asyncio.timeout``.

    Raises:
        BodyTooLarge: declared or received length over ``max_bytes``.
        BodyTimeout: the body did not arrive whole within ``time_limit`` seconds.
        BadContentLength: a ``Content-Length`` that is not a decimal number (httptools refuses those
            first; kept for other servers).
        starlette.requests.ClientDisconnect: the client went away mid-body.
    """
    for name, value in request.scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
                raise BadContentLength(f"Content-Length {value[:40]!r} is not a number")
            if int(value) > max_bytes:
                raise BodyTooLarge(
                    f"body of {int(value)} bytes is over the limit of {max_bytes} bytes")
            break
    task = asyncio.current_task() if deadlines is not None else None
    if deadlines is None or task is None:
        try:
            async with asyncio.timeout(time_limit):
                return await _receive_body(request, max_bytes)
        except TimeoutError:
            raise BodyTimeout(f"body not received whole within {time_limit:g} s") from None
    cancelling = task.cancelling()
    deadlines.add(task, time_limit)
    try:
        return await _receive_body(request, max_bytes)
    except asyncio.CancelledError:
        # A cancellation requested while this task waits in receive() is delivered there,
        # so the sweep's can only surface here, never after the read returned. Absorb only
        # the sweep's (as asyncio.timeout does): another one (shutdown) propagates.
        if not deadlines.expired(task) or task.uncancel() > cancelling:
            raise
        raise BodyTimeout(f"body not received whole within {time_limit:g} s") from None
    finally:
        deadlines.discard(task)


async def _receive_body(request: Request, max_bytes: int) -> bytes:
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(f"body is over the limit of {max_bytes} bytes")
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)
