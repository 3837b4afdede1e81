"""Fixtures for the webhook tests: an in-process app client and TLS material."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from podplacement.certs import CertState, generate_ca, issue_serving_cert, write_dir
from podplacement.rules.config import PlacementConfig
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import StaticConfigSource


@pytest.fixture
def source() -> StaticConfigSource:
    """A config source holding the default PodPlacementConfig (gating on)."""
    return StaticConfigSource(PlacementConfig())


@pytest.fixture
async def client(source: StaticConfigSource) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client bound to a fresh app in-process (ASGI transport, no sockets)."""
    app = create_app(source, own_namespace="podplacement-system")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as c:
        c.app = app  # type: ignore[attr-defined]
        yield c


@pytest.fixture(scope="session")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A certificate directory (CA + serving cert for 127.0.0.1 and localhost)."""
    directory = tmp_path_factory.mktemp("webhook-certs")
    ca = generate_ca()
    serving = issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    write_dir(directory, CertState(serving, ca.key_pem, (ca.cert_pem,)))
    return directory
