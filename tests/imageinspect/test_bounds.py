"""Bounded by design (imageinspect): what one index, one manifest body and the result cache
may make the inspector hold (``imageinspect._manifest`` limits, ``AsyncCache`` bytes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, InvalidManifest, Platform, TooLarge
from podplacement.imageinspect._cache import AsyncCache
from podplacement.imageinspect._manifest import (
    MAX_INDEX_BYTES,
    MAX_INDEX_ENTRIES,
    MAX_MANIFEST_BYTES,
    OCI_INDEX,
    OCI_MANIFEST,
    estimated_bytes,
    index_children,
    parse_config,
    parse_manifest,
)

DIGEST = "sha256:" + "0" * 64


def _index(entries: list[dict[str, Any]]) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                       "manifests": entries}).encode()


def _entry(n: int, **platform: Any) -> dict[str, Any]:
    return {"mediaType": OCI_MANIFEST, "digest": DIGEST, "size": 1,
            "platform": {"os": "linux", "architecture": f"a{n}", **platform}}


def test_the_manifest_limit_is_1_mib_and_an_index_within_it() -> None:
    assert MAX_MANIFEST_BYTES == MAX_INDEX_BYTES == 1024 * 1024
    # an index at the entry limit, with realistic entries, is far below the byte limit
    assert len(_index([_entry(n) for n in range(MAX_INDEX_ENTRIES)])) < MAX_INDEX_BYTES // 4


def test_an_index_at_the_entry_limit_is_read() -> None:
    parsed = parse_manifest(_index([_entry(n) for n in range(MAX_INDEX_ENTRIES)]), OCI_INDEX)
    assert len(parsed.platforms) == MAX_INDEX_ENTRIES == 512


@pytest.mark.parametrize("content_type", [OCI_INDEX, "application/json"])
def test_an_index_over_the_entry_limit_is_too_large(content_type: str) -> None:
    body = _index([_entry(n) for n in range(MAX_INDEX_ENTRIES + 1)])
    with pytest.raises(TooLarge, match="image index lists 513 entries, more than the 512 we "
                                       "read"):
        parse_manifest(body, content_type)
    with pytest.raises(TooLarge, match="513 entries"):
        index_children(body)


def test_an_index_body_over_the_byte_limit_is_refused_before_it_is_decoded() -> None:
    # not even valid JSON: the size decides before the decoder runs
    body = b"[" * (MAX_INDEX_BYTES + 1)
    with pytest.raises(TooLarge, match="more than the 1024 KiB we read"):
        parse_manifest(body, OCI_INDEX)
    with pytest.raises(TooLarge, match="more than the 1024 KiB we read"):
        index_children(body)


@pytest.mark.parametrize("field,value", [
    ("os", "l" * 64), ("architecture", "a" * 64), ("variant", "v" * 64)])
def test_a_platform_field_over_63_characters_is_invalid(field: str, value: str) -> None:
    entry = _entry(0)
    entry["platform"][field] = value
    with pytest.raises(InvalidManifest, match=f"{field} is 64 characters long, more than "
                                              "the 63 we read"):
        parse_manifest(_index([entry]), OCI_INDEX)
    entry["platform"][field] = value[:63]
    assert parse_manifest(_index([entry]), OCI_INDEX).platforms


@pytest.mark.parametrize("extra", [
    {"os.version": "1" * 129}, {"os.version": 7}, {"os.features": ["f"] * 17},
    {"os.features": ["f" * 129]}, {"os.features": "win32k"}])
def test_os_version_and_features_are_bounded(extra: dict[str, Any]) -> None:
    with pytest.raises(InvalidManifest, match=r"os\.(version|features)"):
        parse_manifest(_index([_entry(0, **extra)]), OCI_INDEX)


def test_a_config_platform_is_bounded_too() -> None:
    with pytest.raises(InvalidManifest, match="more than the 63 we read"):
        parse_config(json.dumps({"os": "linux", "architecture": "a" * 100}).encode())


def test_digests_and_media_types_are_bounded() -> None:
    long_digest = {**_entry(0), "digest": "sha256:" + "0" * 200}
    with pytest.raises(InvalidManifest, match="digest is 207 characters long"):
        index_children(_index([long_digest]))
    long_type = {**_entry(0), "mediaType": "application/" + "x" * 300}
    with pytest.raises(InvalidManifest, match="mediaType is 312 characters long"):
        index_children(_index([long_type]))
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "x", "digest": "sha256:" + "0" * 500, "size": 1},
                "layers": []}
    with pytest.raises(InvalidManifest, match="config digest"):
        parse_manifest(json.dumps(manifest).encode(), OCI_MANIFEST)


def _info(n_platforms: int, ref: str = "r") -> ImageInfo:
    return ImageInfo(ref, DIGEST, OCI_INDEX,
                     tuple(Platform("linux", f"a{n}") for n in range(n_platforms)))


def test_estimated_bytes_grow_with_the_platforms() -> None:
    small, big = estimated_bytes(_info(2)), estimated_bytes(_info(512))
    assert 600 < small < 2_000
    assert 512 * 250 < big < 512 * 300
    assert estimated_bytes(ValueError("x")) == 600


async def test_the_cache_evicts_the_least_recently_used_by_bytes() -> None:
    cache: AsyncCache[ImageInfo] = AsyncCache(max_entries=1000, max_bytes=20 * 1024,
                                              size=estimated_bytes)
    for n in range(10):
        cache.put(f"k{n}", _info(2, f"r{n}"), None)
    assert len(cache) == 10
    assert cache.lookup("k0") is not None  # k0 most recent now
    cache.put("big", _info(40), None)  # ~11 kB: the least recently used leave
    assert cache.estimated_bytes <= 20 * 1024
    assert cache.peek("big") is not None and cache.peek("k0") is not None
    assert cache.peek("k1") is None
    assert cache.stats.evictions > 0
    cache.invalidate("big")
    assert cache.estimated_bytes == sum(estimated_bytes(_info(2, "r0")) for _ in range(len(cache)))


async def test_an_entry_larger_than_the_byte_bound_is_not_stored() -> None:
    cache: AsyncCache[ImageInfo] = AsyncCache(max_bytes=4096, size=estimated_bytes)
    cache.put("k", _info(2), None)
    cache.put("huge", _info(100), None)
    assert cache.peek("huge") is None and cache.peek("k") is not None
    calls: list[int] = []

    async def fetch() -> tuple[ImageInfo, float | None]:
        calls.append(1)
        return _info(100), None

    assert len((await cache.get_or_fetch("huge", fetch)).platforms) == 100
    assert calls == [1] and cache.estimated_bytes <= 4096


def test_byte_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        AsyncCache(max_bytes=0)
