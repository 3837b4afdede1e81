"""Real multi-architecture demo images built from Debian's ``busybox-static`` packages.

Each ``.deb`` (downloaded by ``hack/demo.sh`` with ``apt-get download busybox-static:<arch>``)
holds a statically linked ``/bin/busybox`` for its architecture. We turn each into a one-layer
OCI image (layer = gzip'd tar with ``bin/busybox`` and a ``bin/sh`` symlink) so the registry
serves genuine amd64/arm64/ppc64le/s390x binaries, not placeholders.
"""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

#: ELF ``e_machine`` of each OCI architecture (System V gABI): proves the binary is genuine.
ELF_MACHINE: dict[str, int] = {"amd64": 62, "arm64": 183, "ppc64le": 21, "s390x": 22}

#: Debian architecture name -> (OCI architecture, OCI variant).
DEBIAN_TO_OCI: dict[str, tuple[str, str | None]] = {
    "amd64": ("amd64", None),
    "arm64": ("arm64", "v8"),
    "ppc64el": ("ppc64le", None),
    "s390x": ("s390x", None),
}


@dataclass(frozen=True, slots=True)
class BusyboxBinary:
    """One architecture's busybox: OCI platform fields and the gzip'd layer bytes."""

    architecture: str
    variant: str | None
    layer: bytes
    binary_size: int


class DemoImageError(RuntimeError):
    """A ``.deb`` is missing or does not contain ``bin/busybox``."""


def _extract_busybox(deb: Path) -> bytes:
    """Return the bytes of ``./bin/busybox`` inside a busybox-static ``.deb``.

    Raises:
        DemoImageError: dpkg-deb failed or the file is not in the package.
    """
    proc = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise DemoImageError(f"dpkg-deb could not read {deb}: {proc.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        for member in tar.getmembers():
            if member.name in ("./bin/busybox", "bin/busybox") and member.isfile():
                data = tar.extractfile(member)
                if data is not None:
                    return data.read()
    raise DemoImageError(f"{deb} has no bin/busybox")


def elf_machine(binary: bytes) -> int:
    """Return the ELF header's ``e_machine`` field, honouring the file's byte order.

    Raises:
        DemoImageError: not an ELF file.
    """
    if binary[:4] != b"\x7fELF":
        raise DemoImageError("not an ELF binary")
    if binary[5] == 1:
        return int.from_bytes(binary[18:20], "little")
    return int.from_bytes(binary[18:20], "big")


def make_layer(binary: bytes) -> bytes:
    """Build a reproducible gzip'd tar layer holding ``bin/busybox`` and ``bin/sh -> busybox``."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        bin_dir = tarfile.TarInfo("bin")
        bin_dir.type, bin_dir.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(bin_dir)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(binary), 0o755
        tar.addfile(info, io.BytesIO(binary))
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
        tar.addfile(link)
    return gzip.compress(raw.getvalue(), mtime=0)


def load_busybox_debs(deb_dir: Path) -> dict[str, BusyboxBinary]:
    """Read ``busybox-static_*_<debarch>.deb`` files from ``deb_dir``.

    Returns: OCI architecture -> :class:`BusyboxBinary` for each of the four architectures.
    Raises:
        DemoImageError: a package for one of the four architectures is missing or unreadable.
    """
    out: dict[str, BusyboxBinary] = {}
    for deb_arch, (arch, variant) in DEBIAN_TO_OCI.items():
        matches = sorted(deb_dir.glob(f"busybox-static_*_{deb_arch}.deb"))
        if not matches:
            raise DemoImageError(
                f"no busybox-static package for {deb_arch} in {deb_dir} (run hack/demo.sh)"
            )
        binary = _extract_busybox(matches[-1])
        machine = elf_machine(binary)
        if machine != ELF_MACHINE[arch]:
            raise DemoImageError(f"{matches[-1]}: ELF machine {machine}, not {arch}")
        out[arch] = BusyboxBinary(arch, variant, make_layer(binary), len(binary))
    return out
