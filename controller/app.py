"""Wiring of the controller process: informers, the work queue, the reconciler, events,
metrics, leader election and the PodPlacementConfig lifecycle.

Informers (list+watch, cluster-wide): pods with the server-side label selector
``podplacement.io/scheduling-gate=gated`` (never all pods; a gated pod whose label a user
changed is labelled again, :meth:`Controller._relabel`), Nodes, the PodPlacementConfig and
NodeResourceTopologies (tolerated when the CRD is absent; picked up when it appears). While
topology placement is on, a cache-less list+watch of the pods labelled
``podplacement.io/numa=placed`` feeds their bindings to the NUMA in-flight accounting. Every
replica keeps its caches warm; only the leader runs the workers and the lifecycle, so only
the leader writes. When a replica becomes the leader it queues every pod
still gated, which is also how a restarted controller finishes a batch.

Registry rules (containers-registries.conf(5) v2) come from the ConfigMap named by
``spec.imageInspection.registriesConfigMapRef`` (key ``registries.conf``) when the config sets
it, else from ``--registries-conf``; ``--insecure-registry`` applies on top of either. The
ConfigMap is read with a plain GET when the config changes and every
``registries_refresh_seconds``; a missing or malformed one is logged and the last good
registry rules stay in use (pods are never held back for it).

The leader's one :class:`~controller.queue.WorkQueue` serves every reconciler: pod keys
(``namespace/name/uid``, :class:`~controller.reconciler.Reconciler`), the
PodPlacementConfig lifecycle's keys (:data:`controller.lifecycle.KEYS`) and the params
writer's (:data:`controller.paramswriter.PARAMS_KEY`); :meth:`Controller.reconcile` routes
them. When this process stops leading the queue is shut down (its work in flight is
cancelled: the pods are no longer placed here), and what must not be left half-done is then
served on a one-worker queue of its own, bounded: the ordered uninstall under way, or due
because the product itself is being removed (:data:`controller.lifecycle.FINISH_KEY`), and,
on the last graceful stop, the stand-down (:data:`controller.lifecycle.LAST_STOP_KEY`).

The leader also runs one cache-less watch of the pods labelled
``podplacement.io/node-affinity`` (every pod placed, by any path:
:class:`controller.placedwatch.PlacedPods`), which feeds two readers. The admission feed
(:mod:`controller.admissionfeed`, always): a placed pod's images are marked used in the
admission policy's catalog, the images of an anonymous pod placed at admission that the
catalog lacks are inspected by the controller and published (so the policy places their next
pods), and the Warning Event of a decision taken at admission is sent as for the
controller's own. The exec-format-error monitor (:mod:`controller.execformatmonitor`, while
``spec.plugins.execFormatErrorMonitor.enabled``): its own small work queue, one verification
per image digest, the exclusions learned from it (published in the config's status) and the
optional remedy that deletes a failing pod of a ReplicaSet, StatefulSet or Job. The
reconciler places with those exclusions (:meth:`Controller.placement_config`), and an image
whose result lost a platform to one is kept out of the admission policy's catalog
(docs/exec-format-errors.md, "Learn").

Every long-running part but the leader elector is a runnable of one
:class:`~controller.runnables.Manager` (:meth:`Controller._runnables`, docs/design.md
"Runnables"): the caches, the Event senders and the registries and bindings loops on every
replica, the leader's monitors and watches only while this replica leads; it starts them in
that order, stops them in reverse, and ``/healthz`` names any whose task died.

A leader that owns the admission objects (the lifecycle runs) also runs the escape monitor
(:mod:`controller.escapemonitor`): a cache-less watch of the bound pods without the placement
label, its own small work queue, a ``PlacementEscaped`` Event and a record per pod, and the
repair that deletes such a pod of a ReplicaSet, StatefulSet or Job when its node can't run
its images (docs/escaped-pods.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from podplacement.controller import paramswriter, policywatch
from podplacement.controller.admissionfeed import AdmissionFeed
from podplacement.controller.bindingfeed import PODS_PATH, watch_bindings
from podplacement.controller.core import admissionpolicy
from podplacement.controller.core.config import (
    ADMISSION_AUTO,
    CONFIG_NAME,
    CONFIG_PLURAL,
    DEFAULT_NAMESPACE,
    GATE_LABEL,
    GATE_LABEL_GATED,
    GROUP,
    LEASE_NAME,
    LEASE_RELEASED_GRACE_SECONDS,
    LOG_VERBOSITY_LOGGERS,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    NUMA_LABEL,
    NUMA_LABEL_WAITING,
    PARAMS_NAME,
    VERSION,
    ExcludedPlatform,
    PlacementConfig,
    config_or_defaults,
)
from podplacement.controller.core.findings import FindingsStore
from podplacement.controller.core.freshness import PullAlwaysFreshness
from podplacement.controller.core.imageparams import ParamsStore
from podplacement.controller.core.learn import merge, touches
from podplacement.controller.core.nodeview import node_view
from podplacement.controller.core.numa import InFlight
from podplacement.controller.core.platforms import ImageLike, image_platform_pairs
from podplacement.controller.core.podspec import gate_label_ops, has_gate, lost_gate_label
from podplacement.controller.core.policy import Ranking, params_policies
from podplacement.controller.escapemonitor import EscapeMonitor
from podplacement.controller.events import EventSink
from podplacement.controller.execformatmonitor import CONFIG_STATUS_PATH, ExecFormatMonitor
from podplacement.controller.lifecycle import (
    FINISH_KEY,
    KEYS,
    LAST_STOP_KEY,
    LIFECYCLE_KEY,
    Lifecycle,
)
from podplacement.controller.metrics import HealthServer, Metrics
from podplacement.controller.paramswriter import (
    PARAMS_KEY,
    ParamsWriter,
    params_collection_path,
)
from podplacement.controller.placedwatch import PlacedPods
from podplacement.controller.policywatch import PolicyWatch
from podplacement.controller.queue import WorkQueue
from podplacement.controller.reconciler import Reconciler, RetryLater, pod_key, split_key
from podplacement.controller.registriessource import (
    CONFIGMAP_PATH,
    LoadedRegistries,
    RegistriesConfigMap,
    registries_from,
)
from podplacement.controller.runnables import Loop, Manager, Runnable, Service
from podplacement.kubeclient import (
    JSON_PATCH,
    ApiError,
    Conflict,
    Informer,
    KubeAPI,
    NotFound,
    object_key,
)

Handler = Callable[[str], Awaitable[float | None]]

if TYPE_CHECKING:
    from podplacement.controller.leader import LeaderElector

log = logging.getLogger(__name__)

NODES_PATH = "/api/v1/nodes"
CONFIGS_PATH = f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}"
NRTS_PATH = f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}"
#: The ConfigMap named by ``spec.imageInspection.registriesConfigMapRef``.

#: The work-queue key of the checks of the tags pulled with ``Always`` in use
#: (:meth:`Controller._check_always_tags`).
FRESH_KEY = "fresh:cluster"
#: How many of those checks run at once.
FRESH_CONCURRENCY = 8

#: Work-queue keys ``relabel:<namespace/name/uid>``: a gated pod whose gate label was removed
#: (:meth:`Controller._relabel`).
RELABEL_PREFIX = "relabel:"

#: ``(method, path template)`` of every request the pod controller sends. Each collection
#: GET is a list then a watch (the informers; for pods also the NUMA binding feed with
#: :data:`controller.bindingfeed.BINDINGS_SELECTOR` and the watch of placed pods with
#: :data:`controller.placedwatch.WATCH_SELECTOR`). ``tests/deploy`` checks the RBAC in
#: ``deploy/`` against it both ways, next to :data:`controller.lifecycle.API_REQUESTS` and
#: the leader election's: a new request here needs its grant there, and vice versa.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", PODS_PATH),
    ("GET", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("PATCH", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("GET", "/api/v1/namespaces/{namespace}/secrets/{name}"),
    ("GET", NODES_PATH),
    ("GET", CONFIGS_PATH),
    ("GET", NRTS_PATH),
    ("GET", CONFIGMAP_PATH),
    ("POST", "/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
    ("POST", "/api/v1/namespaces/{namespace}/events"),
    # the exec-format-error monitor's deleteFailedPods and the escape monitor's repair
    # (controller.poddelete), and the exclusions learned in the config's status
    # (controller.execformatmonitor.API_REQUESTS)
    ("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}"),
    ("PATCH", CONFIG_STATUS_PATH),
    # the escape monitor: a Namespace's opt-out labels (controller.escapemonitor.API_REQUESTS)
    ("GET", "/api/v1/namespaces/{name}"),
    *paramswriter.API_REQUESTS,
    *policywatch.API_REQUESTS,
    # the params object's creations and deletions (_on_params): list + watch
    ("GET", paramswriter.PARAMS_COLLECTION_PATH),
)


_verbose_loggers: tuple[str, ...] = ()


def apply_log_verbosity(verbosity: str) -> tuple[str, ...]:
    """Apply ``spec.logVerbosity`` (Normal, Debug, Trace) to this process's loggers.

    Debug sets podplacement's own loggers to DEBUG, Trace also the HTTP and Kubernetes client
    libraries; Normal (and any unknown value) hands them back to the root level set by
    ``--log-level``. Returns the loggers now at DEBUG.
    """
    global _verbose_loggers
    wanted = LOG_VERBOSITY_LOGGERS.get(verbosity, ())
    if wanted != _verbose_loggers:
        for name in _verbose_loggers:
            logging.getLogger(name).setLevel(logging.NOTSET)
        for name in wanted:
            logging.getLogger(name).setLevel(logging.DEBUG)
        _verbose_loggers = wanted
        log.info("log verbosity %s", verbosity)
    return wanted


@dataclass
class ControllerOptions:
    """Settings of one controller process (the CLI flags).

    ``metrics_port`` None: no HTTP server. ``webhook_url``/``webhook_service``: when one is
    set the controller also runs the PodPlacementConfig lifecycle (webhook configuration,
    finalizer, status, ordered uninstall); the CA bundle comes from ``cert_dir``
    (``certs`` layout), or cert-manager's CA injector fills it when
    ``cert_manager_certificate`` (``"<namespace>/<Certificate>"``) is set, or else the
    built-in Secret flow writes it. ``ca_bundles`` maps a registry ``host[:port]`` to extra
    PEM CA certificates trusted for it; ``insecure_registries`` lists ``host[:port]``
    allowed plain HTTP / unverified TLS (both on top of ``registries_conf``, like
    ``podplacement inspect``'s ``--ca-file`` / ``--insecure-registry``).
    ``registries_refresh_seconds``: how often the ConfigMap of
    ``spec.imageInspection.registriesConfigMapRef`` is read again (it replaces
    ``registries_conf`` while the config names it; see :func:`registries_from`).
    ``standby_wait``: when the leader stops gracefully, how long it waits for another
    controller to take the lease before it stands down
    (:meth:`controller.lifecycle.Lifecycle.last_stop`); negative: never stand down.
    ``uninstall_deadline_seconds``: how long the ordered uninstall and the stand-down try
    normal decisions for the gated pods before releasing the rest unplaced.
    """

    namespace: str = DEFAULT_NAMESPACE
    workers: int = 32
    rate: float = 500.0
    burst: int = 1000
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8080
    events: bool = True
    registries_conf: str | None = None
    registries_refresh_seconds: float = 60.0
    ca_bundles: Mapping[str, bytes] = field(default_factory=dict)
    insecure_registries: tuple[str, ...] = ()
    webhook_url: str | None = None
    webhook_service: str | None = None
    cert_dir: str | None = None
    cert_manager_certificate: str | None = None
    leader_election: bool = True
    identity: str | None = None
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    watch_timeout: int = 300
    inspector_retries: int = 3
    retry_base_delay: float = 1.0
    retry_max_delay: float = 60.0
    uninstall_deadline_seconds: float = 20.0
    standby_wait: float = 5.0


class Controller:
    """The controller process, startable in-process (tests) or from the CLI.

    Args:
        api: the Kubernetes client (closed by :meth:`stop` only if ``own_api``).
        options: :class:`ControllerOptions`.
        inspector: an ``imageinspect.Inspector``-like object; default: one built from the
            config (cache TTL, registry timeout) and ``--registries-conf``.
    """

    def __init__(
        self,
        api: KubeAPI,
        options: ControllerOptions | None = None,
        *,
        inspector: Any = None,
        own_api: bool = False,
    ) -> None:
        self.api = api
        self.options = options or ControllerOptions()
        self.own_api = own_api
        self.metrics = Metrics()
        o = self.options
        selector = f"{GATE_LABEL}={GATE_LABEL_GATED}"
        self.pods = Informer(api, PODS_PATH, {"labelSelector": selector}, name="gated pods",
                             watch_timeout=o.watch_timeout)
        #: Nodes trimmed to the fields the controller reads (:func:`node_view`): a
        #: kubelet's images, conditions and managedFields are most of a Node's bytes.
        self.nodes = Informer(api, NODES_PATH, name="nodes", watch_timeout=o.watch_timeout,
                              transform=node_view)
        self.configs = Informer(api, CONFIGS_PATH, name="podplacementconfigs",
                                watch_timeout=o.watch_timeout, tolerate_absent=True,
                                max_backoff=10.0)
        self.nrts = Informer(api, NRTS_PATH, name="noderesourcetopologies",
                             watch_timeout=o.watch_timeout, tolerate_absent=True,
                             max_backoff=30.0)
        self.events = EventSink(api, enabled=o.events, instance=o.identity)
        self._inspector = inspector
        self._own_inspector = inspector is None
        self._inspector_key: tuple[float, float, str | None] | None = None
        #: The ConfigMap of ``spec.imageInspection.registriesConfigMapRef`` as last read.
        self._registries = RegistriesConfigMap()
        self._registries_changed = asyncio.Event()
        self._registries_ready = asyncio.Event()
        self._config_cache: tuple[str, PlacementConfig, str | None] | None = None
        self.inflight = self._make_inflight()
        #: The admission policy's params (image → platforms, anonymous results), written by
        #: the leader at most about once a second. Its TTL follows the config's cacheTTL
        #: from the first config event on (:meth:`_apply_params_ttl`), before the writer's
        #: first tick.
        self.params = ParamsStore(self.config_source()[0].image_inspection.cache_ttl_seconds)
        self.params_writer = ParamsWriter(api, self.params, metrics=self.metrics.params,
                                          namespace=o.namespace)
        #: The tags pulled with Always in use and their confirmed digests, published as the
        #: params' spec.fresh (leader only; :meth:`_check_always_tags`).
        self.freshness = PullAlwaysFreshness(
            self.config_source()[0].admission_pull_always_freshness)
        #: The params object's creations and deletions: each one changes the mark the
        #: webhook configuration trusts (its uid), so the lifecycle runs at once
        #: (:meth:`_on_params`). Cache-less: one object.
        self.params_objects = Informer(
            api, params_collection_path(o.namespace),
            {"fieldSelector": f"metadata.name={PARAMS_NAME}"}, name="params object",
            watch_timeout=o.watch_timeout, tolerate_absent=True, max_backoff=10.0,
            keep_cache=False)
        #: The PodPlacementPolicies (ranked on every change, published with the params) and
        #: the pods placed under one (their status; leader only).
        self.policy_watch = PolicyWatch(api, on_change=self._on_policies,
                                        placed_gauge=self.metrics.policy_placed_pods,
                                        watch_timeout=o.watch_timeout)
        #: the last write of the params object a policy change asked for (_on_policies)
        self._policy_flush: asyncio.Task[str] | None = None
        self.queue = self._new_queue()
        #: The queue serving a lifecycle key to its end after this process stopped leading
        #: (:meth:`_serve_to_end`); None otherwise.
        self._final_queue: WorkQueue | None = None
        #: The handlers of the keys that are not pods' (:meth:`reconcile`).
        self._handlers: dict[str, Handler] = {}
        self.reconciler = Reconciler(
            api, self.pods, _InspectorProxy(self), self.placement_config, self.events,
            self.metrics,
            nodes=self.nodes, nrts=self.nrts, inflight=self.inflight,
            failures=lambda key: self.queue.failures(key), publish=self._publish,
            is_leader=lambda: self.leading or self.releasing > 0,
            policies=self.policy_watch.of,
        )
        #: Exec format errors of the pods placed (leader only; spec.plugins.
        #: execFormatErrorMonitor), and the evidence per (digest, architecture).
        self.findings = FindingsStore()
        self.execformat = ExecFormatMonitor(
            api, nodes=self.nodes, events=self.events, metrics=self.metrics,
            config_source=self.config_source, inspector=self.inspector,
            credentials=self.reconciler.credentials, store=self.findings,
            config_object=lambda: self.configs.get(CONFIG_NAME),
            on_excluded=self._on_excluded)
        #: The pods placed, by any path (leader only): the admission feed always, the
        #: exec-format-error monitor while it is enabled.
        self.placed = PlacedPods(api, watch_timeout=o.watch_timeout)
        self.feed = AdmissionFeed(
            store=self.params, inspector=self.inspector, publish=self._publish,
            publishing=self._publishing, config_source=self.placement_config,
            events=self.events, metrics=self.metrics, nodes=self.nodes,
            policies=self.policy_watch.of, listing=lambda: self.placed.listing,
            adopted=self.params_writer.adopted, on_always=self._used_always)
        self.placed.subscribe("admission feed", self.feed.on_pod)
        self.placed.subscribe("exec format monitor", self.execformat.on_pod,
                              enabled=self.execformat.enabled)
        #: Pods bound with no placement record (leader only, while it owns the admission
        #: objects; spec.plugins.placementEscapes).
        self.escapes = EscapeMonitor(
            api, nodes=self.nodes, events=self.events, metrics=self.metrics,
            config_source=self.placement_config,
            config_object=lambda: self.configs.get(CONFIG_NAME),
            credentials=self.reconciler.credentials,
            inspect_images=self.reconciler.inspect_images, own_namespace=o.namespace,
            active=self._owns_admission, watch_timeout=o.watch_timeout)
        self.leading = False
        #: > 0 while the ordered uninstall or the stand-down releases gated pods: the
        #: reconciler may then write although this process may no longer lead
        self.releasing = 0
        self.health: HealthServer | None = None
        self.lifecycle: Lifecycle | None = None
        self.elector: LeaderElector | None = None
        self._elector_task: asyncio.Task[None] | None = None
        self._config_changed = asyncio.Event()
        #: Every long-running part but the leader elector (:meth:`_runnables`).
        self.runtime = Manager(self._runnables())
        self._started = False
        self.metrics.sources.api_counters = lambda: dict(api.counters)
        self.metrics.sources.gated = lambda: len(self.pods.cache)
        self.metrics.sources.queue_depth = self._pods_pending
        self.metrics.sources.inspector_stats = self._inspector_stats
        self.pods.add_handler(self._on_pod)
        self.nrts.add_handler(self._on_nrt)
        self.nodes.add_handler(self._on_node)
        self.configs.add_handler(self._on_config)
        self.params_objects.add_handler(self._on_params)

    def _runnables(self) -> list[Runnable]:
        """The long-running parts, in start order (stopped in reverse): on every replica the
        Event senders (stopped last, after a bounded flush), the caches and the registries and
        bindings loops; on the leader (:meth:`_start_leading`) the policy status loop, the
        escape monitor (while this process runs the lifecycle), the exec-format-error
        monitor, the admission feed and, last, the watch of placed pods that feeds those two
        (docs/design.md, "Runnables")."""
        out: list[Runnable] = [Service("events", False, self.events.start, self._stop_events)]
        out += [Service(f"informer {i.name}", False, i.start, i.stop)
                for i in (self.configs, self.nodes, self.nrts, self.pods, self.params_objects)]
        out += [
            Service("policies", False, self.policy_watch.start, self.policy_watch.stop),
            Loop("registries configmap", False, lambda _: self._refresh_registries_loop()),
        ]
        if self.inflight is not None:
            out.append(Loop("bindings", False, lambda _: self._watch_bindings()))
        out += [
            Loop("policy status", True, self.policy_watch.run),
            Service("escape monitor", True, self._start_escapes, self.escapes.stop),
            Service("exec format monitor", True, self.execformat.start, self.execformat.stop),
            Service("admission feed", True, self.feed.start, self.feed.stop),
            Service("placed pods", True, self.placed.start, self.placed.stop),
        ]
        return out

    def _start_escapes(self) -> None:
        if self.lifecycle is not None:
            self.escapes.start()

    async def _stop_events(self) -> None:
        await self.events.flush(2.0)
        await self.events.stop()

    # --- pieces --------------------------------------------------------------------------
    def _new_queue(self, workers: int | None = None) -> WorkQueue:
        o = self.options
        return WorkQueue(workers=workers or o.workers, rate=o.rate, burst=o.burst,
                         retry_now=(Conflict,), base_delay=o.retry_base_delay,
                         max_delay=o.retry_max_delay)

    def _pods_pending(self) -> int:
        """Pod keys queued, delayed or being processed (the queue's other keys left out)."""
        others = sum(1 for key in self._handlers if self.queue.is_pending(key))
        return self.queue.pending - others

    async def reconcile(self, key: str) -> float | None:
        """The work queue's one handler: a key of the lifecycle or of the params writer goes
        to its reconciler, any other (``namespace/name/uid``) to the pod reconciler.

        Returns:
            None (done) or seconds until the key runs again, as the reconciler said.

        Raises:
            Exception: whatever the reconciler raised (the queue retries after its backoff,
                at once without counting for :class:`kubeclient.Conflict`).
        """
        handler = self._handlers.get(key)
        if handler is None:
            if key.startswith(RELABEL_PREFIX):
                await self._relabel(key[len(RELABEL_PREFIX):])
                return None
            return await self.reconciler.reconcile(key)
        return await handler(key)

    def _failures(self, key: str) -> int:
        """The failure count of ``key`` in the queue serving it."""
        return (self._final_queue or self.queue).failures(key)

    @staticmethod
    def _make_inflight() -> InFlight:
        return InFlight()

    def _inspector_stats(self) -> Any:
        inspector = self._inspector
        return getattr(inspector, "stats", None) if inspector is not None else None

    def inspector(self) -> Any:
        """The image inspector for the current config (rebuilt when the cache TTL, the
        registry timeout or the registry rules of the ConfigMap change; the rules follow
        :func:`registries_from`)."""
        config, _ = self.config_source()
        loaded = self.registries_config_map
        key = (config.image_inspection.cache_ttl_seconds,
               config.image_inspection.registry_timeout_seconds,
               loaded.digest if loaded is not None else None)
        if self._inspector is not None and (not self._own_inspector or key == self._inspector_key):
            return self._inspector
        from podplacement.imageinspect import Inspector

        o = self.options
        registries = registries_from(
            config_map=loaded.registries if loaded is not None else None,
            conf_file=o.registries_conf, insecure=o.insecure_registries,
        )
        old = self._inspector
        self._inspector = Inspector(registries=registries, cache_ttl=key[0], timeout=key[1],
                                    retries=o.inspector_retries, ca_bundles=dict(o.ca_bundles))
        self._inspector_key = key
        if old is not None:
            # Lookups in flight keep using the old one; close it a little later.
            asyncio.get_running_loop().call_later(
                60.0, lambda: asyncio.ensure_future(old.aclose())
            )
        return self._inspector

    async def refresh_registries(self) -> None:
        """Read the registries ConfigMap of ``spec.imageInspection.registriesConfigMapRef``
        once (:meth:`controller.registriessource.RegistriesConfigMap.refresh`)."""
        ref = self.config_source()[0].image_inspection.registries_config_map
        await self._registries.refresh(self.api, ref)

    @property
    def registries_config_map(self) -> LoadedRegistries | None:
        """The registry rules last read from the ConfigMap (None: none in use)."""
        return self._registries.loaded

    @property
    def registries_error(self) -> str | None:
        """Why the last read of the registries ConfigMap failed (None: it did not)."""
        return self._registries.error

    async def _refresh_registries_loop(self) -> None:
        """Re-read the registries ConfigMap when the config changes and every
        ``registries_refresh_seconds``; cancelled by :meth:`stop`."""
        period = max(0.05, self.options.registries_refresh_seconds)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.configs.synced.wait(), period)
        while True:
            self._registries_changed.clear()
            await self.refresh_registries()
            self._registries_ready.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._registries_changed.wait(), period)

    def config_source(self) -> tuple[PlacementConfig, str | None]:
        """The parsed PodPlacementConfig ``cluster`` (defaults when absent), and the parse
        error when it is unreadable (defaults are used then; pods still get ungated)."""
        obj = self.configs.get(CONFIG_NAME)
        if obj is None:
            return PlacementConfig(), None
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if self._config_cache is not None and self._config_cache[0] == rv:
            return self._config_cache[1], self._config_cache[2]
        parsed, error = config_or_defaults(obj)
        if error is not None:
            log.warning("PodPlacementConfig %s unreadable, using defaults: %s", CONFIG_NAME,
                        error)
        self._config_cache = (rv, parsed, error)
        return parsed, error

    def placement_config(self) -> tuple[PlacementConfig, str | None]:
        """:meth:`config_source` with the exclusions this controller places with: those
        its exec-format-error monitor holds in force now (fresher than the status it
        publishes them in), then those of the config's status still in force
        (:func:`controller.core.learn.merge`); none unless ``execFormatErrorMonitor`` has both
        ``enabled`` and ``learn``."""
        config, error = self.config_source()
        if not (config.exec_format_monitor and config.exec_format_learn):
            return config, error
        own = self.execformat.current if self.leading else ()
        if not own and not config.excluded:
            return config, error
        return replace(config, excluded=merge(own, config.excluded, now=time.time())), error

    async def _on_excluded(self, excluded: tuple[ExcludedPlatform, ...]) -> None:
        """Take the excluded digests out of the admission policy's catalog, and write it
        now: its CEL cannot say why a platform is missing, so those pods are gated and
        placed by the webhook or the controller, whose decision annotation does."""
        removed = self.params.remove_digests({d for x in excluded for d in x.digests},
                                             images=[x.image for x in excluded if x.image])
        if removed:
            log.info("params: removed %s (a platform of theirs is excluded)", ", ".join(removed))
            if self.leading and self.lifecycle is not None and not self.params_writer.stopped:
                await self.params_writer.flush()

    def _apply_params_ttl(self) -> None:
        """Give the params store the config's ``imageInspection.cacheTTL`` (it applies to
        existing entries at the writer's next tick)."""
        self.params.ttl_seconds = self.config_source()[0].image_inspection.cache_ttl_seconds

    def _publishing(self) -> bool:
        """True while this controller publishes the admission policy's params: it owns the
        policy (it runs the lifecycle), ``mechanism`` is ``Auto`` and the policy has a place
        branch (docs/how-it-decides.md, "Placement inside the API server")."""
        if self.lifecycle is None:
            return False
        config = self.config_source()[0]
        return config.admission_mechanism == ADMISSION_AUTO and admissionpolicy.places(config)

    def _publish(self, image: str, result: Any) -> None:
        """Record an anonymously inspected image in the admission policy's params, while
        :meth:`_publishing` (by the reconciler, and by the admission feed for the images of
        pods placed at admission). The entry's learned time is the result's
        ``fetched_at`` (when a registry answered; a result served from the inspector's
        cache keeps the time of the answer it copies), or now for a result without one.
        A result an exclusion takes a platform from is not published (its entry goes)."""
        if not self._publishing():
            return
        self.params.ttl_seconds = self.config_source()[0].image_inspection.cache_ttl_seconds
        if touches(result, self.placement_config()[0].excluded):
            # the policy's annotation could not say why a platform is missing
            self.params.remove(image)
            return
        fetched_at = getattr(result, "fetched_at", None)
        digest = getattr(result, "digest", None)
        self.params.record(image, image_platform_pairs(result), time.time(),
                           learned=fetched_at if isinstance(fetched_at, int | float) else None,
                           digest=digest if isinstance(digest, str) else None)

    def _used_always(self, image: str) -> None:
        """A placed anonymous pod pulls ``image`` with ``Always``: keep checking the tag."""
        if self.leading and self._publishing():
            self.freshness.use(image, time.monotonic())

    async def _check_always_tags(self, key: str = FRESH_KEY) -> float | None:
        """The reconciler of :data:`FRESH_KEY`: check the digest of each tag pulled with
        ``Always`` in use that is due (one manifest ``HEAD``, through the inspector's
        ``pull_always``; a moved digest is inspected and published anew, its platforms
        included), then publish the tags confirmed within ``pullAlwaysFreshness`` as
        ``spec.fresh`` (the writer's next tick writes a change). Runs again every half of
        the window; publishes nothing while this controller does not publish the params.

        Returns:
            Seconds until the next pass (:attr:`controller.core.freshness.
            PullAlwaysFreshness.interval`), None while stopped."""
        if self.params_writer.stopped:
            return None
        config = self.config_source()[0]
        self.freshness.window = (config.admission_pull_always_freshness
                                 if self._publishing() else 0.0)
        due = self.freshness.due(time.monotonic())
        if due:
            gate = asyncio.Semaphore(FRESH_CONCURRENCY)
            await asyncio.gather(*(self._check_always_tag(image, gate) for image in due))
        self.params.set_fresh(self.freshness.published(time.monotonic()))
        return self.freshness.interval

    async def _check_always_tag(self, image: str, gate: asyncio.Semaphore) -> None:
        """One tag: confirmed with its digest (and its result published, so a moved digest
        changes the catalog too), or failed (it leaves ``spec.fresh`` at once)."""
        async with gate:
            try:
                result = await self.inspector().inspect(image, (), pull_always=True)
            except Exception as exc:  # a registry error: the tag is not fresh
                log.info("always tag %s: not confirmed: %s", image, exc)
                self.freshness.failed(image)
                return
        digest = getattr(result, "digest", None)
        if not isinstance(digest, str) or not digest:
            self.freshness.failed(image)
            return
        if self.params.digest_of(image) != digest:
            self._publish(image, result)
        if image in self.params:
            self.freshness.confirmed(image, digest, time.monotonic())
        else:  # not publishable (an exclusion, a platform outside the CRD's pattern)
            self.freshness.failed(image)

    def _on_policies(self, ranking: Ranking) -> None:
        """Publish the accepted policies with the params (the admission policy's CEL reads
        them), written at once rather than at the writer's next tick: until the params
        object holds a new policy, the admission policy places that namespace's pods without
        it (policy changes are rare: the pacing is not needed)."""
        if (self.params.set_policies(params_policies(ranking)) and self.leading
                and self.lifecycle is not None and not self.params_writer.stopped):
            self._policy_flush = asyncio.create_task(self.params_writer.flush(),
                                                     name="params flush (policies)")

    # --- event handlers ----------------------------------------------------------------
    def _on_pod(self, etype: str, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        key = pod_key(pod)
        if etype == "DELETED":
            self.queue.discard(key)
            self.reconciler.forget(str((pod.get("metadata") or {}).get("uid")))
            uid = str((pod.get("metadata") or {}).get("uid"))
            if self.leading and not self.reconciler.released_here(uid):
                # Deleted, or it left the watch because a user changed its gate label (a
                # label-selected watch reports that as DELETED with the old object): one GET
                # tells, and a pod still gated is labelled again.
                self.queue.add(RELABEL_PREFIX + key)
            return
        if self.leading and has_gate(pod):
            self.queue.add(key)

    async def _relabel(self, key: str) -> None:
        """Put the label ``scheduling-gate=gated`` back on a pod that still carries our
        gate after its label was changed or removed
        (:func:`controller.core.podspec.lost_gate_label`), so that the pod watch sees it
        again and the pod is placed (a pod's creator can update the label of a gated pod;
        no label decides for the product). Guarded by the pod's uid; a pod gone or
        changed meanwhile is left as it is."""
        namespace, name, uid = split_key(key)
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            pod = await self.api.request("GET", path)
        except NotFound:
            return  # deleted: nothing to do
        except ApiError as exc:
            log.info("pod %s/%s: not relabelled: %s", namespace, name, exc)
            return
        if (pod.get("metadata") or {}).get("uid") != uid or not lost_gate_label(pod):
            return
        try:
            ops = [{"op": "test", "path": "/metadata/uid", "value": uid}, *gate_label_ops(pod)]
            await self.api.request("PATCH", path, body=ops, content_type=JSON_PATCH)
        except (Conflict, NotFound) as exc:
            log.info("pod %s/%s: not relabelled: %s", namespace, name, exc)
            return
        log.info("pod %s/%s: our gate label was removed; set to %s again", namespace, name,
                 GATE_LABEL_GATED)

    def _on_params(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """A params object created or deleted: converge the webhook configuration's
        matchCondition to its uid (or to none) at once (:func:`controller.core.config.
        admission_mark`)."""
        if etype in ("ADDED", "DELETED") and self.leading and self.lifecycle is not None:
            self.queue.add(LIFECYCLE_KEY)

    def _on_node(self, etype: str, node: dict[str, Any], old: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            _forget_topology(node)

    def _on_nrt(self, etype: str, nrt: dict[str, Any], old: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            _forget_topology(nrt)
        if self.inflight is not None and etype != "DELETED":
            try:
                self.inflight.observe_nrt(nrt)
            except Exception:
                log.exception("in-flight NRT accounting failed")
        if not self.leading:
            return
        for pod in self.pods.cache.values():
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if labels.get(NUMA_LABEL) == NUMA_LABEL_WAITING:
                self.queue.add(pod_key(pod))

    def _on_config(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        apply_log_verbosity(self.config_source()[0].log_verbosity)
        self._apply_params_ttl()
        self._config_changed.set()
        self._registries_changed.set()
        self.execformat.config_changed()
        self.escapes.config_changed()
        self.placed.changed()
        if self.lifecycle is not None and self.leading:
            self.queue.add(LIFECYCLE_KEY)

    def _owns_admission(self) -> bool:
        """Whether this controller runs the lifecycle (the admission objects are its) and no
        ordered uninstall is under way: the escape monitor's ``active``."""
        return self.lifecycle is not None and not self.lifecycle.uninstalling

    def ready(self) -> bool:
        """Readiness: the pod, node and config caches are synced."""
        return all(i.synced.is_set() for i in (self.pods, self.nodes, self.configs))

    # --- leadership ----------------------------------------------------------------------
    async def _start_leading(self) -> None:
        if self.leading:
            return
        await self.pods.synced.wait()
        # Give the first read of the registries ConfigMap a moment, so that pods queued now
        # are not looked up with the wrong registry rules; never wait on it for long.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._registries_ready.wait(), 5.0)
        # Nor without the namespaces' placement policies (absent CRD: synced at once).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.policy_watch.policies.synced.wait(), 5.0)
        self.leading = True
        self.metrics.leader.set(1)
        self.queue = self._new_queue()
        self.queue.start(self.reconcile)
        for pod in list(self.pods.cache.values()):
            if has_gate(pod):
                self.queue.add(pod_key(pod))
        self.runtime.start_leading()
        if self.lifecycle is not None:
            self.queue.add(LIFECYCLE_KEY)
            # The writer's first tick adopts and expires by the TTL: the configured one.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.configs.synced.wait(), 5.0)
            self._apply_params_ttl()
            self.params_writer.start()
            self.queue.add(PARAMS_KEY)
            self.queue.add(FRESH_KEY)
        log.info("controller leading: %d gated pods queued", len(self.pods.cache))

    async def _stop_leading(self) -> None:
        """End of a leadership term (lost lease, or :meth:`stop`): the queue is shut down,
        so no pod is placed here any more and the lifecycle's and the params writer's work
        in flight is cancelled; the webhook configuration and the rest stay for the next
        leader. An ordered uninstall under way here, or due because the product itself is
        being removed (its namespace's deletion deletes the Lease, and no replica can
        lead again), is then finished on a queue of its own before the term ends
        (:meth:`_serve_to_end` of :data:`controller.lifecycle.FINISH_KEY`, bounded). Whether
        the product is being removed is read once: when that read fails (the API server is
        unreachable, the usual reason for a lost lease), the term ends at once, so this
        process can campaign again as soon as the server is back."""
        if not self.leading:
            return
        self.leading = False
        self.metrics.leader.set(0)
        await self.queue.shutdown()
        self.freshness.clear()  # a new term starts from the pods it sees
        await self.runtime.stop_leading()
        await self.params_writer.stop()
        if self.lifecycle is not None and await self._finish_due(self.lifecycle):
            await self._serve_to_end(FINISH_KEY)

    @staticmethod
    async def _finish_due(lifecycle: Lifecycle) -> bool:
        """True when an ordered uninstall is under way here or the product is being
        removed (:meth:`controller.lifecycle.Lifecycle.removal_due`, one attempt; a failed
        read is logged and means no)."""
        if lifecycle.uninstalling:
            return True
        try:
            return await lifecycle.removal_due()
        except Exception as exc:
            log.warning("cannot tell whether podplacement is being removed: %s", exc)
            return False

    async def _serve_to_end(self, key: str) -> None:
        """Serve the lifecycle key ``key`` alone on a one-worker queue of its own (the same
        backoff and failure count as the main queue's) until its pass says done, or
        :attr:`controller.lifecycle.Lifecycle.final_seconds` have passed (then the pass in
        flight is cancelled). Never raises: the term or the process is ending."""
        assert self.lifecycle is not None
        queue = self._final_queue = self._new_queue(workers=1)
        queue.start(self.reconcile)
        queue.add(key)
        try:
            async with asyncio.timeout(self.lifecycle.final_seconds):
                await queue.wait_idle()
        except TimeoutError:
            log.warning("%s: not done within %.0f s; left", key, self.lifecycle.final_seconds)
        finally:
            await queue.shutdown()
            self._final_queue = None

    def _make_lifecycle(self) -> Lifecycle | None:
        o = self.options
        if not (o.webhook_url or o.webhook_service):
            return None
        from podplacement.controller import lifecycle as lc

        ca: Any
        if o.cert_manager_certificate:
            ca = None  # cert-manager's CA injector owns caBundle
        elif o.cert_dir:
            ca = lc.ca_bundle_from_dir(o.cert_dir)
        else:
            if o.webhook_service:
                ca = lc.ServingCertSecret(self.api, o.namespace, service_name=o.webhook_service)
            else:
                ca = lc.ServingCertSecret(self.api, o.namespace)
        service = (o.namespace, o.webhook_service, 443, "/mutate") if o.webhook_service else None
        return lc.Lifecycle(
            self.api, namespace=o.namespace, service=service,
            url=o.webhook_url if not o.webhook_service else None, ca_bundle=ca,
            cert_manager_certificate=o.cert_manager_certificate,
            ungate_remaining=self.ungate_remaining,
            before_params_delete=self.params_writer.stop,
            uninstall_deadline_seconds=o.uninstall_deadline_seconds,
            failures=self._failures,
        )

    # --- start / stop --------------------------------------------------------------------
    async def start(self) -> None:
        """Start informers, events, the metrics server and leader election (or lead at
        once when election is off). Returns once started; use :meth:`wait_synced`."""
        if self._started:
            return
        self._started = True
        o = self.options
        self.runtime.start()
        if o.metrics_port is not None:
            self.health = HealthServer(self.metrics, host=o.metrics_host, port=o.metrics_port,
                                       ready=self.ready, unhealthy=self.runtime.unhealthy)
            await self.health.start()
        self.lifecycle = self._make_lifecycle()
        if self.lifecycle is not None:
            self._handlers = dict.fromkeys(KEYS, self.lifecycle.handle)
            self._handlers[PARAMS_KEY] = self.params_writer.reconcile
            self._handlers[FRESH_KEY] = self._check_always_tags
        if o.leader_election:
            from podplacement.controller.leader import LeaderElector

            self.elector = LeaderElector(
                self.api, o.namespace, identity=o.identity,
                lease_duration=o.lease_duration, renew_deadline=o.renew_deadline,
                retry_period=o.retry_period,
                on_started_leading=self._start_leading, on_stopped_leading=self._stop_leading,
            )
            self._elector_task = asyncio.create_task(self.elector.run(), name="leader election")
        else:
            await self._start_leading()

    async def wait_synced(self, wait_seconds: float = 30.0) -> None:
        """Wait until :meth:`ready` (raises TimeoutError)."""
        async with asyncio.timeout(wait_seconds):
            for informer in (self.pods, self.nodes, self.configs):
                await informer.synced.wait()

    async def stop(self) -> None:
        """Stop everything this controller started (graceful: releases the lease). The last
        controller to stop, the leader with no other taking the lease within
        ``standby_wait`` seconds, first stands down or finishes the ordered uninstall
        (:meth:`controller.lifecycle.Lifecycle.last_stop`)."""
        if not self._started:
            return
        self._started = False
        was_leading = self.leading
        if self.elector is not None:
            with contextlib.suppress(Exception):
                await self.elector.stop()
            if self._elector_task is not None:
                self._elector_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._elector_task
        await self._stop_leading()
        if (was_leading and self.lifecycle is not None and self.elector is not None
                and self.options.standby_wait >= 0 and not self.lifecycle.gone):
            await self._last_stop(self.elector.identity)
        await self.runtime.stop()
        if self.health is not None:
            await self.health.stop()
        if self._own_inspector and self._inspector is not None:
            with contextlib.suppress(Exception):
                await self._inspector.aclose()
        if self.own_api:
            await self.api.close()

    async def _last_stop(self, identity: str) -> None:
        """Stand down (or finish the uninstall) unless another controller takes the lease
        within ``standby_wait`` seconds: :data:`controller.lifecycle.LAST_STOP_KEY` served
        to its end (:meth:`_serve_to_end`), after the queue stopped placing pods. Bounded
        by the wait plus :attr:`controller.lifecycle.Lifecycle.final_seconds`; never
        raises: the process is ending."""
        # Past the webhook's grace for a released Lease, so the pods it gated meanwhile
        # are released below too.
        wait = max(self.options.standby_wait, LEASE_RELEASED_GRACE_SECONDS + 1.0)
        if await self._successor(identity, wait):
            return
        await self._serve_to_end(LAST_STOP_KEY)

    async def _successor(self, identity: str, within: float) -> bool:
        """True when a controller other than ``identity`` holds the Lease within ``within``
        seconds (polled); False when none does, or the Lease cannot be read."""
        from podplacement.controller.leader import LEASE_PATH

        path = LEASE_PATH.format(namespace=self.options.namespace, name=LEASE_NAME)
        deadline = time.monotonic() + max(0.0, within)
        while True:
            try:
                lease = await self.api.request("GET", path)
            except ApiError:
                return False
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
            if holder and holder != identity:
                log.info("controller %s took over; not standing down", holder)
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)

    async def __aenter__(self) -> Controller:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- NUMA in-flight accounting ----------------------------------------------------------
    async def _watch_bindings(self, idle_seconds: float = 5.0) -> None:
        """Feed the in-flight NUMA accounting with bindings and deletions
        (:func:`controller.bindingfeed.watch_bindings`) while topology placement is on."""
        await watch_bindings(
            self.api, inflight=lambda: self.inflight,
            enabled=lambda: self.config_source()[0].topology.enabled,
            changed=self._config_changed, watch_timeout=self.options.watch_timeout,
            idle_seconds=idle_seconds)

    # --- uninstall -----------------------------------------------------------------------
    async def ungate_remaining(self, deadline_seconds: float) -> int:
        """Release every pod still gated (ordered uninstall, stand-down): a normal decision
        when it completes within ``deadline_seconds``, else the fallback release, which keeps
        what is known (:meth:`controller.reconciler.Reconciler.release`: the fallback
        architecture when one applies, the fallback operating systems; the Warning
        ``PlacementFallback`` says which). Returns how many of the pods gated when it started
        are released (deleted ones are not counted)."""
        items, _ = await self.api.list_all(
            PODS_PATH, params={"labelSelector": f"{GATE_LABEL}={GATE_LABEL_GATED}"}
        )
        pods = [p for p in items if has_gate(p)]
        deadline = time.monotonic() + max(0.0, deadline_seconds)
        sem = asyncio.Semaphore(max(1, self.options.workers))
        self.releasing += 1

        async def one(pod: dict[str, Any]) -> int:
            async with sem:
                key = pod_key(pod)
                ns, name, _ = split_key(key)
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    self.pods.cache.setdefault(object_key(pod), pod)
                    with contextlib.suppress(TimeoutError, ApiError, RetryLater):
                        async with asyncio.timeout(remaining):
                            await self.reconciler.reconcile(key)
                fresh = await self._get_pod(ns, name)
                if fresh is None:
                    return 0
                if not has_gate(fresh):
                    return 1  # decided (by this call, or by a worker it raced)
                config, _ = self.placement_config()
                try:
                    decision = await self.reconciler.release(
                        fresh, "podplacement is being uninstalled", config)
                except ApiError as exc:
                    log.warning("uninstall: ungating %s/%s failed: %s", ns, name, exc)
                    return 0
                self.reconciler.emit(fresh, decision)
                return 1 if decision.ungate else 0

        try:
            results = await asyncio.gather(*(one(p) for p in pods))
        finally:
            self.releasing -= 1
        return sum(results)

    async def _get_pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.api.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        except ApiError as exc:
            if exc.not_found:
                return None
            raise


def _forget_topology(obj: Mapping[str, Any]) -> None:
    """Drop the NUMA decision cache's parsed Node/NRT of a deleted object (memory only: the
    cache is keyed by name and would otherwise keep deleted nodes)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not name:
        return
    from podplacement.controller.core.numa._decide import _CACHE

    _CACHE.forget(name)


class _InspectorProxy:
    """Late-binding inspector: the reconciler always uses the controller's current one."""

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    async def inspect(self, image: str, credentials: Sequence[Any] = (), *,
                      pull_always: bool = False) -> ImageLike:
        result: ImageLike = await self._controller.inspector().inspect(
            image, credentials, pull_always=pull_always
        )
        return result


def config_from(obj: Mapping[str, Any] | None) -> PlacementConfig:
    """Parse a PodPlacementConfig dict, defaults on None (helper for tests/bench).

    Raises:
        ConfigError: the object does not parse (tests want to know).
    """
    return PlacementConfig.from_object(obj) if obj else PlacementConfig()
