"""The webhook places the replicas of a public image from its cache of anonymous results, and
never a private image's pods, on the real kube-apiserver v1.36.2 (issue 14 items 3 and 6;
the webhook's endpoint is no oracle: docs/security.md).

The webhook runs in-process over TLS (uvicorn, :class:`webhook.server.WebhookServer`) with
its cache (:class:`webhook.placecache.PlaceCache`, anonymous inspections only, keyed by
image). No controller runs. A public image (plain registry): the first pod is stored gated
(the cache fills in the background), the second, in another namespace, is stored placed by
the webhook (no gate, arch affinity, ``"path":"webhook"``). A private (htpasswd) image with
its pull secret in the namespace: every pod stays gated, nothing is stored (the webhook
reads no Secret; the controller places those pods).
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.certs import load_bundle
from podplacement.imageinspect import Inspector
from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import (
    API_VERSION,
    ARCH_LABEL,
    CONFIG_KIND,
    CONFIG_NAME,
    DECISION_ANNOTATION,
    GATE_LABEL,
    SCHEDULING_GATE,
)
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import CONFIG_LIST_PATH, WatchingConfigSource
from podplacement.webhook.placecache import PlaceCache
from podplacement.webhook.server import WebhookServer
from tests.harness.kube import KubeEnv
from tests.harness.oci import Pusher
from tests.harness.realcluster import real_cluster
from tests.harness.registry import Registry
from tests.imageinspect.conftest import insecure
from tests.webhook.test_localkube_admission import MWC_PATH, call, mwc
from tests.webhook.waiting import wait_until

pytestmark = pytest.mark.realcluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from real_cluster(tmp_path_factory, "whplace", controller_manager=False)


def _pull_secret(registry: Registry) -> dict[str, Any]:
    auth = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    config = json.dumps({"auths": {registry.host: {"auth": auth}}}).encode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "private-pull"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()}}


def _pod(name: str, image: str, secret: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}]}
    if secret:
        spec["imagePullSecrets"] = [{"name": "private-pull"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


async def test_public_replicas_are_placed_by_the_webhook_private_ones_never(
        cluster: KubeEnv, registry: Registry, basic_registry: Registry, cert_dir: Path,
        tmp_path: Path) -> None:
    assert basic_registry.ca_pem is not None
    with Pusher(basic_registry) as pusher:
        pusher.image("private/app", "v1", architecture="s390x")
    with Pusher(registry) as pusher:
        pusher.image("public/app", "v1", architecture="s390x")
    private = f"{basic_registry.host}/private/app:v1"
    public = f"{registry.host}/public/app:v1"

    certs = Path(shutil.copytree(cert_dir, tmp_path / "certs"))
    api = await KubeAPI.from_kubeconfig(str(cluster.kubeconfig))
    source = WatchingConfigSource(api, backoff_initial=0.05, backoff_max=0.5)
    inspector = Inspector(registries=insecure(registry.host),
                          ca_bundles={basic_registry.host: basic_registry.ca_pem})
    cache = PlaceCache(inspector)
    app = create_app(source, own_namespace="podplacement-system", place_cache=cache)
    server = WebhookServer(app, cert_file=certs / "tls.crt", key_file=certs / "tls.key",
                           port=0, reload_interval=0.05, graceful_shutdown=0.5)
    await server.start()
    try:
        await call(cluster.create, CONFIG_LIST_PATH, {
            "apiVersion": API_VERSION, "kind": CONFIG_KIND, "metadata": {"name": CONFIG_NAME},
            "spec": {}})
        await wait_until(lambda: source.current is not None, 30)
        hook = mwc(server.port, load_bundle(certs))
        hook["webhooks"][0]["timeoutSeconds"] = 10
        await call(cluster.create, MWC_PATH, hook)
        for ns in ("team-a", "team-b"):
            await call(cluster.ensure_namespace, ns)
        await call(cluster.create, "/api/v1/namespaces/team-a/secrets",
                   _pull_secret(basic_registry))
        pods_a = "/api/v1/namespaces/team-a/pods"
        pods_b = "/api/v1/namespaces/team-b/pods"

        async def create(path: str, pod: dict[str, Any]) -> dict[str, Any]:
            # The webhook configuration reaches the admission plugin after a moment.
            created: dict[str, Any] = {}

            async def gated_or_placed() -> bool:
                nonlocal created
                created = await call(cluster.create, path, pod)
                labels = created["metadata"].get("labels") or {}
                if GATE_LABEL in labels:
                    return True
                await call(cluster.request, "DELETE", f"{path}/{pod['metadata']['name']}")
                await asyncio.sleep(0.2)
                return False

            for _ in range(50):
                if await gated_or_placed():
                    return created
            raise AssertionError("the webhook never answered")

        # public: the first pod gated, the cache fills; the next pod, of another namespace
        # and naming a pull secret, is placed from the same anonymous result
        first = await create(pods_a, _pod("first", public, secret=False))
        assert _gates(first) == [SCHEDULING_GATE]
        await wait_until(lambda: len(cache) == 1, 30)
        await cache.idle()
        second = await call(cluster.create, pods_b, _pod("second", public))
        assert SCHEDULING_GATE not in _gates(second)
        labels = second["metadata"]["labels"]
        assert labels[GATE_LABEL] == "removed"
        assert labels["podplacement.io/node-affinity"] == "set"
        record = json.loads(second["metadata"]["annotations"][DECISION_ANNOTATION])
        assert record["path"] == "webhook" and record["result"] == "set"
        assert record["archs"] == ["s390x"]
        terms = second["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": ARCH_LABEL, "operator": "In", "values": ["s390x"]} in terms[0][
            "matchExpressions"]
        stored = await call(cluster.get, f"{pods_b}/second")
        assert SCHEDULING_GATE not in _gates(stored)

        # private, with its pull secret in team-a: never placed by the webhook, nothing
        # stored (its anonymous inspection is refused); the controller's to place
        for name in ("priv-1", "priv-2"):
            pod = await call(cluster.create, pods_a, _pod(name, private))
            assert _gates(pod) == [SCHEDULING_GATE]
            assert DECISION_ANNOTATION not in (pod["metadata"].get("annotations") or {})
            await cache.idle()
        assert len(cache) == 1 and cache.stats.hits == 1  # only "second" was placed
    finally:
        await server.stop()
        await cache.aclose()
        await inspector.aclose()
        await api.close()
