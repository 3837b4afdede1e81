"""webhook.configsource: the static file source, and list+watch of the PodPlacementConfig
``cluster`` against localkube (resume, 410 relist, backoff on errors, the last good config
kept when one does not parse)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import API_VERSION, CONFIG_KIND, CONFIG_NAME, ConfigError
from podplacement.webhook.configsource import (
    CONFIG_LIST_PATH,
    StaticConfigSource,
    WatchingConfigSource,
)
from tests.harness.kube import KubeEnv, start_localkube
from tests.webhook.waiting import wait_until


def config_object(weight: int = 50) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": CONFIG_KIND,
        "metadata": {"name": CONFIG_NAME},
        "spec": {"plugins": {"nodeAffinityScoring": {
            "enabled": True, "platforms": [{"architecture": "arm64", "weight": weight}]}}},
    }


def test_static_source_reads_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_object(7)))
    source = StaticConfigSource.from_file(path)
    assert source.synced
    assert source.current is not None
    assert source.current.preferred_platforms[0].weight == 7


def test_static_source_empty_file_means_no_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("")
    assert StaticConfigSource.from_file(path).current is None


def test_static_source_rejects_another_kind(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"kind": "ConfigMap", "metadata": {"name": "x"}}))
    with pytest.raises(ConfigError, match="kind"):
        StaticConfigSource.from_file(path)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeEnv]:
    """A localkube for this test, with bookmarks rare and a short watch history, so a
    resumed watch can fall out of the history (410)."""
    server, env = start_localkube(tmp_path, bookmark_interval=3600, history_size=5)
    try:
        yield env
    finally:
        env.close()
        server.stop()


@pytest.fixture
async def api(kube: KubeEnv) -> AsyncIterator[KubeAPI]:
    client = await KubeAPI.from_kubeconfig(str(kube.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def source(api: KubeAPI) -> AsyncIterator[WatchingConfigSource]:
    src = WatchingConfigSource(api, backoff_initial=0.05, backoff_max=0.2, watch_timeout=2)
    await src.start()
    try:
        yield src
    finally:
        await src.stop()


def call(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run a blocking localkube request off the event loop."""
    return asyncio.to_thread(fn, *args)


async def test_absent_config_is_synced_as_none(source: WatchingConfigSource) -> None:
    assert await source.wait_synced(10)
    assert source.current is None


async def test_create_update_delete_are_followed_without_relisting(
    kube: KubeEnv, source: WatchingConfigSource
) -> None:
    assert await source.wait_synced(10)
    await call(kube.create, CONFIG_LIST_PATH, config_object(10))
    await wait_until(lambda: source.current is not None)
    await call(kube.patch, f"{CONFIG_LIST_PATH}/{CONFIG_NAME}",
               {"spec": {"plugins": {"nodeAffinityScoring": {
                   "enabled": True, "platforms": [{"architecture": "arm64", "weight": 90}]}}}})
    await wait_until(lambda: source.current is not None
                     and source.current.preferred_platforms[0].weight == 90)
    await call(kube.delete, f"{CONFIG_LIST_PATH}/{CONFIG_NAME}")
    await wait_until(lambda: source.current is None)
    assert source.lists == 1


async def test_existing_config_is_read_by_the_first_list(kube: KubeEnv, api: KubeAPI) -> None:
    await call(kube.create, CONFIG_LIST_PATH, config_object(33))
    src = WatchingConfigSource(api)
    await src.start()
    try:
        assert await src.wait_synced(10)
        assert src.current is not None
        assert src.current.preferred_platforms[0].weight == 33
    finally:
        await src.stop()


async def test_expired_resource_version_triggers_a_relist(
    kube: KubeEnv, source: WatchingConfigSource, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="podplacement.kubeclient.informer")
    assert await source.wait_synced(10)
    # Writes elsewhere push the watch's resourceVersion out of the 5-event history; the
    # next resume (after the 2 s watch timeout) gets 410 and must relist.
    for i in range(12):
        await call(kube.ensure_namespace, f"churn-{i}")
    await wait_until(lambda: source.lists >= 2, seconds=15)
    assert "resourceVersion too old, relisting" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    await call(kube.create, CONFIG_LIST_PATH, config_object(21))
    await wait_until(lambda: source.current is not None)


async def test_server_errors_are_retried_with_backoff(kube: KubeEnv, api: KubeAPI) -> None:
    assert kube.server is not None
    kube.server.inject_fault(500, 3, method="GET", plural="podplacementconfigs",
                             reason="InternalError", message="injected")
    src = WatchingConfigSource(api, backoff_initial=0.05, backoff_max=0.1)
    await src.start()
    try:
        assert await src.wait_synced(10)
        assert api.counters[("list", 500)] == 3 and api.counters[("list", 200)] == 1
        assert src.lists == 1
    finally:
        await src.stop()


async def test_unusable_config_keeps_the_last_good_one(
    kube: KubeEnv, source: WatchingConfigSource, caplog: pytest.LogCaptureFixture
) -> None:
    assert await source.wait_synced(10)
    await call(kube.create, CONFIG_LIST_PATH, config_object(44))
    await wait_until(lambda: source.current is not None)
    # What the CRD's validation should never let through (a stale CRD might).
    source._apply({**config_object(), "kind": "ConfigMap"})
    assert "ignoring unusable PodPlacementConfig" in caplog.text
    assert source.current is not None and source.current.preferred_platforms[0].weight == 44


async def test_in_cluster_credentials_reread_the_rotating_token(
    tmp_path: Path, cert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.aio.config import incluster_config

    (tmp_path / "ca.crt").write_bytes((cert_dir / "ca.crt").read_bytes())
    (tmp_path / "token").write_text("first")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    # no ~/.kube/config either: in-cluster
    monkeypatch.setattr("kubernetes.aio.config.KUBE_CONFIG_DEFAULT_LOCATION",
                        str(tmp_path / "no-kubeconfig"))
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    api = await KubeAPI.from_kubeconfig()
    assert api.base_url == "https://[fd00::1]:6443"
    assert api.credentials is not None
    assert await api.credentials.authorization() == "bearer first"
    # A 401 reloads the configuration: the rotated token is read again.
    (tmp_path / "token").write_text("second")
    assert await api.credentials.refresh("bearer first") == "bearer second"


async def test_kubeconfig_token_becomes_a_bearer_header(kube: KubeEnv) -> None:
    token = yaml.safe_load(kube.kubeconfig.read_text())["users"][0]["user"]["token"]
    api = await KubeAPI.from_kubeconfig(str(kube.kubeconfig))
    assert api.base_url == kube.url
    assert api.credentials is not None
    assert await api.credentials.authorization() == f"Bearer {token}"
