"""``podplacement demo``: the product run for real on this machine, start to finish.

Steps: find the API server first and say which in the first log line (the real control plane of
:mod:`podplacement.sandbox.controlplane` when its binaries are found: etcd, kube-apiserver,
kube-scheduler and kube-controller-manager; localkube, the API double, as a subprocess when they
are not, with how to get them; or an existing cluster with ``--kubeconfig``), and start it in
the background, with the real amd64 node of :mod:`podplacement.sandbox.realnode` beside the real
control plane when this machine runs one (one line says so, or why not), while the demo gets its
busybox binaries (:mod:`podplacement.demo.images`: downloaded when missing) and starts two real
registries with real multi-arch busybox images (:mod:`podplacement.demo.seed`); apply the CRDs,
nodes, NodeResourceTopologies and the PodPlacementConfig ``cluster``; generate certificates with
``podplacement certs generate``; start ``podplacement webhook`` (HTTPS on 127.0.0.1) and
``podplacement controller`` as processes side by side, exactly as they run in a cluster (the
controller creates the MutatingWebhookConfiguration with the caBundle); create the sample pods
(:mod:`podplacement.demo.workloads`); wait (bounded) until every pod is ungated or waiting for
NUMA resources; print the table (:mod:`podplacement.demo.report`), ``podplacement explain`` of
the pod that waits, and a check of every pod against what its images and the NUMA zones imply;
with a real node, wait (bounded) until the pods bound to it run and print their phase and first
log line, and say which nodes are real and which are simulated; then free CPUs in one NUMA zone
(a NodeResourceTopology update) and show the waiting pod placed there; print a summary of the
controller's ``/metrics``; stop everything it started (processes terminated and waited for, the
real node's host effects undone, the work directory removed), also on Ctrl-C and errors. The
output and the last log line end with the real nodes that ran (``real nodes: amd64, arm64``,
the emulated arm64 node of ``start_real_node(arch="arm64")`` beside the amd64 one when this
machine runs it: the pods placed arm64-only run there).
Exit code: 0 when everything went as expected, 1 when a pod did not, 2 when a step failed,
130 when interrupted.

With ``--kubeconfig`` nothing is faked: no nodes, NRTs, config, webhook or controller are
created (the product must already be installed, ``kubectl apply -k deploy/`` and its config
created, ``kubectl create -f deploy/samples/podplacementconfig.yaml``); only the
namespace, the pull secret and the pods are, and the namespace is deleted at the end. The
registries still listen on 127.0.0.1 of this machine, so the cluster's controller can reach
them only when it runs here too: that is the limitation of that mode.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import importlib.resources
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, TextIO

import yaml

from podplacement.demo import report, workloads
from podplacement.demo.apidouble import LocalkubeMissing, localkube_available, localkube_command
from podplacement.demo.images import DemoImageError, prepare_busybox
from podplacement.demo.seed import (
    DemoRegistryPair,
    push_images,
    start_registries,
)
from podplacement.demo.workloads import Expectation
from podplacement.kubeclient import MERGE_PATCH, ApiError, KubeAPI
from podplacement.rules.config import (
    API_VERSION,
    CONFIG_NAME,
    CONFIG_PLURAL,
    DEFAULT_NAMESPACE,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    WEBHOOK_CONFIGURATION_NAME,
)
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
from podplacement.sandbox.ports import free_port
from podplacement.sandbox.realnode import NodeError, NodeUnavailable, RealNode, start_real_node

log = logging.getLogger("podplacement.demo")

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The working directory of the processes the demo starts: the checkout when run from one,
#: else the current directory (an installed wheel has no checkout).
WORKDIR = REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else None
#: The CRDs the demo applies: package data of ``podplacement`` (``podplacement/crds/``,
#: links to deploy/'s files in a checkout, copies in a wheel).
CRD_FILES = tuple(
    Path(str(importlib.resources.files("podplacement") / "crds" / name))
    for name in ("podplacementconfig.yaml", "imageplatformcatalog.yaml", "podplacementpolicy.yaml",
                 "noderesourcetopology-crd.yaml")
)
MWC_PATH = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
    + WEBHOOK_CONFIGURATION_NAME
)


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and where its log is."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``podplacement demo`` was asked to do.

    Attributes:
        debs: directory with the four ``busybox-static_*_<arch>.deb`` files (those missing
            are downloaded there, see :func:`podplacement.demo.images.prepare_busybox`).
        download: whether missing packages are downloaded (else stand-ins are used).
        api_server: ``auto`` (the real control plane when found, else localkube), ``real``
            (fail without it) or ``localkube``; ignored with ``kubeconfig``.
        kubeconfig: use this existing cluster instead of starting an API server.
        keep: keep the work directory (logs, certificates, kubeconfig) and, on an existing
            cluster, the ``demo`` namespace.
        settle_timeout: seconds to wait for the pods to be decided.
        max_wait_seconds: ``spec.topology.maxWaitSeconds`` of the demo's config.
        out: where the table goes.
    """

    debs: Path
    download: bool = True
    api_server: str = "auto"
    kubeconfig: Path | None = None
    keep: bool = False
    settle_timeout: float = 60.0
    max_wait_seconds: int = 45
    out: TextIO = field(default_factory=lambda: sys.stdout)


# --- processes --------------------------------------------------------------------------


@dataclass
class Child:
    """A process the demo started: ``name`` for messages, its ``log`` file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _log_file: IO[bytes] | None = None
    _stopped: bool = False

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of its log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL and wait (idempotent). A process
        that had already exited is reported (it should have run until now)."""
        code = self.popen.poll()
        if code is not None and not self._stopped:
            log.warning("%s had exited on its own (exit code %s); last lines of %s:\n%s",
                        self.name, code, self.log, self.tail(10))
        self._stopped = True
        if code is None:
            began = time.monotonic()
            self.popen.terminate()
            try:
                code = self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s; killing it", self.name, timeout)
                self.popen.kill()
                code = self.popen.wait(timeout=10)
            log.info("stopped %s (pid %d, exit code %s, %.1f s)", self.name, self.popen.pid,
                     code, time.monotonic() - began)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def start_child(name: str, args: Sequence[str], log_dir: Path,
                env: dict[str, str] | None = None) -> Child:
    """Start ``args`` in its own session (so a terminal Ctrl-C reaches only the demo, which
    then stops its children in order), stdout+stderr to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{name}.log"
    handle = path.open("ab")
    try:
        popen = subprocess.Popen(
            list(args), stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            cwd=WORKDIR, env={**os.environ, **(env or {})}, start_new_session=True,
        )
    except BaseException:
        handle.close()
        raise
    log.info("started %s (pid %d), log %s", name, popen.pid, path)
    return Child(name, popen, path, handle)


def podplacement_args(*args: str) -> list[str]:
    """The command line of a ``podplacement`` subcommand run with this interpreter."""
    return [sys.executable, "-m", "podplacement", "--log-format", "text", *args]




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


# --- waiting ----------------------------------------------------------------------------


async def wait_for(what: str, check: Callable[[], Awaitable[bool]], limit: float,
                   interval: float = 0.2, alive: Sequence[Child] = ()) -> None:
    """Poll ``check`` until it returns True, at most ``limit`` seconds.

    Raises:
        DemoError: the time ran out, or one of ``alive`` exited (with its log tail).
    """
    deadline = time.monotonic() + limit
    while True:
        for child in alive:
            if not child.alive():
                raise DemoError(f"{child.name} exited while waiting for {what}:\n{child.tail()}")
        if await check():
            return
        if time.monotonic() >= deadline:
            raise DemoError(f"timed out after {limit:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


async def _ok(api: KubeAPI, path: str) -> bool:
    try:
        await api.request("GET", path)
    except ApiError:
        return False
    return True


async def create(api: KubeAPI, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    """POST ``obj`` to the collection ``path``; an existing object (409) is left alone and
    returned as it is."""
    try:
        return await api.request("POST", path, body=obj)
    except ApiError as exc:
        if exc.status != 409:
            raise
        name = obj["metadata"]["name"]
        return await api.request("GET", f"{path}/{name}")


# --- the scenario -----------------------------------------------------------------------


async def install_crds(api: KubeAPI) -> None:
    """Create our CRDs (skipped when present) and wait until their APIs are served."""
    for crd_file in CRD_FILES:
        for doc in yaml.safe_load_all(crd_file.read_text()):
            if doc:
                await create(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)

    async def served() -> bool:
        return (await _ok(api, f"/apis/{API_VERSION}/{CONFIG_PLURAL}")
                and await _ok(api, f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}"))

    await wait_for("the CRDs to be served", served, 30.0)


async def install_cluster_objects(api: KubeAPI, config: dict[str, Any],
                                  real_node: bool = False, real_arm64: bool = False) -> None:
    """Namespaces, nodes (made Ready and untainted, as a kubelet would; with a
    ``real_node``, the NUMA nodes tainted :data:`workloads.SIMULATED_TAINT`, with
    ``real_arm64`` the arm64 one too), NRTs, and the PodPlacementConfig ``config``."""
    await create(api, "/api/v1/namespaces", workloads.namespace_object(DEFAULT_NAMESPACE))
    for node in workloads.NODES:
        await create(api, "/api/v1/nodes", workloads.node_object(node))
        path = f"/api/v1/nodes/{node.name}"
        with contextlib.suppress(ApiError):
            await api.request("PATCH", f"{path}/status", body=workloads.node_status(node),
                              content_type=MERGE_PATCH)
        # TaintNodesByCondition taints a node created without a Ready kubelet; a scheduler
        # would never bind there.
        with contextlib.suppress(ApiError):
            await api.request("PATCH", path, body={"spec": {
                "taints": workloads.node_taints(node, real_node, real_arm64)}},
                content_type=MERGE_PATCH)
    for nrt in workloads.nrt_objects():
        await create(api, f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}", nrt)
    await create(api, f"/apis/{API_VERSION}/{CONFIG_PLURAL}", config)


async def install_namespace(api: KubeAPI, registries: workloads.DemoRegistries) -> None:
    """The ``demo`` namespace, its default ServiceAccount and the pull secret.

    Raises:
        DemoError: a namespace of that name exists and was not made by the demo (it is
            never reused, nor deleted at the end).
    """
    ns = workloads.DEMO_NAMESPACE
    stored = await create(api, "/api/v1/namespaces", workloads.namespace_object(ns))
    if not workloads.made_by_demo(stored):
        raise DemoError(f"namespace {ns} exists and was not created by the demo; "
                        "delete it or run the demo against another cluster")
    await create(api, f"/api/v1/namespaces/{ns}/serviceaccounts",
                 workloads.service_account_object(ns))
    await create(api, f"/api/v1/namespaces/{ns}/secrets", workloads.pull_secret(registries, ns))


async def list_demo(api: KubeAPI) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pods and Events (core/v1 and events.k8s.io/v1) of the demo namespace."""
    ns = workloads.DEMO_NAMESPACE
    pods = (await api.request("GET", f"/api/v1/namespaces/{ns}/pods")).get("items") or []
    events: list[dict[str, Any]] = []
    for path in (f"/api/v1/namespaces/{ns}/events",
                 f"/apis/events.k8s.io/v1/namespaces/{ns}/events"):
        with contextlib.suppress(ApiError):
            events += (await api.request("GET", path)).get("items") or []
    return pods, events


async def settle(api: KubeAPI, names: set[str], limit: float, watch: Sequence[Child],
                 scheduler: bool, done_states: tuple[str, ...] = ("ungated", "waiting"),
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Wait (bounded by ``limit`` s) until every pod of ``names`` is in one of
    ``done_states`` (see :func:`report.state_cell`; a pod the webhook never gated counts as
    done too), then (bounded) for their Events, which the controller sends after the ungate,
    and, with a scheduler, for the bindings of the pods that can run somewhere. Returns the
    last pods and events read; a timeout is logged, not raised (the table shows the state
    reached)."""
    ns = workloads.DEMO_NAMESPACE
    state: dict[str, Any] = {"pods": [], "events": []}

    async def read() -> list[dict[str, Any]]:
        pods, events = await list_demo(api)
        state["pods"], state["events"] = pods, events
        return [p for p in pods if p["metadata"]["name"] in names]

    async def decided() -> bool:
        ours = await read()
        return len(ours) == len(names) and all(
            report.state_cell(p) in (*done_states, "not-gated") for p in ours)

    async def reported() -> bool:
        ours = await read()
        reasons = report.events_by_pod(state["events"])
        return all(reasons.get((ns, p["metadata"]["name"])) for p in ours
                   if report.state_cell(p) in ("ungated", "waiting"))

    async def bound() -> bool:
        return all(p["spec"].get("nodeName") for p in await read()
                   if report.state_cell(p) == "ungated" and not report.unsatisfiable(p))

    try:
        await wait_for("the pods to be decided", decided, limit, interval=0.5, alive=watch)
    except DemoError as exc:
        log.error("%s", exc)
    with contextlib.suppress(DemoError):
        await wait_for("the events", reported, 10.0, interval=0.5)
    if scheduler:
        with contextlib.suppress(DemoError):
            await wait_for("the scheduler to bind the pods", bound, 15.0, interval=0.5)
    return state["pods"], state["events"]


def print_checks(out: TextIO, checks: Sequence[tuple[str, str, Expectation]],
                 pods: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]]) -> int:
    """Print one verdict line per ``(pod name, what it shows, expectation)``; returns how
    many did not match."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    reasons = report.events_by_pod(events)
    failures = 0
    for name, what, expect in checks:
        pod = by_name.get(name)
        if pod is None:
            problems = ["pod missing"]
        else:
            problems = report.check(pod, reasons.get((workloads.DEMO_NAMESPACE, name), []),
                                    expect)
        failures += bool(problems)
        verdict = "ok" if not problems else "UNEXPECTED: " + "; ".join(problems)
        print(f"{name:<20} {what}: {verdict}", file=out)
    return failures


async def run_workloads(api: KubeAPI, registries: workloads.DemoRegistries, server: ApiServer,
                        options: DemoOptions, watch: Sequence[Child],
                        metrics_url: str | None = None,
                        explain: Callable[[dict[str, Any]], Awaitable[str]] | None = None,
                        ) -> int:
    """Create the sample pods, wait for the decisions and print the table; explain (through
    ``explain``) why pods still wait; then free NUMA capacity and show the waiting pod placed
    (the controller re-queues waiting pods on NodeResourceTopology changes); finally a
    summary of the controller's metrics from ``metrics_url``. Returns the exit code (0 when
    everything went as expected, 1 otherwise). On an existing cluster only the table is
    shown and the exit code says whether podplacement decided every pod."""
    items = workloads.workloads(registries)
    ns = workloads.DEMO_NAMESPACE
    for w in items:
        await api.request("POST", f"/api/v1/namespaces/{ns}/pods", body=w.pod)
    names = {w.name for w in items}
    log.info("created %d pods in namespace %s; waiting for decisions", len(items), ns)
    pods, events = await settle(api, names, options.settle_timeout, watch, server.scheduler)
    by_name = {p["metadata"]["name"]: p for p in pods}
    ordered = [by_name[w.name] for w in items if w.name in by_name]
    out = options.out
    print(report.render_table(report.build_rows(ordered, events)) + "\n", file=out)
    kind = f"API server: {server.kind}, scheduler: {'yes' if server.scheduler else 'no'}"
    if server.kind == "existing":
        # The cluster's own nodes and PodPlacementConfig decide: the expectations hold for
        # the demo's fake cluster only, so report whether the product decided each pod.
        undecided = [w.name for w in items
                     if report.state_cell(by_name.get(w.name) or {}) not in
                     ("ungated", "waiting")]
        for name in undecided:
            print(f"{name:<20} not decided by podplacement (is it installed and running?)",
                  file=out)
        print(f"{len(items) - len(undecided)} of {len(items)} workloads decided ({kind})",
              file=out)
        out.flush()
        return 0 if not undecided else 1

    if explain is not None:
        for pod in ordered:
            if report.state_cell(pod) == "waiting":
                text = await explain(pod)
                if text:
                    print(f"why {pod['metadata']['name']} waits (podplacement explain):\n"
                          f"{text.rstrip()}\n", file=out)
    failures = print_checks(out, [(w.name, w.what, w.expect) for w in items], pods, events)
    print(f"\n{len(items) - failures} of {len(items)} workloads placed as expected ({kind})\n",
          file=out)
    out.flush()
    for real in server.real_nodes:
        failures += await show_real_node(api, real, options, watch)
    nodes = (await api.request("GET", "/api/v1/nodes")).get("items") or []
    print(report.nodes_line(nodes, [n.name for n in server.real_nodes]) + "\n", file=out)
    out.flush()

    waiting = workloads.WAITING_POD
    if report.state_cell(by_name.get(waiting) or {}) == "waiting":
        failures += await free_capacity(api, options, watch, server.scheduler)

    if metrics_url:
        exposition = await asyncio.to_thread(_http_text, metrics_url)
        summary = report.metrics_summary(exposition) if exposition else ""
        if summary:
            print(f"controller: {summary}", file=out)
    print(server.real_nodes_line(), file=out)
    out.flush()
    return 0 if failures == 0 else 1


#: Seconds the pods on the real node get to run (first pulls included: about 2 s each);
#: the emulated arm64 node gets :data:`ARM64_RUN_TIMEOUT` (its containerd and the
#: containers' programs run under qemu-user).
RUN_TIMEOUT = 30.0
ARM64_RUN_TIMEOUT = 60.0


async def show_real_node(api: KubeAPI, node: RealNode, options: DemoOptions,
                         watch: Sequence[Child]) -> int:
    """Wait (bounded by :data:`RUN_TIMEOUT`) until the pods bound to the real node run,
    then print their phase and first log line and one verdict per pod; returns how many did
    not run (a real node that got no pod counts as one)."""
    ns = workloads.DEMO_NAMESPACE
    state: dict[str, list[dict[str, Any]]] = {"pods": []}

    async def running() -> bool:
        pods = (await api.request("GET", f"/api/v1/namespaces/{ns}/pods")).get("items") or []
        state["pods"] = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node.name]
        return all((p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")
                   for p in state["pods"])

    with contextlib.suppress(DemoError):
        await wait_for(f"the pods on the real node {node.name} to run", running,
                       ARM64_RUN_TIMEOUT if node.arch == "arm64" else RUN_TIMEOUT,
                       interval=0.3, alive=watch)
    pods = state["pods"]
    logs = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        logs[name] = await asyncio.to_thread(node.pod_log, ns, name, "app")
    out = options.out
    print(f"on the real {node.arch} node {node.name} ({node.describe()}): the pods placed "
          "there run (phase, first line of their log):", file=out)
    rows = report.run_rows(pods, logs)
    print(report.render_table(rows, report.RUN_HEADERS, {}) + "\n", file=out)
    failures = 0 if rows else 1
    if not rows:
        print(f"no pod was bound to the real node {node.name}: UNEXPECTED", file=out)
    for row in rows:
        problems = ([f"phase {row.phase}"] if row.phase != "Running" else []) + (
            ["no log"] if row.log == "-" else [])
        failures += bool(problems)
        verdict = "ok" if not problems else "UNEXPECTED: " + "; ".join(problems)
        print(f"{row.pod:<20} runs on the real node: {verdict}", file=out)
    print("", file=out)
    return failures


async def free_capacity(api: KubeAPI, options: DemoOptions, watch: Sequence[Child],
                        scheduler: bool) -> int:
    """Raise the free CPUs of one NUMA zone (as when pods there finish), wait until the pod
    that waited for NUMA resources is placed, print its row and check it; returns 1 when it
    was not placed as expected, else 0."""
    node = workloads.FREED_NODE
    log.info("freeing NUMA capacity on %s (the kubelet's NRT exporter would report this)",
             node.name)
    await api.request("PATCH", f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}/{node.name}",
                      body=workloads.freed_capacity_patch(), content_type=MERGE_PATCH)
    name = workloads.WAITING_POD
    pods, events = await settle(api, {name}, 30.0, watch, scheduler, ("ungated",))
    pods = [p for p in pods if p["metadata"]["name"] == name]
    for pod in pods:
        if report.state_cell(pod) == "waiting":  # not re-decided within the bound
            log.error("%s still waits after the capacity was freed", name)
    out = options.out
    print(f"after {node.name} zone node-0 reported {workloads.FREED_CPU} free CPUs "
          "(NodeResourceTopology update):", file=out)
    print(report.render_table(report.build_rows(pods, events)) + "\n", file=out)
    failures = print_checks(out, [(name, "placed once a zone can hold it",
                                   workloads.AFTER_FREEING)], pods, events)
    print("", file=out)
    return failures


def registries_conf(pair: DemoRegistryPair) -> str:
    """containers-registries.conf(5) v2 text: the public registry is plain HTTP."""
    return f'[[registry]]\nlocation = "{pair.public.host}"\ninsecure = true\n'


async def generate_certs(work: Path) -> tuple[Path, bytes]:
    """``podplacement certs generate`` for ``localhost``/``127.0.0.1`` into ``work/certs``;
    returns the directory and the CA PEM.

    Raises:
        DemoError: the command failed.
    """
    cert_dir = work / "certs"
    proc = await asyncio.to_thread(
        subprocess.run,
        podplacement_args("certs", "generate", "--out", str(cert_dir), "--dns", "localhost",
                          "--ip", "127.0.0.1"),
        capture_output=True, text=True, cwd=WORKDIR, timeout=60, check=False,
    )
    if proc.returncode != 0:
        raise DemoError(f"podplacement certs generate failed: {proc.stderr.strip()}")
    return cert_dir, (cert_dir / "ca.crt").read_bytes()


def start_webhook(cert_dir: Path, kubeconfig: Path, log_dir: Path) -> tuple[Child, int]:
    """Start ``podplacement webhook`` (HTTPS on 127.0.0.1, serving chain from ``cert_dir``,
    the config watched through ``kubeconfig``); returns the process and its port."""
    port = free_port()
    webhook = start_child("webhook", podplacement_args(
        "webhook", "--host", "127.0.0.1", "--port", str(port), "--cert-dir", str(cert_dir),
        "--kubeconfig", str(kubeconfig), "--namespace", DEFAULT_NAMESPACE,
    ), log_dir)
    return webhook, port


async def wait_webhook_ready(webhook: Child, port: int, ca_pem: bytes,
                             watch: Sequence[Child] = ()) -> None:
    """Wait until the webhook's ``/readyz`` answers 200 over TLS verified with ``ca_pem``.

    Raises:
        DemoError: it (or one of ``watch``) exited, or it was not ready within 30 s.
    """
    ctx = ssl.create_default_context(cadata=ca_pem.decode())

    async def ready() -> bool:
        return await asyncio.to_thread(_https_ok, f"https://127.0.0.1:{port}/readyz", ctx)

    await wait_for("the webhook's /readyz", ready, 30.0, interval=0.2,
                   alive=[webhook, *watch])


def controller_args(work: Path, pair: DemoRegistryPair, kubeconfig: Path, cert_dir: Path,
                    webhook_port: int) -> tuple[list[str], dict[str, str], str]:
    """The ``podplacement controller`` command line, extra environment and metrics URL.

    The controller registers the webhook by URL with the CA of ``cert_dir``, reads a
    registries.conf marking the public registry as plain HTTP, trusts the private
    registry's CA (``--ca-file HOST=FILE``) and never stands down at its end (the demo's
    control plane goes with the demo).
    """
    conf = work / "registries.conf"
    conf.write_text(registries_conf(pair))
    ca_file = work / "private-registry-ca.crt"
    ca_file.write_bytes(pair.private_ca_pem)
    metrics_port = free_port()
    args = ["controller", "--kubeconfig", str(kubeconfig), "--namespace", DEFAULT_NAMESPACE,
            "--webhook-url", f"https://127.0.0.1:{webhook_port}/mutate",
            "--cert-dir", str(cert_dir), "--registries-conf", str(conf),
            "--standby-wait", "-1", "--ca-file", f"{pair.private.host}={ca_file}",
            "--metrics-port", str(metrics_port)]
    return podplacement_args(*args), {}, f"http://127.0.0.1:{metrics_port}/metrics"


async def wait_webhook_registered(api: KubeAPI, watch: Sequence[Child]) -> None:
    """Wait until the controller has created the MutatingWebhookConfiguration with a
    caBundle on every webhook.

    Raises:
        DemoError: a watched process exited or 30 s passed.
    """

    async def registered() -> bool:
        try:
            mwc = await api.request("GET", MWC_PATH)
        except ApiError:
            return False
        hooks = mwc.get("webhooks") or []
        return bool(hooks) and all((h.get("clientConfig") or {}).get("caBundle")
                                   for h in hooks)

    await wait_for(f"the MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION_NAME}",
                   registered, 30.0, interval=0.3, alive=watch)


async def explain_pod(work: Path, pair: DemoRegistryPair, kubeconfig: Path,
                      config: dict[str, Any], pod: dict[str, Any]) -> str:
    """``podplacement explain`` of ``pod`` against the cluster (nodes and NRTs read through
    ``kubeconfig``, the PodPlacementConfig ``config`` from a file), as a table; "" when it
    fails."""
    name = pod["metadata"]["name"]
    pod_file = work / f"explain-{name}.json"
    pod_file.write_text(json.dumps(pod))
    config_file = work / "podplacementconfig.json"
    config_file.write_text(json.dumps(config))
    args = podplacement_args("explain", str(pod_file), "--kubeconfig", str(kubeconfig),
                             "--config", str(config_file),
                             "--insecure-registry", pair.public.host, "--output", "table")
    try:
        proc = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True,
                                       cwd=WORKDIR, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("podplacement explain %s failed: %s", name, exc)
        return ""
    if proc.returncode != 0:
        log.warning("podplacement explain %s failed (exit %d): %s", name, proc.returncode,
                    proc.stderr.strip()[-500:])
        return ""
    return proc.stdout


async def scenario(options: DemoOptions, pair: DemoRegistryPair, server: ApiServer, work: Path,
                   children: list[Child]) -> int:
    """Everything after the registries and the API server are up; processes it starts are
    appended to ``children`` at once, so the caller stops them whatever happens."""
    log_dir = work / "logs"
    registries = pair.names
    api = await KubeAPI.from_kubeconfig(str(server.kubeconfig))
    try:
        await wait_for("the API server", lambda: _ok(api, "/version"), 30.0,
                       alive=[server.child] if server.child else [])
        if server.kind == "existing":
            if not await _ok(api, f"/apis/{API_VERSION}/{CONFIG_PLURAL}/{CONFIG_NAME}"):
                raise DemoError(
                    "the cluster has no PodPlacementConfig 'cluster': install podplacement "
                    "first (kubectl apply -k deploy/; kubectl create -f "
                    "deploy/samples/podplacementconfig.yaml)"
                )
            await install_namespace(api, registries)
            return await run_workloads(api, registries, server, options, [])

        await install_crds(api)
        config = workloads.placement_config(max_wait_seconds=options.max_wait_seconds)
        await install_cluster_objects(api, config, real_node=server.node is not None,
                                      real_arm64=server.arm64_node is not None)
        await install_namespace(api, registries)
        log.info("cluster objects applied (%d nodes, %d NodeResourceTopologies, config %s)",
                 len(workloads.NODES), len(workloads.nrt_objects()), CONFIG_NAME)

        cert_dir, ca_pem = await generate_certs(work)
        # side by side: the controller registers the webhook while it starts; no pod is
        # created before both are ready
        webhook, webhook_port = start_webhook(cert_dir, server.kubeconfig, log_dir)
        children.append(webhook)
        args, env, metrics_url = controller_args(work, pair, server.kubeconfig, cert_dir,
                                                 webhook_port)
        controller = start_child("controller", args, log_dir, env)
        children.append(controller)
        watch = [webhook, controller] + ([server.child] if server.child else [])
        await wait_webhook_ready(webhook, webhook_port, ca_pem, watch)
        await wait_webhook_registered(api, watch)
        log.info("webhook registered by the controller; creating the workloads")
        explain = functools.partial(explain_pod, work, pair, server.kubeconfig, config)
        return await run_workloads(api, registries, server, options, watch, metrics_url,
                                   explain)
    finally:
        await api.close()


def _http_text(url: str) -> str:
    """GET ``url`` and return the body as text ("" on any error)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bytes(resp.read()).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return ""


def _https_ok(url: str, ctx: ssl.SSLContext) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM, and SIGINT even when the parent started us with it ignored (Python
    then keeps it ignored: e.g. under a pytest-xdist worker), into KeyboardInterrupt while
    the demo runs, so its cleanup runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM during cleanup: a second Ctrl-C must not leave processes."""
    try:
        previous = {sig: signal.signal(sig, signal.SIG_IGN)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(options: DemoOptions) -> int:
    """Run the whole demo; returns the exit code (0: every workload as expected, 1: some
    not, 2: a step failed, 130: interrupted). Everything started is stopped before return.
    """
    started = time.monotonic()
    # the registry pushes would log every HTTP request
    logging.getLogger("httpx").setLevel(logging.WARNING)
    children: list[Child] = []
    pair: DemoRegistryPair | None = None
    server: ApiServer | None = None
    starting: concurrent.futures.Future[ApiServer] | None = None
    work: Path | None = None
    code = 2
    with _terminate_as_interrupt():
        try:
            assets = choose_api_server(options)
            work = Path(tempfile.mkdtemp(prefix="podplacement-demo-"))
            log.info("work directory %s", work)
            if options.kubeconfig is None:
                # the API server starts while the images are built and pushed
                pool = concurrent.futures.ThreadPoolExecutor(1, "api-server")
                starting = pool.submit(
                    start_real_cluster if assets is not None else start_localkube, work,
                    *((assets, options.debs) if assets is not None else (work / "logs",)))
                pool.shutdown(wait=False)
            busybox = prepare_busybox(options.debs, download=options.download)
            log.info("busybox binaries: %s", ", ".join(
                f"{arch} ({b.binary_size} bytes, {b.source})" for arch, b in busybox.items()))
            pair = start_registries(work)
            digests = push_images(pair, busybox)
            log.info("registries: public http://%s, private https://%s (basic auth); "
                     "%d tags pushed", pair.public.host, pair.private.host, len(digests))
            if starting is None:
                server = ApiServer(options.kubeconfig or Path(), "existing", scheduler=True,
                                   node_note="an existing cluster: its own nodes")
            else:
                server = starting.result()
                starting = None
            for real in server.real_nodes:
                for registry in (pair.public, pair.private):
                    real.trust_registry(registry)
            code = asyncio.run(scenario(options, pair, server, work, children))
        except KeyboardInterrupt:
            log.warning("interrupted; stopping everything")
            code = 130
        except (DemoError, DemoImageError, ApiError) as exc:
            log.error("demo failed: %s", exc)
            _log_tails(children, server)
            code = 2
        except Exception as exc:
            log.exception("demo failed: %s", exc)
            _log_tails(children, server)
            code = 2
        finally:
            with _signals_ignored():
                if starting is not None:  # interrupted or failed while it started
                    server = _started_anyway(starting)
                if work is not None:
                    _cleanup(options, work, children, server, pair)
    log.info("demo finished in %.1f s (exit code %d); %s", time.monotonic() - started, code,
             server.real_nodes_line() if server is not None else "real nodes: none")
    return code


def _started_anyway(starting: concurrent.futures.Future[ApiServer]) -> ApiServer | None:
    """The API server a background start produced (waited for: it is bounded by its own
    readiness limit), to be stopped; None when the start failed (it stopped what it had
    started)."""
    try:
        return starting.result()
    except Exception as exc:
        log.error("the API server did not start: %s", exc)
        return None


def _log_tails(children: Sequence[Child], server: ApiServer | None) -> None:
    """Show the end of every child's log (what failed is usually there)."""
    every = list(children) + ([server.child] if server is not None and server.child else [])
    for child in every:
        log.error("last lines of %s (%s):\n%s", child.name, child.log, child.tail(15))


def _cleanup(options: DemoOptions, work: Path, children: list[Child], server: ApiServer | None,
             pair: DemoRegistryPair | None) -> None:
    """Stop what was started, clients before servers: the controller, then the API server
    (it calls the webhook and holds keep-alive connections to it, which would make the
    webhook wait out its graceful-shutdown timeout), then the webhook, then the registries.
    Nothing is left running even if one stop fails."""
    if server is not None and server.kind == "existing" and not options.keep:
        with contextlib.suppress(Exception):
            asyncio.run(_delete_namespace(server.kubeconfig))
    server_stopped = False

    def stop_server() -> None:
        nonlocal server_stopped
        if server is None or server.stop is None or server_stopped:
            return
        server_stopped = True
        try:
            server.stop()
        except Exception as exc:  # keep stopping the others
            log.error("stopping the API server failed: %s", exc)

    for child in reversed(children):
        if child.name == "webhook":
            stop_server()
        try:
            child.stop()
        except Exception as exc:  # keep stopping the others
            log.error("stopping %s failed: %s", child.name, exc)
    stop_server()
    if pair is not None:
        pair.stop()
    if options.keep:
        log.info("work directory kept: %s", work)
    else:
        shutil.rmtree(work, ignore_errors=True)


async def _delete_namespace(kubeconfig: Path) -> None:
    """Delete the demo namespace (and so its pods and secret) if the demo made it."""
    api = await KubeAPI.from_kubeconfig(str(kubeconfig))
    path = f"/api/v1/namespaces/{workloads.DEMO_NAMESPACE}"
    try:
        if workloads.made_by_demo(await api.request("GET", path)):
            await api.request("DELETE", path)
            log.info("namespace %s deleted", workloads.DEMO_NAMESPACE)
    finally:
        await api.close()


__all__ = ["DemoError", "DemoOptions", "run_demo"]
