"""The NUMA binding feed: bindings and deletions of the pods the controller ungated toward
NUMA candidates, into the in-flight accounting (:class:`controller.numa.InFlight`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from controller.config import NUMA_LABEL, NUMA_LABEL_PLACED
from controller.kube import ApiError, KubeAPI, next_backoff, retry_delay

log = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"
#: Label selector of the feed: the label the NUMA-placing ungate write sets.
BINDINGS_SELECTOR = f"{NUMA_LABEL}={NUMA_LABEL_PLACED}"


class PodObserver(Protocol):
    """What the feed needs of :class:`controller.numa.InFlight`."""

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
    (:func:`controller.decision.decide`), so the API server sends only those pods, not every
    ungated pod of the cluster. No field selector: a placed pod deleted before it was bound
    must reach the accounting too (unbound pods are otherwise ignored by ``observe_pod``).
    One paged list at (re)start, then a plain watch (no cache, so no memory per pod); only
    while ``enabled()`` (topology placement on), checked again when ``changed`` is set or
    every ``idle_seconds``. Errors back off (:func:`controller.kube.retry_delay`)."""
    params = {"labelSelector": BINDINGS_SELECTOR}
    rv = ""
    backoff = 0.5
    while True:
        if not enabled():
            rv = ""
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), idle_seconds)
            continue
        try:
            if not rv:
                # (Re)start: the pods already bound, then their changes from that list.
                items, rv = await api.list_all(PODS_PATH, params=params)
                for item in items:
                    inflight().observe_pod(item)
            async for event in api.watch(PODS_PATH, params=params, resource_version=rv,
                                         timeout_seconds=watch_timeout):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    rv = ""  # 410 Gone: list again
                    break
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if event.get("type") == "BOOKMARK":
                    continue
                inflight().observe_pod(obj, deleted=event.get("type") == "DELETED")
            backoff = 0.5
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("binding watch: %s", exc)
            if isinstance(exc, ApiError) and exc.gone:
                rv = ""
            await asyncio.sleep(retry_delay(backoff, exc))
            backoff = next_backoff(backoff, exc, 30.0)
