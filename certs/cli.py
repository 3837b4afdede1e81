"""``podplacement certs``: create and rotate the webhook's CA and serving certificate on disk.

``generate`` writes a fresh CA and serving certificate into a directory (``tls.crt``,
``tls.key``, ``ca.crt``, ``ca.key``) and refuses to replace existing ones without ``--force``;
``rotate`` renews what is close to expiry following the two-step CA overlap of
:mod:`certs.rotation` and prints the plan as JSON.

``--dns`` names must be DNS-1123 subdomains (lowercase; the API server and cluster DNS only
produce such names). A wildcard is allowed as the whole first label only (``*.svc.example``),
as TLS hostname matching understands it. Exit codes: 0 done, 1 the directory could not be
read or written, 2 an unusable argument.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import sys
from pathlib import Path
from typing import Any

import orjson

from podplacement.certs._generate import generate_ca, issue_serving_cert, service_dns_names
from podplacement.certs.rotation import DEFAULT_OVERLAP, DEFAULT_ROTATE_BEFORE, rotate_dir
from podplacement.certs.store import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    CertState,
    CertStoreError,
    write_dir,
)
from podplacement.cliargs import (
    is_dns_label,
    is_dns_subdomain,
    non_negative_float,
    one_line,
    positive_float,
)

#: The files ``certs generate`` writes (and ``certs rotate`` maintains) in the directory.
FILES = (TLS_CERT, TLS_KEY, CA_CERT, CA_KEY)


def check_dns_name(name: str) -> str:
    """``name`` if it is a DNS-1123 subdomain, optionally with ``*.`` as its first label.

    Raises:
        ValueError: otherwise (the message names the value).
    """
    wildcard = name.startswith("*.")
    rest = name[2:] if wildcard else name
    if not is_dns_subdomain(rest) or (wildcard and "." not in rest):
        raise ValueError(
            f"--dns {name!r} is not a DNS name: want lowercase letters, digits, '-' and '.' "
            "(a DNS-1123 subdomain, at most 253 characters; '*.' allowed as the first label "
            "of a name with at least two more labels)")
    return name


def _names(args: argparse.Namespace) -> tuple[list[str] | None, list[str] | None]:
    dns = [check_dns_name(n) for n in args.dns or []]
    if args.service:
        if not args.namespace:
            raise ValueError("--service needs --namespace")
        for flag, value in (("--service", args.service), ("--namespace", args.namespace)):
            if not is_dns_label(value):
                raise ValueError(f"{flag} {value!r} is not a valid name (a DNS-1123 label)")
        dns = service_dns_names(args.service, args.namespace) + dns
    elif args.namespace:
        raise ValueError("--namespace only goes with --service")
    ips = list(args.ip or [])
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ValueError(f"--ip {ip!r} is not an IPv4 or IPv6 address") from None
    return (dns or None), (ips or None)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dns", action="append", metavar="NAME",
                   help="DNS SAN, a DNS-1123 subdomain ('*.' allowed as the first label); "
                        "repeatable")
    p.add_argument("--ip", action="append", metavar="ADDR", help="IP SAN (repeatable)")
    p.add_argument("--service", help="add the 4 DNS names of this Service (needs --namespace)")
    p.add_argument("--namespace", help="namespace of --service")
    p.add_argument("--key-type", choices=("ecdsa", "rsa"), default="ecdsa",
                   help="key algorithm of the CA and the serving certificate: ECDSA P-256 or "
                        "RSA 2048 (default: %(default)s)")
    p.add_argument("--ca-validity-days", type=positive_float, default=365.0, metavar="DAYS",
                   help="lifetime of a new CA in days (default: %(default)s)")
    p.add_argument("--validity-days", type=positive_float, default=90.0, metavar="DAYS",
                   help="lifetime of a new serving certificate in days (default: %(default)s)")


def register(subparsers: Any) -> None:
    """Add ``certs generate`` and ``certs rotate`` to the top-level parser's subparsers."""
    p = subparsers.add_parser("certs", help="create or rotate the webhook's TLS certificates",
                              description="Create or rotate the webhook's CA and serving "
                                          "certificate in a directory.")
    sub = p.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    files = ", ".join(FILES)
    gen = sub.add_parser(
        "generate", help="write a new CA and serving certificate",
        description=f"Write a new CA and a serving certificate signed by it into --out: "
                    f"{files} (keys mode 0600), for the names of --dns, --ip and --service: "
                    "at least one of --dns, --ip or --service is required. The directory "
                    "is created if needed; existing "
                    "certificates or keys there are only replaced with --force. Prints "
                    '{"dir", "dns", "ip"} as JSON. Exit code 0 written, 1 the directory '
                    "could not be written, 2 an unusable argument.")
    gen.usage = ("%(prog)s --out DIR (--dns NAME | --ip ADDR | --service SERVICE --namespace "
                 "NAMESPACE)... [options]")
    gen.add_argument("--out", required=True, metavar="DIR",
                     help=f"output directory ({files} are written there)")
    gen.add_argument("--force", action="store_true",
                     help="replace the certificates and keys already in --out (a new CA: "
                          "clients trusting the old one must be updated)")
    _common(gen)
    gen.set_defaults(func=generate)

    rot = sub.add_parser(
        "rotate", help="renew certificates close to expiry (CA overlap)",
        description=f"Renew what is close to expiry in a directory written by 'certs "
                    f"generate' ({files}): a new CA is first added to the bundle and signs the "
                    "serving certificate only after --overlap-minutes, on a later run. Prints "
                    "the plan as JSON. With --dns/--ip/--service the serving certificate gets "
                    "those names (reissued when they changed). Exit code 0 done, 1 the "
                    "directory could not be read or written, 2 an unusable argument.")
    rot.add_argument("--dir", required=True, metavar="DIR",
                     help="certificate directory (as written by 'certs generate')")
    rot.add_argument("--force", action="store_true",
                     help="start a CA rotation now (the serving certificate follows after "
                          "the overlap, on a later run)")
    rot.add_argument("--rotate-before-days", type=non_negative_float, metavar="DAYS",
                     default=DEFAULT_ROTATE_BEFORE.total_seconds() / 86400,
                     help="renew a serving certificate this many days before it expires; a "
                          "CA this long plus the overlap before (default: %(default)s)")
    rot.add_argument("--overlap-minutes", type=non_negative_float, metavar="MINUTES",
                     default=DEFAULT_OVERLAP.total_seconds() / 60,
                     help="minutes a new CA is in the bundle before it signs the serving "
                          "certificate (default: %(default)s)")
    _common(rot)
    rot.set_defaults(func=rotate)


def _fail(action: str, message: str, code: int) -> int:
    print(f"podplacement certs {action}: {one_line(message)}", file=sys.stderr)
    return code


def _check_out(out: Path, force: bool) -> None:
    """Refuse an --out that is not a usable directory, or one that already holds
    certificates or keys (unless ``force``). Creates the directory. Raises ValueError."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if out.is_dir() and not force:
        present = [name for name in FILES if (out / name).exists()]
        if present:
            raise ValueError(f"--out {out} already holds {', '.join(present)}; use --force "
                             "to replace them (or 'certs rotate --dir' to renew them)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create the directory: "
                         f"{exc.strerror or one_line(exc)}") from None


def generate(args: argparse.Namespace) -> int:
    """``certs generate``: exit 0 on success, 1 when writing fails, 2 on bad arguments."""
    out = Path(args.out)
    try:
        dns, ips = _names(args)
        if not dns and not ips:
            raise ValueError("give at least one --dns, --ip or --service")
        _check_out(out, args.force)
        ca = generate_ca(validity=dt.timedelta(days=args.ca_validity_days),
                         key_type=args.key_type)
        serving = issue_serving_cert(ca, dns or [], ips or [],
                                     validity=dt.timedelta(days=args.validity_days),
                                     key_type=args.key_type)
    except (ValueError, OverflowError) as exc:
        return _fail("generate", str(exc), 2)
    try:
        write_dir(out, CertState(serving, ca.key_pem, (ca.cert_pem,)))
    except OSError as exc:
        return _fail("generate", f"writing {out}: {exc.strerror or exc}", 1)
    print(orjson.dumps({"dir": str(args.out), "dns": dns or [], "ip": ips or []}).decode())
    return 0


def _check_dir(directory: Path, names_given: bool) -> None:
    """Refuse a --dir that does not exist, is not a directory, or holds no certificate to
    rotate while no names were given to create one. Raises ValueError."""
    if not directory.exists():
        raise ValueError(f"--dir {directory} does not exist (create it with 'podplacement "
                         f"certs generate --out {directory}')")
    if not directory.is_dir():
        raise ValueError(f"--dir {directory} is not a directory")
    if not names_given and not (directory / TLS_CERT).exists():
        raise ValueError(f"--dir {directory} holds no certificate ({TLS_CERT}) to rotate "
                         f"(create one with 'podplacement certs generate --out {directory}', "
                         "or give --dns/--ip/--service)")


def rotate(args: argparse.Namespace) -> int:
    """``certs rotate``: prints the plan as JSON; exit 0 on success, 1 on unreadable state,
    2 on bad arguments."""
    directory = Path(args.dir)
    try:
        dns, ips = _names(args)
        _check_dir(directory, bool(dns or ips))
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
        return _fail("rotate", str(exc), 1)
    except OSError as exc:
        return _fail("rotate", f"{directory}: {exc.strerror or exc}", 1)
    except (ValueError, OverflowError) as exc:
        return _fail("rotate", str(exc), 2)
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
