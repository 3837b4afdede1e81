"""certs.secretflow.ServingCertSecret: the CA and serving certificate kept in two Secrets,
through any client shaped like certs.Requester: an in-memory fake whose errors carry only a
``status``, and the controller's KubeAPI on localkube (real TLS handshakes with the issued
certificates). The lifecycle publishing the bundle is in tests/controller."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from podplacement import certs
from podplacement.certs.secretflow import CA_SECRET_NAME, TLS_SECRET_NAME, WEBHOOK_SERVICE_NAME
from podplacement.kubeclient import ApiError, KubeAPI
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


@pytest.fixture
def api(fresh_api: KubeAPI) -> KubeAPI:
    return fresh_api


# --- any Requester ---------------------------------------------------------------------------


class StatusError(Exception):
    """An API error as the Requester protocol describes it: nothing but a ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class FakeRequester:
    """Secrets in a dict by path; records ``(method, path)``; ``fail`` maps a
    ``(method, path)`` to the status of one injected error."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[tuple[str, str], int] = {}

    async def request(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        self.calls.append((method, path))
        if (method, path) in self.fail:
            raise StatusError(self.fail.pop((method, path)))
        if method == "GET":
            if path not in self.objects:
                raise StatusError(404)
            return copy.deepcopy(self.objects[path])
        name = path.rsplit("/", 1)[-1] if method == "PUT" else body["metadata"]["name"]
        key = path if method == "PUT" else f"{path}/{name}"
        if (method == "POST") == (key in self.objects):
            raise StatusError(409 if method == "POST" else 404)
        self.objects[key] = copy.deepcopy(body)
        return copy.deepcopy(body)


async def test_any_requester_whose_errors_carry_a_status_will_do() -> None:
    fake = FakeRequester()
    source: certs.Requester = fake
    flow = certs.ServingCertSecret(source, NS)
    bundle = await flow()
    collection = f"/api/v1/namespaces/{NS}/secrets"
    assert fake.calls == [("GET", CA_PATH), ("GET", TLS_PATH),
                          ("POST", collection), ("POST", collection)]
    ca, tls = fake.objects[CA_PATH], fake.objects[TLS_PATH]
    assert (ca["type"], tls["type"]) == ("Opaque", "kubernetes.io/tls")
    assert ca["metadata"]["labels"] == tls["metadata"]["labels"] == {
        "app.kubernetes.io/name": "podplacement"}
    assert base64.b64decode(ca["data"]["ca.crt"]) == base64.b64decode(tls["data"]["ca.crt"])
    assert base64.b64decode(tls["data"]["ca.crt"]) == bundle
    assert "ca.key" in ca["data"] and "ca.key" not in tls["data"]

    # converged: reads only (no webhook configuration path, so nothing else is read)
    fake.calls.clear()
    assert await flow() == bundle
    assert fake.calls == [("GET", CA_PATH), ("GET", TLS_PATH)]


async def test_errors_other_than_not_found_reach_the_caller() -> None:
    fake = FakeRequester()
    flow = certs.ServingCertSecret(fake, NS)
    fake.fail[("GET", CA_PATH)] = 403
    with pytest.raises(StatusError) as forbidden:
        await flow()
    assert forbidden.value.status == 403
    # another writer created the CA Secret first: the 409 is the caller's to retry
    fake.fail[("POST", f"/api/v1/namespaces/{NS}/secrets")] = 409
    with pytest.raises(StatusError) as conflict:
        await flow()
    assert conflict.value.status == 409
    bundle = await flow()
    assert base64.b64decode(fake.objects[TLS_PATH]["data"]["ca.crt"]) == bundle


def test_api_requests_name_every_secret_request() -> None:
    assert set(certs.secretflow.API_REQUESTS) == {
        ("GET", "/api/v1/namespaces/{namespace}/secrets/{name}"),
        ("POST", "/api/v1/namespaces/{namespace}/secrets"),
        ("PUT", "/api/v1/namespaces/{namespace}/secrets/{name}"),
    }


# --- the controller's client on localkube ------------------------------------------------------


async def test_serving_cert_secret_issues_a_certificate_that_tls_clients_trust(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    env = fresh_localkube
    env.ensure_namespace(NS)
    source = certs.ServingCertSecret(api, NS)
    bundle = await source()
    tls = env.get(f"/api/v1/namespaces/{NS}/secrets/podplacement-webhook-tls")
    ca = env.get(f"/api/v1/namespaces/{NS}/secrets/podplacement-webhook-ca")
    assert tls["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in tls["data"].items()}
    assert data["ca.crt"] == bundle == base64.b64decode(ca["data"]["ca.crt"])
    leaf = x509.load_pem_x509_certificate(data["tls.crt"])
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "podplacement-webhook.podplacement-system.svc" in sans.get_values_for_type(
        x509.DNSName)

    # a real TLS handshake: server with the issued pair, client trusting only the bundle
    assert await handshake(tmp_path, certs.KeyPair(data["tls.crt"], data["tls.key"]), bundle)

    # a second call changes nothing
    before = rvs(env)
    assert await source() == bundle
    assert rvs(env) == before
    # a certificate close to expiry is re-issued by the same CA
    ca_pair = certs.KeyPair(base64.b64decode(ca["data"]["ca.crt"]),
                            base64.b64decode(ca["data"]["ca.key"]))
    short = certs.issue_serving_cert(ca_pair, ["podplacement-webhook"],
                                     validity=dt.timedelta(days=2))
    env.patch(TLS_PATH, {"data": {"tls.crt": base64.b64encode(short.cert_pem).decode()}})
    assert await source() == bundle
    renewed = secret_data(env, TLS_PATH)["tls.crt"]
    assert renewed != short.cert_pem
    assert x509.load_pem_x509_certificate(renewed).not_valid_after_utc > (
        leaf.not_valid_after_utc - dt.timedelta(days=1))


async def test_interrupted_step_one_is_completed_without_skipping_the_overlap(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    env = fresh_localkube
    env.ensure_namespace(NS)
    real = dt.datetime.now(dt.UTC)
    clock = Clock(real - dt.timedelta(days=9))
    source = certs.ServingCertSecret(
        api, NS, renew_before=dt.timedelta(days=1), overlap=dt.timedelta(hours=1),
        ca_validity=dt.timedelta(days=10), cert_validity=dt.timedelta(days=10), clock=clock,
    )
    bundle0 = await source()
    s0 = serving(env)

    # step 1 stores the new CA, then the write of the TLS Secret fails
    clock.now = real - dt.timedelta(minutes=60)
    assert env.server is not None
    env.server.inject_fault(409, 1, method="PUT", plural="secrets", name=TLS_SECRET_NAME)
    with pytest.raises(ApiError):
        await source()
    assert secret_data(env, TLS_PATH)["ca.crt"] == bundle0  # not yet updated
    assert len(subject_keys(secret_data(env, CA_PATH)["ca.crt"])) == 2

    # the retry completes step 1 with the same new CA and keeps the serving certificate
    ca_key = secret_data(env, CA_PATH)["ca.key"]
    bundle1 = await source()
    assert source.last_plan is not None and source.last_plan.noop
    assert secret_data(env, CA_PATH)["ca.key"] == ca_key
    assert secret_data(env, TLS_PATH)["ca.crt"] == bundle1 == secret_data(env, CA_PATH)[
        "ca.crt"]
    assert len(subject_keys(bundle1)) == 2
    assert serving(env) == s0
    assert await handshake(tmp_path, s0, bundle1)


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
    pair = certs.issue_serving_cert(old_ca, certs.service_dns_names(WEBHOOK_SERVICE_NAME, NS),
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
        "data": {"tls.crt": b64(pair.cert_pem), "tls.key": b64(pair.key_pem),
                 "ca.crt": b64(new_ca.cert_pem + old_ca.cert_pem)}})
    source = certs.ServingCertSecret(api, NS, renew_before=dt.timedelta(days=1))
    bundle = await source()
    assert source.last_plan is not None and source.last_plan.noop
    assert bundle == old_ca.cert_pem + new_ca.cert_pem  # oldest first
    assert secret_data(env, CA_PATH)["ca.crt"] == bundle
    assert serving(env) == pair
    assert env.get(TLS_PATH)["metadata"]["labels"]["team"] == "x"
    assert await handshake(tmp_path, pair, bundle)


async def test_serving_certificate_follows_a_renamed_service(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    env = fresh_localkube
    env.ensure_namespace(NS)
    bundle = await certs.ServingCertSecret(api, NS, service_name="old-name")()
    renamed = certs.ServingCertSecret(api, NS)
    assert await renamed() == bundle  # same CA
    assert renamed.last_plan is not None and renamed.last_plan.reissue_serving
    sans = serving(env).certificate.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert HOST in sans and not any(n.startswith("old-name") for n in sans)
    assert await handshake(tmp_path, serving(env), bundle)
    before = rvs(env)
    await renamed()
    assert rvs(env) == before


@pytest.mark.realcluster
async def test_the_flow_on_the_real_api_server(real_kube: KubeEnv) -> None:
    """The real kube-apiserver: create, converge without writes, replace with the
    resourceVersion precondition keeping foreign labels, and a foreign Secret type (immutable
    on the server) fails loudly instead of being overwritten."""
    env = real_kube
    namespace = f"certs-{uuid.uuid4().hex[:8]}"
    env.ensure_namespace(namespace)
    tls_path = f"/api/v1/namespaces/{namespace}/secrets/{TLS_SECRET_NAME}"
    ca_path = f"/api/v1/namespaces/{namespace}/secrets/{CA_SECRET_NAME}"
    api = await KubeAPI.from_kubeconfig(str(env.kubeconfig))
    try:
        flow = certs.ServingCertSecret(api, namespace)
        bundle = await flow()
        assert env.get(tls_path)["type"] == "kubernetes.io/tls"
        assert env.get(ca_path)["type"] == "Opaque"
        before = (env.get(ca_path)["metadata"]["resourceVersion"],
                  env.get(tls_path)["metadata"]["resourceVersion"])
        assert await flow() == bundle
        assert (env.get(ca_path)["metadata"]["resourceVersion"],
                env.get(tls_path)["metadata"]["resourceVersion"]) == before

        env.patch(tls_path, {"metadata": {"labels": {"team": "x"}},
                             "data": {"tls.crt": base64.b64encode(
                                 certs.issue_serving_cert(certs.generate_ca(), [HOST]).cert_pem
                             ).decode()}})
        assert await flow() == bundle
        assert flow.last_plan is not None and flow.last_plan.reissue_serving
        live = env.get(tls_path)
        assert live["metadata"]["labels"] == {"team": "x", "app.kubernetes.io/name": "podplacement"}
        leaf = x509.load_pem_x509_certificate(base64.b64decode(live["data"]["tls.crt"]))
        leaf.verify_directly_issued_by(x509.load_pem_x509_certificates(bundle)[0])

        env.delete(tls_path)
        env.create(f"/api/v1/namespaces/{namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": TLS_SECRET_NAME, "namespace": namespace},
            "data": {"other": base64.b64encode(b"x").decode()}})
        with pytest.raises(ApiError) as invalid:
            await flow()
        assert invalid.value.status == 422
    finally:
        await api.close()
        env.delete(f"/api/v1/namespaces/{namespace}")
