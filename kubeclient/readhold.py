"""Holding a connection's reads for a moment, so that what arrives meanwhile is read at once.

A watch's server writes each event apart. Read as it comes, every event costs the client one
wake-up of the event loop, one socket read, one TLS decryption call, one pass of the HTTP
parser and one wake-up of the reader: on a 3 kB pod event at 400 events/s that overhead is
about four times the JSON decoding and the controller's handlers together (``bench/watchread.py``
prints the figures). Holding
the reads for a few tens of milliseconds lets the kernel's socket buffer collect the events
sent meanwhile; they are then read, decrypted and parsed in one go.

asyncio's TLS transport (``sslproto``, Python 3.11+) reads the socket on its own while the
application's reads are paused, until its buffer of undecrypted bytes reaches its read
high-water mark (256 KiB by default). During the hold that mark is set to one byte, so the
first bytes that arrive pause the socket itself; the defaults are set back before reading
resumes. A plain TCP transport pauses the socket directly.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: A read this large (asyncio's TLS transport reads at most 256 KiB at a time) means the
#: reader is behind a burst: it reads on at once, unheld. Holding then would only let the
#: socket's buffer fill until TCP pushes back on the API server, whose watch cache ends a
#: watcher that stays blocked (the informer then watches again, or lists again on a 410).
FULL_READ = 256 * 1024


async def hold_reading(transport: Any, seconds: float, last_read: int = 0) -> None:
    """Stop reading ``transport`` (an ``asyncio.ReadTransport``) for ``seconds``, then read
    again. Nothing is held or awaited after a read of ``last_read`` >= :data:`FULL_READ`
    bytes, nor for a transport already paused (the HTTP client's own flow control: its
    buffer is full, so the reader must not wait) or closing. Cancellation resumes the reads
    before it propagates. Never raises for a transport that does not support flow control
    (it is then not held)."""
    if last_read >= FULL_READ:
        return
    try:
        if transport.is_closing() or not transport.is_reading():
            return
        limits = getattr(transport, "set_read_buffer_limits", None)
        if limits is not None:
            limits(high=1, low=0)
        transport.pause_reading()
    except (AttributeError, NotImplementedError, RuntimeError):
        return
    try:
        await asyncio.sleep(seconds)
    finally:
        try:
            if limits is not None:
                limits()  # asyncio's defaults
            if not transport.is_closing():
                transport.resume_reading()
        except (AttributeError, NotImplementedError, RuntimeError):
            pass
