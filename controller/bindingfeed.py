"""The NUMA binding feed: bindings and deletions of the pods the controller ungated toward
NUMA candidates, into the in-flight accounting (:class:`rules.numa.InFlight`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from podplacement.kubeclient import Informer, KubeAPI
from podplacement.rules.config import NUMA_LABEL, NUMA_LABEL_PLACED

PODS_PATH = "/api/v1/pods"
#: Label selector of the feed: the label the NUMA-placing ungate write sets.
BINDINGS_SELECTOR = f"{NUMA_LABEL}={NUMA_LABEL_PLACED}"


class PodObserver(Protocol):
    """What the feed needs of :class:`rules.numa.InFlight`."""

    def observe_pod(self, pod: Mapping[str, Any], *, deleted: bool = False) -> Any: ...


async def watch_bindings(
    api: KubeAPI,
    *,
    inflight: Callable[[], PodObserver],
    enabled: Callable[[], bool],
    changed: asyncio.Event,
    watch_timeout: int,
    idle_seconds: float = 5.0,
) -> None:
    """Feed ``inflight()`` with the bindings and deletions of the pods the controller ungated
    toward NUMA candidates: a bound pod holds its requests on its node only, no longer on
    every candidate; a deleted one holds nothing. Runs until cancelled.

    Selects on the label ``podplacement.io/numa=placed`` that the ungate write sets
    (:func:`rules.place.decision.decide`), so the API server sends only those pods, not every
    ungated pod of the cluster. No field selector: a placed pod deleted before it was bound
    must reach the accounting too (unbound pods are otherwise ignored by ``observe_pod``).
    A :class:`kubeclient.Informer` without a cache (no memory per pod): one paged list at
    (re)start, every pod listed handed on as it is, then its watch. As with any cache-less
    list+watch, a relist cannot report the pods deleted while the watch was down.
    Runs only while ``enabled()`` (topology placement on), checked again when ``changed``
    is set or every ``idle_seconds``; each time it is switched on again it starts with a
    fresh list. Errors back off as the informer does (:func:`kubeclient.retry_delay`)."""

    def observe(etype: str, pod: dict[str, Any], _old: dict[str, Any] | None) -> None:
        inflight().observe_pod(pod, deleted=etype == "DELETED")

    informer: Informer | None = None
    try:
        while True:
            if enabled() and informer is None:
                informer = Informer(api, PODS_PATH, {"labelSelector": BINDINGS_SELECTOR},
                                    name="numa bindings", watch_timeout=watch_timeout,
                                    min_backoff=0.5, keep_cache=False)
                informer.add_handler(observe)
                informer.start()
            elif not enabled() and informer is not None:
                await informer.stop()
                informer = None
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), idle_seconds)
    finally:
        if informer is not None:
            await informer.stop()
