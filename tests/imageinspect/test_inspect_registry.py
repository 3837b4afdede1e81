"""Inspector against the real registry (plain HTTP and TLS): manifest kinds, platforms,
digests, request counts, cache behaviour, mirrors and blocked registries."""

from __future__ import annotations

import asyncio
import json

import pytest

from podplacement.imageinspect import (
    Blocked,
    ConnectionFailed,
    InvalidReference,
    NotFound,
    Platform,
    RegistriesConfig,
    UnsafeAddress,
)
from podplacement.imageinspect._manifest import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
)
from tests.harness.oci import Pusher
from tests.harness.registry import Registry
from tests.imageinspect.conftest import InspectorFactory, insecure, trust

PLATFORMS = ["linux/amd64", "linux/arm64/v8", "linux/arm/v7", "windows/amd64"]


@pytest.fixture(scope="module")
def plain(registry: Registry, pusher: object) -> dict[str, object]:
    """Images pushed once to the plain registry."""
    p: Pusher = pusher(registry)  # type: ignore[operator]
    return {
        "oci_index": p.multiarch("ii/multi", "oci", PLATFORMS, fmt="oci", attestations=True),
        "docker_list": p.multiarch(
            "ii/multi", "docker", ["linux/amd64", "linux/s390x"], fmt="docker"
        ),
        "docker_single": p.image("ii/single", "docker", architecture="ppc64le", fmt="docker"),
        "oci_single": p.image("ii/single", "oci", architecture="arm64", variant="v8", fmt="oci"),
        "warmup": p.image("ii/warmup", "v1"),
    }


async def _warm(insp: object, registry: Registry) -> None:
    """Settle the insecure scheme probe so request counts below are per image."""
    await insp.inspect(f"{registry.host}/ii/warmup:v1")  # type: ignore[attr-defined]


async def test_oci_index_gives_platforms_in_one_request(
    registry: Registry, plain: dict[str, object], make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(registries=insecure(registry.host))
    await _warm(insp, registry)
    before = insp.stats.requests
    info = await insp.inspect(f"{registry.host}/ii/multi:oci")
    assert insp.stats.requests - before == 1
    assert info.media_type == OCI_INDEX
    assert info.digest == plain["oci_index"].digest  # type: ignore[attr-defined]
    assert info.reference == f"{registry.host}/ii/multi:oci"
    # Attestation entries (unknown/unknown) are skipped; windows keeps its os; variants kept.
    assert [str(p) for p in info.platforms] == PLATFORMS


async def test_docker_manifest_list(
    registry: Registry, plain: dict[str, object], make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(registries=insecure(registry.host))
    info = await insp.inspect(f"{registry.host}/ii/multi:docker")
    assert info.media_type == DOCKER_LIST
    assert info.platforms == (Platform("linux", "amd64"), Platform("linux", "s390x"))


@pytest.mark.parametrize(
    ("tag", "media_type", "platform"),
    [
        ("docker", DOCKER_MANIFEST, Platform("linux", "ppc64le")),
        ("oci", OCI_MANIFEST, Platform("linux", "arm64", "v8")),
    ],
)
async def test_single_manifest_reads_the_config_in_two_requests(
    registry: Registry,
    plain: dict[str, object],
    make_inspector: InspectorFactory,
    tag: str,
    media_type: str,
    platform: Platform,
) -> None:
    insp = await make_inspector(registries=insecure(registry.host))
    await _warm(insp, registry)
    before = insp.stats.requests
    info = await insp.inspect(f"{registry.host}/ii/single:{tag}")
    assert insp.stats.requests - before == 2
    assert (info.media_type, info.platforms) == (media_type, (platform,))
    # A warm hit costs nothing.
    again = await insp.inspect(f"{registry.host}/ii/single:{tag}")
    assert again == info
    assert insp.stats.requests - before == 2
    assert insp.stats.cache_hits >= 1


async def test_another_tag_of_a_known_config_costs_one_request(
    registry: Registry, pusher: object, make_inspector: InspectorFactory
) -> None:
    """A config blob is content-addressed: once read, its platform answers every tag whose
    manifest names it (retags, promotion tags, a tag per CI run of the same build)."""
    p: Pusher = pusher(registry)  # type: ignore[operator]
    first = p.image("ii/retag", "v1", architecture="s390x")
    p.raw_manifest("ii/retag", "v1-promoted", first.body, first.media_type)
    insp = await make_inspector(registries=insecure(registry.host))
    await _warm(insp, registry)
    before = insp.stats.requests
    one = await insp.inspect(f"{registry.host}/ii/retag:v1")
    assert insp.stats.requests - before == 2
    other = await insp.inspect(f"{registry.host}/ii/retag:v1-promoted")
    assert insp.stats.requests - before == 3  # the manifest only
    assert insp.stats.config_hits == 1
    assert other.platforms == one.platforms == (Platform("linux", "s390x"),)
    assert other.digest == one.digest and other.reference.endswith(":v1-promoted")
    # another config (another build) is read
    p.image("ii/retag", "v2", architecture="arm64")
    assert (await insp.inspect(f"{registry.host}/ii/retag:v2")).platforms == (
        Platform("linux", "arm64"),)
    assert insp.stats.requests - before == 5 and insp.stats.config_hits == 1


async def test_digest_pinned_reference_and_tag_plus_digest(
    registry: Registry, plain: dict[str, object], make_inspector: InspectorFactory
) -> None:
    digest = plain["oci_index"].digest  # type: ignore[attr-defined]
    insp = await make_inspector(registries=insecure(registry.host))
    info = await insp.inspect(f"{registry.host}/ii/multi@{digest}")
    assert info.digest == digest
    assert info.reference == f"{registry.host}/ii/multi@{digest}"
    # The digest decides: the tag does not even exist.
    both = await insp.inspect(f"{registry.host}/ii/multi:no-such-tag@{digest}")
    assert [str(p) for p in both.platforms] == PLATFORMS


async def test_not_found_names_registry_reference_and_status(
    registry: Registry, plain: dict[str, object], make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(registries=insecure(registry.host))
    for image in (f"{registry.host}/ii/multi:missing", f"{registry.host}/ii/nope:v1"):
        with pytest.raises(NotFound) as info:
            await insp.inspect(image)
        err = info.value
        assert (err.status, err.registry, err.reference) == (404, registry.host, image)
        assert registry.host in str(err) and "404" in str(err)


async def test_concurrent_lookups_share_one_fetch(
    registry: Registry, plain: dict[str, object], make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(registries=insecure(registry.host))
    await _warm(insp, registry)
    before = insp.stats.requests
    results = await asyncio.gather(
        *(insp.inspect(f"{registry.host}/ii/single:docker") for _ in range(20))
    )
    assert len({r.digest for r in results}) == 1
    assert insp.stats.requests - before == 2
    assert insp.stats.inflight_joins == 19


async def test_pull_always_revalidates_with_one_head(
    registry: Registry, pusher: object, make_inspector: InspectorFactory
) -> None:
    p: Pusher = pusher(registry)  # type: ignore[operator]
    p.image("ii/moving", "v1", architecture="amd64")
    insp = await make_inspector(registries=insecure(registry.host))
    image = f"{registry.host}/ii/moving:v1"
    first = await insp.inspect(image)
    before = insp.stats.requests
    same = await insp.inspect(image, pull_always=True)
    assert same == first
    assert insp.stats.requests - before == 1 and insp.stats.revalidations == 1
    # The tag moves: the cached answer is stale, the HEAD notices it.
    p.image("ii/moving", "v1", architecture="riscv64")
    assert (await insp.inspect(image)).platforms == (Platform("linux", "amd64"),)
    moved = await insp.inspect(image, pull_always=True)
    assert moved.platforms == (Platform("linux", "riscv64"),)
    assert moved.digest != first.digest


class _WallClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_cached_result_carries_the_time_of_the_fetch_it_copies(
    registry: Registry, pusher: object, make_inspector: InspectorFactory
) -> None:
    p: Pusher = pusher(registry)  # type: ignore[operator]
    p.image("ii/aged", "v1", architecture="amd64")
    wall = _WallClock()
    insp = await make_inspector(registries=insecure(registry.host), wall_clock=wall)
    image = f"{registry.host}/ii/aged:v1"
    first = await insp.inspect(image)
    assert first.fetched_at == 1_700_000_000.0
    wall.now += 30
    again = await insp.inspect(image)  # from the cache: not a new registry answer
    assert insp.stats.cache_hits == 1
    assert again.fetched_at == 1_700_000_000.0
    # a revalidation (pull_always) asks the registry: the answer is as of the HEAD
    revalidated = await insp.inspect(image, pull_always=True)
    assert insp.stats.revalidations == 1 and revalidated.fetched_at == 1_700_000_030.0
    assert revalidated == first  # the time is not part of equality


async def test_max_age_refetches_a_cached_result_that_is_too_old(
    registry: Registry, pusher: object, make_inspector: InspectorFactory
) -> None:
    """The inspector caches for 6 h; a caller aging by fetched_at with a 20 s TTL gets a
    fresh answer once the cached one is 20 s old, and sees a tag that moved."""
    p: Pusher = pusher(registry)  # type: ignore[operator]
    p.multiarch("ii/maxage", "v1", ["linux/amd64", "linux/arm64"])
    wall = _WallClock()
    insp = await make_inspector(registries=insecure(registry.host), wall_clock=wall)
    image = f"{registry.host}/ii/maxage:v1"
    first = await insp.inspect(image, max_age=20)
    p.image("ii/maxage", "v1", architecture="amd64")  # re-pushed amd64-only
    wall.now += 19.9
    young = await insp.inspect(image, max_age=20)
    assert young.platforms == first.platforms and young.fetched_at == first.fetched_at
    wall.now += 0.1
    fresh = await insp.inspect(image, max_age=20)
    assert fresh.platforms == (Platform("linux", "amd64"),)
    assert fresh.fetched_at == 1_700_000_020.0
    assert insp.stats.cache_misses == 2
    # without max_age the (now refreshed) cache answers
    assert (await insp.inspect(image)).fetched_at == 1_700_000_020.0


async def test_plain_http_needs_an_insecure_entry(
    registry: Registry, plain: dict[str, object], make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector()
    with pytest.raises(ConnectionFailed) as info:
        await insp.inspect(f"{registry.host}/ii/multi:oci")
    assert info.value.registry == registry.host


async def test_tls_registry_with_custom_ca(
    tls_registry: Registry, pusher: object, make_inspector: InspectorFactory
) -> None:
    p: Pusher = pusher(tls_registry)  # type: ignore[operator]
    p.multiarch("ii/tls", "v1", ["linux/amd64", "linux/arm64"])
    image = f"{tls_registry.host}/ii/tls:v1"
    insp = await make_inspector(ca_bundles=trust(tls_registry))
    info = await insp.inspect(image)
    assert [str(x) for x in info.platforms] == ["linux/amd64", "linux/arm64"]
    untrusting = await make_inspector()
    with pytest.raises(ConnectionFailed, match=r"(?i)certificate"):
        await untrusting.inspect(image)
    # An insecure entry accepts the unknown CA (unverified TLS, no fallback to HTTP needed).
    lax = await make_inspector(registries=insecure(tls_registry.host))
    assert (await lax.inspect(image)).digest == info.digest


async def test_mirror_is_tried_first_then_the_source(
    registry: Registry, tls_registry: Registry, pusher: object, make_inspector: InspectorFactory
) -> None:
    mirror: Pusher = pusher(registry)  # type: ignore[operator]
    source: Pusher = pusher(tls_registry)  # type: ignore[operator]
    mirror.image("ii/mirrored", "v1", architecture="arm64")
    source.image("ii/mirrored", "v1", architecture="amd64")
    source.image("ii/mirrored", "only-source", architecture="s390x")
    conf = RegistriesConfig.from_toml(
        f'[[registry]]\nlocation = "{tls_registry.host}"\n'
        f'[[registry.mirror]]\nlocation = "{registry.host}"\ninsecure = true\n'
    )
    insp = await make_inspector(registries=conf, ca_bundles=trust(tls_registry))
    from_mirror = await insp.inspect(f"{tls_registry.host}/ii/mirrored:v1")
    assert from_mirror.platforms == (Platform("linux", "arm64"),)
    assert from_mirror.reference == f"{tls_registry.host}/ii/mirrored:v1"
    from_source = await insp.inspect(f"{tls_registry.host}/ii/mirrored:only-source")
    assert from_source.platforms == (Platform("linux", "s390x"),)
    with pytest.raises(NotFound) as info:
        await insp.inspect(f"{tls_registry.host}/ii/mirrored:nowhere")
    assert info.value.registry == tls_registry.host


async def test_blocked_registry_is_refused_without_a_request(
    registry: Registry, plain: dict[str, object], make_inspector: InspectorFactory
) -> None:
    conf = RegistriesConfig.from_toml(
        f'[[registry]]\nlocation = "{registry.host}"\nblocked = true\ninsecure = true\n'
    )
    insp = await make_inspector(registries=conf)
    with pytest.raises(Blocked, match="blocked"):
        await insp.inspect(f"{registry.host}/ii/multi:oci")
    assert insp.stats.requests == 0


@pytest.mark.parametrize(
    "image", ["169.254.169.254/latest/meta-data:x", "[fe80::1]:5000/a/b", "169.254.0.1:80/x"]
)
async def test_link_local_and_metadata_addresses_are_refused(
    image: str, make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(retries=0)
    with pytest.raises(UnsafeAddress):
        await insp.inspect(image)


async def test_resolver_refuses_names_that_resolve_to_link_local() -> None:
    from aiohttp.abc import ResolveResult

    from podplacement.imageinspect._transport import _GuardedResolver, _UnsafeAddressOSError

    class FakeInner:
        async def resolve(self, host: str, port: int, family: object) -> list[ResolveResult]:
            addr = "169.254.169.254" if host == "metadata.internal" else "127.0.0.1"
            return [ResolveResult(hostname=host, host=addr, port=port, family=2, proto=0, flags=0)]

        async def close(self) -> None:
            return None

    resolver = _GuardedResolver()
    await resolver.close()
    resolver._inner = FakeInner()  # type: ignore[assignment]
    assert (await resolver.resolve("localhost", 80))[0]["host"] == "127.0.0.1"
    with pytest.raises(_UnsafeAddressOSError, match=r"169\.254\.169\.254"):
        await resolver.resolve("metadata.internal", 80)


async def test_invalid_reference_is_not_fetched(make_inspector: InspectorFactory) -> None:
    insp = await make_inspector()
    with pytest.raises(InvalidReference) as info:
        await insp.inspect("Registry.example.com/UPPER/case")
    assert info.value.part == "path"
    assert insp.stats.requests == 0


async def test_connection_refused_is_connection_failed(make_inspector: InspectorFactory) -> None:
    from tests.harness.registry import free_port

    host = f"127.0.0.1:{free_port()}"
    insp = await make_inspector(registries=insecure(host), retries=1)
    insp._sleep = _no_sleep
    with pytest.raises(ConnectionFailed) as info:
        await insp.inspect(f"{host}/a/b:c")
    assert info.value.registry == host
    assert insp.stats.retries == 1


async def _no_sleep(delay: float) -> None:
    return None


def test_image_info_json_shape() -> None:
    from podplacement.imageinspect import ImageInfo
    from podplacement.imageinspect.cli import _describe

    info = ImageInfo("r/x:y", "sha256:" + "0" * 64, OCI_INDEX, (Platform("linux", "arm64", "v8"),))
    assert json.loads(json.dumps(_describe(info)))["platforms"] == ["linux/arm64/v8"]
