"""Reading layer blobs (imageinspect._layers): compression by media type and magic, tar
entries into a Layer, heads kept for executables only, early stop, cancellation."""

from __future__ import annotations

import threading

import pytest

from podplacement.imageinspect._elf import HEAD_BYTES
from podplacement.imageinspect._layers import (
    Cancelled,
    ChunkReader,
    LayerError,
    compression_of,
    scan_layer,
)
from podplacement.imageinspect._rootfs import FILE, HARDLINK, SYMLINK, Layer
from tests.imageinspect._images import (
    elf,
    file,
    gz,
    hardlink,
    layer,
    opaque,
    symlink,
    tar,
    whiteout,
    zst,
)

OCI_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_GZIP = OCI_TAR + "+gzip"
OCI_ZSTD = OCI_TAR + "+zstd"
DOCKER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

MEMBERS = [file("bin/busybox", elf("arm64")), symlink("bin/sh", "busybox"),
           hardlink("bin/ash", "bin/busybox"), file("etc/motd", b"hello", 0o644),
           whiteout("usr/bin/old"), opaque("opt")]


def fed(blob: bytes, chunk: int = 1000) -> ChunkReader:
    reader = ChunkReader()
    for i in range(0, len(blob), chunk):
        reader.put(blob[i:i + chunk])
    reader.close()
    return reader


@pytest.mark.parametrize(("media_type", "blob"), [
    (OCI_GZIP, layer(MEMBERS, "gzip")),
    (DOCKER_GZIP, layer(MEMBERS, "gzip")),
    (OCI_ZSTD, layer(MEMBERS, "zstd")),
    (OCI_TAR, layer(MEMBERS, "none")),
    ("application/octet-stream", layer(MEMBERS, "zstd")),  # told by its magic
])
def test_entries_whiteouts_and_heads(media_type: str, blob: bytes) -> None:
    out = Layer()
    assert scan_layer(fed(blob), media_type, out) is False
    assert out.complete
    busybox = out.entries["/bin/busybox"]
    assert busybox.kind == FILE and busybox.head == elf("arm64")[:HEAD_BYTES]
    assert out.entries["/bin/sh"].kind == SYMLINK and out.entries["/bin/sh"].link == "busybox"
    assert out.entries["/bin/ash"].kind == HARDLINK
    assert out.entries["/etc/motd"].head is None  # not executable: not kept
    assert out.whiteouts == {"/usr/bin/old"} and out.opaque == {"/opt"}


def test_multi_member_gzip_and_multi_frame_zstd() -> None:
    raw = tar([file("a", elf("amd64")), file("b", elf("s390x"))])
    for blob, media_type in ((gz(raw[:1536]) + gz(raw[1536:]), OCI_GZIP),
                             (zst(raw[:1536]) + zst(raw[1536:]), OCI_ZSTD)):
        out = Layer()
        scan_layer(fed(blob, 100), media_type, out)
        assert set(out.entries) == {"/a", "/b"}


def test_long_names_through_pax() -> None:
    name = "opt/" + "d" * 150 + "/app"
    out = Layer()
    scan_layer(fed(layer([file(name, elf("amd64"))])), OCI_GZIP, out)
    assert "/" + name in out.entries


def test_on_entry_stops_the_read() -> None:
    out = Layer()
    assert scan_layer(fed(layer(MEMBERS)), OCI_GZIP, out, lambda p: p == "/bin/sh") is True
    assert not out.complete and "/etc/motd" not in out.entries


@pytest.mark.parametrize("media_type", [OCI_TAR + "+encrypted", OCI_TAR + "+bzip2"])
def test_unreadable_compressions(media_type: str) -> None:
    with pytest.raises(LayerError):
        compression_of(media_type, b"")


def test_corrupt_layer_is_a_layer_error() -> None:
    with pytest.raises(LayerError):
        scan_layer(fed(b"\x1f\x8b" + b"garbage" * 100), OCI_GZIP, Layer())


def test_cancel_stops_a_waiting_reader() -> None:
    reader = ChunkReader()
    blob = layer(MEMBERS)
    reader.put(blob[:20])
    errors: list[BaseException] = []

    def run() -> None:
        try:
            scan_layer(reader, OCI_GZIP, Layer())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    reader.cancel()
    thread.join(5)
    assert not thread.is_alive()
    assert errors and isinstance(errors[0], Cancelled | LayerError)
