"""The arm64 node's exec guard: containers of an emulated arm64 node refuse x86 programs
as a real arm64 machine's kernel does (``execve`` fails with ``ENOEXEC``, so runc prints
``exec /bin/busybox: exec format error`` and the container exits 1).

Why it is needed: on this amd64 machine the kernel runs an x86-64 ELF natively, and
``binfmt_misc`` cannot stop it (the ELF loader is tried before ``binfmt_misc``:
``fs/binfmt_elf.c`` registers at ``core_initcall``, ``fs/binfmt_misc.c`` at
``fs_initcall``). So each container of the arm64 node gets a seccomp filter whose
``execve``/``execveat`` go to this supervisor (``SCMP_ACT_NOTIFY``, runtime-spec
``linux.seccomp.listenerPath``; runc sends the listener descriptor and the container's
state over a unix socket, ``SCM_RIGHTS``). For each call the supervisor reads the path
from the caller's memory (at most ``PATH_MAX`` bytes), opens it inside the caller's root
(``openat2`` ``RESOLVE_IN_ROOT``: a container's absolute symlinks never reach the host's
files), reads the first 64 bytes and answers ``ENOEXEC`` when :func:`refused_machine`
says the program is an x86 ELF (also for a ``#!`` script whose interpreter is one);
otherwise the kernel goes on with the call (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``), and an
arm64 ELF runs through the ``binfmt_misc`` registration of the node's user namespace.

The answer is an emulation aid, not a security boundary (seccomp_unotify(2): a
``CONTINUE`` decision is racy); everything a container writes (paths, file contents) is
read bounded and a malformed one is allowed to reach the kernel, which then decides.

Run as ``python -m podplacement.sandbox.execguard SOCKET``: it listens on the unix socket
``SOCKET`` (mode 0600), serves every listener it is sent, and ends on SIGTERM or SIGINT.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
from pathlib import Path

__all__ = ["ELF_MACHINES_REFUSED", "main", "refused_machine", "shebang_interpreter"]

log = logging.getLogger("podplacement.sandbox.execguard")

#: ELF ``e_machine`` values (System V gABI) an arm64 kernel refuses to execute: x86-64
#: (62) and i386 (3).
ELF_MACHINES_REFUSED = {62: "x86-64", 3: "i386"}
#: How much of a path is read from a caller's memory (Linux ``PATH_MAX``).
PATH_MAX = 4096
#: How many bytes of a program are read.
HEADER_BYTES = 256
#: How many ``#!`` interpreters are followed (the kernel allows 4 levels; one is enough
#: for a refusal of the usual shape).
SHEBANG_DEPTH = 2

# <linux/seccomp.h>
_NOTIF = struct.Struct("=QII" "iIQ6Q")  # seccomp_notif: id, pid, flags, seccomp_data
_RESP = struct.Struct("=QqiI")  # seccomp_notif_resp: id, val, error, flags
_IOCTL_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif)
_IOCTL_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp)
_IOCTL_ID_VALID = 0x40082102  # _IOW('!', 2, __u64)
_FLAG_CONTINUE = 1
# x86-64 syscall numbers (the filter runs on the host's syscalls, also under qemu-user)
_NR_EXECVE, _NR_EXECVEAT, _NR_OPENAT2 = 59, 322, 437
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_RESOLVE_IN_ROOT = 0x10
_O_PATH = 0o10000000


def refused_machine(header: bytes) -> str | None:
    """The name of the architecture when ``header`` (a file's first bytes) is an ELF whose
    ``e_machine`` an arm64 kernel refuses (:data:`ELF_MACHINES_REFUSED`), else None (not
    an ELF, too short, or an ELF of another machine)."""
    if len(header) < 20 or header[:4] != b"\x7fELF" or header[5] not in (1, 2):
        return None
    order = "<" if header[5] == 1 else ">"
    (machine,) = struct.unpack_from(order + "H", header, 18)
    return ELF_MACHINES_REFUSED.get(machine)


def shebang_interpreter(header: bytes) -> str | None:
    """The interpreter path of a ``#!`` script's first line (``header``: its first bytes),
    else None."""
    if not header.startswith(b"#!"):
        return None
    line = header[2:].split(b"\n", 1)[0].strip()
    first = line.split(None, 1)[0] if line else b""
    return first.decode(errors="replace") if first else None


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def _openat2_in_root(root_fd: int, path: str) -> int:
    """Open ``path`` read-only as if ``root_fd`` were ``/`` (``RESOLVE_IN_ROOT``).

    Raises:
        OSError: it could not be opened.
    """
    how = _OpenHow(os.O_RDONLY | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT)
    fd = _libc.syscall(_NR_OPENAT2, root_fd, path.encode(), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def _read_string(pid: int, address: int) -> str | None:
    """A NUL-terminated string of at most :data:`PATH_MAX` bytes at ``address`` of
    ``pid``'s memory, or None."""
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            raw = mem.read(PATH_MAX)
    except (OSError, OverflowError, ValueError):
        return None
    end = raw.find(b"\0")
    return raw[:end].decode(errors="surrogateescape") if end >= 0 else None


def _header(pid: int, path: str, dirfd: int | None) -> bytes | None:
    """The first :data:`HEADER_BYTES` of ``path`` as ``pid`` sees it (relative paths
    against its working directory, or its descriptor ``dirfd``), or None."""
    try:
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not path.startswith("/"):
            base = (f"/proc/{pid}/fd/{dirfd}" if dirfd is not None
                    else f"/proc/{pid}/cwd")
            inside = os.readlink(base)  # the directory as the caller's root shows it
            if not inside.startswith("/"):
                return None
            path = inside.rstrip("/") + "/" + path
        fd = _openat2_in_root(root, path)
        try:
            return os.read(fd, HEADER_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        os.close(root)


def _fd_header(pid: int, fd: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/fd/{fd}", "rb", buffering=0) as f:
            return f.read(HEADER_BYTES)
    except OSError:
        return None


def decide(pid: int, nr: int, args: tuple[int, ...]) -> str | None:
    """Why the ``execve``/``execveat`` (syscall ``nr``, ``args``) of ``pid`` is refused
    (``"x86-64 ELF /path"``), or None to let the kernel go on."""
    if nr == _NR_EXECVE:
        path, dirfd = _read_string(pid, args[0]), None
    elif nr == _NR_EXECVEAT:
        path = _read_string(pid, args[1])
        raw_fd = ctypes.c_int32(args[0] & 0xFFFFFFFF).value
        dirfd = None if raw_fd == _AT_FDCWD else raw_fd
        if path == "" and args[4] & _AT_EMPTY_PATH and dirfd is not None:
            header = _fd_header(pid, dirfd)
            machine = refused_machine(header or b"")
            return f"{machine} ELF (fd {dirfd})" if machine else None
    else:
        return None
    for _ in range(SHEBANG_DEPTH):
        if not path:
            return None
        header = _header(pid, path, dirfd)
        if header is None:
            return None
        machine = refused_machine(header)
        if machine:
            return f"{machine} ELF {path}"
        path, dirfd = shebang_interpreter(header), None
    return None


def _answer(listener: int) -> bool:
    """Receive one notification on ``listener`` and answer it. False when the listener is
    done (its processes all exited)."""
    buf = bytearray(_NOTIF.size)
    try:
        fcntl.ioctl(listener, _IOCTL_RECV, buf, True)
    except OSError as exc:
        # ENOENT: the call went away before it was received (the caller was signalled,
        # e.g. a Go runtime's preemption signal, and will call again, or it died): the
        # listener stays, or the call made again would fail with ENOSYS
        return exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT)
    notif_id, pid, _flags, nr, _arch, _ip, *args = _NOTIF.unpack(buf)
    why = decide(pid, nr, tuple(args))
    try:
        fcntl.ioctl(listener, _IOCTL_ID_VALID, struct.pack("=Q", notif_id))
    except OSError:
        return True  # the call is gone (the caller was killed)
    if why is not None:
        log.info("refused exec in pid %d: %s (ENOEXEC)", pid, why)
        resp = _RESP.pack(notif_id, 0, -errno.ENOEXEC, 0)
    else:
        resp = _RESP.pack(notif_id, 0, 0, _FLAG_CONTINUE)
    try:
        fcntl.ioctl(listener, _IOCTL_SEND, bytearray(resp), True)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("seccomp answer for pid %d failed: %s", pid, exc)
    return True


def _receive_listener(conn: socket.socket) -> int | None:
    """The listener descriptor runc sends (with the container's state, ignored)."""
    fds = array.array("i")
    try:
        _msg, ancdata, _flags, _addr = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * 4))
    except OSError:
        return None
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    for extra in fds[1:]:
        os.close(extra)
    return fds[0] if fds else None


def _serve_listener(listener: int, stop: threading.Event) -> None:
    """Answer ``listener``'s calls until its processes are all gone (``POLLHUP``) or
    ``stop``; then close it. One thread per listener: a receive that blocks (its call went
    away between the poll and the receive) holds up no other container."""
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    try:
        while not stop.is_set():
            events = poller.poll(1000)
            if any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
                   for _, ev in events):
                return
            if events and not _answer(listener):
                return
    finally:
        os.close(listener)


def serve(path: Path) -> None:
    """Listen on ``path`` and answer every listener's notifications until SIGTERM/SIGINT.

    Raises:
        OSError: the socket could not be bound.
    """
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(str(path))
    finally:
        os.umask(old)
    server.listen(64)
    server.settimeout(1.0)
    print("ready", flush=True)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except (TimeoutError, InterruptedError):
            continue
        except OSError:
            continue
        with conn:
            conn.settimeout(5.0)
            listener = _receive_listener(conn)
        if listener is not None:
            threading.Thread(target=_serve_listener, args=(listener, stop),
                             daemon=True).start()
    server.close()
    path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m podplacement.sandbox.execguard SOCKET`` (module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m podplacement.sandbox.execguard SOCKET", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s execguard: %(message)s")
    serve(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
