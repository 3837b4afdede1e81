"""The webhook's Prometheus metrics (``podplacement_webhook_*``) and their label values.

One :class:`WebhookMetrics` per app, in its own registry (several apps per process in tests);
the stages of :mod:`webhook.pipeline` count into it, ``/metrics`` exposes it. The label values
are listed in docs/reference/labels-events-metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from podplacement.rules.config import METRICS_PREFIX
from podplacement.webhook import limits as _limits
from podplacement.webhook.admitplace import (
    GATED,
    GATED_INSPECTION_FAILED,
    GATED_NEEDS_CREDENTIALS,
    GATED_OVER_BUDGET,
    PLACED_FROM_CACHE,
    PLACED_INSPECTED,
    PLACED_REVALIDATED,
)
from podplacement.webhook.gating import REASON_ALREADY_GATED, REASON_GATED, SKIP_REASONS
from podplacement.webhook.limits import ConnectionStats
from podplacement.webhook.outage import UNPLACED_REASONS

#: ``outcome`` label values of ``podplacement_webhook_requests_total``.
#: ``admissions_total{path}`` values.
PATH_WEBHOOK_PLACED = "webhook-placed"
PATH_WEBHOOK_INSPECTED = "webhook-inspected"
PATH_WEBHOOK_REVALIDATED = "webhook-revalidated"
PATH_GATED = "gated"
PATH_GATED_OVER_BUDGET = "gated-over-budget"
PATH_GATED_INSPECTION_FAILED = "gated-inspection-failed"
PATH_GATED_NEEDS_CREDENTIALS = "gated-needs-credentials"
PATH_RELEASED = "released"
PATH_SKIPPED = "skipped"

OUTCOME_GATED = "gated"
#: A pod the webhook placed (from its cache, or inspected at admission while no controller
#: runs): ungated, final affinity.
OUTCOME_PLACED = "placed"
OUTCOME_SKIPPED = "skipped"
OUTCOME_IGNORED = "ignored"
OUTCOME_BAD_REQUEST = "bad_request"
OUTCOME_ERROR = "error"
#: A pod released at admission without its images' platforms because no controller runs
#: (the controller's fallback applied; :mod:`webhook.outage`).
OUTCOME_RELEASED = "released"
#: Reason of ``placed`` and ``released`` while no controller runs.
REASON_CONTROLLER_UNAVAILABLE = "controller_unavailable"
#: Reasons of ``placed`` outside an outage (empty: from the cache): an image inspected at
#: admission, or the digests of the images pulled with ``Always`` confirmed.
REASON_INSPECTED = "inspected"
REASON_REVALIDATED = "revalidated"

#: ``reason`` for requests that are not a pod CREATE.
REASON_NOT_POD_CREATE = "not_pod_create"
#: ``reason`` of ``bad_request``: a body over the limit (HTTP 413).
REASON_BODY_TOO_LARGE = _limits.REASON_BODY_TOO_LARGE
#: ``reason`` of ``bad_request``: a body not received in time (HTTP 408).
REASON_BODY_TIMEOUT = _limits.REASON_BODY_TIMEOUT

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)


class WebhookMetrics:
    """Prometheus metrics of one app (prometheus_client), in their own registry (several apps
    per process in tests). Names start with ``podplacement_webhook_``:

    * ``requests_total{outcome, reason}``: AdmissionReview requests by outcome and skip reason;
    * ``admissions_total{path}``: pod creations by the path they took:
      ``webhook-placed`` (from the webhook's cache, or while no controller runs),
      ``webhook-inspected`` (an image inspected at admission within the config's
      ``inspectionBudget``), ``webhook-revalidated`` (images pulled with ``Always`` kept
      their digest: one ``HEAD`` each), ``gated`` (by the policy or the webhook; the
      controller places them), ``gated-over-budget`` and ``gated-inspection-failed`` (the
      same, after an inspection at admission that did not finish in time or failed),
      ``gated-needs-credentials`` (the pod names pull Secrets and the registry refused an
      image of it to the webhook's anonymous inspection; also while no controller runs),
      ``released`` (released unplaced while no controller runs) and ``skipped``;
    * ``released_unplaced_total{reason}``: pods released at admission without their images'
      platforms while no controller runs (the controller's fallback requirement: the
      fallback architecture when one applies, the fallback operating systems; never any
      node: :mod:`rules.place.fallback`), by why (:data:`webhook.outage.UNPLACED_REASONS`);
    * ``gated_pods_total``: pods the webhook gated;
    * ``errors_total``: internal errors (pod admitted unchanged);
    * ``request_duration_seconds``: histogram of the time spent handling ``/mutate``;
    * ``connections_refused_total``, ``header_timeouts_total``: connections aborted by the
      server's cap on open connections and header timeout (:mod:`webhook.limits`; the server
      counts into :attr:`connection_stats`, read at scrape time).

    The labelled children used per request are resolved once here, so the handler pays one
    ``inc()`` (prometheus_client's lock included) per count.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        p = f"{METRICS_PREFIX}webhook_"
        self._requests = Counter(f"{p}requests", "AdmissionReview requests by outcome and "
                                 "skip reason.", ("outcome", "reason"), registry=self.registry)
        self._by_reason = {r: self._requests.labels(OUTCOME_SKIPPED, r) for r in SKIP_REASONS}
        self._by_reason[REASON_GATED] = self._requests.labels(OUTCOME_GATED, REASON_GATED)
        self.ignored = self._requests.labels(OUTCOME_IGNORED, REASON_NOT_POD_CREATE)
        self.bad_request = self._requests.labels(OUTCOME_BAD_REQUEST, "")
        self.body_too_large = self._requests.labels(OUTCOME_BAD_REQUEST, REASON_BODY_TOO_LARGE)
        self.body_timeout = self._requests.labels(OUTCOME_BAD_REQUEST, REASON_BODY_TIMEOUT)
        #: ``requests_total{outcome="error"}``, counted with ``errors_total`` (internal errors)
        self.failed_requests = self._requests.labels(OUTCOME_ERROR, "")
        self.released = self._requests.labels(OUTCOME_RELEASED, REASON_CONTROLLER_UNAVAILABLE)
        self.placed = self._requests.labels(OUTCOME_PLACED, "")
        self.placed_inspected = self._requests.labels(OUTCOME_PLACED, REASON_INSPECTED)
        self.placed_revalidated = self._requests.labels(OUTCOME_PLACED, REASON_REVALIDATED)
        self.placed_in_outage = self._requests.labels(OUTCOME_PLACED,
                                                      REASON_CONTROLLER_UNAVAILABLE)
        unplaced = Counter(f"{p}released_unplaced", "Pods released at admission without "
                           "their images' platforms while no controller runs.", ("reason",),
                           registry=self.registry)
        self.released_unplaced = {r: unplaced.labels(r) for r in UNPLACED_REASONS}
        admissions = Counter(f"{p}admissions", "Pod creations by the path they took.",
                             ("path",), registry=self.registry)
        self.webhook_placed = admissions.labels(PATH_WEBHOOK_PLACED)
        self.path_gated = admissions.labels(PATH_GATED)
        self.path_skipped = admissions.labels(PATH_SKIPPED)
        self.path_released = admissions.labels(PATH_RELEASED)
        #: :data:`webhook.admitplace.KINDS` → (requests_total child, admissions_total child)
        #: for the placed kinds; admissions_total child for the gated ones.
        self.placed_by_kind = {
            PLACED_FROM_CACHE: (self.placed, self.webhook_placed),
            PLACED_INSPECTED: (self.placed_inspected,
                               admissions.labels(PATH_WEBHOOK_INSPECTED)),
            PLACED_REVALIDATED: (self.placed_revalidated,
                                 admissions.labels(PATH_WEBHOOK_REVALIDATED)),
        }
        self.gated_by_kind = {
            GATED: self.path_gated,
            GATED_OVER_BUDGET: admissions.labels(PATH_GATED_OVER_BUDGET),
            GATED_INSPECTION_FAILED: admissions.labels(PATH_GATED_INSPECTION_FAILED),
            GATED_NEEDS_CREDENTIALS: admissions.labels(PATH_GATED_NEEDS_CREDENTIALS),
        }
        self._path_by_reason = {REASON_GATED: self.path_gated,
                                REASON_ALREADY_GATED: self.path_gated}
        self.gated = Counter(f"{p}gated_pods", "Pods the webhook gated.",
                             registry=self.registry)
        self.errors = Counter(f"{p}errors", "Internal errors (pod admitted unchanged).",
                              registry=self.registry)
        self.latency = Histogram(f"{p}request_duration_seconds",
                                 "Time spent handling /mutate, in seconds.",
                                 buckets=_LATENCY_BUCKETS, registry=self.registry)
        #: Filled by the server's protocol (pass it as ``ConnectionLimits(stats=...)``).
        self.connection_stats = ConnectionStats()
        self.registry.register(_ConnectionCollector(p, self.connection_stats))

    def decided(self, reason: str, kind: str = GATED) -> None:
        """Count one pod decision (``gated`` or a skip reason), and its admission path;
        a gated pod's path by ``kind`` (:data:`webhook.admitplace.KINDS`: why the webhook
        did not place it)."""
        child = self._by_reason.get(reason)
        if child is None:
            child = self._by_reason[reason] = self._requests.labels(OUTCOME_SKIPPED, reason)
        child.inc()
        path = self._path_by_reason.get(reason, self.path_skipped)
        if path is self.path_gated:
            path = self.gated_by_kind.get(kind, path)
        path.inc()

    def placed_at_admission(self, kind: str) -> None:
        """Count one pod the webhook placed outside an outage, by ``kind``."""
        request, path = self.placed_by_kind[kind]
        request.inc()
        path.inc()

    def observe_latency(self, seconds: float) -> None:
        """Record one /mutate duration in seconds."""
        self.latency.observe(seconds)


class _ConnectionCollector:
    """The server's connection counters (:class:`webhook.limits.ConnectionStats`), read at
    scrape time: the protocol counts them as plain ints on the event loop."""

    def __init__(self, prefix: str, stats: ConnectionStats) -> None:
        self._prefix = prefix
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        """Two counter families (prometheus_client custom collector)."""
        yield CounterMetricFamily(
            f"{self._prefix}connections_refused",
            "Connections aborted: the open-connection cap was reached.",
            value=self._stats.refused)
        yield CounterMetricFamily(
            f"{self._prefix}header_timeouts",
            "Connections aborted: request headers not received in time.",
            value=self._stats.header_timeouts)

