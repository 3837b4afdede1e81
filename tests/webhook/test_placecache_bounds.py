"""Bounded by design (webhook): the place cache holds at most ``max_bytes`` of estimated
result bytes (:func:`imageinspect.estimated_bytes`), the least recently used out; a pod
over ``MAX_POD_IMAGES`` is not inspected at admission."""

from __future__ import annotations

from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, Platform, estimated_bytes
from podplacement.rules.config import PlacementConfig
from podplacement.rules.place.placement import MAX_POD_IMAGES
from podplacement.webhook.admitplace import place_at_admission
from podplacement.webhook.placecache import PlaceCache


class _Unused:
    async def inspect(self, *args: Any, **kw: Any) -> Any:
        raise AssertionError("no image is inspected")


def _info(ref: str, n: int) -> ImageInfo:
    return ImageInfo(ref, "sha256:" + "0" * 64, "x",
                     tuple(Platform("linux", f"a{i}") for i in range(n)), fetched_at=1000.0)


def _key(image: str) -> Any:
    return image  # the webhook's results are anonymous: the image alone is the key


def test_the_place_cache_is_bounded_by_estimated_bytes() -> None:
    cache = PlaceCache(_Unused(), max_bytes=50_000, clock=lambda: 1000.0)
    for n in range(10):
        cache.store(_key(f"r/{n}"), _info(f"r/{n}", 10))  # ~3.3 kB each
    assert len(cache) == 10
    cache.store(_key("big"), _info("big", 100))  # ~26 kB: the oldest leave
    assert cache.estimated_bytes <= 50_000
    assert len(cache) < 11 and cache.stats.evicted == 11 - len(cache)
    config = PlacementConfig()
    keys = {"big": _key("big"), "r/0": _key("r/0"), "r/9": _key("r/9")}
    assert set(cache.cached(keys, config)) == {"big", "r/9"}
    cache.store(_key("huge"), _info("huge", 1000))  # larger than the bound: not stored
    assert "huge" not in cache.cached({"huge": _key("huge")}, config)
    assert cache.estimated_bytes == sum(
        estimated_bytes(v) for _, v in cache._entries.values())


def test_a_byte_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        PlaceCache(_Unused(), max_bytes=0)


async def test_a_pod_over_the_image_bound_is_left_to_the_controller() -> None:
    pod = {"metadata": {"namespace": "ns", "name": "p"},
           "spec": {"containers": [{"name": f"c{n}", "image": f"r/i:{n}"}
                                   for n in range(MAX_POD_IMAGES + 1)]}}
    cache = PlaceCache(_Unused())
    answer = await place_at_admission(pod, "ns", PlacementConfig(), cache=cache,
                                      inspector=_Unused(),  # type: ignore[arg-type]
                                      budget=1.0, dry_run=False)
    assert answer.placement is None
    assert cache.stats.fills_scheduled == 0
