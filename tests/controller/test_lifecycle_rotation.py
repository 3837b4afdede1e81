"""controller.lifecycle.ServingCertSecret (certs.secretflow's flow bound to our webhook
configuration) with the lifecycle on localkube: a CA rotation in two steps with an overlap
window (certs.rotation), checked with real TLS handshakes against the caBundle the lifecycle
publishes in the MutatingWebhookConfiguration at each step. The flow on its own is tested in
tests/certs/test_secretflow.py."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podplacement import certs
from podplacement.controller.lifecycle import (
    WEBHOOK_PATH,
    WEBHOOK_SERVICE_NAME,
    Lifecycle,
    ServingCertSecret,
)
from podplacement.kubeclient import KubeAPI
from podplacement.rules.admit.webhookconfig import ServiceRef
from tests.certs._secrets import (
    CA_PATH,
    HOST,
    NS,
    TLS_PATH,
    Clock,
    handshake,
    rvs,
    secret_data,
    serving,
    subject_keys,
)
from tests.harness.kube import KubeEnv

SAMPLE = Path(__file__).resolve().parents[2] / "deploy/samples/podplacementconfig.yaml"
CONFIGS = "/apis/podplacement.io/v1beta1/podplacementconfigs"


@pytest.fixture
def api(fresh_api: KubeAPI) -> KubeAPI:
    return fresh_api


def _published_bundle(env: KubeEnv) -> bytes:
    hooks = env.get(WEBHOOK_PATH)["webhooks"]
    bundles = {base64.b64decode(h["clientConfig"]["caBundle"]) for h in hooks}
    assert len(bundles) == 1
    return bundles.pop()


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
    bundle0, s0 = _published_bundle(env), serving(env)
    assert len(subject_keys(bundle0)) == 1
    assert secret_data(env, TLS_PATH)["ca.crt"] == bundle0
    assert "ca.key" not in secret_data(env, TLS_PATH)  # webhook pods never get the CA key
    assert await handshake(tmp_path, s0, bundle0)

    # nothing due yet: no Secret is written
    clock.now = real - dt.timedelta(hours=2)
    before = rvs(env)
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.noop
    assert rvs(env) == before and _published_bundle(env) == bundle0

    # step 1: the new CA joins the bundle, the serving certificate stays
    clock.now = real - dt.timedelta(minutes=60)
    await lifecycle.reconcile()
    assert source.last_plan is not None
    assert source.last_plan.new_ca and not source.last_plan.reissue_serving
    bundle1 = _published_bundle(env)
    keys1 = subject_keys(bundle1)
    assert len(keys1) == 2 and keys1[0] == subject_keys(bundle0)[0]
    assert serving(env) == s0
    assert secret_data(env, TLS_PATH)["ca.crt"] == bundle1
    assert secret_data(env, CA_PATH)["ca.crt"] == bundle1
    new_ca = certs.KeyPair(
        x509.load_pem_x509_certificates(bundle1)[1].public_bytes(serialization.Encoding.PEM),
        secret_data(env, CA_PATH)["ca.key"])
    # an API server on either bundle reaches a replica serving the step-1 certificate
    assert await handshake(tmp_path, s0, bundle1)
    assert await handshake(tmp_path, s0, bundle0)

    # inside the overlap window nothing is reissued, however often we reconcile
    clock.now = real - dt.timedelta(minutes=30)
    before = rvs(env)
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.noop
    assert rvs(env) == before and serving(env) == s0

    # step 2: overlap over, the serving certificate comes from the new CA
    clock.now = real
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.reissue_serving
    assert not source.last_plan.new_ca
    s1 = serving(env)
    assert s1 != s0
    assert s1.certificate.issuer == new_ca.certificate.subject
    s1.certificate.verify_directly_issued_by(new_ca.certificate)
    bundle2 = _published_bundle(env)
    assert bundle2 == bundle1
    # replicas on the old and on the new certificate are both trusted ...
    assert await handshake(tmp_path, s1, bundle2)
    assert await handshake(tmp_path, s0, bundle2)
    # ... while a bundle without the new CA would not have been (why step 1 comes first)
    assert not await handshake(tmp_path, s1, bundle0)

    # the old CA expires: it leaves the bundle, nothing else changes
    clock.now = real + dt.timedelta(days=1)
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.drop_cas
    bundle3 = _published_bundle(env)
    assert subject_keys(bundle3) == [keys1[1]]
    assert serving(env) == s1
    assert await handshake(tmp_path, s1, bundle3)


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
    bundle0, s0 = _published_bundle(env), serving(env)

    clock.now = real - dt.timedelta(minutes=60)
    await source()  # step 1, not published
    assert source.last_plan is not None and source.last_plan.new_ca
    assert _published_bundle(env) == bundle0

    clock.now = real  # the overlap is over
    await source()
    assert source.last_plan is not None and not source.last_plan.reissue_serving
    assert "held" in source.last_plan.reasons[-1]
    assert serving(env) == s0
    assert await handshake(tmp_path, serving(env), _published_bundle(env))

    # The lifecycle's reconcile publishes the two-CA bundle (its source call still holds,
    # since it runs before the write); the next one reissues from the new CA.
    await lifecycle.reconcile()
    assert serving(env) == s0
    bundle1 = _published_bundle(env)
    assert len(subject_keys(bundle1)) == 2
    await lifecycle.reconcile()
    assert source.last_plan is not None and source.last_plan.reissue_serving
    s1 = serving(env)
    assert s1 != s0
    assert await handshake(tmp_path, s1, _published_bundle(env))
    assert not await handshake(tmp_path, s1, bundle0)


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
    assert not await handshake(tmp_path, serving(env), _published_bundle(env))
    await source()
    assert source.last_plan is not None and source.last_plan.reissue_serving
    assert await handshake(tmp_path, serving(env), _published_bundle(env))
