"""Limits on what one client can hold of the webhook: request size, read times, connections.

The kube-apiserver sends one AdmissionReview per request, whole and at once, so a body that is
very large, arrives slowly or never ends, and connections that sit idle in their headers, come
from a broken or hostile client. Without limits uvicorn reads any body whole and waits for
headers and bodies forever (measured: a 100 MB body read whole, 50 connections stalled after
10 bytes of body still open after 70 s). Where each limit is enforced, and why there:

* **Body size** (:data:`DEFAULT_MAX_BODY_BYTES`): in the app (:func:`webhook.app.read_body`),
  which answers HTTP 413 from ``Content-Length`` before reading anything and, for a chunked
  body, counts the bytes as they arrive and stops at the limit. uvicorn has no body limit.
* **Body read time** (:data:`DEFAULT_BODY_TIMEOUT`): in the app too, around the reads: HTTP
  408. One sweep timer per app (:class:`webhook.app.BodyDeadlines`) rather than an
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

from dataclasses import dataclass, field

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
