"""Inspector against registries that misbehave, through the FaultProxy (tests/harness/faults):
rate limits, 5xx, stalls, bad bodies and content types, digest mismatches, oversize documents,
schema 1, and blob redirects to another host."""

from __future__ import annotations

import json

import pytest

from podplacement.imageinspect import (
    Denied,
    DigestMismatch,
    Inspector,
    InvalidManifest,
    Platform,
    RateLimited,
    ServerError,
    Timeout,
    TooLarge,
    credentials_from_docker_config,
)
from podplacement.imageinspect._manifest import DOCKER_SCHEMA1_SIGNED, OCI_MANIFEST
from tests.harness.faults import FaultProxy
from tests.harness.oci import Pusher
from tests.harness.registry import Registry
from tests.imageinspect.conftest import InspectorFactory, insecure, trust

MANIFESTS = r"/manifests/"


@pytest.fixture(scope="module")
def images(registry: Registry, pusher: object) -> dict[str, object]:
    p: Pusher = pusher(registry)  # type: ignore[operator]
    big_config = json.dumps(
        {"os": "linux", "architecture": "amd64", "pad": "x" * (9 * 1024 * 1024)}
    ).encode()
    cfg = p.blob("ff/bigcfg", big_config)
    layer = p.blob("ff/bigcfg", b"layer")

    def manifest(declared: int) -> bytes:
        return json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": cfg.digest,
                    "size": declared,
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer.digest,
                        "size": layer.size,
                    }
                ],
            }
        ).encode()

    return {
        "index": p.multiarch("ff/app", "v1", ["linux/amd64", "linux/arm64"]),
        "single": p.image("ff/single", "v1", architecture="arm64"),
        "other": p.image("ff/other", "v1", architecture="s390x"),
        "declared_big": p.raw_manifest("ff/bigcfg", "declared", manifest(cfg.size), OCI_MANIFEST),
        "lying_small": p.raw_manifest("ff/bigcfg", "lying", manifest(100), OCI_MANIFEST),
    }


@pytest.fixture
def proxy(registry: Registry, fault_proxy: object, images: dict[str, object]) -> FaultProxy:
    return fault_proxy(registry)  # type: ignore[operator]


async def _inspector(
    make_inspector: InspectorFactory, proxy: FaultProxy, **kw: object
) -> tuple[Inspector, list[float]]:
    """An inspector allowed to use the proxy's plain HTTP, recording backoff delays instead
    of sleeping."""
    insp = await make_inspector(registries=insecure(proxy.host), **kw)
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    insp._sleep = record
    return insp, delays


async def test_429_with_retry_after_is_retried_after_that_delay(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, delays = await _inspector(make_inspector, proxy, retries=2)
    proxy.add_rule(path_regex=MANIFESTS, status=429, headers={"Retry-After": "7"}, times=2)
    info = await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert [str(p) for p in info.platforms] == ["linux/amd64", "linux/arm64"]
    assert delays == [7.0, 7.0]
    assert proxy.count("GET", MANIFESTS) == 3


async def test_persistent_429_raises_rate_limited_with_retry_after(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, _delays = await _inspector(make_inspector, proxy, retries=1)
    proxy.add_rule(path_regex=MANIFESTS, status=429, headers={"Retry-After": "2"}, times=0)
    with pytest.raises(RateLimited) as info:
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert info.value.status == 429 and info.value.retry_after == 2.0
    assert info.value.registry == proxy.host
    assert proxy.count("GET", MANIFESTS) == 2


async def test_too_long_retry_after_is_not_waited_for(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, delays = await _inspector(make_inspector, proxy, retries=3)
    proxy.add_rule(path_regex=MANIFESTS, status=429, headers={"Retry-After": "3600"}, times=0)
    with pytest.raises(RateLimited):
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert delays == []
    assert proxy.count("GET", MANIFESTS) == 1


async def test_503_is_retried_with_backoff(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, delays = await _inspector(make_inspector, proxy, retries=3)
    proxy.add_rule(path_regex=MANIFESTS, status=503, times=2)
    info = await insp.inspect(f"{proxy.host}/ff/single:v1")
    assert info.platforms == (Platform("linux", "arm64"),)
    assert len(delays) == 2
    assert delays[1] > delays[0] * 0.9  # exponential: the second waits longer or equal
    assert insp.stats.retries == 2


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_other_5xx_is_the_callers_to_retry(
    status: int, proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    """502/504 go back to the caller at once (the controller's queue retries the pod)."""
    insp, _delays = await _inspector(make_inspector, proxy, retries=3)
    proxy.add_rule(
        path_regex=MANIFESTS,
        status=status,
        times=0,
        content_type="application/json",
        body=b'{"errors":[{"code":"UNKNOWN","message":"disk on fire"}]}',
    )
    with pytest.raises(ServerError) as info:
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    # The status is reported; the registry's error text is not (it is remote text).
    assert info.value.status == status and "disk on fire" not in str(info.value)
    assert proxy.count("GET", MANIFESTS) == 1


async def test_403_is_denied(proxy: FaultProxy, make_inspector: InspectorFactory) -> None:
    insp, _delays = await _inspector(make_inspector, proxy)
    proxy.add_rule(path_regex=MANIFESTS, status=403, times=0)
    with pytest.raises(Denied) as info:
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert info.value.status == 403


async def test_stalled_registry_times_out(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, _delays = await _inspector(make_inspector, proxy, timeout=0.5)
    proxy.add_rule(path_regex=MANIFESTS, delay=5.0, times=0)
    with pytest.raises(Timeout) as info:
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert info.value.registry == proxy.host


async def test_malformed_json_is_invalid_manifest(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, _delays = await _inspector(make_inspector, proxy)
    proxy.add_rule(path_regex=MANIFESTS, replace_body=b'{"schemaVersion": 2, "manif', times=0)
    with pytest.raises(InvalidManifest, match="not valid JSON") as info:
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert type(info.value) is InvalidManifest


async def test_wrong_content_type_is_invalid_manifest(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, _delays = await _inspector(make_inspector, proxy)
    proxy.add_rule(path_regex=MANIFESTS, content_type="text/html", times=0)
    with pytest.raises(InvalidManifest, match="Content-Type is not") as info:
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert "text/html" not in str(info.value)


async def test_body_not_matching_the_digest_header_or_pinned_digest(
    proxy: FaultProxy, images: dict[str, object], make_inspector: InspectorFactory
) -> None:
    insp, _delays = await _inspector(make_inspector, proxy)
    index = images["index"]
    # A valid manifest, but not the one the registry's Docker-Content-Digest names.
    other = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [],
        }
    ).encode()
    proxy.add_rule(path_regex=MANIFESTS, replace_body=other, times=0)
    with pytest.raises(DigestMismatch, match="registry's header"):
        await insp.inspect(f"{proxy.host}/ff/app:v1")
    with pytest.raises(DigestMismatch, match="not the digest expected"):
        await insp.inspect(f"{proxy.host}/ff/app@{index.digest}")  # type: ignore[attr-defined]


async def test_oversize_manifest_is_too_large(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, _delays = await _inspector(make_inspector, proxy)
    big = b'{"schemaVersion": 2, "pad": "' + b"x" * (4 * 1024 * 1024) + b'"}'
    proxy.add_rule(path_regex=MANIFESTS, replace_body=big, times=0)
    with pytest.raises(TooLarge, match="1 MiB"):
        await insp.inspect(f"{proxy.host}/ff/app:v1")


async def test_config_over_8_mib_is_too_large(
    registry: Registry, images: dict[str, object], make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(registries=insecure(registry.host))
    await insp.inspect(f"{registry.host}/ff/single:v1")  # settle the scheme probe
    before = insp.stats.requests
    with pytest.raises(TooLarge, match="config"):
        await insp.inspect(f"{registry.host}/ff/bigcfg:declared")
    assert insp.stats.requests - before == 1  # the declared size stops it before the blob GET
    # A manifest that understates the size is caught while reading the blob.
    with pytest.raises(TooLarge, match="8 MiB"):
        await insp.inspect(f"{registry.host}/ff/bigcfg:lying")


async def test_schema1_manifest_uses_top_level_architecture(
    proxy: FaultProxy, make_inspector: InspectorFactory
) -> None:
    insp, _delays = await _inspector(make_inspector, proxy)
    schema1 = json.dumps(
        {
            "schemaVersion": 1,
            "name": "ff/app",
            "tag": "v1",
            "architecture": "arm",
            "fsLayers": [],
            "history": [{"v1Compatibility": json.dumps({"os": "linux"})}],
            "signatures": [],
        }
    ).encode()
    proxy.add_rule(
        path_regex=MANIFESTS, replace_body=schema1, content_type=DOCKER_SCHEMA1_SIGNED, times=0
    )
    info = await insp.inspect(f"{proxy.host}/ff/app:v1")
    assert info.media_type == DOCKER_SCHEMA1_SIGNED
    assert info.platforms == (Platform("linux", "arm"),)


async def test_blob_redirect_to_another_host_gets_no_credentials(
    basic_registry: Registry,
    registry: Registry,
    pusher: object,
    fault_proxy: object,
    make_inspector: InspectorFactory,
) -> None:
    # The same image in both registries: the private one redirects its blob GETs to
    # "storage" (the plain registry seen as http://localhost:PORT), a different origin.
    for reg in (basic_registry, registry):
        pusher(reg).image("ff/redirected", "v1", architecture="mips64le")  # type: ignore[operator]
    front: FaultProxy = fault_proxy(basic_registry)  # type: ignore[operator]
    storage: FaultProxy = fault_proxy(registry, advertise="localhost")  # type: ignore[operator]
    front.add_rule(path_regex=r"/blobs/", redirect_to=storage.url, times=0)
    creds = credentials_from_docker_config(
        {
            "auths": {
                front.host: {
                    "username": basic_registry.username,
                    "password": basic_registry.password,
                }
            }
        }
    )
    insp = await make_inspector(registries=insecure(front.host), ca_bundles=trust(basic_registry))
    info = await insp.inspect(f"{front.host}/ff/redirected:v1", creds)
    assert info.platforms == (Platform("linux", "mips64le"),)
    manifest_gets = [s for s in front.seen if "/manifests/" in s.path and s.status == 200]
    assert manifest_gets and all("authorization" in s.headers for s in manifest_gets)
    blob_gets = [s for s in storage.seen if "/blobs/" in s.path]
    assert blob_gets and all("authorization" not in s.headers for s in blob_gets)
