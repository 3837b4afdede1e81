"""The admission pipeline of ``POST /mutate``: one AdmissionReview through five named stages.

:meth:`AdmissionPipeline.answer` runs them in this order; each stage either answers (a
:class:`~fastapi.responses.Response`, final) or hands plain data to the next:

1. :meth:`~AdmissionPipeline.decode`: read the body within the limits
   (:func:`webhook.limits.read_body`) and parse the AdmissionReview
   (:func:`webhook.review.parse_review`) → a :class:`Review`, or HTTP 400/408/413.
2. :meth:`~AdmissionPipeline.skip`: not a pod CREATE → allowed unchanged;
   :func:`webhook.gating.should_gate` says not to gate → allowed unchanged; else (to gate, or
   already gated by the admission policy) → a :class:`PodToGate`.
3. :meth:`~AdmissionPipeline.outage`: no controller holds its Lease → placed or released at
   admission (:func:`webhook.outage.answer_during_outage`: a private image, which the
   webhook cannot inspect, means the fallback); else None (go on).
4. :meth:`~AdmissionPipeline.place`: from the cache of anonymous results, or inspected within the
   config's ``inspectionBudget`` (:func:`webhook.admitplace.place_reviewed_pod`) → placed in
   the answer, or why not (a :data:`webhook.admitplace.KINDS` value).
5. :meth:`~AdmissionPipeline.gate`: the gate and label patch (:func:`webhook.review.patch_tail`),
   or for a pod that came gated the label fix (:func:`webhook.review.label_tail`).

The webhook never denies and never answers 5xx (docs/design.md, "Rules that are easy to get
wrong"): a stage that raises :class:`webhook.review.BadReview` gets HTTP 400, any other
exception after decoding ``allowed: true`` without a patch plus
:data:`INTERNAL_ERROR_WARNING` and an error count. Dry-run reviews (``request.dryRun``) get the
same answers but cause nothing beyond them: no registry request and no cache fill.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from fastapi import Request
from fastapi.responses import Response

from podplacement.rules.config import PlacementConfig
from podplacement.rules.policy import policy_for
from podplacement.webhook.admitplace import GATED, place_reviewed_pod
from podplacement.webhook.admitplace import PlaceCacheLike as _PlaceCacheBase
from podplacement.webhook.configsource import ConfigSource
from podplacement.webhook.gating import REASON_ALREADY_GATED, GateDecision, should_gate
from podplacement.webhook.limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    BadContentLength,
    BodyDeadlines,
    BodyTimeout,
    BodyTooLarge,
    read_body,
)
from podplacement.webhook.metrics import WebhookMetrics
from podplacement.webhook.outage import OutageAnswer, answer_during_outage
from podplacement.webhook.policysource import PolicySource
from podplacement.webhook.review import (
    BadReview,
    allowed,
    bad_request,
    is_pod_create,
    label_tail,
    parse_review,
    patch_members,
    patch_tail,
    pod_and_namespace,
    refused,
    warnings_members,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from podplacement.webhook.admitinspect import AdmissionInspector

log = logging.getLogger(__name__)

INTERNAL_ERROR_WARNING = "podplacement webhook: internal error, pod admitted without gating"
_INTERNAL_ERROR_TAIL = warnings_members((INTERNAL_ERROR_WARNING,))


class PlaceCacheLike(_PlaceCacheBase, Protocol):
    """What the pipeline and the app need of :class:`webhook.placecache.PlaceCache`."""

    async def aclose(self) -> None: ...


class ControllerLeaseLike(Protocol):
    """What the pipeline and the app need of :class:`webhook.leasewatch.ControllerLease`."""

    def available(self) -> bool: ...
    def seconds_since_renewal(self) -> float: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


# Not frozen: a frozen dataclass's __init__ (object.__setattr__ per field) cost ~2 us per
# review on the /mutate hot path, about 4% of it (bench: in-process ASGI). Read-only by use.
@dataclass(slots=True)
class Review:
    """One decoded AdmissionReview: what :meth:`AdmissionPipeline.decode` hands on (the
    stages only read it).

    Attributes:
        body: the request body as received (the outage and place stages read the whole pod
            from it; the selective decoder kept only the gating fields).
        api_version: ``admission.k8s.io/v1`` or ``v1beta1``; the answer's ``apiVersion``.
        request: the review's ``request`` as :func:`webhook.review.parse_review` returns it
            (``uid`` a non-empty str, ``kind`` a GroupVersionKind dict, ``operation`` a str).
        config: the PodPlacementConfig read together with the body (None: there is none).
        started: :func:`time.perf_counter` seconds when the request arrived; the inspection
            budgets are counted from it.
    """

    body: bytes
    api_version: str
    request: Mapping[str, Any]
    config: PlacementConfig | None
    started: float

    @property
    def uid(self) -> str:
        """``request.uid``, echoed in the answer."""
        uid: str = self.request["uid"]
        return uid


@dataclass(slots=True)
class PodToGate:
    """A pod CREATE the webhook holds at the gate unless it can place it now: what
    :meth:`AdmissionPipeline.skip` hands on (the stages only read it).

    Attributes:
        pod: ``request.object`` (selectively decoded: the gating fields only).
        namespace: the pod's namespace (``request.namespace``, else its metadata's).
        decision: :func:`webhook.gating.should_gate`'s verdict: ``gate`` true, or the
            reason ``already_gated`` (the admission policy, or the creator, set our gate).
        dry_run: ``request.dryRun`` is true: nothing beyond the answer may happen.
    """

    pod: Mapping[str, Any]
    namespace: str
    decision: GateDecision
    dry_run: bool


class AdmissionPipeline:
    """The stages of ``/mutate`` (module docstring), with what they need.

    Args:
        config_source: the cached PodPlacementConfig (read once per review, with the body).
        metrics: where every stage counts (:class:`webhook.metrics.WebhookMetrics`).
        own_namespace: the controller's namespace (its pods are never gated).
        max_body_bytes: bodies over this many bytes get HTTP 413.
        body_timeout: seconds to receive a body whole, else HTTP 408.
        controller_lease: tells whether a controller runs
            (:class:`webhook.leasewatch.ControllerLease`). While it says no, pods are not
            held: a pod the admission policy gated, or one the webhook would gate, is placed
            at admission by the webhook itself or released with the controller's fallback
            (:mod:`webhook.outage`; outcome ``placed`` or ``released``, reason
            ``controller_unavailable``). None: always hold (no outage stage).
        place_cache: the cache of anonymous inspection results of the fast path
            (:class:`webhook.placecache.PlaceCache`, keyed by image). A pod the webhook
            would gate, or that the admission policy gated, whose images the cache knows
            is placed in the answer (the controller's decision,
            :func:`rules.place.admission.admission_placement`: final affinity, labels, annotation
            with ``"path":"webhook"``, gate removed, ``warnings`` for pins the images cannot
            run on), counted as ``admissions_total{path="webhook-placed"}``. On a miss, and
            for images pulled with ``Always``, the images are inspected (revalidated: one
            ``HEAD``) with ``inspector`` within the config's ``inspectionBudget``
            (:mod:`webhook.admitplace`; ``webhook-inspected``, ``webhook-revalidated``);
            past it the pod stays gated (``gated-over-budget``). Without an inspector or
            with a budget of 0, a miss schedules a background fill; a ``dryRun`` review
            only reads the cache. None: no place stage.
        inspector: inspects a pod's images at admission within a budget
            (:class:`webhook.admitinspect.AdmissionInspector`, storing into
            ``place_cache``): the config's ``inspectionBudget`` while a controller runs, the
            inspector's own ``budget`` while none does; None: pods are placed from the cache
            only, and released with the fallback while no controller runs.
        policies: the namespaces' PodPlacementPolicies
            (:class:`webhook.policysource.WatchingPolicySource`), applied on every path that
            places at admission; None: the cluster's config alone.

    Raises:
        ValueError: ``max_body_bytes`` < 1 or ``body_timeout`` <= 0.
    """

    def __init__(
        self,
        config_source: ConfigSource,
        metrics: WebhookMetrics,
        *,
        own_namespace: str,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        controller_lease: ControllerLeaseLike | None = None,
        place_cache: PlaceCacheLike | None = None,
        inspector: AdmissionInspector | None = None,
        policies: PolicySource | None = None,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        if not body_timeout > 0:
            raise ValueError(f"body_timeout must be > 0 seconds, got {body_timeout}")
        self.config_source = config_source
        self.metrics = metrics
        self.own_namespace = own_namespace
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.controller_lease = controller_lease
        self.place_cache = place_cache
        self.inspector = inspector
        self.policies = policies
        self.deadlines = BodyDeadlines()

    async def answer(self, request: Request) -> Response:
        """``POST /mutate``: the stages in order; the first answer is the reply.

        Returns HTTP 400/408/413 (:meth:`decode`, or :class:`webhook.review.BadReview` from a
        later stage) or 200 with ``allowed: true``; never raises for an error inside a stage
        after decoding (logged, counted in ``errors_total`` and ``requests_total{outcome=
        "error"}``, answered with :data:`INTERNAL_ERROR_WARNING`). The time spent is
        observed in ``request_duration_seconds``.
        """
        started = perf_counter()
        try:
            review = await self.decode(request, started)
            if isinstance(review, Response):
                return review
            try:
                return await self._decide(review)
            except BadReview as exc:
                self.metrics.bad_request.inc()
                return bad_request(str(exc))
            except Exception:
                log.exception("admission failed; allowing the pod unchanged",
                              extra={"uid": review.uid})
                self.metrics.errors.inc()
                self.metrics.failed_requests.inc()
                return allowed(review.api_version, review.uid, _INTERNAL_ERROR_TAIL)
        finally:
            self.metrics.observe_latency(perf_counter() - started)

    async def _decide(self, review: Review) -> Response:
        """Stages 2-5 for a decoded review."""
        pod = self.skip(review)
        if isinstance(pod, Response):
            return pod
        answer = await self.outage(review, pod)
        if answer is not None:
            return answer
        placed = await self.place(review, pod)
        if isinstance(placed, Response):
            return placed
        return self.gate(review, pod, placed)

    async def decode(self, request: Request, started: float) -> Review | Response:
        """Stage 1: read the body and parse the AdmissionReview.

        Args:
            request: the HTTP request (its body is read here, within ``max_body_bytes`` and
                ``body_timeout``).
            started: :func:`time.perf_counter` seconds when it arrived (kept in the
                :class:`Review`).

        Returns:
            The :class:`Review` (the config is read with it: parse and rules see the same
            config), or the final answer, counted in ``requests_total{outcome=
            "bad_request"}``: HTTP 400 ``{"error": ...}`` for a body that is not a usable
            AdmissionReview, a bad ``Content-Length`` or a failed read (e.g. the client went
            away mid-body); 413 / 408 with ``Connection: close`` for a body over the limit /
            not received in time (reason ``body_too_large`` / ``body_timeout``). Never raises.
        """
        m = self.metrics
        try:
            body = await read_body(request, max_bytes=self.max_body_bytes,
                                   time_limit=self.body_timeout, deadlines=self.deadlines)
            # Read once: the parse and the rules see the same config (no await between).
            config = self.config_source.current
            api_version, review_request = parse_review(body)
        except (BadReview, BadContentLength) as exc:
            m.bad_request.inc()
            return bad_request(str(exc))
        except BodyTooLarge as exc:
            m.body_too_large.inc()
            return refused(exc)
        except BodyTimeout as exc:
            m.body_timeout.inc()
            return refused(exc)
        except Exception as exc:  # e.g. the client went away mid-body
            m.bad_request.inc()
            return bad_request(f"could not read the request: {type(exc).__name__}")
        return Review(body, api_version, review_request, config, started)

    def skip(self, review: Review) -> PodToGate | Response:
        """Stage 2: answer every review the webhook leaves alone.

        Returns:
            ``allowed: true`` unchanged for a request that is not a pod CREATE (counted
            ``ignored``/``not_pod_create``) and for a pod :func:`webhook.gating.should_gate`
            does not gate (counted ``skipped`` with its reason); else the :class:`PodToGate`
            (to gate, or ``already_gated``), not counted yet.

        Raises:
            BadReview: a pod CREATE without ``request.object`` or a namespace.
        """
        request = review.request
        if not is_pod_create(request):
            self.metrics.ignored.inc()
            return allowed(review.api_version, review.uid)
        pod, namespace = pod_and_namespace(request)
        decision = should_gate(pod, namespace=namespace, config=review.config,
                               own_namespace=self.own_namespace)
        if not decision.gate and decision.reason != REASON_ALREADY_GATED:
            self.metrics.decided(decision.reason)
            return allowed(review.api_version, review.uid)
        return PodToGate(pod, namespace, decision, request.get("dryRun") is True)

    async def outage(self, review: Review, pod: PodToGate) -> Response | None:
        """Stage 3: while no controller runs, hold no pod at the gate that the webhook can
        place or release.

        Returns:
            None when a controller holds its Lease (or there is no Lease watch or no
            config): go on. Else the answer of :func:`webhook.outage.answer_during_outage`
            (the pod placed at admission, inspected anonymously within the inspector's own
            ``budget`` counted from ``review.started``, or released with the controller's
            fallback), counted ``placed`` / ``released`` with reason
            ``controller_unavailable``.

        Raises:
            Exception: from the Lease, the policy source or a whole-body parse (the caller
            answers with :data:`INTERNAL_ERROR_WARNING`).
        """
        lease, config = self.controller_lease, review.config
        if lease is None or config is None or lease.available():
            return None
        inspector, policies = self.inspector, self.policies
        budget = (inspector.budget if inspector else 0.0)
        whole = orjson.loads(review.body)["request"]["object"]
        answer = await answer_during_outage(
            whole, config,
            inspector=inspector,
            budget=budget - (perf_counter() - review.started), dry_run=pod.dry_run,
            silent_for=lease.seconds_since_renewal(),
            policy=(policy_for(whole, policies.of(pod.namespace))
                    if policies is not None else None))
        return self._outage_answer(review, answer)

    def _outage_answer(self, review: Review, answer: OutageAnswer) -> Response:
        """The outage answer, counted: placed, or released unplaced and why."""
        m = self.metrics
        if answer.unplaced is None:
            m.placed_in_outage.inc()
            m.webhook_placed.inc()
        else:
            m.released.inc()
            m.path_released.inc()
            m.released_unplaced[answer.unplaced].inc()
        tail = patch_members(answer.patch) if answer.patch else b""
        if answer.warnings:
            tail += warnings_members(answer.warnings)
        return allowed(review.api_version, review.uid, tail)

    async def place(self, review: Review, pod: PodToGate) -> Response | str:
        """Stage 4: place the pod in the answer when its images are known, or learned within
        the config's ``inspectionBudget`` (counted from ``review.started``).

        Returns:
            The answer with the controller's decision (final affinity, labels, annotation
            with ``"path":"webhook"``, gate removed, ``warnings``), counted by how it was
            placed (:meth:`webhook.metrics.WebhookMetrics.placed_at_admission`); else why
            not, a :data:`webhook.admitplace.KINDS` value (:data:`webhook.admitplace.GATED`
            when there is no cache). Errors inside are counted in ``errors_total`` and
            leave the pod gated (:func:`webhook.admitplace.place_reviewed_pod`).
        """
        cache, config = self.place_cache, review.config
        if cache is None:
            return GATED
        budget = (config.admission_inspection_budget if config is not None
                  else 0.0) - (perf_counter() - review.started)
        placed = await place_reviewed_pod(
            review.body, pod.namespace, config, cache=cache, inspector=self.inspector,
            budget=budget, dry_run=pod.dry_run, policies=self.policies,
            on_error=self.metrics.errors.inc)
        if placed.placement is None:
            return placed.kind
        self.metrics.placed_at_admission(placed.kind)
        tail = patch_members(placed.placement.patch)
        if placed.placement.warnings:
            tail += warnings_members(placed.placement.warnings)
        return allowed(review.api_version, review.uid, tail)

    def gate(self, review: Review, pod: PodToGate, kind: str = GATED) -> Response:
        """Stage 5: the pod stays for the controller.

        Args:
            kind: why it was not placed (:data:`webhook.admitplace.KINDS`), the
                ``admissions_total`` path it is counted under.

        Returns:
            For a pod to gate, the gate and gate-label JSONPatch
            (:func:`webhook.review.patch_tail`), counted ``gated`` and in
            ``gated_pods_total``; for a pod that came with our gate, the label set to
            ``gated`` when it is not (:func:`webhook.review.label_tail`), counted
            ``skipped``/``already_gated``.
        """
        self.metrics.decided(pod.decision.reason, kind)
        if pod.decision.reason == REASON_ALREADY_GATED:
            return allowed(review.api_version, review.uid, label_tail(pod.pod))
        self.metrics.gated.inc()
        return allowed(review.api_version, review.uid, patch_tail(pod.pod))
