"""controller.lifecycle.ServingCertSecret on localkube: a CA rotation in two steps with an
overlap window (certs.rotation), checked with real TLS handshakes against the caBundle the
lifecycle publishes in the MutatingWebhookConfiguration at each step."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

import certs
from controller.kube import ApiError, KubeAPI
from controller.lifecycle import (
    CA_SECRET_NAME,
    TLS_SECRET_NAME,
    WEBHOOK_PATH,
    WEBHOOK_SERVICE_NAME,
    Lifecycle,
    ServingCertSecret,
)
from controller.webhookconfig import ServiceRef
from tests.harness.kube import KubeEnv

NS = "podplacement-system"
HOST = f"{WEBHOOK_SERVICE_NAME}.{NS}.svc"
SAMPLE = Path(__file__).resolve().parents[2] / "deploy/base/samples/podplacementconfig.yaml"
CONFIGS = "/apis/podplacement.io/v1beta1/podplacementconfigs"
TLS_PATH = f"/api/v1/namespaces/{NS}/secrets/{TLS_SECRET_NAME}"
CA_PATH = f"/api/v1/namespaces/{NS}/secrets/{CA_SECRET_NAME}"


class Clock:
    """A settable clock for ServingCertSecret (never ahead of the wall clock, so every
    certificate issued under it is already valid for the real TLS handshakes)."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
async def api(fresh_localkube: KubeEnv) -> AsyncIterator[KubeAPI]:
    client = KubeAPI.from_url(fresh_localkube.url)
    try:
        yield client
    finally:
        await client.close()


def _secret_data(env: KubeEnv, path: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in env.get(path)["data"].items()}


def _serving(env: KubeEnv) -> certs.KeyPair:
    data = _secret_data(env, TLS_PATH)
    return certs.KeyPair(data["tls.crt"], data["tls.key"])


def _published_bundle(env: KubeEnv) -> bytes:
    hooks = env.get(WEBHOOK_PATH)["webhooks"]
    bundles = {base64.b64decode(h["clientConfig"]["caBundle"]) for h in hooks}
    assert len(bundles) == 1
    return bundles.pop()


def _subjects_keys(bundle: bytes) -> list[bytes]:
    """The SubjectKeyIdentifier of every CA in ``bundle`` (identifies CAs with equal names)."""
    return [c.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
            for c in x509.load_pem_x509_certificates(bundle)]


async def _handshake(tmp_path: Path, serving: certs.KeyPair, bundle: bytes) -> bool:
    """Serve ``serving`` on 127.0.0.1 and connect with a client trusting only ``bundle``
    (hostname checked against the Service name). True when the client verified the server
    and read its reply, False when certificate verification failed."""
    cert_file, key_file = tmp_path / "hs.crt", tmp_path / "hs.key"
    cert_file.write_bytes(serving.cert_pem)
    key_file.write_bytes(serving.key_pem)
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


def _setup(env: KubeEnv, api: KubeAPI, clock: Clock) -> tuple[ServingCertSecret, Lifecycle]:
    env.ensure_namespace(NS)
    env.create(CONFIGS, yaml.safe_load(SAMPLE.read_text()))
    source = ServingCertSecret(
        api, NS, renew_before=dt.timedelta(days=1), overlap=dt.timedelta(hours=1),
        ca_validity=dt.timedelta(days=10), cert_validity=dt.timedelta(days=10), clock=clock,
    )
    lifecycle = Lifecycle(api, namespace=NS, service=ServiceRef(NS, WEBHOOK_SERVICE_NAME),
                          ca_bundle=source)
    return source, lifecycle


def _rvs(env: KubeEnv) -> tuple[str, str]:
    return (env.get(CA_PATH)["metadata"]["resourceVersion"],
            env.get(TLS_PATH)["metadata"]["resourceVersion"])


async def test_ca_rotation_keeps_every_step_trusted(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    env = fresh_localkube
    real = dt.datetime.now(dt.UTC)
    # CA0 lives [real-9d-1m, real+1d-1m]: with renew_before 1d and overlap 1h its renewal
    # starts at real-61m, and the overlap of its successor ends at about real-1m.
    clock = Clock(real - dt.timedelta(days=9))
    source, lifecycle = _setup(env, api, clock)

    # step 0: first install
    await lifecycle.reconcile()
    bundle0, s0 = _published_bundle(env), _serving(env)
    assert len(_subjects_keys(bundle0)) == 1
    assert _secret_data(env, TLS_PATH)["ca.crt"] == bundle0
    assert "ca.key" not in _secret_data(env, TLS_PATH)  # webhook pods never get the CA key
    assert await _handshake(tmp_path, s0, bundle0)

    # nothing due yet: no Secret is written
    clock.now = real - dt.timedelta(hours=2)
    rvs = _rvs(env)
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.noop
    assert _rvs(env) == rvs and _published_bundle(env) == bundle0

    # step 1: the new CA joins the bundle, the serving certificate stays
    clock.now = real - dt.timedelta(minutes=60)
    await lifecycle.reconcile()
    assert source.last_plan is not None
    assert source.last_plan.new_ca and not source.last_plan.reissue_serving
    bundle1 = _published_bundle(env)
    keys1 = _subjects_keys(bundle1)
    assert len(keys1) == 2 and keys1[0] == _subjects_keys(bundle0)[0]
    assert _serving(env) == s0
    assert _secret_data(env, TLS_PATH)["ca.crt"] == bundle1
    assert _secret_data(env, CA_PATH)["ca.crt"] == bundle1
    new_ca = certs.KeyPair(
        x509.load_pem_x509_certificates(bundle1)[1].public_bytes(serialization.Encoding.PEM),
        _secret_data(env, CA_PATH)["ca.key"])
    # an API server on either bundle reaches a replica serving the step-1 certificate
    assert await _handshake(tmp_path, s0, bundle1)
    assert await _handshake(tmp_path, s0, bundle0)

    # inside the overlap window nothing is reissued, however often we reconcile
    clock.now = real - dt.timedelta(minutes=30)
    rvs = _rvs(env)
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.noop
    assert _rvs(env) == rvs and _serving(env) == s0

    # step 2: overlap over, the serving certificate comes from the new CA
    clock.now = real
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.reissue_serving
    assert not source.last_plan.new_ca
    s1 = _serving(env)
    assert s1 != s0
    assert s1.certificate.issuer == new_ca.certificate.subject
    s1.certificate.verify_directly_issued_by(new_ca.certificate)
    bundle2 = _published_bundle(env)
    assert bundle2 == bundle1
    # replicas on the old and on the new certificate are both trusted ...
    assert await _handshake(tmp_path, s1, bundle2)
    assert await _handshake(tmp_path, s0, bundle2)
    # ... while a bundle without the new CA would not have been (why step 1 comes first)
    assert not await _handshake(tmp_path, s1, bundle0)

    # the old CA expires: it leaves the bundle, nothing else changes
    clock.now = real + dt.timedelta(days=1)
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.drop_cas
    bundle3 = _published_bundle(env)
    assert _subjects_keys(bundle3) == [keys1[1]]
    assert _serving(env) == s1
    assert await _handshake(tmp_path, s1, bundle3)


async def test_interrupted_step_one_is_completed_without_skipping_the_overlap(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    env = fresh_localkube
    real = dt.datetime.now(dt.UTC)
    clock = Clock(real - dt.timedelta(days=9))
    source, _ = _setup(env, api, clock)
    bundle0 = await source()
    s0 = _serving(env)

    # step 1 stores the new CA, then the write of the TLS Secret fails
    clock.now = real - dt.timedelta(minutes=60)
    assert env.server is not None
    env.server.inject_fault(409, 1, method="PUT", plural="secrets", name=TLS_SECRET_NAME)
    with pytest.raises(ApiError):
        await source()
    assert _secret_data(env, TLS_PATH)["ca.crt"] == bundle0  # not yet updated
    assert len(_subjects_keys(_secret_data(env, CA_PATH)["ca.crt"])) == 2

    # the retry completes step 1 with the same new CA and keeps the serving certificate
    ca_key = _secret_data(env, CA_PATH)["ca.key"]
    bundle1 = await source()
    assert source.last_plan is not None and source.last_plan.noop
    assert _secret_data(env, CA_PATH)["ca.key"] == ca_key
    assert _secret_data(env, TLS_PATH)["ca.crt"] == bundle1 == _secret_data(env, CA_PATH)[
        "ca.crt"]
    assert len(_subjects_keys(bundle1)) == 2
    assert _serving(env) == s0
    assert await _handshake(tmp_path, s0, bundle1)


async def test_secrets_of_the_single_ca_layout_are_taken_over(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    """Secrets written before the rotation rework: the CA Secret's ca.crt held only the
    newest CA and the TLS Secret's bundle the newest and the older ones. The older CA must
    stay trusted and the serving certificate must be kept."""
    env = fresh_localkube
    env.ensure_namespace(NS)
    old_ca = certs.generate_ca(validity=dt.timedelta(days=3),
                               not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    new_ca = certs.generate_ca(validity=dt.timedelta(days=100))
    serving = certs.issue_serving_cert(old_ca, certs.service_dns_names(WEBHOOK_SERVICE_NAME, NS),
                                       validity=dt.timedelta(days=3))

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    env.create(f"/api/v1/namespaces/{NS}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": CA_SECRET_NAME, "namespace": NS},
        "data": {"ca.crt": b64(new_ca.cert_pem), "ca.key": b64(new_ca.key_pem)}})
    env.create(f"/api/v1/namespaces/{NS}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": TLS_SECRET_NAME, "namespace": NS, "labels": {"team": "x"}},
        "data": {"tls.crt": b64(serving.cert_pem), "tls.key": b64(serving.key_pem),
                 "ca.crt": b64(new_ca.cert_pem + old_ca.cert_pem)}})
    source = ServingCertSecret(api, NS, renew_before=dt.timedelta(days=1))
    bundle = await source()
    assert source.last_plan is not None and source.last_plan.noop
    assert bundle == old_ca.cert_pem + new_ca.cert_pem  # oldest first
    assert _secret_data(env, CA_PATH)["ca.crt"] == bundle
    assert _serving(env) == serving
    assert env.get(TLS_PATH)["metadata"]["labels"]["team"] == "x"
    assert await _handshake(tmp_path, serving, bundle)


async def test_serving_certificate_follows_a_renamed_service(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    env = fresh_localkube
    env.ensure_namespace(NS)
    bundle = await ServingCertSecret(api, NS, service_name="old-name")()
    renamed = ServingCertSecret(api, NS)
    assert await renamed() == bundle  # same CA
    assert renamed.last_plan is not None and renamed.last_plan.reissue_serving
    sans = _serving(env).certificate.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert HOST in sans and not any(n.startswith("old-name") for n in sans)
    assert await _handshake(tmp_path, _serving(env), bundle)
    rvs = _rvs(env)
    await renamed()
    assert _rvs(env) == rvs


async def test_step_two_waits_until_the_new_ca_is_published(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    """Step 1's bundle never reached the webhook configuration (here: the source is called
    without the lifecycle, as when every write of the configuration failed): after the
    overlap, the serving certificate is not replaced by one the published caBundle does not
    trust; it is once the lifecycle has published the bundle."""
    env = fresh_localkube
    real = dt.datetime.now(dt.UTC)
    clock = Clock(real - dt.timedelta(days=9))
    source, lifecycle = _setup(env, api, clock)
    await lifecycle.reconcile()
    bundle0, s0 = _published_bundle(env), _serving(env)

    clock.now = real - dt.timedelta(minutes=60)
    await source()  # step 1, not published
    assert source.last_plan is not None and source.last_plan.new_ca
    assert _published_bundle(env) == bundle0

    clock.now = real  # the overlap is over
    await source()
    assert source.last_plan is not None and not source.last_plan.reissue_serving
    assert "held" in source.last_plan.reasons[-1]
    assert _serving(env) == s0
    assert await _handshake(tmp_path, _serving(env), _published_bundle(env))

    # The lifecycle's reconcile publishes the two-CA bundle (its source call still holds,
    # since it runs before the write); the next one reissues from the new CA.
    await lifecycle.reconcile()
    assert _serving(env) == s0
    bundle1 = _published_bundle(env)
    assert len(_subjects_keys(bundle1)) == 2
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.reissue_serving
    s1 = _serving(env)
    assert s1 != s0
    assert await _handshake(tmp_path, s1, _published_bundle(env))
    assert not await _handshake(tmp_path, s1, bundle0)


async def test_first_install_and_broken_certificates_are_not_held(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    env = fresh_localkube
    clock = Clock(dt.datetime.now(dt.UTC))
    source, lifecycle = _setup(env, api, clock)
    await source()  # no webhook configuration yet: issued at once
    assert source.last_plan is not None and source.last_plan.reissue_serving
    await lifecycle.reconcile()
    # The TLS Secret gets a certificate from a foreign CA: it is replaced although the
    # published bundle is unchanged (the current certificate does not work anyway).
    foreign = certs.issue_serving_cert(certs.generate_ca(), [HOST])
    env.patch(TLS_PATH, [
        {"op": "replace", "path": "/data/tls.crt",
         "value": base64.b64encode(foreign.cert_pem).decode()},
        {"op": "replace", "path": "/data/tls.key",
         "value": base64.b64encode(foreign.key_pem).decode()}], "json")
    assert not await _handshake(tmp_path, _serving(env), _published_bundle(env))
    await source()
    assert source.last_plan is not None and source.last_plan.reissue_serving
    assert await _handshake(tmp_path, _serving(env), _published_bundle(env))
