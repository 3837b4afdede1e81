"""The admission webhook's ASGI app: ``POST /mutate`` plus health, readiness and metrics.

``/mutate`` is :class:`webhook.pipeline.AdmissionPipeline`: the AdmissionReview decoded
(:mod:`webhook.review`), then skip, outage, place and gate, each a named stage (its module
docstring has the order and what each answers). It answers in the request's ``apiVersion``
(``admission.k8s.io/v1`` or ``v1beta1``) with the request's ``uid`` and ``allowed: true``
and never denies: a body that is not an AdmissionReview gets HTTP 400 (the API server then
applies failurePolicy), a body over ``max_body_bytes`` HTTP 413, one not received within
``body_timeout`` seconds HTTP 408 (:func:`webhook.limits.read_body`), an unexpected error
while deciding ``allowed: true`` without a patch plus a ``warnings`` entry and an error count.
This module wires the pipeline, the health routes, the metrics (:mod:`webhook.metrics`) and
the lifespan of the watches and caches into one FastAPI app.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import generate_latest

from podplacement.rules.config import DEFAULT_NAMESPACE
from podplacement.webhook.configsource import ConfigSource
from podplacement.webhook.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES
from podplacement.webhook.metrics import WebhookMetrics
from podplacement.webhook.pipeline import (
    INTERNAL_ERROR_WARNING,
    AdmissionPipeline,
    ControllerLeaseLike,
    PlaceCacheLike,
)
from podplacement.webhook.policysource import PolicySource
from podplacement.webhook.review import ADMISSION_V1, ADMISSION_V1BETA1, BadReview

if TYPE_CHECKING:
    from podplacement.webhook.admitinspect import AdmissionInspector

#: Re-exported: the names callers of this module have always imported from it.
__all__ = [
    "ADMISSION_V1",
    "ADMISSION_V1BETA1",
    "INTERNAL_ERROR_WARNING",
    "BadReview",
    "ControllerLeaseLike",
    "PlaceCacheLike",
    "WebhookMetrics",
    "create_app",
]


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
        max_body_bytes, body_timeout, controller_lease, place_cache, admission_inspector
            (the pipeline's ``inspector``), policies: the stages' parts, as
            :class:`webhook.pipeline.AdmissionPipeline` takes them (what each changes is
            there); the lease, the policies and the config are started and stopped with the
            app's lifespan, the cache and the inspector closed with it.

    Raises:
        ValueError: ``max_body_bytes`` < 1 or ``body_timeout`` <= 0.

    Routes: ``POST /mutate`` (:meth:`webhook.pipeline.AdmissionPipeline.answer`),
    ``GET /healthz``, ``GET /readyz`` (503 until the config was read once and certificates
    are loaded), ``GET /metrics`` (Prometheus text format).
    """
    m = metrics or WebhookMetrics()
    pipeline = AdmissionPipeline(
        config_source, m, own_namespace=own_namespace, max_body_bytes=max_body_bytes,
        body_timeout=body_timeout, controller_lease=controller_lease,
        place_cache=place_cache, inspector=admission_inspector, policies=policies)
    app = FastAPI(title="podplacement webhook", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=_lifespan(pipeline))
    app.state.metrics = m
    app.state.config_source = config_source
    app.add_api_route("/mutate", pipeline.answer, methods=["POST"])
    _add_probes(app, config_source, certs_ready, m)
    return app


def _lifespan(pipeline: AdmissionPipeline) -> Callable[[FastAPI], Any]:
    """The app's lifespan: start the config, policy and Lease watches; on the way out stop
    the Lease watch, close the inspector and the cache, stop the config and policy watches
    (in that order)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        lease, policies = pipeline.controller_lease, pipeline.policies
        await pipeline.config_source.start()
        if policies is not None:
            await policies.start()
        if lease is not None:
            await lease.start()
        try:
            yield
        finally:
            if lease is not None:
                await lease.stop()
            if pipeline.inspector is not None:
                await pipeline.inspector.aclose()
            if pipeline.place_cache is not None:
                await pipeline.place_cache.aclose()
            await pipeline.config_source.stop()
            if policies is not None:
                await policies.stop()

    return lifespan


def _add_probes(app: FastAPI, config_source: ConfigSource, certs_ready: Callable[[], bool],
                metrics: WebhookMetrics) -> None:
    """``GET /healthz`` (always ok), ``GET /readyz`` (503 and what is missing until the config
    was read once and the certificates are loaded) and ``GET /metrics`` (Prometheus text)."""

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
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
