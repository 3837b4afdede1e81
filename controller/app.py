"""Wiring of the controller process: informers, the work queue, the reconciler, events,
metrics, leader election and the PodPlacementConfig lifecycle. :class:`Controller` constructs
the parts, each a module of one job, hands each what it needs, and starts and stops them:

* :mod:`controller.configview`: the PodPlacementConfig as parsed (defaults when unreadable),
  with the exclusions of exec format errors placed with;
* :mod:`controller.registryrules`: the registry rules of the ConfigMap the config names;
* :mod:`controller.inspectors`: the image inspector for the current config and rules;
* :mod:`controller.publisher`: what goes into the admission policy's params;
* :mod:`controller.alwaysfresh`: the checks of the tags pulled with ``Always`` (key
  :data:`controller.alwaysfresh.FRESH_KEY`);
* :mod:`controller.gatedpods`: the informers' events mapped to work-queue keys;
* :mod:`controller.term`: the start and end of a leadership term, and its work queue;
* :mod:`controller.lastrelease`: the release of every pod still gated when the product goes.

Informers (list+watch, cluster-wide): pods with the server-side label selector
``podplacement.io/scheduling-gate=gated`` (never all pods; a gated pod whose label a user
changed is labelled again, :meth:`controller.gatedpods.GatedPodEvents.relabel`), Nodes, the
PodPlacementConfig and NodeResourceTopologies (tolerated when the CRD is absent; picked up
when it appears). While topology placement is on, a cache-less list+watch of the pods
labelled ``podplacement.io/numa=placed`` feeds their bindings to the NUMA in-flight
accounting. Every replica keeps its caches warm; only the leader runs the workers and the
lifecycle, so only the leader writes. When a replica becomes the leader it queues every pod
still gated, which is also how a restarted controller finishes a batch.

Registry rules (containers-registries.conf(5) v2) come from the ConfigMap named by
``spec.imageInspection.registriesConfigMapRef`` (key ``registries.conf``) when the config sets
it, else from ``--registries-conf``; ``--insecure-registry`` applies on top of either. The
ConfigMap is read with a plain GET when the config changes and every
``registries_refresh_seconds``; a missing or malformed one is logged and the last good
registry rules stay in use (pods are never held back for it).

The leader's one placement controller (a :class:`controller.generic.Controller` of string
keys, :attr:`controller.term.LeadershipTerm.queue`) serves every reconciler: pod keys
(``namespace/name/uid``, :class:`~controller.reconciler.Reconciler`), the
PodPlacementConfig lifecycle's keys (:data:`controller.lifecycle.KEYS`), the params
writer's (:data:`controller.paramswriter.PARAMS_KEY`), the Always tags' checks
(:data:`controller.alwaysfresh.FRESH_KEY`) and the relabelling of pods
(:data:`controller.gatedpods.RELABEL_PREFIX`); :meth:`Controller.reconcile` routes them (one
worker pool and one token bucket for all five kinds, which ``--workers``, ``--rate`` and
``--burst`` size; docs/design.md, "One generic controller"). When
this process stops leading the queue is shut down (its work in flight is cancelled: the pods
are no longer placed here), and what must not be left half-done is then served on a
one-worker queue of its own, bounded: the ordered uninstall under way, or due because the
product itself is being removed (:data:`controller.lifecycle.FINISH_KEY`), and, on the last
graceful stop, the stand-down (:data:`controller.lifecycle.LAST_STOP_KEY`)
(:class:`controller.term.LeadershipTerm`).

The leader also runs one cache-less watch of the pods labelled
``podplacement.io/node-affinity`` (every pod placed, by any path:
:class:`controller.placedwatch.PlacedPods`), which feeds three readers: the escape monitor
(below) and these two. The admission feed
(:mod:`controller.admissionfeed`, always): a placed pod's images are marked used in the
admission policy's catalog, the images of an anonymous pod placed at admission that the
catalog lacks are inspected by the controller and published (so the policy places their next
pods), and the Warning Event of a decision taken at admission is sent as for the
controller's own. The exec-format-error monitor (:mod:`controller.execformatmonitor`, while
``spec.plugins.execFormatErrorMonitor.enabled``): its own generic controller, one verification
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
label, and the labelled ones of the watch of placed pods whose record their spec does not bear
out (:func:`rules.monitor.escape.placement_doubt`: a label a pod's creator wrote hides nothing), its
own generic controller, a ``PlacementEscaped`` Event and a record per pod, and the
repair that deletes such a pod of a ReplicaSet, StatefulSet or Job when its node can't run
its images (docs/escaped-pods.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from podplacement.controller import paramswriter, policywatch
from podplacement.controller.admissionfeed import AdmissionFeed
from podplacement.controller.alwaysfresh import FRESH_KEY, AlwaysTagChecks
from podplacement.controller.bindingfeed import PODS_PATH, watch_bindings
from podplacement.controller.configview import ConfigView
from podplacement.controller.credproviders import load_runner
from podplacement.controller.escapemonitor import EscapeMonitor
from podplacement.controller.events import EventSink
from podplacement.controller.execformatmonitor import CONFIG_STATUS_PATH, ExecFormatMonitor
from podplacement.controller.gatedpods import RELABEL_PREFIX, GatedPodEvents
from podplacement.controller.generic import Controller as GenericController
from podplacement.controller.generic import QueueSettings
from podplacement.controller.inspectionreports import InspectionReports
from podplacement.controller.inspectors import InspectorSource
from podplacement.controller.lastrelease import LastResortRelease
from podplacement.controller.lifecycle import KEYS, Lifecycle
from podplacement.controller.metrics import HealthServer, Metrics
from podplacement.controller.paramswriter import PARAMS_KEY, ParamsWriter, params_collection_path
from podplacement.controller.placedwatch import PlacedPods
from podplacement.controller.policywatch import PolicyWatch
from podplacement.controller.publisher import ParamsPublisher
from podplacement.controller.reconciler import Reconciler
from podplacement.controller.registriessource import CONFIGMAP_PATH, LoadedRegistries
from podplacement.controller.registryrules import RegistryRules
from podplacement.controller.runnables import Loop, Manager, Runnable, Service
from podplacement.controller.term import Handler, LeadershipTerm, make_lifecycle
from podplacement.kubeclient import Informer, KubeAPI, resource_path
from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.config import (
    CONFIG_NAME,
    CONFIG_PLURAL,
    DEFAULT_NAMESPACE,
    GATE_LABEL,
    GATE_LABEL_GATED,
    GROUP,
    LOG_VERBOSITY_LOGGERS,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    PARAMS_NAME,
    VERSION,
    ExcludedPlatform,
    PlacementConfig,
)
from podplacement.rules.findings import FindingsStore
from podplacement.rules.freshness import PullAlwaysFreshness
from podplacement.rules.monitor.escape import created_at
from podplacement.rules.nodeview import node_view
from podplacement.rules.numa import InFlight
from podplacement.rules.tolerations import node_arch_taints

if TYPE_CHECKING:
    from podplacement.controller.leader import LeaderElector

log = logging.getLogger(__name__)

NODES_PATH = resource_path("", "v1", "nodes")
CONFIGS_PATH = resource_path(GROUP, VERSION, CONFIG_PLURAL)
NRTS_PATH = resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL)
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
    # the escape monitor: a Namespace's opt-out labels, and the escape condition of the
    # record, which a pod's creator cannot write (controller.escapemonitor.API_REQUESTS)
    ("GET", "/api/v1/namespaces/{name}"),
    ("PATCH", "/api/v1/namespaces/{namespace}/pods/{name}/status"),
    *paramswriter.API_REQUESTS,
    *policywatch.API_REQUESTS,
    # the params object's creations and deletions (controller.gatedpods): list + watch
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
    ``credential_provider_config`` / ``credential_provider_bin_dir``: the kubelet's
    ``CredentialProviderConfig`` file and the directory of its plugins
    (:mod:`controller.credproviders`); an unusable config is logged and the controller runs
    without providers.
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
    credential_provider_config: str | None = None
    credential_provider_bin_dir: str | None = None


class Controller:
    """The controller process, startable in-process (tests) or from the CLI: the wiring of
    its parts, each with one job (:mod:`controller.configview`,
    :mod:`controller.registryrules`, :mod:`controller.inspectors`,
    :mod:`controller.publisher`, :mod:`controller.alwaysfresh`, :mod:`controller.gatedpods`,
    :mod:`controller.term`, :mod:`controller.lastrelease`), and its start and stop.

    Args:
        api: the Kubernetes client (closed by :meth:`stop` only if ``own_api``).
        options: :class:`ControllerOptions`.
        inspector: an ``imageinspect.Inspector``-like object; default: one built from the
            config (cache TTL, registry timeout) and ``--registries-conf``.
    """

    def __init__(self, api: KubeAPI, options: ControllerOptions | None = None, *,
                 inspector: Any = None, own_api: bool = False) -> None:
        self.api, self.options, self.own_api = api, options or ControllerOptions(), own_api
        o = self.options
        self.metrics = Metrics()
        self.pods, self.nodes, self.configs, self.nrts, self.params_objects = _informers(api, o)
        self.events = EventSink(api, enabled=o.events, instance=o.identity)
        self.config = ConfigView(self.configs, self._exclusions)
        self.registry_rules = RegistryRules(api, self.config_source, self.configs.synced,
                                            o.registries_refresh_seconds)
        self.inspectors = InspectorSource(
            inspector, self.config_source, self._loaded_registries,
            registries_conf=o.registries_conf, insecure=o.insecure_registries,
            retries=o.inspector_retries, ca_bundles=o.ca_bundles)
        self.inflight = InFlight()
        self.providers, self.providers_error = load_runner(
            o.credential_provider_config, o.credential_provider_bin_dir, api,
            on_run=self._count_provider_run)
        self.metrics.credential_provider_config_error.set(1 if self.providers_error else 0)
        self.params, self.params_writer, self.publisher = _params(self)
        self.freshness, self.fresh = _always_tags(self)
        self.policy_watch = PolicyWatch(api, on_change=self.publisher.on_policies,
                                        placed_gauge=self.metrics.policy_placed_pods,
                                        watch_timeout=o.watch_timeout)
        self.runtime = Manager()
        self.term = _term(self)
        self.reconciler = _reconciler(self)
        self.release = LastResortRelease(api, self.pods, self.reconciler, workers=o.workers,
                                         placement_config=self.placement_config)
        self._config_changed = asyncio.Event()
        self.gated = _gated_pods(self)
        self.reports = InspectionReports(api, o.namespace, ttl=self._cache_ttl,
                                         watch_timeout=o.watch_timeout)
        self.findings, self.execformat, self.placed, self.feed, self.escapes = _leader_parts(self)
        #: The handlers of the keys that are not pods' (:meth:`reconcile`).
        self._handlers: dict[str, Handler] = {}
        self.health: HealthServer | None = None
        self.elector: LeaderElector | None = None
        self._elector_task: asyncio.Task[None] | None = None
        self._started = False
        for runnable in self._runnables():
            self.runtime.add(runnable)
        self.metrics.sources.api_counters = self._api_counters
        self.metrics.sources.gated = self._gated_count
        self.metrics.sources.queue_depth = self._pods_pending
        self.metrics.sources.oldest_gated = self._oldest_gated
        self.metrics.sources.catalog = self._catalog_size
        self.metrics.sources.inspector_stats = self.inspectors.stats
        self.gated.subscribe(self.pods, self.nrts, self.nodes, self.configs, self.params_objects)

    def _runnables(self) -> list[Runnable]:
        """The long-running parts, in start order (stopped in reverse): on every replica the
        Event senders (stopped last, after a bounded flush), the caches (the webhook's
        inspection reports among them) and the registries and bindings loops; on the leader
        (:meth:`controller.term.LeadershipTerm.start_leading`) the policy status loop, the
        escape monitor (while this process runs the lifecycle), the exec-format-error
        monitor, the creation of the report ConfigMap, the admission feed and, last, the
        watch of placed pods
        that feeds those two (docs/design.md, "Runnables")."""
        out: list[Runnable] = [Service("events", False, self.events.start, self._stop_events)]
        out += [Service(f"informer {i.name}", False, i.start, i.stop)
                for i in (self.configs, self.nodes, self.nrts, self.pods, self.params_objects)]
        out += [
            Service("policies", False, self.policy_watch.start, self.policy_watch.stop),
            Service("inspection reports", False, self.reports.start, self.reports.stop),
            Loop("registries configmap", False, self._registries_loop),
        ]
        if self.inflight is not None:
            out.append(Loop("bindings", False, self._bindings_loop))
        out += [
            Loop("policy status", True, self.policy_watch.run),
            Service("escape monitor", True, self._start_escapes, self.escapes.stop,
                    health=self.escapes.queue.healthy),
            Service("exec format monitor", True, self.execformat.start, self.execformat.stop,
                    health=self.execformat.queue.healthy),
            Loop("inspection report configmap", True, self.reports.keep),
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

    async def _registries_loop(self, _stop: asyncio.Event) -> None:
        """The runnable ``registries configmap``
        (:meth:`controller.registryrules.RegistryRules.run`)."""
        await self.registry_rules.run()

    async def _bindings_loop(self, _stop: asyncio.Event) -> None:
        """The runnable ``bindings`` (:meth:`_watch_bindings`)."""
        await self._watch_bindings()

    async def _watch_bindings(self, idle_seconds: float = 5.0) -> None:
        """Feed the in-flight NUMA accounting with bindings and deletions
        (:func:`controller.bindingfeed.watch_bindings`) while topology placement is on."""
        await watch_bindings(
            self.api, inflight=self._inflight, enabled=self._topology_enabled,
            changed=self._config_changed, watch_timeout=self.options.watch_timeout,
            idle_seconds=idle_seconds)

    # --- the readers the parts are wired with (named, so an import graph sees them) ------
    def _inflight(self) -> InFlight:
        """The NUMA in-flight accounting."""
        return self.inflight

    def _topology_enabled(self) -> bool:
        """``spec.topology.enabled`` of the current config."""
        return self.config_source()[0].topology.enabled

    def _exclusions(self) -> tuple[ExcludedPlatform, ...]:
        """The exec-format exclusions placed with: the monitor's, while this replica leads
        (none otherwise)."""
        return self.execformat.current if self.leading else ()

    def _loaded_registries(self) -> LoadedRegistries | None:
        """The registry rules of the ConfigMap (:attr:`registries_config_map`)."""
        return self.registry_rules.loaded

    def _count_provider_run(self, name: str, result: str) -> None:
        """Count one credential provider run
        (``podplacement_credential_provider_runs_total{provider,result}``)."""
        self.metrics.credential_provider_runs.labels(name, result).inc()

    def _api_counters(self) -> dict[Any, int]:
        """The API client's request counters, copied at scrape time."""
        return dict(self.api.counters)

    def _gated_count(self) -> int:
        """Pods in the gated pods' cache."""
        return len(self.pods.cache)

    def _catalog_size(self) -> tuple[int, int]:
        """The params' (JSON bytes, evictions)."""
        return self.params.json_size, self.params.evictions

    def _node_arch_taints(self) -> Any:
        """The architecture taints the Nodes carry (the status, for the webhook)."""
        return node_arch_taints(self.nodes.cache.values())

    def _policy_taints(self) -> Any:
        """The architecture taints the policy's CEL tolerates: the config's and the
        Nodes' ones."""
        return self.config_source()[0].architecture_taints.known(self._node_arch_taints())

    def _runs_lifecycle(self) -> bool:
        """True when this process runs the PodPlacementConfig lifecycle."""
        return self.lifecycle is not None

    def _reports_apply(self) -> bool:
        """Whether the webhook's inspection reports may be published: not while the config
        names a registries ConfigMap (its rules are the controller's alone)."""
        return self.config_source()[0].image_inspection.registries_config_map is None

    def _cache_ttl(self) -> float:
        """The config's ``imageInspection.cacheTTL`` (seconds)."""
        return self.config_source()[0].image_inspection.cache_ttl_seconds

    def _is_leading(self) -> bool:
        """:attr:`leading`, as a callable."""
        return self.leading

    def _may_write(self) -> bool:
        """The pod reconciler may write: this replica leads, or releases the pods still
        gated (:attr:`releasing`)."""
        return self.leading or self.releasing > 0

    def _params_writer_stopped(self) -> bool:
        """The params writer stopped (:attr:`controller.paramswriter.ParamsWriter.stopped`)."""
        return self.params_writer.stopped

    def _pod_failures(self, key: str) -> int:
        """The failure count of a pod key in the current term's queue."""
        return self.term.queue.failures(key)

    def _apply_log_verbosity(self) -> None:
        """Apply the config's ``spec.logVerbosity`` (:func:`apply_log_verbosity`)."""
        apply_log_verbosity(self.config_source()[0].log_verbosity)

    def _wake_leader_parts(self) -> None:
        """A config event: the exec-format monitor, the escape monitor and the watch of
        placed pods read their switches again."""
        self.execformat.config_changed()
        self.escapes.config_changed()
        self.placed.changed()

    def _config_object(self) -> Mapping[str, Any] | None:
        """The live PodPlacementConfig ``cluster`` (None: it does not exist)."""
        return self.configs.get(CONFIG_NAME)

    def _placed_listing(self) -> bool:
        """The watch of placed pods is listing
        (:attr:`controller.placedwatch.PlacedPods.listing`)."""
        return self.placed.listing

    def _escapes_active(self) -> bool:
        """The escape monitor may run: this process owns the admission objects and no
        ordered uninstall is under way."""
        return self.lifecycle is not None and not self.lifecycle.uninstalling

    # --- the parts' state, as others read it ---------------------------------------------
    @property
    def leading(self) -> bool:
        """True while this replica leads (:attr:`controller.term.LeadershipTerm.leading`)."""
        return self.term.leading

    @property
    def queue(self) -> GenericController[str]:
        """The current leadership term's work queue."""
        return self.term.queue

    @property
    def lifecycle(self) -> Lifecycle | None:
        """The PodPlacementConfig lifecycle when this process runs it (set by :meth:`start`)."""
        return self.term.lifecycle

    @lifecycle.setter
    def lifecycle(self, value: Lifecycle | None) -> None:
        self.term.lifecycle = value

    @property
    def releasing(self) -> int:
        """> 0 while the ordered uninstall or the stand-down releases gated pods: the
        reconciler may then write although this process may no longer lead."""
        return self.release.releasing

    def config_source(self) -> tuple[PlacementConfig, str | None]:
        """The parsed PodPlacementConfig (:meth:`controller.configview.ConfigView.source`)."""
        return self.config.source()

    def placement_config(self) -> tuple[PlacementConfig, str | None]:
        """The config with the exclusions placed with
        (:meth:`controller.configview.ConfigView.placement`)."""
        return self.config.placement()

    def inspector(self) -> Any:
        """The image inspector for the current config
        (:meth:`controller.inspectors.InspectorSource.current`)."""
        return self.inspectors.current()

    async def refresh_registries(self) -> None:
        """Read the registries ConfigMap once
        (:meth:`controller.registryrules.RegistryRules.refresh`)."""
        await self.registry_rules.refresh()

    @property
    def registries_config_map(self) -> LoadedRegistries | None:
        """The registry rules last read from the ConfigMap (None: none in use)."""
        return self.registry_rules.loaded

    @property
    def registries_error(self) -> str | None:
        """Why the last read of the registries ConfigMap failed (None: it did not)."""
        return self.registry_rules.error

    async def ungate_remaining(self, deadline_seconds: float) -> int:
        """Release every pod still gated
        (:meth:`controller.lastrelease.LastResortRelease.ungate_remaining`)."""
        return await self.release.ungate_remaining(deadline_seconds)

    def ready(self) -> bool:
        """Readiness: the pod, node and config caches are synced."""
        return all(i.synced.is_set() for i in (self.pods, self.nodes, self.configs))

    def _oldest_gated(self) -> float:
        """Seconds since the creationTimestamp of the oldest pod of the gated pods' cache
        (0 when none, or none has a readable timestamp): ``podplacement_oldest_gated_pod_
        seconds``, read at scrape time."""
        created = [t for pod in list(self.pods.cache.values())
                   if (t := created_at(pod)) is not None]
        return max(0.0, time.time() - min(created)) if created else 0.0

    # --- the work queue ------------------------------------------------------------------
    def _pods_pending(self) -> int:
        """Pod keys queued, delayed or being processed (the queue's other keys left out)."""
        others = sum(1 for key in self._handlers if self.queue.is_pending(key))
        return self.queue.pending - others

    async def reconcile(self, key: str) -> float | None:
        """The work queue's one handler: a key of the lifecycle, of the params writer or of
        the Always tags' checks goes to its reconciler, ``relabel:<pod>`` to
        :meth:`controller.gatedpods.GatedPodEvents.relabel`, any other
        (``namespace/name/uid``) to the pod reconciler.

        Returns:
            None (done) or seconds until the key runs again, as the reconciler said.

        Raises:
            Exception: whatever the reconciler raised (the queue retries after its backoff,
                at once without counting for :class:`kubeclient.Conflict`).
        """
        handler = self._handlers.get(key)
        if handler is None:
            if key.startswith(RELABEL_PREFIX):
                await self.gated.relabel(key[len(RELABEL_PREFIX):])
                return None
            return await self.reconciler.reconcile(key)
        return await handler(key)

    def _make_lifecycle(self) -> Lifecycle | None:
        return make_lifecycle(self.api, self.options, ungate_remaining=self.ungate_remaining,
                              before_params_delete=self.params_writer.stop,
                              failures=self.term.failures)

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
            # the architecture taints the Nodes carry, for the webhook (no Node view)
            self.lifecycle.status.arch_taints = self._node_arch_taints
            self._handlers = dict.fromkeys(KEYS, self.lifecycle.handle)
            self._handlers[PARAMS_KEY] = self.params_writer.reconcile
            self._handlers[FRESH_KEY] = self.fresh.check
        if o.leader_election:
            from podplacement.controller.leader import LeaderElector

            self.elector = LeaderElector(
                self.api, o.namespace, identity=o.identity,
                lease_duration=o.lease_duration, renew_deadline=o.renew_deadline,
                retry_period=o.retry_period, on_started_leading=self.term.start_leading,
                on_stopped_leading=self.term.stop_leading,
            )
            self._elector_task = asyncio.create_task(self.elector.run(), name="leader election")
        else:
            await self.term.start_leading()

    async def wait_synced(self, wait_seconds: float = 30.0) -> None:
        """Wait until :meth:`ready` (raises TimeoutError)."""
        async with asyncio.timeout(wait_seconds):
            for informer in (self.pods, self.nodes, self.configs):
                await informer.synced.wait()

    async def stop(self) -> None:
        """Stop everything this controller started (graceful: releases the lease). The last
        controller to stop, the leader with no other taking the lease within
        ``standby_wait`` seconds, first stands down or finishes the ordered uninstall
        (:meth:`controller.term.LeadershipTerm.last_stop`)."""
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
        await self.term.stop_leading()
        if (was_leading and self.lifecycle is not None and self.elector is not None
                and self.options.standby_wait >= 0 and not self.lifecycle.gone):
            await self.term.last_stop(self.elector.identity)
        await self.runtime.stop()
        if self.health is not None:
            await self.health.stop()
        await self.inspectors.aclose()
        if self.own_api:
            await self.api.close()

    async def __aenter__(self) -> Controller:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# --- factories of the bigger parts (Controller.__init__'s wiring) --------------------------
def _informers(api: KubeAPI, o: ControllerOptions) -> tuple[Informer, Informer, Informer,
                                                             Informer, Informer]:
    """The informers every replica keeps: gated pods (server-side label selector), Nodes
    (trimmed to the fields the controller reads, :func:`node_view`: a kubelet's images,
    conditions and managedFields are most of a Node's bytes), the PodPlacementConfig, the
    NRTs (both tolerated when their CRD is absent) and the params object's creations and
    deletions (cache-less: one object; each changes the mark the webhook configuration
    trusts, its uid)."""
    return (
        Informer(api, PODS_PATH, {"labelSelector": f"{GATE_LABEL}={GATE_LABEL_GATED}"},
                 name="gated pods", watch_timeout=o.watch_timeout),
        Informer(api, NODES_PATH, name="nodes", watch_timeout=o.watch_timeout,
                 transform=node_view),
        Informer(api, CONFIGS_PATH, name="podplacementconfigs", watch_timeout=o.watch_timeout,
                 tolerate_absent=True, max_backoff=10.0),
        Informer(api, NRTS_PATH, name="noderesourcetopologies", watch_timeout=o.watch_timeout,
                 tolerate_absent=True, max_backoff=30.0),
        Informer(api, params_collection_path(o.namespace),
                 {"fieldSelector": f"metadata.name={PARAMS_NAME}"}, name="params object",
                 watch_timeout=o.watch_timeout, tolerate_absent=True, max_backoff=10.0,
                 keep_cache=False),
    )


def _params(c: Controller) -> tuple[ParamsStore, ParamsWriter, ParamsPublisher]:
    """The admission policy's params (image → platforms, anonymous results), written by the
    leader at most about once a second; their TTL follows the config's cacheTTL from the first
    config event on, before the writer's first tick; and what is published in them
    (:class:`controller.publisher.ParamsPublisher`: by the leader that runs the lifecycle)."""
    params = ParamsStore(c.config_source()[0].image_inspection.cache_ttl_seconds)
    writer = ParamsWriter(c.api, params, metrics=c.metrics.params, namespace=c.options.namespace)
    # the architecture taints the policy's CEL tolerates: the config's and the Nodes' ones
    writer.taints_source = c._policy_taints
    publisher = ParamsPublisher(
        params, writer, config_source=c.config_source, placement_config=c.placement_config,
        owns_admission=c._runs_lifecycle, leading=c._is_leading)
    return params, writer, publisher


def _always_tags(c: Controller) -> tuple[PullAlwaysFreshness, AlwaysTagChecks]:
    """The tags pulled with Always in use and their confirmed digests, published as the
    params' spec.fresh (leader only; :class:`controller.alwaysfresh.AlwaysTagChecks`)."""
    freshness = PullAlwaysFreshness(c.config_source()[0].admission_pull_always_freshness)
    return freshness, AlwaysTagChecks(
        freshness, c.params, config_source=c.config_source, inspector=c.inspector,
        publishing=c.publisher.publishing, publish=c.publisher.publish,
        leading=c._is_leading, stopped=c._params_writer_stopped)


def _term(c: Controller) -> LeadershipTerm:
    """The leadership term: its queues built from the options, a new term waiting for the
    registry rules' first read and the policies' sync."""
    o = c.options
    return LeadershipTerm(
        c.api, namespace=o.namespace, queues=QueueSettings(
            o.workers, o.rate, o.burst, o.retry_base_delay, o.retry_max_delay),
        reconcile=c.reconcile, pods=c.pods,
        waits=(c.registry_rules.ready, c.policy_watch.policies.synced),
        config_synced=c.configs.synced, leader_gauge=c.metrics.leader, runtime=c.runtime,
        params_writer=c.params_writer, freshness=c.freshness,
        apply_params_ttl=c.publisher.apply_ttl, standby_wait=o.standby_wait)


def _reconciler(c: Controller) -> Reconciler:
    """The pod reconciler: it writes while this process leads or releases the pods still
    gated, and publishes its anonymous results."""
    return Reconciler(
        c.api, c.pods, c.inspectors, c.placement_config, c.events, c.metrics,
        nodes=c.nodes, nrts=c.nrts, inflight=c.inflight,
        failures=c._pod_failures, publish=c.publisher.publish,
        is_leader=c._may_write, policies=c.policy_watch.of,
        providers=c.providers)


def _gated_pods(c: Controller) -> GatedPodEvents:
    """The informers' event handlers (:class:`controller.gatedpods.GatedPodEvents`); a
    config event also applies its log verbosity and params TTL, and wakes the bindings and
    registries loops and the leader's monitors."""
    return GatedPodEvents(
        c.api, c.pods, c.term, c.reconciler, inflight=c.inflight,
        runs_lifecycle=c._runs_lifecycle, config_listeners=(
            c._apply_log_verbosity, c.publisher.apply_ttl, c._config_changed.set,
            c.registry_rules.config_changed, c._wake_leader_parts))


def _leader_parts(c: Controller) -> tuple[FindingsStore, ExecFormatMonitor, PlacedPods,
                                          AdmissionFeed, EscapeMonitor]:
    """The leader's readers of placed pods: the exec-format-error monitor and its evidence
    per (digest, architecture) (spec.plugins.execFormatErrorMonitor), the watch of the pods
    placed by any path that feeds it and the admission feed, and the escape monitor of the
    pods bound with no placement record (while this process owns the admission objects and
    no ordered uninstall is under way; spec.plugins.placementEscapes)."""
    o = c.options
    findings = FindingsStore()
    execformat = ExecFormatMonitor(
        c.api, nodes=c.nodes, events=c.events, metrics=c.metrics,
        config_source=c.config_source, inspector=c.inspector,
        credentials=c.reconciler.credentials, store=findings,
        config_object=c._config_object, on_excluded=c.publisher.on_excluded)
    placed = PlacedPods(c.api, watch_timeout=o.watch_timeout)
    feed = AdmissionFeed(
        store=c.params, inspector=c.inspector, publish=c.publisher.publish,
        publishing=c.publisher.publishing, config_source=c.placement_config,
        events=c.events, metrics=c.metrics, nodes=c.nodes,
        policies=c.policy_watch.of, listing=c._placed_listing,
        adopted=c.params_writer.adopted, on_always=c.fresh.used, reports=c.reports,
        use_reports=c._reports_apply)
    placed.subscribe("admission feed", feed.on_pod)
    placed.subscribe("exec format monitor", execformat.on_pod, enabled=execformat.enabled)
    escapes = EscapeMonitor(
        c.api, nodes=c.nodes, events=c.events, metrics=c.metrics,
        config_source=c.placement_config, config_object=c._config_object,
        credentials=c.reconciler.credentials, inspect_images=c.reconciler.inspect_images,
        own_namespace=o.namespace, watch_timeout=o.watch_timeout,
        active=c._escapes_active)
    # the labelled pods: a label the pod's creator wrote hides nothing (rules.monitor.escape)
    placed.subscribe("escape monitor", escapes.on_pod, enabled=escapes.watching)
    return findings, execformat, placed, feed, escapes


def config_from(obj: Mapping[str, Any] | None) -> PlacementConfig:
    """Parse a PodPlacementConfig dict, defaults on None (helper for tests/bench).

    Raises:
        ConfigError: the object does not parse (tests want to know).
    """
    return PlacementConfig.from_object(obj) if obj else PlacementConfig()
