"""The emulated arm64 node's CRI relay: the kubelet talks to it, it talks to containerd.

Why: the kubelet asks for the ``RuntimeDefault`` seccomp profile for every pod sandbox
(the pause container), and containerd 1.6 refuses any profile but ``Unconfined`` when it
finds no seccomp ("failed to generate seccomp spec opts: seccomp is not supported"). Under
qemu-user it finds none: qemu answers ``EINVAL`` to ``prctl(PR_SET_SECCOMP)`` so the
emulated program can't filter the syscalls qemu needs. The relay turns, in the bytes the
kubelet sends, the sandbox's seccomp fields into fields containerd does not know, of the
same length (:func:`rewrite`), so containerd sees no profile and runs the sandbox
unconfined (the exec guard's filter is added to each container by runc, as on every
container of this node). Nothing else is changed: HTTP/2 DATA frames are not compressed,
and a same-length edit keeps every frame and gRPC length right.

The edit is at the byte level, in a request holding the sandbox's annotations only: the
``security_context`` of ``LinuxPodSandboxConfig`` whose last field is
:data:`SANDBOX_SECCOMP` (``LinuxSandboxSecurityContext`` field 9, ``SecurityProfile{}``,
which is ``RuntimeDefault``; the kubelet v1.36.2 sends no deprecated
``seccomp_profile_path``). A request split across two reads is not seen (the kubelet
writes each small request at once); the sandbox then fails as without the relay.

Run as ``python -m podplacement.sandbox.criproxy LISTEN TARGET`` (unix socket paths); it
ends on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys

__all__ = ["SANDBOX_SECCOMP", "main", "rewrite"]

log = logging.getLogger("podplacement.sandbox.criproxy")

#: A RunPodSandbox request carries the kubelet's ``kubernetes.io/config.seen`` annotation.
SANDBOX_MARK = b"kubernetes.io/config.seen"
#: ``LinuxPodSandboxConfig.security_context`` (field 2, wire type 2, a one-byte length)
#: starting with its namespace options (field 1).
_SECURITY_CONTEXT = re.compile(rb"\x12([\x04-\x7f])\x0a", re.DOTALL)
#: Its last field as the kubelet writes it: ``seccomp`` (field 9, wire type 2), an empty
#: ``SecurityProfile`` (``RuntimeDefault``); and what it becomes: field 15, unknown to
#: containerd's decoder (skipped), the same length.
SANDBOX_SECCOMP, UNKNOWN_FIELD = b"\x4a\x00", b"\x7a\x00"


def rewrite(chunk: bytes) -> bytes:
    """``chunk`` with the sandbox's ``RuntimeDefault`` seccomp field made unknown when it
    is a RunPodSandbox request (module docstring); the same length in every case."""
    if SANDBOX_MARK not in chunk or SANDBOX_SECCOMP not in chunk:
        return chunk
    out = bytearray(chunk)
    for m in _SECURITY_CONTEXT.finditer(chunk):
        end = m.start() + 2 + m.group(1)[0]
        if chunk[end - 2:end] == SANDBOX_SECCOMP:
            out[end - 2:end] = UNKNOWN_FIELD
    return bytes(out)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                edit: bool) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(rewrite(data) if edit else data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen: str, target: str) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(target)
        except OSError as exc:
            log.warning("containerd at %s: %s", target, exc)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, True), _pipe(up_reader, writer, False))

    with contextlib.suppress(FileNotFoundError):
        os.unlink(listen)
    old = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(relay, listen)
    finally:
        os.umask(old)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(listen)


def main(argv: list[str] | None = None) -> int:
    """``python -m podplacement.sandbox.criproxy LISTEN TARGET`` (module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m podplacement.sandbox.criproxy LISTEN TARGET", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s criproxy: %(message)s")
    asyncio.run(_serve(args[0], args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
