"""pytest fixtures for the real OCI registry (docker-registry) variants.

Session-scoped registries (each variant starts once per session):
``registry`` (plain HTTP, anonymous), ``tls_registry`` (HTTPS, our CA), ``basic_registry``
(HTTPS + htpasswd Basic auth), ``token_registry`` (HTTPS + bearer tokens from our token
server). Factories: ``pusher`` / ``make_pusher`` (``make_pusher(reg) -> Pusher``, closed at
session end) and the function-scoped ``fault_proxy`` / ``make_fault_proxy``
(``make_fault_proxy(upstream, **kw) -> FaultProxy``, stopped after the test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.harness.faults import FaultProxy
from tests.harness.oci import Pusher
from tests.harness.registry import Registry, start_registry

PusherFactory = Callable[[Registry], Pusher]
FaultProxyFactory = Callable[..., FaultProxy]


def _start(
    factory: pytest.TempPathFactory, name: str, **opts: Any
) -> Iterator[Registry]:
    reg = start_registry(factory.mktemp(name), **opts)
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """Plain-HTTP anonymous registry on 127.0.0.1."""
    yield from _start(tmp_path_factory, "registry-plain")


@pytest.fixture(scope="session")
def tls_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """HTTPS registry; ``ca_pem`` is the CA to trust."""
    yield from _start(tmp_path_factory, "registry-tls", tls=True)


@pytest.fixture(scope="session")
def basic_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """HTTPS registry requiring Basic auth (htpasswd, bcrypt); credentials in
    ``username``/``password``."""
    yield from _start(tmp_path_factory, "registry-basic", tls=True, auth="basic")


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """HTTPS registry requiring bearer tokens; ``token_server`` issues them (HTTPS, same CA)
    for ``username``/``password``. Tests that change the token server's settings
    (``expires_in``, ``token_field``, ``anonymous_pull``, ``claim_lifetime``) must restore
    them."""
    yield from _start(tmp_path_factory, "registry-token", tls=True, auth="token")


@pytest.fixture(scope="session")
def make_pusher() -> Iterator[PusherFactory]:
    """Factory ``make_pusher(registry) -> Pusher``; every Pusher is closed at session end."""
    made: list[Pusher] = []

    def factory(reg: Registry) -> Pusher:
        p = Pusher(reg)
        made.append(p)
        return p

    yield factory
    for p in made:
        p.close()


@pytest.fixture(scope="session")
def pusher(make_pusher: PusherFactory) -> PusherFactory:
    """Alias of :func:`make_pusher`: ``pusher(registry) -> Pusher``."""
    return make_pusher


@pytest.fixture
def make_fault_proxy() -> Iterator[FaultProxyFactory]:
    """Factory ``make_fault_proxy(upstream: Registry | str, *, ca_pem=None,
    advertise="127.0.0.1") -> FaultProxy``; every proxy is stopped after the test."""
    made: list[FaultProxy] = []

    def factory(upstream: Registry | str, **kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(upstream, **kwargs)
        made.append(proxy)
        return proxy

    yield factory
    for proxy in made:
        proxy.stop()


@pytest.fixture
def fault_proxy(make_fault_proxy: FaultProxyFactory) -> FaultProxyFactory:
    """Alias of :func:`make_fault_proxy`."""
    return make_fault_proxy
