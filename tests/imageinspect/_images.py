"""Building blocks for image-verification tests: ELF headers of each architecture, tar
layers with symlinks, hard links and whiteouts, gzip or zstd compressed."""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass

import zstandard

from podplacement.imageinspect._elf import (
    ELFCLASS32,
    ELFCLASS64,
    ELFDATA2LSB,
    ELFDATA2MSB,
    EM_386,
    EM_AARCH64,
    EM_ARM,
    EM_PPC64,
    EM_RISCV,
    EM_S390,
    EM_X86_64,
)

#: OCI architecture -> (e_machine, EI_CLASS, EI_DATA) of a genuine binary of it.
ELF_IDENT: dict[str, tuple[int, int, int]] = {
    "amd64": (EM_X86_64, ELFCLASS64, ELFDATA2LSB),
    "arm64": (EM_AARCH64, ELFCLASS64, ELFDATA2LSB),
    "ppc64le": (EM_PPC64, ELFCLASS64, ELFDATA2LSB),
    "ppc64": (EM_PPC64, ELFCLASS64, ELFDATA2MSB),
    "s390x": (EM_S390, ELFCLASS64, ELFDATA2MSB),
    "arm": (EM_ARM, ELFCLASS32, ELFDATA2LSB),
    "386": (EM_386, ELFCLASS32, ELFDATA2LSB),
    "riscv64": (EM_RISCV, ELFCLASS64, ELFDATA2LSB),
}


def elf(arch: str, size: int = 4096) -> bytes:
    """A file starting with the ELF header of ``arch`` (e_type ET_EXEC), padded to
    ``size`` bytes: all the verifier reads of a binary."""
    machine, ei_class, ei_data = ELF_IDENT[arch]
    order = "little" if ei_data == ELFDATA2LSB else "big"
    ident = b"\x7fELF" + bytes([ei_class, ei_data, 1]) + b"\0" * 9
    header = ident + (2).to_bytes(2, order) + machine.to_bytes(2, order)
    return header + b"\0" * (size - len(header))


@dataclass(frozen=True)
class Member:
    """One tar member: ``kind`` file, dir, symlink, hardlink; ``data`` for files, ``link``
    for links."""

    name: str
    kind: str = "file"
    data: bytes = b""
    link: str = ""
    mode: int = 0o755


def file(name: str, data: bytes, mode: int = 0o755) -> Member:
    return Member(name, "file", data, mode=mode)


def symlink(name: str, target: str) -> Member:
    return Member(name, "symlink", link=target, mode=0o777)


def hardlink(name: str, target: str) -> Member:
    return Member(name, "hardlink", link=target)


def directory(name: str) -> Member:
    return Member(name, "dir")


def whiteout(path: str) -> Member:
    """The OCI whiteout deleting ``path`` from the layers below."""
    head, _, base = path.rstrip("/").rpartition("/")
    return Member(f"{head}/.wh.{base}".lstrip("/"), "file", b"", mode=0o644)


def opaque(directory_path: str) -> Member:
    """The OCI opaque marker hiding ``directory_path``'s lower contents."""
    return Member(f"{directory_path.strip('/')}/.wh..wh..opq", "file", b"", mode=0o644)


def tar(members: list[Member]) -> bytes:
    """An uncompressed PAX tar of ``members``, in the order given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.mode = m.mode
            info.mtime = 0
            if m.kind == "file":
                info.size = len(m.data)
                out.addfile(info, io.BytesIO(m.data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE}[m.kind]
            info.linkname = m.link
            out.addfile(info)
    return buf.getvalue()


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def layer(members: list[Member], compression: str = "gzip") -> bytes:
    """A layer blob: the tar of ``members``, gzip'd, zstd'd or plain."""
    raw = tar(members)
    return gz(raw) if compression == "gzip" else zst(raw) if compression == "zstd" else raw
