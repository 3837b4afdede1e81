"""podplacement installed on a control plane the way a platform engineer installs it.

:func:`install_manifests` runs ``kubectl apply -k`` of ``deploy/`` (CRDs first, waited until
Established, then everything; the in-cluster Deployments are scaled to 0 because no kubelet
could run them), then creates the sample config once (:func:`create_sample_config`).
:func:`start_product` then runs ``podplacement webhook`` and ``podplacement controller`` as
local processes with the tokens of deploy/'s own ServiceAccounts (``kubectl create token``),
so the real authorizer enforces deploy/'s RBAC on every request they make; the API server
reaches the webhook by ``clientConfig.url`` on 127.0.0.1, registered by the controller with
the CA of a certificate made by ``podplacement certs generate``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from podplacement.sandbox.controlplane import ControlPlane, write_kubeconfig
from podplacement.sandbox.ports import free_port

#: deploy/'s namespace and ServiceAccounts (deploy/base/rbac/serviceaccounts.yaml).
NAMESPACE = "podplacement-system"
WEBHOOK_SA = "podplacement-webhook"
CONTROLLER_SA = "podplacement-controller"

_FORBIDDEN = re.compile(r"forbidden", re.IGNORECASE)  # ApiError text: "403 Forbidden: ..."


class InstallError(RuntimeError):
    """A step of the install failed; the message says which, with its output."""


def _kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise InstallError("kubectl is not on PATH")
    return found


def kubectl(plane: ControlPlane, *args: str, timeout: float = 120.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``kubectl ARGS`` with the plane's admin kubeconfig.

    Raises:
        InstallError: ``check`` and a non-zero exit (message: the command and its stderr).
    """
    env = dict(os.environ, KUBECONFIG=str(plane.kubeconfig))
    proc = subprocess.run([_kubectl(), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise InstallError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def install_manifests(plane: ControlPlane, deploy_dir: Path, *, config: bool = True) -> str:
    """Install as docs/guide/install.md says: ``kubectl apply -k deploy_dir/crds``, wait until
    every CRD there is Established, ``kubectl apply -k deploy_dir``; then, with ``config``,
    the one-time step of a first install, :func:`create_sample_config`. The in-cluster
    Deployments are scaled to 0 (no kubelet here could run them). Returns the apply output.

    Raises:
        InstallError: a kubectl step failed.
    """
    kubectl(plane, "apply", "--server-side", "-k", str(deploy_dir / "crds"))
    # -f of the directory reads its *.yaml files: the CRDs (the kustomization file is named
    # `Kustomization` so that it is not one of them)
    kubectl(plane, "wait", "--for", "condition=Established", "--timeout=60s",
            "-f", str(deploy_dir / "crds"))
    out = kubectl(plane, "apply", "--server-side", "-k", str(deploy_dir)).stdout
    kubectl(plane, "scale", "deployment", "--all", "--replicas=0", "-n", NAMESPACE)
    if config:
        create_sample_config(plane, deploy_dir)
    return out


def create_sample_config(plane: ControlPlane, deploy_dir: Path) -> bool:
    """``kubectl create -f deploy_dir/samples/podplacementconfig.yaml``: the PodPlacementConfig
    of a first install, outside the install manifests so that re-applying them never changes
    it. An existing config is kept as it is (``create`` never replaces it). Returns whether
    it was created.

    Raises:
        InstallError: kubectl failed for another reason than an existing config.
    """
    proc = kubectl(plane, "create", "-f", str(deploy_dir / "samples" / "podplacementconfig.yaml"),
                   check=False)
    if proc.returncode == 0:
        return True
    if "AlreadyExists" in proc.stderr or "already exists" in proc.stderr:
        return False
    raise InstallError(f"kubectl create -f samples/podplacementconfig.yaml: "
                       f"{proc.stderr.strip()}")


def service_account_kubeconfig(plane: ControlPlane, name: str, path: Path,
                               namespace: str = NAMESPACE) -> Path:
    """A kubeconfig at ``path`` authenticating as ServiceAccount ``namespace/name`` with a
    token from ``kubectl create token`` (TokenRequest API, 24 h).

    Raises:
        InstallError: the token request failed.
    """
    token = kubectl(plane, "create", "token", name, "-n", namespace,
                    "--duration=24h").stdout.strip()
    return write_kubeconfig(path, plane.url, plane.ca_file, token, user=name)


@dataclass
class Process:
    """A child process of the product with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        """True while it runs."""
        return self.popen.poll() is None

    def log(self) -> str:
        """Its whole log so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        """Send ``sig`` to its pid (SIGTERM: graceful), SIGKILL after ``timeout`` s."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


def start_process(name: str, args: Sequence[str], workdir: Path,
                  env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Process:
    """Start ``python -m podplacement ARGS`` with output to ``workdir/NAME.log``; ``env`` is
    added to this process's environment, ``cwd`` is its working directory (``python -m``
    imports from there first; default: this process's)."""
    log_path = workdir / f"{name}.log"
    log = open(log_path, "ab")  # closed by Process.stop
    popen = subprocess.Popen([sys.executable, "-m", "podplacement", "--log-format", "text",
                              *args], stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, **(env or {})}, cwd=cwd)
    return Process(name, popen, log_path, log)


@dataclass
class Product:
    """The webhook and the controller running against a control plane.

    Attributes:
        webhook / controllers: the processes (several controllers: leader election).
        webhook_port: HTTPS port of the webhook on 127.0.0.1.
        cert_dir: ``ca.crt``, ``tls.crt``, ``tls.key`` of the webhook.
        kubeconfigs: ``{"webhook": path, "controller": path}`` (ServiceAccount tokens).
        env / cwd: the processes' extra environment and working directory (another
            release's source tree: ``{"PYTHONPATH": tree}`` and the tree).
    """

    plane: ControlPlane
    workdir: Path
    webhook: Process
    webhook_port: int
    cert_dir: Path
    kubeconfigs: dict[str, Path]
    controller_args: list[str]
    controllers: list[Process] = field(default_factory=list)
    webhook_args: list[str] = field(default_factory=list)
    webhook_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None

    def restart_webhook(self, ready_limit: float = 60.0) -> Process:
        """Start the webhook again (same port, certificates and arguments) after it was
        stopped, and wait until it answers ``/readyz``; it replaces :attr:`webhook`.

        Raises:
            InstallError: it did not become ready within ``ready_limit`` seconds.
        """
        self.webhook.stop()
        self.webhook_restarts += 1
        self.webhook = start_process(f"webhook-{self.webhook_restarts}", self.webhook_args,
                                     self.workdir, self.env, self.cwd)
        _webhook_ready(self.webhook_port, self.cert_dir / "ca.crt", ready_limit, self.webhook)
        return self.webhook

    def start_controller(self, identity: str | None = None) -> Process:
        """Start one more controller process (leader election decides who acts)."""
        n = len(self.controllers)
        ident = identity or f"sandbox-controller-{n}"
        proc = start_process(f"controller-{n}", [*self.controller_args, "--identity", ident],
                             self.workdir, self.env, self.cwd)
        self.controllers.append(proc)
        return proc

    def forbidden(self) -> list[str]:
        """Log lines of every process that mention 403 / forbidden (RBAC denials)."""
        lines = []
        for proc in [self.webhook, *self.controllers]:
            lines += [f"{proc.name}: {line}" for line in proc.log().splitlines()
                      if _FORBIDDEN.search(line)]
        return lines

    def stop(self) -> None:
        """Stop the controllers (gracefully), then the webhook."""
        for proc in self.controllers:
            proc.stop()
        self.webhook.stop()


def _webhook_ready(port: int, ca_file: Path, limit: float, proc: Process) -> None:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    deadline = time.monotonic() + limit
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx,
                                        timeout=2) as r:
                if r.status == 200:
                    return
        if not proc.alive() or time.monotonic() > deadline:
            raise InstallError(f"the webhook did not become ready:\n{proc.log()[-3000:]}")
        time.sleep(0.2)


def start_product(
    plane: ControlPlane,
    workdir: Path,
    *,
    controller_options: Sequence[str] = (),
    webhook_options: Sequence[str] = (),
    controllers: int = 1,
    admin: bool = False,
    ready_limit: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    wait_registered: bool = True,
) -> Product:
    """Start the webhook and ``controllers`` controller processes as deploy/'s
    ServiceAccounts (``admin``: with the admin token instead, for a plane without deploy/'s
    RBAC) and wait until the webhook answers ``/readyz`` and (``wait_registered``) the
    controller has registered the MutatingWebhookConfiguration with a caBundle; without it,
    e.g. while another release's controller still leads, :func:`wait_webhook_registered`
    waits later. ``env`` and ``cwd`` run every process (``certs generate`` included) with
    that environment added and in that directory: another release's source tree.

    ``controller_options`` are added to ``podplacement controller`` (e.g.
    ``--insecure-registry HOST``, ``--ca-file HOST=FILE``), ``webhook_options`` to
    ``podplacement webhook`` (e.g. ``--controller-unavailable-after 5``).

    Raises:
        InstallError: a process exited or was not ready within ``ready_limit`` seconds.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    cert_dir = workdir / "certs"
    proc = subprocess.run([sys.executable, "-m", "podplacement", "certs", "generate", "--out",
                           str(cert_dir), "--dns", "localhost", "--ip", "127.0.0.1"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    if proc.returncode != 0:
        raise InstallError(f"podplacement certs generate: {proc.stderr.strip()}")
    if admin:
        kubeconfigs = {"webhook": plane.kubeconfig, "controller": plane.kubeconfig}
    else:
        kubeconfigs = {
            "webhook": service_account_kubeconfig(plane, WEBHOOK_SA,
                                                  workdir / "webhook.kubeconfig"),
            "controller": service_account_kubeconfig(plane, CONTROLLER_SA,
                                                     workdir / "controller.kubeconfig"),
        }
    port = free_port()
    webhook_args = [
        "webhook", "--host", "127.0.0.1", "--port", str(port), "--cert-dir", str(cert_dir),
        "--kubeconfig", str(kubeconfigs["webhook"]), "--namespace", NAMESPACE,
        *webhook_options]
    webhook = start_process("webhook", webhook_args, workdir, env, cwd)
    controller_args = [
        "controller", "--kubeconfig", str(kubeconfigs["controller"]), "--namespace", NAMESPACE,
        "--webhook-url", f"https://127.0.0.1:{port}/mutate", "--cert-dir", str(cert_dir),
        "--metrics-port", "-1", "--lease-duration", "5", *controller_options]
    product = Product(plane, workdir, webhook, port, cert_dir, kubeconfigs, controller_args,
                      webhook_args=webhook_args, env=dict(env or {}), cwd=cwd)
    try:
        _webhook_ready(port, cert_dir / "ca.crt", ready_limit, webhook)
        for _ in range(controllers):
            product.start_controller()
        if wait_registered:
            wait_webhook_registered(product, ready_limit)
    except BaseException:
        product.stop()
        raise
    return product


def wait_webhook_registered(product: Product, limit: float = 60.0) -> dict[str, Any]:
    """Wait until the MutatingWebhookConfiguration calls *this* product's webhook (its URL,
    with a caBundle; one left by an earlier install points elsewhere until the new leader
    updates it) and a dry-run pod in ``default`` comes back gated (the webhook has the
    config and the API server trusts its certificate); returns the configuration.

    Raises:
        InstallError: every controller exited, or ``limit`` seconds passed.
    """
    from podplacement.rules.config import SCHEDULING_GATE, WEBHOOK_CONFIGURATION_NAME

    path = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
            + WEBHOOK_CONFIGURATION_NAME)
    url = f"https://127.0.0.1:{product.webhook_port}/mutate"
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-"},
             "spec": {"containers": [{"name": "c", "image": "probe.invalid/probe:1"}]}}
    deadline = time.monotonic() + limit
    with product.plane.client() as c:
        while True:
            r = c.get(path)
            if r.status_code == 200:
                mwc: dict[str, Any] = r.json()
                hooks = mwc.get("webhooks") or []
                ours = hooks and all((h.get("clientConfig") or {}).get("url") == url
                                     and (h.get("clientConfig") or {}).get("caBundle")
                                     for h in hooks)
                if ours:
                    created = c.post("/api/v1/namespaces/default/pods",
                                     params={"dryRun": "All"}, json=probe)
                    gates = (created.json().get("spec") or {}).get("schedulingGates") or [] \
                        if created.status_code == 201 else []
                    if any(g.get("name") == SCHEDULING_GATE for g in gates):
                        return mwc
            if not any(p.alive() for p in product.controllers) or time.monotonic() > deadline:
                logs = "\n".join(p.log()[-2000:] for p in product.controllers)
                raise InstallError(
                    f"{WEBHOOK_CONFIGURATION_NAME} does not gate through {url}:\n{logs}")
            time.sleep(0.2)


def placement_config(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The PodPlacementConfig ``cluster`` with ``spec`` (default: empty, the defaults)."""
    return {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
            "metadata": {"name": "cluster"}, "spec": dict(spec or {})}


def dump_yaml(objs: Sequence[Mapping[str, Any]]) -> str:
    """YAML stream of ``objs`` (for kubectl apply -f -)."""
    return yaml.safe_dump_all([dict(o) for o in objs])
