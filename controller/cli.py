"""``podplacement controller``: run the gating controller until SIGTERM/SIGINT.

Connects with ``--kubeconfig`` (and ``--context``), else ``$KUBECONFIG`` / ``~/.kube/config``
when present, else the in-cluster service account. Registry access takes the
same ``--registries-conf`` / ``--insecure-registry`` / ``--ca-file`` flags as
``podplacement inspect``. Exit codes: 0 after SIGTERM/SIGINT, 1 without a usable Kubernetes
configuration, 2 for unusable arguments, 130 on KeyboardInterrupt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import signal
import sys
from typing import TYPE_CHECKING

from podplacement.cliargs import non_negative_float, one_line, positive_int
from podplacement.imageinspect.cli import add_registry_arguments, parse_ca_files
from podplacement.rules.config import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from podplacement.controller.app import ControllerOptions

log = logging.getLogger(__name__)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


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
                   help="the controller's own namespace (lease, secrets, webhook Service; "
                        "default: %(default)s)")
    p.add_argument("--workers", type=positive_int, default=32,
                   help="concurrent pod reconciles, >= 1 (default: %(default)s)")
    p.add_argument("--rate", type=non_negative_float, default=500.0,
                   help="pods started per second across workers, 0 for unlimited "
                        "(default: %(default)s)")
    p.add_argument("--metrics-port", type=int, default=8080,
                   help="port of /metrics, /healthz, /readyz, -1 for no server "
                        "(default: %(default)s)")
    p.add_argument("--metrics-address", default="0.0.0.0",
                   help="address of the metrics server (default: %(default)s)")
    p.add_argument("--no-events", action="store_true", help="do not emit Kubernetes Events")
    add_registry_arguments(p, pull_secret=False)
    p.add_argument("--image-credential-provider-config", metavar="FILE",
                   help="the kubelet's CredentialProviderConfig (kubelet.config.k8s.io/v1): "
                        "run its credential provider plugins for images it matches, as the "
                        "kubelet does (the kubelet's flag name)")
    p.add_argument("--image-credential-provider-bin-dir", metavar="DIR",
                   help="the directory of the credential provider plugins named in "
                        "--image-credential-provider-config")
    hook = p.add_mutually_exclusive_group()
    hook.add_argument("--webhook-url", help="manage the MutatingWebhookConfiguration with "
                      "this URL (https://...)")
    hook.add_argument("--webhook-service", help="manage the MutatingWebhookConfiguration "
                      "pointing at this Service in --namespace")
    ca = p.add_mutually_exclusive_group()
    ca.add_argument("--cert-dir", help="CA bundle directory for the webhook configuration "
                    "(default with --webhook-service: the built-in Secret flow)")
    ca.add_argument("--cert-manager-certificate", metavar="NS/NAME",
                    help="cert-manager Certificate whose CA cert-manager's CA injector puts "
                    "into the webhook configuration (annotation cert-manager.io/inject-ca-from); "
                    "the controller then never writes caBundle nor certificate Secrets")
    p.add_argument("--no-leader-election", action="store_true",
                   help="act as the leader at once (single replica)")
    p.add_argument("--identity", help="leader election identity (default: hostname + random)")
    p.add_argument("--lease-duration", type=positive_int, default=15, metavar="SECONDS",
                   help="leader election lease duration in seconds; the leader renews "
                        "within 2/3 of it (default: %(default)s)")
    p.add_argument("--standby-wait", type=float, default=5.0, metavar="SECONDS",
                   help="when the leader stops gracefully and no other controller takes the "
                        "lease within this time, it stands down: the admission policy "
                        "pauses and every gated pod is released; negative: never "
                        "(default: %(default)s)")
    p.add_argument("--uninstall-deadline", type=non_negative_float, default=20.0,
                   metavar="SECONDS",
                   help="how long the ordered uninstall and the stand-down try normal "
                        "placement decisions before releasing the remaining gated pods "
                        "unplaced; keep it well inside the pod's "
                        "terminationGracePeriodSeconds (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of the subcommand; returns the exit code."""
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


def _certificate_ref(text: str | None) -> str | None:
    if text is None:
        return None
    ns, sep, name = text.partition("/")
    if not sep or not _DNS_LABEL.fullmatch(ns) or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"--cert-manager-certificate wants NAMESPACE/NAME, got {text!r}")
    return text


def options_from_args(args: argparse.Namespace) -> ControllerOptions:
    """Turn the parsed ``podplacement controller`` arguments into
    :class:`controller.app.ControllerOptions` (reads the ``--ca-file`` files).

    ``--cert-manager-certificate`` needs ``--webhook-url`` or ``--webhook-service`` (it only
    changes how the webhook configuration gets its CA); ``--ca-file`` values are
    ``HOST[:PORT]=FILE`` with a PEM file, repeated files for one host are concatenated.

    Raises:
        ValueError: an unusable value (message names the flag).
        OSError: a ``--ca-file`` file cannot be read.
    """
    from podplacement.controller.app import ControllerOptions

    certificate = _certificate_ref(args.cert_manager_certificate)
    if certificate and not (args.webhook_url or args.webhook_service):
        raise ValueError("--cert-manager-certificate needs --webhook-service or --webhook-url")
    return ControllerOptions(
        namespace=args.namespace,
        workers=args.workers,
        rate=args.rate,
        metrics_host=args.metrics_address,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        events=not args.no_events,
        registries_conf=args.registries_conf,
        ca_bundles=parse_ca_files(args.ca_file),
        insecure_registries=tuple(h.strip() for h in args.insecure_registry if h.strip()),
        webhook_url=args.webhook_url,
        webhook_service=args.webhook_service,
        cert_dir=args.cert_dir,
        cert_manager_certificate=certificate,
        leader_election=not args.no_leader_election,
        identity=args.identity,
        lease_duration=args.lease_duration,
        renew_deadline=max(2.0, args.lease_duration * 2 / 3),
        retry_period=max(1.0, args.lease_duration / 7.5),
        standby_wait=args.standby_wait,
        uninstall_deadline_seconds=args.uninstall_deadline,
        credential_provider_config=args.image_credential_provider_config,
        credential_provider_bin_dir=args.image_credential_provider_bin_dir,
    )


async def _main(args: argparse.Namespace) -> int:
    from podplacement.controller.app import Controller
    from podplacement.kubeclient import KubeAPI

    try:
        options = options_from_args(args)
    except (OSError, ValueError) as exc:
        print(f"podplacement controller: {one_line(exc)}", file=sys.stderr)
        return 2
    try:
        api = await KubeAPI.from_kubeconfig(args.kubeconfig, context=args.context)
    except Exception as exc:
        log.error("cannot load Kubernetes configuration: %s", exc)
        return 1
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
