"""One cache-less list+watch of the pods podplacement placed, shared by every reader in the
leader.

Every decision, on every path (the admission policy, the webhook, the controller), writes
the label ``podplacement.io/node-affinity`` (``set`` or ``not-set``,
:func:`rules.place.placement.placed_labels`), so a label selector on it makes the API
server send those pods only, never all pods. Readers subscribe with a handler and an
``enabled`` switch: the exec-format-error monitor (while
``spec.plugins.execFormatErrorMonitor.enabled``), the admission feed
(:mod:`controller.admissionfeed`, always) and the escape monitor (while it runs: the label
is what a pod's creator can write too, so it checks, with no request, that each bound
labelled pod's record reproduces from its spec, :mod:`controller.escapemonitor`). One list
and one watch serve them all, instead of one per reader: a second watch of the same selector
would double the API server's work for every placed pod (its initial list is the largest
request the controller makes).

The watch runs while a subscriber is enabled. When a subscriber is switched on while it
runs, the watch starts over with a fresh list, so the newcomer sees every placed pod once;
the others see them again (a cache-less watch's handlers tolerate that: a relist does the
same). Nothing is kept per pod (:class:`kubeclient.Informer` with ``keep_cache=False``),
so deletions while the watch was down are not seen. Handlers run in the event loop and must
not block. The watch's reads are held :data:`READ_COALESCE_SECONDS` after each read, so a
burst of placed pods is read in batches, each event up to that much later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podplacement.controller.bindingfeed import PODS_PATH
from podplacement.kubeclient import Informer, KubeAPI
from podplacement.kubeclient.informer import EventHandler
from podplacement.rules.config import AFFINITY_LABEL

log = logging.getLogger(__name__)

#: The watch's label selector: the label every decision writes (``set`` or ``not-set``).
WATCH_SELECTOR = AFFINITY_LABEL
#: Seconds the reads of the monitors' pod watches (this one and the escape monitor's) are
#: held after each read (:meth:`kubeclient.KubeAPI.watch`): their readers learn, warn and
#: check after the fact, so 50 ms later costs nobody a wait, and the events of a burst are
#: read in batches (``bench/watchread.py``: about 30% of the CPU per event at 400
#: events/s).
READ_COALESCE_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class _Subscriber:
    name: str
    handler: EventHandler
    enabled: Callable[[], bool]


class PlacedPods:
    """The watch of placed pods (module docstring).

    Args:
        api: the Kubernetes client.
        watch_timeout: seconds per watch request.
        idle_seconds: how often the subscribers' switches are read again when
            :meth:`changed` is not called.
    """

    def __init__(self, api: KubeAPI, *, watch_timeout: int = 300,
                 idle_seconds: float = 5.0) -> None:
        self.api = api
        self.watch_timeout = watch_timeout
        self.idle_seconds = idle_seconds
        self._subscribers: list[_Subscriber] = []
        self._active: frozenset[str] = frozenset()
        self._informer: Informer | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, name: str, handler: EventHandler,
                  enabled: Callable[[], bool] = lambda: True) -> None:
        """Hand every placed pod (``handler(event_type, pod, None)``) to ``handler`` while
        ``enabled()``; ``name`` identifies the subscriber (unique)."""
        self._subscribers.append(_Subscriber(name, handler, enabled))
        self._changed.set()

    @property
    def listing(self) -> bool:
        """True while the watch's (re)list hands its pods on (they may have been placed
        long ago); False for a pod the watch reports as it is placed or changes."""
        return self._informer is not None and self._informer.listing

    @property
    def running(self) -> bool:
        """True while the list+watch runs (some subscriber is enabled)."""
        return self._informer is not None

    def changed(self) -> None:
        """A switch may have changed (the config did): read them again now."""
        self._changed.set()

    def start(self) -> None:
        """Start (the leader calls this); idempotent."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="placed pods")

    async def stop(self) -> None:
        """Stop the watch (the term ended)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        try:
            while True:
                self._changed.clear()
                await self._apply(frozenset(s.name for s in self._subscribers
                                            if _enabled(s)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.idle_seconds)
        finally:
            self._active = frozenset()
            if self._informer is not None:
                await self._informer.stop()
                self._informer = None

    async def _apply(self, wanted: frozenset[str]) -> None:
        """Run the watch for the ``wanted`` subscribers: stopped when none is, started over
        when one joins (so it sees every placed pod)."""
        joined = wanted - self._active
        self._active = wanted
        if self._informer is not None and (not wanted or joined):
            await self._informer.stop()
            self._informer = None
        if wanted and self._informer is None:
            log.info("watching placed pods for %s", ", ".join(sorted(wanted)))
            self._informer = Informer(self.api, PODS_PATH, {"labelSelector": WATCH_SELECTOR},
                                      name="placed pods", watch_timeout=self.watch_timeout,
                                      min_backoff=0.5, keep_cache=False,
                                      coalesce=READ_COALESCE_SECONDS)
            self._informer.add_handler(self._on_pod)
            self._informer.start()

    def _on_pod(self, etype: str, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        for s in self._subscribers:
            if s.name in self._active:
                try:
                    s.handler(etype, pod, old)
                except Exception:
                    log.exception("placed pods: %s failed on %s", s.name, etype)


def _enabled(s: _Subscriber) -> bool:
    try:
        return bool(s.enabled())
    except Exception:
        log.exception("placed pods: the switch of %s failed", s.name)
        return False
