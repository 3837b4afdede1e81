"""The admission webhook's ASGI app: ``POST /mutate`` plus health, readiness and metrics.

``/mutate`` reads the raw body and decodes only the fields it needs (msgspec into TypedDicts when
msgspec is installed, else orjson on the whole body; no pydantic model on the hot path), checks
the few AdmissionReview fields it relies on, asks :func:`webhook.gating.should_gate` and
answers in the request's ``apiVersion`` (``admission.k8s.io/v1`` or ``v1beta1``) with the
request's ``uid``, ``allowed: true`` and, for a gated pod, a base64 JSONPatch
(:func:`webhook.patch.gate_patch`). It never denies: a body that is not an AdmissionReview gets
HTTP 400 (the API server then applies failurePolicy), an unexpected error while deciding gets
``allowed: true`` without a patch plus a ``warnings`` entry and an error count. A body over
``max_body_bytes`` gets HTTP 413 and one not received within ``body_timeout`` seconds HTTP
408 (:func:`webhook.limits.read_body`, with the other read limits). Other resources,
subresources and operations are allowed unchanged. Dry-run requests (``request.dryRun``)
get the same answers, but cause nothing beyond them (``sideEffects: None``): no registry
request and no cache fill, only cache reads. A gated pod whose images the webhook knows, or
learns within the config's ``inspectionBudget``, is placed in the answer
(:mod:`webhook.admitplace`); while no controller runs, gated pods are placed at admission or
released with the fallback (:mod:`webhook.outage`).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import msgspec
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from podplacement.controller.core.admission import AdmissionPlacement
from podplacement.controller.core.config import DEFAULT_NAMESPACE, METRICS_PREFIX
from podplacement.controller.core.podspec import gate_label_ops
from podplacement.controller.core.policy import policy_for
from podplacement.webhook import limits as _limits
from podplacement.webhook.admitplace import (
    GATED,
    GATED_INSPECTION_FAILED,
    GATED_OVER_BUDGET,
    PLACED_FROM_CACHE,
    PLACED_INSPECTED,
    PLACED_REVALIDATED,
    place_reviewed_pod,
)
from podplacement.webhook.admitplace import PlaceCacheLike as _PlaceCacheBase
from podplacement.webhook.configsource import ConfigSource
from podplacement.webhook.gating import (
    REASON_ALREADY_GATED,
    REASON_GATED,
    SKIP_REASONS,
    should_gate,
)
from podplacement.webhook.limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    BadContentLength,
    BodyDeadlines,
    BodyRefused,
    BodyTimeout,
    BodyTooLarge,
    ConnectionStats,
    read_body,
)
from podplacement.webhook.outage import UNPLACED_REASONS, OutageAnswer, answer_during_outage
from podplacement.webhook.patch import gate_patch, patch_shape
from podplacement.webhook.policysource import PolicySource

if TYPE_CHECKING:
    from podplacement.webhook.admitinspect import AdmissionInspector

log = logging.getLogger(__name__)

ADMISSION_V1 = "admission.k8s.io/v1"
ADMISSION_V1BETA1 = "admission.k8s.io/v1beta1"
ADMISSION_VERSIONS = frozenset({ADMISSION_V1, ADMISSION_V1BETA1})

#: ``outcome`` label values of ``podplacement_webhook_requests_total``.
#: ``admissions_total{path}`` values.
PATH_WEBHOOK_PLACED = "webhook-placed"
PATH_WEBHOOK_INSPECTED = "webhook-inspected"
PATH_WEBHOOK_REVALIDATED = "webhook-revalidated"
PATH_GATED = "gated"
PATH_GATED_OVER_BUDGET = "gated-over-budget"
PATH_GATED_INSPECTION_FAILED = "gated-inspection-failed"
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

INTERNAL_ERROR_WARNING = "podplacement webhook: internal error, pod admitted without gating"

_JSON = "application/json"
_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)


class BadReview(ValueError):
    """The body is not a usable AdmissionReview (answered with HTTP 400)."""


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
      ``released`` (released unplaced while no controller runs) and ``skipped``;
    * ``released_unplaced_total{reason}``: pods released at admission without their images'
      platforms while no controller runs (the controller's fallback requirement: the
      fallback architecture when one applies, the fallback operating systems; never any
      node: :mod:`controller.core.fallback`), by why (:data:`webhook.outage.UNPLACED_REASONS`);
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


# --- selective decoding ----------------------------------------------------------------------
# orjson builds Python objects for the whole 5 KB review (managedFields, volumes, userInfo, ...)
# although /mutate reads a handful of fields: that was ~80% of what /mutate cost over the bare
# endpoint (bench/webhook.py). msgspec decodes into the TypedDicts below: it
# checks the JSON syntax of the parts it skips without building objects for them and returns
# plain dicts holding only the listed keys (~6 us instead of ~16 us for the recorded review),
# so the pure gating code takes them unchanged. Every field webhook.gating and webhook.patch
# read must be listed here (tests/webhook/test_fast_review.py checks it with recording dicts).


# Every TypedDict keeps only the keys the rules read, and the subtrees below the rules' paths
# are typed as narrowly as they are read: msgspec then builds no object for the rest (a
# matchExpression's operator and values, an ownerReference's uid, the other labels, ...).
# Building and freeing those objects cost more than scanning the bytes once /mutate was
# served (bench/webhook.py): allocations on a cache-cold heap. A field of another JSON type
# than declared makes msgspec decline the body, and the orjson path answers it.
class _Gate(TypedDict, total=False):
    name: Any


class _OwnerRef(TypedDict, total=False):
    kind: Any
    controller: Any


# Only our own keys are kept: the gating rule reads them (a pod the admission policy placed),
# and the patch otherwise only asks whether ``metadata.labels``/``annotations`` is an object.
# (Literal keys for mypy: GATE_LABEL and DECISION_ANNOTATION; tests/webhook/test_fast_review.py
# fails when a key the rules read is missing here.)
_Labels = TypedDict("_Labels", {"podplacement.io/scheduling-gate": Any}, total=False)
_Annotations = TypedDict("_Annotations", {"podplacement.io/decision": Any}, total=False)


class _PodMeta(TypedDict, total=False):
    namespace: Any
    labels: _Labels | None
    annotations: _Annotations | None
    ownerReferences: list[_OwnerRef] | None


class _PodSpec(TypedDict, total=False):
    """The spec fields the gating rules read."""

    nodeName: Any
    schedulingGates: list[_Gate] | None


class _Pod(TypedDict, total=False):
    metadata: _PodMeta | None
    spec: _PodSpec | None


class _GroupVersionKind(TypedDict, total=False):
    group: Any
    kind: Any


class _Request(TypedDict, total=False):
    uid: Any
    kind: _GroupVersionKind | None
    operation: Any
    subResource: Any
    namespace: Any
    dryRun: Any
    object: _Pod | None


class _Review(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    request: _Request | None


#: The selective decoder (tests set it to None to compare with the whole-body path).
_REVIEW_DECODER: Any = msgspec.json.Decoder(_Review)
_DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.MsgspecError,)


def _parse_review_fast(body: bytes) -> tuple[str, Mapping[str, Any]] | None:
    """``(apiVersion, request)`` decoded with msgspec into the subset of fields /mutate reads;
    None when msgspec declines the body (then orjson parses it whole).

    Same answer as the orjson path: a body msgspec cannot decode (bad JSON anywhere, or a
    structural field of the wrong type, e.g. ``request.object`` not an object) is declined
    and gets orjson's verdict and message; non-ASCII bodies are declined too, since msgspec
    does not check the UTF-8 of the strings it skips. Duplicate keys: the last wins in both.
    The remaining difference is in what orjson refuses although it is valid JSON text: a
    number out of double range (``1e999``) in a field /mutate does not read is skipped here
    instead of answered with 400, and an integer beyond 64 bits in a field it reads stays an
    int (orjson makes it a float).

    Raises:
        BadReview: decoded, but a required field is missing or mistyped.
    """
    if _REVIEW_DECODER is None or not body.isascii():
        return None
    try:
        review = _REVIEW_DECODER.decode(body)
    except _DECODE_ERRORS:
        return None
    return _checked_review(review)


def _parse_review(body: bytes) -> tuple[str, Mapping[str, Any]]:
    """Return ``(apiVersion, request)`` of an AdmissionReview or raise :class:`BadReview`.

    Takes the selective decoder (:func:`_parse_review_fast`) when it can, else parses the
    whole body with orjson; both give the same answer (see :func:`_parse_review_fast`).
    """
    fast = _parse_review_fast(body)
    if fast is not None:
        return fast
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
    return _checked_review(review)


def _checked_review(review: Any) -> tuple[str, Mapping[str, Any]]:
    """Check the AdmissionReview fields /mutate relies on; ``(apiVersion, request)`` or
    :class:`BadReview` with the message the client gets."""
    if not isinstance(review, dict):
        raise BadReview("body is not a JSON object")
    api_version = review.get("apiVersion")
    if not isinstance(api_version, str) or api_version not in ADMISSION_VERSIONS:
        raise BadReview(f"unsupported apiVersion {api_version!r} (want {ADMISSION_V1})")
    if review.get("kind") != "AdmissionReview":
        raise BadReview(f"kind must be AdmissionReview, got {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or not a string")
    kind = request.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise BadReview("request.kind is missing or not a GroupVersionKind")
    if not isinstance(request.get("operation"), str):
        raise BadReview("request.operation is missing or not a string")
    return api_version, request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request["kind"]
    return (
        request["operation"] == "CREATE"
        and kind.get("kind") == "Pod"
        and kind.get("group", "") == ""
        and not request.get("subResource")
    )


def _pod_and_namespace(request: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise BadReview("request.object is missing or not an object for a pod CREATE")
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        metadata = pod.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    if not isinstance(namespace, str) or not namespace:
        raise BadReview("request.namespace is missing for a pod CREATE")
    return pod, namespace


_PATCH_TAILS: dict[tuple[bool, bool], bytes] = {}


def _patch_tail(pod: Mapping[str, Any]) -> bytes:
    """``,"patchType":"JSONPatch","patch":"<base64 JSONPatch>"``: the response members that
    gate ``pod``.

    :func:`webhook.patch.gate_patch` depends only on whether ``spec.schedulingGates`` is a
    list and ``metadata.labels`` a map (:func:`webhook.patch.patch_shape`), so there are four
    distinct patches: each is built and encoded once, then looked up by that shape.
    """
    key = patch_shape(pod)
    tail = _PATCH_TAILS.get(key)
    if tail is None:
        patch = base64.b64encode(orjson.dumps(gate_patch(pod))).decode()
        members = orjson.dumps({"patchType": "JSONPatch", "patch": patch})
        tail = _PATCH_TAILS[key] = b"," + members[1:-1]
    return tail


def _label_tail(pod: Mapping[str, Any]) -> bytes:
    """The response members that set our gate label to ``gated`` on a pod created with our
    gate (:func:`controller.core.podspec.gate_label_ops`), or nothing when it says so
    already."""
    ops = gate_label_ops(pod)
    if not ops:
        return b""
    members = orjson.dumps({"patchType": "JSONPatch",
                            "patch": base64.b64encode(orjson.dumps(ops)).decode()})
    return b"," + members[1:-1]


_ANSWER_HEADS = {
    version: b'{"apiVersion":' + orjson.dumps(version) + b',"kind":"AdmissionReview",'
    b'"response":{"uid":'
    for version in ADMISSION_VERSIONS
}


def _allowed(api_version: str, uid: str, tail: bytes = b"") -> Response:
    """The answer ``{"apiVersion", "kind": "AdmissionReview", "response": {"uid", "allowed":
    true, <tail>}}``, spliced from constant parts: the same bytes as ``orjson.dumps`` of that
    dict (tests/webhook/test_app.py checks it) without building it per request.
    ``api_version`` must be one of :data:`ADMISSION_VERSIONS`."""
    body = _ANSWER_HEADS[api_version] + orjson.dumps(uid) + b',"allowed":true' + tail + b"}}"
    return Response(body, media_type=_JSON)


def _outage_response(api_version: str, uid: str, answer: OutageAnswer,
                     m: WebhookMetrics) -> Response:
    """The answer while no controller runs (:func:`webhook.outage.answer_during_outage`),
    counted: placed, or released unplaced and why."""
    if answer.unplaced is None:
        m.placed_in_outage.inc()
        m.webhook_placed.inc()
    else:
        m.released.inc()
        m.path_released.inc()
        m.released_unplaced[answer.unplaced].inc()
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if answer.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(answer.patch))).decode()
    if answer.warnings:
        response["warnings"] = list(answer.warnings)
    return _review_response(api_version, response)


class PlaceCacheLike(_PlaceCacheBase, Protocol):
    """What :func:`create_app` needs of :class:`webhook.placecache.PlaceCache`."""

    async def aclose(self) -> None: ...


def _placed(api_version: str, uid: str, placement: AdmissionPlacement) -> Response:
    response: dict[str, Any] = {
        "uid": uid, "allowed": True, "patchType": "JSONPatch",
        "patch": base64.b64encode(orjson.dumps(list(placement.patch))).decode(),
    }
    if placement.warnings:
        response["warnings"] = list(placement.warnings)
    return _review_response(api_version, response)


class ControllerLeaseLike(Protocol):
    """What :func:`create_app` needs of :class:`webhook.leasewatch.ControllerLease`."""

    def available(self) -> bool: ...
    def seconds_since_renewal(self) -> float: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def _review_response(api_version: str, response: dict[str, Any]) -> Response:
    body = {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
    return Response(orjson.dumps(body), media_type=_JSON)


def _bad_request(message: str) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=400, media_type=_JSON)


def _refused(exc: BodyRefused) -> Response:
    """The 413/408 answer; ``Connection: close``, since the rest of the body is not read."""
    return Response(orjson.dumps({"error": str(exc)}), status_code=exc.status,
                    media_type=_JSON, headers={"connection": "close"})


def create_app(
    config_source: ConfigSource,
    *,
    own_namespace: str = DEFAULT_NAMESPACE,
    certs_ready: Callable[[], bool] = lambda: True,
    metrics: WebhookMetrics | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    controller_lease: ControllerLeaseLike | None = None,
    place_cache: PlaceCacheLike | None = None,
    admission_inspector: AdmissionInspector | None = None,
    policies: PolicySource | None = None,
) -> FastAPI:
    """Build the webhook app.

    Args:
        config_source: gives the cached PodPlacementConfig; started and stopped with the app's
            lifespan.
        own_namespace: the controller's namespace (its pods are never gated).
        certs_ready: tells ``/readyz`` whether the serving certificate is loaded.
        metrics: the metrics holder (a fresh one with its own registry by default); the app
            exposes it as ``app.state.metrics``.
        max_body_bytes: bodies over this many bytes get HTTP 413 (:func:`read_body`).
        body_timeout: seconds to receive a body whole, else HTTP 408 (:func:`read_body`).
        controller_lease: tells whether a controller runs
            (:class:`webhook.leasewatch.ControllerLease`; started and stopped with the app).
            While it says no, pods are not held: a pod the admission policy gated, or one
            the webhook would gate, is placed at admission by the webhook itself or
            released with the controller's fallback (:mod:`webhook.outage`; outcome
            ``placed`` or ``released``, reason ``controller_unavailable``). None: always
            hold (no escape).
        place_cache: the per-credential inspection cache of the fast path
            (:class:`webhook.placecache.PlaceCache`; closed with the app). A pod the webhook
            would gate, or that the admission policy gated, whose images the cache knows for
            the pod's credentials is placed in the answer (the controller's decision,
            :func:`controller.core.admission.admission_placement`: final affinity, labels,
            annotation with ``"path":"webhook"``, gate removed, ``warnings`` for pins the
            images cannot run on), counted as ``admissions_total{path="webhook-placed"}``.
            On a miss, and for images pulled with ``Always``, the images are inspected
            (revalidated: one ``HEAD``) with ``admission_inspector`` within the config's
            ``inspectionBudget`` (:mod:`webhook.admitplace`; ``webhook-inspected``,
            ``webhook-revalidated``); past it the pod stays gated
            (``gated-over-budget``). Without an inspector or with a budget of 0, a miss
            schedules a background fill; a ``dryRun`` review only reads the cache. None:
            no fast path.
        admission_inspector: inspects a pod's images at admission within a budget
            (:class:`webhook.admitinspect.AdmissionInspector`, storing into
            ``place_cache``; closed with the app): the config's ``inspectionBudget`` while
            a controller runs, the inspector's own ``budget`` while none does; None: pods
            are placed from the cache only, and released with the fallback while no
            controller runs.
        policies: the namespaces' PodPlacementPolicies
            (:class:`webhook.policysource.WatchingPolicySource`; started and stopped with the
            app), applied on every path that places at admission; None: the cluster's
            config alone.

    Raises:
        ValueError: ``max_body_bytes`` < 1 or ``body_timeout`` <= 0.

    Routes: ``POST /mutate``, ``GET /healthz``, ``GET /readyz`` (503 until the config was read
    once and certificates are loaded), ``GET /metrics`` (Prometheus text format).
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if not body_timeout > 0:
        raise ValueError(f"body_timeout must be > 0 seconds, got {body_timeout}")
    m = metrics or WebhookMetrics()
    deadlines = BodyDeadlines()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await config_source.start()
        if policies is not None:
            await policies.start()
        if controller_lease is not None:
            await controller_lease.start()
        try:
            yield
        finally:
            if controller_lease is not None:
                await controller_lease.stop()
            if admission_inspector is not None:
                await admission_inspector.aclose()
            if place_cache is not None:
                await place_cache.aclose()
            await config_source.stop()
            if policies is not None:
                await policies.stop()

    app = FastAPI(title="podplacement webhook", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.metrics = m
    app.state.config_source = config_source

    observe_latency = m.observe_latency

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        started = perf_counter()
        try:
            try:
                body = await read_body(request, max_bytes=max_body_bytes,
                                       time_limit=body_timeout, deadlines=deadlines)
                # Read once: the parse and the rules see the same config (no await between).
                config = config_source.current
                api_version, review_request = _parse_review(body)
            except (BadReview, BadContentLength) as exc:
                m.bad_request.inc()
                return _bad_request(str(exc))
            except BodyTooLarge as exc:
                m.body_too_large.inc()
                return _refused(exc)
            except BodyTimeout as exc:
                m.body_timeout.inc()
                return _refused(exc)
            except Exception as exc:  # e.g. the client went away mid-body
                m.bad_request.inc()
                return _bad_request(f"could not read the request: {type(exc).__name__}")
            uid = review_request["uid"]
            try:
                if not _is_pod_create(review_request):
                    m.ignored.inc()
                    return _allowed(api_version, uid)
                pod, namespace = _pod_and_namespace(review_request)
                decision = should_gate(pod, namespace=namespace, config=config,
                                       own_namespace=own_namespace)
                dry_run = review_request.get("dryRun") is True
                if (controller_lease is not None and config is not None
                        and (decision.gate or decision.reason == REASON_ALREADY_GATED)
                        and not controller_lease.available()):
                    budget = (admission_inspector.budget if admission_inspector else 0.0)
                    whole = orjson.loads(body)["request"]["object"]
                    answer = await answer_during_outage(
                        whole, namespace, config,
                        inspector=admission_inspector,
                        budget=budget - (perf_counter() - started), dry_run=dry_run,
                        silent_for=controller_lease.seconds_since_renewal(),
                        policy=(policy_for(whole, policies.of(namespace))
                                if policies is not None else None))
                    return _outage_response(api_version, uid, answer, m)
                # --- fast path: place from the cache, or inspected within the budget ---
                kind = GATED
                if place_cache is not None and (decision.gate
                                                or decision.reason == REASON_ALREADY_GATED):
                    budget = (config.admission_inspection_budget if config is not None
                              else 0.0) - (perf_counter() - started)
                    placed = await place_reviewed_pod(
                        body, namespace, config, cache=place_cache,
                        inspector=admission_inspector, budget=budget, dry_run=dry_run,
                        policies=policies,
                        on_error=m.errors.inc)
                    if placed.placement is not None:
                        m.placed_at_admission(placed.kind)
                        return _placed(api_version, uid, placed.placement)
                    kind = placed.kind
                # --- end of the fast path ---
                m.decided(decision.reason, kind)
                if decision.reason == REASON_ALREADY_GATED:
                    return _allowed(api_version, uid, _label_tail(pod))
                if not decision.gate:
                    return _allowed(api_version, uid)
                m.gated.inc()
                return _allowed(api_version, uid, _patch_tail(pod))
            except BadReview as exc:
                m.bad_request.inc()
                return _bad_request(str(exc))
            except Exception:
                log.exception("admission failed; allowing the pod unchanged",
                              extra={"uid": uid})
                m.errors.inc()
                m.failed_requests.inc()
                return _review_response(
                    api_version,
                    {"uid": uid, "allowed": True, "warnings": [INTERNAL_ERROR_WARNING]},
                )
        finally:
            observe_latency(perf_counter() - started)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b"ok", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        missing = []
        if not config_source.synced:
            missing.append("config not read yet")
        if not certs_ready():
            missing.append("certificates not loaded")
        if missing:
            return Response("; ".join(missing).encode(), status_code=503,
                            media_type="text/plain")
        return Response(b"ok", media_type="text/plain")

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    return app
