"""Kubernetes API environments for tests: localkube, or a real control plane.

:class:`KubeEnv` is what tests get from the ``kube`` / ``localkube`` / ``real_kube`` fixtures:
the server URL, a kubeconfig file, and small synchronous helpers for raw JSON requests.
:func:`start_real_control_plane` starts etcd + kube-apiserver (+ kube-scheduler when present)
from ``$KUBEBUILDER_ASSETS`` (the envtest convention) on 127.0.0.1 with generated certificates
and a static admin token.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import httpx
import yaml

import certs
from localkube import LocalKube

REPO = Path(__file__).resolve().parents[2]
CRD_FILES = sorted((REPO / "deploy" / "crds").glob("*.yaml")) + sorted(
    (REPO / "deploy" / "optional").glob("*crd*.yaml")
)

PATCH_TYPES = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


@dataclass
class KubeEnv:
    """A running Kubernetes API for a test.

    Attributes:
        url: base URL (``http://127.0.0.1:N`` for localkube, ``https://...`` for real).
        kubeconfig: path of a kubeconfig file for kubectl / the kubernetes client.
        kind: ``"localkube"`` or ``"real"``.
        server: the :class:`LocalKube` (None for a real control plane).
        token: bearer token (real control plane), ``ca_file``: CA bundle for TLS verification.
    """

    url: str
    kubeconfig: Path
    kind: Literal["localkube", "real"]
    server: LocalKube | None = None
    token: str | None = None
    ca_file: Path | None = None
    _client: httpx.Client | None = field(default=None, repr=False)

    @property
    def client(self) -> httpx.Client:
        """A shared synchronous httpx client for this server."""
        if self._client is None:
            headers = {"Accept": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            verify: Any = str(self.ca_file) if self.ca_file else True
            self._client = httpx.Client(base_url=self.url, headers=headers, verify=verify,
                                        timeout=30.0)
        return self._client

    def close(self) -> None:
        """Close the shared client."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        content_type: str | None = None,
        params: dict[str, Any] | None = None,
        content: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Send a raw request; ``json`` is serialised with ``content_type`` (default
        ``application/json``; ``json``/``merge``/``strategic``/``apply`` are shorthands)."""
        hdrs = dict(headers or {})
        body: bytes | str | None = content
        if json is not None:
            import orjson

            body = orjson.dumps(json)
            hdrs.setdefault("Content-Type", "application/json")
        if content_type:
            hdrs["Content-Type"] = PATCH_TYPES.get(content_type, content_type)
        kwargs: dict[str, Any] = {}
        if timeout is not None:
            kwargs["timeout"] = timeout
        return self.client.request(method, path, content=body, params=params, headers=hdrs,
                                   **kwargs)

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """POST ``obj`` to the collection ``path``; returns the stored object.

        Raises: httpx.HTTPStatusError for a non-2xx answer.
        """
        r = self.request("POST", path, json=obj)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def get(self, path: str) -> dict[str, Any]:
        """GET ``path`` as JSON. Raises: httpx.HTTPStatusError for a non-2xx answer."""
        r = self.request("GET", path)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def patch(self, path: str, body: Any, patch_type: str = "merge") -> dict[str, Any]:
        """PATCH ``path`` (``patch_type``: json, merge, strategic, apply). Raises on non-2xx."""
        r = self.request("PATCH", path, json=body, content_type=patch_type)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def delete(self, path: str) -> httpx.Response:
        """DELETE ``path`` (any status is returned, not raised)."""
        return self.request("DELETE", path)

    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Create namespace ``name`` (with ``labels``) unless it exists; returns it."""
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}}}
        r = self.request("POST", "/api/v1/namespaces", json=body)
        if r.status_code == 409:
            return self.get(f"/api/v1/namespaces/{name}")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def apply_crds(self, files: list[Path] | None = None) -> None:
        """Create the CRDs of ``files`` (default: the project's) unless they exist."""
        for path in files or CRD_FILES:
            for doc in yaml.safe_load_all(path.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    r = self.request("POST",
                                     "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                     json=doc)
                    if r.status_code not in (201, 409):
                        r.raise_for_status()


def start_localkube(tmp: Path, **options: Any) -> tuple[LocalKube, KubeEnv]:
    """Start a localkube with the project's CRDs and a kubeconfig in ``tmp``."""
    server = LocalKube(CRD_FILES, **options).start()
    kubeconfig = server.write_kubeconfig(tmp / "kubeconfig")
    return server, KubeEnv(url=server.url, kubeconfig=kubeconfig, kind="localkube",
                           server=server)


# --- real control plane --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RealControlPlane:
    """Processes of a real control plane started from ``KUBEBUILDER_ASSETS``."""

    env: KubeEnv
    processes: list[subprocess.Popen[bytes]]
    workdir: Path
    log: IO[bytes] | None = None

    def stop(self) -> None:
        """Terminate the processes (newest first) and wait for them."""
        self.env.close()
        for p in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in reversed(self.processes):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.log is not None:
            self.log.close()


def start_real_control_plane(assets: Path, workdir: Path) -> RealControlPlane:
    """Start etcd, kube-apiserver and (if present) kube-scheduler on 127.0.0.1.

    Raises:
        RuntimeError: a binary is missing or the API server does not become ready in 60 s.
    """
    etcd_bin, api_bin = assets / "etcd", assets / "kube-apiserver"
    if not etcd_bin.exists() or not api_bin.exists():
        raise RuntimeError(f"etcd/kube-apiserver not found in {assets}")
    workdir.mkdir(parents=True, exist_ok=True)
    ca = certs.generate_ca("localkube-test-ca")
    serving = certs.issue_serving_cert(ca, ["localhost", "kubernetes"], ["127.0.0.1"])
    sa_key = certs.new_private_key("rsa")
    from cryptography.hazmat.primitives import serialization

    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    (workdir / "serving.crt").write_bytes(serving.cert_pem)
    (workdir / "serving.key").write_bytes(serving.key_pem)
    (workdir / "sa.key").write_bytes(sa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (workdir / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    token = os.urandom(16).hex()
    (workdir / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
    etcd_client, etcd_peer, api_port = _free_port(), _free_port(), _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    log = open(workdir / "control-plane.log", "wb")  # closed by RealControlPlane.stop
    procs.append(subprocess.Popen([
        str(etcd_bin), "--data-dir", str(workdir / "etcd"),
        "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
        "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
        "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--unsafe-no-fsync",
    ], stdout=log, stderr=subprocess.STDOUT))
    procs.append(subprocess.Popen([
        str(api_bin), f"--secure-port={api_port}", "--bind-address=127.0.0.1",
        f"--etcd-servers=http://127.0.0.1:{etcd_client}",
        f"--cert-dir={workdir}", f"--tls-cert-file={workdir / 'serving.crt'}",
        f"--tls-private-key-file={workdir / 'serving.key'}",
        f"--client-ca-file={workdir / 'ca.crt'}",
        f"--token-auth-file={workdir / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={workdir / 'sa.pub'}",
        f"--service-account-signing-key-file={workdir / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/12", "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
    ], stdout=log, stderr=subprocess.STDOUT))
    url = f"https://127.0.0.1:{api_port}"
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "real", "cluster": {
            "server": url, "certificate-authority": str(workdir / "ca.crt")}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "admin"}}],
        "current-context": "real",
    }))
    env = KubeEnv(url=url, kubeconfig=kubeconfig, kind="real", token=token,
                  ca_file=workdir / "ca.crt")
    plane = RealControlPlane(env, procs, workdir, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if env.request("GET", "/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            plane.stop()
            raise RuntimeError(f"kube-apiserver did not become ready; see {workdir}")
        time.sleep(0.5)
    sched = assets / "kube-scheduler"
    if sched.exists() and shutil.which(str(sched)):
        procs.append(subprocess.Popen([
            str(sched), f"--kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={_free_port()}", "--leader-elect=false",
        ], stdout=log, stderr=subprocess.STDOUT))
    return plane
