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
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podplacement.cliargs import one_line, positive_float, positive_int
from podplacement.imageinspect.cli import add_registry_arguments, registry_settings
from podplacement.rules.admit.webhookconfig import DEFAULT_TIMEOUT_SECONDS
from podplacement.rules.config import DEFAULT_NAMESPACE
from podplacement.webhook.admitinspect import DEFAULT_BUDGET
from podplacement.webhook.limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
)

if TYPE_CHECKING:
    from podplacement.webhook.admitinspect import AdmissionInspector
    from podplacement.webhook.configsource import ConfigSource
    from podplacement.webhook.leasewatch import ControllerLease
    from podplacement.webhook.placecache import PlaceCache
    from podplacement.webhook.policysource import PolicySource

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add the ``webhook`` subcommand to the top-level parser's subparsers."""
    p = subparsers.add_parser(
        "webhook",
        help="serve the pod-gating admission webhook (TLS)",
        description="Serve the mutating admission webhook that adds podplacement's "
                    "scheduling gate to new pods (POST /mutate), with /healthz, /readyz and "
                    "/metrics, over TLS 1.2+ from --cert-dir/tls.crt and tls.key (reloaded "
                    "when they change). The PodPlacementConfig is watched through the API "
                    "(--kubeconfig, else $KUBECONFIG, ~/.kube/config or in-cluster) or read "
                    "from --config-file. Runs until SIGTERM/SIGINT (exit code 0); exit code "
                    "1 when it cannot start (certificates, kubeconfig, config file, address), "
                    "2 for an unusable argument.",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: %(default)s)")
    p.add_argument("--port", type=int, default=9443, help="listen port (default: %(default)s)")
    p.add_argument("--cert-dir", default="/etc/podplacement/webhook-certs", metavar="DIR",
                   help="directory with tls.crt and tls.key, reloaded on change "
                        "(default: %(default)s)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                   help="the controller's own namespace, whose pods are never gated "
                        "(default: %(default)s)")
    p.add_argument("--config-file", default=None,
                   help="read the PodPlacementConfig from this YAML file instead of the API")
    p.add_argument("--reload-interval", type=positive_float, default=2.0, metavar="SECONDS",
                   help="seconds between certificate file checks (default: %(default)s)")
    p.add_argument("--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES,
                   help="refuse request bodies over this many bytes with HTTP 413 "
                        f"(default {DEFAULT_MAX_BODY_BYTES}: 6 MiB)")
    p.add_argument("--body-timeout", type=positive_float, default=DEFAULT_BODY_TIMEOUT,
                   help="seconds to receive a request body whole, else HTTP 408 "
                        f"(default {DEFAULT_BODY_TIMEOUT:g})")
    p.add_argument("--header-timeout", type=positive_float, default=DEFAULT_HEADER_TIMEOUT,
                   help="seconds from a connection or a request's first byte to its "
                        "complete headers, else the connection is closed "
                        f"(default {DEFAULT_HEADER_TIMEOUT:g})")
    p.add_argument("--max-connections", type=positive_int, default=DEFAULT_MAX_CONNECTIONS,
                   help="open connections beyond which new ones are closed unanswered "
                        f"(default {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--controller-unavailable-after", type=positive_float, default=60.0,
                   metavar="SECONDS",
                   help="when no renewal of the controller's leader Lease was seen for this "
                        "long, pods are not held at the gate: the webhook places them at "
                        "admission itself, inspecting their images anonymously within "
                        "--admission-inspection-budget, or releases them with the config's "
                        "fallback (fallbackArchitecture, fallbackOperatingSystems); a pod "
                        "whose image needs its pull secrets stays gated for the controller "
                        "(default: %(default)s; not with --config-file)")
    p.add_argument("--admission-inspection-budget", type=_budget, default=DEFAULT_BUDGET,
                   metavar="SECONDS",
                   help="seconds, counted from the start of a review, that the webhook may "
                        "wait for a pod's image inspections while answering while no "
                        "controller runs (while one runs, the PodPlacementConfig's "
                        "spec.admission.inspectionBudget applies); must stay below the "
                        "webhook configuration's timeoutSeconds "
                        f"({DEFAULT_TIMEOUT_SECONDS}) (default: %(default)s)")
    p.add_argument("--no-place-cache", action="store_true",
                   help="never place a gated pod at admission while a controller runs "
                        "(default: place pods whose images the webhook inspected "
                        "anonymously, before or within the config's "
                        "spec.admission.inspectionBudget; the webhook reads no Secret: an "
                        "image that needs a pull secret is left to the controller; not with "
                        "--config-file)")
    p.add_argument("--report-key", default=None, metavar="NAME",
                   help="this replica's key in the ConfigMap podplacement-webhook-inspections "
                        "of --namespace, where the webhook reports its recent anonymous "
                        "inspection results so that the controller publishes those images "
                        "without fetching them again (default: $POD_NAME, else the host "
                        "name)")
    p.add_argument("--no-inspection-report", action="store_true",
                   help="write no inspection report (the controller then inspects the "
                        "images of the pods the webhook placed itself)")
    add_registry_arguments(p, pull_secret=False)
    p.set_defaults(func=run)


def _budget(text: str) -> float:
    """argparse type of ``--admission-inspection-budget``: > 0 and below the webhook
    configuration's ``timeoutSeconds`` (after which the API server stops waiting)."""
    value = positive_float(text)
    if value >= DEFAULT_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value:g} s is not below the webhook timeout of {DEFAULT_TIMEOUT_SECONDS} s")
    return value


async def _serve(args: argparse.Namespace) -> int:
    from podplacement.imageinspect import Inspector, IPNetwork
    from podplacement.kubeclient import KubeAPI
    from podplacement.rules.config import PlacementConfig
    from podplacement.webhook.admitinspect import AdmissionInspector
    from podplacement.webhook.configsource import StaticConfigSource, WatchingConfigSource
    from podplacement.webhook.leasewatch import ControllerLease
    from podplacement.webhook.placecache import PlaceCache
    from podplacement.webhook.policysource import WatchingPolicySource

    if args.config_file:
        return await _serve_with(args, StaticConfigSource.from_file(args.config_file), None)
    settings = registry_settings(args)
    # One client for the watches (config, policies, the controller's Lease); its credentials
    # refresh themselves (kubeclient). It reads no Secret: every inspection is anonymous.
    api = await KubeAPI.from_kubeconfig(args.kubeconfig, user_agent="podplacement-webhook")
    source = WatchingConfigSource(api)

    def refused_networks() -> tuple[IPNetwork, ...]:
        # The config in force (its default while there is none), read at every connection.
        return (source.current or PlacementConfig()).image_inspection.refused_networks

    inspector = Inspector(registries=settings.registries, ca_bundles=settings.ca_bundles,
                          refused_networks=refused_networks)
    report = _report(args, api, source)
    try:
        lease = ControllerLease(api, args.namespace,
                                threshold=args.controller_unavailable_after)
        note = report.note if report is not None else None
        cache = None if args.no_place_cache else PlaceCache(inspector, on_result=note)
        at_admission = AdmissionInspector(inspector, cache=cache,
                                          budget=args.admission_inspection_budget,
                                          on_result=note if cache is None else None)
        if report is not None:
            report.start()
        return await _serve_with(args, source, lease, cache, at_admission,
                                 WatchingPolicySource(api))
    finally:
        if report is not None:
            await report.stop()
        await inspector.aclose()
        await api.close()


def _report(args: argparse.Namespace, api: Any, source: Any) -> Any:
    """The inspection report of this replica (:mod:`webhook.inspectionreport`), or None
    with ``--no-inspection-report`` or without a usable key (logged)."""
    from podplacement.rules.admit.inspectionreport import valid_key
    from podplacement.rules.config import PlacementConfig
    from podplacement.webhook.inspectionreport import InspectionReport

    if args.no_inspection_report:
        return None
    key = args.report_key or os.environ.get("POD_NAME") or socket.gethostname()
    if not valid_key(key):
        log.warning("no inspection report: %r is not a ConfigMap key (--report-key)", key[:80])
        return None

    def ttl() -> float:
        return (source.current or PlacementConfig()).image_inspection.cache_ttl_seconds

    return InspectionReport(api, args.namespace, key, ttl=ttl)


async def _serve_with(args: argparse.Namespace, source: ConfigSource,
                      lease: ControllerLease | None, place_cache: PlaceCache | None = None,
                      admission_inspector: AdmissionInspector | None = None,
                      policies: PolicySource | None = None) -> int:
    """Serve with ``source`` (and ``lease``) until SIGINT/SIGTERM; returns 0."""
    from podplacement.webhook.app import WebhookMetrics, create_app
    from podplacement.webhook.limits import ConnectionLimits
    from podplacement.webhook.server import WebhookServer

    cert_dir = Path(args.cert_dir)
    holder: dict[str, WebhookServer] = {}
    metrics = WebhookMetrics()
    app = create_app(
        source,
        own_namespace=args.namespace,
        certs_ready=lambda: "server" in holder and holder["server"].certs_loaded,
        metrics=metrics,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        controller_lease=lease,
        place_cache=place_cache,
        admission_inspector=admission_inspector,
        policies=policies,
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
    host = f"[{args.host}]" if ":" in args.host else args.host
    log.info("webhook listening on https://%s:%d", host, server.port,
             extra={"host": args.host, "port": server.port})
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

    problem = _cert_problem(Path(args.cert_dir))
    if problem is not None:
        log.error("webhook failed to start: %s", problem)
        return 1
    try:
        return uvloop.run(_serve(args))
    except Exception as exc:  # start-up: certificates, kubeconfig, config file
        log.error("webhook failed to start: %s", _describe(exc))
        return 1


def _cert_problem(cert_dir: Path) -> str | None:
    """Why ``cert_dir`` cannot serve (missing directory or files, named), else None."""
    if not cert_dir.is_dir():
        what = "is not a directory" if cert_dir.exists() else "does not exist"
        return f"--cert-dir {cert_dir} {what} (create it with 'podplacement certs generate " \
               f"--out {cert_dir}')"
    missing = [name for name in ("tls.crt", "tls.key") if not (cert_dir / name).is_file()]
    if missing:
        return f"--cert-dir {cert_dir} has no {' or '.join(missing)}"
    return None


def _describe(exc: BaseException) -> str:
    """One line for a start-up error; an OSError names its file when it has one."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return one_line(exc) or type(exc).__name__
