"""The webhook's inspection report: its recent anonymous results, written for the controller
so that the catalog learns an image the webhook inspected without a second registry fetch
(docs/how-it-decides.md, "The catalog fills itself from every path"; the format and the
channel's rules: :mod:`rules.admit.inspectionreport`).

:meth:`InspectionReport.note` is called, in the event loop, with every result the webhook
placed a pod with or inspected (:class:`webhook.admitinspect.AdmissionInspector`): a dict
update, no I/O. A new entry (an image not noted yet, or a newer registry answer) marks the
report changed. :meth:`InspectionReport.run` writes it at most once per ``interval``
(1 s) while something changed: one JSON merge patch of this replica's key of the ConfigMap
:data:`~rules.admit.inspectionreport.REPORT_CONFIGMAP` (the key: the webhook's pod name),
also written every :data:`HEARTBEAT` seconds (so the controller knows a replica reports),
which also removes the keys of replicas that have not written for
:data:`~rules.admit.inspectionreport.STALE_KEY_SECONDS` (the patch's answer is the whole
ConfigMap: no extra read). Entries noted more than ``window`` seconds ago, or answered by
the registry ``cacheTTL`` ago, are dropped; the buffer holds
:data:`~rules.admit.inspectionreport.MAX_REPORT_ENTRIES` at most (the oldest out first).

Errors: the ConfigMap is missing (the leader creates it a moment after its start, or a
controller older than this webhook, which creates none and reads none): one log line, and the
write is tried again after 1, 2, 4 ... up to :data:`MAX_RETRY` seconds; any other API error:
one line per kind of error, retried the same way. The admission path never
waits for a write. On shutdown (:meth:`stop`) the replica removes its key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from podplacement.kubeclient import ApiError, KubeAPI, NotFound, resource_path
from podplacement.rules.admit.inspectionreport import (
    MAX_REFERENCE_LENGTH,
    REPORT_CONFIGMAP,
    STALE_KEY_SECONDS,
    ReportEntry,
    decode_written,
    encode_report,
    report_entry,
    valid_key,
)
from podplacement.rules.admit.inspectionreport import (
    MAX_REPORT_ENTRIES as MAX_ENTRIES,
)

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_WINDOW", "InspectionReport", "report_path"]

log = logging.getLogger(__name__)

#: Seconds between two writes at most once (while something changed).
DEFAULT_INTERVAL = 1.0
#: Seconds an entry stays in the report after it was last noted: the controller reads it
#: within seconds of the pod's placement, and a new leader learns the pods placed in the last
#: minute (:data:`controller.admissionfeed.EVENT_WINDOW_SECONDS`).
DEFAULT_WINDOW = 90.0
#: Seconds after which the key is written even if nothing changed: the controller waits for
#: reports only while some replica wrote within ``STALE_KEY_SECONDS`` (300).
HEARTBEAT = 60.0
#: Longest wait (seconds) before a write that failed is tried again.
MAX_RETRY = 30.0


def report_path(namespace: str) -> str:
    """The API path of the report ConfigMap in ``namespace``."""
    return resource_path("", "v1", "configmaps", namespace=namespace, name=REPORT_CONFIGMAP)


class InspectionReport:
    """This replica's report (module docstring).

    Args:
        api: the webhook's Kubernetes client.
        namespace: the product's namespace (where the ConfigMap is).
        key: this replica's key (its pod name; :func:`rules.admit.inspectionreport.
            valid_key`).
        ttl: the config's ``imageInspection.cacheTTL`` in seconds (read at every write).
        interval: seconds between writes at most once.
        window: seconds an entry stays after it was last noted.
        clock: unix seconds.

    Raises:
        ValueError: ``key`` is not a valid ConfigMap key.
    """

    def __init__(self, api: KubeAPI, namespace: str, key: str, *,
                 ttl: Callable[[], float], interval: float = DEFAULT_INTERVAL,
                 window: float = DEFAULT_WINDOW, clock: Callable[[], float] = time.time
                 ) -> None:
        if not valid_key(key):
            raise ValueError(f"{key[:80]!r} is not a ConfigMap key")
        self.api, self.namespace, self.key = api, namespace, key
        self.ttl, self.interval, self.window, self.clock = ttl, interval, window, clock
        #: image → (entry, when last noted); the least recently noted first
        self._entries: OrderedDict[str, tuple[ReportEntry, float]] = OrderedDict()
        self._changed = False
        self._stale: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._last_error = ""
        self._attempted = 0.0
        self._backoff = 0.0
        #: writes that succeeded (tests, benchmarks)
        self.writes = 0

    def note(self, image: str, result: Any) -> None:
        """Keep ``image``'s anonymous result (``imageinspect.ImageInfo``); cheap, no I/O.
        A result without a publishable entry (:func:`rules.admit.inspectionreport.
        report_entry`), or of a reference longer than the controller reads
        (:data:`~rules.admit.inspectionreport.MAX_REFERENCE_LENGTH`), is ignored."""
        if len(image) > MAX_REFERENCE_LENGTH:
            return
        now = self.clock()
        held = self._entries.get(image)
        if held is not None and result is not None and (
                held[0][1] == getattr(result, "digest", None)
                and held[0][2] >= int(getattr(result, "fetched_at", 0) or 0)):
            self._entries[image] = (held[0], now)
            self._entries.move_to_end(image)
            return
        entry = report_entry(result)
        if entry is None:
            return
        self._entries[image] = (entry, now)
        self._entries.move_to_end(image)
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)
        self._changed = True

    def __len__(self) -> int:
        return len(self._entries)

    def _prune(self, now: float) -> None:
        """Drop the entries noted ``window`` ago or answered ``ttl`` ago."""
        ttl = self.ttl()
        for image, (entry, noted) in list(self._entries.items()):
            if noted <= now - self.window or entry[2] <= now - ttl:
                del self._entries[image]
                self._changed = True

    async def write(self) -> bool:
        """Write this replica's key now (and remove the stale keys seen at the last write).

        Returns:
            True when written. Raises nothing: API errors are logged once per kind.
        """
        now = self.clock()
        self._prune(now)
        text, _ = encode_report({i: e for i, (e, _) in self._entries.items()}, now)
        data: dict[str, Any] = {self.key: text}
        data.update(dict.fromkeys(self._stale - {self.key}))
        self._changed = False
        self._attempted = now
        try:
            answer = await self.api.request("PATCH", report_path(self.namespace),
                                            body={"data": data})
        except NotFound:
            self._failed()
            self._error(f"ConfigMap {self.namespace}/{REPORT_CONFIGMAP} not found (not "
                        "created by the leader yet, or a controller older than this "
                        "webhook): until it is, the controller inspects the images itself",
                        "absent")
            return False
        except ApiError as exc:
            self._failed()
            self._error(f"report not written: HTTP {exc.status} {exc.reason}", str(exc.status))
            return False
        self._last_error = ""
        self._backoff = 0.0
        self.writes += 1
        self._stale = _stale_keys(answer, now)
        return True

    def _failed(self) -> None:
        """A write failed: write again (all of it) after the next backoff step."""
        self._changed = True
        self._backoff = min(MAX_RETRY, max(self.interval, 2 * self._backoff))

    def _error(self, message: str, kind: str) -> None:
        if kind != self._last_error:
            log.warning("inspection report: %s", message)
        self._last_error = kind

    async def run(self) -> None:
        """Write while something changed, at most once per ``interval``, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            if self._backoff and self.clock() - self._attempted < self._backoff:
                continue
            if (self._changed or self._stale or self._expiring()
                    or self.clock() - self._attempted >= HEARTBEAT):
                await self.write()

    def _expiring(self) -> bool:
        """True when the oldest entry is due to leave (a write then shrinks the key)."""
        if not self._entries:
            return False
        _, (entry, noted) = next(iter(self._entries.items()))
        now = self.clock()
        return noted <= now - self.window or entry[2] <= now - self.ttl()

    def start(self) -> None:
        """Start :meth:`run` as a task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="inspection report")

    async def stop(self) -> None:
        """Stop writing and remove this replica's key (best effort, bounded by the
        client's timeout)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        with contextlib.suppress(ApiError):
            await self.api.request("PATCH", report_path(self.namespace),
                                   body={"data": {self.key: None}}, request_timeout=5.0)


def _stale_keys(configmap: Any, now: float) -> set[str]:
    """The keys of ``configmap``'s data last written ``STALE_KEY_SECONDS`` ago, of any format
    version that says when it was written (removed with the next write); a key that does
    not say is left alone (the controller ignores it)."""
    data = configmap.get("data") if isinstance(configmap, dict) else None
    if not isinstance(data, dict):
        return set()
    out: set[str] = set()
    for key, text in data.items():
        written = decode_written(text)
        if written is not None and written <= now - STALE_KEY_SECONDS:
            out.add(str(key))
    return out
