"""Server TLS for the webhook: TLS 1.2+ and certificate reload without dropping the listener.

How the certificate is swapped: uvicorn builds one :class:`ssl.SSLContext` at start-up and
wraps every accepted connection with it. :class:`CertReloader` keeps a reference to that same
context object and polls the certificate and key files (``os.stat``: inode, size, mtime; this
follows the ``..data`` symlink swap of a Kubernetes Secret volume, and the atomic renames of
:mod:`certs.store`). When they change it reads both files once, copies the bytes into a
private temporary directory and loads that copy into a scratch context, which fails if the
files were half-written or the key does not match the certificate; only then does it call
``load_cert_chain`` on the live context, from the same copy, so the live context only ever
gets a pair that was just validated. OpenSSL copies the certificate and key from
the context into each new connection at handshake time, so handshakes after the reload present
the new chain, while established connections keep theirs and the listening socket is never
closed. A failed reload keeps the old chain and is retried at the next poll. Changing the key
type (ECDSA ↔ RSA) needs a restart: OpenSSL keeps one chain per key type in a context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"


def server_ssl_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A server context with TLS 1.2 as the minimum version and the given chain loaded.

    Raises:
        OSError / ssl.SSLError: unreadable files or a key that does not match.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx


def _signature(*paths: Path) -> tuple[tuple[int, int, int], ...] | None:
    try:
        out = []
        for path in paths:
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)
    except OSError:
        return None


class CertReloader:
    """Keeps ``context`` serving the chain currently on disk.

    Args:
        context: the live server context (the one uvicorn wraps connections with).
        cert_file / key_file: PEM files (certificate chain, private key).
        interval: seconds between polls of the files.

    Attributes:
        reloads: number of successful reloads since start (observability and tests).
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        interval: float = 2.0,
    ) -> None:
        self.context = context
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.interval = interval
        self.reloads = 0
        self._seen = _signature(self.cert_file, self.key_file)
        self._failed: tuple[tuple[int, int, int], ...] | None = None
        self._task: asyncio.Task[None] | None = None

    def check(self) -> bool:
        """Reload now if the files changed since the last successful load; returns True when
        the live context was reloaded. Never raises on bad files (logs and keeps the old
        chain)."""
        sig = _signature(self.cert_file, self.key_file)
        if sig is None or sig == self._seen:
            return False
        try:
            cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
            with tempfile.TemporaryDirectory(prefix="podplacement-tls-") as tmp:
                cert_copy, key_copy = Path(tmp, CERT_FILE), Path(tmp, KEY_FILE)
                cert_copy.write_bytes(cert)
                key_copy.touch(mode=0o600)
                key_copy.write_bytes(key)
                server_ssl_context(cert_copy, key_copy)  # validate before touching live
                self.context.load_cert_chain(str(cert_copy), str(key_copy))
        except (OSError, ssl.SSLError, ValueError) as exc:
            if sig != self._failed:  # retried every poll; logged once per file version
                log.warning("serving certificate reload failed, keeping the old one: %s", exc)
                self._failed = sig
            return False
        self._seen = sig
        self.reloads += 1
        log.info("serving certificate reloaded", extra={"cert_file": str(self.cert_file)})
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()

    def start(self) -> None:
        """Start polling in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
