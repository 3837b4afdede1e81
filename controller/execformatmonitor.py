"""The exec-format-error monitor: watches the pods podplacement placed, records each
container that fails with an exec format error, verifies the image's binaries once per
digest, learns which (digest, platform) pairs are wrong, and, when asked, deletes a failing
pod so that its owner recreates it elsewhere.

I/O around the pure rules of :mod:`rules.monitor.execformat` (detection, verify on suspicion),
:mod:`rules.findings` (what is proof) and :mod:`rules.learn` (exclusions, the
remedy). The controller's cache-less watch of the pods labelled
``podplacement.io/node-affinity`` (:class:`controller.placedwatch.PlacedPods`: every pod the
product decided about, never all pods; nothing kept per pod; it hands pods to
:meth:`ExecFormatMonitor.on_pod` while :meth:`ExecFormatMonitor.enabled`) hands each pod
to :func:`rules.monitor.execformat.needs_work`; a pod with something to do is queued by key on
its own :class:`controller.generic.Controller` (key type :data:`controller.generic.PodKey`;
its queue, workers and the learn loop; the placement queue's depth stays the placement's).
The per-pod reconcile reads the pod again, starts the one verification of each
digest it needs (a finding's, or a suspicion's: the runc/crun shape without words), writes
the label ``podplacement.io/exec-format-error=true`` and the record annotation in one merge
patch guarded by ``resourceVersion`` (a conflict is retried with a fresh read), and only
after that write emits one Warning Event ``ExecFormatError`` per new (container, restart),
counts ``podplacement_exec_format_errors_total{arch}`` and the evidence in the
:class:`rules.findings.FindingsStore`: the record on the pod is what makes a second
run, or another leader, silent. A suspicion is written only once its verification flags the
node's platform; one whose verification passes leaves no trace on the pod.

Learning (``spec.plugins.execFormatErrorMonitor.learn``): a loop (every ``tick_seconds``,
and at once after new evidence) expires evidence one ``imageInspection.cacheTTL`` after its
latest part, computes the exclusions in force (:func:`rules.learn.exclusions`) and
publishes them, with the pods deleted by the remedy, in the PodPlacementConfig's
``status.execFormatErrorMonitor`` (a merge patch of the status subresource, written only
when it differs): that is where the webhook reads them (it watches the object already), and
where a new leader or a restarted controller takes them back (:meth:`ExecFormatMonitor.adopt`,
times cut to now), with the evidence below the threshold re-derived from the pods' statuses
as the watch lists them (the records say only what was reported: a pod's creator can write
them, so they are never evidence; docs/exec-format-errors.md, "What is evidence"). Errors
are evidence for their pod's namespace only; the verification, of the image's own program,
for every namespace.
Then ``on_excluded`` lets the controller take the excluded digests out of the admission
policy's catalog. The remedy (``deleteFailedPods``): a failing pod whose pair is excluded and
whose controlling owner is a ReplicaSet, StatefulSet or Job is deleted
(:func:`controller.poddelete.delete_pod`: its UID as precondition), at most one pod per owner
per TTL. Runs in the leader only, while
``spec.plugins.execFormatErrorMonitor.enabled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podplacement.controller.bindingfeed import PODS_PATH
from podplacement.controller.events import EventSink
from podplacement.controller.generic import POD_KEYS, Controller, PodKey, QueueSettings
from podplacement.controller.metrics import Metrics
from podplacement.controller.poddelete import GONE, REFUSED, delete_pod
from podplacement.controller.reconciler import pod_key, split_key
from podplacement.kubeclient import Informer, KubeAPI, NotFound, pod_path, resource_path
from podplacement.rules.config import (
    ARCH_LABEL,
    CONFIG_NAME,
    CONFIG_PLURAL,
    EXEC_FORMAT_LABEL,
    EXEC_FORMAT_REASON,
    GROUP,
    LINUX,
    OS_LABEL,
    VERSION,
    ExcludedPlatform,
    PlacementConfig,
    excluded_from_status,
)
from podplacement.rules.findings import FindingsStore, Verification, seen_at
from podplacement.rules.learn import (
    DeletedPod,
    deleted_from_status,
    describe,
    exclusions,
    hit,
    remedy_owner,
    status_patch,
)
from podplacement.rules.monitor.execformat import (
    PROOF_MESSAGE,
    ExecFormatFinding,
    detect,
    event_spec,
    findings_of,
    needs_work,
    pending_suspicions,
    placement_digests,
    record_patch,
    recorded,
    spec_image,
    unreported,
    updated_record,
    verification_entry,
)
from podplacement.rules.place.decision import WARNING, EventSpec

log = logging.getLogger(__name__)

#: The PodPlacementConfig's status subresource, where the exclusions are published.
CONFIG_STATUS_PATH = resource_path(GROUP, VERSION, CONFIG_PLURAL, name=CONFIG_NAME,
                                   subresource="status")

#: ``(method, path template)`` of every request the monitor sends (pods: the list+watch, the
#: read, the guarded patch and the remedy's delete; the pod's pull secrets for verification;
#: Events; the config's status). All are in :data:`controller.app.API_REQUESTS` or
#: :data:`controller.lifecycle.API_REQUESTS`, whose grants ``tests/deploy`` checks.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", PODS_PATH),
    ("GET", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("PATCH", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("GET", "/api/v1/namespaces/{namespace}/secrets/{name}"),
    ("POST", "/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
    ("POST", "/api/v1/namespaces/{namespace}/events"),
    ("PATCH", CONFIG_STATUS_PATH),
)

#: The monitor's queue: 2 workers, 50 keys/s (burst 100), retries after 0.2..60 s.
QUEUE = QueueSettings(workers=2, rate=50.0, burst=100, base_delay=0.2, max_delay=60.0)
#: Pods remembered per digest while its verification runs (to queue them when it ends).
_MAX_WAITING = 1000
#: Verification results kept (digests; the oldest go first).
_MAX_VERIFIED = 10_000
#: Verifications running at once.
_MAX_VERIFYING = 4
#: Seconds between publishing an exclusion (config status, catalog) and the first pod the
#: remedy deletes for it: the webhook's watch of the config sees the status within them.
REMEDY_GRACE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class _PlatformResult:
    status: str
    reason: str
    manifest: str


@dataclass(slots=True)
class _Verified:
    """One digest's verification: when, what (the index digest), per platform the result;
    ``error`` when it failed as a whole."""

    checked_at: float
    digest: str = ""
    platforms: dict[str, _PlatformResult] = field(default_factory=dict)
    error: str | None = None

    def entry(self, architecture: str, os: str) -> dict[str, Any]:
        """The record entry for a node of ``os``/``architecture``."""
        mismatched = tuple(p for p, r in self.platforms.items() if r.status == "mismatch")
        if self.error is not None:
            return verification_entry("error", self.error, (), at=self.checked_at)
        for platform, result in self.platforms.items():
            parts = platform.split("/")
            if len(parts) >= 2 and (parts[0], parts[1]) == (os, architecture):
                return verification_entry(result.status, result.reason, mismatched,
                                          at=self.checked_at)
        return verification_entry("skipped", f"no {os}/{architecture} platform in the image",
                                  mismatched, at=self.checked_at)


class ExecFormatMonitor:
    """See the module docstring.

    Args:
        api: the Kubernetes client.
        nodes: the Node informer (the node's ``kubernetes.io/arch`` and ``os`` labels).
        events: the Event sink.
        metrics: the controller's metrics.
        config_source: the current (config, error) pair.
        inspector: returns the current ``imageinspect.Inspector`` (registry rules, CAs).
        credentials: pod, config → its pull credentials (the reconciler's rule).
        store: where evidence is kept (one per controller).
        config_object: the live PodPlacementConfig ``cluster`` (its status holds the
            published exclusions), or None while it does not exist.
        on_excluded: awaited with the exclusions in force after each change (the
            controller takes their digests out of the admission policy's catalog and
            writes it before returning).
        verify_max_bytes: byte cap per platform of one verification.
        tick_seconds: period of the learn loop (expiry, status).
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
        config_object: Callable[[], Mapping[str, Any] | None] = lambda: None,
        on_excluded: Callable[[tuple[ExcludedPlatform, ...]], Awaitable[None]] | None = None,
        verify_max_bytes: int | None = None,
        tick_seconds: float = 5.0,
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
        self.config_object = config_object
        self.on_excluded = on_excluded
        self.verify_max_bytes = verify_max_bytes
        self.tick_seconds = tick_seconds
        self.clock = clock
        self.queue: Controller[PodKey] = Controller("exec format monitor", self.reconcile, QUEUE,
                                                    codec=POD_KEYS, loop=self._run)
        #: (digest, scope) → its verification (done ones only); scope "" is every platform
        #: (after an exec format error), "os/arch" the node's platform only (a suspicion)
        self.reports: dict[tuple[str, str], _Verified] = {}
        #: the exclusions in force, as last computed (read by the controller's placement)
        self.current: tuple[ExcludedPlatform, ...] = ()
        #: owner UID → the pod the remedy deleted for it (one per owner per TTL)
        self.deleted: dict[str, DeletedPod] = {}
        self._refused: dict[str, float] = {}
        self._verifying: dict[tuple[str, str], set[PodKey]] = {}
        self._slots = asyncio.Semaphore(_MAX_VERIFYING)
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._learned = asyncio.Event()
        self._adopted = False
        self._published_digests: frozenset[str] = frozenset()
        self._published_at = 0.0

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the queue and the learn loop (the leader calls this; the pods come from
        the controller's watch of placed pods, :meth:`on_pod`)."""
        if self.queue.running:
            return
        self._adopted = False
        self.queue.start()

    async def stop(self) -> None:
        """Stop the learn loop, the queue and any verification in flight."""
        await self.queue.stop()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._verifying.clear()
        self.current = ()

    def config_changed(self) -> None:
        """The config changed: the loop re-reads ``execFormatErrorMonitor``."""
        self._changed.set()

    def enabled(self) -> bool:
        """``spec.plugins.execFormatErrorMonitor.enabled``."""
        return self.config_source()[0].exec_format_monitor

    async def _run(self) -> None:
        while True:
            if self.enabled():
                try:
                    await self.learn()
                except Exception:  # the next tick retries; never end the loop
                    log.exception("exec format errors: learning failed")
            self._changed.clear()
            self._learned.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self._changed, self._learned)]
            try:
                await asyncio.wait(waits, timeout=self.tick_seconds,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    # --- watch ---------------------------------------------------------------------------
    def on_pod(self, etype: str, pod: dict[str, Any], _old: dict[str, Any] | None) -> None:
        """Watch handler: take back the evidence the pod's record holds, and queue the pod
        when it has something to do (pure checks)."""
        key = PodKey(pod_key(pod))
        if etype == "DELETED":
            self.queue.discard(key)
            return
        self._seed(pod)
        os, arch = self._node_platform(str((pod.get("spec") or {}).get("nodeName") or ""))
        if (needs_work(pod, self._verification(arch, os), architecture=arch, os=os)
                or self._remedy_due(pod, arch, os)):
            self.queue.add(key)

    def _seed(self, pod: Mapping[str, Any]) -> None:
        """Count again, after a restart or a leader change, the errors the pod reported
        before (each once: pod UID, container, restart), when seen within the TTL.

        The pod's record annotation is not evidence: its creator can write it at creation
        (docs/exec-format-errors.md, "What is evidence"). Only what the controller re-derives
        counts: a container whose *status* shows the runtime's words now
        (:func:`rules.monitor.execformat.detect`), its digest from the status ``imageID``, the
        architecture from its node's label, in the pod's namespace. The record only says
        that the finding was reported (its ``restartCount``) and when; that time is cut to
        now (:func:`rules.findings.seen_at`). Its ``verified`` part is never read: the
        exclusions the controller's verifications proved come back from the config's
        status (:meth:`adopt`)."""
        record = recorded(pod)
        if not record["containers"]:
            return
        meta = pod.get("metadata") or {}
        uid, namespace = str(meta.get("uid") or ""), str(meta.get("namespace") or "")
        if not uid or not namespace:
            return
        os, arch = self._node_platform(str((pod.get("spec") or {}).get("nodeName") or ""))
        ttl = self.config_source()[0].image_inspection.cache_ttl_seconds
        now = self.clock()
        aliases = placement_digests(pod)
        for f in detect(pod):
            item = record["containers"].get(f.container)
            if not isinstance(item, dict) or item.get("restartCount") != f.restart_count:
                continue  # not reported yet: the reconcile counts it
            at = seen_at(item.get("at"), now)
            if f.digest is None or arch == "unknown" or at is None or at <= now - ttl:
                continue
            self.store.record_error(f.digest, arch, (uid, f.container, f.restart_count), at,
                                    namespace=namespace, os=os,
                                    aliases=[aliases[f.container]] if f.container in aliases
                                    else (), image=spec_image(pod, f))

    # --- the reconcile -------------------------------------------------------------------
    async def reconcile(self, key: PodKey) -> float | None:
        """Read the pod, start the verifications it needs, write its label and record, emit
        the Events of what is new, and apply the remedy when it is due.

        Raises:
            Conflict: the pod changed since it was read (the queue retries at once).
            ApiError: another API failure (the queue backs off).
        """
        ns, name, uid = split_key(key)
        path = pod_path(ns, name)
        try:
            pod = await self.api.request("GET", path)
        except NotFound:
            return None
        if (pod.get("metadata") or {}).get("uid") != uid:
            return None
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        os, arch = self._node_platform(node)
        verification = self._verification(arch, os)
        for s in pending_suspicions(pod, verification):
            self._verify_once(s.finding, pod, key, scope=f"{os}/{arch}")
        findings = findings_of(pod, verification, architecture=arch, os=os)
        if not findings:
            return None
        for f in findings:
            if f.proof == PROOF_MESSAGE:
                self._verify_once(f, pod, key)
        new = unreported(pod, findings)
        now = self.clock()
        record = updated_record(pod, new, arch=arch, node=node, verification=verification,
                                findings=findings, at=now)
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if record != recorded(pod) or EXEC_FORMAT_LABEL not in labels:
            try:
                await self.api.request("PATCH", path, body=record_patch(pod, record))
            except NotFound:
                return None
            aliases = placement_digests(pod)
            for f in new:
                spec = event_spec(f, arch=arch, node=node,
                                  verified=verification(f.digest) if f.digest else None)
                self.metrics.events.labels(spec.type).inc()
                self.events.emit(pod, spec)
                self.metrics.exec_format_errors.labels(arch).inc()
                if f.digest:
                    self.store.record_error(
                        f.digest, arch, (uid, f.container, f.restart_count), now,
                        namespace=ns, os=os,
                        aliases=[aliases[f.container]] if f.container in aliases else (),
                        image=spec_image(pod, f))
                log.warning("pod %s/%s: %s", ns, name, spec.message)
            if new:
                self._refresh(now)
                self._learned.set()
        return await self._remedy(pod, findings, arch, os)

    def _node_platform(self, node: str) -> tuple[str, str]:
        obj = self.nodes.get(node) if node else None
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        return str(labels.get(OS_LABEL) or LINUX), str(labels.get(ARCH_LABEL) or "unknown")

    def _verification(self, arch: str, os: str) -> Callable[[str], dict[str, Any] | None]:
        """digest → the record entry of its verification for a node of ``os``/``arch``
        (of every platform, else of that platform alone), or None."""
        def entry(digest: str) -> dict[str, Any] | None:
            done = self.reports.get((digest, "")) or self.reports.get((digest, f"{os}/{arch}"))
            return done.entry(arch, os) if done is not None else None
        return entry

    # --- verification --------------------------------------------------------------------
    def _verify_once(self, f: ExecFormatFinding, pod: Mapping[str, Any], key: PodKey, *,
                     scope: str = "") -> None:
        """Start the one verification of ``f.digest`` for ``scope`` (every platform, or the
        ``os/arch`` of a suspicion's node); nothing when it ran, or runs, for that scope or
        for every platform."""
        digest = f.digest
        if not digest or (digest, "") in self.reports or (digest, scope) in self.reports:
            return
        waiting = self._verifying.get((digest, scope))
        if waiting is not None:
            if len(waiting) < _MAX_WAITING:
                waiting.add(key)
            return
        self._verifying[(digest, scope)] = {key}
        task = asyncio.create_task(self._verify(f, dict(pod), scope),
                                   name=f"verify {digest[:19]} {scope or 'all'}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _verify(self, f: ExecFormatFinding, pod: dict[str, Any], scope: str) -> None:
        digest = f.digest or ""
        base = (spec_image(pod, f) or f.image).split("@")[0]
        reference = f.reference or (f"{base}@{digest}" if base else "")
        try:
            from podplacement.imageinspect import DEFAULT_MAX_BYTES, verify_image

            async with self._slots:
                config = self.config_source()[0]
                creds = await self.credentials(pod, config)
                # the image's own Entrypoint and Cmd, never the pod's command or args: a
                # verification excludes a platform in every namespace, and a pod's creator
                # could name any file of the image (docs/exec-format-errors.md, "What is
                # evidence")
                report = await verify_image(
                    self.inspector(), reference, creds, command=None, args=None,
                    max_bytes=self.verify_max_bytes or DEFAULT_MAX_BYTES,
                    platforms=[scope] if scope else None)
            now = self.clock()
            done = _Verified(now, report.digest)
            for p in report.platforms:
                self.metrics.image_verifications.labels(p.status).inc()
                done.platforms[p.platform] = _PlatformResult(p.status, p.reason, p.manifest)
                os_name = p.platform.split("/")[0]
                self.store.record_verification(
                    digest, p.architecture, Verification(p.status, p.reason, now, reference),
                    os=os_name, aliases=[a for a in (report.digest, p.manifest) if a],
                    image=spec_image(pod, f) or f.image)
            log.info("verified %s: %s", reference,
                     ", ".join(f"{p}: {r.status}" for p, r in done.platforms.items()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.image_verifications.labels("error").inc()
            done = _Verified(self.clock(), error=f"{type(exc).__name__}: {exc}"[:300])
            log.info("verification of %s failed: %s", reference, exc)
        self.reports[(digest, scope)] = done
        while len(self.reports) > _MAX_VERIFIED:
            self.reports.pop(next(iter(self.reports)))
        self._refresh(self.clock())
        self._learned.set()
        for key in self._verifying.pop((digest, scope), set()):
            self.queue.add(key)

    # --- learning ------------------------------------------------------------------------
    def _ttl(self) -> float:
        return self.config_source()[0].image_inspection.cache_ttl_seconds

    def _refresh(self, now: float) -> tuple[ExcludedPlatform, ...]:
        """Recompute :attr:`current` from the store (pure; no write)."""
        config = self.config_source()[0]
        self.current = (exclusions(self.store, now=now, ttl=self._ttl())
                        if config.exec_format_learn else ())
        self.metrics.exec_format_exclusions.set(len(self.current))
        return self.current

    def adopt(self, obj: Mapping[str, Any], now: float) -> int:
        """Take back what a PodPlacementConfig's status published (a restart, a new
        leader): each exclusion still in force becomes evidence again (its error count as a
        floor, its proof, its namespace, its last evidence time cut to ``now``; the expiry
        follows from those, so it is at most one TTL after ``now``), and each pod deleted
        within the TTL keeps its owner from a second deletion. Items the status parser
        refuses (:meth:`rules.config.ExcludedPlatform.from_status`: an earlier release's,
        errors without a namespace) are not taken back. Returns the exclusions adopted."""
        ttl = self._ttl()
        count = 0
        for x in excluded_from_status(obj, max_age=ttl):
            last_seen = seen_at(x.last_seen, now)
            if last_seen is None or last_seen + ttl <= now or x.expires <= now:
                continue
            self.store.adopt(x.digests, x.architecture, os=x.os, proof=x.proof,
                             errors=x.errors, last_seen=last_seen, image=x.image,
                             reason=x.reason, namespace=x.namespace,
                             since=seen_at(x.since, last_seen) or last_seen)
            count += 1
        for d in deleted_from_status(obj):
            if d.at > now - ttl:
                self.deleted.setdefault(d.owner_uid, d)
        return count

    async def learn(self) -> None:
        """One round of the learn loop: take back the published state once, expire old
        evidence, recompute the exclusions, publish them in the config's status when they
        differ, then hand them to ``on_excluded``.

        Raises:
            ApiError: the status write failed (the next round retries).
        """
        now = self.clock()
        ttl = self._ttl()
        obj = self.config_object()
        if not self._adopted and obj is not None:
            adopted = self.adopt(obj, now)
            self._adopted = True
            if adopted:
                log.info("took back %d exclusions learned from exec format errors", adopted)
        self.store.expire(now, ttl)
        for done in [k for k, v in self.reports.items() if v.checked_at <= now - ttl]:
            self.reports.pop(done, None)
        for owner in [o for o, d in self.deleted.items() if d.at <= now - ttl]:
            self.deleted.pop(owner, None)
        for owner in [o for o, at in self._refused.items() if at <= now - ttl]:
            self._refused.pop(owner, None)
        current = self._refresh(now)
        if obj is not None and self._adopted:
            desired = status_patch(current, sorted(self.deleted.values(), key=lambda d: d.at))
            live = (obj.get("status") or {}).get("execFormatErrorMonitor") or {}
            wanted = desired["status"]["execFormatErrorMonitor"]
            if {k: live.get(k) or [] for k in wanted} != wanted:
                try:
                    await self.api.request("PATCH", CONFIG_STATUS_PATH, body=desired)
                except NotFound:
                    pass
        digests = frozenset(d for x in current for d in x.digests)
        if digests != self._published_digests:
            if self.on_excluded is not None:
                await self.on_excluded(current)
            self._published_digests, self._published_at = digests, now

    # --- the remedy ----------------------------------------------------------------------
    def _remedy_due(self, pod: Mapping[str, Any], arch: str, os: str) -> bool:
        """Whether ``deleteFailedPods`` would delete ``pod`` now (pure check)."""
        config = self.config_source()[0]
        if not (config.delete_failed_pods and config.exec_format_learn and self.current):
            return False
        owner = remedy_owner(pod)
        if owner is None or owner[2] in self.deleted or owner[2] in self._refused:
            return False
        findings = findings_of(pod, self._verification(arch, os), architecture=arch, os=os)
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        return any(hit(f.digest, os, arch, self.current, namespace=namespace)
                   for f in findings)

    async def _remedy(self, pod: Mapping[str, Any], findings: Sequence[ExecFormatFinding],
                      arch: str, os: str) -> float | None:
        """Delete ``pod`` when :meth:`_remedy_due` (its UID as precondition), once per owner
        per TTL; a Warning ``ExecFormatError`` (action ``Delete``) says why.

        Not before the exclusion is published where the new pod will be placed (the
        config's status, which the webhook reads, and the admission policy's catalog
        without the image) and :data:`REMEDY_GRACE_SECONDS` have passed for the webhook's
        watch to see it: until then the learn loop is woken and the delay is returned (the
        queue runs the pod again after it)."""
        if not self._remedy_due(pod, arch, os):
            return None
        owner = remedy_owner(pod)
        assert owner is not None
        meta = pod.get("metadata") or {}
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        excluded = next(x for f in findings
                        if (x := hit(f.digest, os, arch, self.current, namespace=ns)))
        if (not set(excluded.digests) <= self._published_digests
                or self.clock() - self._published_at < REMEDY_GRACE_SECONDS):
            self._learned.set()
            return REMEDY_GRACE_SECONDS
        result = await delete_pod(self.api, ns, name, uid)
        if result.status == GONE:
            return None
        if result.status == REFUSED:
            # the deployment took the grant away: not again for this owner within the TTL
            log.warning("pod %s/%s: not deleted: %s", ns, name, result.message)
            self._refused[owner[2]] = self.clock()
            return None
        self.deleted[owner[2]] = DeletedPod(owner[0], owner[1], owner[2], ns, name,
                                            self.clock())
        self.metrics.exec_format_pods_deleted.labels(owner[0]).inc()
        spec = EventSpec(WARNING, EXEC_FORMAT_REASON, (
            f"deleted (spec.plugins.execFormatErrorMonitor.deleteFailedPods) so that its "
            f"{owner[0]} {owner[1]} creates a new pod, placed without the platform that "
            f"fails: {describe(excluded)}")[:1000], "Delete")
        self.metrics.events.labels(spec.type).inc()
        self.events.emit(pod, spec)
        log.warning("pod %s/%s: %s", ns, name, spec.message)
        self._learned.set()
        return None

