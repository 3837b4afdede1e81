"""The escape monitor: finds pods that reached a node with no placement record, reports
each once, and deletes those its node can't run when their owner will recreate them.

I/O around the pure rules of :mod:`rules.monitor.escape` (docs/escaped-pods.md). A
cache-less list+watch (:class:`kubeclient.Informer` with ``keep_cache=False``: nothing kept
per pod) of the pods the API server selects by
:func:`rules.monitor.escape.watch_params`: bound, not ended, outside the system namespaces
and the product's own, without the placement label ``podplacement.io/node-affinity`` and
without the escape record; and the pods with that label, from the leader's one watch of
placed pods (:class:`controller.placedwatch.PlacedPods`, which lists them anyway for the
admission feed: no second list of every placed pod), because the label is what a pod's
creator can write too. The watch handler applies
:func:`rules.monitor.escape.skip_reason` (pure; a labelled pod is left alone only when its record
reproduces from its spec and its node is one its spec admits,
:func:`rules.monitor.escape.placement_doubt`, so an honest placed pod costs a JSON parse and no
request) and queues a pod's key (:data:`controller.generic.PodKey`) on the monitor's own
:class:`controller.generic.Controller` (its queue, workers and the loop that turns its watch
on and off), never on the placement queue. The per-pod reconcile
reads the pod again, reads its Namespace's labels (opted-out namespaces are left alone;
:func:`rules.scope.namespace_opted_out`, a few seconds' cache), inspects its images with the
reconciler's pull-secret rule and the controller's inspector (a failed inspection is retried
with the queue's backoff, ``imageInspection.maxRetries`` times, then the verdict is
``unknown``), classifies it against its node's labels from the Node informer, and then:

- ``unfit`` with an owner to recreate it and ``deleteUnfitPods`` on
  (:func:`rules.monitor.escape.repair_owner`): deleted with its UID as precondition
  (:func:`controller.poddelete.delete_pod`, the deleter ``deleteFailedPods`` uses), at most
  one round of deletions per owner per minute
  (:class:`rules.monitor.escape.RepairRounds`; a pod that must wait is queued again
  when the next round may start); the Warning Event says so;
- otherwise the verdict is written on the pod (label and annotation
  ``podplacement.io/placement-escaped``, one merge patch guarded by ``resourceVersion``), then
  the condition of the same type through ``pods/status``
  (:func:`rules.monitor.escape.condition_patch`:
  the part of the record a pod's creator cannot write, so a label they preset hides nothing,
  :func:`rules.monitor.escape.recorded`), and only then the ``PlacementEscaped`` Event is sent: a
  second run, a relist or a new leader finds the record and stays silent. The watch's
  selector does not leave the recorded pods out (their label proves nothing): a relist hands
  on the escapes recorded so far, a pure check each.

``podplacement_escaped_pods_total{outcome}`` counts each pod once (``repaired``, ``unfit``,
``fit``, ``unknown``). Runs in the leader only, while the PodPlacementConfig exists and is not
being deleted, ``spec.plugins.placementEscapes.enabled`` is on and ``active()`` (the
controller owns the admission objects: without them no pod is placed at admission, so
there is nothing to escape from). Memory: the queue's keys (at most :data:`MAX_QUEUED`
waiting to be read; a pod left out is queued again by its next watch event or relist), the
namespace cache and one float per owner in a repair round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from podplacement.controller.bindingfeed import PODS_PATH
from podplacement.controller.events import EventSink
from podplacement.controller.generic import POD_KEYS, Controller, PodKey, QueueSettings
from podplacement.controller.metrics import Metrics
from podplacement.controller.placedwatch import READ_COALESCE_SECONDS
from podplacement.controller.poddelete import DELETED, GONE, delete_pod
from podplacement.controller.podmemo import DEFAULT_SIZE, InputMemo, placement_spec
from podplacement.controller.reconciler import pod_key, split_key
from podplacement.kubeclient import (
    STRATEGIC_MERGE_PATCH,
    ApiError,
    Informer,
    KubeAPI,
    NotFound,
    namespace_path,
    pod_path,
)
from podplacement.rules.config import AFFINITY_LABEL, DECISION_ANNOTATION, PlacementConfig
from podplacement.rules.monitor.escape import (
    FIT,
    REPAIRED,
    RepairRounds,
    classify,
    condition_patch,
    created_at,
    event_spec,
    placement_doubt,
    record_patch,
    repair_owner,
    skip_reason,
    watch_params,
)
from podplacement.rules.place.plan import parse_time
from podplacement.rules.scope import namespace_opted_out

log = logging.getLogger(__name__)

#: ``(method, path template)`` of every request the monitor sends: the pods' list+watch, a
#: pod's read, the record's patch and the repair's delete, the Namespace's read (its
#: opt-out labels), the pod's pull secrets, Events. All are in
#: :data:`controller.app.API_REQUESTS`, whose grants ``tests/deploy`` checks.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", PODS_PATH),
    ("GET", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("PATCH", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("PATCH", "/api/v1/namespaces/{namespace}/pods/{name}/status"),
    ("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("GET", "/api/v1/namespaces/{name}"),
    ("GET", "/api/v1/namespaces/{namespace}/secrets/{name}"),
    ("POST", "/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
    ("POST", "/api/v1/namespaces/{namespace}/events"),
)

#: The monitor's queue: 2 workers, 50 keys/s (burst 100), retries after 0.5..60 s.
QUEUE = QueueSettings(workers=2, rate=50.0, burst=100, base_delay=0.5, max_delay=60.0)
#: Keys waiting to be read at most; a pod past it is queued by its next watch event.
MAX_QUEUED = 10_000
#: Namespaces whose labels are kept, and for how long (seconds).
MAX_NAMESPACES = 1000
NAMESPACE_TTL_SECONDS = 10.0


class DoubtMemo:
    """:func:`rules.monitor.escape.placement_doubt` memoized
    (:class:`controller.podmemo.InputMemo`) on everything it reads: the pod's decision
    annotation, its ``spec`` (:func:`controller.podmemo.placement_spec`) and its node's
    labels (or that the node is not known).
    The replicas of one workload placed alike share one entry, so an honest placed pod
    costs a hash of its spec instead of the re-derivation of its record.

    Attributes:
        memo: the memo (its ``hits`` and ``misses``).
    """

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.memo: InputMemo[str | None] = InputMemo(size)

    def __call__(self, pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> str | None:
        """``placement_doubt(pod, node)``, from the memo when this input was judged."""
        annotations = (pod.get("metadata") or {}).get("annotations")
        record = annotations.get(DECISION_ANNOTATION) if isinstance(annotations, Mapping) else None
        node_labels = None if node is None else (node.get("metadata") or {}).get("labels")
        return self.memo.get([record, placement_spec(pod.get("spec")), node is None,
                              node_labels], (),
                             lambda: placement_doubt(pod, node))


class InspectLater(Exception):
    """An image of the pod could not be inspected and retries are left: the queue runs the
    pod again after its backoff."""


class EscapeMonitor:
    """See the module docstring.

    Args:
        api: the Kubernetes client.
        nodes: the Node informer (the node's ``kubernetes.io/os`` and ``arch`` labels).
        events: the Event sink.
        metrics: the controller's metrics.
        config_source: the current (config, error) pair, with the exec format exclusions
            the controller places with (:meth:`controller.app.Controller.placement_config`).
        config_object: the live PodPlacementConfig ``cluster`` (its ``creationTimestamp``:
            pods created before it are not escapes), or None while it does not exist.
        credentials: pod, config → its pull credentials (the reconciler's rule).
        inspect_images: pod, credentials → image reference → result or exception (the
            reconciler's :meth:`~controller.reconciler.Reconciler.inspect_images`).
        own_namespace: the product's namespace.
        active: whether the controller owns the admission objects now.
        watch_timeout: seconds per watch request.
        idle_seconds: how often the switches are read again without a config change.
        clock: unix seconds (the repair rounds compare it with ``creationTimestamp``).
    """

    def __init__(
        self,
        api: KubeAPI,
        *,
        nodes: Informer,
        events: EventSink,
        metrics: Metrics,
        config_source: Callable[[], tuple[PlacementConfig, str | None]],
        config_object: Callable[[], Mapping[str, Any] | None],
        credentials: Callable[[Mapping[str, Any], PlacementConfig], Awaitable[list[Any]]],
        inspect_images: Callable[[Mapping[str, Any], Sequence[Any]],
                                 Awaitable[Mapping[str, Any]]],
        own_namespace: str,
        active: Callable[[], bool] = lambda: True,
        watch_timeout: int = 300,
        idle_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.nodes = nodes
        self.events = events
        self.metrics = metrics
        self.config_source = config_source
        self.config_object = config_object
        self.credentials = credentials
        self.inspect_images = inspect_images
        self.own_namespace = own_namespace
        self.active = active
        self.watch_timeout = watch_timeout
        self.idle_seconds = idle_seconds
        self.clock = clock
        self.params = watch_params(own_namespace)
        self.queue: Controller[PodKey] = Controller("escape monitor", self.reconcile, QUEUE,
                                                    codec=POD_KEYS, loop=self._run)
        self.rounds = RepairRounds()
        self._namespaces: dict[str, tuple[Mapping[str, Any], float]] = {}
        self._created: tuple[str, float | None] = ("", None)
        self._changed = asyncio.Event()
        self._full_logged = False
        self.doubts = DoubtMemo()

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the queue and the watch loop (the leader calls this)."""
        self.queue.start()

    async def stop(self) -> None:
        """Stop the watch and the queue (a pod in flight is cancelled; the next leader
        finds it again, as it carries no record yet)."""
        await self.queue.stop()

    def config_changed(self) -> None:
        """The config changed: the loop reads the switches again."""
        self._changed.set()

    def enabled(self) -> bool:
        """The config exists, is not being deleted, has
        ``spec.plugins.placementEscapes.enabled``, and ``active()``."""
        obj = self.config_object()
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return False
        return self.config_source()[0].escape_monitor and self.active()

    def _config_created(self) -> float | None:
        """The config's ``creationTimestamp`` in unix seconds (None: no config)."""
        obj = self.config_object()
        if obj is None:
            return None
        text = (obj.get("metadata") or {}).get("creationTimestamp")
        text = text if isinstance(text, str) else ""
        if self._created[0] != text:
            self._created = (text, parse_time(text))
        return self._created[1]

    async def _run(self) -> None:
        informer: Informer | None = None
        try:
            while True:
                on = self.enabled()
                if on and informer is None:
                    informer = Informer(self.api, PODS_PATH, self.params,
                                        name="escaped pods", watch_timeout=self.watch_timeout,
                                        min_backoff=0.5, keep_cache=False,
                                        coalesce=READ_COALESCE_SECONDS)
                    informer.add_handler(self.on_pod)
                    informer.start()
                elif not on and informer is not None:
                    await informer.stop()
                    informer = None
                now = self.clock()
                self.rounds.expire(now)
                for ns in [n for n, (_, at) in self._namespaces.items()
                           if now - at >= NAMESPACE_TTL_SECONDS]:
                    self._namespaces.pop(ns, None)
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.idle_seconds)
        finally:
            if informer is not None:
                await informer.stop()

    # --- watch ---------------------------------------------------------------------------
    def watching(self) -> bool:
        """Whether the monitor runs (started by the leader) and :meth:`enabled`: the switch
        of its subscription to the watch of placed pods."""
        return self.queue.running and self.enabled()

    def _node(self, pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
        name = (pod.get("spec") or {}).get("nodeName")
        return self.nodes.get(name) if isinstance(name, str) and name else None

    def on_pod(self, etype: str, pod: dict[str, Any], _old: dict[str, Any] | None) -> None:
        """Watch handler of both watches (its own of the pods without the placement label,
        and :class:`controller.placedwatch.PlacedPods` of those with it): queue the pod's
        key when it is an escape to check (pure checks, no request: a labelled pod whose
        record reproduces from its spec and whose node its spec admits is left here,
        :func:`rules.monitor.escape.placement_doubt`; a key already queued or waiting is left as
        it is)."""
        key = PodKey(pod_key(pod))
        if etype == "DELETED":
            self.queue.discard(key)
            return
        if self.queue.is_pending(key):
            return
        if skip_reason(pod, own_namespace=self.own_namespace,
                       config_created=self._config_created(),
                       node=self._node(pod), doubt=self.doubts) is not None:
            return
        if len(self.queue) >= MAX_QUEUED:
            if not self._full_logged:
                log.warning("escaped pods: %d waiting to be checked; more are left for their "
                            "next watch event", MAX_QUEUED)
                self._full_logged = True
            return
        self._full_logged = False
        self.queue.add(key)

    # --- the reconcile -------------------------------------------------------------------
    async def reconcile(self, key: PodKey) -> float | None:
        """Check one escaped pod (see the module docstring).

        Returns:
            None (done), or seconds until the pod may be deleted (the owner's repair round).

        Raises:
            InspectLater: an image could not be inspected and retries are left.
            Conflict: the pod changed since it was read (the queue retries at once).
            ApiError: another API failure (the queue backs off).
        """
        if not self.enabled():
            return None
        ns, name, uid = split_key(key)
        pod = await self._get(pod_path(ns, name))
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            return None
        node = self._node(pod)
        if skip_reason(pod, own_namespace=self.own_namespace,
                       config_created=self._config_created(), node=node,
                       doubt=self.doubts) is not None:
            return None
        labels = (pod.get("metadata") or {}).get("labels") or {}
        doubt = (self.doubts(pod, node) or "") if AFFINITY_LABEL in labels else ""
        config = self.config_source()[0]
        labels = await self._namespace_labels(ns)
        if labels is None or namespace_opted_out(labels, config.namespace_selector):
            return None
        try:
            creds = await self.credentials(pod, config)
        except ApiError as exc:
            log.info("pod %s/%s: reading pull secrets failed: %s", ns, name, exc)
            creds = []
        images = await self.inspect_images(pod, creds)
        failed = [i for i, r in images.items() if isinstance(r, BaseException)]
        if failed and self.queue.failures(key) < config.image_inspection.max_retries:
            raise InspectLater(f"inspecting {failed[0]} failed")
        verdict = classify(pod, node, images, config.excluded)
        owner, not_repaired = repair_owner(pod, verdict,
                                           delete_unfit_pods=config.delete_unfit_pods)
        if owner is not None:
            wait = self.rounds.admit(owner[2], created_at(pod), self.clock())
            if wait > 0:
                return wait
            result = await delete_pod(self.api, ns, name, uid)
            if result.status == GONE:
                return None
            if result.status == DELETED:
                self._report(pod, REPAIRED, event_spec(verdict, deleted_for=owner,
                                                       doubt=doubt))
                return None
            not_repaired = f"the delete was refused: {result.message}"
        try:
            await self.api.request("PATCH", pod_path(ns, name),
                                   body=record_patch(pod, verdict, now=self.clock(),
                                                     not_repaired=not_repaired, doubt=doubt))
            # the part of the record a pod's creator cannot write (rules.monitor.escape.recorded);
            # if it fails, the queue retries the pod, which is then not recorded yet
            await self.api.request("PATCH", pod_path(ns, name, "status"),
                                   body=condition_patch(verdict, now=self.clock(),
                                                        doubt=doubt),
                                   content_type=STRATEGIC_MERGE_PATCH)
        except NotFound:
            return None
        self._report(pod, verdict.outcome,
                     event_spec(verdict, not_repaired=not_repaired, doubt=doubt))
        return None

    def _report(self, pod: Mapping[str, Any], outcome: str, spec: Any) -> None:
        meta = pod.get("metadata") or {}
        self.metrics.escaped_pods.labels(outcome).inc()
        self.metrics.events.labels(spec.type).inc()
        self.events.emit(pod, spec)
        log.log(logging.INFO if outcome == FIT else logging.WARNING,
                "pod %s/%s escaped placement (%s): %s", meta.get("namespace"),
                meta.get("name"), outcome, spec.message)

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.api.request("GET", path)
        except NotFound:
            return None

    async def _namespace_labels(self, namespace: str) -> Mapping[str, Any] | None:
        """The Namespace's labels (None: it is gone), kept :data:`NAMESPACE_TTL_SECONDS`.

        Raises:
            ApiError: the read failed other than 404 (the queue backs off).
        """
        now = self.clock()
        cached = self._namespaces.get(namespace)
        if cached is not None and now - cached[1] < NAMESPACE_TTL_SECONDS:
            return cached[0]
        obj = await self._get(namespace_path(namespace))
        if obj is None:
            self._namespaces.pop(namespace, None)
            return None
        labels = (obj.get("metadata") or {}).get("labels")
        labels = labels if isinstance(labels, Mapping) else {}
        self._namespaces.pop(namespace, None)
        self._namespaces[namespace] = (labels, now)
        while len(self._namespaces) > MAX_NAMESPACES:
            self._namespaces.pop(next(iter(self._namespaces)))
        return labels
