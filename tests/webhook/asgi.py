"""Calling the webhook's ASGI app directly, without a client stack (fast enough to sweep
thousands of bodies in the fuzz and equivalence tests)."""

from __future__ import annotations

import json
from typing import Any


async def asgi_post(app: Any, body: bytes) -> tuple[int, Any]:
    """POST /mutate straight into the ASGI app (no client stack: fast enough to sweep
    thousands of bodies); an exception escaping the app propagates into the test."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "https", "path": "/mutate", "raw_path": b"/mutate", "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 443),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload)
