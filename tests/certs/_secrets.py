"""Helpers for the tests of the certificate Secrets (certs.secretflow, and the lifecycle that
publishes their bundle): a settable clock, Secret data, CA identities and real TLS
handshakes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ssl
from pathlib import Path

from cryptography import x509

from podplacement import certs
from tests.harness.kube import KubeEnv

NS = "podplacement-system"
HOST = f"{certs.secretflow.WEBHOOK_SERVICE_NAME}.{NS}.svc"
TLS_PATH = f"/api/v1/namespaces/{NS}/secrets/{certs.secretflow.TLS_SECRET_NAME}"
CA_PATH = f"/api/v1/namespaces/{NS}/secrets/{certs.secretflow.CA_SECRET_NAME}"


class Clock:
    """A settable clock for ServingCertSecret (never ahead of the wall clock, so every
    certificate issued under it is already valid for the real TLS handshakes)."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def secret_data(env: KubeEnv, path: str) -> dict[str, bytes]:
    """The decoded ``data`` of the Secret at ``path``."""
    return {k: base64.b64decode(v) for k, v in env.get(path)["data"].items()}


def serving(env: KubeEnv) -> certs.KeyPair:
    """The serving certificate and key in the TLS Secret."""
    data = secret_data(env, TLS_PATH)
    return certs.KeyPair(data["tls.crt"], data["tls.key"])


def subject_keys(bundle: bytes) -> list[bytes]:
    """The SubjectKeyIdentifier of every CA in ``bundle`` (identifies CAs with equal names)."""
    return [c.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
            for c in x509.load_pem_x509_certificates(bundle)]


def rvs(env: KubeEnv) -> tuple[str, str]:
    """The resourceVersions of the CA and the TLS Secret."""
    return (env.get(CA_PATH)["metadata"]["resourceVersion"],
            env.get(TLS_PATH)["metadata"]["resourceVersion"])


async def handshake(tmp_path: Path, pair: certs.KeyPair, bundle: bytes) -> bool:
    """Serve ``pair`` on 127.0.0.1 and connect with a client trusting only ``bundle``
    (hostname checked against the Service name). True when the client verified the server
    and read its reply, False when certificate verification failed."""
    cert_file, key_file = tmp_path / "hs.crt", tmp_path / "hs.key"
    cert_file.write_bytes(pair.cert_pem)
    key_file.write_bytes(pair.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_file, key_file)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            writer.write(b"ok")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        client_ctx = ssl.create_default_context(cadata=bundle.decode())
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname=HOST), timeout=10)
        except ssl.SSLCertVerificationError:
            return False
        try:
            return await asyncio.wait_for(reader.read(), timeout=10) == b"ok"
        finally:
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
