"""Act 1 of ``podplacement demo``: choose and start the API server (the real control plane
with its real amd64 and emulated arm64 nodes, localkube, or an existing cluster)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from podplacement.demo.apidouble import LocalkubeMissing, localkube_available, localkube_command
from podplacement.demo.common import CRD_FILES, Child, DemoError, DemoOptions, start_child
from podplacement.sandbox.controlplane import (
    HOW_TO_GET,
    K8S_VERSION,
    Assets,
    AssetsNotFound,
    ControlPlane,
    ControlPlaneError,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.realnode import NodeError, NodeUnavailable, RealNode, start_real_node

log = logging.getLogger("podplacement.demo")

# --- API server -------------------------------------------------------------------------


@dataclass
class ApiServer:
    """The API server in use: ``kubeconfig`` path, ``kind`` (``localkube``, ``real`` or
    ``existing``), whether a scheduler binds pods, how to stop it (None: not ours), the
    process behind it when the demo started one (to report its log if it dies), and the
    real node beside the real control plane (None: every node is simulated; ``node_note``
    says why) and the emulated arm64 node beside it (None: the pods placed on arm64 go to
    the simulated ``demo-arm64``; ``arm64_note`` says why)."""

    kubeconfig: Path
    kind: str
    scheduler: bool
    stop: Callable[[], None] | None = None
    child: Child | None = None
    node: RealNode | None = None
    node_note: str = ""
    arm64_node: RealNode | None = None
    arm64_note: str = ""

    @property
    def real_nodes(self) -> list[RealNode]:
        """The real nodes that run: the amd64 one first, then the arm64 one."""
        return [n for n in (self.node, self.arm64_node) if n is not None]

    def real_nodes_line(self) -> str:
        """``real nodes: amd64, arm64`` (the architectures of the real nodes), or
        ``real nodes: none``."""
        return f"real nodes: {', '.join(n.arch for n in self.real_nodes) or 'none'}"


def start_localkube(work: Path, log_dir: Path, ready_seconds: float = 30.0) -> ApiServer:
    """localkube, the API double of a source checkout (:mod:`podplacement.demo.apidouble`),
    as a process on a port it picks itself (no race for a free port) with our CRDs; it writes
    the kubeconfig, then logs ``localkube listening on URL``.

    Raises:
        DemoError: localkube is not installed, exited, or did not come up within
            ``ready_seconds``.
    """
    kubeconfig = work / "kubeconfig"
    try:
        args = localkube_command(kubeconfig, CRD_FILES)
    except LocalkubeMissing as exc:
        raise DemoError(LOCALKUBE_MISSING) from exc
    child = start_child("localkube", args, log_dir)
    deadline = time.monotonic() + ready_seconds
    try:
        while "localkube listening on" not in child.tail(5):
            if not child.alive() or time.monotonic() > deadline:
                raise DemoError(f"localkube did not start:\n{child.tail()}")
            time.sleep(0.1)
    except BaseException:  # Ctrl-C included: the caller does not know the process yet
        child.stop()
        raise
    note = "localkube, the API double, runs no kubelet"
    log.info("real node: none, every node is simulated and no pod runs (%s)", note)
    return ApiServer(kubeconfig, "localkube", scheduler=False, stop=child.stop, child=child,
                     node_note=note)


def start_real_cluster(work: Path, assets: Assets, debs: Path | None = None) -> ApiServer:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager of ``assets``
    (:mod:`podplacement.sandbox.controlplane`), and the real amd64 node when this machine
    runs one (:mod:`podplacement.sandbox.realnode`; one line says so, or why not); beside
    it the emulated arm64 node (``arch="arm64"``, its packages in ``debs``, as
    ``hack/fetch-debs.sh`` downloads them) when this machine runs that too (one line says
    so, or why not: the demo goes on without it).

    Raises:
        DemoError: the control plane did not start.
    """
    try:
        plane = start_control_plane(assets, work / "control-plane")
    except ControlPlaneError as exc:
        raise DemoError(str(exc)) from exc
    node: RealNode | None = None
    note = ""
    try:
        node = start_real_node(plane, work / "node")
    except NodeUnavailable as exc:
        note = str(exc)
    except (NodeError, OSError) as exc:
        note = f"it did not start: {exc}"
    except BaseException:
        plane.stop()
        raise
    if node is not None:
        log.info("real node: %s (%s), where the pods placed on amd64 run; the other nodes "
                 "are simulated", node.name, node.describe())
    else:
        log.warning("real node: none, every node is simulated and no pod runs (%s)", note)
    arm64, arm64_note = (_start_arm64_node(plane, work, debs, node) if node is not None
                         else (None, "no real amd64 node"))

    def stop() -> None:
        for real in (arm64, node):
            if real is not None:
                real.stop()
        plane.stop()

    return ApiServer(plane.kubeconfig, "real", scheduler="kube-scheduler" in plane.processes,
                     stop=stop, node=node, node_note=note, arm64_node=arm64,
                     arm64_note=arm64_note)


def _start_arm64_node(plane: ControlPlane, work: Path, debs: Path | None,
                      amd64: RealNode) -> tuple[RealNode | None, str]:
    """The emulated arm64 node beside ``amd64`` (:func:`start_real_cluster`), or None and
    the one-line reason it does not run (logged as a warning); on Ctrl-C the amd64 node and
    the plane are stopped before the interrupt goes on."""
    try:
        arm64 = start_real_node(plane, work / "node-arm64", arch="arm64", debs=debs)
    except NodeUnavailable as exc:
        note = str(exc)
    except (NodeError, OSError) as exc:
        note = f"it did not start: {exc}"
    except BaseException:
        amd64.stop()
        plane.stop()
        raise
    else:
        log.info("real arm64 node: %s (%s, emulated: qemu-user), where the pods placed on "
                 "arm64 run", arm64.name, arm64.describe())
        return arm64, ""
    log.warning("arm64 node: none, the pods placed on arm64 go to the simulated demo-arm64 "
                "(%s)", note)
    return None, note


#: Why the demo cannot fall back to localkube in an installed wheel.
LOCALKUBE_MISSING = ("localkube, the test-only API double, is not installed (it ships in the "
                     "source checkout, not in the wheel)")


def _require_localkube(why: str, instead: str) -> None:
    """Raise DemoError unless localkube (the source tree's test-only API double) is
    importable; the one-line message is ``why`` (how the demo got here), that localkube is
    missing, and ``instead`` (what to do)."""
    if not localkube_available():
        raise DemoError(f"{why}; {LOCALKUBE_MISSING}: {instead}")


def choose_api_server(options: DemoOptions) -> Assets | None:
    """Decide which API server the demo runs on and log it (the demo's first line): the
    control-plane binaries for the real one, None for localkube or an existing cluster.

    localkube, the API double, is a test-only package of the source tree (the wheel does not
    install it): outside a checkout the demo needs the real binaries or ``--kubeconfig``.

    Raises:
        DemoError: ``--api-server real`` and no binaries were found, or localkube is wanted
            (or the only choice left) and not installed.
    """
    if options.kubeconfig is not None:
        log.info("API server: the existing cluster of %s", options.kubeconfig)
        return None
    if options.api_server == "localkube":
        _require_localkube("--api-server localkube",
                           "drop it to run on the real control plane (to get one, "
                           f"{HOW_TO_GET}), or use --kubeconfig FILE for an existing cluster")
        log.info("API server: localkube, the API double (--api-server localkube); no "
                 "kube-scheduler binds the pods")
        return None
    try:
        assets = locate_assets()
    except AssetsNotFound as exc:
        if options.api_server == "real":
            raise DemoError(f"--api-server real: {exc}") from exc
        _require_localkube(str(exc), "the demo needs those binaries, or --kubeconfig FILE "
                                     "for an existing cluster")
        log.warning("API server: localkube, the API double, not the real control plane; no "
                    "kube-scheduler binds the pods. Why: %s", exc)
        return None
    log.info("API server: the real control plane, kube-apiserver %s with kube-scheduler and "
             "kube-controller-manager from %s (%s)", K8S_VERSION, assets.directory,
             assets.source)
    return assets
