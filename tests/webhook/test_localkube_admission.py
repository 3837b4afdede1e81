"""End to end with localkube's MutatingAdmissionWebhook: the webhook served over TLS by
uvicorn, registered with a url clientConfig and our caBundle, reading the PodPlacementConfig
from the same API server; pods created in localkube are stored gated and labelled."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from podplacement.certs import load_bundle, rotate_dir
from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import (
    API_VERSION,
    ARCH_LABEL,
    CONFIG_KIND,
    CONFIG_NAME,
    GATE_LABEL,
    SCHEDULING_GATE,
    WEBHOOK_CONFIGURATION_NAME,
    WEBHOOK_NAME,
)
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import CONFIG_LIST_PATH, WatchingConfigSource
from podplacement.webhook.server import WebhookServer
from tests.harness.kube import KubeEnv
from tests.webhook.waiting import wait_until

MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def call(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run a blocking localkube request off the event loop (the webhook runs on it)."""
    return asyncio.to_thread(fn, *args)


def mwc(port: int, bundle: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION_NAME},
        "webhooks": [{
            "name": WEBHOOK_NAME,
            "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate",
                             "caBundle": base64.b64encode(bundle).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            # Fail, not the deployed Ignore: a broken call must fail this test loudly.
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }],
    }


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


@dataclass
class Env:
    kube: KubeEnv
    server: WebhookServer
    certs: Path
    source: WatchingConfigSource


@pytest.fixture
async def webhook(fresh_localkube: KubeEnv, cert_dir: Path, tmp_path: Path) -> AsyncIterator[Env]:
    kube = fresh_localkube
    certs = Path(shutil.copytree(cert_dir, tmp_path / "certs"))
    api = await KubeAPI.from_kubeconfig(str(kube.kubeconfig))
    source = WatchingConfigSource(api, backoff_initial=0.05, backoff_max=0.5)
    app = create_app(source, own_namespace="podplacement-system")
    server = WebhookServer(app, cert_file=certs / "tls.crt", key_file=certs / "tls.key",
                           port=0, reload_interval=0.05, graceful_shutdown=0.5)
    await server.start()
    try:
        assert await source.wait_synced(10)
        await call(kube.create, MWC_PATH, mwc(server.port, load_bundle(certs)))
        await call(kube.ensure_namespace, "apps")
        yield Env(kube, server, certs, source)
    finally:
        await server.stop()
        await api.close()


async def enable_config(env: Env) -> None:
    await call(env.kube.create, CONFIG_LIST_PATH, {
        "apiVersion": API_VERSION, "kind": CONFIG_KIND, "metadata": {"name": CONFIG_NAME},
        "spec": {}})
    await wait_until(lambda: env.source.current is not None)


def is_gated(stored: dict[str, Any]) -> bool:
    gates = [g["name"] for g in stored["spec"].get("schedulingGates") or []]
    labels = stored["metadata"].get("labels") or {}
    return SCHEDULING_GATE in gates and labels.get(GATE_LABEL) == "gated"


async def test_pod_created_in_localkube_is_stored_gated_and_labelled(
    webhook: Env
) -> None:
    kube = webhook.kube
    # No PodPlacementConfig yet: nothing is gated.
    before = await call(kube.create, "/api/v1/namespaces/apps/pods", pod("before"))
    assert not is_gated(before)
    await enable_config(webhook)
    created = await call(kube.create, "/api/v1/namespaces/apps/pods", pod("plain"))
    assert is_gated(created)
    stored = await call(kube.get, "/api/v1/namespaces/apps/pods/plain")
    assert is_gated(stored)
    assert stored["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    # A pinned pod is gated too (its pin may not fit its images); skip rules still apply.
    pinned = await call(kube.create, "/api/v1/namespaces/apps/pods",
                        pod("pinned", nodeSelector={ARCH_LABEL: "amd64"}))
    assert is_gated(pinned)
    system = await call(kube.create, "/api/v1/namespaces/kube-system/pods", pod("sys"))
    assert not is_gated(system)
    # The config came from one list and the watch, never from a request per admission.
    assert kube.server is not None
    config_verbs = [r.verb for r in kube.server.requests if CONFIG_LIST_PATH in r.path]
    assert config_verbs.count("list") == webhook.source.lists == 1
    assert set(config_verbs) <= {"list", "watch", "create"}


async def test_server_dry_run_gets_the_gate_and_stores_nothing(
    webhook: Env
) -> None:
    kube = webhook.kube
    await enable_config(webhook)
    resp = await call(lambda: kube.request("POST", "/api/v1/namespaces/apps/pods",
                                           json=pod("dry"), params={"dryRun": "All"}))
    assert resp.status_code == 201
    assert is_gated(resp.json())
    missing = await call(lambda: kube.request("GET", "/api/v1/namespaces/apps/pods/dry"))
    assert missing.status_code == 404


async def test_ca_rotation_with_bundle_sync_fails_no_pod_create(
    webhook: Env
) -> None:
    kube, server, certs = webhook.kube, webhook.server, webhook.certs
    await enable_config(webhook)
    old_bundle = load_bundle(certs)
    created: list[dict[str, Any]] = []

    async def create(n: int) -> None:
        for i in range(n):
            created.append(await call(kube.create, "/api/v1/namespaces/apps/pods",
                                      pod(f"p-{len(created)}-{i}")))

    async def set_bundle(bundle: bytes) -> None:
        await call(kube.patch, f"{MWC_PATH}/{WEBHOOK_CONFIGURATION_NAME}",
                   [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle",
                     "value": base64.b64encode(bundle).decode()}], "json")

    await create(5)
    assert rotate_dir(certs, force=True).new_ca           # step 1: the new CA joins the bundle
    await set_bundle(load_bundle(certs))                  # ... and reaches the caller
    await create(5)
    assert rotate_dir(certs, overlap=dt.timedelta(0)).reissue_serving  # step 2: new serving
    await wait_until(lambda: server.reloader.reloads > 0)
    await create(5)
    # A bundle with only the new CA makes the caller open new connections: they must get the
    # reloaded chain (the old CA alone is refused; see test_tls_server).
    await set_bundle(load_bundle(certs)[len(old_bundle):])
    await create(5)
    assert len(created) == 20 and all(is_gated(p) for p in created)
