"""Kubernetes API environments for tests: localkube, or a real control plane.

:class:`KubeEnv` is what tests get from the ``kube`` / ``localkube`` / ``real_kube`` fixtures:
the server URL, a kubeconfig file, and small synchronous helpers for raw JSON requests.
:func:`start_real` starts the real control plane of :mod:`podplacement.sandbox.controlplane`
(found by itself: ``$KUBEBUILDER_ASSETS``, else ``../shared/k8s-bin`` plus Debian's etcd) with
the project's CRDs and fake Ready nodes of every architecture.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from localkube import LocalKube
from podplacement.sandbox.controlplane import (
    DEFAULT_NODES,
    ControlPlane,
    FakeNode,
    add_nodes,
    locate_assets,
    start_control_plane,
)

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
    plane: ControlPlane | None = None
    _client: httpx.Client | None = field(default=None, repr=False)

    @property
    def client(self) -> httpx.Client:
        """A shared synchronous httpx client for this server."""
        if self._client is None:
            headers = {"Accept": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            verify: Any = (ssl.create_default_context(cafile=str(self.ca_file))
                           if self.ca_file else True)
            self._client = httpx.Client(base_url=self.url, headers=headers, verify=verify,
                                        timeout=30.0)
        return self._client

    def close(self) -> None:
        """Close the shared client."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def stop(self) -> None:
        """Close the client; stop the server (localkube or the real control plane)."""
        self.close()
        if self.server is not None:
            self.server.stop()
        if self.plane is not None:
            self.plane.stop()

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
        """Create namespace ``name`` (with ``labels``) unless it exists; returns it. On a
        real control plane, also wait (at most 20 s) for its ``default`` ServiceAccount, which
        the ServiceAccount admission plugin needs before any pod is created there (made by
        kube-controller-manager; created here when no controller-manager runs).

        Raises: httpx.HTTPStatusError on a refused write; RuntimeError when the
        ServiceAccount does not appear."""
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}}}
        r = self.request("POST", "/api/v1/namespaces", json=body)
        if r.status_code == 409:
            out: dict[str, Any] = self.get(f"/api/v1/namespaces/{name}")
        else:
            r.raise_for_status()
            out = r.json()
        if self.kind == "real":
            self.wait_default_service_account(name)
        return out

    def wait_default_service_account(self, namespace: str, limit: float = 20.0) -> None:
        """Wait for ``namespace``'s ``default`` ServiceAccount; create it when no
        kube-controller-manager runs. Raises: RuntimeError after ``limit`` seconds."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts"
        if self.plane is None or "kube-controller-manager" not in self.plane.processes:
            r = self.request("POST", path, json={"apiVersion": "v1", "kind": "ServiceAccount",
                                                 "metadata": {"name": "default"}})
            if r.status_code not in (201, 409):
                r.raise_for_status()
        deadline = time.monotonic() + limit
        while self.request("GET", f"{path}/default").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no default ServiceAccount in {namespace} after {limit} s")
            time.sleep(0.05)

    def wait_crds_served(self, limit: float = 30.0) -> None:
        """Wait until every CRD of the project answers a list (a new CRD takes a moment
        on a real API server). Raises: RuntimeError after ``limit`` seconds."""
        paths = []
        for path in CRD_FILES:
            for doc in yaml.safe_load_all(path.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    spec = doc["spec"]
                    version = next(v["name"] for v in spec["versions"] if v.get("served"))
                    paths.append(f"/apis/{spec['group']}/{version}/{spec['names']['plural']}")
        deadline = time.monotonic() + limit
        for p in paths:
            while self.request("GET", p).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{p} not served after {limit} s")
                time.sleep(0.1)

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


def real_env(plane: ControlPlane) -> KubeEnv:
    """The :class:`KubeEnv` of a running real control plane (admin token)."""
    return KubeEnv(url=plane.url, kubeconfig=plane.kubeconfig, kind="real", token=plane.token,
                   ca_file=plane.ca_file, plane=plane)


def start_real(workdir: Path, *, nodes: Iterable[FakeNode] = DEFAULT_NODES,
               crds: bool = True, **options: Any) -> KubeEnv:
    """Locate the binaries (:func:`podplacement.sandbox.controlplane.locate_assets`), start
    the control plane in ``workdir``, load the project's CRDs (unless not ``crds``: a test
    that installs another release's) and add the fake Ready ``nodes``. ``options`` go to
    ``start_control_plane``.

    Raises:
        AssetsNotFound: no binaries; ControlPlaneError: it did not start.
    """
    plane = start_control_plane(locate_assets(), workdir, **options)
    try:
        env = real_env(plane)
        if crds:
            env.apply_crds()
            env.wait_crds_served()
        add_nodes(plane, nodes)
    except BaseException:
        plane.stop()
        raise
    return env
