"""``podplacement demo [--debs DIR] [--no-download] [--api-server auto|real|localkube]
[--kubeconfig F] [--keep] [--timeout S]``: run the product end to end on this machine and
print what it decided (see :mod:`podplacement.demo.run`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from podplacement.cliargs import positive_float

#: ``--api-server`` choices: the real control plane when found (else localkube), the real
#: one or nothing, the API double.
API_SERVERS = ("auto", "real", "localkube")


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand to the top-level parser's subparsers."""
    p = subparsers.add_parser(
        "demo",
        help="run registry, API server, webhook and controller here and place sample pods",
        description=(
            "Start two real registries seeded with multi-arch busybox images, an API server "
            "(the real control plane when its binaries are found: KUBEBUILDER_ASSETS, else "
            "shared/k8s-bin beside the checkout, else the cache an earlier run filled; "
            "otherwise localkube, the API double; or an existing cluster with --kubeconfig), "
            "the webhook and the controller as processes, create sample workloads and print "
            "the placement table. Everything started is stopped at the end."
        ),
    )
    p.add_argument("--debs", type=Path, default=None, metavar="DIR",
                   help="directory with busybox-static_*_<arch>.deb for amd64, arm64, ppc64el "
                        "and s390x; missing ones are downloaded there with apt-get download "
                        "(default: $PODPLACEMENT_DEMO_DEBS, else the checkout's "
                        ".demo-cache/debs when filled, else ~/.cache/podplacement/debs)")
    p.add_argument("--no-download", action="store_true",
                   help="do not run apt-get download: an architecture without a package gets "
                        "a stand-in binary")
    p.add_argument("--api-server", choices=API_SERVERS, default="auto",
                   help="auto: the real control plane when its binaries are found, else "
                        "localkube; real: fail without it; localkube: the API double "
                        "(default: %(default)s)")
    p.add_argument("--kubeconfig", type=Path, default=None,
                   help="use this existing cluster (podplacement installed; nothing faked; "
                        "its controller must reach this machine's 127.0.0.1 registries)")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory (logs, certs, kubeconfig) and, on an "
                        "existing cluster, the demo namespace")
    p.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds to wait for the placement decisions (default 60)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit code 0 when every workload was placed as expected, 1 when some
    were not, 2 when a step failed, 130 when interrupted."""
    from podplacement.demo.common import WORKDIR
    from podplacement.demo.images import default_debs_dir
    from podplacement.demo.run import DemoOptions, run_demo

    options = DemoOptions(
        debs=args.debs or default_debs_dir(WORKDIR),
        download=not args.no_download,
        api_server=args.api_server,
        kubeconfig=args.kubeconfig,
        keep=bool(args.keep),
        settle_timeout=float(args.timeout),
    )
    return run_demo(options)
