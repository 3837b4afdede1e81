"""Kubernetes Events about pods, sent in the background so they never delay an ungate.

One Event per decision (Normal ``PlacementDecided`` or a Warning; see
:mod:`rules.place.decision`). Events go through a bounded queue drained by a few sender
tasks; when the queue is full the event is dropped and counted (an event is advice, the
pod patch is what matters). Written as ``events.k8s.io/v1`` Events (``eventTime`` with
microseconds, ``reportingController``, ``action``, ``note`` <= 1 kB: the checks the real
server makes, ``reference/events.json``), falling back to core/v1 Events when the
events.k8s.io group is not served (404).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any

from podplacement.kubeclient import ApiError, KubeAPI, resource_path
from podplacement.rules.place.decision import EventSpec

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "podplacement.io/controller"
SOURCE_COMPONENT = "podplacement-controller"


def _micro_time(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    pod: Mapping[str, Any], spec: EventSpec, *, instance: str, now: dt.datetime | None = None,
    api: str = "events.k8s.io/v1",
) -> dict[str, Any]:
    """The Event object for ``spec`` about ``pod`` (``api``: ``events.k8s.io/v1`` or ``v1``)."""
    now = now or dt.datetime.now(dt.UTC)
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace") or "default")
    name = f"{meta.get('name')}.{secrets.token_hex(8)}"
    ref = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": ns,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    message = spec.message if len(spec.message) <= 1000 else spec.message[:997] + "..."
    if api == "v1":
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": ref,
            "reason": spec.reason,
            "type": spec.type,
            "message": message,
            "source": {"component": SOURCE_COMPONENT},
            "firstTimestamp": _time(now),
            "lastTimestamp": _time(now),
            "count": 1,
            "reportingComponent": REPORTING_CONTROLLER,
            "reportingInstance": instance,
        }
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": _micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "action": spec.action,
        "reason": spec.reason,
        "regarding": ref,
        "note": message,
        "type": spec.type,
    }


class EventSink:
    """Background Event sender.

    Args:
        api: the Kubernetes client.
        enabled: False drops every event (``--no-events``).
        instance: ``reportingInstance`` (defaults to the host name).
        max_queue: bounded queue size; overflow is dropped and counted in ``dropped``.
        senders: concurrent sender tasks.
    """

    def __init__(
        self,
        api: KubeAPI,
        *,
        enabled: bool = True,
        instance: str | None = None,
        max_queue: int = 10_000,
        senders: int = 4,
    ) -> None:
        self.api = api
        self.enabled = enabled
        self.instance = instance or os.environ.get("HOSTNAME") or "podplacement-controller"
        self._queue: asyncio.Queue[tuple[dict[str, Any], EventSpec]] = asyncio.Queue(max_queue)
        self._senders = senders
        self._tasks: list[asyncio.Task[None]] = []
        self._api_version = "events.k8s.io/v1"
        self.sent = 0
        self.dropped = 0
        self.failed = 0

    def emit(self, pod: Mapping[str, Any], spec: EventSpec) -> None:
        """Queue an event (never blocks; drops when disabled or full)."""
        if not self.enabled:
            return
        try:
            self._queue.put_nowait((dict(pod), spec))
        except asyncio.QueueFull:
            self.dropped += 1

    def start(self) -> None:
        """Start the sender tasks."""
        if not self.enabled or self._tasks:
            return
        for i in range(self._senders):
            self._tasks.append(asyncio.create_task(self._run(), name=f"events-{i}"))

    async def _send(self, pod: Mapping[str, Any], spec: EventSpec) -> None:
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        if self._api_version == "events.k8s.io/v1":
            body = event_body(pod, spec, instance=self.instance)
            try:
                await self.api.request(
                    "POST", resource_path("events.k8s.io", "v1", "events", namespace=ns),
                    body=body,
                )
                return
            except ApiError as exc:
                # An unserved group answers a text/plain 404 (reference/errors.json); a
                # Status 404 means the namespace is gone.
                if exc.status != 404 or exc.body is not None:
                    raise
                self._api_version = "v1"
        body = event_body(pod, spec, instance=self.instance, api="v1")
        await self.api.request("POST", resource_path("", "v1", "events", namespace=ns),
                               body=body)

    async def _run(self) -> None:
        while True:
            pod, spec = await self._queue.get()
            try:
                await self._send(pod, spec)
                self.sent += 1
            except ApiError as exc:
                self.failed += 1
                log.debug("event %s not sent: %s", spec.reason, exc)
            except Exception:
                self.failed += 1
                log.exception("event %s not sent", spec.reason)
            finally:
                self._queue.task_done()

    async def flush(self, wait_seconds: float = 5.0) -> None:
        """Wait (bounded) until the queued events are sent."""
        if not self._tasks:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), wait_seconds)

    async def stop(self) -> None:
        """Cancel the senders (queued events are dropped)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
