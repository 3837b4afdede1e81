"""pytest fixtures for the Kubernetes API: localkube, or the real control plane.

- ``localkube``: session-scoped localkube with the project's CRDs (``deploy/crds`` and the
  optional NRT CRD) loaded.
- ``fresh_localkube``: a new localkube for one test (same CRDs).
- ``real_kube``: session-scoped real control plane (kube-apiserver, kube-scheduler and
  kube-controller-manager v1.36.2 with etcd, found by
  :func:`podplacement.sandbox.controlplane.locate_assets`: ``KUBEBUILDER_ASSETS``, else
  ``../shared/k8s-bin`` plus Debian's etcd, else the cache an earlier run filled), CRDs
  loaded. Like envtest it runs no
  kube-scheduler and has no nodes, so API tests see pods exactly as they wrote them (the
  controller's end-to-end modules start their own, with a scheduler and nodes); the
  controller-manager runs (each namespace's ``default`` ServiceAccount). Skips with the
  reason when no binaries are found.
- ``kube``: ``localkube``, or ``real_kube`` when ``PODPLACEMENT_TEST_CLUSTER=real``.
- ``unique_namespace``: a fresh namespace (name) in ``kube``, deleted afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from podplacement.kubeclient import KubeAPI
from tests.harness.kube import KubeEnv, start_localkube


@pytest.fixture(scope="session")
def localkube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    """A session-wide localkube (CRDs loaded); stopped at session end."""
    _server, env = start_localkube(tmp_path_factory.mktemp("localkube"))
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
def fresh_localkube(tmp_path: Path) -> Iterator[KubeEnv]:
    """A localkube for this test only (CRDs loaded); stopped afterwards."""
    _server, env = start_localkube(tmp_path)
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
async def fresh_api(fresh_localkube: KubeEnv) -> AsyncIterator[KubeAPI]:
    """A client of :func:`fresh_localkube` (admin); closed afterwards."""
    client = KubeAPI.from_url(fresh_localkube.url)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    """The session's real control plane (skips when no binaries are found)."""
    from tests.harness.realcluster import real_cluster

    yield from real_cluster(tmp_path_factory, "realkube", nodes=(), scheduler=False)


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> KubeEnv:
    """localkube, or the real control plane with ``PODPLACEMENT_TEST_CLUSTER=real``."""
    name = "real_kube" if os.environ.get("PODPLACEMENT_TEST_CLUSTER") == "real" else "localkube"
    env: KubeEnv = request.getfixturevalue(name)
    return env


@pytest.fixture
def unique_namespace(kube: KubeEnv) -> Iterator[str]:
    """Create a namespace with a unique name in ``kube``; delete it after the test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.ensure_namespace(name)
    try:
        yield name
    finally:
        kube.delete(f"/api/v1/namespaces/{name}")
