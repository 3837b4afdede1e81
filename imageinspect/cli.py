"""``podplacement inspect``: print the digest, media type and platforms of images.

Example::

    podplacement inspect --pull-secret regcred.json --insecure-registry 127.0.0.1:5000 \\
        nginx 127.0.0.1:5000/team/app:v1

``--pull-secret`` takes a Kubernetes Secret (JSON or YAML, ``kubernetes.io/dockerconfigjson``
or ``kubernetes.io/dockercfg``) or a docker ``config.json``. Exit code 0 when every image was
inspected, 1 when any failed (each failure is printed with its registry, reference and status),
2 for unusable arguments or files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from imageinspect._credentials import (
    Credential,
    credentials_from_docker_config,
    credentials_from_pull_secrets,
)
from imageinspect._errors import RegistryError
from imageinspect._inspector import Inspector
from imageinspect._manifest import ImageInfo
from imageinspect._registries import RegistriesConfig


def register(subparsers: Any) -> None:
    """Add the ``inspect`` subcommand to the ``podplacement`` parser (see podplacement.cli)."""
    p = subparsers.add_parser(
        "inspect",
        help="show the platforms of container images",
        description="Fetch image manifests and print each image's digest, media type and "
        "platforms (os/architecture/variant).",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image references")
    p.add_argument("--json", action="store_true", help="print one JSON array")
    p.add_argument(
        "--pull-secret",
        action="append",
        default=[],
        metavar="FILE",
        help="Kubernetes pull Secret (JSON/YAML) or docker config.json; repeatable",
    )
    p.add_argument("--registries-conf", metavar="FILE", help="containers-registries.conf v2 file")
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
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (10)")
    p.set_defaults(func=run)


def _load_credentials(path: str) -> list[Credential]:
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON/YAML object")
    items = doc.get("items") if doc.get("kind") == "List" else None
    if isinstance(items, list):
        return credentials_from_pull_secrets([i for i in items if isinstance(i, dict)])
    if doc.get("kind") == "Secret" or ("type" in doc and "data" in doc):
        return credentials_from_pull_secrets([doc])
    return credentials_from_docker_config(doc)


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
        credentials = [c for f in args.pull_secret for c in _load_credentials(f)]
        registries = (
            RegistriesConfig.load(args.registries_conf)
            if args.registries_conf
            else RegistriesConfig()
        )
        for host in args.insecure_registry:
            registries = registries.with_insecure(host)
        ca_bundles: dict[str, bytes] = {}
        for item in args.ca_file:
            host, sep, file = item.partition("=")
            if not sep or not host or not file:
                raise ValueError(f"--ca-file wants HOST=FILE, got {item!r}")
            ca_bundles[host] = Path(file).read_bytes()
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"podplacement inspect: {exc}", file=sys.stderr)
        return 2
    inspector = Inspector(registries=registries, ca_bundles=ca_bundles, timeout=args.timeout)
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
