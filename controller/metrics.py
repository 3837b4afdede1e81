"""Prometheus metrics of the controller and the small HTTP server for ``/metrics``,
``/healthz`` and ``/readyz`` (prefix ``podplacement_``; docs/reference/labels-events-metrics.md
"Metrics"). The server is the webhook's stack, a Starlette app on uvicorn, in the controller's
event loop (prometheus_client's own ``start_http_server`` answers every path with the metrics
from a thread, so it could not serve ``/readyz``). uvicorn's main loop wakes every 0.1 s even
when idle: about 2 ms of CPU a second, measured on the 2-core development machine.

Each :class:`Metrics` has its own ``CollectorRegistry`` so several controllers can run in one
process (tests). Counters kept elsewhere (API requests in :class:`~kubeclient.KubeAPI`,
image cache hits in the inspector) are read at scrape time by a custom collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from podplacement.rules.config import METRICS_PREFIX

log = logging.getLogger(__name__)

P = METRICS_PREFIX
_UNGATE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
_INSPECT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _Sources(Collector):
    def __init__(self) -> None:
        self.api_counters: Callable[[], dict[tuple[str, int], int]] | None = None
        self.inspector_stats: Callable[[], Any] | None = None
        self.gated: Callable[[], int] | None = None
        self.queue_depth: Callable[[], int] | None = None
        self.oldest_gated: Callable[[], float] | None = None
        self.catalog: Callable[[], tuple[int, int]] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.api_counters is not None:
            fam = CounterMetricFamily(
                P + "api_requests", "Kubernetes API requests by verb and HTTP code "
                "(code 0: transport error)", labels=["verb", "code"]
            )
            for (verb, code), n in sorted(self.api_counters().items()):
                fam.add_metric([verb, str(code)], n)
            yield fam
        if self.inspector_stats is not None:
            stats = self.inspector_stats()
            hits = CounterMetricFamily(P + "image_cache_hits", "Image inspections from the cache")
            hits.add_metric([], float(getattr(stats, "cache_hits", 0)))
            yield hits
            misses = CounterMetricFamily(
                P + "image_cache_misses", "Image inspections that fetched from a registry"
            )
            misses.add_metric([], float(getattr(stats, "cache_misses", 0)))
            yield misses
            reqs = CounterMetricFamily(P + "registry_requests", "HTTP requests sent to registries")
            reqs.add_metric([], float(getattr(stats, "requests", 0)))
            yield reqs
        if self.gated is not None:
            g = GaugeMetricFamily(P + "gated_pods", "Pods carrying the podplacement gate (watch)")
            g.add_metric([], float(self.gated()))
            yield g
        if self.queue_depth is not None:
            q = GaugeMetricFamily(P + "queue_depth", "Pods queued, delayed or being processed")
            q.add_metric([], float(self.queue_depth()))
            yield q
        if self.oldest_gated is not None:
            o = GaugeMetricFamily(P + "oldest_gated_pod_seconds", "Age in seconds of the "
                                  "oldest pod carrying the podplacement gate (0: none)")
            o.add_metric([], self.oldest_gated())
            yield o
        if self.catalog is not None:
            size, evictions = self.catalog()
            b = GaugeMetricFamily(P + "params_bytes", "Bytes of the catalog (spec.repositories, "
                                  "spec.platformSets, spec.learnedAt) of the admission "
                                  "policy's params object, as compact JSON "
                                  "(the catalog held now; the bound is 1,000,000)")
            b.add_metric([], float(size))
            yield b
            e = CounterMetricFamily(P + "params_evictions", "Catalog entries dropped, least "
                                    "recently used first, to keep the params object within "
                                    "its bounds")
            e.add_metric([], float(evictions))
            yield e


@dataclass(frozen=True, slots=True)
class ParamsMetrics:
    """The params writer's metrics: ``entries`` (Gauge) and ``writes`` (Counter by
    ``result``)."""

    entries: Gauge
    writes: Counter


class Metrics:
    """The controller's metrics.

    Attributes:
        processed: ``podplacement_pods_processed_total{outcome}`` (set, not-set, fallback,
            no-supported-platform, wait-numa, retry).
        ungate_seconds: ``podplacement_ungate_seconds``: creationTimestamp → ungate (s).
        inspect_seconds: ``podplacement_image_inspection_seconds``: one image lookup (s).
        inspect_errors: ``podplacement_image_inspection_errors_total``.
        conflicts: ``podplacement_patch_conflicts_total`` (409/422 on the guarded patch).
        events: ``podplacement_events_total{type}`` queued for sending.
        leader: ``podplacement_leader`` 1 while this replica leads.
        exec_format_errors: ``podplacement_exec_format_errors_total{arch}``: containers
            seen failing with an exec format error, by the node's architecture (one per pod,
            container and restart).
        image_verifications: ``podplacement_image_verifications_total{status}``: platform
            checks of ``inspect --verify`` run after an exec format error or a suspicion of
            one, by status.
        exec_format_exclusions: ``podplacement_exec_format_exclusions``: (digest, platform)
            pairs placement leaves out now, learned from exec format errors.
        exec_format_pods_deleted: ``podplacement_exec_format_pods_deleted_total{owner_kind}``:
            failing pods deleted by ``deleteFailedPods``, by their owner's kind.
        escaped_pods: ``podplacement_escaped_pods_total{outcome}``: pods found bound to a
            node with no placement record, by outcome: ``repaired`` (deleted so that their
            owner recreates them), ``unfit`` (their node can't run their images; left),
            ``fit``, ``unknown`` (:mod:`rules.monitor.escape`).
        admission_feed: ``podplacement_admission_feed_inspections_total{result}``: images of
            pods placed at admission that the controller inspected anonymously to publish
            them in the params object (``ok``: inspected, then published unless the
            params' rules keep it out; ``reported``: taken from the webhook's inspection
            report, no registry request; ``failed``; ``dropped``: too many waiting, the next
            pod of the image queues it again).
        placed_at_admission: ``podplacement_placed_at_admission_total{path}``: pods the
            leader saw placed at admission, by the decision's path (``admission``: the
            admission policy in the API server; ``webhook``), counted once as they are
            placed (a relist's older pods are not counted again).
        policy_placed_pods: ``podplacement_policy_placed_pods{namespace,policy}``: the pods
            that exist and were placed under each PodPlacementPolicy (its
            ``status.placedPods``).
        credential_provider_runs: ``podplacement_credential_provider_runs_total{provider,
            result}``: kubelet credential provider plugin runs (``ok``, ``error``).
        credential_provider_config_error: ``podplacement_credential_provider_config_error``
            1 while the configured provider config is unusable.
        params: the admission policy's params object:
            ``podplacement_params_entries`` (entries last written to ImagePlatformCatalog
            ``cluster``) and ``podplacement_params_writes_total{result}`` (created,
            updated, conflict, error); the :class:`controller.paramswriter.ParamsMetrics`
            shape.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.processed = Counter(
            P + "pods_processed", "Gated pods processed, by outcome", ["outcome"], registry=r
        )
        self.ungate_seconds = Histogram(
            P + "ungate_seconds", "Seconds from pod creationTimestamp to the ungating patch",
            buckets=_UNGATE_BUCKETS, registry=r,
        )
        self.inspect_seconds = Histogram(
            P + "image_inspection_seconds", "Seconds per image inspection (cache hits included)",
            buckets=_INSPECT_BUCKETS, registry=r,
        )
        self.inspect_errors = Counter(
            P + "image_inspection_errors", "Failed image inspections", registry=r
        )
        self.conflicts = Counter(
            P + "patch_conflicts", "Guarded pod patches rejected as stale (409/422)", registry=r
        )
        self.events = Counter(P + "events", "Events queued, by type", ["type"], registry=r)
        self.leader = Gauge(P + "leader", "1 while this replica is the leader", registry=r)
        self.exec_format_errors = Counter(
            P + "exec_format_errors", "Containers seen failing with an exec format error, by "
            "the node's architecture", ["arch"], registry=r)
        self.image_verifications = Counter(
            P + "image_verifications", "Image platforms verified after an exec format error "
            "or a suspicion of one, by status", ["status"], registry=r)
        self.exec_format_exclusions = Gauge(
            P + "exec_format_exclusions", "Image digest and platform pairs placement leaves "
            "out, learned from exec format errors", registry=r)
        self.exec_format_pods_deleted = Counter(
            P + "exec_format_pods_deleted", "Failing pods deleted by deleteFailedPods so that "
            "their owner recreates them, by the owner's kind", ["owner_kind"], registry=r)
        self.escaped_pods = Counter(
            P + "escaped_pods", "Pods found bound to a node with no placement record, by "
            "outcome (repaired, unfit, fit, unknown)", ["outcome"], registry=r)
        self.params = ParamsMetrics(
            Gauge(P + "params_entries", "Entries of the admission policy's params object "
                  "(ImagePlatformCatalog cluster), as last written", registry=r),
            Counter(P + "params_writes", "Writes of the admission policy's params object, "
                    "by result", ["result"], registry=r),
        )
        self.admission_feed = Counter(
            P + "admission_feed_inspections", "Images of pods placed at admission inspected "
            "anonymously by the controller for the params object, by result", ["result"],
            registry=r)
        self.policy_placed_pods = Gauge(
            P + "policy_placed_pods", "Pods that exist and were placed under a "
            "PodPlacementPolicy (label podplacement.io/policy), by namespace and policy",
            ["namespace", "policy"], registry=r)
        self.placed_at_admission = Counter(
            P + "placed_at_admission", "Pods seen placed at admission, by the decision's path "
            "(admission: the admission policy; webhook)", ["path"], registry=r)
        self.credential_provider_runs = Counter(
            P + "credential_provider_runs", "Runs of kubelet credential provider plugins, by "
            "provider and result (ok, error)", ["provider", "result"], registry=r)
        self.credential_provider_config_error = Gauge(
            P + "credential_provider_config_error", "1 while the credential provider config "
            "given with --image-credential-provider-config is unusable (no provider runs)",
            registry=r)
        self.sources = _Sources()
        r.register(self.sources)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


#: The text exposition format's Content-Type (Prometheus text format 0.0.4).
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal capture (it would re-raise a captured SIGTERM
    after shutdown): the controller's CLI handles the signals and stops the server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HealthServer:
    """HTTP server for ``/metrics`` (text format), ``/healthz`` (200 ``ok``: the process
    answers and ``unhealthy()`` is empty; 500 ``unhealthy: <name>: <why>; ...`` otherwise, the
    controller's runnables whose task died: :meth:`controller.runnables.Manager.unhealthy`)
    and ``/readyz`` (200 ``ok`` while ``ready()`` is true, the informers synced; 503
    ``not ready`` otherwise): a Starlette app on uvicorn, as the webhook's, running in the
    caller's event loop. Binds ``host:port`` (port 0 picks a free one); plain HTTP.
    """

    def __init__(
        self, metrics: Metrics, *, host: str = "127.0.0.1", port: int = 8080,
        ready: Callable[[], bool] = lambda: True,
        unhealthy: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._ready = ready
        self._unhealthy = unhealthy
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None

    async def _metrics(self, _: Request) -> Response:
        return Response(self.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def _healthz(self, _: Request) -> Response:
        failing = self._unhealthy()
        if not failing:
            return PlainTextResponse("ok")
        text = "; ".join(f"{name}: {why}" for name, why in sorted(failing.items()))
        return PlainTextResponse(f"unhealthy: {text}", status_code=500)

    async def _readyz(self, _: Request) -> Response:
        if self._ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("not ready", status_code=503)

    async def start(self, start_within: float = 10.0) -> None:
        """Start listening; ``port`` is updated to the bound port.

        Raises:
            OSError: ``host:port`` cannot be bound (in use, no such address).
            RuntimeError: the server did not start within ``start_within`` seconds.
        """
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        app = Starlette(routes=[
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/healthz", self._healthz, methods=["GET"]),
            Route("/readyz", self._readyz, methods=["GET"]),
        ])
        config = uvicorn.Config(
            app, lifespan="off", ws="none", log_config=None, log_level="warning",
            access_log=False, server_header=False, timeout_graceful_shutdown=2,
        )
        self._server = server = _Server(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="metrics server")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + start_within
        while not server.started:
            if self._task.done() or loop.time() > deadline:
                await self.stop()
                raise RuntimeError(f"metrics server on {self.host}:{self.port} did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop the server (idempotent): open connections get up to 2 s to finish."""
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 15)
            self._task = None
        self._server = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
