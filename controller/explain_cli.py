"""The ``podplacement explain`` subcommand: read a pod, the nodes and their NRTs, inspect the
images (or assume their platforms) and print the dry-run report of :mod:`controller.explain`.

Inputs are files as ``kubectl get ... -o yaml`` prints them (a ``List``, a single object or
multi-document YAML), or a live cluster through ``--kubeconfig`` (Nodes and
``topology.node.k8s.io/v1alpha2`` NodeResourceTopologies; a missing NRT CRD means no NRTs).
Without ``--config`` the defaults apply, with NUMA placement enabled when any NRT was read.
Exit status: 0 report printed, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from controller.config import (
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    ConfigError,
    PlacementConfig,
)
from controller.decision import unique_images
from controller.explain import OUTPUTS, explain, render
from controller.numa import STRATEGIES, QuantityError


class InputError(Exception):
    """An input file or option cannot be used (message says which and why)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Platform:
    os: str
    architecture: str
    variant: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _AssumedImage:
    """Stand-in for ``imageinspect.ImageInfo`` under ``--assume-platforms``."""

    reference: str
    digest: str
    platforms: tuple[_Platform, ...]


def load_objects(path: str) -> list[dict[str, Any]]:
    """Objects in a YAML/JSON file: the items of ``List``-kind documents, other documents as
    they are; empty documents are skipped.

    Raises:
        InputError: unreadable file or not YAML.
    """
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        docs = list(yaml.safe_load_all(text))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: {exc}") from exc
    out: list[dict[str, Any]] = []
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InputError(f"{path}: expected Kubernetes objects, got {type(doc).__name__}")
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            out.extend(i for i in doc["items"] if isinstance(i, dict))
        else:
            out.append(doc)
    return out


def parse_platforms(text: str) -> tuple[_Platform, ...]:
    """``linux/amd64,linux/arm64/v8`` -> platforms. Raises InputError on another shape."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        parts = item.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise InputError(f"--assume-platforms: {item!r} is not os/architecture[/variant]")
        out.append(_Platform(parts[0], parts[1], parts[2] if len(parts) == 3 else None))
    return tuple(out)


def _by_name(objs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str((o.get("metadata") or {}).get("name", "")): o for o in objs}


def read_cluster(kubeconfig: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and NRTs from the cluster ``kubeconfig`` points at (raw JSON, quantities as
    sent). Raises InputError when the cluster cannot be read."""
    import json

    from kubernetes import client, config  # imported here: only this path needs it
    from kubernetes.client.rest import ApiException

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig)
    except Exception as exc:  # the loader raises several unrelated types
        raise InputError(f"--kubeconfig {kubeconfig}: {exc}") from exc
    core: Any = client.CoreV1Api(api_client)
    custom: Any = client.CustomObjectsApi(api_client)
    with api_client:
        try:
            raw = core.list_node(_preload_content=False)
            nodes = json.loads(raw.data).get("items") or []
        except ApiException as exc:
            raise InputError(f"listing nodes: {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise InputError(f"listing nodes: {exc}") from exc
        try:
            raw = custom.list_cluster_custom_object(
                NRT_GROUP, NRT_VERSION, NRT_PLURAL, _preload_content=False)
            nrts = json.loads(raw.data).get("items") or []
        except ApiException as exc:
            if exc.status != 404:
                raise InputError(f"listing NRTs: {exc.status} {exc.reason}") from exc
            nrts = []  # the NodeResourceTopology CRD is not installed
    return nodes, nrts


async def _inspect(images: Sequence[str], insecure: Sequence[str] = ()) -> dict[str, Any]:
    from imageinspect import Inspector, RegistriesConfig

    registries = RegistriesConfig()
    for host in insecure:
        registries = registries.with_insecure(host)
    async with Inspector(registries=registries) as inspector:
        async def one(image: str) -> Any:
            try:
                return await inspector.inspect(image)
            except Exception as exc:  # reported per image, like the controller does
                return exc
        results = await asyncio.gather(*(one(i) for i in images))
    return dict(zip(images, results, strict=True))


def _config(args: argparse.Namespace, have_nrts: bool) -> PlacementConfig:
    if args.config:
        objs = load_objects(args.config)
        if not objs:
            raise InputError(f"{args.config}: no PodPlacementConfig")
        try:
            cfg = PlacementConfig.from_object(objs[0])
        except ConfigError as exc:
            raise InputError(f"{args.config}: {exc}") from exc
    else:
        cfg = PlacementConfig()
        cfg = dataclasses.replace(
            cfg, topology=dataclasses.replace(cfg.topology, enabled=have_nrts))
    if args.scoring_strategy:
        cfg = dataclasses.replace(
            cfg, topology=dataclasses.replace(cfg.topology, scoring_strategy=args.scoring_strategy))
    return cfg


def run(args: argparse.Namespace) -> int:
    """Execute ``podplacement explain``; prints the report to stdout, errors to stderr."""
    try:
        pods = [o for o in load_objects(args.pod) if o.get("kind", "Pod") == "Pod"]
        if not pods:
            raise InputError(f"{args.pod}: no Pod found")
        pod = pods[0]
        if args.kubeconfig:
            if args.nodes or args.nrt:
                raise InputError("use --kubeconfig or --nodes/--nrt, not both")
            nodes, nrt_list = read_cluster(args.kubeconfig)
        else:
            nodes = load_objects(args.nodes) if args.nodes else []
            nrt_list = load_objects(args.nrt) if args.nrt else []
        nrts = _by_name(nrt_list)
        config = _config(args, bool(nrts))
        images = list(unique_images(pod))
        if args.assume_platforms:
            assumed = parse_platforms(args.assume_platforms)
            results: dict[str, Any] = {i: _AssumedImage(i, "", assumed) for i in images}
        else:
            results = asyncio.run(_inspect(images, args.insecure_registry or ()))
        report = explain(pod, nodes, nrts, results, config)
    except InputError as exc:
        print(f"podplacement explain: {exc}", file=sys.stderr)
        return 2
    except (QuantityError, ValueError) as exc:
        print(f"podplacement explain: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(report, args.output))
    return 0


def register(subparsers: Any) -> None:
    """Add the ``explain`` subcommand to the ``podplacement`` dispatcher."""
    parser = subparsers.add_parser(
        "explain",
        help="dry-run the placement decision for a pod",
        description="Show where a pod would be placed and why: images and platforms, the "
                    "architecture decision, a verdict and NUMA score per node, and the "
                    "nodeAffinity that would be injected.",
    )
    parser.add_argument("pod", metavar="POD.yaml", help="the pod manifest ('-' for stdin)")
    parser.add_argument("--kubeconfig", help="read Nodes and NRTs from this cluster")
    parser.add_argument("--nodes", metavar="NODES.yaml", help="kubectl get nodes -o yaml")
    parser.add_argument("--nrt", metavar="NRTS.yaml",
                        help="kubectl get noderesourcetopologies -o yaml")
    parser.add_argument("--config", metavar="CONFIG.yaml", help="a PodPlacementConfig")
    parser.add_argument("--assume-platforms", metavar="OS/ARCH,...",
                        help="skip the registry: every image supports these platforms")
    parser.add_argument("--insecure-registry", metavar="HOST[:PORT]", action="append",
                        help="reach this registry over plain HTTP (repeatable)")
    parser.add_argument("--scoring-strategy", choices=STRATEGIES,
                        help="override spec.topology.scoringStrategy")
    parser.add_argument("--output", "-o", choices=OUTPUTS, default="table")
    parser.set_defaults(func=run)
