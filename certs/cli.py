"""``podplacement certs``: create and rotate the webhook's CA and serving certificate on disk.

``generate`` writes a fresh CA and serving certificate into a directory (``tls.crt``,
``tls.key``, ``ca.crt``, ``ca.key``); ``rotate`` renews what is close to expiry following the
two-step CA overlap of :mod:`certs.rotation` and prints the plan as JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

import orjson

from certs._generate import generate_ca, issue_serving_cert, service_dns_names
from certs.rotation import DEFAULT_OVERLAP, DEFAULT_ROTATE_BEFORE, rotate_dir
from certs.store import CertState, CertStoreError, write_dir


def _names(args: argparse.Namespace) -> tuple[list[str] | None, list[str] | None]:
    dns = list(args.dns or [])
    if args.service:
        if not args.namespace:
            raise ValueError("--service needs --namespace")
        dns = service_dns_names(args.service, args.namespace) + dns
    ips = list(args.ip or [])
    return (dns or None), (ips or None)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dns", action="append", metavar="NAME", help="DNS SAN (repeatable)")
    p.add_argument("--ip", action="append", metavar="ADDR", help="IP SAN (repeatable)")
    p.add_argument("--service", help="add the 4 DNS names of this Service (needs --namespace)")
    p.add_argument("--namespace", help="namespace of --service")
    p.add_argument("--key-type", choices=("ecdsa", "rsa"), default="ecdsa")
    p.add_argument("--ca-validity-days", type=float, default=365.0)
    p.add_argument("--validity-days", type=float, default=90.0)


def register(subparsers: Any) -> None:
    """Add ``certs generate`` and ``certs rotate`` to the top-level parser's subparsers."""
    p = subparsers.add_parser("certs", help="create or rotate the webhook's TLS certificates")
    sub = p.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    gen = sub.add_parser("generate", help="write a new CA and serving certificate")
    gen.add_argument("--out", required=True, help="output directory")
    _common(gen)
    gen.set_defaults(func=generate)

    rot = sub.add_parser("rotate", help="renew certificates close to expiry (CA overlap)")
    rot.add_argument("--dir", required=True, help="certificate directory")
    rot.add_argument("--force", action="store_true",
                     help="start a CA rotation now (the serving certificate follows after "
                          "the overlap, on a later run)")
    rot.add_argument("--rotate-before-days", type=float,
                     default=DEFAULT_ROTATE_BEFORE.total_seconds() / 86400)
    rot.add_argument("--overlap-minutes", type=float,
                     default=DEFAULT_OVERLAP.total_seconds() / 60)
    _common(rot)
    rot.set_defaults(func=rotate)


def generate(args: argparse.Namespace) -> int:
    """``certs generate``: exit 0 on success, 2 on bad arguments."""
    try:
        dns, ips = _names(args)
        if not dns and not ips:
            raise ValueError("give at least one --dns, --ip or --service")
        ca = generate_ca(validity=dt.timedelta(days=args.ca_validity_days),
                         key_type=args.key_type)
        serving = issue_serving_cert(ca, dns or [], ips or [],
                                     validity=dt.timedelta(days=args.validity_days),
                                     key_type=args.key_type)
    except ValueError as exc:
        print(f"podplacement certs generate: {exc}", file=sys.stderr)
        return 2
    write_dir(args.out, CertState(serving, ca.key_pem, (ca.cert_pem,)))
    print(orjson.dumps({"dir": str(args.out), "dns": dns or [], "ip": ips or []}).decode())
    return 0


def rotate(args: argparse.Namespace) -> int:
    """``certs rotate``: prints the plan as JSON; exit 0 on success, 1 on unreadable state,
    2 on bad arguments."""
    try:
        dns, ips = _names(args)
        plan = rotate_dir(
            args.dir,
            rotate_before=dt.timedelta(days=args.rotate_before_days),
            overlap=dt.timedelta(minutes=args.overlap_minutes),
            force=args.force,
            dns_names=dns,
            ip_addresses=ips,
            key_type=args.key_type,
            ca_validity=dt.timedelta(days=args.ca_validity_days),
            validity=dt.timedelta(days=args.validity_days),
        )
    except CertStoreError as exc:
        print(f"podplacement certs rotate: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"podplacement certs rotate: {exc}", file=sys.stderr)
        return 2
    out = {
        "dir": str(args.dir),
        "new_ca": plan.new_ca,
        "reissued_serving": plan.reissue_serving,
        "dropped_cas": len(plan.drop_cas),
        "reasons": list(plan.reasons),
        "next_check": plan.next_check.isoformat() if plan.next_check else None,
    }
    print(orjson.dumps(out).decode())
    return 0
