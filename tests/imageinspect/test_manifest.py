"""Platform extraction from manifest JSON (OCI image-spec, Docker v2.2, schema 1, BuildKit)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podplacement.imageinspect import DigestMismatch, InvalidManifest, Platform
from podplacement.imageinspect._manifest import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    DOCKER_SCHEMA1,
    DOCKER_SCHEMA1_SIGNED,
    OCI_INDEX,
    OCI_MANIFEST,
    compute_digest,
    parse_config,
    parse_manifest,
    verify_digest,
)


def _entry(platform: dict[str, Any] | None, annotations: dict[str, str] | None = None) -> dict:
    e: dict[str, Any] = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "0" * 64, "size": 1}
    if platform is not None:
        e["platform"] = platform
    if annotations:
        e["annotations"] = annotations
    return e


def _index(entries: list[dict], media_type: str = OCI_INDEX) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": media_type, "manifests": entries}).encode()


def test_index_platforms_skip_attestations_and_unknown_and_keep_windows_and_variants() -> None:
    body = _index(
        [
            _entry({"os": "linux", "architecture": "amd64"}),
            _entry({"os": "linux", "architecture": "arm64", "variant": "v8"}),
            _entry({"os": "linux", "architecture": "arm", "variant": "v7"}),
            _entry({"os": "windows", "architecture": "amd64", "os.version": "10.0.20348.2031"}),
            _entry(
                {"os": "unknown", "architecture": "unknown"},
                {"vnd.docker.reference.type": "attestation-manifest"},
            ),
            _entry({"os": "linux", "architecture": "s390x"}, {"vnd.docker.reference.type": "x"}),
            _entry({"os": "unknown", "architecture": "unknown"}),
            _entry(None),
            _entry({"os": "linux", "architecture": "amd64"}),
        ]
    )
    parsed = parse_manifest(body, OCI_INDEX)
    assert parsed.is_index and not parsed.needs_config
    assert [str(p) for p in parsed.platforms] == [
        "linux/amd64",
        "linux/arm64/v8",
        "linux/arm/v7",
        "windows/amd64",
    ]


def test_docker_manifest_list_is_read_like_an_index() -> None:
    body = _index([_entry({"os": "linux", "architecture": "ppc64le"})], DOCKER_LIST)
    parsed = parse_manifest(body, DOCKER_LIST + "; charset=utf-8")
    assert parsed.media_type == DOCKER_LIST
    assert parsed.platforms == (Platform("linux", "ppc64le"),)


@pytest.mark.parametrize("media_type", [OCI_MANIFEST, DOCKER_MANIFEST])
def test_single_manifest_points_at_its_config(media_type: str) -> None:
    cfg = "sha256:" + "1" * 64
    body = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": {"mediaType": "x", "digest": cfg, "size": 123},
            "layers": [],
        }
    ).encode()
    parsed = parse_manifest(body, media_type)
    assert parsed.needs_config
    assert (parsed.config_digest, parsed.config_size) == (cfg, 123)
    assert parsed.platforms == ()


def test_config_gives_os_architecture_variant() -> None:
    doc = {"os": "linux", "architecture": "arm", "variant": "v6", "rootfs": {}}
    assert parse_config(json.dumps(doc).encode()) == (Platform("linux", "arm", "v6"),)
    assert str(Platform("linux", "arm", "v6")) == "linux/arm/v6"
    assert parse_config(b'{"os": "unknown", "architecture": "unknown"}') == ()


def test_schema1_reads_top_level_architecture_and_history_os() -> None:
    doc = {
        "schemaVersion": 1,
        "name": "a",
        "tag": "t",
        "architecture": "arm64",
        "history": [{"v1Compatibility": json.dumps({"os": "linux", "id": "x"})}],
    }
    parsed = parse_manifest(json.dumps(doc).encode(), DOCKER_SCHEMA1_SIGNED)
    assert parsed.platforms == (Platform("linux", "arm64"),)
    # With a generic content type the body's schemaVersion tells it is schema 1.
    parsed = parse_manifest(json.dumps(doc).encode(), "application/json")
    assert parsed.media_type == DOCKER_SCHEMA1
    assert parsed.platforms == (Platform("linux", "arm64"),)


@pytest.mark.parametrize(
    ("body", "content_type", "needle"),
    [
        (b"{not json", OCI_INDEX, "not valid JSON"),
        (b"[1, 2]", OCI_INDEX, "not a JSON object"),
        (_index([]), "text/html", "Content-Type is not"),
        (_index([]), DOCKER_MANIFEST, "contradicts"),
        (b'{"schemaVersion": 2, "mediaType": "' + OCI_INDEX.encode() + b'"}', None, "manifests"),
        (b'{"schemaVersion": 2, "mediaType": "' + OCI_MANIFEST.encode() + b'"}', None, "config"),
        (b'{"schemaVersion": 3}', "application/json", "cannot tell"),
        (b'{"schemaVersion": 1}', DOCKER_SCHEMA1, "architecture"),
        (_index([_entry({"os": "linux"})]), OCI_INDEX, "os/architecture"),
    ],
)
def test_bad_manifests_raise_invalid_manifest(
    body: bytes, content_type: str | None, needle: str
) -> None:
    with pytest.raises(InvalidManifest) as info:
        parse_manifest(body, content_type)
    assert needle in str(info.value)


def test_digest_verification() -> None:
    data = b"hello"
    digest = compute_digest(data)
    verify_digest(data, digest)
    assert compute_digest(data, "sha512").startswith("sha512:")
    with pytest.raises(DigestMismatch):
        verify_digest(b"hello!", digest)
    with pytest.raises(DigestMismatch):
        verify_digest(data, "md5:abc")


def test_platform_parse() -> None:
    assert Platform.parse("linux/arm64/v8") == Platform("linux", "arm64", "v8")
    assert Platform.parse("windows/amd64") == Platform("windows", "amd64")
    with pytest.raises(ValueError):
        Platform.parse("linux")
