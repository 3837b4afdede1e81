"""The admission webhook's ASGI app: ``POST /mutate`` plus health, readiness and metrics.

``/mutate`` reads the raw body and decodes only the fields it needs (msgspec into TypedDicts when
msgspec is installed, else orjson on the whole body; no pydantic model on the hot path), checks
the few AdmissionReview fields it relies on, asks :func:`webhook.gating.should_gate` and
answers in the request's ``apiVersion`` (``admission.k8s.io/v1`` or ``v1beta1``) with the
request's ``uid``, ``allowed: true`` and, for a gated pod, a base64 JSONPatch
(:func:`webhook.patch.gate_patch`). It never denies: a body that is not an AdmissionReview gets
HTTP 400 (the API server then applies failurePolicy), an unexpected error while deciding gets
``allowed: true`` without a patch plus a ``warnings`` entry and an error count. Other resources,
subresources and operations are allowed unchanged. Dry-run requests get the same patch (the
webhook has no side effects: ``sideEffects: None``).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypedDict

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from controller.config import DEFAULT_NAMESPACE, METRICS_PREFIX
from webhook.configsource import ConfigSource
from webhook.gating import REASON_GATED, SKIP_REASONS, should_gate
from webhook.patch import gate_patch, patch_shape

log = logging.getLogger(__name__)

ADMISSION_V1 = "admission.k8s.io/v1"
ADMISSION_V1BETA1 = "admission.k8s.io/v1beta1"
ADMISSION_VERSIONS = frozenset({ADMISSION_V1, ADMISSION_V1BETA1})

#: ``outcome`` label values of ``podplacement_webhook_requests_total``.
OUTCOME_GATED = "gated"
OUTCOME_SKIPPED = "skipped"
OUTCOME_IGNORED = "ignored"
OUTCOME_BAD_REQUEST = "bad_request"
OUTCOME_ERROR = "error"

#: ``reason`` for requests that are not a pod CREATE.
REASON_NOT_POD_CREATE = "not_pod_create"

INTERNAL_ERROR_WARNING = "podplacement webhook: internal error, pod admitted without gating"

_JSON = "application/json"
_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)


class BadReview(ValueError):
    """The body is not a usable AdmissionReview (answered with HTTP 400)."""


class WebhookMetrics:
    """Prometheus metrics of one app, in their own registry (several apps per process in
    tests). Names start with ``podplacement_webhook_``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        prefix = f"{METRICS_PREFIX}webhook_"
        self.requests = Counter(
            f"{prefix}requests", "AdmissionReview requests by outcome and skip reason.",
            ("outcome", "reason"), registry=self.registry,
        )
        self.gated = Counter(f"{prefix}gated_pods", "Pods the webhook gated.",
                             registry=self.registry)
        self.errors = Counter(f"{prefix}errors", "Internal errors (pod admitted unchanged).",
                              registry=self.registry)
        self.latency = Histogram(
            f"{prefix}request_duration_seconds", "Time spent handling /mutate, in seconds.",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        # Children resolved once: .labels() costs a dict lookup and a lock per call.
        self._by_reason = {r: self.requests.labels(OUTCOME_SKIPPED, r) for r in SKIP_REASONS}
        self._by_reason[REASON_GATED] = self.requests.labels(OUTCOME_GATED, REASON_GATED)
        self.ignored = self.requests.labels(OUTCOME_IGNORED, REASON_NOT_POD_CREATE)
        self.bad_request = self.requests.labels(OUTCOME_BAD_REQUEST, "")
        self.error = self.requests.labels(OUTCOME_ERROR, "")

    def decided(self, reason: str) -> None:
        """Count one pod decision (``gated`` or a skip reason)."""
        child = self._by_reason.get(reason)
        if child is None:
            child = self._by_reason[reason] = self.requests.labels(OUTCOME_SKIPPED, reason)
        child.inc()


# --- selective decoding ----------------------------------------------------------------------
# orjson builds Python objects for the whole 5 KB review (managedFields, volumes, userInfo, ...)
# although /mutate reads a handful of fields: that was ~80% of what /mutate cost over the bare
# endpoint (bench/webhook.py). msgspec, when installed, decodes into the TypedDicts below: it
# checks the JSON syntax of the parts it skips without building objects for them and returns
# plain dicts holding only the listed keys (~6 us instead of ~16 us for the recorded review),
# so the pure gating code takes them unchanged. Every field webhook.gating and webhook.patch
# read must be listed here (tests/webhook/test_fast_review.py checks it with recording dicts).
try:
    import msgspec  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # optional: without it every body takes the orjson path
    msgspec = None  # type: ignore[assignment]


class _Container(TypedDict, total=False):
    resources: Any


class _PodMeta(TypedDict, total=False):
    namespace: Any
    labels: Any
    ownerReferences: Any


class _PodSpec(TypedDict, total=False):
    nodeName: Any
    schedulingGates: Any
    nodeSelector: Any
    affinity: Any
    resources: Any
    containers: list[_Container] | None
    initContainers: list[_Container] | None


class _Pod(TypedDict, total=False):
    metadata: _PodMeta | None
    spec: _PodSpec | None


class _Request(TypedDict, total=False):
    uid: Any
    kind: Any
    operation: Any
    subResource: Any
    namespace: Any
    object: _Pod | None


class _Review(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    request: _Request | None


_REVIEW_DECODER: Any = msgspec.json.Decoder(_Review) if msgspec is not None else None
_DECODE_ERRORS: tuple[type[Exception], ...] = (
    (msgspec.MsgspecError,) if msgspec is not None else ()
)


def _parse_review_fast(body: bytes) -> tuple[str, Mapping[str, Any]] | None:
    """``(apiVersion, request)`` decoded with msgspec into the subset of fields /mutate reads;
    None when msgspec is not installed or declines the body (then orjson parses it whole).

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


_PATCH_CACHE: dict[tuple[bool, bool], str] = {}


def _encoded_patch(pod: Mapping[str, Any]) -> str:
    """The base64 JSONPatch for ``pod``.

    :func:`webhook.patch.gate_patch` depends only on whether ``spec.schedulingGates`` is a
    list and ``metadata.labels`` a map (:func:`webhook.patch.patch_shape`), so there are four
    distinct patches: each is built and encoded once, then looked up by that shape.
    """
    key = patch_shape(pod)
    encoded = _PATCH_CACHE.get(key)
    if encoded is None:
        encoded = _PATCH_CACHE[key] = base64.b64encode(orjson.dumps(gate_patch(pod))).decode()
    return encoded


def _review_response(api_version: str, response: dict[str, Any]) -> Response:
    body = {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
    return Response(orjson.dumps(body), media_type=_JSON)


def _bad_request(message: str) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=400, media_type=_JSON)


def create_app(
    config_source: ConfigSource,
    *,
    own_namespace: str = DEFAULT_NAMESPACE,
    certs_ready: Callable[[], bool] = lambda: True,
    metrics: WebhookMetrics | None = None,
    bare_endpoint: bool = False,
) -> FastAPI:
    """Build the webhook app.

    Args:
        config_source: gives the cached PodPlacementConfig; started and stopped with the app's
            lifespan.
        own_namespace: the controller's namespace (its pods are never gated).
        certs_ready: tells ``/readyz`` whether the serving certificate is loaded.
        metrics: the metrics holder (a fresh one with its own registry by default); the app
            exposes it as ``app.state.metrics``.
        bare_endpoint: also serve ``POST /bare``, a constant answer on the same stack, for
            the benchmark's baseline.

    Routes: ``POST /mutate``, ``GET /healthz``, ``GET /readyz`` (503 until the config was read
    once and certificates are loaded), ``GET /metrics`` (Prometheus text format).
    """
    m = metrics or WebhookMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await config_source.start()
        try:
            yield
        finally:
            await config_source.stop()

    app = FastAPI(title="podplacement webhook", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.metrics = m
    app.state.config_source = config_source

    observe_latency = m.latency.observe

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        started = time.perf_counter()
        try:
            return await _mutate(request)
        finally:
            observe_latency(time.perf_counter() - started)

    async def _mutate(request: Request) -> Response:
        try:
            body = await request.body()
            api_version, review_request = _parse_review(body)
        except BadReview as exc:
            m.bad_request.inc()
            return _bad_request(str(exc))
        except Exception as exc:  # e.g. the client went away mid-body
            m.bad_request.inc()
            return _bad_request(f"could not read the request: {type(exc).__name__}")
        uid = review_request["uid"]
        response: dict[str, Any] = {"uid": uid, "allowed": True}
        try:
            if not _is_pod_create(review_request):
                m.ignored.inc()
                return _review_response(api_version, response)
            pod, namespace = _pod_and_namespace(review_request)
            decision = should_gate(pod, namespace=namespace, config=config_source.current,
                                   own_namespace=own_namespace)
            if decision.gate:
                response["patchType"] = "JSONPatch"
                response["patch"] = _encoded_patch(pod)
                m.gated.inc()
            m.decided(decision.reason)
            return _review_response(api_version, response)
        except BadReview as exc:
            m.bad_request.inc()
            return _bad_request(str(exc))
        except Exception:
            log.exception("admission failed; allowing the pod unchanged", extra={"uid": uid})
            m.errors.inc()
            m.error.inc()
            return _review_response(
                api_version,
                {"uid": uid, "allowed": True, "warnings": [INTERNAL_ERROR_WARNING]},
            )

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

    if bare_endpoint:
        bare_body = orjson.dumps({"apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
                                  "response": {"uid": "", "allowed": True}})

        @app.post("/bare")
        async def bare(request: Request) -> Response:
            await request.body()
            return Response(bare_body, media_type=_JSON)

    return app
