"""The webhook's endpoint is no oracle (docs/security.md), on the real control plane
v1.36.2 with podplacement installed from deploy/ (its RBAC as shipped) and the product's
webhook and controller running under their own ServiceAccounts.

Team-b keeps a private image (htpasswd registry, s390x only) and its pull secret.

(a) The webhook's ServiceAccount cannot read a Secret: a SubjectAccessReview says no for
    team-b's pull secret, and a GET impersonating the ServiceAccount gets 403, for that
    Secret and for the webhook CA's private key in the product's namespace.
(b) A caller who reaches the webhook's Service (HTTPS, the webhook's CA) and POSTs an
    AdmissionReview naming namespace team-b and a pod of team-b's private image with
    team-b's pull secret learns nothing of the image: no patch, no platform, no digest
    (twice: the second answer would come from the webhook's cache).
(c) A pod of that image created normally in team-b is still placed, by the controller
    (the decision has no ``path``), with the image's architecture, and not left gated.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podplacement.certs.secretflow import CA_SECRET_NAME
from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.sandbox.product import (
    NAMESPACE,
    WEBHOOK_SA,
    Product,
    start_product,
    wait_webhook_registered,
)
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import NO_STAND_DOWN, installed_cluster, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

TEAM = "team-b"
SECRET = "team-b-pull"
WEBHOOK_USER = f"system:serviceaccount:{NAMESPACE}:{WEBHOOK_SA}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "tenantwh")


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, basic_registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    """The webhook and one controller of this checkout, trusting the private registry's CA;
    afterwards, no RBAC denial in their logs (the webhook never asks for a Secret)."""
    assert cluster.plane is not None and basic_registry.ca_pem is not None
    work = tmp_path_factory.mktemp("product")
    ca = work / "registry-ca.pem"
    ca.write_bytes(basic_registry.ca_pem)
    options = ["--ca-file", f"{basic_registry.host}={ca}"]
    prod = start_product(cluster.plane, work / "run",
                         controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        wait_webhook_registered(prod)
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


@pytest.fixture(scope="module")
def private(cluster: KubeEnv, basic_registry: Registry, make_pusher: Any) -> tuple[str, str]:
    """(image, manifest digest) of team-b's private s390x image; team-b and its pull secret
    exist."""
    pushed = make_pusher(basic_registry).image("teamb/secret-app", "v1",
                                               architecture="s390x")
    cluster.ensure_namespace(TEAM)
    auth = base64.b64encode(f"{basic_registry.username}:{basic_registry.password}".encode())
    config = json.dumps({"auths": {basic_registry.host: {"auth": auth.decode()}}}).encode()
    cluster.create(f"/api/v1/namespaces/{TEAM}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()}})
    return f"{basic_registry.host}/teamb/secret-app:v1", pushed.digest


def _pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TEAM},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "imagePullSecrets": [{"name": SECRET}],
                     "terminationGracePeriodSeconds": 0}}


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in pod["spec"].get("schedulingGates") or [])


def test_a_the_webhooks_service_account_cannot_read_a_secret(
        cluster: KubeEnv, product: Product, private: tuple[str, str]) -> None:
    review = cluster.request("POST",
                             "/apis/authorization.k8s.io/v1/subjectaccessreviews", json={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": WEBHOOK_USER,
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                            "system:authenticated"],
                 "resourceAttributes": {"namespace": TEAM, "verb": "get",
                                        "resource": "secrets", "name": SECRET}}})
    review.raise_for_status()
    assert review.json()["status"].get("allowed") is not True
    as_webhook = {"Impersonate-User": WEBHOOK_USER}
    for path in (f"/api/v1/namespaces/{TEAM}/secrets/{SECRET}",
                 f"/api/v1/namespaces/{NAMESPACE}/secrets/{CA_SECRET_NAME}"):
        got = cluster.request("GET", path, headers=as_webhook)
        assert got.status_code == 403, (path, got.status_code)
    # the impersonation itself works: what the webhook may read, it reads
    allowed = cluster.request("GET", "/apis/podplacement.io/v1beta1/podplacementconfigs",
                              headers=as_webhook)
    assert allowed.status_code == 200


def _mutate(product: Product, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to the webhook's /mutate as any caller who reaches its Service would:
    HTTPS, verified with the webhook's CA, no client certificate."""
    ctx = ssl.create_default_context(cafile=str(product.cert_dir / "ca.crt"))
    r = httpx.post(f"https://127.0.0.1:{product.webhook_port}/mutate", json=body,
                   verify=ctx, timeout=10.0)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def _metric(product: Product, name: str, **labels: str) -> float:
    ctx = ssl.create_default_context(cafile=str(product.cert_dir / "ca.crt"))
    text = httpx.get(f"https://127.0.0.1:{product.webhook_port}/metrics", verify=ctx).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and want in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_b_a_forged_review_naming_team_b_learns_nothing_of_its_private_image(
        cluster: KubeEnv, product: Product, private: tuple[str, str]) -> None:
    image, digest = private
    wait_for(lambda: (cluster.get("/apis/podplacement.io/v1beta1/podplacementconfigs/cluster")
                      .get("status") or {}).get("admission"), 60)
    pod = _pod("oracle", image)
    pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    pod["metadata"]["labels"] = {"podplacement.io/scheduling-gate": "gated"}
    for attempt in range(2):  # the second would be answered from the webhook's cache
        uid = str(uuid.uuid4())
        answer = _mutate(product, {
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "CREATE", "namespace": TEAM,
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "userInfo": {"username": "mallory"}, "object": pod}})
        response = answer["response"]
        assert response["uid"] == uid and response["allowed"] is True
        assert "patch" not in response, base64.b64decode(response["patch"])
        text = json.dumps(answer)
        for secret in ("s390x", digest, digest.split(":", 1)[1][:16]):
            assert secret not in text, (attempt, secret)
    assert _metric(product, "podplacement_webhook_admissions_total",
                   path="gated-needs-credentials") >= 2
    assert _metric(product, "podplacement_webhook_admissions_total",
                   path="webhook-placed") == 0


def test_c_a_private_images_pod_is_placed_by_the_controller(
        cluster: KubeEnv, product: Product, private: tuple[str, str]) -> None:
    image, _ = private
    created = cluster.create(f"/api/v1/namespaces/{TEAM}/pods", _pod("real", image))
    assert _gated(created), "the webhook does not place a private image's pod"
    path = f"/api/v1/namespaces/{TEAM}/pods/real"

    def ungated() -> dict[str, Any] | None:
        pod = cluster.get(path)
        return None if _gated(pod) else pod

    placed = wait_for(ungated, 30)
    record = json.loads(placed["metadata"]["annotations"][DECISION_ANNOTATION])
    assert "path" not in record, record  # the controller's decision
    assert record["result"] == "set" and record["archs"] == ["s390x"]
    assert placed["metadata"]["labels"]["podplacement.io/scheduling-gate"] == "removed"
    # the controller read the Secret in team-b: its decision names no failed image
    assert not any(i.get("error") for i in record.get("images") or [])
