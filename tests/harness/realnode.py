"""The ``realnode`` tier's harness: a real control plane whose one amd64 node is real
(kubelet + containerd + runc, :mod:`podplacement.sandbox.realnode`) beside the fake arm64,
ppc64le, s390x and Windows nodes, and real binaries for the images that run there (Debian's
``busybox-static`` of amd64 and arm64, as ``hack/fetch-debs.sh`` downloads them).

A module starts its cluster once (:func:`cluster_with_real_node`); without the control
plane, the kubelet, containerd or the ``.deb`` files it skips with the reason (under
``CI=true`` the session refuses to start instead: ``tests/conftest.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from podplacement.demo.images import DemoImageError, busybox_binary, make_layer
from podplacement.sandbox.controlplane import DEFAULT_NODES, AssetsNotFound, FakeNode
from podplacement.sandbox.realnode import (
    NodeUnavailable,
    RealNode,
    find_arm64_root,
    find_runtime,
    start_real_node,
)
from podplacement.sandbox.registry import Registry
from tests.harness.kube import KubeEnv, start_real
from tests.harness.realcluster import wait_for

__all__ = ["FAKE_NODES", "FAKE_NODES_BESIDE_ARM64", "REALNODE", "NodeCluster", "busybox",
           "busybox_layer", "cluster_with_real_node", "debs_dir", "missing_arm64_node",
           "missing_real_node", "wait_for"]

REPO = Path(__file__).resolve().parents[2]
#: The marker of the tests that need the real node.
REALNODE = "realnode"
#: The fake nodes beside the real one: every platform but linux/amd64 (the real node's).
FAKE_NODES: tuple[FakeNode, ...] = tuple(
    n for n in DEFAULT_NODES if (n.os, n.arch) != ("linux", "amd64"))


#: The fake nodes beside the real amd64 and arm64 ones: every platform but linux/amd64 and
#: linux/arm64 (so an arm64 pod can only go to the emulated arm64 node).
FAKE_NODES_BESIDE_ARM64: tuple[FakeNode, ...] = tuple(
    n for n in DEFAULT_NODES if (n.os, n.arch) not in (("linux", "amd64"), ("linux", "arm64")))


def missing_arm64_node() -> str | None:
    """Why this machine can't run the emulated arm64 node (one line), or None when it
    can."""
    why = missing_real_node()
    if why is not None:
        return why
    try:
        find_arm64_root(debs_dir())
    except NodeUnavailable as exc:
        return str(exc)
    return None


def missing_real_node() -> str | None:
    """Why this machine can't run the real node (one line), or None when it can."""
    try:
        find_runtime()
    except NodeUnavailable as exc:
        return str(exc)
    return None


@dataclass
class NodeCluster:
    """A real control plane with the real node and the fake ones.

    Attributes:
        kube: the control plane.
        node: the real node (its name: ``node.name``).
        arm64: the emulated arm64 node, when asked for.
    """

    kube: KubeEnv
    node: RealNode
    arm64: RealNode | None = None


def cluster_with_real_node(tmp_path_factory: pytest.TempPathFactory, name: str,
                           registries: tuple[Registry, ...] = (), arm64: bool = False,
                           **options: Any) -> Iterator[NodeCluster]:
    """A real control plane (``options`` go to ``start_real``) with :data:`FAKE_NODES` and
    the real node trusting ``registries``, for one module; with ``arm64`` also the emulated
    arm64 node, and :data:`FAKE_NODES_BESIDE_ARM64` as the fake ones. Skips when this
    machine can't run them. Stops the nodes (undoing their host effects) and the plane
    afterwards."""
    why = missing_arm64_node() if arm64 else missing_real_node()
    if why is not None:
        pytest.skip(why)
    try:
        kube = start_real(tmp_path_factory.mktemp(name),
                          nodes=FAKE_NODES_BESIDE_ARM64 if arm64 else FAKE_NODES, **options)
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    nodes: list[RealNode] = []
    try:
        assert kube.plane is not None
        nodes.append(start_real_node(kube.plane, tmp_path_factory.mktemp(f"{name}-node"),
                                     registries=registries))
        if arm64:
            nodes.append(start_real_node(kube.plane, tmp_path_factory.mktemp(f"{name}-arm64"),
                                         registries=registries, arch="arm64",
                                         debs=debs_dir()))
        yield NodeCluster(kube, nodes[0], nodes[1] if arm64 else None)
    finally:
        for node in reversed(nodes):
            node.stop()
        kube.stop()


def debs_dir() -> Path | None:
    """The directory of the busybox-static ``.deb`` files (``PODPLACEMENT_DEMO_DEBS``, the
    checkout's ``.demo-cache/debs``, the demo's user cache), or None."""
    from podplacement.demo.images import user_cache_dir

    for candidate in (os.environ.get("PODPLACEMENT_DEMO_DEBS"),
                      str(REPO / ".demo-cache" / "debs"), str(user_cache_dir() / "debs")):
        if candidate and list(Path(candidate).glob("busybox-static_*_arm64.deb")) \
                and list(Path(candidate).glob("busybox-static_*_amd64.deb")):
            return Path(candidate)
    return None


def busybox(arch: str) -> bytes:
    """The real busybox of ``arch`` (``amd64`` or ``arm64``) from the ``.deb`` files;
    skips without them (``hack/fetch-debs.sh`` downloads them)."""
    debs = debs_dir()
    if debs is None:
        pytest.skip("busybox-static .debs of amd64 and arm64 not found: run "
                    "hack/fetch-debs.sh (fills .demo-cache/debs) or set PODPLACEMENT_DEMO_DEBS")
    try:
        return busybox_binary(debs, arch)
    except DemoImageError as exc:
        pytest.skip(str(exc))


def busybox_layer(arch: str) -> bytes:
    """A gzip'd layer with ``bin/busybox`` of ``arch`` and ``bin/sh`` linked to it."""
    return make_layer(busybox(arch))
