"""The network a registry can send us to, on the real control plane v1.36.2 with podplacement
installed from deploy/ as shipped (docs/security.md; DESIGN.md: "token realms and redirects
pass the same network checks as the registry, and no remote text is copied into what users
read").

A user ``mallory`` with the built-in ClusterRole ``edit`` in one namespace names registries
she runs (fault proxies answering from rules) in her pods' images:

* an HTTPS registry (trusted with ``--ca-file``, not marked insecure) whose 401 challenge
  sends the product to ``http://127.0.0.1:<canary>/admin?x=1``: a plain-HTTP realm, refused;
* a registry marked insecure whose realm names a canary on 127.0.0.77, and a proxy of the
  real registry whose blob redirect names the same canary, with 127.0.0.77/32 added to
  ``spec.imageInspection.refusedNetworks``: refused networks are not connected to;
* a registry answering 404/500 with a marker in its error body.

Each pod is released by the fallback (``maxRetries`` 1) and the canaries received nothing;
no pod annotation or Event holds the marker. Only 127.0.0.0/8 addresses are used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.certs import generate_ca, issue_serving_cert
from podplacement.imageinspect import DEFAULT_REFUSED_NETWORKS
from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.sandbox.product import Product, start_product
from tests.harness.faults import FaultProxy
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import NO_STAND_DOWN, bind_edit, installed_cluster, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
MALLORY = {"Impersonate-User": "mallory"}
NS = "mallory"
MARKER = "QX7-remote-text-marker"
FAR = "127.0.0.77"


def _challenge(realm: str) -> dict[str, str]:
    return {"WWW-Authenticate": f'Bearer realm="{realm}",service="{MARKER}"'}


def _error_body() -> bytes:
    return json.dumps({"errors": [{"code": MARKER, "message": f"{MARKER} secret"}]}).encode()


class Doubles:
    """Mallory's registries and the canaries (fault proxies, stopped at module end)."""

    def __init__(self, registry: Registry, ca_file: Path) -> None:
        ca = generate_ca("tenant-network-ca")
        ca_file.write_bytes(ca.cert_pem)
        self.ca_file = ca_file
        grant = json.dumps({"token": "granted"}).encode()
        self.canary = FaultProxy("http://127.0.0.1:9")
        self.far = FaultProxy("http://127.0.0.1:9", bind=FAR)
        for c in (self.canary, self.far):
            c.add_rule(status=200, content_type="application/json", body=grant, times=0)
        serving = issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
        #: HTTPS, not insecure: its realm is plain HTTP to the canary, path and query its own.
        self.tls = FaultProxy("http://127.0.0.1:9", serving=serving)
        self.tls.add_rule(path_regex="^/v2/", status=401, times=0, body=_error_body(),
                          content_type="application/json",
                          headers=_challenge(f"http://{self.canary.host}/admin?x=1"))
        #: Plain HTTP, marked insecure: its realm names the far canary.
        self.plain = FaultProxy("http://127.0.0.1:9")
        self.plain.add_rule(path_regex="^/v2/realm/", status=401, times=0,
                            headers=_challenge(f"http://{self.far.host}/token"))
        self.plain.add_rule(path_regex="^/v2/missing/", status=404, times=0,
                            body=_error_body(), content_type="application/json")
        self.plain.add_rule(path_regex="^/v2/broken/", status=500, times=0,
                            body=_error_body(), content_type="application/json")
        #: The real registry, its blobs redirected to the far canary.
        self.redirecting = FaultProxy(registry)
        self.redirecting.add_rule(path_regex="/blobs/", redirect_to=self.far.url, times=0)
        self.all = (self.canary, self.far, self.tls, self.plain, self.redirecting)

    def stop(self) -> None:
        for proxy in self.all:
            proxy.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "network")


@pytest.fixture(scope="module")
def doubles(registry: Registry, make_pusher: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doubles]:
    # single platform: the platform is in the config blob, fetched through the redirect
    make_pusher(registry).image("network/single", "v1", architecture="arm64")
    d = Doubles(registry, tmp_path_factory.mktemp("network-ca") / "ca.pem")
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry, doubles: Doubles,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    assert cluster.plane is not None
    options = ["--insecure-registry", registry.host,
               "--insecure-registry", doubles.plain.host,
               "--insecure-registry", doubles.redirecting.host,
               "--ca-file", f"{doubles.tls.host}={doubles.ca_file}"]
    prod = start_product(cluster.plane, tmp_path_factory.mktemp("product"),
                         controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


@pytest.fixture(scope="module")
def ns(cluster: KubeEnv, product: Product) -> str:
    """mallory's namespace (``edit``); the config refuses 127.0.0.77 too and gives up an
    image after one retry."""
    cluster.ensure_namespace(NS)
    bind_edit(cluster, NS)
    patched = cluster.patch(CONFIG, {"spec": {"imageInspection": {
        "maxRetries": 1, "refusedNetworks": [*DEFAULT_REFUSED_NETWORKS, f"{FAR}/32"]}}})
    generation = patched["metadata"]["generation"]

    def observed() -> bool:
        status = cluster.get(CONFIG).get("status") or {}
        return int(status.get("observedGeneration") or 0) >= generation

    wait_for(observed, 30, every=0.2)

    def mallory_may_create() -> bool:  # RBAC is read by the API server at once
        r = cluster.request("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All",
                            json=_pod("probe", "busybox"), headers=MALLORY)
        return r.status_code == 201

    wait_for(mallory_may_create, 20, every=0.5)
    return NS


def _pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0}}


def _released(cluster: KubeEnv, name: str, image: str) -> tuple[dict[str, Any], list[str]]:
    """mallory creates the pod; returns it once the product released it (the fallback,
    after the one retry) and the messages of its Events."""
    r = cluster.request("POST", f"/api/v1/namespaces/{NS}/pods", json=_pod(name, image),
                        headers=MALLORY)
    assert r.status_code == 201, r.text
    path = f"/api/v1/namespaces/{NS}/pods/{name}"

    def ungated() -> dict[str, Any] | None:
        pod = cluster.get(path)
        gates = pod["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else pod

    pod = dict(wait_for(ungated, 60, every=0.2))
    events = cluster.request(
        "GET", f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name={name}")
    return pod, [e.get("message") or "" for e in events.json().get("items") or []]


def _no_remote_text(pod: dict[str, Any], messages: list[str]) -> None:
    annotations = pod["metadata"].get("annotations") or {}
    record = annotations.get(DECISION_ANNOTATION, "")
    assert record, "released without a decision record"
    assert MARKER not in json.dumps(annotations), annotations
    for message in messages:
        assert MARKER not in message, message
    assert MARKER not in json.dumps(pod.get("status") or {})


def test_a_plain_http_realm_of_a_tls_registry_reaches_nothing(
        cluster: KubeEnv, ns: str, doubles: Doubles) -> None:
    pod, messages = _released(cluster, "realm-http", f"{doubles.tls.host}/a/app:v1")
    assert doubles.tls.count("GET", "^/v2/") >= 1, "the registry was never asked"
    assert doubles.canary.seen == [], [r.target for r in doubles.canary.seen]
    _no_remote_text(pod, messages)
    assert any("token realm refused: plain HTTP" in m for m in messages), messages


def test_a_realm_in_a_refused_network_reaches_nothing(
        cluster: KubeEnv, ns: str, doubles: Doubles) -> None:
    pod, messages = _released(cluster, "realm-far", f"{doubles.plain.host}/realm/app:v1")
    assert doubles.plain.count("GET", "^/v2/realm/") >= 1
    assert doubles.far.seen == [], [r.target for r in doubles.far.seen]
    assert FAR not in json.dumps(pod["metadata"].get("annotations") or {})
    _no_remote_text(pod, messages)


def test_a_blob_redirect_into_a_refused_network_reaches_nothing(
        cluster: KubeEnv, ns: str, doubles: Doubles) -> None:
    pod, messages = _released(cluster, "redirect-far",
                              f"{doubles.redirecting.host}/network/single:v1")
    assert doubles.redirecting.count("GET", "/blobs/") >= 1, "no blob was asked for"
    assert doubles.far.seen == [], [r.target for r in doubles.far.seen]
    _no_remote_text(pod, messages)


@pytest.mark.parametrize("repository", ["missing", "broken"])
def test_the_registrys_error_text_is_in_no_annotation_or_event(
        cluster: KubeEnv, ns: str, doubles: Doubles, repository: str) -> None:
    pod, messages = _released(cluster, f"error-{repository}",
                              f"{doubles.plain.host}/{repository}/app:v1")
    assert messages, "no Event"
    _no_remote_text(pod, messages)
    status = "HTTP 404" if repository == "missing" else "HTTP 500"
    assert any(status in m for m in messages), messages


def test_the_crd_refuses_a_refused_network_that_is_not_one(cluster: KubeEnv, ns: str) -> None:
    """The CRD's rule (CEL ``isCIDR``/``isIP``) refuses a malformed item at the API."""
    r = cluster.request("PATCH", CONFIG, json={"spec": {"imageInspection": {
        "refusedNetworks": ["169.254.0.0/16", "10.0.0.0/33"]}}}, content_type="merge")
    assert r.status_code == 422, r.text
    assert "refusedNetworks" in r.text
