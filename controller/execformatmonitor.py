"""The exec-format-error monitor: watches the pods podplacement placed, records each
container that fails with an exec format error, and verifies the image's binaries once per
digest.

I/O around the pure rule of :mod:`controller.execformat`. A cache-less list+watch of the
pods labelled ``podplacement.io/node-affinity`` (every pod the product decided about, never
all pods; nothing kept per pod) hands each pod to :func:`controller.execformat.needs_work`;
a pod with something to write is queued by key on its own :class:`controller.queue.WorkQueue`
(the placement queue's depth stays the placement's). The per-pod reconcile reads the pod
again, writes the label ``podplacement.io/exec-format-error=true`` and the record annotation
in one merge patch guarded by ``resourceVersion`` (a conflict is retried with a fresh read),
and only after that write emits one Warning Event ``ExecFormatError`` per new (container,
restart) and counts ``podplacement_exec_format_errors_total{arch}``: the record on the pod
is what makes a second run, or another leader, silent. The first finding of an image digest
starts one verification of it (``imageinspect.verify_image`` with the pod's pull secrets and
the container's command), whose results go to the :class:`controller.findings.FindingsStore`
and, by a new round for the waiting pods, to their records (``explain`` shows them). Runs in
the leader only, while ``spec.plugins.execFormatErrorMonitor.enabled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from controller.bindingfeed import PODS_PATH
from controller.config import AFFINITY_LABEL, ARCH_LABEL, EXEC_FORMAT_LABEL, PlacementConfig
from controller.events import EventSink
from controller.execformat import (
    ExecFormatFinding,
    detect,
    event_spec,
    needs_work,
    record_patch,
    recorded,
    unreported,
    updated_record,
    verification_entry,
)
from controller.findings import FindingsStore, Verification
from controller.metrics import Metrics
from controller.queue import WorkQueue
from controller.reconciler import pod_key, split_key
from kubeclient import Conflict, Informer, KubeAPI, NotFound

log = logging.getLogger(__name__)

#: ``(method, path template)`` of every request the monitor sends (pods: the list+watch, the
#: read and the guarded patch; the pod's pull secrets for verification; Events). All are in
#: :data:`controller.app.API_REQUESTS`, whose grants ``tests/deploy`` checks: the monitor
#: needs no other permission.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", PODS_PATH),
    ("GET", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("PATCH", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("GET", "/api/v1/namespaces/{namespace}/secrets/{name}"),
    ("POST", "/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
    ("POST", "/api/v1/namespaces/{namespace}/events"),
)

#: The watch's label selector: the label every decision writes (``set`` or ``not-set``).
WATCH_SELECTOR = AFFINITY_LABEL
#: Pods remembered per digest while its verification runs (to queue them when it ends).
_MAX_WAITING = 1000
#: Verification results kept (digests; the oldest go first).
_MAX_VERIFIED = 10_000


class ExecFormatMonitor:
    """See the module docstring.

    Args:
        api: the Kubernetes client.
        nodes: the Node informer (the node's ``kubernetes.io/arch`` label).
        events: the Event sink.
        metrics: the controller's metrics.
        config_source: the current (config, error) pair.
        inspector: returns the current ``imageinspect.Inspector`` (registry rules, CAs).
        credentials: pod, config → its pull credentials (the reconciler's rule).
        store: where evidence is kept (one per controller; Learn reads it).
        watch_timeout: seconds per watch request.
        verify_max_bytes: byte cap per platform of one verification.
        clock: unix seconds.
    """

    def __init__(
        self,
        api: KubeAPI,
        *,
        nodes: Informer,
        events: EventSink,
        metrics: Metrics,
        config_source: Callable[[], tuple[PlacementConfig, str | None]],
        inspector: Callable[[], Any],
        credentials: Callable[[Mapping[str, Any], PlacementConfig], Awaitable[list[Any]]],
        store: FindingsStore | None = None,
        watch_timeout: int = 300,
        verify_max_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.nodes = nodes
        self.events = events
        self.metrics = metrics
        self.config_source = config_source
        self.inspector = inspector
        self.credentials = credentials
        self.store = store if store is not None else FindingsStore()
        self.watch_timeout = watch_timeout
        self.verify_max_bytes = verify_max_bytes
        self.clock = clock
        self.queue = WorkQueue(workers=2, rate=50.0, burst=100, retry_now=(Conflict,),
                               base_delay=0.2, max_delay=60.0)
        #: digest → its verification as the pods' records keep it (done ones only)
        self.verified: dict[str, dict[str, Any]] = {}
        self._verifying: dict[str, set[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the queue and the watch loop (the leader calls this)."""
        if self._runner is not None:
            return
        self.queue = WorkQueue(workers=2, rate=50.0, burst=100, retry_now=(Conflict,),
                               base_delay=0.2, max_delay=60.0)
        self.queue.start(self.reconcile)
        self._runner = asyncio.create_task(self._run(), name="exec format monitor")

    async def stop(self) -> None:
        """Stop the watch, the queue and any verification in flight."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None
        await self.queue.shutdown()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._verifying.clear()

    def config_changed(self) -> None:
        """The config changed: the watch loop re-reads ``execFormatErrorMonitor.enabled``."""
        self._changed.set()

    def enabled(self) -> bool:
        """``spec.plugins.execFormatErrorMonitor.enabled``."""
        return self.config_source()[0].exec_format_monitor

    async def _run(self, idle_seconds: float = 5.0) -> None:
        informer: Informer | None = None
        try:
            while True:
                if self.enabled() and informer is None:
                    informer = Informer(self.api, PODS_PATH, {"labelSelector": WATCH_SELECTOR},
                                        name="placed pods", watch_timeout=self.watch_timeout,
                                        min_backoff=0.5, keep_cache=False)
                    informer.add_handler(self.on_pod)
                    informer.start()
                elif not self.enabled() and informer is not None:
                    await informer.stop()
                    informer = None
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), idle_seconds)
        finally:
            if informer is not None:
                await informer.stop()

    # --- watch ---------------------------------------------------------------------------
    def on_pod(self, etype: str, pod: dict[str, Any], _old: dict[str, Any] | None) -> None:
        """Watch handler: queue the pod when it has something to write (pure check)."""
        key = pod_key(pod)
        if etype == "DELETED":
            self.queue.discard(key)
            return
        if needs_work(pod, self.verified.get):
            self.queue.add(key)

    # --- the reconcile -------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        """Read the pod, write its label and record, then emit the Events of what is new.

        Raises:
            Conflict: the pod changed since it was read (the queue retries at once).
            ApiError: another API failure (the queue backs off).
        """
        ns, name, uid = split_key(key)
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        try:
            pod = await self.api.request("GET", path)
        except NotFound:
            return None
        if (pod.get("metadata") or {}).get("uid") != uid:
            return None
        findings = detect(pod)
        if not findings:
            return None
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        arch = self._node_arch(node)
        for f in findings:
            self._verify_once(f, pod, key)
        new = unreported(pod, findings)
        record = updated_record(pod, new, arch=arch, node=node,
                                verification=self.verified.get)
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if record == recorded(pod) and EXEC_FORMAT_LABEL in labels:
            return None
        try:
            await self.api.request("PATCH", path, body=record_patch(pod, record))
        except NotFound:
            return None
        now = self.clock()
        for f in new:
            spec = event_spec(f, arch=arch, node=node)
            self.metrics.events.labels(spec.type).inc()
            self.events.emit(pod, spec)
            self.metrics.exec_format_errors.labels(arch).inc()
            if f.digest:
                self.store.record_error(f.digest, arch, (uid, f.container, f.restart_count), now)
            log.warning("pod %s/%s: %s", ns, name, spec.message)
        return None

    def _node_arch(self, node: str) -> str:
        obj = self.nodes.get(node) if node else None
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        return str(labels.get(ARCH_LABEL) or "unknown")

    # --- verification --------------------------------------------------------------------
    def _verify_once(self, f: ExecFormatFinding, pod: Mapping[str, Any], key: str) -> None:
        """Start the one verification of ``f.digest`` (nothing when it ran or runs)."""
        digest = f.digest
        if not digest or digest in self.verified:
            return
        waiting = self._verifying.get(digest)
        if waiting is not None:
            if len(waiting) < _MAX_WAITING:
                waiting.add(key)
            return
        self._verifying[digest] = {key}
        task = asyncio.create_task(self._verify(f, dict(pod)), name=f"verify {digest[:19]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _verify(self, f: ExecFormatFinding, pod: dict[str, Any]) -> None:
        digest = f.digest or ""
        arch = self._node_arch(str((pod.get("spec") or {}).get("nodeName") or ""))
        reference = f.reference or (f"{f.image.split('@')[0]}@{digest}" if f.image else "")
        try:
            from imageinspect import DEFAULT_MAX_BYTES, verify_image

            config = self.config_source()[0]
            creds = await self.credentials(pod, config)
            command, args = _command_of(pod, f)
            report = await verify_image(
                self.inspector(), reference, creds, command=command, args=args,
                max_bytes=self.verify_max_bytes or DEFAULT_MAX_BYTES)
            now = self.clock()
            status, reason = "skipped", f"no {arch} platform in the image"
            for p in report.platforms:
                self.metrics.image_verifications.labels(p.status).inc()
                self.store.record_verification(digest, p.architecture, Verification(
                    p.status, p.reason, now, reference))
                if p.architecture == arch:
                    status, reason = p.status, p.reason
            entry = verification_entry(status, reason, report.mismatched)
            log.info("verified %s for %s: %s (%s)", reference, arch, status, reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.image_verifications.labels("error").inc()
            entry = verification_entry("error", f"{type(exc).__name__}: {exc}", ())
            log.info("verification of %s failed: %s", reference, exc)
        self.verified[digest] = entry
        while len(self.verified) > _MAX_VERIFIED:
            self.verified.pop(next(iter(self.verified)))
        for key in self._verifying.pop(digest, set()):
            self.queue.add(key)


def _command_of(pod: Mapping[str, Any], f: ExecFormatFinding) -> tuple[
        Sequence[str] | None, Sequence[str] | None]:
    """The failing container's ``command`` and ``args`` from the pod spec."""
    spec = pod.get("spec") or {}
    for c in spec.get("initContainers" if f.init else "containers") or ():
        if isinstance(c, Mapping) and c.get("name") == f.container:
            return c.get("command") or None, c.get("args") or None
    return None, None
