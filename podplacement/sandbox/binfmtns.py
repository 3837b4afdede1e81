"""A user namespace whose own ``binfmt_misc`` runs arm64 programs through qemu-user.

Since Linux 6.7 each user namespace may have its own ``binfmt_misc`` instance (a mount of
``binfmt_misc`` made in a mount namespace it owns); ``execve`` in a process uses the
instance of the nearest user namespace, walking up from the process's own
(``fs/binfmt_misc.c`` ``load_binfmt_misc``). The host's own instance is never mounted nor
written here: a registration there would make arm64 programs run everywhere on the
machine and break the amd64 node's exec format errors.

The holder (``python -m podplacement.sandbox.binfmtns MOUNTPOINT QEMU``) unshares a user
and a mount namespace, says ``unshared`` and waits while its starter
(:func:`start_holder`, root in the initial namespace) writes the identity mapping of uids
and gids ``0..65535`` (:data:`ID_MAP`); then it mounts ``binfmt_misc`` at ``MOUNTPOINT``
inside its own mount namespace, registers ``QEMU`` for arm64 ELF programs (flag ``F``:
the interpreter is opened now, so containers need no qemu in their file system), says
``ready`` and sleeps until SIGTERM or until its standard input closes. While it lives,
``/proc/PID/ns/user`` is the namespace the arm64 node's runtime and containers join.
Everything it made goes with it (the namespaces, the mount, the registration).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["AARCH64_MAGIC", "AARCH64_MASK", "ID_MAP", "HolderError", "read_word",
           "registration", "start_holder"]

#: uid and gid map of the namespace: ``inside outside count`` (identity; root stays root
#: for files, an unmapped id reads as nobody).
ID_MAP = "0 0 65536\n"
#: qemu's ``binfmt_misc`` magic and mask of aarch64 ELF executables (qemu
#: ``scripts/qemu-binfmt-conf.sh``): ELF64, little-endian, ``e_type`` EXEC or DYN,
#: ``e_machine`` 183.
AARCH64_MAGIC = (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00")
AARCH64_MASK = (b"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff"
                b"\xff\xff")
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_REC, _MS_SLAVE, _MS_RDONLY = 0x4000, 1 << 19, 1
#: Seconds the starter waits for each of the holder's two words.
HOLDER_WAIT_S = 10.0


class HolderError(RuntimeError):
    """The namespace could not be made (the message says which step and why)."""


def read_word(proc: subprocess.Popen[str], timeout: float = HOLDER_WAIT_S) -> str:
    """The next line ``proc`` writes on its stdout (stripped), or "" when none comes within
    ``timeout`` seconds or it closed its stdout."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


def registration(interpreter: str, name: str = "qemu-aarch64") -> bytes:
    """The line written to ``binfmt_misc/register`` (kernel ``binfmt-misc.rst``:
    ``:name:type:offset:magic:mask:interpreter:flags``) for arm64 ELF programs.

    Raises:
        ValueError: ``interpreter`` is not an absolute path free of ``:`` and newlines.
    """
    if not interpreter.startswith("/") or any(c in interpreter for c in ":\n\0"):
        raise ValueError(f"bad interpreter path {interpreter!r}")

    def esc(data: bytes) -> bytes:
        return b"".join(b"\\x%02x" % b for b in data)

    return (b":" + name.encode() + b":M::" + esc(AARCH64_MAGIC) + b":" + esc(AARCH64_MASK)
            + b":" + interpreter.encode() + b":" + flags(interpreter))


def flags(interpreter: str) -> bytes:
    """The registration's flags: ``F`` (the interpreter is opened now), and ``P`` (keep the
    program's own ``argv[0]``) for Debian's ``*-binfmt-P`` names of qemu, which read the
    program's name from the argument the kernel then adds (Debian's binfmts file for
    qemu-user-static: ``preserve yes``)."""
    return b"FP" if interpreter.endswith("-binfmt-P") else b"F"


def _check(ret: int, what: str) -> None:
    if ret != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _hold(mountpoint: str, interpreter: str, libroot: str | None) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    _check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    print("unshared", flush=True)
    if sys.stdin.readline().strip() != "mapped":
        return 1
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # the host's later mounts (the kubelet's volumes) reach this namespace; none of its
    # own mounts reach the host
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None), "make / a slave")
    if libroot:
        lower = f"lowerdir={libroot}/usr/lib:/usr/lib".encode()
        _check(libc.mount(b"overlay", b"/usr/lib", b"overlay", _MS_RDONLY, lower),
               "overlay the arm64 libraries on /usr/lib")
    _check(libc.mount(b"binfmt_misc", mountpoint.encode(), b"binfmt_misc", 0, None),
           "mount binfmt_misc")
    with open(os.path.join(mountpoint, "register"), "wb", buffering=0) as f:
        f.write(registration(interpreter))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    sys.stdin.read()  # until the starter closes it (or SIGTERM)
    return 0


def start_holder(mountpoint: Path, interpreter: Path, *, libroot: Path | None = None,
                 log: Path | None = None) -> subprocess.Popen[str]:
    """Start the holder (module docstring) and wait until its namespace is ready. Stop it
    with ``terminate()`` (or by closing its stdin) and ``wait()``.

    Raises:
        HolderError: it did not get ready (its stderr, or ``log``, says why); it is killed
            first.
    """
    mountpoint.mkdir(parents=True, exist_ok=True)
    err = open(log, "ab") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "podplacement.sandbox.binfmtns", str(mountpoint),
         str(interpreter), *([str(libroot)] if libroot else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
        start_new_session=True)
    if log is not None:
        err.close()  # type: ignore[union-attr]
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if read_word(proc) != "unshared":
            raise HolderError(f"the binfmt_misc holder did not unshare (exit {proc.poll()})")
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{proc.pid}/{name}").write_text(ID_MAP)
        proc.stdin.write("mapped\n")
        proc.stdin.flush()
        if read_word(proc) != "ready":
            raise HolderError("the binfmt_misc holder did not register qemu "
                              f"(exit {proc.poll()}); see {log}")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def main(argv: list[str] | None = None) -> int:
    """``python -m podplacement.sandbox.binfmtns MOUNTPOINT QEMU`` (module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m podplacement.sandbox.binfmtns MOUNTPOINT QEMU",
              file=sys.stderr)
        return 2
    try:
        return _hold(args[0], args[1], args[2] if len(args) > 2 else None)
    except OSError as exc:
        print(f"binfmtns: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
