"""Kubelet credential providers in the controller, on the real control plane v1.36.2 with
podplacement installed from deploy/ (plus the credential-providers overlay's token-mode
RBAC) and the real Basic-auth registry (docs/pools/credential-providers.md).

The suite's own plugins speak the exec protocol (``credentialprovider.kubelet.k8s.io/v1``)
and log every request they get:

* ``shared-provider`` matches ``<registry>/shared`` and answers the registry's login with
  ``cacheKeyType: Registry`` for an hour: two pods of two images of that registry, without
  any pull secret, are placed on their images' platforms (not the fallback) after ONE run;
* ``bound-provider`` (ServiceAccount-token mode, audience ``registry.test``) matches
  ``<registry>/bound`` and answers the login only for a token whose subject is team-a's
  ServiceAccount ``builder`` with that audience: team-a's pod is placed; team-b's pod of the
  same image with a ServiceAccount of the same name gets its own run, with its own token,
  no login, and the fallback (team-a's cached answer is not used for it).
"""

from __future__ import annotations

import json
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.sandbox.product import Product, start_product, wait_webhook_registered
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import NO_STAND_DOWN, installed_cluster, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

REPO = Path(__file__).resolve().parents[1]
CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
AUDIENCE = "registry.test"
TEAMS = ("team-a", "team-b")

PLUGIN = textwrap.dedent("""\
    #!{python}
    import base64, json, os, sys
    request = json.load(sys.stdin)
    token = request.get("serviceAccountToken", "")
    claims = {{}}
    if token:
        body = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    with open(os.environ["PLUGIN_LOG"], "a") as f:
        f.write(json.dumps({{"image": request["image"], "sub": claims.get("sub"),
                            "aud": claims.get("aud")}}) + "\\n")
    auth = {{os.environ["PLUGIN_HOST"]: {{"username": os.environ["PLUGIN_USER"],
                                          "password": os.environ["PLUGIN_PASSWORD"]}}}}
    wanted = os.environ.get("PLUGIN_REQUIRE_SUB")
    if wanted and not (claims.get("sub") == wanted
                       and os.environ["PLUGIN_AUDIENCE"] in (claims.get("aud") or [])):
        auth = {{}}
    json.dump({{"apiVersion": request["apiVersion"], "kind": "CredentialProviderResponse",
               "cacheKeyType": "Registry", "cacheDuration": "1h", "auth": auth}}, sys.stdout)
""")


class Plugins:
    """The bin directory, the config and the two plugins' request logs."""

    def __init__(self, work: Path, registry: Registry) -> None:
        self.bin = work / "bin"
        self.bin.mkdir()
        self.logs = {name: work / f"{name}.jsonl" for name in ("shared", "bound")}
        for name in self.logs:
            path = self.bin / f"{name}-provider"
            path.write_text(PLUGIN.format(python=sys.executable))
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        common = [{"name": "PLUGIN_HOST", "value": registry.host},
                  {"name": "PLUGIN_USER", "value": registry.username or ""},
                  {"name": "PLUGIN_PASSWORD", "value": registry.password or ""},
                  {"name": "PLUGIN_AUDIENCE", "value": AUDIENCE}]
        self.config = work / "config.yaml"
        self.config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig",
            "providers": [
                {"name": "shared-provider", "matchImages": [f"{registry.host}/shared"],
                 "defaultCacheDuration": "10m",
                 "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                 "env": [*common, {"name": "PLUGIN_LOG", "value": str(self.logs["shared"])}]},
                {"name": "bound-provider", "matchImages": [f"{registry.host}/bound"],
                 "defaultCacheDuration": "10m",
                 "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                 "tokenAttributes": {"serviceAccountTokenAudience": AUDIENCE,
                                     "requireServiceAccount": True},
                 "env": [*common, {"name": "PLUGIN_LOG", "value": str(self.logs["bound"])},
                         {"name": "PLUGIN_REQUIRE_SUB",
                          "value": "system:serviceaccount:team-a:builder"}]},
            ]}))

    def runs(self, name: str) -> list[dict[str, Any]]:
        log = self.logs[name]
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() \
            else []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "credprov")


@pytest.fixture(scope="module")
def images(basic_registry: Registry, make_pusher: Any) -> dict[str, str]:
    p = make_pusher(basic_registry)
    p.multiarch("shared/multi", "v1", ["linux/amd64", "linux/arm64/v8"])
    p.image("shared/single", "v1", architecture="s390x")
    p.image("bound/app", "v1", architecture="ppc64le")
    host = basic_registry.host
    return {"multi": f"{host}/shared/multi:v1", "single": f"{host}/shared/single:v1",
            "bound": f"{host}/bound/app:v1"}


@pytest.fixture(scope="module")
def plugins(basic_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Plugins:
    return Plugins(tmp_path_factory.mktemp("plugins"), basic_registry)


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, basic_registry: Registry, plugins: Plugins, images: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    """The product with the providers; the overlay's token-mode RBAC applied; team-a and
    team-b with a ServiceAccount ``builder`` each; ``maxRetries`` 1 (a quick fallback)."""
    assert cluster.plane is not None and basic_registry.ca_pem is not None
    rbac = REPO / "deploy" / "overlays" / "credential-providers" / "rbac.yaml"
    import yaml

    for doc in yaml.safe_load_all(rbac.read_text()):
        kind = "clusterroles" if doc["kind"] == "ClusterRole" else "clusterrolebindings"
        cluster.create(f"/apis/rbac.authorization.k8s.io/v1/{kind}", doc)
    for team in TEAMS:
        cluster.ensure_namespace(team)
        cluster.create(f"/api/v1/namespaces/{team}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "builder"}})
    work = tmp_path_factory.mktemp("product")
    ca = work / "registry-ca.pem"
    ca.write_bytes(basic_registry.ca_pem)
    options = ["--ca-file", f"{basic_registry.host}={ca}"]
    prod = start_product(cluster.plane, work / "run", controller_options=[
        *options, *NO_STAND_DOWN,
        "--image-credential-provider-config", str(plugins.config),
        "--image-credential-provider-bin-dir", str(plugins.bin)], webhook_options=options)
    try:
        wait_webhook_registered(prod)
        generation = cluster.patch(CONFIG, {"spec": {"imageInspection": {"maxRetries": 1}}})[
            "metadata"]["generation"]
        wait_for(lambda: int((cluster.get(CONFIG).get("status") or {}).get(
            "observedGeneration") or 0) >= generation, 30, every=0.2)
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


def _pod(name: str, image: str, account: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}],
                            "terminationGracePeriodSeconds": 0}
    if account:
        spec["serviceAccountName"] = account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _decided(cluster: KubeEnv, team: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Create the pod in ``team``; its decision record once the gate is gone."""
    name = pod["metadata"]["name"]
    cluster.create(f"/api/v1/namespaces/{team}/pods", pod)

    def ungated() -> dict[str, Any] | None:
        got = cluster.get(f"/api/v1/namespaces/{team}/pods/{name}")
        gates = got["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else got

    placed = wait_for(ungated, 60, every=0.2)
    record: dict[str, Any] = json.loads(placed["metadata"]["annotations"][DECISION_ANNOTATION])
    return record


def test_a_private_images_are_placed_with_one_plugin_run_per_registry(
        cluster: KubeEnv, product: Product, plugins: Plugins, images: dict[str, str]) -> None:
    multi = _decided(cluster, "team-a", _pod("multi", images["multi"]))
    single = _decided(cluster, "team-a", _pod("single", images["single"]))
    assert multi["result"] == "set" and sorted(multi["archs"]) == ["amd64", "arm64"], multi
    assert single["result"] == "set" and single["archs"] == ["s390x"], single
    runs = plugins.runs("shared")
    # cacheKeyType Registry, cacheDuration 1h: the second image's lookup is a cache hit
    assert [r["image"] for r in runs] == [images["multi"].rsplit(":", 1)[0]], runs
    assert runs[0]["sub"] is None  # not token mode: no token sent


def test_b_token_mode_credentials_serve_only_their_service_account(
        cluster: KubeEnv, product: Product, plugins: Plugins, images: dict[str, str]) -> None:
    mine = _decided(cluster, "team-a", _pod("bound", images["bound"], "builder"))
    assert mine["result"] == "set" and mine["archs"] == ["ppc64le"], mine
    theirs = _decided(cluster, "team-b", _pod("bound", images["bound"], "builder"))
    assert theirs.get("archs") != ["ppc64le"] or theirs["result"] != "set", theirs
    runs = plugins.runs("bound")
    assert [r["sub"] for r in runs] == ["system:serviceaccount:team-a:builder",
                                        "system:serviceaccount:team-b:builder"], runs
    assert all(AUDIENCE in (r["aud"] or []) for r in runs)
    # nothing of what the providers gave reached the catalog
    catalog = cluster.get("/apis/podplacement.io/v1beta1/namespaces/podplacement-system/"
                          "imageplatformcatalogs/cluster")
    text = json.dumps(catalog.get("spec") or {})
    for image in images.values():
        assert image.rsplit(":", 1)[0] not in text, image
