"""The webhook's fast path: the controller's own placement decision, answered at admission.

A pod whose images the webhook already knows (from its per-credential cache,
:mod:`webhook.placecache`) can be placed in the AdmissionReview answer instead of being gated
and PATCHed by the controller later: no second write, which is what halves pod throughput
(README "The webhook after the policy"). The decision is not re-implemented here:
:func:`admission_placement` runs :func:`controller.plan.plan` on a gated copy of the pod,
exactly as the reconciler would on the gated pod, and turns the controller's PATCH into a
patch for the admission object: the optimistic-concurrency ``test`` goes (a pod being created
has no resourceVersion), so do the gate ops when the pod does not carry the gate yet (the API
server without the admission policy), and the decision annotation says ``"path":"webhook"``.
Only placements that leave the pod ungated and need no cluster view take this path: never
NUMA placement (it needs the nodes' NRTs and in-flight holds), never a fallback or retry.
While no controller runs, :func:`outage_placement` decides the same way but once and for all:
an image without a result means the controller's fallback at once, NUMA aside.
Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.config import FAST_PATHS_ENABLED, SCHEDULING_GATE, PlacementConfig
from controller.decision import (
    FALLBACK,
    INCOMPATIBLE_NODE_AFFINITY,
    INCOMPATIBLE_NODE_SELECTOR,
    NO_SUPPORTED_PLATFORM,
    NO_SUPPORTED_PLATFORM_EVENT,
    NOT_SET,
    PARTIALLY_COMPATIBLE_AFFINITY,
    PLACEMENT_FALLBACK,
    SET,
    WARNING,
    Outcome,
    unique_images,
)
from controller.plan import plan
from controller.platforms import ImageLike
from controller.podspec import gate_index, has_gate

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

#: The decision outcomes the webhook may answer with: the pod leaves admission ungated.
_PLACED = frozenset({SET, NOT_SET, NO_SUPPORTED_PLATFORM})
#: Warning reasons that mean "the pod cannot run (everywhere) where the user sent it", and
#: the fallback of :func:`outage_placement` (placed without its images' platforms): the ones
#: the user should see at ``kubectl`` time.
_WARNED = frozenset({INCOMPATIBLE_NODE_AFFINITY, INCOMPATIBLE_NODE_SELECTOR,
                     PARTIALLY_COMPATIBLE_AFFINITY, NO_SUPPORTED_PLATFORM_EVENT,
                     PLACEMENT_FALLBACK})
#: The resourceVersion of the gated copy the controller's decision is taken on.
_PLACEHOLDER_RV = "0"


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
    fast path)."""
    return (config is not None and config.admission_fast_paths == FAST_PATHS_ENABLED
            and not config.topology.enabled)


def _gated_copy(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """``pod`` as the controller would read it once gated: our gate in
    ``spec.schedulingGates`` (appended when absent) and a placeholder resourceVersion. The
    labels are left as they are, so the label ops of the decision apply to the admission
    object too (the controller would see ``scheduling-gate=gated``; both end in
    ``removed``). None when the spec is not the shape the API gives."""
    gated: dict[str, Any] = copy.deepcopy(dict(pod))
    spec = gated.setdefault("spec", {})
    meta = gated.setdefault("metadata", {})
    if not isinstance(spec, dict) or not isinstance(meta, dict):
        return None
    gates = spec.setdefault("schedulingGates", [])
    if not isinstance(gates, list):
        return None
    if not has_gate(gated):
        gates.append({"name": SCHEDULING_GATE})
    meta["resourceVersion"] = _PLACEHOLDER_RV
    return gated


def _warning(message: str) -> str:
    line = WARNING_PREFIX + " ".join(message.split())
    return line if len(line) <= MAX_WARNING_CHARS else line[:MAX_WARNING_CHARS - 3] + "..."


def admission_placement(
    pod: Mapping[str, Any],
    images: Mapping[str, ImageLike | BaseException],
    config: PlacementConfig,
    *,
    revalidated: bool = False,
) -> AdmissionPlacement | None:
    """The placement of a pod being created, decided at admission as the controller would.

    Args:
        pod: the AdmissionReview's ``request.object`` (no resourceVersion; with or without
            our scheduling gate: the admission policy may have added it).
        images: per distinct image reference of the pod (as written), its inspection result
            (``imageinspect.ImageInfo``-like); an exception or a missing entry means unknown.
        config: the PodPlacementConfig in force.
        revalidated: the caller checked the results of the images pulled with
            ``imagePullPolicy: Always`` against the registry for this admission (the tag's
            current digest, as the controller does for every such pod); without it those
            images leave the pod to the controller.

    Returns:
        None when the webhook must leave the pod to the controller: an image without a
        result, an image pulled with ``imagePullPolicy: Always`` not ``revalidated``, fast
        paths disabled or
        NUMA placement on (:func:`fast_path_applies`), an outcome other than
        ``set``/``not-set``/``no-supported-platform``, or a pod whose shape the
        controller's patch does not fit. Otherwise the
        :class:`AdmissionPlacement`: the same affinity, labels and decision (plus
        ``"path":"webhook"``) as the controller's PATCH of the gated pod (README "The
        webhook after the policy", KEP-3838 narrowing rules via
        :func:`controller.plan.plan`).

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
    return _decided_at_admission(pod, images, config, _PLACED, give_up=None)


def outage_placement(
    pod: Mapping[str, Any],
    images: Mapping[str, ImageLike | BaseException],
    config: PlacementConfig,
    *,
    give_up: str,
) -> AdmissionPlacement | None:
    """The placement of a pod being created while no controller runs: the webhook is the
    only one left to decide, so it decides once and for all (README "No cluster-wide stall
    when the controller is down").

    The controller's decision (:func:`controller.plan.plan`) on the gated copy, as in
    :func:`admission_placement`, with two differences. An image without a result (an
    exception or missing) means the controller's fallback at once
    (:func:`controller.decision.decide` with ``give_up``: ``fallbackArchitecture``
    required when set, else no architecture requirement; outcome ``fallback``, a
    ``PlacementFallback`` warning). And ``fastPaths`` is not consulted, nor NUMA placement
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

    Returns:
        the :class:`AdmissionPlacement` (outcome ``set``, ``not-set``,
        ``no-supported-platform`` or ``fallback``), or None for a pod whose shape the
        controller's patch does not fit. Never raises for odd pod specs.
    """
    return _decided_at_admission(pod, images, config, _PLACED | {FALLBACK},
                                 give_up=give_up)


def _decided_at_admission(
    pod: Mapping[str, Any],
    images: Mapping[str, ImageLike | BaseException],
    config: PlacementConfig,
    outcomes: frozenset[Outcome],
    *,
    give_up: str | None,
) -> AdmissionPlacement | None:
    """:func:`controller.plan.plan` on the gated copy of ``pod``, its PATCH turned into a
    patch of the admission object; None for an outcome outside ``outcomes`` or a pod whose
    shape the patch does not fit."""
    gated = _gated_copy(pod)
    if gated is None:
        return None
    decision = plan(gated, images, config, nodes=None, nrts={}, now=0.0, path=PATH_WEBHOOK,
                    give_up=give_up)
    if decision.outcome not in outcomes or not decision.ungate:
        return None
    ops = [dict(op) for op in decision.patch]
    if not ops or ops[0] != {"op": "test", "path": "/metadata/resourceVersion",
                             "value": _PLACEHOLDER_RV}:
        return None
    ops = ops[1:]
    if not has_gate(pod):
        # The gate exists only on the copy: its trailing test + remove must not reach the
        # admission object (the index would name another gate, or nothing).
        index = gate_index(gated)
        tail = [{"op": "test", "path": f"/spec/schedulingGates/{index}/name",
                 "value": SCHEDULING_GATE},
                {"op": "remove", "path": f"/spec/schedulingGates/{index}"}]
        if ops[-2:] != tail:
            return None
        ops = ops[:-2]
    warnings = tuple(_warning(e.message) for e in decision.events
                     if e.type == WARNING and e.reason in _WARNED)
    return AdmissionPlacement(tuple(ops), warnings, decision.outcome, decision.annotation)
