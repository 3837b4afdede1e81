"""``podplacement inspect``: print the digest, media type and platforms of images.

Example::

    podplacement inspect --pull-secret regcred.json --insecure-registry 127.0.0.1:5000 \\
        nginx 127.0.0.1:5000/team/app:v1

With ``--verify`` it also reads, for each platform, the ELF header of the program the image
runs (``Entrypoint``, else ``Cmd[0]``, through ``PATH``, symlinks and whiteouts; a ``#!``
script's interpreter too) and reports each platform whose binary is for another architecture;
``--max-bytes`` caps the bytes read per platform. Exit code 3 when a platform is flagged.

``--pull-secret`` takes a Kubernetes Secret (JSON or YAML, ``kubernetes.io/dockerconfigjson``
or ``kubernetes.io/dockercfg``) or a docker ``config.json``. Exit code 0 when every image was
inspected, 1 when any failed (each failure is printed with its registry, reference and status),
2 for unusable arguments or files (an image reference that does not parse included).

The registry flags (:func:`add_registry_arguments`, read by :func:`registry_settings`) are
shared with ``podplacement explain`` and ``podplacement controller``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from podplacement.cliargs import one_line, positive_float, yaml_error_line
from podplacement.imageinspect._credentials import (
    Credential,
    credentials_from_docker_config,
    credentials_from_pull_secrets,
)
from podplacement.imageinspect._errors import InvalidReference, RegistryError
from podplacement.imageinspect._inspector import Inspector
from podplacement.imageinspect._manifest import ImageInfo
from podplacement.imageinspect._reference import parse_reference
from podplacement.imageinspect._registries import RegistriesConfig
from podplacement.imageinspect._verify import (
    DEFAULT_MAX_BYTES,
    PlatformReport,
    VerifyReport,
    verify_image,
)

#: Exit code of ``inspect --verify`` when a platform's program is for another architecture.
EXIT_MISMATCH = 3


@dataclasses.dataclass(frozen=True)
class RegistrySettings:
    """What the registry flags amount to: the registry rules, extra CA bundles by
    ``host[:port]`` and the credentials of the ``--pull-secret`` files."""

    registries: RegistriesConfig
    ca_bundles: dict[str, bytes]
    credentials: list[Credential]


def add_registry_arguments(p: argparse.ArgumentParser, *, pull_secret: bool = True) -> None:
    """Add the registry flags shared by ``inspect``, ``explain`` and ``controller``:
    ``--pull-secret`` (unless ``pull_secret`` is false), ``--registries-conf``,
    ``--insecure-registry`` and ``--ca-file`` (see :func:`registry_settings`)."""
    if pull_secret:
        p.add_argument(
            "--pull-secret",
            action="append",
            default=[],
            metavar="FILE",
            help="Kubernetes pull Secret (JSON/YAML, or a List of them) or docker "
            "config.json; repeatable",
        )
    p.add_argument("--registries-conf", metavar="FILE",
                   help="containers-registries.conf(5) v2 TOML file (mirrors, insecure, blocked)")
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST",
        help="allow plain HTTP / unverified TLS for HOST[:PORT]; repeatable",
    )
    p.add_argument(
        "--ca-file",
        action="append",
        default=[],
        metavar="HOST=FILE",
        help="trust the PEM CA bundle FILE for registry HOST[:PORT]; repeatable",
    )


def parse_ca_files(items: Sequence[str]) -> dict[str, bytes]:
    """``--ca-file HOST[:PORT]=FILE`` values → PEM bundle per host (files for one host are
    concatenated).

    Raises:
        ValueError: not ``HOST=FILE``, or the file holds no PEM certificate.
        OSError: a file cannot be read.
    """
    out: dict[str, bytes] = {}
    for item in items:
        host, sep, file = item.partition("=")
        if not sep or not host or not file:
            raise ValueError(f"--ca-file wants HOST=FILE, got {item!r}")
        pem = Path(file).read_bytes()
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            raise ValueError(f"--ca-file {item!r}: {file} holds no PEM certificate")
        out[host] = out.get(host, b"") + pem
    return out


def registry_settings(args: argparse.Namespace) -> RegistrySettings:
    """Read the flags of :func:`add_registry_arguments` (files included).

    Raises:
        ValueError: an unusable value or file content (message names the flag or file).
        OSError: a file cannot be read.
    """
    credentials = [c for f in getattr(args, "pull_secret", None) or []
                   for c in load_credentials(f)]
    registries = (
        RegistriesConfig.load(args.registries_conf) if args.registries_conf
        else RegistriesConfig()
    )
    for host in args.insecure_registry or []:
        if host.strip():
            registries = registries.with_insecure(host.strip())
    return RegistrySettings(registries, parse_ca_files(args.ca_file or []), credentials)


def register(subparsers: Any) -> None:
    """Add the ``inspect`` subcommand to the ``podplacement`` parser (see podplacement.cli)."""
    p = subparsers.add_parser(
        "inspect",
        help="show the platforms of container images",
        description="Fetch image manifests and print each image's digest, media type and "
        "platforms (os/architecture/variant). Exit code 0 when every image was inspected, "
        "1 when one failed, 2 for an unusable argument (an invalid image reference too), "
        "3 when --verify flags a platform.",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image references")
    p.add_argument("--json", action="store_true", help="print one JSON array")
    p.add_argument("--verify", action="store_true",
                   help="read each platform's program (ELF header of the entrypoint) and "
                   "flag platforms whose binary is for another architecture")
    p.add_argument("--max-bytes", type=_positive_int, default=DEFAULT_MAX_BYTES,
                   metavar="BYTES",
                   help="with --verify: bytes read per platform at most, manifests and "
                   "compressed layers (default: %(default)s)")
    add_registry_arguments(p)
    p.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="seconds per registry request, > 0 (default: %(default)s)")
    p.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def load_credentials(path: str) -> list[Credential]:
    """Credentials in a ``--pull-secret`` file: a pull Secret, a ``List`` of them or a docker
    ``config.json`` (JSON or YAML).

    Raises:
        ValueError: not YAML/JSON, not an object, or an undecodable secret.
        OSError: the file cannot be read.
    """
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: {yaml_error_line(exc)}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file ({exc.reason})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON/YAML object")
    try:
        items = doc.get("items") if doc.get("kind") == "List" else None
        if isinstance(items, list):
            return credentials_from_pull_secrets([i for i in items if isinstance(i, dict)])
        if doc.get("kind") == "Secret" or ("type" in doc and "data" in doc):
            return credentials_from_pull_secrets([doc])
        return credentials_from_docker_config(doc)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: {one_line(exc)}") from None


def _describe(info: ImageInfo) -> dict[str, Any]:
    return {
        "reference": info.reference,
        "digest": info.digest,
        "mediaType": info.media_type,
        "platforms": [str(p) for p in info.platforms],
    }


async def _inspect_all(
    images: list[str], inspector: Inspector, credentials: list[Credential]
) -> list[ImageInfo | RegistryError]:
    async def one(image: str) -> ImageInfo | RegistryError:
        try:
            return await inspector.inspect(image, credentials)
        except RegistryError as exc:
            return exc

    try:
        return list(await asyncio.gather(*(one(i) for i in images)))
    finally:
        await inspector.aclose()


def run(args: argparse.Namespace) -> int:
    """Run ``podplacement inspect``; returns 0, 1 (an image failed) or 2 (bad arguments)."""
    try:
        for image in args.images:
            parse_reference(image)
        settings = registry_settings(args)
    except InvalidReference as exc:
        print(f"podplacement inspect: invalid image reference: {one_line(exc)}",
              file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"podplacement inspect: {one_line(exc)}", file=sys.stderr)
        return 2
    credentials = settings.credentials
    inspector = Inspector(registries=settings.registries, ca_bundles=settings.ca_bundles,
                          timeout=args.timeout)
    if getattr(args, "verify", False):
        return _run_verify(args, inspector, credentials)
    results = asyncio.run(_inspect_all(list(args.images), inspector, credentials))
    failed = False
    out: list[dict[str, Any]] = []
    for image, result in zip(args.images, results, strict=True):
        if isinstance(result, RegistryError):
            failed = True
            out.append({"image": image, "error": str(result), "errorType": type(result).__name__})
            if not args.json:
                print(f"{image}: error: {type(result).__name__}: {result}", file=sys.stderr)
            continue
        out.append({"image": image, **_describe(result)})
        if not args.json:
            print(result.reference)
            print(f"  digest:     {result.digest}")
            print(f"  media type: {result.media_type}")
            platforms = ", ".join(str(p) for p in result.platforms) or "(none)"
            print(f"  platforms:  {platforms}")
    if args.json:
        print(json.dumps(out, indent=2))
    return 1 if failed else 0


async def _verify_all(images: list[str], inspector: Inspector, credentials: list[Credential],
                      max_bytes: int) -> list[VerifyReport | RegistryError]:
    async def one(image: str) -> VerifyReport | RegistryError:
        try:
            return await verify_image(inspector, image, credentials, max_bytes=max_bytes)
        except RegistryError as exc:
            return exc

    try:
        return [await one(i) for i in images]
    finally:
        await inspector.aclose()


def _platform_lines(p: PlatformReport) -> list[str]:
    flag = "MISMATCH" if p.status == "mismatch" else p.status
    lines = [f"  {p.platform}: {flag}: {p.reason}"]
    for f in p.files:
        where = f.path or "(not found)"
        via = f" (via {', '.join(f.via)})" if f.via else ""
        lines.append(f"    {f.name} -> {where}{via}: {f.detail or f.kind}")
    cap = ", byte cap reached" if p.cap_hit else ""
    lines.append(f"    read {p.bytes_read} bytes, {p.layers_read}/{p.layers} layers, "
                 f"{p.seconds:.2f} s{cap}")
    return lines


def _run_verify(args: argparse.Namespace, inspector: Inspector,
                credentials: list[Credential]) -> int:
    """``inspect --verify``: 0 all platforms fine, 1 an image failed, 3 a platform flagged."""
    results = asyncio.run(_verify_all(list(args.images), inspector, credentials,
                                      args.max_bytes))
    failed = flagged = False
    out: list[dict[str, Any]] = []
    for image, result in zip(args.images, results, strict=True):
        if isinstance(result, RegistryError):
            failed = True
            out.append({"image": image, "error": str(result), "errorType": type(result).__name__})
            if not args.json:
                print(f"{image}: error: {type(result).__name__}: {result}", file=sys.stderr)
            continue
        flagged = flagged or bool(result.mismatched)
        failed = failed or any(p.status == "error" for p in result.platforms)
        out.append({"image": image, **result.to_dict()})
        if not args.json:
            print(result.reference)
            print(f"  digest:     {result.digest}")
            print(f"  mismatched: {', '.join(result.mismatched) or '(none)'}")
            for p in result.platforms:
                print("\n".join(_platform_lines(p)))
    if args.json:
        print(json.dumps(out, indent=2))
    return EXIT_MISMATCH if flagged else 1 if failed else 0
