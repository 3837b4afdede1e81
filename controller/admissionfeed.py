"""The admission feed: what the leader learns and tells from the pods placed at admission
(docs/how-it-decides.md "The catalog fills itself from every path", "Events").

The controller's watch of placed pods (:class:`controller.placedwatch.PlacedPods`, label
``podplacement.io/node-affinity``) hands every pod it sees placed, by any path, to
:meth:`AdmissionFeed.on_pod` (a pod enters that selector once, when it is placed: the
watch says ADDED). For each such pod, in the event loop and without a request:

- **use**: each of its images in the admission policy's catalog is marked used
  (:meth:`rules.admit.imageparams.ParamsStore.touch`), so a full catalog evicts the
  least recently used entries first. A touch changes no published byte: no write.
- **learn**: a pod placed at admission (``"path":"webhook"`` or ``"admission"``) whose
  images are not all in the catalog, and that needs no pull Secret
  (:func:`rules.monitor.admitted.images_to_learn`), queues those images. A few workers
  inspect each one anonymously with the controller's own inspector (its cache and one
  flight per image), off the watch, and record the result with the controller's
  ``publish`` (its rules: exclusions, the config's place branch, learned time =
  when a registry answered), so the params writer publishes it on its next tick (at most
  about a second later, batched and paced as every write is). The workers wait until the
  writer has taken over the live object, so a new leader inspects only what that object
  lacks. The pods placed by the webhook, not only by the controller, thus fill the catalog
  from which the policy places the next pods of those images.
  When the webhook placed the pod, it has just inspected those images itself: the feed then
  takes the webhook's anonymous result from its inspection report
  (:class:`controller.inspectionreports.InspectionReports`, validated like a registry's
  answer; learned time = when the registry answered the webhook) instead of fetching the
  image again. An image not reported yet waits up to :data:`REPORT_WAIT_SECONDS` for the
  report (the webhook writes it at most about a second after the admission), off the
  workers; then, or at once while no webhook replica reports (an older webhook during an
  upgrade, ``--no-inspection-report``), the worker inspects it as before; so it does
  whenever the config names a ``registriesConfigMapRef`` (registry rules the controller
  applies and the webhook does not read). The report is
  only read for the images of the pod seen placed: nothing the report names enters the
  catalog otherwise.
- **tell**: the Warning Event of the decision of a pod placed at admission, and its
  ``ExecFormatExclusion`` when an exclusion narrowed it
  (:func:`rules.monitor.admitted.admission_events`: the controller's own Events for
  that pod, same reasons and text), once per pod: the UIDs it was sent for are remembered
  (bounded).

A pod a (re)list hands on, rather than the watch as it is placed, counts for use, learn and
tell only when created less than :data:`EVENT_WINDOW_SECONDS` ago: a new leader learns and
tells about the pods placed while none led, not about every pod that exists. A relist is not
a use in time (it would reorder the catalog's LRU by the list's order) and its old pods name
the tags the catalog evicted as least used (learning them back would evict the tags in use
now, and inspect every evicted tag at each leader change).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from podplacement.controller.events import EventSink
from podplacement.controller.metrics import Metrics
from podplacement.controller.podmemo import InputMemo, placement_spec
from podplacement.kubeclient import Informer
from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.config import ARCH_LABEL, OS_LABEL, PlacementConfig
from podplacement.rules.monitor.admitted import (
    admission_events,
    admission_path,
    always_images,
    decision_record,
    images_to_learn,
    recently_created,
)
from podplacement.rules.place.admission import PATH_WEBHOOK
from podplacement.rules.place.placement import EventSpec, unique_images
from podplacement.rules.platforms import NodeInventory, node_inventory
from podplacement.rules.policy import PlacementPolicy, policy_for

log = logging.getLogger(__name__)

#: Seconds after its creation during which a pod handed on by a (re)list, not by the watch
#: as it is placed, still gets its Warning Event (a leader change takes about one Lease).
EVENT_WINDOW_SECONDS = 60.0
#: Pod UIDs remembered as told (the oldest forgotten first).
MAX_TOLD = 50_000
#: Images waiting to be inspected for the catalog; more are dropped (the next pod of the
#: image queues it again).
MAX_PENDING = 1_000
#: Images inspected at once for the catalog.
WORKERS = 4

#: Seconds an image of a pod placed at admission waits for the webhook's report of it
#: before the controller inspects it itself (the webhook writes at most once a second).
REPORT_WAIT_SECONDS = 3.0

#: ``podplacement_admission_feed_inspections_total`` results.
INSPECTED = "ok"
#: ... taken from the webhook's inspection report (no registry request)
REPORTED = "reported"
FAILED = "failed"
DROPPED = "dropped"


class AdmissionFeed:
    """See the module docstring.

    Args:
        store: the catalog (the params writer publishes it).
        inspector: returns the controller's current ``imageinspect.Inspector``.
        publish: records an anonymously inspected image with the controller's rules
            (:meth:`controller.publisher.ParamsPublisher.publish`).
        publishing: True while the controller publishes the catalog at all (it owns the
            policy and the policy has a place branch); nothing is inspected otherwise.
        config_source: the (config, error) pair the controller places with (exclusions
            included).
        events: the Event sink.
        metrics: the controller's metrics.
        nodes: the Node informer (``PlatformNotInCluster``), or None.
        policies: namespace → its accepted placement policies, highest priority first.
        listing: True while the watch's (re)list hands pods on
            (:attr:`controller.placedwatch.PlacedPods.listing`).
        adopted: set once the params writer took over the live object; the inspections
            wait for it.
        clock: unix seconds.
        on_always: called with each image a placed anonymous pod pulls with
            ``imagePullPolicy: Always`` (:func:`rules.monitor.admitted.always_images`;
            the controller keeps checking those tags, :mod:`rules.freshness`).
        reports: the webhook's inspection reports
            (:class:`controller.inspectionreports.InspectionReports`), or None: every
            image is inspected by the controller.
        report_wait: seconds an image waits for its report (module docstring).
        use_reports: False while the reports must not be taken: the config names a
            ``registriesConfigMapRef``, whose rules (blocked registries, mirrors) the
            controller's inspector applies and the webhook's does not read.
    """

    def __init__(
        self,
        *,
        store: ParamsStore,
        inspector: Callable[[], Any],
        publish: Callable[[str, Any], None],
        publishing: Callable[[], bool],
        config_source: Callable[[], tuple[PlacementConfig, str | None]],
        events: EventSink,
        metrics: Metrics,
        nodes: Informer | None = None,
        policies: Callable[[str], Sequence[PlacementPolicy]] = lambda namespace: (),
        listing: Callable[[], bool] = lambda: False,
        adopted: asyncio.Event | None = None,
        clock: Callable[[], float] = time.time,
        on_always: Callable[[str], None] | None = None,
        reports: ReportSource | None = None,
        report_wait: float = REPORT_WAIT_SECONDS,
        use_reports: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.inspector = inspector
        self.publish = publish
        self.publishing = publishing
        self.config_source = config_source
        self.events = events
        self.metrics = metrics
        self.nodes = nodes
        self.policies = policies
        self.listing = listing
        self.adopted = adopted
        self.clock = clock
        self.on_always = on_always
        self.reports = reports
        self.report_wait = report_wait
        self.use_reports = use_reports
        #: images waiting for the webhook's report → the timer of the fallback inspection
        self._awaiting: dict[str, asyncio.TimerHandle] = {}
        #: UIDs of the pods told about (insertion order: the oldest first).
        self.told: OrderedDict[str, None] = OrderedDict()
        #: admission_events memoized on all it reads (controller.podmemo)
        self.told_memo: InputMemo[tuple[EventSpec, ...]] = InputMemo()
        self._pending: set[str] = set()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._inventory: NodeInventory | None = None
        if nodes is not None:
            nodes.add_handler(self._nodes_changed)
        if reports is not None:
            reports.subscribe(self._reported)

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the inspection workers (the leader calls this)."""
        if self._workers:
            return
        self._queue = asyncio.Queue()
        self._pending.clear()
        self._workers = [asyncio.create_task(self._work(), name=f"admission feed {i}")
                         for i in range(WORKERS)]

    async def stop(self) -> None:
        """Stop the workers; queued images are dropped (the next leader sees their pods)."""
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._workers.clear()
        self._pending.clear()
        for handle in self._awaiting.values():
            handle.cancel()
        self._awaiting.clear()

    # --- the watch ---------------------------------------------------------------------
    def on_pod(self, etype: str, pod: dict[str, Any], _old: dict[str, Any] | None) -> None:
        """Watch handler (module docstring): use, learn, tell. Pure checks and in-memory
        work only; never raises for an odd pod."""
        if etype != "ADDED":
            return
        if self.on_always is not None:
            for image in always_images(pod, self.config_source()[0]):
                self.on_always(image)
        if self.listing() and not recently_created(pod, self.clock(), EVENT_WINDOW_SECONDS):
            return  # not a use now, nothing to learn or tell (module docstring: relist)
        for image in unique_images(pod):
            self.store.touch(image)
        record = decision_record(pod)
        path = admission_path(record)
        if path is None:
            return
        self.metrics.placed_at_admission.labels(path).inc()
        config = self.config_source()[0]
        if self.publishing() and self._workers:
            for image in images_to_learn(pod, record, config, self.store.__contains__):
                self._learn(image, wait=path == PATH_WEBHOOK)
        self._tell(pod, record, config)

    def _learn(self, image: str, *, wait: bool = False) -> None:
        """Queue ``image`` for the workers; with ``wait`` (the webhook placed the pod) and a
        webhook replica reporting, only once its report arrives or ``report_wait`` passed."""
        if image in self._pending:
            return
        if len(self._pending) >= MAX_PENDING:
            self.metrics.admission_feed.labels(DROPPED).inc()
            return
        self._pending.add(image)
        reports = self._reports()
        if (wait and reports is not None and reports.get(image) is None
                and reports.reporting()):
            self._awaiting[image] = asyncio.get_running_loop().call_later(
                self.report_wait, self._give_up, image)
            return
        self._queue.put_nowait(image)

    def _reports(self) -> ReportSource | None:
        """The webhook's reports, when they may be taken now (``use_reports``)."""
        return self.reports if self.reports is not None and self.use_reports() else None

    def _reported(self) -> None:
        """The webhook's reports changed: the images waiting that are reported now go to the
        workers."""
        if not self._awaiting or self.reports is None:
            return
        for image in list(self._awaiting):
            if self.reports.get(image) is not None:
                self._awaiting.pop(image).cancel()
                self._queue.put_nowait(image)

    def _give_up(self, image: str) -> None:
        """No report of ``image`` within ``report_wait``: the workers inspect it."""
        if self._awaiting.pop(image, None) is not None and self._workers:
            self._queue.put_nowait(image)

    def _tell(self, pod: Mapping[str, Any], record: Mapping[str, Any] | None,
              config: PlacementConfig) -> None:
        """Send the Warning of the pod's decision and its ``ExecFormatExclusion``, once per
        pod."""
        if not self.events.enabled:
            return
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid or uid in self.told:
            return
        namespace = str(meta.get("namespace") or "")
        nodes, policy = self._nodes(), policy_for(pod, self.policies(namespace))
        # admission_events reads the pod's namespace, labels, annotations and spec, the
        # catalog's values of its images, the policy, the config and the nodes
        specs = self.told_memo.get(
            [namespace, meta.get("labels"), meta.get("annotations"),
             placement_spec(pod.get("spec")),
             [self.store.get(i) for i in unique_images(pod)]], (policy,),
            lambda: admission_events(pod, record, config, catalog=self.store.get, nodes=nodes,
                                     policy=policy), scope=(config, nodes))
        if not specs:
            return
        self.told[uid] = None
        while len(self.told) > MAX_TOLD:
            self.told.popitem(last=False)
        for spec in specs:
            self.metrics.events.labels(spec.type).inc()
            self.events.emit(pod, spec)

    def _nodes(self) -> NodeInventory | None:
        """The node inventory, rebuilt after a Node changed (None without an informer)."""
        if self.nodes is None:
            return None
        if self._inventory is None:
            self._inventory = node_inventory(self.nodes.cache.values())
        return self._inventory

    def _nodes_changed(self, etype: str, node: dict[str, Any], old: dict[str, Any] | None
                       ) -> None:
        """A Node was added, deleted or relabelled: rebuild the inventory when next asked
        (status updates, most Node events, keep it)."""
        if etype != "MODIFIED" or old is None or _platform_labels(node) != _platform_labels(old):
            self._inventory = None

    # --- the inspections ---------------------------------------------------------------
    async def _work(self) -> None:
        while True:
            image = await self._queue.get()
            try:
                await self._inspect(image)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("admission feed: %s", image)
            finally:
                self._pending.discard(image)

    async def _inspect(self, image: str) -> None:
        """Inspect ``image`` anonymously and record it, unless the catalog got it
        meanwhile (the writer's adoption, the reconciler) or is not published now."""
        if self.adopted is not None:
            await self.adopted.wait()
        if image in self.store or not self.publishing():
            return
        reports = self._reports()
        reported = reports.get(image) if reports is not None else None
        if reported is not None:
            self.metrics.admission_feed.labels(REPORTED).inc()
            self.publish(image, reported)
            return
        try:
            result = await self.inspector().inspect(image)
        except Exception as exc:  # the registry's errors; the next pod of it tries again
            self.metrics.admission_feed.labels(FAILED).inc()
            log.info("admission feed: %s not inspected anonymously: %s", image, exc)
            return
        self.metrics.admission_feed.labels(INSPECTED).inc()
        self.publish(image, result)


class ReportSource(Protocol):
    """What the feed needs of :class:`controller.inspectionreports.InspectionReports`."""

    def get(self, image: str) -> Any: ...
    def reporting(self) -> bool: ...
    def subscribe(self, listener: Callable[[], None]) -> None: ...


def _platform_labels(node: Mapping[str, Any]) -> tuple[Any, Any]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(ARCH_LABEL), labels.get(OS_LABEL)
