"""The webhook served by uvicorn over real TLS on 127.0.0.1, and certificate rotation under
load with zero failed requests."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import ssl
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from podplacement.certs import load_bundle, rotate_dir
from podplacement.rules.config import PlacementConfig
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.server import WebhookServer
from tests.webhook.reference import raw_body
from tests.webhook.waiting import wait_until

BODY = raw_body("a-plain-pod")


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@pytest.fixture
def certs(cert_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the session certificate directory (tests rotate it)."""
    return Path(shutil.copytree(cert_dir, tmp_path / "certs"))


@pytest.fixture
async def server(certs: Path) -> AsyncIterator[WebhookServer]:
    app = create_app(StaticConfigSource(PlacementConfig()))
    srv = WebhookServer(app, cert_file=certs / "tls.crt", key_file=certs / "tls.key",
                        host="127.0.0.1", port=0, reload_interval=0.05,
                        graceful_shutdown=0.5)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


async def post(ctx: ssl.SSLContext, port: int, host: str = "127.0.0.1") -> httpx.Response:
    async with httpx.AsyncClient(verify=ctx, timeout=10) as c:
        return await c.post(f"https://{host}:{port}/mutate?timeout=5s", content=BODY,
                            headers={"Content-Type": "application/json"})


async def test_webhook_answers_over_tls_verified_by_our_ca(
    server: WebhookServer, certs: Path
) -> None:
    ctx = client_context(load_bundle(certs))
    resp = await post(ctx, server.port)
    assert resp.status_code == 200
    assert resp.json()["response"]["patchType"] == "JSONPatch"
    assert resp.http_version == "HTTP/1.1"
    async with httpx.AsyncClient(verify=ctx) as c:
        assert (await c.get(f"https://localhost:{server.port}/readyz")).status_code == 200


async def test_a_client_not_trusting_our_ca_is_refused(server: WebhookServer) -> None:
    with pytest.raises(httpx.ConnectError):
        await post(ssl.create_default_context(), server.port)


async def test_tls_below_1_2_is_refused(server: WebhookServer, certs: Path) -> None:
    assert server.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_2
    ctx = ssl.create_default_context(cadata=load_bundle(certs).decode())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(httpx.ConnectError):
        await post(ctx, server.port)


async def test_rotation_under_load_fails_no_request(server: WebhookServer, certs: Path) -> None:
    """300 requests on fresh connections (new handshakes) by 10 workers while the CA and the
    serving certificate are rotated in two steps; clients trust the bundle on disk, as the API
    server trusts the caBundle the controller keeps in sync."""
    old_bundle = load_bundle(certs)
    old_ca_only = client_context(old_bundle)
    total, workers = 300, 10
    contexts: dict[bytes, ssl.SSLContext] = {}
    done: list[int] = []
    failures: list[str] = []
    after_reload: list[int] = []

    async def worker(share: int) -> None:
        for _ in range(share):
            bundle = load_bundle(certs)
            if bundle not in contexts:
                contexts[bundle] = client_context(bundle)
            ctx = contexts[bundle]
            reloaded = server.reloader.reloads > 0
            try:
                async with httpx.AsyncClient(verify=ctx, timeout=10,
                                             limits=httpx.Limits(max_keepalive_connections=0)) as c:
                    resp = await c.post(f"https://127.0.0.1:{server.port}/mutate", content=BODY)
                    if resp.status_code != 200 or "patch" not in resp.json()["response"]:
                        failures.append(f"HTTP {resp.status_code}")
                    elif reloaded:
                        after_reload.append(1)  # a fresh handshake with the new chain
            except httpx.HTTPError as exc:
                failures.append(repr(exc))
            done.append(1)

    async def rotate() -> None:
        await wait_until(lambda: len(done) >= total // 3, seconds=60)
        step1 = rotate_dir(certs, force=True)  # new CA joins the bundle
        assert step1.new_ca and not step1.reissue_serving
        await wait_until(lambda: len(done) >= total // 2, seconds=60)
        step2 = rotate_dir(certs, overlap=dt.timedelta(0))  # overlap over: new serving cert
        assert step2.reissue_serving and not step2.new_ca

    async with asyncio.timeout(120):
        await asyncio.gather(rotate(), *(worker(total // workers) for _ in range(workers)))
    assert len(done) == total
    assert failures == []
    assert after_reload, "no request ran after the reload: the test did not straddle it"
    # The new certificate is served while the server kept running.
    await wait_until(lambda: server.reloader.reloads > 0)
    assert server.reloader.reloads == 1
    bundle = load_bundle(certs)
    assert bundle.startswith(old_bundle) and len(bundle) > len(old_bundle)
    new_ca_only = client_context(bundle[len(old_bundle):])
    assert (await post(new_ca_only, server.port)).status_code == 200
    with pytest.raises(httpx.ConnectError):
        await post(old_ca_only, server.port)


async def test_a_half_written_pair_keeps_the_old_chain(
    server: WebhookServer, certs: Path
) -> None:
    ctx = client_context(load_bundle(certs))
    good_key = (certs / "tls.key").read_bytes()
    before = server.reloader.reloads
    (certs / "tls.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\ngarbage\n")
    assert server.reloader.check() is False  # tries (the files changed) and refuses
    assert server.reloader.reloads == before
    assert (await post(ctx, server.port)).status_code == 200
    # Once the pair is whole again it is picked up.
    (certs / "tls.key.new").write_bytes(good_key)
    (certs / "tls.key.new").replace(certs / "tls.key")
    await wait_until(lambda: server.reloader.reloads == before + 1)
    assert (await post(ctx, server.port)).status_code == 200
