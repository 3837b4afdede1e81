"""Shared pieces of the tests that run the installed product on the real control plane
(``tests/test_installed_realcluster.py``, ``tests/test_faults_realcluster.py``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.sandbox.controlplane import AssetsNotFound
from tests.harness.kube import KubeEnv, start_real

REPO = Path(__file__).resolve().parents[2]

#: Controller options for a product whose last stop need not stand down: a graceful stop
#: then ends at once instead of waiting 5 s for a successor (``--standby-wait``). The
#: stand-down has tests of its own (``tests/test_uninstall_realcluster.py``).
NO_STAND_DOWN = ("--standby-wait", "-1")


def real_cluster(tmp_path_factory: pytest.TempPathFactory, name: str,
                 **options: Any) -> Iterator[KubeEnv]:
    """A real control plane for one test module (``options`` go to ``start_real``);
    skips the module when the binaries are not found."""
    try:
        env = start_real(tmp_path_factory.mktemp(name), **options)
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    try:
        yield env
    finally:
        env.stop()


def checked_namespace(cluster: KubeEnv, prefix: str) -> Iterator[str]:
    """A fresh namespace; afterwards every pod podplacement decided must be bound to a node
    its images can run on (:func:`tests.controller.conftest.check_bindings`)."""
    from tests.controller.conftest import check_bindings

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.ensure_namespace(name)
    try:
        yield name
        check_bindings(cluster, name)
    finally:
        cluster.delete(f"/api/v1/namespaces/{name}")


def bind_edit(cluster: KubeEnv, namespace: str, user: str = "mallory") -> None:
    """Bind the built-in ClusterRole ``edit`` to ``user`` in ``namespace`` (which must
    exist): the tenant of docs/security.md, whom tests act as through Impersonate-User
    headers. The RoleBinding is named ``<user>-edit``."""
    cluster.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{user}-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


def wait_for(check: Callable[[], Any], within: float, every: float = 0.1) -> Any:
    """Call ``check`` every ``every`` seconds until it returns something true (returned), for
    at most ``within`` seconds. Raises: AssertionError with the last value."""
    deadline = time.monotonic() + within
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"not within {within} s; last: {last!r}")


def installed_cluster(tmp_path_factory: pytest.TempPathFactory, name: str
                      ) -> Iterator[KubeEnv]:
    """:func:`real_cluster` with podplacement installed from ``deploy/`` as shipped
    (:func:`podplacement.sandbox.product.install_manifests`: the sample config too)."""
    from podplacement.sandbox.product import install_manifests

    plane = real_cluster(tmp_path_factory, name)
    env = next(plane)
    try:
        assert env.plane is not None
        install_manifests(env.plane, REPO / "deploy")
        yield env
    finally:
        plane.close()


def running_product(cluster: KubeEnv, registry: Any, tmp_path_factory: pytest.TempPathFactory,
                    ) -> Iterator[Any]:
    """The webhook and one controller of this checkout (:func:`podplacement.sandbox.product.
    start_product`, deploy/'s ServiceAccounts) trusting ``registry`` over plain HTTP, the
    controller without the stand-down wait; afterwards, no RBAC denial in their logs."""
    from podplacement.sandbox.product import start_product

    assert cluster.plane is not None
    options = ["--insecure-registry", registry.host]
    prod = start_product(cluster.plane, tmp_path_factory.mktemp("product"),
                         controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


def product_with_metrics(cluster: KubeEnv, registry: Any,
                         tmp_path_factory: pytest.TempPathFactory, name: str
                         ) -> Iterator[tuple[Any, int]]:
    """The product started on ``cluster`` as processes (the registry trusted as insecure, no
    stand-down), the controller's ``/metrics`` on 127.0.0.1: yields ``(Product, port)``,
    stops it after, and fails when the product's logs show RBAC denials. For a module's
    ``product`` fixture."""
    from podplacement.sandbox.ports import free_port
    from podplacement.sandbox.product import start_product

    assert cluster.plane is not None
    port = free_port()
    options = ["--insecure-registry", registry.host]
    prod = start_product(cluster.plane, tmp_path_factory.mktemp(f"{name}-product"),
                         controller_options=[*options, "--metrics-port", str(port),
                                             "--metrics-address", "127.0.0.1",
                                             *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod, port
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"
