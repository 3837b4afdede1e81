"""``python -m localkube --port N --crd FILE...``: run localkube in the foreground."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence

from localkube.runner import LocalKube


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGINT/SIGTERM; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m localkube",
                                     description="Kubernetes API double on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 = pick a free one)")
    parser.add_argument("--crd", action="append", default=[], help="CRD YAML file (repeatable)")
    parser.add_argument("--kubeconfig", help="write a kubeconfig to this path")
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    parser.add_argument("--history-size", type=int, default=10000)
    parser.add_argument("--record-requests", action="store_true",
                        help="keep the request log (GET /localkube/requests)")
    args = parser.parse_args(argv)
    kube = LocalKube(args.crd, port=args.port, bookmark_interval=args.bookmark_interval,
                     history_size=args.history_size, record_requests=args.record_requests)
    kube.start()
    if args.kubeconfig:
        kube.write_kubeconfig(args.kubeconfig)
    print(f"localkube listening on {kube.url}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    kube.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
