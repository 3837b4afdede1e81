"""The webhook's cache of **anonymous** image inspection results, filled in the background.

The webhook places a pod at admission when it knows every image of the pod
(:func:`rules.place.admission.admission_placement`; docs/how-it-decides.md "The webhook
after the policy"):
from this cache, or after :mod:`webhook.admitinspect` inspected the missing ones within the
config's ``inspectionBudget`` and stored them here (:meth:`PlaceCache.store`;
:mod:`webhook.admitplace`). With a budget of 0, a miss leaves the pod gated for the
controller and :meth:`PlaceCache.schedule_fill` queues a background fill, which inspects the
images anonymously and stores the results. Either way the next pod with the same images is
placed by the webhook. A review with ``dryRun`` only reads the cache
(``lookup(touch=False)``) and schedules no fill.

The webhook reads no Secret (docs/security.md): every inspection here is anonymous,
the rule of the params object (the catalog): what a registry answers without credentials
is public. So results are keyed by the image reference as written only: nothing in the
cache is anything a caller could not have asked the registry for itself, and a pod of any
namespace may be placed from it. An image the registry refuses to name without
credentials is never stored (failures are not stored); its pods stay gated for the
controller, which reads the pod's own namespace's pull Secrets.
Entries expire the config's ``imageInspection.cacheTTL`` after a registry answered for
them (the result's ``fetched_at``, not the time of the fill: a fill the inspector served
from its own cache does not make an old result young; fills ask the inspector for results
younger than the TTL), and the cache is bounded (least recently used out). Failures
are not stored: the controller reports them. Fills are deduplicated per key, run at most
``max_concurrent_fills`` at a time, and at most ``max_queued_fills`` wait (more are dropped
and counted).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from podplacement.imageinspect import estimated_bytes
from podplacement.rules.config import PlacementConfig
from podplacement.rules.place.decision import unique_images

__all__ = ["CacheKey", "InspectorLike", "PlaceCache", "PlaceCacheStats", "cache_keys"]

log = logging.getLogger(__name__)

#: The image reference as written: results are anonymous, so the image alone is the key.
CacheKey = str

DEFAULT_MAX_ENTRIES = 10_000
#: Default bound on the estimated bytes of the stored results: 32 MiB, as the inspector's
#: own cache (``imageinspect._inspector.DEFAULT_CACHE_BYTES``); with both full the webhook
#: holds about 64 MiB of results, within its 256Mi limit (deploy/base/webhook).
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_CONCURRENT_FILLS = 8
DEFAULT_MAX_QUEUED_FILLS = 1_000


class InspectorLike(Protocol):
    """What the fills need of :class:`imageinspect.Inspector`: results may carry
    ``fetched_at`` (unix seconds of the registry's answer, :class:`imageinspect.ImageInfo`);
    ``max_age`` asks for a result younger than that many seconds. The webhook passes no
    credentials: every inspection of the webhook is anonymous."""

    async def inspect(self, image: str, credentials: Sequence[Any] = (), *,
                      pull_always: bool = False, max_age: float | None = None) -> Any: ...


@dataclass(slots=True)
class PlaceCacheStats:
    """Counters (plain ints, read at scrape time or by tests).

    Attributes:
        hits: lookups that found every image of the pod.
        misses: lookups that did not.
        fills_scheduled: fills queued (each covers the missing images of one pod).
        fills_deduplicated: schedule calls whose images were all cached or being filled.
        fills_dropped: fills not queued because ``max_queued_fills`` were waiting.
        fills_failed: images whose anonymous inspection failed (not stored), or fills
            abandoned on an internal error.
        stored: results stored.
        evicted: entries dropped by the LRU bounds (entries, bytes).
    """

    hits: int = 0
    misses: int = 0
    fills_scheduled: int = 0
    fills_deduplicated: int = 0
    fills_dropped: int = 0
    fills_failed: int = 0
    stored: int = 0
    evicted: int = 0


@dataclass(frozen=True, slots=True)
class _Fill:
    images: tuple[tuple[str, bool], ...]  # (image, pull_always)
    keys: tuple[CacheKey, ...]
    ttl: float  # the config's cacheTTL when the fill was queued (seconds)


def cache_keys(pod: Mapping[str, Any]) -> dict[str, CacheKey]:
    """The cache key of each distinct image of ``pod`` (image reference as written → key):
    the image reference itself. Neither the pod's namespace nor its pull Secrets are part
    of it: the webhook inspects anonymously only, and an anonymous answer is the same for
    every caller (module docstring)."""
    return {image: image for image in unique_images(pod)}


class PlaceCache:
    """Anonymous inspection results per image reference, for the webhook's fast path.

    Args:
        inspector: inspects images, always without credentials
            (:class:`imageinspect.Inspector`); not closed here.
        max_entries: LRU bound on stored results.
        max_bytes: LRU bound on their estimated bytes (:func:`imageinspect.estimated_bytes`).
        max_concurrent_fills: fills running at once.
        max_queued_fills: fills waiting for a worker; more are dropped (counted in
            :attr:`stats`).

        clock: wall-clock unix seconds (``time.time``; tests pass a fake): entries are
            aged from their results' ``fetched_at``, which is on that clock.
        on_result: called with (image as written, result) for every result stored and
            every one found by a lookup that touches the cache (an admission, not a dry
            run): :meth:`webhook.inspectionreport.InspectionReport.note`, so that the
            controller learns the images the webhook placed pods with without fetching them
            again. Must be cheap and not raise.

    Raises:
        ValueError: a bound < 1.

    Call :meth:`aclose` on shutdown (cancels the running fills).
    """

    def __init__(
        self,
        inspector: InspectorLike,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_concurrent_fills: int = DEFAULT_MAX_CONCURRENT_FILLS,
        max_queued_fills: int = DEFAULT_MAX_QUEUED_FILLS,
        clock: Callable[[], float] = time.time,
        on_result: Callable[[str, Any], None] | None = None,
    ) -> None:
        if min(max_entries, max_bytes, max_concurrent_fills, max_queued_fills) < 1:
            raise ValueError("max_entries, max_bytes, max_concurrent_fills and "
                             "max_queued_fills must be >= 1")
        self._inspector = inspector
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        #: the estimated bytes of the stored results, and each one's
        self._bytes = 0
        self._sizes: dict[CacheKey, int] = {}
        self._max_workers = max_concurrent_fills
        self._max_queued = max_queued_fills
        self._clock = clock
        self.on_result = on_result
        #: key → (learned at: when a registry answered, result), least recently used first.
        self._entries: collections.OrderedDict[CacheKey, tuple[float, Any]] = (
            collections.OrderedDict())
        self._filling: set[CacheKey] = set()
        self._queue: collections.deque[_Fill] = collections.deque()
        self._workers: set[asyncio.Task[None]] = set()
        self.stats = PlaceCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, pod: Mapping[str, Any], config: PlacementConfig, *,
               touch: bool = True) -> dict[str, Any] | None:
        """Every distinct image of ``pod`` → its stored result, or None when any image is
        missing or expired (learned ``config.image_inspection.cache_ttl_seconds`` or longer
        ago). No I/O. ``touch``: see :meth:`cached`."""
        keys = cache_keys(pod)
        out = self.cached(keys, config, touch=touch)
        if len(out) != len(keys):
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        return out

    def cached(self, keys: Mapping[str, CacheKey], config: PlacementConfig, *,
               touch: bool = True) -> dict[str, Any]:
        """The stored result of each of ``keys`` (image → :data:`CacheKey`, as
        :func:`cache_keys` gives them) that has one younger than the config's
        ``cacheTTL``: image → result; the others are left out. No I/O.

        ``touch`` (default): found entries become the most recently used and expired ones
        are dropped. ``touch=False`` only reads (an AdmissionReview with ``dryRun``: it
        must leave the cache as it was)."""
        ttl = config.image_inspection.cache_ttl_seconds
        now = self._clock()
        out: dict[str, Any] = {}
        for image, key in keys.items():
            entry = self._entries.get(key)
            if entry is None:
                continue
            if now - entry[0] >= ttl:
                if touch:
                    self._drop(key)
                continue
            if touch:
                self._entries.move_to_end(key)
                if self.on_result is not None:
                    self.on_result(image, entry[1])
            out[image] = entry[1]
        return out

    def schedule_fill(self, pod: Mapping[str, Any], config: PlacementConfig) -> bool:
        """Queue a background (anonymous) fill of the images of ``pod`` that are neither
        stored nor being filled. Returns at once (never awaits; must be called
        from the event loop); True when a fill was queued, False when there was nothing to
        fill or the queue was full (dropped, counted)."""
        keys = cache_keys(pod)
        ttl = config.image_inspection.cache_ttl_seconds
        now = self._clock()
        pulls = unique_images(pod)
        missing = [
            (image, key) for image, key in keys.items()
            if key not in self._filling
            and ((entry := self._entries.get(key)) is None or now - entry[0] >= ttl)
        ]
        if not missing:
            self.stats.fills_deduplicated += 1
            return False
        if len(self._queue) >= self._max_queued:
            self.stats.fills_dropped += 1
            return False
        fill = _Fill(tuple((image, pulls[image]) for image, _ in missing),
                     tuple(key for _, key in missing), ttl)
        self._filling.update(fill.keys)
        self._queue.append(fill)
        self.stats.fills_scheduled += 1
        if len(self._workers) < self._max_workers:
            task = asyncio.get_running_loop().create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)
        return True

    async def idle(self) -> None:
        """Wait until no fill is queued or running (tests, shutdown)."""
        while self._workers:
            await asyncio.gather(*list(self._workers), return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel queued and running fills."""
        self._queue.clear()
        workers = list(self._workers)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._filling.clear()

    async def _work(self) -> None:
        while self._queue:
            fill = self._queue.popleft()
            try:
                await self._fill(fill)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.stats.fills_failed += 1
                log.exception("background image inspection failed")
            finally:
                self._filling.difference_update(fill.keys)

    async def _fill(self, fill: _Fill) -> None:
        async def one(image: str, pull_always: bool) -> Any:
            try:
                return await self._inspector.inspect(image, (), pull_always=pull_always,
                                                     max_age=fill.ttl)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return exc

        results = await asyncio.gather(*(one(i, p) for i, p in fill.images))
        for key, result in zip(fill.keys, results, strict=True):
            if isinstance(result, BaseException):
                self.stats.fills_failed += 1
                continue
            self.store(key, result)

    def store(self, key: CacheKey, result: Any) -> None:
        """Store the anonymous inspection result of ``key`` (an image reference,
        :func:`cache_keys`), aged from when a registry answered for it (its
        ``fetched_at``, unix seconds; a result without one, or with one in the future,
        counts as learned now): the background fills and
        :class:`webhook.admitinspect.AdmissionInspector` store here. Only successful
        results of inspections made without credentials belong here (failures are the
        controller's to report)."""
        now = self._clock()
        fetched_at = getattr(result, "fetched_at", None)
        learned = min(fetched_at, now) if isinstance(fetched_at, int | float) else now
        size = estimated_bytes(result)
        self._drop(key)
        if size > self._max_bytes:
            self.stats.evicted += 1
            return
        self._entries[key] = (learned, result)
        self._sizes[key] = size
        self._bytes += size
        self.stats.stored += 1
        if self.on_result is not None:
            self.on_result(key, result)
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats.evicted += 1

    @property
    def estimated_bytes(self) -> int:
        """The estimated bytes of the stored results."""
        return self._bytes

    def _drop(self, key: CacheKey) -> None:
        if self._entries.pop(key, None) is not None:
            self._bytes -= self._sizes.pop(key, 0)
