"""The floor under any admission webhook: a minimal mutating webhook of the benchmark's own.

``bench/cluster.py --scenario floor-webhook`` runs it (no product installed) and registers a
MutatingWebhookConfiguration for the bench namespace's pod CREATEs, so the API server's CPU
per pod, next to bare's in the same round, is what one webhook call costs the API server
whatever the webhook decides: the AdmissionReview encoded, the TLS round trip, the answer
decoded. Its answer allows the pod with a one-op JSONPatch adding a label (the least a
placing webhook sends). The app is an ASGI callable on uvicorn, the product webhook's own
server, reading the request ``uid`` with orjson.

Usage: ``python bench/floorhook.py --port N --cert FILE --key FILE`` (binds 127.0.0.1).
"""

from __future__ import annotations

import os
import sys

# bench/inspect.py would shadow the standard library's ``inspect``: put the project root
# first on sys.path instead of this script's directory.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import base64  # noqa: E402
from collections.abc import Awaitable, Callable, MutableMapping  # noqa: E402
from typing import Any  # noqa: E402

import orjson  # noqa: E402

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: The one JSONPatch op every answer carries (base64, as AdmissionReview wants it).
PATCH = base64.b64encode(orjson.dumps([
    {"op": "add", "path": "/metadata/labels/bench.io~1floor", "value": "webhook"}])).decode()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /mutate``: allowed, with :data:`PATCH` (every pod the bench creates has a
    labels map); anything else: 404."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] != "/mutate":
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    review = orjson.loads(body)
    answer = orjson.dumps({"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
                           "kind": "AdmissionReview",
                           "response": {"uid": review["request"]["uid"], "allowed": True,
                                        "patchType": "JSONPatch", "patch": PATCH}})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})


def main() -> None:
    """Serve :func:`app` with TLS on 127.0.0.1 until killed."""
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    args = ap.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, ssl_certfile=args.cert,
                ssl_keyfile=args.key, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
