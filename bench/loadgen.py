"""The cluster benchmark's load generator: one process creating pods from pre-serialized
request bytes over several keep-alive HTTPS connections (HTTP/1.1, raw asyncio streams).

Run by :mod:`bench.cluster` as ``python bench/loadgen.py SPEC_FILE``; imports only the
standard library, so a process starts in a few milliseconds. ``SPEC_FILE`` is JSON:
``{"host", "port", "ca_file", "token", "path", "connections", "bodies": [[index, body], ...]}``.
The process builds every request (headers + body, as bytes) and opens its connections,
prints ``ready`` on stdout, waits for one line on stdin (the start signal), then sends the
requests over ``connections`` connections, each taking the next request when its previous
answer arrived (no pipelining). It prints one JSON line
``{"results": [[index, sent, answered, status], ...], "cpu": seconds}``: times from
``time.monotonic()`` (CLOCK_MONOTONIC: the same clock in every process of the machine),
``status`` the HTTP status (0: the connection failed), and its own CPU time (user + system)
from the start signal to the last answer (``cpu``) and in all (``cpu_total``: with the
start-up and the serialization before the signal). No retries: a failed create is reported as such.
"""

from __future__ import annotations

import os
import sys

# bench/inspect.py would shadow the standard library's ``inspect`` (asyncio imports it).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import asyncio  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import ssl  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from typing import Any  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 response (Content-Length or chunked body, discarded); its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = -1
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length > 0:
        await reader.readexactly(length)
    return status


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=spec["ca_file"])
    host, port = spec["host"], int(spec["port"])
    prefix = (f"POST {spec['path']} HTTP/1.1\r\nHost: {host}:{port}\r\n"
              f"Authorization: Bearer {spec['token']}\r\nContent-Type: application/json\r\n"
              "Accept: application/json\r\nUser-Agent: podplacement-bench\r\n")
    work: deque[tuple[int, bytes]] = deque()
    for index, body in spec["bodies"]:
        data = body.encode()
        work.append((index, (prefix + f"Content-Length: {len(data)}\r\n\r\n").encode() + data))
    streams = [await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
               for _ in range(max(1, min(int(spec["connections"]), len(work) or 1)))]
    results: list[list[Any]] = []
    loop = asyncio.get_running_loop()
    reader_in = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader_in), sys.stdin)
    print("ready", flush=True)
    await reader_in.readline()
    cpu0 = _cpu()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while work:
            index, request = work.popleft()
            sent = time.monotonic()
            try:
                writer.write(request)
                status = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                results.append([index, sent, time.monotonic(), 0])
                return
            results.append([index, sent, time.monotonic(), status])
        writer.close()

    await asyncio.gather(*(connection(r, w) for r, w in streams))
    return {"results": results, "cpu": _cpu() - cpu0, "cpu_total": _cpu()}


def main() -> int:
    """Read the spec file named on the command line, run, print the results."""
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    out = asyncio.run(_run(spec))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
