"""The controller's side of the webhook's inspection reports: it watches the ConfigMap
:data:`~rules.admit.inspectionreport.REPORT_CONFIGMAP` of its own namespace, validates each
webhook replica's key (:func:`rules.admit.inspectionreport.read_report`; an entry is
validated when it is looked up, :func:`~rules.admit.inspectionreport.reported_result`), so
that the admission feed (:mod:`controller.admissionfeed`) publishes an
image the webhook placed a pod with from the webhook's anonymous result instead of fetching
it again (docs/how-it-decides.md, "The catalog fills itself from every path").

Every replica keeps the watch (one small object: a field selector on its name); the leader
creates the ConfigMap when it is missing (:meth:`InspectionReports.ensure`: the webhook may
only patch it). A key that is not of this release's format (an older or newer webhook, a
hand edit) is ignored with one log line per change; so is a key over the bounds, a key
beyond :data:`~rules.admit.inspectionreport.MAX_KEYS`, and a malformed entry looked up
(counted).
An upgrade from a webhook that writes no report leaves no key: the feed then fetches at
once, as before (:meth:`InspectionReports.reporting`).

What the report says is only ever looked up for an image of a pod the controller saw placed
(the feed), never copied wholesale into the catalog; the publisher's rules (anonymous pods
only, exclusions, the catalog's bounds and ages) apply to it as to the controller's own
inspections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from podplacement.imageinspect import ImageInfo
from podplacement.kubeclient import ApiError, Conflict, Informer, KubeAPI, resource_path
from podplacement.rules.admit.inspectionreport import (
    MAX_KEYS,
    REPORT_CONFIGMAP,
    STALE_KEY_SECONDS,
    RawReport,
    read_report,
    reported_result,
)

__all__ = ["API_REQUESTS", "InspectionReports", "reports_collection_path"]

log = logging.getLogger(__name__)

#: ``(method, path template)`` of this module's requests: the watch (list + watch of one
#: object by field selector) and the leader's creation of the ConfigMap.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", "/api/v1/namespaces/{namespace}/configmaps"),
    ("POST", "/api/v1/namespaces/{namespace}/configmaps"),
)

Listener = Callable[[], None]


def reports_collection_path(namespace: str) -> str:
    """The ConfigMaps collection of ``namespace`` (listed and watched by field selector)."""
    return resource_path("", "v1", "configmaps", namespace=namespace)


class InspectionReports:
    """The webhook's reports, validated and indexed by image (module docstring).

    Args:
        api: the controller's client.
        namespace: the product's namespace.
        ttl: the config's ``imageInspection.cacheTTL`` in seconds (a tag answered that long
            ago is not taken).
        clock: unix seconds.
        watch_timeout: the informer's watch timeout (seconds).
    """

    def __init__(self, api: KubeAPI, namespace: str, *, ttl: Callable[[], float],
                 clock: Callable[[], float] = time.time, watch_timeout: int = 300) -> None:
        self.api, self.namespace, self.ttl, self.clock = api, namespace, ttl, clock
        self.informer = Informer(
            api, reports_collection_path(namespace),
            {"fieldSelector": f"metadata.name={REPORT_CONFIGMAP}"},
            name="inspection reports", watch_timeout=watch_timeout, max_backoff=10.0,
            keep_cache=False)
        self.informer.add_handler(self._on_event)
        #: key → (its text, what it says)
        self._keys: dict[str, tuple[str, RawReport]] = {}
        #: key → the reason it is ignored (logged once per change)
        self._ignored: dict[str, str] = {}
        self._listeners: list[Listener] = []
        self._exists = False
        #: entries looked up and found malformed or expired (tests)
        self.skipped = 0

    # --- reading ---------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        """Call ``listener()`` after each change of the reports (in the event loop; it must
        not block): the images it waits for may be there now (:meth:`get`)."""
        self._listeners.append(listener)

    def get(self, image: str) -> ImageInfo | None:
        """The newest reported anonymous result of ``image`` (as written in pod specs),
        validated now (:func:`rules.admit.inspectionreport.reported_result`), or None: no
        replica reported it, or not validly."""
        best: ImageInfo | None = None
        now, ttl = self.clock(), self.ttl()
        for _, report in self._keys.values():
            raw = report.images.get(image)
            if raw is None:
                continue
            result = reported_result(image, raw, now=now, ttl=ttl)
            if result is None:
                self.skipped += 1
            elif best is None or (result.fetched_at or 0) > (best.fetched_at or 0):
                best = result
        return best

    def reporting(self) -> bool:
        """True when a webhook replica wrote a report of this format within
        :data:`~rules.admit.inspectionreport.STALE_KEY_SECONDS`: the feed then waits a
        moment for the report of an image placed by the webhook before fetching it."""
        limit = self.clock() - STALE_KEY_SECONDS
        return any(report.written > limit for _, report in self._keys.values())

    def _on_event(self, etype: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        """Read each key that changed (one JSON decode each; entries are validated when
        looked up), then tell the listeners."""
        meta = obj.get("metadata") or {}
        if meta.get("name") != REPORT_CONFIGMAP:
            return
        if etype == "DELETED":
            self._exists = False
            self._keys.clear()
            return
        self._exists = True
        data = obj.get("data")
        data = data if isinstance(data, dict) else {}
        now = self.clock()
        kept: dict[str, tuple[str, RawReport]] = {}
        for n, (key, text) in enumerate(sorted(data.items())):
            if n >= MAX_KEYS:
                self._ignore(str(key), f"more than {MAX_KEYS} replicas report")
                continue
            prior = self._keys.get(key)
            if prior is not None and prior[0] == text:
                kept[key] = prior
                continue
            report = read_report(text, now=now)
            if isinstance(report, str):
                self._ignore(str(key), report)
                continue
            self._ignored.pop(key, None)
            kept[key] = (text, report)
        self._keys = kept
        for listener in self._listeners:
            listener()

    def _ignore(self, key: str, reason: str) -> None:
        if self._ignored.get(key) != reason:
            log.warning("inspection report of webhook replica %s ignored: %s", key[:80], reason)
        self._ignored[key] = reason

    # --- the ConfigMap ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the watch."""
        self.informer.start()

    async def stop(self) -> None:
        """Stop the watch and forget the reports."""
        await self.informer.stop()
        self._keys.clear()

    async def ensure(self) -> bool:
        """Create the ConfigMap when the watch has listed it absent (the leader calls this;
        the webhook may only patch it). Returns True when it exists or was created; logs
        and returns False on an API error (the next call tries again)."""
        await self.informer.synced.wait()
        if self._exists:
            return True
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": REPORT_CONFIGMAP, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/part-of": "podplacement",
                                        "app.kubernetes.io/component": "inspection-report"}},
                "data": {}}
        try:
            await self.api.request("POST", reports_collection_path(self.namespace), body=body)
        except Conflict:
            return True
        except ApiError as exc:
            log.warning("inspection report ConfigMap not created: %s", exc)
            return False
        log.info("created ConfigMap %s/%s for the webhook's inspection reports",
                 self.namespace, REPORT_CONFIGMAP)
        return True

    async def keep(self, stop: asyncio.Event) -> None:
        """The leader's loop: :meth:`ensure` now, and again after the ConfigMap was deleted
        (checked every 10 s), until ``stop`` is set."""
        while not stop.is_set():
            await self.ensure()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 10.0)

