"""The webhook places the replicas of a private image, on the real kube-apiserver v1.36.2
(issue 14 items 3 and 6: "a private image's replicas are placed by the webhook").

The webhook runs in-process over TLS (uvicorn, :class:`webhook.server.WebhookServer`) with
its per-credential cache (:class:`webhook.placecache.PlaceCache`) reading pull Secrets from
the real API server and inspecting a private (htpasswd) image in a real registry. No
controller runs: the first pod is stored gated (and the cache fills in the background), the
second is stored placed by the webhook (no gate, arch affinity, ``"path":"webhook"``), and
the same pod in a namespace without the pull secret stays gated (a result learned with one
namespace's secret never answers another).
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


async def test_second_pod_of_a_private_image_is_placed_by_the_webhook(
        cluster: KubeEnv, basic_registry: Registry, cert_dir: Path, tmp_path: Path) -> None:
    assert basic_registry.ca_pem is not None
    with Pusher(basic_registry) as pusher:
        pusher.image("private/app", "v1", architecture="s390x")
    image = f"{basic_registry.host}/private/app:v1"

    certs = Path(shutil.copytree(cert_dir, tmp_path / "certs"))
    api = await KubeAPI.from_kubeconfig(str(cluster.kubeconfig))
    source = WatchingConfigSource(api, backoff_initial=0.05, backoff_max=0.5)
    inspector = Inspector(ca_bundles={basic_registry.host: basic_registry.ca_pem})
    cache = PlaceCache(api, inspector)
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

        first = await create(pods_a, _pod("first", image))
        assert _gates(first) == [SCHEDULING_GATE]
        await wait_until(lambda: len(cache) == 1, 30)
        await cache.idle()

        second = await call(cluster.create, pods_a, _pod("second", image))
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
        stored = await call(cluster.get, f"{pods_a}/second")
        assert SCHEDULING_GATE not in _gates(stored)

        # team-b has no pull secret of that name: another key, the pod stays gated.
        other = await call(cluster.create, "/api/v1/namespaces/team-b/pods",
                           _pod("other", image))
        assert _gates(other) == [SCHEDULING_GATE]
        await cache.idle()
        again = await call(cluster.create, "/api/v1/namespaces/team-b/pods",
                           _pod("again", image))
        assert _gates(again) == [SCHEDULING_GATE]  # anonymous inspection failed: not stored
        assert cache.stats.hits == 1  # only "second" was placed
    finally:
        await server.stop()
        await cache.aclose()
        await inspector.aclose()
        await api.close()
