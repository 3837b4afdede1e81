"""``podplacement demo [--debs DIR] [--kubeconfig F] [--keep]``: run the product end to end on
this machine and print what it decided (see :mod:`podplacement.demo.run`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

#: Where ``hack/demo.sh`` downloads the busybox-static packages (relative to the checkout).
DEFAULT_DEBS = Path(__file__).resolve().parents[2] / ".demo-cache" / "debs"
DEBS_ENV = "PODPLACEMENT_DEMO_DEBS"


def default_debs() -> Path:
    """``$PODPLACEMENT_DEMO_DEBS`` or ``<checkout>/.demo-cache/debs``."""
    env = os.environ.get(DEBS_ENV)
    return Path(env) if env else DEFAULT_DEBS


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand to the top-level parser's subparsers."""
    p = subparsers.add_parser(
        "demo",
        help="run registry, API server, webhook and controller here and place sample pods",
        description=(
            "Start two real registries seeded with multi-arch busybox images, an API server "
            "(localkube; the real binaries with KUBEBUILDER_ASSETS; or --kubeconfig), the "
            "webhook and the controller as processes, create sample workloads and print the "
            "placement table. Everything started is stopped at the end."
        ),
    )
    p.add_argument("--debs", type=Path, default=None,
                   help=f"directory with busybox-static_*_<arch>.deb for amd64, arm64, ppc64el "
                        f"and s390x (default: ${DEBS_ENV} or .demo-cache/debs)")
    p.add_argument("--kubeconfig", type=Path, default=None,
                   help="use this existing cluster (podplacement installed; nothing faked; "
                        "its controller must reach this machine's 127.0.0.1 registries)")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory (logs, certs, kubeconfig) and, on an "
                        "existing cluster, the demo namespace")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for the placement decisions (default 60)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit code 0 when every workload was placed as expected, 1 when some
    were not, 2 when a step failed, 130 when interrupted."""
    from podplacement.demo.run import DemoOptions, run_demo

    options = DemoOptions(
        debs=args.debs or default_debs(),
        kubeconfig=args.kubeconfig,
        keep=bool(args.keep),
        settle_timeout=float(args.timeout),
    )
    return run_demo(options)
