"""pytest fixtures for the Kubernetes API: localkube, or a real control plane
(etcd + kube-apiserver from KUBEBUILDER_ASSETS).

- ``localkube``: session-scoped localkube with the project's CRDs (``deploy/crds`` and the
  optional NRT CRD) loaded.
- ``fresh_localkube``: a new localkube for one test (same CRDs).
- ``real_kube``: session-scoped real control plane; skips without ``KUBEBUILDER_ASSETS``.
- ``kube``: ``localkube``, or ``real_kube`` when ``PODPLACEMENT_TEST_CLUSTER=real`` and
  ``KUBEBUILDER_ASSETS`` is set.
- ``unique_namespace``: a fresh namespace (name) in ``kube``, deleted afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.kube import KubeEnv, start_localkube, start_real_control_plane


@pytest.fixture(scope="session")
def localkube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    """A session-wide localkube (CRDs loaded); stopped at session end."""
    server, env = start_localkube(tmp_path_factory.mktemp("localkube"))
    try:
        yield env
    finally:
        env.close()
        server.stop()


@pytest.fixture
def fresh_localkube(tmp_path: Path) -> Iterator[KubeEnv]:
    """A localkube for this test only (CRDs loaded); stopped afterwards."""
    server, env = start_localkube(tmp_path)
    try:
        yield env
    finally:
        env.close()
        server.stop()


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    """A real control plane from ``$KUBEBUILDER_ASSETS`` (skips when unset)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        pytest.skip("KUBEBUILDER_ASSETS not set (needs etcd + kube-apiserver binaries)")
    plane = start_real_control_plane(Path(assets), tmp_path_factory.mktemp("realkube"))
    try:
        plane.env.apply_crds()
        yield plane.env
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> KubeEnv:
    """localkube, or the real control plane with ``PODPLACEMENT_TEST_CLUSTER=real``."""
    if os.environ.get("PODPLACEMENT_TEST_CLUSTER") == "real" and os.environ.get(
        "KUBEBUILDER_ASSETS"
    ):
        env: KubeEnv = request.getfixturevalue("real_kube")
        return env
    env = request.getfixturevalue("localkube")
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
