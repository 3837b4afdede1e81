"""The webhook's fast path: the controller's own placement rule, answered at admission.

A pod whose images the webhook already knows (from its cache of anonymous results,
:mod:`webhook.placecache`) can be placed in the AdmissionReview answer instead of being gated
and PATCHed by the controller later: no second write, which is what halves pod throughput
(docs/how-it-decides.md, "The webhook after the policy"). The rule is not re-implemented
here: :func:`admission_placement` takes the facts of
:func:`rules.place.placement.placement_facts`, the same the controller would write on the
gated pod, and renders them for the object being created
(:func:`rules.place.render.admission_patch`: no resourceVersion ``test``, the gate ops only
when the admission policy already added our gate), with ``"path":"webhook"`` in the decision
annotation. Only placements that leave the pod ungated and need no cluster view take this
path: never NUMA placement (it needs the nodes' NRTs and in-flight holds), never a fallback
or retry. While no controller runs, :func:`outage_placement` decides the same way but once
and for all: an image without a result means the controller's fallback at once, NUMA aside.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import FAST_PATHS_ENABLED, PlacementConfig
from podplacement.rules.place.placement import (
    ARCHITECTURES_NOT_ALLOWED,
    INCOMPATIBLE_NODE_AFFINITY,
    INCOMPATIBLE_NODE_SELECTOR,
    NO_SUPPORTED_PLATFORM_EVENT,
    PARTIALLY_COMPATIBLE_AFFINITY,
    PLACEMENT_FALLBACK,
    PLATFORMS_LEFT_OUT,
    WARNING,
    Outcome,
    Placement,
    PlacementInputs,
    compact_json,
    placement_facts,
    unique_images,
)
from podplacement.rules.place.render import admission_patch
from podplacement.rules.platforms import ImageLike
from podplacement.rules.policy import PlacementPolicy

__all__ = [
    "PATH_WEBHOOK",
    "WARNING_PREFIX",
    "AdmissionPlacement",
    "admission_placement",
    "fast_path_applies",
    "outage_placement",
]

#: The ``path`` the decision annotation carries for a pod the webhook placed.
PATH_WEBHOOK = "webhook"
#: Each ``warnings`` entry starts with this (kubectl prints ``Warning: <entry>``).
WARNING_PREFIX = "podplacement: "
#: Longest ``warnings`` entry, in characters (the API server caps each at 120 *words*; one
#: short line is what a user reads in a terminal).
MAX_WARNING_CHARS = 300
#: Largest admission patch the webhook answers with, in bytes of compact JSON: 256 KiB. The
#: API server applies it to the pod being created, whose stored size etcd caps at 1.5 MiB;
#: a patch that made the pod too large would fail the create, and the webhook never denies.
#: A placement over it (an architecture list ANDed into hundreds of the pod's terms) is left
#: to the controller, whose PATCH, refused as too large, releases the pod with the fallback
#: (docs/how-it-decides.md, "No pod stays gated forever").
MAX_ADMISSION_PATCH_BYTES = 256 * 1024

#: The outcomes the webhook may answer with: the pod leaves admission ungated.
_PLACED = frozenset({Outcome.SET, Outcome.NOT_SET, Outcome.NO_SUPPORTED_PLATFORM})
#: Warning reasons that mean "the pod cannot run (everywhere) where the user sent it", that
#: platforms were left out of its terms, and the fallback of :func:`outage_placement`
#: (placed without its images' platforms): the ones the user should see at ``kubectl`` time
#: (docs/how-it-decides.md "The webhook after the policy": a ``warnings`` entry).
_WARNED = frozenset({ARCHITECTURES_NOT_ALLOWED, INCOMPATIBLE_NODE_AFFINITY,
                     INCOMPATIBLE_NODE_SELECTOR,
                     PARTIALLY_COMPATIBLE_AFFINITY, PLATFORMS_LEFT_OUT,
                     NO_SUPPORTED_PLATFORM_EVENT, PLACEMENT_FALLBACK})


@dataclass(frozen=True, slots=True)
class AdmissionPlacement:
    """The webhook's answer for a pod it places at admission.

    Attributes:
        patch: RFC 6902 ops for the AdmissionReview's ``request.object``: the affinity ops,
            labels (``scheduling-gate=removed``, ``node-affinity=set|not-set``), the decision
            annotation (with ``"path":"webhook"``) and, when the pod carries our gate,
            ``test`` + ``remove`` of it.
        warnings: the AdmissionReview ``warnings`` entries (``"podplacement: <message>"``),
            empty when the placement raised no user-facing Warning.
        outcome: the decision's outcome (``set``, ``not-set`` or ``no-supported-platform``).
        annotation: the decision annotation's compact JSON.
    """

    patch: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    outcome: Outcome
    annotation: str


def fast_path_applies(config: PlacementConfig | None) -> bool:
    """True when ``config`` lets the webhook place pods at admission: fast paths
    ``Enabled`` (``spec.admission.fastPaths``) and NUMA placement off (NUMA never takes a
    fast path: it needs the nodes' NRTs and in-flight holds)."""
    return (config is not None and config.admission_fast_paths == FAST_PATHS_ENABLED
            and not config.topology.enabled)


def _warning(message: str) -> str:
    line = WARNING_PREFIX + " ".join(message.split())
    return line if len(line) <= MAX_WARNING_CHARS else line[:MAX_WARNING_CHARS - 3] + "..."


def admission_placement(
    pod: Mapping[str, Any],
    images: Mapping[str, ImageLike | BaseException],
    config: PlacementConfig,
    *,
    policy: PlacementPolicy | None = None,
    revalidated: bool = False,
) -> AdmissionPlacement | None:
    """The placement of a pod being created, decided at admission as the controller would.

    Args:
        pod: the AdmissionReview's ``request.object`` (no resourceVersion; with or without
            our scheduling gate: the admission policy may have added it).
        images: per distinct image reference of the pod (as written), its inspection result
            (``imageinspect.ImageInfo``-like); an exception or a missing entry means unknown.
        config: the PodPlacementConfig in force.
        policy: the namespace's placement policy matching the pod
            (:func:`rules.policy.policy_for`), or None.
        revalidated: the caller checked the results of the images pulled with
            ``imagePullPolicy: Always`` against the registry for this admission (the tag's
            current digest, as the controller does for every such pod); without it those
            images leave the pod to the controller.

    Returns:
        None when the webhook must leave the pod to the controller: an image without a
        result, an image pulled with ``imagePullPolicy: Always`` not ``revalidated``, fast
        paths disabled or
        NUMA placement on (:func:`fast_path_applies`), an outcome other than
        ``set``/``not-set``/``no-supported-platform``, or an object that is not the shape
        the API gives. Otherwise the :class:`AdmissionPlacement`: the same affinity, labels
        and decision (plus ``"path":"webhook"``) as the controller's PATCH of the gated pod
        (the facts of :func:`rules.place.placement.placement_facts`: KEP-3838 narrowing
        rules and exact (os, architecture) pairs).

    None too when the admission patch would be over :data:`MAX_ADMISSION_PATCH_BYTES`.
    Never raises for odd pod specs (they give None).
    """
    if not fast_path_applies(config):
        return None
    for image, pull_always in unique_images(pod).items():
        result = images.get(image)
        if result is None or isinstance(result, BaseException):
            return None
        if pull_always and not revalidated:
            # imagePullPolicy Always: the controller revalidates the tag with the registry
            # for every pod; a cached result cannot (the admission policy gates these).
            return None
    return _decided_at_admission(
        PlacementInputs(pod, images, config, path=PATH_WEBHOOK, policy=policy), _PLACED)


def outage_placement(
    pod: Mapping[str, Any],
    images: Mapping[str, ImageLike | BaseException],
    config: PlacementConfig,
    *,
    give_up: str,
    policy: PlacementPolicy | None = None,
) -> AdmissionPlacement | None:
    """The placement of a pod being created while no controller runs: the webhook is the
    only one left to decide, so it decides once and for all (docs/how-it-decides.md "No
    cluster-wide stall when the controller is down").

    The controller's facts (:func:`rules.place.placement.placement_facts`), as in
    :func:`admission_placement`, with two differences. An image without a result (an
    exception or missing) means the controller's fallback at once
    (``give_up``: :func:`rules.place.fallback.fallback_requirement`, the fallback
    architecture when one applies and the fallback operating systems; outcome ``fallback``,
    a ``PlacementFallback`` warning). And ``fastPaths`` is not consulted, nor NUMA placement
    (no node view at admission: the architecture requirement only, as the controller's own
    NUMA fallback). The caller answers for freshness: results of images pulled with
    ``imagePullPolicy: Always`` must have been revalidated with the registry for this
    admission.

    Args:
        pod: the AdmissionReview's ``request.object`` (gated by the policy or not).
        images: per distinct image reference (as written), the result or the exception.
        config: the PodPlacementConfig in force.
        give_up: why no later attempt follows, for the fallback's reason (e.g. ``"at
            admission (no controller running)"``).
        policy: the namespace's placement policy matching the pod, or None.

    Returns:
        the :class:`AdmissionPlacement` (outcome ``set``, ``not-set``,
        ``no-supported-platform`` or ``fallback``), or None for an object that is not the
        shape the API gives. Never raises for odd pod specs.
    """
    return _decided_at_admission(
        PlacementInputs(pod, images, config, path=PATH_WEBHOOK, give_up=give_up, policy=policy),
        _PLACED | {Outcome.FALLBACK})


def admission_warnings(placement: Placement) -> tuple[str, ...]:
    """The AdmissionReview ``warnings`` of ``placement``: its Event when that is a Warning
    the user should see at ``kubectl`` time (``"podplacement: <message>"``, one line)."""
    return tuple(_warning(e.message) for e in placement.events
                 if e.type == WARNING and e.reason in _WARNED)


def _decided_at_admission(inputs: PlacementInputs,
                          outcomes: frozenset[Outcome]) -> AdmissionPlacement | None:
    """The facts of ``inputs.pod`` (:func:`rules.place.placement.placement_facts`, as the
    controller decides the gated pod) rendered as its admission patch; None for an outcome
    outside ``outcomes`` or an object that is not the shape the API gives."""
    pod = inputs.pod
    spec, meta = pod.get("spec", {}), pod.get("metadata", {})
    if (not isinstance(spec, Mapping) or not isinstance(meta, Mapping)
            or not isinstance(spec.get("schedulingGates", []), list)):
        return None
    placement = placement_facts(inputs)
    if placement.outcome not in outcomes or not placement.ungate:
        return None
    patch = admission_patch(pod, placement)
    if len(compact_json({"patch": patch})) > MAX_ADMISSION_PATCH_BYTES:
        return None
    return AdmissionPlacement(patch, admission_warnings(placement), placement.outcome,
                              placement.annotation)
