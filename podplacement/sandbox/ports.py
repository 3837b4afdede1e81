"""Ports on 127.0.0.1 for the local components the sandbox, the demo, the tests and the
benchmarks start: the one place that asks the kernel for a free port."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port (1-65535) that was free on 127.0.0.1 a moment ago (bind to port 0 and
    release; another process may take it before the caller binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
