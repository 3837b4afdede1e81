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
from podplacement.sandbox import binfmtns, emulated, hostfx, nodeparts
from podplacement.sandbox.controlplane import AssetsNotFound, ControlPlane, locate_kubelet
from podplacement.sandbox.ports import free_port
from podplacement.sandbox.registry import Registry

__all__ = [
    "ARM64_NODE_LABELS",
    "ARM64_NODE_NAME",
    "NODE_NAME",
    "NodeError",
    "NodeRuntime",
    "NodeUnavailable",
    "RealNode",
    "find_arm64_root",
    "find_runtime",
    "start_real_node",
]

log = logging.getLogger("podplacement.sandbox")

#: The real node's name (and InternalIP): the kubelet's ``--hostname-override``.
NODE_NAME = "127.0.0.1"
#: The emulated arm64 node's name and InternalIP (another loopback address: its kubelet
#: binds there, beside the amd64 node's).
ARM64_NODE_NAME = "127.0.0.2"
#: The labels the arm64 node's kubelet registers with (``--node-labels``: the kubelet
#: v1.36.2 writes them over the ones of its own build, ``kubernetes.io/arch=amd64``).
ARM64_NODE_LABELS = {"kubernetes.io/arch": "arm64", "beta.kubernetes.io/arch": "arm64"}
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
        arch: ``amd64``, or ``arm64`` for the emulated node (:func:`start_real_node`).
        helpers: the emulated node's ``binfmtns`` holder and ``execguard``
            (:mod:`podplacement.sandbox.binfmtns`, :mod:`podplacement.sandbox.execguard`).
    """

    name: str
    workdir: Path
    rundir: Path
    plane: ControlPlane
    runtime: NodeRuntime
    footprint: hostfx.NodeFootprint
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    arch: str = "amd64"
    helpers: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
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
        if self.arch != "amd64" and name == "containerd":
            holder = self.helpers["binfmtns"].pid
            args = ["nsenter", f"--user=/proc/{holder}/ns/user",
                    f"--mount=/proc/{holder}/ns/mnt", "--", *args]
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
        for name, helper in self.helpers.items():
            if helper.poll() is None:
                helper.terminate()
                try:
                    helper.wait(5)
                except subprocess.TimeoutExpired:
                    helper.kill()
                    helper.wait(5)
                log.info("stopped %s (pid %d)", name, helper.pid)
        left = hostfx.clean_node(self.footprint)  # removes rundir once nothing is left
        left += hostfx.leave(self.footprint)
        for out in self._logs:
            out.close()
        self._logs.clear()
        with contextlib.suppress(httpx.HTTPError), self.plane.client(timeout=3.0) as c:
            c.delete(f"/api/v1/nodes/{self.name}")
            if self.arch != "amd64":
                c.delete(f"{_MAP_BINDING_PATH}/{ARCH_POLICY}")
                c.delete(f"{_MAP_PATH}/{ARCH_POLICY}")
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


def _kubelet_credentials(plane: ControlPlane, directory: Path, name: str = NODE_NAME) -> Path:
    """A kubeconfig for the kubelet: a client certificate ``CN=system:node:NAME,
    O=system:nodes`` (what the Node authorizer and NodeRestriction expect) from the
    plane's CA."""
    ca = certs.KeyPair((plane.workdir / "ca.crt").read_bytes(),
                       (plane.workdir / "ca.key").read_bytes())
    pair = certs.issue_client_cert(ca, f"system:node:{name}", ["system:nodes"])
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


def find_arm64_root(debs: Path | None) -> emulated.EmulatedRoot:
    """What the emulated arm64 node needs beyond :func:`find_runtime`: Linux 6.7 or newer
    (a ``binfmt_misc`` of the node's own user namespace), ``nsenter``, and Debian's
    packages of :data:`podplacement.sandbox.emulated.ARM64_PACKAGES` in ``debs``, extracted
    into the cache beside the binaries' (:func:`podplacement.sandbox.emulated.
    prepare_root`).

    Raises:
        NodeUnavailable: one of them is missing (one line: what, and how to get it).
    """
    if not emulated.kernel_supports_binfmt_namespaces():
        raise NodeUnavailable(f"an arm64 node needs Linux 6.7 or newer (a binfmt_misc per "
                              f"user namespace); this is {os.uname().release}")
    if _which("nsenter") is None:
        raise NodeUnavailable("no nsenter (util-linux) for the arm64 node")
    if debs is None:
        raise NodeUnavailable("no directory of the arm64 node's .deb files: run "
                              "hack/fetch-debs.sh")
    try:
        return emulated.prepare_root(emulated.find_debs(debs), hostfx.ledger_dir())
    except emulated.EmulationUnavailable as exc:
        raise NodeUnavailable(str(exc)) from exc


#: The emulated node's kubelet settings beyond the amd64 node's: no default seccomp profile
#: (qemu-user refuses ``prctl(PR_SET_SECCOMP)``, so its containerd answers "seccomp is not
#: supported" to any profile but Unconfined; the exec guard's own filter is added by runc).
_EMULATED_KUBELET: dict[str, Any] = {"seccompDefault": False}
#: The MutatingAdmissionPolicy (and its binding) that keeps the arm64 node's architecture
#: ``arm64`` (:func:`_arch_policy`).
ARCH_POLICY = "podplacement-sandbox-arm64-node"
_MAP_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
_MAP_BINDING_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"


def _arch_policy(name: str, arch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A MutatingAdmissionPolicy and its binding (``admissionregistration.k8s.io/v1``, GA
    in v1.36) that set, on every create and update of Node ``name`` (and of its status),
    the label ``kubernetes.io/arch`` (and ``beta.kubernetes.io/arch``) and
    ``status.nodeInfo.architecture`` to ``arch``. Needed because the kubelet v1.36.2 puts
    back its own build's ``kubernetes.io/arch`` at each status update, whatever
    ``--node-labels`` said (observed: the label read ``arm64`` after a patch, ``amd64``
    10 s later)."""
    labels = ", ".join(f'"{k}": "{v}"' for k, v in ARM64_NODE_LABELS.items()) \
        if arch == "arm64" else f'"kubernetes.io/arch": "{arch}"'
    expression = ("Object{metadata: Object.metadata{labels: {" + labels + "}}, "
                  "status: Object.status{nodeInfo: Object.status.nodeInfo{architecture: "
                  f'"{arch}"}}}}}}')
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": ARCH_POLICY},
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["nodes", "nodes/status"]}]},
            "matchConditions": [{"name": "the-emulated-node",
                                 "expression": f'object.metadata.name == "{name}"'}],
            "failurePolicy": "Fail", "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "ApplyConfiguration",
                           "applyConfiguration": {"expression": expression}}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": ARCH_POLICY},
        "spec": {"policyName": ARCH_POLICY},
    }
    return policy, binding


def _install_arch_policy(plane: ControlPlane, name: str, arch: str) -> None:
    """Create (or replace) :func:`_arch_policy` on ``plane``.

    Raises:
        NodeError: the API server refused it.
    """
    policy, binding = _arch_policy(name, arch)
    with plane.client(timeout=10.0) as c:
        for path, doc in ((_MAP_PATH, policy), (_MAP_BINDING_PATH, binding)):
            c.delete(f"{path}/{ARCH_POLICY}")
            r = c.post(path, json=doc)
            if r.status_code >= 300:
                raise NodeError(f"the {doc['kind']} {ARCH_POLICY} was refused: "
                                f"{r.status_code} {r.text[:300]}")


def _start_emulation(node: RealNode, root: emulated.EmulatedRoot) -> str:
    """Start the arm64 node's ``binfmtns`` holder and exec guard; write the runc wrapper.
    Returns the wrapper's path."""
    holder = binfmtns.start_holder(node.rundir / "binfmt", root.binfmt_interpreter,
                                   libroot=root.root,
                                   log=node.log_path("binfmtns"))
    node.helpers["binfmtns"] = holder
    socket_path = node.rundir / "execguard.sock"
    out = open(node.log_path("execguard"), "ab")
    node._logs.append(out)
    guard = subprocess.Popen([sys.executable, "-m", "podplacement.sandbox.execguard",
                              str(socket_path)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=out, text=True,
                             start_new_session=True)
    node.helpers["execguard"] = guard
    if binfmtns.read_word(guard) != "ready":
        raise NodeError(f"the exec guard did not start; see {node.log_path('execguard')}")
    relay = subprocess.Popen([sys.executable, "-m", "podplacement.sandbox.criproxy",
                              str(node.rundir / "cri.sock"), node.footprint.socket],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out,
                             text=True, start_new_session=True)
    node.helpers["criproxy"] = relay
    if binfmtns.read_word(relay) != "ready":
        raise NodeError(f"the CRI relay did not start; see {node.log_path('execguard')}")
    wrapper = node.rundir / "runc-wrapper"
    wrapper.write_text(emulated.runc_wrapper_script(sys.executable, str(node.runtime.runc),
                                                    str(socket_path)))
    wrapper.chmod(0o755)
    return str(wrapper)


def start_real_node(plane: ControlPlane, workdir: Path, *,
                    registries: tuple[Registry, ...] = (),
                    runtime: NodeRuntime | None = None,
                    ready_limit: float = NODE_READY_S,
                    arch: str = "amd64", debs: Path | None = None) -> RealNode:
    """Start the real node on ``plane`` (module docstring), its logs in ``workdir``
    (created), the rest in a short temporary directory (:attr:`RealNode.rundir`), trusting
    ``registries``; wait until it is Ready and untainted.

    With ``arch="arm64"`` the node is the emulated arm64 one (named
    :data:`ARM64_NODE_NAME`, labelled :data:`ARM64_NODE_LABELS`): Debian's arm64
    containerd (the packages in ``debs``, :func:`find_arm64_root`) runs under qemu-user in
    a user namespace whose own ``binfmt_misc`` runs arm64 programs
    (:mod:`podplacement.sandbox.binfmtns`), with the host's runc and shim (they run in that
    namespace too, so do the containers), an arm64 pause image, and every container's
    ``execve`` checked by the exec guard (:mod:`podplacement.sandbox.execguard`: x86
    programs fail with ``exec format error`` as on an arm64 machine). Both nodes may run
    at once.

    Raises:
        NodeUnavailable: this machine can't run one (:func:`find_runtime`,
            :func:`find_arm64_root`).
        NodeError: containerd or the kubelet did not start; what was started is stopped
            and undone first.
        ValueError: ``arch`` is neither ``amd64`` nor ``arm64``.
    """
    if arch not in ("amd64", "arm64"):
        raise ValueError(f"no real node of architecture {arch!r}")
    runtime = runtime or find_runtime()
    root = find_arm64_root(debs) if arch == "arm64" else None
    name = ARM64_NODE_NAME if arch == "arm64" else NODE_NAME
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix=hostfx.NODE_DIR_PREFIX))
    for sub in ("containerd", "kubelet/root", "kubelet/certs", "cni/bin", "cni/conf", "hosts",
                "pod-logs", "runc", "opt"):
        (rundir / sub).mkdir(parents=True, exist_ok=True)
    footprint = hostfx.NodeFootprint(str(rundir), f"/podplacement-{uuid.uuid4().hex[:10]}",
                                     str(rundir / "containerd" / "containerd.sock"))
    hostfx.enter(footprint)
    node = RealNode(name, workdir, rundir, plane, runtime, footprint, arch=arch)
    try:
        runc_binary = None
        if root is not None:
            _install_arch_policy(plane, name, arch)
            runc_binary = _start_emulation(node, root)
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
            cni_conf=str(rundir / "cni" / "conf"), hosts_dir=str(node.hosts_dir),
            runc_binary=runc_binary))
        containerd = root.containerd if root is not None else runtime.containerd
        node._spawn("containerd", [str(containerd), "--config", str(config)])
        _wait_containerd(node)
        archive = rundir / "containerd" / "pause.oci.tar"
        archive.write_bytes(nodeparts.pause_image_archive(arch=arch))
        imported = node.ctr("images", "import", "--platform", f"linux/{arch}", str(archive))
        if imported.returncode != 0:
            raise NodeError(f"ctr images import of the pause image: {imported.stderr.strip()}")
        hostfx.create_cgroups(footprint.cgroup_root)
        kubelet_dir = rundir / "kubelet"
        kubeconfig = _kubelet_credentials(plane, kubelet_dir / "certs", name)
        (kubelet_dir / "resolv.conf").write_text("")
        kubelet_config = kubelet_dir / "config.yaml"
        kubelet_config.write_text(yaml.safe_dump(nodeparts.kubelet_config(
            port=free_port(), healthz_port=free_port(), cgroup_root=footprint.cgroup_root,
            runtime_socket=str(rundir / "cri.sock") if root is not None else footprint.socket,
            client_ca_file=str(plane.ca_file), pod_logs_dir=str(rundir / "pod-logs"),
            resolv_conf=str(kubelet_dir / "resolv.conf"),
            extra=_EMULATED_KUBELET | {"address": name, "healthzBindAddress": name}
            if arch != "amd64" else None)))
        labels = ([f"--node-labels={','.join(f'{k}={v}' for k, v in ARM64_NODE_LABELS.items())}"]
                  if arch == "arm64" else [])
        node._spawn("kubelet", [
            str(runtime.kubelet), f"--config={kubelet_config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={kubelet_dir / 'root'}", f"--cert-dir={kubelet_dir / 'certs'}",
            f"--hostname-override={name}", *labels, "--v=2"])
        node.wait_ready(ready_limit)
    except BaseException:
        node.stop()
        raise
    return node
