"""Supported platforms are the intersection over images of (os, architecture)."""

from __future__ import annotations

from podplacement.rules.config import ARCH_LABEL, OS_LABEL
from podplacement.rules.platforms import node_inventory, supported_platforms
from tests.controller._pods import img


def test_intersection_over_images_sorted() -> None:
    ps = supported_platforms(
        [
            img("a", "linux/s390x", "linux/amd64", "linux/arm64/v8"),
            img("b", "linux/arm64", "linux/amd64", "linux/ppc64le"),
        ]
    )
    assert ps.pairs == (("linux", "amd64"), ("linux", "arm64"))
    assert ps.architectures == ("amd64", "arm64")
    assert ps.oses == ("linux",) and ps.all_linux
    assert ps.variants == (("linux", "arm64", "v8"),)  # recorded, not matched
    assert ps.strings() == ["linux/amd64", "linux/arm64"]


def test_os_matters_windows_is_not_linux() -> None:
    ps = supported_platforms([img("w", "windows/amd64"), img("l", "linux/amd64")])
    assert ps.empty
    win = supported_platforms([img("w", "windows/amd64", "linux/arm64")])
    assert win.oses == ("linux", "windows") and not win.all_linux


def test_attestation_unknown_entries_are_not_platforms() -> None:
    ps = supported_platforms([img("a", "linux/amd64", "unknown/unknown")])
    assert ps.pairs == (("linux", "amd64"),)


def test_no_images_gives_an_empty_set_with_zero_count() -> None:
    ps = supported_platforms([])
    assert ps.empty and ps.image_count == 0


def test_node_inventory_reads_arch_and_os_labels() -> None:
    inv = node_inventory(
        [
            {"metadata": {"labels": {ARCH_LABEL: "amd64", OS_LABEL: "linux"}}},
            {"metadata": {"labels": {ARCH_LABEL: "arm64"}}},
            {"metadata": {}},
        ]
    )
    assert inv.architectures == frozenset({"amd64", "arm64"})
    assert inv.pairs == frozenset({("linux", "amd64"), ("linux", "arm64")})
    assert inv.node_count == 3
