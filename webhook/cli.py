"""``podplacement webhook``: serve the admission webhook over TLS.

The serving chain is read from ``--cert-dir`` (``tls.crt``, ``tls.key``; the layout of a
mounted ``kubernetes.io/tls`` Secret and of ``podplacement certs generate``) and reloaded when
it changes. Request limits (``--max-body-bytes``, ``--body-timeout``, ``--header-timeout``,
``--max-connections``) are described in :mod:`webhook.limits`. The PodPlacementConfig comes
from the API server (list + watch, via ``--kubeconfig`` or the in-cluster ServiceAccount) or,
with ``--config-file``, from a file.
"""

from __future__ import annotations

import argparse
import gc
import logging
from pathlib import Path
from typing import Any

from controller.config import DEFAULT_NAMESPACE
from webhook.limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
)

log = logging.getLogger(__name__)


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1 (else argparse exits with status 2 and a message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite float > 0, in seconds (else exit status 2 and a message)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 and finite, got {text}")
    return value


def register(subparsers: Any) -> None:
    """Add the ``webhook`` subcommand to the top-level parser's subparsers."""
    p = subparsers.add_parser("webhook", help="serve the pod-gating admission webhook (TLS)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9443, help="listen port (default 9443)")
    p.add_argument("--cert-dir", default="/etc/podplacement/webhook-certs",
                   help="directory with tls.crt and tls.key (reloaded on change)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                   help="the controller's own namespace (its pods are never gated)")
    p.add_argument("--config-file", default=None,
                   help="read the PodPlacementConfig from this YAML file instead of the API")
    p.add_argument("--reload-interval", type=float, default=2.0,
                   help="seconds between certificate file checks")
    p.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES,
                   help="refuse request bodies over this many bytes with HTTP 413 "
                        f"(default {DEFAULT_MAX_BODY_BYTES}: 6 MiB)")
    p.add_argument("--body-timeout", type=_positive_float, default=DEFAULT_BODY_TIMEOUT,
                   help="seconds to receive a request body whole, else HTTP 408 "
                        f"(default {DEFAULT_BODY_TIMEOUT:g})")
    p.add_argument("--header-timeout", type=_positive_float, default=DEFAULT_HEADER_TIMEOUT,
                   help="seconds from a connection or a request's first byte to its "
                        "complete headers, else the connection is closed "
                        f"(default {DEFAULT_HEADER_TIMEOUT:g})")
    p.add_argument("--max-connections", type=_positive_int, default=DEFAULT_MAX_CONNECTIONS,
                   help="open connections beyond which new ones are closed unanswered "
                        f"(default {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--bare-endpoint", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


async def _serve(args: argparse.Namespace) -> int:
    from webhook.app import WebhookMetrics, create_app
    from webhook.configsource import (
        ApiConnection,
        ConfigSource,
        StaticConfigSource,
        WatchingConfigSource,
    )
    from webhook.limits import ConnectionLimits
    from webhook.server import WebhookServer

    source: ConfigSource
    if args.config_file:
        source = StaticConfigSource.from_file(args.config_file)
    else:
        source = WatchingConfigSource(ApiConnection.from_kubeconfig(args.kubeconfig))
    cert_dir = Path(args.cert_dir)
    holder: dict[str, WebhookServer] = {}
    metrics = WebhookMetrics()
    app = create_app(
        source,
        own_namespace=args.namespace,
        certs_ready=lambda: "server" in holder and holder["server"].certs_loaded,
        metrics=metrics,
        bare_endpoint=args.bare_endpoint,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
    )
    server = WebhookServer(
        app,
        cert_file=cert_dir / "tls.crt",
        key_file=cert_dir / "tls.key",
        host=args.host,
        port=args.port,
        reload_interval=args.reload_interval,
        limits=ConnectionLimits(header_timeout=args.header_timeout,
                                max_connections=args.max_connections,
                                stats=metrics.connection_stats),
    )
    holder["server"] = server
    log.info("webhook listening", extra={"host": args.host, "port": server.port})
    # Every admission parses a pod into hundreds of short-lived objects, so young-generation
    # collections run often; freezing the start-up heap (FastAPI, pydantic, the kubernetes
    # package) keeps the older-generation passes from rescanning it each time.
    gc.collect()
    gc.freeze()
    await server.serve(handle_signals=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the webhook until SIGINT/SIGTERM; returns the exit code (1 on start-up errors)."""
    import uvloop

    try:
        return uvloop.run(_serve(args))
    except Exception as exc:  # start-up: certificates, kubeconfig, config file
        log.error("webhook failed to start: %s", exc)
        return 1
