"""Reading one layer blob: decompress (gzip, zstd or none) and walk its tar entries into a
:class:`~imageinspect._rootfs.Layer`, keeping the first bytes of each executable file.

Blocking code for a worker thread: the bytes come from a :class:`ChunkReader` that the
event loop fills as the registry sends them (bounded: the loop hands over a chunk only when
the thread has room), so a layer is never held whole in memory and decompression never runs
on the event loop. Layer media types: OCI image-spec ``media-types.md`` / ``layer.md``
(``application/vnd.oci.image.layer.v1.tar``, ``+gzip``, ``+zstd``; Docker's
``application/vnd.docker.image.rootfs.diff.tar.gzip``); a type that names no compression is
told apart by its magic bytes (gzip ``1f 8b``, RFC 1952; zstd ``28 b5 2f fd``, RFC 8878).
Tar: POSIX ustar/pax and GNU long names, read by the standard library's ``tarfile`` in its
streaming mode.
"""

from __future__ import annotations

import contextlib
import gzip
import queue
import tarfile
import threading
from collections.abc import Callable
from typing import IO, Any, cast

import zstandard

from podplacement.imageinspect._elf import HEAD_BYTES
from podplacement.imageinspect._rootfs import DIR, FILE, HARDLINK, OTHER, SYMLINK, Entry, Layer

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class LayerError(Exception):
    """A layer blob cannot be read: unknown compression, corrupt data, not a tar."""


class Cancelled(Exception):
    """The reader was told to stop (the byte budget is spent or the check is done)."""


class ChunkReader:
    """A blocking, file-like reader over chunks handed in from another thread.

    Args:
        on_taken: called (in the reading thread) each time a chunk is taken, so the
            producer may hand in another one.
    """

    def __init__(self, on_taken: Callable[[], None] = lambda: None) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._buf = b""
        self._eof = False
        self._on_taken = on_taken
        self.cancelled = threading.Event()
        self.closed = False
        self.consumed = 0

    # --- producer side -------------------------------------------------------------
    def put(self, chunk: bytes) -> None:
        """Hand in the next chunk."""
        self._queue.put(chunk)

    def close(self) -> None:
        """No more chunks: the reader sees the end of the stream."""
        self.closed = True
        self._queue.put(None)

    def cancel(self) -> None:
        """Make the reading thread stop with :class:`Cancelled` at its next read."""
        self.cancelled.set()
        self._queue.put(None)

    # --- consumer side -------------------------------------------------------------
    def _fill(self) -> bool:
        while not self._buf and not self._eof:
            chunk = self._queue.get()
            if self.cancelled.is_set():
                raise Cancelled()
            if chunk is None:
                self._eof = True
                break
            self._on_taken()
            self._buf = chunk
        return bool(self._buf)

    def peek(self, n: int) -> bytes:
        """Up to ``n`` bytes without consuming them (fewer only at the end)."""
        while len(self._buf) < n and not self._eof:
            have = self._buf
            self._buf = b""
            if not self._fill():
                self._buf = have
                break
            self._buf = have + self._buf
        return self._buf[:n]

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is buffered when ``n`` < 0); b"" at the end.

        Raises:
            Cancelled: :meth:`cancel` was called.
        """
        if self.cancelled.is_set():
            raise Cancelled()
        if not self._fill():
            return b""
        if n < 0 or n >= len(self._buf):
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        self.consumed += len(out)
        return out

    def readable(self) -> bool:
        """File protocol."""
        return True


def compression_of(media_type: str, magic: bytes) -> str:
    """``gzip``, ``zstd`` or ``none`` for a layer of ``media_type`` starting with ``magic``.

    Raises:
        LayerError: an encrypted layer (``+encrypted``), or a type naming another
            compression.
    """
    mt = media_type.lower()
    if "encrypted" in mt:
        raise LayerError(f"encrypted layer ({media_type}) cannot be read")
    if mt.endswith(("+gzip", ".gzip", "tar.gz")):
        return "gzip"
    if mt.endswith(("+zstd", ".zstd")):
        return "zstd"
    if mt.endswith(("+bzip2", "+xz", ".bzip2", ".xz")):
        raise LayerError(f"unsupported layer compression ({media_type})")
    if magic.startswith(GZIP_MAGIC):
        return "gzip"
    if magic.startswith(ZSTD_MAGIC):
        return "zstd"
    return "none"


def decompressed(reader: ChunkReader, media_type: str) -> IO[bytes]:
    """A file object giving the layer's tar bytes (gzip members and zstd frames followed
    across their boundaries; zstd skippable frames skipped).

    Raises:
        LayerError: see :func:`compression_of`.
    """
    kind = compression_of(media_type, reader.peek(4))
    raw = cast(IO[bytes], reader)
    if kind == "gzip":
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
    if kind == "zstd":
        dctx = zstandard.ZstdDecompressor()
        return cast(IO[bytes], dctx.stream_reader(raw, read_across_frames=True))
    return raw


def _entry(member: tarfile.TarInfo, head: bytes | None) -> Entry:
    mode = member.mode & 0o7777
    if member.isreg():
        return Entry(FILE, mode, None, head, member.size)
    if member.isdir():
        return Entry(DIR, mode)
    if member.issym():
        return Entry(SYMLINK, mode, member.linkname)
    if member.islnk():
        return Entry(HARDLINK, mode, member.linkname)
    return Entry(OTHER, mode)


def scan_layer(
    reader: ChunkReader,
    media_type: str,
    layer: Layer,
    on_entry: Callable[[str], bool] = lambda path: False,
    head_bytes: int = HEAD_BYTES,
) -> bool:
    """Read one layer's tar entries into ``layer`` (blocking; run it in a worker thread).

    Args:
        reader: the layer blob's bytes as they arrive.
        media_type: the layer descriptor's media type.
        layer: filled with the entries; ``complete`` is set when the tar ends.
        on_entry: called with each entry's path (as :meth:`Layer.add` returns it); a true
            answer stops the reading (the caller knows what it wanted).
        head_bytes: bytes kept of each regular file with an execute bit.
    Returns:
        True when ``on_entry`` stopped it, False when the tar ended.
    Raises:
        LayerError: unreadable compression or tar.
        Cancelled: the reader was cancelled.
    """
    try:
        stream = decompressed(reader, media_type)
        tar = tarfile.open(fileobj=stream, mode="r|")
    except (tarfile.TarError, OSError, EOFError, zstandard.ZstdError) as exc:
        raise LayerError(f"not a readable tar layer: {exc}") from exc
    try:
        while True:
            member = tar.next()
            if member is None:
                break
            cast(Any, tar).members.clear()  # tarfile keeps every header otherwise
            head = None
            if member.isreg() and member.mode & 0o111 and member.size > 0:
                extracted = tar.extractfile(member)
                head = extracted.read(head_bytes) if extracted is not None else None
            path = layer.add(member.name, _entry(member, head))
            if on_entry(path):
                return True
    except Cancelled:
        raise
    except (tarfile.TarError, OSError, EOFError, zstandard.ZstdError) as exc:
        raise LayerError(f"layer read failed: {exc}") from exc
    finally:
        # Stream mode with our own file object: closing reads nothing more.
        with contextlib.suppress(Exception):
            tar.close()
    layer.complete = True
    return False
