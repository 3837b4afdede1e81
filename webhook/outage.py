"""The webhook's answer while no controller runs: place the pod itself, else release it with
the controller's fallback.

When the controller's Lease has gone unrenewed for ``--controller-unavailable-after``
(:class:`webhook.leasewatch.ControllerLease`), nothing would ever place a gated pod, and a
pod let through unplaced may be bound to a node its images cannot run on and is never
revisited. So the webhook decides once and for all, at admission (docs/how-it-decides.md "No
cluster-wide stall when the controller is down"):

1. the pod's images are inspected within the review's budget, anonymously
   (:meth:`webhook.admitinspect.AdmissionInspector.pod_images`: the place cache first,
   concurrent reviews of one image sharing one inspection; images pulled with ``Always``
   revalidated with the registry; the webhook reads no Secret, docs/security.md);
2. the webhook reads no Secret, so a private image (one the registry refuses to the
   anonymous inspection) has no result here: like any image without a result, it means the
   controller's fallback at once (item 3). It is not held gated: with no controller
   leading, nothing would ever place it ("nothing we leave in the API server gates pods
   once we are gone"), so a private image's pod gets the fallback's operating systems
   during an outage where the webhook of 0.2.0 placed it with the pod's pull Secrets
   (docs/security.md, the trade-off);
3. the controller's decision is answered (:func:`rules.place.admission.outage_placement`:
   final affinity, labels, decision annotation with ``"path":"webhook"``, gate removed);
   an image without a result in time means the controller's fallback at once
   (:func:`rules.place.fallback.fallback_requirement`: the fallback architecture when
   one applies and always the fallback operating systems, default ``kubernetes.io/os In
   [linux]``), the pod is *released unplaced* and the answer says why
   (:attr:`OutageAnswer.unplaced`).

With ``dryRun`` nothing is inspected: the cache answers or the pod is released. A pod whose
shape the controller's patch does not fit gets the plain release of
:func:`webhook.patch.release_patch` (gate removed, decision ``controller-unavailable``),
without the fallback requirement: such an object (``metadata`` not an object,
``schedulingGates`` not a list) is not one the API server hands a webhook, and no affinity
path into it can be trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import PlacementConfig
from podplacement.rules.place.admission import WARNING_PREFIX, outage_placement
from podplacement.rules.place.decision import Outcome, unique_images
from podplacement.rules.policy import PlacementPolicy
from podplacement.webhook.admitinspect import (
    AdmissionInspector,
    NotInspected,
    NotInspectedInTime,
    TooManyInspections,
)
from podplacement.webhook.patch import release_patch

__all__ = [
    "UNPLACED_BUSY",
    "UNPLACED_DRY_RUN",
    "UNPLACED_FAILED",
    "UNPLACED_NOT_INSPECTED",
    "UNPLACED_REASONS",
    "UNPLACED_TIMEOUT",
    "UNPLACED_UNFIT",
    "OutageAnswer",
    "answer_during_outage",
]

#: ``reason`` label values of ``podplacement_webhook_released_unplaced_total``: why a pod
#: was released without its images' platforms, the first that applies in this order.
UNPLACED_DRY_RUN = "dry_run"  # a dry-run review whose images were not all cached
UNPLACED_TIMEOUT = "timeout"  # an inspection did not finish within the budget
UNPLACED_BUSY = "busy"  # too many inspections were running to start one more
UNPLACED_NOT_INSPECTED = "not_inspected"  # the webhook has no inspector
UNPLACED_FAILED = "failed"  # the registry failed, or refused an image of a pod without
# pull Secrets
UNPLACED_UNFIT = "unfit"  # the pod's shape does not fit the controller's patch
UNPLACED_REASONS = (UNPLACED_DRY_RUN, UNPLACED_TIMEOUT, UNPLACED_BUSY, UNPLACED_NOT_INSPECTED,
                    UNPLACED_FAILED, UNPLACED_UNFIT)


@dataclass(frozen=True, slots=True)
class OutageAnswer:
    """The webhook's answer for one pod while no controller runs.

    Attributes:
        patch: RFC 6902 ops for the AdmissionReview's ``request.object`` (empty: nothing
            to change, e.g. an ungated pod of an odd shape).
        warnings: the AdmissionReview ``warnings`` entries (``"podplacement: ..."``).
        unplaced: None when the pod was placed from its images' platforms; else why it
            was released without them (one of :data:`UNPLACED_REASONS`).
    """

    patch: tuple[Mapping[str, Any], ...]
    warnings: tuple[str, ...]
    unplaced: str | None


def _why_unplaced(errors: Mapping[str, BaseException], dry_run: bool) -> str:
    values = list(errors.values())
    if dry_run:
        return UNPLACED_DRY_RUN
    for kind, label in ((NotInspectedInTime, UNPLACED_TIMEOUT),
                        (TooManyInspections, UNPLACED_BUSY),
                        (NotInspected, UNPLACED_NOT_INSPECTED)):
        if any(isinstance(e, kind) for e in values):
            return label
    return UNPLACED_FAILED


async def answer_during_outage(
    pod: Mapping[str, Any],
    config: PlacementConfig,
    *,
    inspector: AdmissionInspector | None,
    budget: float,
    dry_run: bool,
    silent_for: float,
    policy: PlacementPolicy | None = None,
) -> OutageAnswer:
    """Place ``pod`` at admission, release it with the fallback, or leave it gated for the
    controller (module docstring).

    Args:
        pod: the AdmissionReview's ``request.object`` (the whole pod), gated by the
            admission policy or one the webhook would gate.
        config: the PodPlacementConfig in force.
        inspector: inspects at admission (None: nothing is inspected, every pod is
            released with the fallback).
        budget: seconds left for the inspections (the caller counts from the start of the
            review).
        dry_run: ``request.dryRun``: the cache only, untouched (no registry request).
        silent_for: seconds since the controller's Lease was last seen renewed (for the
            decision's reason).
        policy: the namespace's PodPlacementPolicy matching the pod, or None.

    Returns:
        the :class:`OutageAnswer` (placed, or released with the fallback). Raises only on
        internal errors (the caller allows the pod unchanged and counts them).
    """
    give_up = (f"at admission (no podplacement controller has renewed its Lease for "
               f"{silent_for:.0f} s)")
    if inspector is not None:
        found = await inspector.pod_images(pod, config, budget=budget,
                                           dry_run=dry_run, revalidate=True)
        images: Mapping[str, Any] = found.results
        errors = found.errors()
    else:
        errors = {image: NotInspected(image, "no inspector") for image in unique_images(pod)}
        images = errors
    placement = outage_placement(pod, images, config, give_up=give_up, policy=policy)
    if placement is None:
        reason = f"{give_up}; the pod is admitted without placement"
        return OutageAnswer(tuple(release_patch(pod, reason)),
                            (WARNING_PREFIX + reason,), UNPLACED_UNFIT)
    unplaced = _why_unplaced(errors, dry_run) if placement.outcome == Outcome.FALLBACK else None
    return OutageAnswer(placement.patch, placement.warnings, unplaced)
