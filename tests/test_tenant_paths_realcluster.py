"""No path from tenant input to a URL: a pod's ``imagePullSecrets`` name never reaches an
API path unchecked (docs/design.md, "Rules that are easy to get wrong"; client-go
``IsValidPathSegmentName``), on the real control plane v1.36.2 with podplacement installed
from deploy/ as shipped and the apiserver's audit log on.

Namespace ``team-b`` holds the Secret ``regcred`` that opens a private image (s390x only) on
the harness's Basic-auth registry. A user ``mallory`` with the built-in ClusterRole ``edit``
in ``team-a`` creates pods of that image whose ``imagePullSecrets`` name is each traversal
form pointing at team-b's Secret (the API server accepts every one). None is placed with the
private image's platform (each ends with the fallback: ``kubernetes.io/arch In [amd64]``), the
controller warns on each pod (``InvalidPullSecret``), and the audit log shows that no
component of the product ever asked for anything in team-b.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.rules.config import SCHEDULING_GATE
from podplacement.sandbox.product import Product, install_manifests, start_product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import NO_STAND_DOWN, REPO, bind_edit, real_cluster, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
PRODUCT_USERS = "system:serviceaccount:podplacement-system:"
MALLORY = {"Impersonate-User": "mallory"}
TENANT, VICTIM = "team-a", "team-b"

#: Each form names team-b's Secret from a pod in team-a.
TRAVERSALS = [
    "../../team-b/secrets/regcred",
    "%2e%2e/%2e%2e/team-b/secrets/regcred",
    "..%2f..%2fteam-b%2fsecrets%2fregcred",
    "x/../../../team-b/secrets/regcred",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    plane = real_cluster(tmp_path_factory, "tenantpaths", audit=True)
    env = next(plane)
    try:
        assert env.plane is not None
        install_manifests(env.plane, REPO / "deploy")
        yield env
    finally:
        plane.close()


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, basic_registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    assert cluster.plane is not None and basic_registry.ca_pem is not None
    work = tmp_path_factory.mktemp("product")
    ca = work / "registry-ca.pem"
    ca.write_bytes(basic_registry.ca_pem)
    options = ["--ca-file", f"{basic_registry.host}={ca}"]
    prod = start_product(cluster.plane, work / "run",
                         controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


@pytest.fixture(scope="module")
def private(basic_registry: Registry, make_pusher: Any) -> str:
    """An s390x-only image only team-b's Secret opens."""
    make_pusher(basic_registry).image("tenant/private", "v1", architecture="s390x")
    return f"{basic_registry.host}/tenant/private:v1"


@pytest.fixture(scope="module")
def namespaces(cluster: KubeEnv, product: Product, basic_registry: Registry) -> None:
    """team-b with its pull Secret; team-a where mallory may ``edit``; a config that falls
    back at once (no retries) to amd64."""
    cluster.ensure_namespace(VICTIM)
    auth = base64.b64encode(f"{basic_registry.username}:{basic_registry.password}".encode())
    config = json.dumps({"auths": {basic_registry.host: {"auth": auth.decode()}}}).encode()
    cluster.create(f"/api/v1/namespaces/{VICTIM}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()}})
    cluster.ensure_namespace(TENANT)
    bind_edit(cluster, TENANT)
    cluster.patch(CONFIG, {"spec": {"fallbackArchitecture": "amd64",
                                    "imageInspection": {"maxRetries": 0}}})
    time.sleep(1.0)  # the webhook's and the controller's config watches

    def mallory_may_create() -> bool:  # RBAC is read by the API server at once
        r = cluster.request("POST", f"/api/v1/namespaces/{TENANT}/pods?dryRun=All",
                            json=_pod("probe", "busybox", "probe"), headers=MALLORY)
        return r.status_code == 201

    wait_for(mallory_may_create, 20, every=0.5)


def _pod(name: str, image: str, secret: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "imagePullSecrets": [{"name": secret}],
                     "terminationGracePeriodSeconds": 0}}


def _required_archs(pod: dict[str, Any]) -> set[str]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms") or []
    return {v for t in terms for e in t.get("matchExpressions") or []
            if e["key"] == "kubernetes.io/arch" for v in e["values"]}


def _settled(cluster: KubeEnv, name: str, within: float) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{TENANT}/pods/{name}"

    def ungated() -> dict[str, Any] | None:
        pod = cluster.get(path)
        gates = pod["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else pod

    return dict(wait_for(ungated, within, every=0.25))


def _audit(cluster: KubeEnv) -> list[dict[str, Any]]:
    """Every audit event so far (the batch backend flushes each second: wait for it)."""
    assert cluster.plane is not None and cluster.plane.audit_log is not None
    time.sleep(2.5)
    log = cluster.plane.audit_log
    return [json.loads(line) for path in sorted(log.parent.glob(log.name + "*"))
            for line in path.read_text().splitlines()]


def _warnings(cluster: KubeEnv, name: str) -> list[str]:
    events = cluster.get(f"/api/v1/namespaces/{TENANT}/events")["items"]
    return [str(e.get("message")) for e in events
            if e.get("reason") == "InvalidPullSecret"
            and (e.get("involvedObject") or {}).get("name") == name]


def test_a_pull_secret_name_never_reaches_another_namespace(
        cluster: KubeEnv, namespaces: None, private: str) -> None:
    names = [f"traversal-{i}" for i in range(len(TRAVERSALS))]
    for name, secret in zip(names, TRAVERSALS, strict=True):
        r = cluster.request("POST", f"/api/v1/namespaces/{TENANT}/pods",
                            json=_pod(name, private, secret), headers=MALLORY)
        assert r.status_code == 201, r.text  # the API server does not check these names
    placed = {name: _required_archs(_settled(cluster, name, 60)) for name in names}
    # never the private image's platform: the fallback, as for any image nobody can read
    assert placed == {name: {"amd64"} for name in names}
    for name in names:
        warned = wait_for(lambda n=name: _warnings(cluster, n), 10)  # type: ignore[misc]
        assert "is unusable and was skipped: Secret name" in warned[0], warned
    # no component of ours asked the API server for anything of team-b
    reads = [(e["user"]["username"], e["verb"], e.get("requestURI"))
             for e in _audit(cluster)
             if e["user"]["username"].startswith(PRODUCT_USERS)
             and ((e.get("objectRef") or {}).get("namespace") == VICTIM
                  or VICTIM in str(e.get("requestURI")))]
    assert reads == []


def test_the_same_pods_image_is_placed_with_a_valid_secret_of_its_own(
        cluster: KubeEnv, namespaces: None, private: str) -> None:
    """The control: with a Secret of team-a's own, the private image's platform is placed
    (so the test above fails for the reason it names, not for an unreadable image)."""
    secret = cluster.get(f"/api/v1/namespaces/{VICTIM}/secrets/regcred")
    cluster.create(f"/api/v1/namespaces/{TENANT}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "own"},
        "type": secret["type"], "data": secret["data"]})
    r = cluster.request("POST", f"/api/v1/namespaces/{TENANT}/pods",
                        json=_pod("own-secret", private, "own"), headers=MALLORY)
    assert r.status_code == 201, r.text
    assert _required_archs(_settled(cluster, "own-secret", 60)) == {"s390x"}
