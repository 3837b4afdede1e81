"""Fixtures for imageinspect tests against the real registry harness (tests/harness)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from podplacement.imageinspect import Inspector, RegistriesConfig
from tests.harness.registry import Registry

InspectorFactory = Callable[..., Awaitable[Inspector]]


def insecure(*hosts: str) -> RegistriesConfig:
    """registries.conf allowing plain HTTP for ``hosts`` (the plain registry, fault proxies)."""
    conf = RegistriesConfig()
    for host in hosts:
        conf = conf.with_insecure(host)
    return conf


def trust(*registries: Registry) -> dict[str, bytes]:
    """``ca_bundles`` trusting each TLS registry's CA (and its token server)."""
    out: dict[str, bytes] = {}
    for reg in registries:
        if reg.ca_pem:
            out[reg.host] = reg.ca_pem
            if reg.token_server is not None:
                out[reg.token_server.url.split("://", 1)[1]] = reg.ca_pem
    return out


@pytest.fixture
async def make_inspector() -> AsyncIterator[InspectorFactory]:
    """``await make_inspector(**Inspector kwargs)``; every inspector is closed after the test.
    Retries default to 1 to keep failure tests short."""
    made: list[Inspector] = []

    async def factory(**kwargs: Any) -> Inspector:
        kwargs.setdefault("retries", 1)
        kwargs.setdefault("timeout", 10.0)
        insp = Inspector(**kwargs)
        made.append(insp)
        return insp

    yield factory
    for insp in made:
        await insp.aclose()
