"""``podplacement controller``: run the gating controller until SIGTERM/SIGINT.

Connects with ``--kubeconfig`` (and ``--context``), else ``$KUBECONFIG`` / ``~/.kube/config``
when present, else the in-cluster service account (issue 5 item 15).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from controller.config import DEFAULT_NAMESPACE

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``controller`` subcommand (sets ``func``)."""
    p = subparsers.add_parser(
        "controller",
        help="run the placement controller (gated pods -> affinity -> ungate)",
        description="Watch pods gated by the podplacement webhook, inspect their images, "
        "add node affinity for the supported platforms and remove the gate in one write.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config "
                   "or in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                   help="the controller's own namespace (lease, secrets, webhook Service)")
    p.add_argument("--workers", type=int, default=32, help="concurrent pod reconciles")
    p.add_argument("--rate", type=float, default=500.0,
                   help="pods started per second across workers (0: unlimited)")
    p.add_argument("--metrics-port", type=int, default=8080,
                   help="port of /metrics, /healthz, /readyz (-1: no server)")
    p.add_argument("--metrics-address", default="0.0.0.0",
                   help="address of the metrics server")
    p.add_argument("--no-events", action="store_true", help="do not emit Kubernetes Events")
    p.add_argument("--registries-conf", help="containers-registries.conf(5) v2 TOML file")
    hook = p.add_mutually_exclusive_group()
    hook.add_argument("--webhook-url", help="manage the MutatingWebhookConfiguration with "
                      "this URL (https://...)")
    hook.add_argument("--webhook-service", help="manage the MutatingWebhookConfiguration "
                      "pointing at this Service in --namespace")
    p.add_argument("--cert-dir", help="CA bundle directory for the webhook configuration "
                   "(default with --webhook-service: the built-in Secret flow)")
    p.add_argument("--no-leader-election", action="store_true",
                   help="act as the leader at once (single replica)")
    p.add_argument("--identity", help="leader election identity (default: hostname + random)")
    p.add_argument("--lease-duration", type=int, default=15, help="seconds")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of the subcommand; returns the exit code."""
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


async def _main(args: argparse.Namespace) -> int:
    from controller.app import Controller, ControllerOptions
    from controller.kube import KubeAPI

    try:
        api = await KubeAPI.from_kubeconfig(args.kubeconfig, context=args.context)
    except Exception as exc:
        log.error("cannot load Kubernetes configuration: %s", exc)
        return 1
    options = ControllerOptions(
        namespace=args.namespace,
        workers=args.workers,
        rate=args.rate,
        metrics_host=args.metrics_address,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        events=not args.no_events,
        registries_conf=args.registries_conf,
        webhook_url=args.webhook_url,
        webhook_service=args.webhook_service,
        cert_dir=args.cert_dir,
        leader_election=not args.no_leader_election,
        identity=args.identity,
        lease_duration=args.lease_duration,
        renew_deadline=max(2.0, args.lease_duration * 2 / 3),
        retry_period=max(1.0, args.lease_duration / 7.5),
    )
    controller = Controller(api, options, own_api=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await controller.start()
    log.info("controller started (namespace %s, %d workers)", options.namespace, options.workers)
    try:
        await stop.wait()
    finally:
        log.info("controller stopping")
        await controller.stop()
    return 0
