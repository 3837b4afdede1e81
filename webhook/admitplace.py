"""Place a gated pod at admission: from the place cache, or after inspecting its images within
the config's budget, with one manifest ``HEAD`` for an image pulled with ``Always``.

A pod the admission policy gated, or one the webhook would gate, is placed in the webhook's
answer (gate removed, the controller's own decision,
:func:`rules.place.admission.admission_placement`) when the webhook knows every image of it
**from an anonymous inspection** (:mod:`webhook.placecache`: the webhook reads no Secret, so
an image that needs the pod's pull Secrets is the controller's; docs/security.md).
What it does not know yet it learns now, anonymously, within
``spec.admission.inspectionBudget`` seconds counted from the start of the review
(:attr:`rules.config.PlacementConfig.admission_inspection_budget`;
docs/how-it-decides.md "The webhook after the policy"):

* an image missing from the cache is inspected
  (:meth:`webhook.admitinspect.AdmissionInspector.pod_images`: concurrent reviews of one
  image share one inspection, made without credentials);
* an image pulled with ``imagePullPolicy: Always`` is revalidated even when cached: the
  registry is asked for the tag's current digest with one manifest ``HEAD``
  (:meth:`imageinspect.Inspector.inspect` with ``pull_always``); the same digest places the pod
  from the cached platforms, another one means a full inspection. This is what the
  controller does for every such pod; the admission policy's params cannot, so the policy
  keeps gating them;
* past the budget the pod stays gated for the controller, exactly as without this step,
  and the inspection goes on in the background and stores its result, so the next pod of
  that image is placed from the cache. A failed inspection leaves the pod to the
  controller too (it retries and reports), and so does an image the registry refuses to
  show without credentials: the controller inspects it with the pod's own pull Secrets.

A review with ``dryRun`` reads the cache only (untouched): nothing is inspected or filled
(``sideEffects: None``). A budget of 0 inspects nothing at admission: a miss schedules a
background fill (:meth:`webhook.placecache.PlaceCache.schedule_fill`) and the pod stays gated.
No HTTP here: the caller reads the review and writes the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from podplacement.rules.config import PlacementConfig
from podplacement.rules.place.admission import (
    AdmissionPlacement,
    admission_placement,
    fast_path_applies,
)
from podplacement.rules.place.decision import too_many_images, unique_images
from podplacement.rules.policy import PlacementPolicy, policy_for
from podplacement.webhook.admitinspect import (
    NotInspectedInTime,
    PodImages,
    TooManyInspections,
    needs_credentials,
)
from podplacement.webhook.policysource import PolicySource

__all__ = [
    "GATED",
    "GATED_INSPECTION_FAILED",
    "GATED_NEEDS_CREDENTIALS",
    "GATED_OVER_BUDGET",
    "KINDS",
    "PLACED_FROM_CACHE",
    "PLACED_INSPECTED",
    "PLACED_REVALIDATED",
    "AdmissionAnswer",
    "InspectorLike",
    "PlaceCacheLike",
    "place_at_admission",
    "place_reviewed_pod",
]

log = logging.getLogger(__name__)

#: :attr:`AdmissionAnswer.kind` values. Placed: every image was in the cache (no registry
#: request) ...
PLACED_FROM_CACHE = "cache"
#: ... an image was inspected at admission (new, expired, or an ``Always`` tag whose digest
#: changed) ...
PLACED_INSPECTED = "inspected"
#: ... every image was cached and each one pulled with ``Always`` kept its digest (one
#: ``HEAD`` per such image, shared by concurrent reviews).
PLACED_REVALIDATED = "revalidated"
#: Left gated for the controller without trying at admission (a dry run, fast paths off or
#: NUMA placement on, a budget of 0, a pod whose shape the patch does not fit).
GATED = "gated"
#: Left gated: an image was not inspected within the budget (or too many inspections were
#: running to start one); it goes on in the background.
GATED_OVER_BUDGET = "over_budget"
#: Left gated: an image's anonymous inspection failed (a registry error).
GATED_INSPECTION_FAILED = "inspection_failed"
#: Left gated: the pod names pull Secrets and the registry refused an image of it to the
#: webhook's anonymous inspection (:func:`webhook.admitinspect.needs_credentials`): the
#: controller inspects it with the pod's own pull Secrets.
GATED_NEEDS_CREDENTIALS = "needs_credentials"
KINDS = (PLACED_FROM_CACHE, PLACED_INSPECTED, PLACED_REVALIDATED, GATED, GATED_OVER_BUDGET,
         GATED_INSPECTION_FAILED, GATED_NEEDS_CREDENTIALS)


class PlaceCacheLike(Protocol):
    """What this module needs of :class:`webhook.placecache.PlaceCache`."""

    def lookup(self, pod: Mapping[str, Any], config: PlacementConfig, *,
               touch: bool = True) -> Mapping[str, Any] | None: ...
    def schedule_fill(self, pod: Mapping[str, Any], config: PlacementConfig) -> Any: ...


class InspectorLike(Protocol):
    """What this module needs of :class:`webhook.admitinspect.AdmissionInspector`."""

    async def pod_images(self, pod: Mapping[str, Any],
                         config: PlacementConfig, *, budget: float | None = None,
                         dry_run: bool = False, revalidate: bool = False) -> PodImages: ...


@dataclass(frozen=True, slots=True)
class AdmissionAnswer:
    """The outcome of :func:`place_at_admission` for one pod.

    Attributes:
        placement: the patch and warnings placing the pod, or None: leave it gated.
        kind: how it came about, one of :data:`KINDS` (the path metric's label).
    """

    placement: AdmissionPlacement | None
    kind: str


_NOT_TRIED = AdmissionAnswer(None, GATED)


def _digest(result: Any) -> Any:
    return getattr(result, "digest", None)


async def place_at_admission(
    pod: Mapping[str, Any],
    namespace: str,
    config: PlacementConfig | None,
    *,
    cache: PlaceCacheLike,
    inspector: InspectorLike | None,
    budget: float,
    dry_run: bool,
    policy: PlacementPolicy | None = None,
) -> AdmissionAnswer:
    """Place ``pod`` from the cache, or after inspecting its images within ``budget``
    (module docstring), with the namespace's placement ``policy`` matching it (None: the
    cluster's config alone).

    Args:
        pod: the AdmissionReview's ``request.object``, decoded whole; gated by the policy
            or one the webhook would gate.
        namespace: the review's namespace (the exclusions learned from one namespace's
            exec format errors apply by it).
        config: the PodPlacementConfig in force (None: nothing is placed).
        cache: the place cache (looked up first; with ``dry_run`` read untouched).
        inspector: inspects at admission, sharing flights and storing into ``cache``
            (None: a miss schedules a background fill, as with a budget of 0).
        budget: seconds left of the config's ``inspectionBudget`` for this review (the
            caller counts from the start of the review); <= 0 still starts the
            inspections, which then fill the cache in the background.
        dry_run: ``request.dryRun``: the cache only, untouched; no registry request.

    Returns:
        an :class:`AdmissionAnswer`. Raises only on internal errors (the caller leaves the
        pod gated and counts them).
    """
    if not fast_path_applies(config) or too_many_images(pod) is not None:
        return _NOT_TRIED  # over MAX_POD_IMAGES: not inspected here; the controller decides
    assert config is not None
    pod = _in_namespace(pod, namespace)
    found = cache.lookup(pod, config, touch=not dry_run)
    pulls = unique_images(pod)
    always = any(pulls.values())
    if found is not None and not always:
        placement = admission_placement(pod, found, config, policy=policy)
        return AdmissionAnswer(placement, PLACED_FROM_CACHE if placement else GATED)
    if dry_run:
        return _NOT_TRIED
    if inspector is None or config.admission_inspection_budget <= 0:
        cache.schedule_fill(pod, config)
        return _NOT_TRIED
    images = await inspector.pod_images(pod, config, budget=max(0.0, budget),
                                        revalidate=True)
    if not images.complete:
        late = any(isinstance(e, NotInspectedInTime | TooManyInspections)
                   for e in images.errors().values())
        if late:
            return AdmissionAnswer(None, GATED_OVER_BUDGET)
        return AdmissionAnswer(None, GATED_NEEDS_CREDENTIALS
                               if needs_credentials(pod, config, images)
                               else GATED_INSPECTION_FAILED)
    placement = admission_placement(pod, images.results, config, revalidated=True,
                                    policy=policy)
    if placement is None:
        return _NOT_TRIED
    unchanged = found is not None and all(
        _digest(images.results[image]) == _digest(found[image]) for image in pulls)
    return AdmissionAnswer(placement, PLACED_REVALIDATED if unchanged else PLACED_INSPECTED)


def _in_namespace(pod: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    """``pod`` with ``metadata.namespace`` = ``namespace`` (the review's) when its object
    has none: exclusions learned from one namespace's exec format errors apply by the
    pod's namespace (:meth:`rules.config.ExcludedPlatform.applies_to`)."""
    meta = pod.get("metadata")
    if isinstance(meta, Mapping) and meta.get("namespace") == namespace:
        return pod
    return {**pod, "metadata": {**(meta if isinstance(meta, Mapping) else {}),
                                "namespace": namespace}}


async def place_reviewed_pod(
    body: bytes,
    namespace: str,
    config: PlacementConfig | None,
    *,
    cache: PlaceCacheLike,
    inspector: InspectorLike | None,
    budget: float,
    dry_run: bool,
    on_error: Callable[[], None],
    policies: PolicySource | None = None,
) -> AdmissionAnswer:
    """:func:`place_at_admission` for the pod of an AdmissionReview ``body`` (bytes of the
    whole review: the webhook's selective decoder kept only the gating fields, the decision
    reads the whole pod). Never raises for an internal error: it is logged, ``on_error()``
    is called, and the answer is "left gated" (:data:`GATED`). The namespace's placement
    policy matching the pod (``policies``; :func:`rules.policy.policy_for`) applies."""
    try:
        pod = orjson.loads(body)["request"]["object"]
        policy = policy_for(pod, policies.of(namespace)) if policies is not None else None
        return await place_at_admission(pod, namespace, config, cache=cache,
                                        inspector=inspector, budget=budget, dry_run=dry_run,
                                        policy=policy)
    except Exception:
        log.exception("webhook placement failed; the pod is left to the controller")
        on_error()
        return _NOT_TRIED
