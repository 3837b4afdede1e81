"""A bounded poll for async tests (no timing assertions: only an upper bound)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_until(check: Callable[[], bool], seconds: float = 10.0,
                     interval: float = 0.02) -> None:
    """Return once ``check()`` is true; raise AssertionError after about ``seconds``."""
    for _ in range(int(seconds / interval) + 1):
        if check():
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {seconds} s")
