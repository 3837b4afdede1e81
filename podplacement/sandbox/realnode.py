"""One real amd64 node for the sandbox's control plane: kubelet v1.36.2 (``kubelet.xz`` of
``../shared/k8s-bin``, found like the control plane: :func:`podplacement.sandbox.controlplane.
locate_kubelet`), Debian's containerd 1.6 and runc, and our loopback-only CNI plugin and pause
image (:mod:`podplacement.sandbox.nodeparts`). Pods bound to it run real containers pulled
from the sandbox's registries; ``kubectl logs`` works.

:func:`find_runtime` says whether this machine can run one (one-line reason otherwise);
:func:`start_real_node` starts containerd (its root, state, socket, runc root, CNI and
registry host files all in a short temporary directory of the node's own; the logs in the
caller's directory), imports the pause image, makes the
node's own cgroup root in every hierarchy, gives the kubelet a client certificate
``CN=system:node:127.0.0.1, O=system:nodes`` from the plane's CA, starts it named
``127.0.0.1`` (a loopback address is refused as ``--node-ip``, but the node's name gives it
the InternalIP the API server reaches it by for logs and exec: nothing binds or routes off
loopback), waits until the node is Ready and lifts the ``not-ready`` taint (the plane's
controller-manager runs without the node-lifecycle controller, which would mark the fake
nodes unreachable). :meth:`RealNode.trust_registry` writes the ``hosts.toml`` of a registry
(plain HTTP, or TLS with its CA) at any time; containerd reads it at the next pull.
:meth:`RealNode.stop` ends the kubelet and containerd by pid and undoes every host effect
(:mod:`podplacement.sandbox.hostfx`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from podplacement import certs
from podplacement.sandbox import hostfx, nodeparts
from podplacement.sandbox.controlplane import AssetsNotFound, ControlPlane, locate_kubelet
from podplacement.sandbox.ports import free_port
from podplacement.sandbox.registry import Registry

__all__ = [
    "NODE_NAME",
    "NodeError",
    "NodeRuntime",
    "NodeUnavailable",
    "RealNode",
    "find_runtime",
    "start_real_node",
]

log = logging.getLogger("podplacement.sandbox")

#: The real node's name (and InternalIP): the kubelet's ``--hostname-override``.
NODE_NAME = "127.0.0.1"
#: Debian's packages (``hack/setup.sh`` installs them) and the reference loopback plugin.
CONTAINERD = "containerd"
CTR = "ctr"
RUNC = "runc"
LOOPBACK_PLUGIN = Path("/usr/lib/cni/loopback")
#: Seconds to wait for containerd's socket and for the node to be Ready.
CONTAINERD_READY_S = 30.0
NODE_READY_S = 60.0


class NodeUnavailable(Exception):
    """This machine can't run a real node; ``str(exc)`` is the one-line reason."""


class NodeError(RuntimeError):
    """The node did not start (the message names the log to read)."""


@dataclass(frozen=True)
class NodeRuntime:
    """The programs a real node runs (absolute paths)."""

    kubelet: Path
    containerd: Path
    ctr: Path
    runc: Path
    shim: Path
    loopback: Path


def _which(name: str) -> Path | None:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin")
    return Path(found) if found else None


def find_runtime() -> NodeRuntime:
    """The kubelet (:func:`~podplacement.sandbox.controlplane.locate_kubelet`), containerd,
    ctr, runc, the runc shim and the loopback CNI plugin, when this machine can run them:
    root, Linux, an amd64 machine.

    Raises:
        NodeUnavailable: something is missing (one line: what, and how to get it).
    """
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        raise NodeUnavailable("a real node needs an x86-64 Linux machine")
    if os.geteuid() != 0:
        raise NodeUnavailable("a real node needs root (the kubelet and containerd)")
    try:
        kubelet = locate_kubelet()
    except AssetsNotFound as exc:
        raise NodeUnavailable(str(exc)) from exc
    programs = {name: _which(name) for name in (CONTAINERD, CTR, RUNC, hostfx.SHIM)}
    missing = [n for n, p in programs.items() if p is None]
    if not LOOPBACK_PLUGIN.is_file():
        missing.append(str(LOOPBACK_PLUGIN))
    if missing:
        raise NodeUnavailable(
            f"no {', '.join(missing)}: install Debian's containerd, runc and "
            "containernetworking-plugins (hack/setup.sh does)")
    if not hostfx.cgroup_hierarchies():
        raise NodeUnavailable(f"no cgroup hierarchy mounted under {hostfx.CGROUP_FS}")
    p = {n: v for n, v in programs.items() if v is not None}
    return NodeRuntime(kubelet, p[CONTAINERD], p[CTR], p[RUNC], p[hostfx.SHIM], LOOPBACK_PLUGIN)


@dataclass
class RealNode:
    """A running real node.

    Attributes:
        name: the Node's name (:data:`NODE_NAME`).
        workdir: the caller's directory: ``containerd.log``, ``kubelet.log`` (kept).
        rundir: everything else of the node, in a short temporary directory of its own
            (unix socket paths must stay under 108 bytes, and the kubelet's and
            containerd's sockets live in there): ``containerd/`` (config, root, state,
            socket), ``kubelet/`` (config, root, certs), ``runc/``, ``cni/``, ``hosts/``
            (registry ``hosts.toml`` files), ``pod-logs/``. Removed by :meth:`stop`.
        footprint: where it acts on the host (:class:`podplacement.sandbox.hostfx.
            NodeFootprint`; its ``workdir`` is :attr:`rundir`).
        processes: ``{"containerd": Popen, "kubelet": Popen}``.
    """

    name: str
    workdir: Path
    rundir: Path
    plane: ControlPlane
    runtime: NodeRuntime
    footprint: hostfx.NodeFootprint
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def socket(self) -> str:
        """containerd's socket."""
        return self.footprint.socket

    @property
    def hosts_dir(self) -> Path:
        """containerd's registry ``config_path``."""
        return self.rundir / "hosts"

    def log_path(self, name: str) -> Path:
        """The log of ``containerd`` or ``kubelet``."""
        return self.workdir / f"{name}.log"

    def trust_registry(self, registry: Registry) -> None:
        """Let containerd pull from ``registry``: its ``hosts.toml`` (plain HTTP, or HTTPS
        trusting the registry's CA). Credentials are the pod's pull secrets, passed by the
        kubelet."""
        directory = self.hosts_dir / registry.host
        directory.mkdir(parents=True, exist_ok=True)
        ca_file = None
        if registry.ca_pem is not None:
            (directory / "ca.crt").write_bytes(registry.ca_pem)
            ca_file = str(directory / "ca.crt")
        tls = registry.url.startswith("https://")
        (directory / "hosts.toml").write_text(nodeparts.hosts_toml(registry.host, tls=tls,
                                                                   ca_file=ca_file))

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """The log of a pod's container through the API server (which asks this node's
        kubelet); "" when it can't be read."""
        params = {"container": container} if container else None
        with contextlib.suppress(httpx.HTTPError), self.plane.client(timeout=10.0) as c:
            r = c.get(f"/api/v1/namespaces/{namespace}/pods/{name}/log", params=params)
            if r.status_code == 200:
                return r.text
        return ""

    def describe(self) -> str:
        """``kubelet VERSION, RUNTIME VERSION`` from the Node's ``status.nodeInfo`` (e.g.
        ``kubelet v1.36.2, containerd 1.6.20~ds1``); "" when it can't be read."""
        with contextlib.suppress(httpx.HTTPError, ValueError), \
                self.plane.client(timeout=5.0) as c:
            info = (c.get(f"/api/v1/nodes/{self.name}").json().get("status") or {}).get(
                "nodeInfo") or {}
            runtime = str(info.get("containerRuntimeVersion") or "").replace("://", " ")
            return f"kubelet {info.get('kubeletVersion')}, {runtime}"
        return ""

    def ctr(self, *args: str, timeout: float = 60.0,
            connect_timeout: float = 2.0) -> subprocess.CompletedProcess[str]:
        """Run ``ctr --address SOCKET -n k8s.io ARGS`` (the CRI's namespace).

        Raises:
            subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds.
        """
        return subprocess.run([str(self.runtime.ctr), "--address", self.socket,
                               f"--connect-timeout={connect_timeout}s", "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)

    def _spawn(self, name: str, args: list[str]) -> None:
        out = open(self.log_path(name), "ab")  # closed by stop()
        self._logs.append(out)
        # runc, mount and the CNI plugins live in sbin directories
        env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin")
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.processes[name] = proc
        log.info("started %s (pid %d), log %s", name, proc.pid, self.log_path(name))

    def _stop_process(self, name: str, timeout: float = 10.0) -> None:
        proc = self.processes.get(name)
        if proc is None or proc.poll() is not None:
            return
        began = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) did not stop within %.0f s of SIGTERM; killing it",
                        name, proc.pid, timeout)
            proc.kill()
            proc.wait(5)
        log.info("stopped %s (pid %d, exit code %s, %.1f s)", name, proc.pid,
                 proc.returncode, time.monotonic() - began)

    def stop(self) -> list[str]:
        """Stop the kubelet, the containers (SIGKILL by pid, from the node's cgroups),
        containerd and its shims (by pid), unmount everything under :attr:`rundir`, remove
        the node's cgroups and :attr:`rundir`, delete the Node object (while the API server
        answers) and restore the machine-wide effects when no other node runs
        (:func:`podplacement.sandbox.hostfx.leave`). Idempotent.

        Returns: what could not be undone (one line each; empty when all was), also logged.
        """
        if self._stopped:
            return []
        self._stopped = True
        self._stop_process("kubelet")
        hostfx.kill_pids(hostfx.cgroup_pids(self.footprint.cgroup_root), "container process")
        self._stop_process("containerd")
        left = hostfx.clean_node(self.footprint)  # removes rundir once nothing is left
        left += hostfx.leave(self.footprint)
        for out in self._logs:
            out.close()
        self._logs.clear()
        with contextlib.suppress(httpx.HTTPError), self.plane.client(timeout=3.0) as c:
            c.delete(f"/api/v1/nodes/{self.name}")
        for line in left:
            log.warning("real node: not undone: %s", line)
        return left

    def wait_ready(self, limit: float = NODE_READY_S) -> dict[str, Any]:
        """Wait until the Node is Ready, then remove its ``not-ready`` taint (NoSchedule,
        added at registration by the TaintNodesByCondition admission plugin). Returns the
        Node.

        Raises:
            NodeError: a process exited, not Ready within ``limit`` seconds, or the taint
                could not be removed.
        """
        deadline = time.monotonic() + limit
        path = f"/api/v1/nodes/{self.name}"
        with self.plane.client(timeout=5.0) as c:
            while True:
                node: dict[str, Any] = {}
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    r = c.get(path)
                    node = r.json() if r.status_code == 200 else {}
                conditions = (node.get("status") or {}).get("conditions") or []
                if any(x.get("type") == "Ready" and x.get("status") == "True"
                       for x in conditions):
                    break
                dead = [n for n, p in self.processes.items() if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    why = f"{', '.join(dead)} exited" if dead else f"not Ready in {limit:.0f} s"
                    raise NodeError(f"real node {self.name}: {why}; see "
                                    f"{self.log_path('kubelet')} and "
                                    f"{self.log_path('containerd')}")
                time.sleep(0.2)
            taints = [t for t in (node.get("spec") or {}).get("taints") or []
                      if t.get("key") != "node.kubernetes.io/not-ready"]
            try:
                r = c.patch(path, json={"spec": {"taints": taints or None}},
                            headers={"Content-Type": "application/merge-patch+json"})
                r.raise_for_status()
            except httpx.HTTPError as exc:
                raise NodeError(f"real node {self.name}: its taints could not be lifted: "
                                f"{exc}") from exc
            ready: dict[str, Any] = r.json()
            return ready


def _wait_containerd(node: RealNode) -> None:
    deadline = time.monotonic() + CONTAINERD_READY_S
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            if (os.path.exists(node.socket)
                    and node.ctr("version", timeout=5, connect_timeout=1).returncode == 0):
                return
        proc = node.processes["containerd"]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise NodeError(f"containerd did not answer on {node.socket}; see "
                            f"{node.log_path('containerd')}")
        time.sleep(0.05)


def _kubelet_credentials(plane: ControlPlane, directory: Path) -> Path:
    """A kubeconfig for the kubelet: a client certificate ``CN=system:node:NODE_NAME,
    O=system:nodes`` (what the Node authorizer and NodeRestriction expect) from the
    plane's CA."""
    ca = certs.KeyPair((plane.workdir / "ca.crt").read_bytes(),
                       (plane.workdir / "ca.key").read_bytes())
    pair = certs.issue_client_cert(ca, f"system:node:{NODE_NAME}", ["system:nodes"])
    (directory / "client.crt").write_bytes(pair.cert_pem)
    (directory / "client.key").write_bytes(pair.key_pem)
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "sandbox", "cluster": {
            "server": plane.url, "certificate-authority": str(plane.ca_file)}}],
        "users": [{"name": "node", "user": {
            "client-certificate": str(directory / "client.crt"),
            "client-key": str(directory / "client.key")}}],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "node"}}],
        "current-context": "sandbox",
    }))
    return path


def start_real_node(plane: ControlPlane, workdir: Path, *,
                    registries: tuple[Registry, ...] = (),
                    runtime: NodeRuntime | None = None,
                    ready_limit: float = NODE_READY_S) -> RealNode:
    """Start the real node on ``plane`` (module docstring), its logs in ``workdir``
    (created), the rest in a short temporary directory (:attr:`RealNode.rundir`), trusting
    ``registries``; wait until it is Ready and untainted.

    Raises:
        NodeUnavailable: this machine can't run one (:func:`find_runtime`).
        NodeError: containerd or the kubelet did not start; what was started is stopped
            and undone first.
    """
    runtime = runtime or find_runtime()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix=hostfx.NODE_DIR_PREFIX))
    for sub in ("containerd", "kubelet/root", "kubelet/certs", "cni/bin", "cni/conf", "hosts",
                "pod-logs", "runc", "opt"):
        (rundir / sub).mkdir(parents=True, exist_ok=True)
    footprint = hostfx.NodeFootprint(str(rundir), f"/podplacement-{uuid.uuid4().hex[:10]}",
                                     str(rundir / "containerd" / "containerd.sock"))
    hostfx.enter(footprint)
    node = RealNode(NODE_NAME, workdir, rundir, plane, runtime, footprint)
    try:
        for registry in registries:
            node.trust_registry(registry)
        cni_bin = rundir / "cni" / "bin"
        (cni_bin / "loopback").symlink_to(runtime.loopback)
        plugin = cni_bin / nodeparts.CNI_PLUGIN
        plugin.write_text(nodeparts.cni_plugin_script(sys.executable, str(runtime.loopback)))
        plugin.chmod(0o755)
        (rundir / "cni" / "conf" / "10-podplacement.conflist").write_text(
            json.dumps(nodeparts.cni_conflist()))
        config = rundir / "containerd" / "config.toml"
        config.write_text(nodeparts.containerd_config(
            root=str(rundir / "containerd" / "root"),
            state=str(rundir / "containerd" / "state"), socket=footprint.socket,
            runc_root=str(rundir / "runc"), opt=str(rundir / "opt"), cni_bin=str(cni_bin),
            cni_conf=str(rundir / "cni" / "conf"), hosts_dir=str(node.hosts_dir)))
        node._spawn("containerd", [str(runtime.containerd), "--config", str(config)])
        _wait_containerd(node)
        archive = rundir / "containerd" / "pause.oci.tar"
        archive.write_bytes(nodeparts.pause_image_archive())
        imported = node.ctr("images", "import", "--platform", "linux/amd64", str(archive))
        if imported.returncode != 0:
            raise NodeError(f"ctr images import of the pause image: {imported.stderr.strip()}")
        hostfx.create_cgroups(footprint.cgroup_root)
        kubelet_dir = rundir / "kubelet"
        kubeconfig = _kubelet_credentials(plane, kubelet_dir / "certs")
        (kubelet_dir / "resolv.conf").write_text("")
        kubelet_config = kubelet_dir / "config.yaml"
        kubelet_config.write_text(yaml.safe_dump(nodeparts.kubelet_config(
            port=free_port(), healthz_port=free_port(), cgroup_root=footprint.cgroup_root,
            runtime_socket=footprint.socket, client_ca_file=str(plane.ca_file),
            pod_logs_dir=str(rundir / "pod-logs"),
            resolv_conf=str(kubelet_dir / "resolv.conf"))))
        node._spawn("kubelet", [
            str(runtime.kubelet), f"--config={kubelet_config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={kubelet_dir / 'root'}", f"--cert-dir={kubelet_dir / 'certs'}",
            f"--hostname-override={NODE_NAME}", "--v=2"])
        node.wait_ready(ready_limit)
    except BaseException:
        node.stop()
        raise
    return node
