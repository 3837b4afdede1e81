"""Real multi-architecture demo images built from Debian's ``busybox-static`` packages.

Each ``.deb`` holds a statically linked ``/bin/busybox`` for its architecture. We turn each into
a one-layer OCI image (layer = gzip'd tar with ``bin/busybox`` and a ``bin/sh`` symlink) so the
registry serves genuine amd64/arm64/ppc64le/s390x binaries, not placeholders.

:func:`prepare_busybox` gets what is missing itself: ``apt-get download
busybox-static:<arch>`` into the packages directory (a user cache directory by default, see
:func:`default_debs_dir`; no root needed once the foreign dpkg architectures are configured,
which ``hack/fetch-debs.sh`` does). An architecture whose package can't be had gets a
stand-in: a minimal static ELF executable of that architecture (it exits 0), so the images still
carry a binary whose ELF machine matches their platform, and the log says so.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import io
import logging
import os
import shutil
import struct
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("podplacement.demo")

#: ELF ``e_machine`` of each OCI architecture (System V gABI): proves the binary is genuine.
ELF_MACHINE: dict[str, int] = {"amd64": 62, "arm64": 183, "ppc64le": 21, "s390x": 22}

#: Debian architecture name -> (OCI architecture, OCI variant).
DEBIAN_TO_OCI: dict[str, tuple[str, str | None]] = {
    "amd64": ("amd64", None),
    "arm64": ("arm64", "v8"),
    "ppc64el": ("ppc64le", None),
    "s390x": ("s390x", None),
}


#: Where ``hack/fetch-debs.sh`` downloads the packages, relative to a checkout.
CHECKOUT_DEBS = Path(".demo-cache") / "debs"


@dataclass(frozen=True, slots=True)
class BusyboxBinary:
    """One architecture's busybox: OCI platform fields and the gzip'd layer bytes.

    Attributes:
        source: the ``.deb`` file name, or ``"stand-in"`` for a generated ELF executable.
    """

    architecture: str
    variant: str | None
    layer: bytes
    binary_size: int
    source: str = ""


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


def _find_deb(deb_dir: Path, deb_arch: str) -> Path | None:
    matches = sorted(deb_dir.glob(f"busybox-static_*_{deb_arch}.deb"))
    return matches[-1] if matches else None


def _binary_from_deb(deb: Path, arch: str, variant: str | None) -> BusyboxBinary:
    binary = _extract_busybox(deb)
    machine = elf_machine(binary)
    if machine != ELF_MACHINE[arch]:
        raise DemoImageError(f"{deb}: ELF machine {machine}, not {arch}")
    return BusyboxBinary(arch, variant, make_layer(binary), len(binary), deb.name)


def busybox_binary(deb_dir: Path, arch: str) -> bytes:
    """The real ``/bin/busybox`` of OCI architecture ``arch`` (amd64, arm64, ppc64le, s390x)
    from its ``busybox-static`` package in ``deb_dir``, its ELF machine checked.

    Raises:
        DemoImageError: no such package, unreadable, or an ELF of another machine.
        KeyError: another architecture.
    """
    deb_arch = next((d for d, (a, _) in DEBIAN_TO_OCI.items() if a == arch), None)
    if deb_arch is None:
        raise KeyError(arch)
    deb = _find_deb(deb_dir, deb_arch)
    if deb is None:
        raise DemoImageError(f"no busybox-static package for {deb_arch} in {deb_dir}")
    binary = _extract_busybox(deb)
    if elf_machine(binary) != ELF_MACHINE[arch]:
        raise DemoImageError(f"{deb}: ELF machine {elf_machine(binary)}, not {arch}")
    return binary


def load_busybox_debs(deb_dir: Path) -> dict[str, BusyboxBinary]:
    """Read ``busybox-static_*_<debarch>.deb`` files from ``deb_dir``.

    Returns: OCI architecture -> :class:`BusyboxBinary` for each of the four architectures.
    Raises:
        DemoImageError: a package for one of the four architectures is missing or unreadable.
    """
    out: dict[str, BusyboxBinary] = {}
    for deb_arch, (arch, variant) in DEBIAN_TO_OCI.items():
        deb = _find_deb(deb_dir, deb_arch)
        if deb is None:
            raise DemoImageError(f"no busybox-static package for {deb_arch} in {deb_dir}")
        out[arch] = _binary_from_deb(deb, arch, variant)
    return out


# --- getting what is missing ------------------------------------------------------------


def user_cache_dir() -> Path:
    """``$PODPLACEMENT_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/podplacement``: the
    directory the demo and the tests cache downloads in (also holds the control-plane
    binaries, :func:`podplacement.sandbox.controlplane.default_cache_dir`)."""
    base = os.environ.get("PODPLACEMENT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "podplacement")
    return Path(base)


def default_debs_dir(checkout: Path | None) -> Path:
    """Where the demo reads (and downloads) the packages without ``--debs``:
    ``$PODPLACEMENT_DEMO_DEBS``; else ``checkout/.demo-cache/debs`` when ``checkout`` is
    given and holds a package (``hack/fetch-debs.sh`` fills it); else
    ``user_cache_dir()/debs``."""
    env = os.environ.get("PODPLACEMENT_DEMO_DEBS")
    if env:
        return Path(env)
    if checkout is not None:
        local = checkout / CHECKOUT_DEBS
        if any(local.glob("busybox-static_*.deb")):
            return local
    return user_cache_dir() / "debs"


def download_debs(deb_dir: Path, deb_archs: list[str], timeout: float = 120.0) -> str:
    """``apt-get download busybox-static:<arch>`` for ``deb_archs`` into ``deb_dir``
    (created): all in one call, then, when that failed, one call per package still missing
    (one unknown architecture must not stop the others). Returns the last error line of the
    calls that failed ("" when all succeeded); never raises for a failed download (apt-get
    missing, no network, an architecture dpkg does not know)."""
    apt = shutil.which("apt-get")
    if apt is None:
        return "apt-get not found"
    try:
        deb_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {deb_dir}: {exc.strerror or exc}"

    def download(archs: list[str]) -> str:
        log.info("downloading busybox-static for %s with apt-get download into %s",
                 ", ".join(archs), deb_dir)
        try:
            proc = subprocess.run(
                [apt, "download", "-q", *(f"busybox-static:{a}" for a in archs)],
                cwd=deb_dir, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"apt-get download: {exc}"
        if proc.returncode == 0 and all(_find_deb(deb_dir, a) for a in archs):
            return ""
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines()
                 if ln.strip() and "unsandboxed" not in ln]
        return lines[-1].strip() if lines else f"apt-get exit code {proc.returncode}"

    error = download(deb_archs)
    if error and len(deb_archs) > 1:
        for deb_arch in [a for a in deb_archs if _find_deb(deb_dir, a) is None]:
            error = download([deb_arch]) or error
    return error


def prepare_busybox(deb_dir: Path, download: bool = True,
                    fetch: Callable[[Path, list[str]], str] = download_debs,
                    ) -> dict[str, BusyboxBinary]:
    """The four architectures' binaries: from the packages in ``deb_dir``; those missing
    are downloaded first (``download``: with ``fetch``, :func:`download_debs` by default);
    those still missing get a stand-in (:func:`standin_binary`), with a warning that says
    how to get the real package.

    Returns: OCI architecture -> :class:`BusyboxBinary` for amd64, arm64, ppc64le, s390x.
    Raises:
        DemoImageError: a package present is unreadable or holds the wrong architecture.
    """
    missing = [d for d in DEBIAN_TO_OCI if _find_deb(deb_dir, d) is None]
    error = ""
    if missing and download:
        error = fetch(deb_dir, missing)
    standins = [d for d in DEBIAN_TO_OCI if _find_deb(deb_dir, d) is None]

    def load(deb_arch: str) -> BusyboxBinary:
        arch, variant = DEBIAN_TO_OCI[deb_arch]
        deb = _find_deb(deb_dir, deb_arch)
        if deb is not None:
            return _binary_from_deb(deb, arch, variant)
        binary = standin_binary(arch)
        return BusyboxBinary(arch, variant, make_layer(binary), len(binary), "stand-in")

    # dpkg-deb runs and zlib compresses outside the GIL: four at once
    with concurrent.futures.ThreadPoolExecutor(len(DEBIAN_TO_OCI)) as pool:
        out = {b.architecture: b for b in pool.map(load, DEBIAN_TO_OCI)}
    if standins:
        why = f" ({error})" if error else (" (downloads off)" if not download else "")
        log.warning(
            "no busybox-static package for %s in %s%s: the image layers for %s hold a "
            "generated stand-in (a minimal static ELF executable of that architecture). For "
            "the real binaries: dpkg --add-architecture for each (as root), apt-get update, "
            "then run the demo again (or bash hack/fetch-debs.sh in a checkout)",
            ", ".join(standins), deb_dir, why, ", ".join(standins))
    return out


#: Per OCI architecture: ELF machine, byte order, ELF flags, and machine code for
#: ``exit(0)`` (Linux syscall ABI of each architecture).
_STANDIN: dict[str, tuple[int, str, int, bytes]] = {
    # mov eax, 60 (exit); xor edi, edi; syscall
    "amd64": (62, "<", 0, bytes.fromhex("b83c000000" "31ff" "0f05")),
    # mov x0, #0; mov x8, #93 (exit); svc #0
    "arm64": (183, "<", 0, bytes.fromhex("000080d2" "a80b80d2" "010000d4")),
    # li r0, 1 (exit); li r3, 0; sc  (ELFv2 ABI: e_flags 2)
    "ppc64le": (21, "<", 2, bytes.fromhex("01000038" "00006038" "02000044")),
    # lghi %r2, 0; svc 1 (exit)
    "s390x": (22, ">", 0, bytes.fromhex("a7290000" "0a01")),
}


def standin_binary(arch: str) -> bytes:
    """A minimal static ELF64 executable for ``arch`` (amd64, arm64, ppc64le, s390x): one
    PT_LOAD segment whose code calls ``exit(0)``.

    Raises:
        KeyError: another architecture.
    """
    machine, order, flags, code = _STANDIN[arch]
    base, ehsize, phsize = 0x400000, 64, 56
    size = ehsize + phsize + len(code)
    ident = b"\x7fELF" + bytes([2, 1 if order == "<" else 2, 1, 0]) + bytes(8)
    header = ident + struct.pack(f"{order}HHIQQQIHHHHHH", 2, machine, 1, base + ehsize + phsize,
                                 ehsize, 0, flags, ehsize, phsize, 1, 64, 0, 0)
    program = struct.pack(f"{order}IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x10000)
    return header + program + code
