"""Inspect a pod's images while its AdmissionReview waits: within a time budget, anonymously,
one registry inspection per image however many reviews ask at once, results kept in the
place cache.

The API server waits for the webhook at most the configuration's ``timeoutSeconds``
(:data:`rules.admit.webhookconfig.DEFAULT_TIMEOUT_SECONDS`, 5 s) and then applies
``failurePolicy: Ignore``: the pod passes unanswered. So an inspection at admission gets a
*budget* well inside that (:data:`DEFAULT_BUDGET`), after which the caller answers with what
it has. An inspection is a *flight*, an asyncio task of its own keyed by
``(image, revalidate)`` (the place-cache key, :func:`webhook.placecache.cache_keys`, is the
image reference as written), so N concurrent reviews of one image wait for one flight
(singleflight), whatever their namespaces. A review whose budget runs out leaves; its
flight goes on (bounded by ``flight_timeout``) and stores its result, so the next pod of
that image is answered from the cache. Failures are not stored.

Every flight is **anonymous**: the webhook reads no Secret (docs/security.md). Its
endpoint can be called by anyone who reaches its Service, with an AdmissionReview naming
any namespace; were it to inspect with that namespace's pull Secrets, its answer would tell
the caller another namespace's private image's platforms and digest. An image the registry
answers only with credentials fails here (``imageinspect.Unauthorized``, ``Denied``,
``NotFound``) and its pod stays gated for the controller, which reads the pod's own
namespace's Secrets.

``dry_run=True`` (an AdmissionReview with ``request.dryRun``: the webhook declares
``sideEffects: None``) answers from the cache only, read without touching it: no registry
request, no cache write.

``revalidate=True`` treats images pulled with ``imagePullPolicy: Always`` as the controller
does: never answered from the place cache, always asked of the registry
(:meth:`imageinspect.Inspector.inspect` with ``pull_always``: a HEAD digest check when its own
cache holds the tag). Concurrent reviews share one such check (the flight key), so a review
may be answered by a HEAD sent at most one registry round trip before it arrived. Used while
no controller runs (:mod:`webhook.outage`, with the inspector's own ``budget``) and, with
the config's ``inspectionBudget``, for a gated pod the cache cannot place
(:mod:`webhook.admitplace`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from podplacement.imageinspect import Denied, NotFound, Unauthorized
from podplacement.rules.config import PlacementConfig
from podplacement.rules.place.decision import unique_images
from podplacement.rules.podspec import pull_secret_refs
from podplacement.webhook.placecache import CacheKey, InspectorLike, cache_keys

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_FLIGHT_TIMEOUT",
    "DEFAULT_MAX_FLIGHTS",
    "REFUSED_ANONYMOUSLY",
    "AdmissionInspectionError",
    "AdmissionInspector",
    "AdmissionInspectorStats",
    "NotInspected",
    "NotInspectedInTime",
    "PodImages",
    "TooManyInspections",
    "needs_credentials",
]

log = logging.getLogger(__name__)

#: Seconds a review may wait for inspections (from the start of ``/mutate`` when the caller
#: says so). The API server gives the webhook 5 s (``timeoutSeconds``); 2 s leave 3 s for
#: the connection, the body, the decision and a loaded event loop on a small node.
DEFAULT_BUDGET = 2.0
#: Flights running at once; a review needing another one gets :class:`TooManyInspections`.
DEFAULT_MAX_FLIGHTS = 256
#: Seconds a flight may run in all (registry retries and backoff included).
DEFAULT_FLIGHT_TIMEOUT = 30.0

#: (place-cache key, revalidate with the registry)
FlightKey = tuple[CacheKey, bool]

#: The errors of an anonymous inspection that credentials may cure: the registry refused to
#: show the image without them (HTTP 401, 403) or hid it (404: several registries answer
#: so for a private repository).
REFUSED_ANONYMOUSLY = (Unauthorized, Denied, NotFound)


class AdmissionInspectionError(Exception):
    """An image the admission inspection has no result for (the base class)."""


class NotInspectedInTime(AdmissionInspectionError):
    """The image's inspection did not finish within the review's budget (``seconds``); it
    goes on in the background and fills the cache."""

    def __init__(self, image: str, seconds: float) -> None:
        super().__init__(f"{image}: not inspected within {seconds:.1f} s at admission")
        self.image = image
        self.seconds = seconds


class TooManyInspections(AdmissionInspectionError):
    """``max_flights`` inspections were running: this one was not started."""

    def __init__(self, image: str, limit: int) -> None:
        super().__init__(f"{image}: not inspected, {limit} inspections already running")
        self.image = image
        self.limit = limit


class NotInspected(AdmissionInspectionError):
    """The image was not in the cache and was not to be inspected (``dry_run``, or an image
    pulled with ``Always`` that must be revalidated)."""

    def __init__(self, image: str, why: str) -> None:
        super().__init__(f"{image}: not inspected ({why})")
        self.image = image
        self.why = why


class CacheLike(Protocol):
    """What :class:`AdmissionInspector` needs of :class:`webhook.placecache.PlaceCache`."""

    def cached(self, keys: Mapping[str, CacheKey], config: PlacementConfig, *,
               touch: bool = True) -> dict[str, Any]: ...
    def store(self, key: CacheKey, result: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class PodImages:
    """What :meth:`AdmissionInspector.pod_images` learned about one pod's images.

    Attributes:
        results: every distinct image reference of the pod (as written, pod order) → its
            result (``imageinspect.ImageInfo``) or the exception standing for it: the
            anonymous inspection's own error (``imageinspect.RegistryError``; an image that
            needs credentials gives ``Unauthorized``, ``Denied`` or ``NotFound``), or an
            :class:`AdmissionInspectionError`.
        from_cache: the images answered from the place cache.
        inspected: the images whose inspection this call started or joined and saw finish.
    """

    results: Mapping[str, Any]
    from_cache: tuple[str, ...] = ()
    inspected: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """True when every image has a result (no exception)."""
        return not any(isinstance(r, BaseException) for r in self.results.values())

    def errors(self) -> dict[str, BaseException]:
        """image → exception, for the images without a result."""
        return {i: r for i, r in self.results.items() if isinstance(r, BaseException)}


def needs_credentials(pod: Mapping[str, Any], config: PlacementConfig,
                      images: PodImages) -> bool:
    """True when ``pod`` is one the controller may place and the webhook may not: the pod
    names pull Secrets (its ``imagePullSecrets`` or the config's
    ``globalPullSecretRef``; :func:`rules.podspec.pull_secret_refs`, the controller's
    rule) and the registry refused an image of it to the webhook's anonymous inspection
    (:data:`REFUSED_ANONYMOUSLY`). The controller reads those Secrets in the pod's own
    namespace; the webhook reads none (module docstring). No I/O."""
    if not pull_secret_refs(pod, config):
        return False
    return any(isinstance(e, REFUSED_ANONYMOUSLY) for e in images.errors().values())


@dataclass(slots=True)
class AdmissionInspectorStats:
    """Counters (plain ints, read by tests and benchmarks).

    Attributes:
        flights_started: inspections started (one per flight key at a time).
        flights_joined: reviews that waited for a flight another review had started.
        flights_failed: flights that ended with an error (not stored).
        stored: results stored in the place cache.
        cache_answers: images answered from the place cache.
        budget_exceeded: images a review stopped waiting for (budget spent).
        refused: images not inspected because ``max_flights`` were running.
    """

    flights_started: int = 0
    flights_joined: int = 0
    flights_failed: int = 0
    stored: int = 0
    cache_answers: int = 0
    budget_exceeded: int = 0
    refused: int = 0


class AdmissionInspector:
    """Inspects the images of pods under admission within a budget, anonymously, one flight
    per key.

    Args:
        inspector: inspects images, always without credentials
            (:class:`imageinspect.Inspector`, shared with the place cache's fills); not
            closed here.
        cache: where results are looked up and stored (:class:`webhook.placecache.PlaceCache`
            or None: nothing is cached here).
        budget: default seconds :meth:`pod_images` waits (> 0).
        max_flights: flights running at once (>= 1).
        flight_timeout: seconds one flight may run in all (> 0).
        on_result: called with (image as written, result) for every result
            :meth:`pod_images` answers with, from the cache or inspected, but not on a dry
            run (:meth:`webhook.inspectionreport.InspectionReport.note`: the controller
            learns the image from it without fetching it again); must be cheap and not
            raise.

    Raises:
        ValueError: a bound out of range.

    Call :meth:`aclose` on shutdown (cancels the flights).
    """

    def __init__(
        self,
        inspector: InspectorLike,
        *,
        cache: CacheLike | None = None,
        budget: float = DEFAULT_BUDGET,
        max_flights: int = DEFAULT_MAX_FLIGHTS,
        flight_timeout: float = DEFAULT_FLIGHT_TIMEOUT,
        on_result: Callable[[str, Any], None] | None = None,
    ) -> None:
        if not budget > 0 or not flight_timeout > 0 or max_flights < 1:
            raise ValueError("budget and flight_timeout must be > 0, max_flights >= 1")
        self._inspector = inspector
        self._cache = cache
        self.budget = budget
        self._max_flights = max_flights
        self._flight_timeout = flight_timeout
        self.on_result = on_result
        self._flights: dict[FlightKey, asyncio.Task[Any]] = {}
        self.stats = AdmissionInspectorStats()

    def in_flight(self) -> int:
        """Flights running now."""
        return len(self._flights)

    async def pod_images(
        self,
        pod: Mapping[str, Any],
        config: PlacementConfig,
        *,
        budget: float | None = None,
        dry_run: bool = False,
        revalidate: bool = False,
    ) -> PodImages:
        """The results of ``pod``'s images, from the place cache or inspected now.

        Args:
            pod: the AdmissionReview's ``request.object`` (its pull Secrets are not read:
                every image is inspected anonymously).
            config: the PodPlacementConfig in force (cache TTL).
            budget: seconds to wait for the inspections started or joined (default: the
                instance's ``budget``; <= 0: start them, wait for none). Flights left
                behind go on and fill the cache.
            dry_run: answer from the cache only and leave it untouched: no registry
                request, no cache write (``request.dryRun``).
            revalidate: images pulled with ``imagePullPolicy: Always`` are not answered
                from the cache but inspected with ``pull_always`` (the controller's rule);
                with ``dry_run`` they get :class:`NotInspected`.

        Returns:
            :class:`PodImages`: a result or an exception for every distinct image. Never
            raises for an image's failure; cancelling the call leaves the flights running.
        """
        keys = cache_keys(pod)
        pulls = unique_images(pod)
        found = (self._cache.cached(keys, config, touch=not dry_run)
                 if self._cache is not None else {})
        results: dict[str, Any] = {}
        from_cache: list[str] = []
        wanted: dict[str, FlightKey] = {}
        for image, key in keys.items():
            always = revalidate and pulls.get(image, False)
            if image in found and not always:
                results[image] = found[image]
                from_cache.append(image)
            elif dry_run:
                results[image] = NotInspected(
                    image, "dry run" if not always else "dry run, imagePullPolicy Always")
            else:
                wanted[image] = (key, always)
        self.stats.cache_answers += len(from_cache)
        if not wanted:
            self._report(results, dry_run)
            return PodImages(results, tuple(from_cache))
        max_age = config.image_inspection.cache_ttl_seconds
        tasks: dict[str, asyncio.Task[Any]] = {}
        for image, flight_key in wanted.items():
            task = self._flight(flight_key, image, max_age)
            if task is None:
                results[image] = TooManyInspections(image, self._max_flights)
            else:
                tasks[image] = task
        seconds = self.budget if budget is None else budget
        if tasks:
            await asyncio.wait(set(tasks.values()), timeout=max(0.0, seconds))
        inspected: list[str] = []
        for image, task in tasks.items():
            if not task.done():
                self.stats.budget_exceeded += 1
                results[image] = NotInspectedInTime(image, seconds)
            elif task.cancelled():
                results[image] = NotInspectedInTime(image, seconds)
            else:
                error = task.exception()
                results[image] = error if error is not None else task.result()
                inspected.append(image)
        self._report(results, dry_run)
        return PodImages({i: results[i] for i in keys}, tuple(from_cache), tuple(inspected))

    def _report(self, results: Mapping[str, Any], dry_run: bool) -> None:
        """Hand every result (not the exceptions) to ``on_result``, unless ``dry_run``."""
        if self.on_result is None or dry_run:
            return
        for image, result in results.items():
            if not isinstance(result, BaseException):
                self.on_result(image, result)

    def _flight(self, key: FlightKey, image: str, max_age: float) -> asyncio.Task[Any] | None:
        """The running flight of ``key``, joined, or a new one; None when ``max_flights``
        are running. ``max_age``: the config's cacheTTL (seconds): a result the inspector
        holds from an older registry answer is fetched again, not placed with."""
        task = self._flights.get(key)
        if task is not None:
            self.stats.flights_joined += 1
            return task
        if len(self._flights) >= self._max_flights:
            self.stats.refused += 1
            return None
        task = asyncio.get_running_loop().create_task(self._fly(key, image, max_age))
        self._flights[key] = task
        self.stats.flights_started += 1

        def done(t: asyncio.Task[Any]) -> None:
            if self._flights.get(key) is t:
                del self._flights[key]
            if not t.cancelled() and t.exception() is not None:
                self.stats.flights_failed += 1

        task.add_done_callback(done)
        return task

    async def _fly(self, key: FlightKey, image: str, max_age: float) -> Any:
        cache_key, always = key
        async with asyncio.timeout(self._flight_timeout):
            # No credentials, ever: an anonymous answer is public (module docstring).
            result = await self._inspector.inspect(image, (), pull_always=always,
                                                   max_age=max_age)
        if self._cache is not None:
            self._cache.store(cache_key, result)
            self.stats.stored += 1
        return result

    async def idle(self) -> None:
        """Wait until no flight runs (tests; each flight ends within ``flight_timeout``)."""
        while self._flights:
            await asyncio.gather(*list(self._flights.values()), return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel the running flights."""
        tasks = list(self._flights.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flights.clear()
