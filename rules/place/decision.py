"""The controller's decision for one gated pod: the placement's facts and the PATCH that
writes them (pure, no I/O).

:func:`decide` is what the reconciler, ``explain`` and the tests call through
:func:`rules.place.plan.plan`: the facts of
:func:`rules.place.placement.placement_facts` (the rules, in small named steps, are
described there), rendered as the controller's one JSON patch by
:func:`rules.place.render.controller_patch`. The reconciler does the reading and
the writing (STYLE.md, controller-runtime habits).

The names of the decision vocabulary (:class:`Outcome`, the Event reasons, ``EventSpec``,
``unique_images``) live in :mod:`rules.place.placement` and are re-exported here for the
modules that import them from the decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from podplacement.rules.config import PlacementConfig
from podplacement.rules.place.placement import (
    IMAGE_INSPECTION_FAILED,
    INCOMPATIBLE_NODE_AFFINITY,
    INCOMPATIBLE_NODE_SELECTOR,
    INVALID_PULL_SECRET,
    MAX_POD_IMAGES,
    NO_SUPPORTED_PLATFORM_EVENT,
    NORMAL,
    PARTIALLY_COMPATIBLE_AFFINITY,
    PLACEMENT_DECIDED,
    PLACEMENT_FALLBACK,
    PLATFORM_NOT_IN_CLUSTER,
    PLATFORMS_LEFT_OUT,
    REASON_NOT_GATED,
    WAITING_FOR_NUMA,
    WARNING,
    ContainerImage,
    EventSpec,
    NumaLike,
    Outcome,
    Placement,
    PlacementInputs,
    event_message,
    fallback_release,
    placement_facts,
    pod_images,
    short_error,
    too_many_images,
    ungate_only,
    unique_images,
)
from podplacement.rules.place.render import controller_patch
from podplacement.rules.podspec import has_gate
from podplacement.rules.policy import PlacementPolicy

__all__ = [
    "IMAGE_INSPECTION_FAILED",
    "INCOMPATIBLE_NODE_AFFINITY",
    "INCOMPATIBLE_NODE_SELECTOR",
    "INVALID_PULL_SECRET",
    "MAX_POD_IMAGES",
    "NORMAL",
    "NO_SUPPORTED_PLATFORM_EVENT",
    "PARTIALLY_COMPATIBLE_AFFINITY",
    "PLACEMENT_DECIDED",
    "PLACEMENT_FALLBACK",
    "PLATFORMS_LEFT_OUT",
    "PLATFORM_NOT_IN_CLUSTER",
    "WAITING_FOR_NUMA",
    "WARNING",
    "ContainerImage",
    "Decision",
    "EventSpec",
    "NumaLike",
    "Outcome",
    "PlacementInputs",
    "decide",
    "fallback_ungate",
    "invalid_pull_secret_event",
    "plain_ungate",
    "pod_images",
    "too_many_images",
    "unique_images",
    "unrecorded",
]



@dataclass(frozen=True, slots=True)
class Decision(Placement):
    """The decision for one gated pod: the :class:`~rules.place.placement.Placement` facts
    (outcome, reason, supported pairs, restriction per term, preferred terms, labels,
    annotation facts, warnings and the Event) and ``patch``, the controller's JSON-patch
    ops writing them (:func:`rules.place.render.controller_patch`; empty when nothing is
    written: ``retry``, ``skip``, a pod already waiting for NUMA candidates)."""

    patch: tuple[dict[str, Any], ...] = ()


def _rendered(pod: Mapping[str, Any], placement: Placement) -> Decision:
    """``placement`` and its controller PATCH for ``pod``."""
    facts = {f.name: getattr(placement, f.name) for f in fields(placement)}
    return Decision(**facts, patch=controller_patch(pod, placement))


def invalid_pull_secret_event(namespace: str, name: str, error: BaseException) -> EventSpec:
    """The Warning ``InvalidPullSecret`` for a pull Secret whose payload cannot be decoded
    (``imageinspect.CredentialError``; its text names the entry, never the secret's data),
    or whose name may not be a Secret's (``kubeclient.InvalidPathSegment``: ``..``, ``a/b``;
    never read): the secret is skipped and the images are inspected with the remaining
    credentials. A name that is not a plain printable one is shown quoted and cut to 64
    characters (it is the pod creator's text)."""
    shown = name if name.isprintable() and len(name) <= 253 else repr(name[:64])
    return EventSpec(WARNING, INVALID_PULL_SECRET, event_message(
        f"pull secret {namespace}/{shown} is unusable and was skipped: {short_error(error)}"
    ), "Inspect")


def decide(inputs: PlacementInputs) -> Decision:
    """Decide placement for the gated ``inputs.pod``: ``skip`` when it no longer carries our
    gate, else the facts of :func:`rules.place.placement.placement_facts` (the same
    ``inputs``) with the controller's PATCH.

    Args:
        inputs: what the decision reads (:class:`rules.place.placement.PlacementInputs`;
            its ``pod`` is the gated Pod, with ``metadata.resourceVersion``).

    Returns:
        a :class:`Decision`. Never raises for odd pod specs: they end in an ungate.

    Raises:
        ValueError: something is written and the pod has no ``metadata.resourceVersion``.
    """
    if not has_gate(inputs.pod):
        return Decision(Outcome.SKIP, REASON_NOT_GATED)
    return _rendered(inputs.pod, placement_facts(inputs))


def fallback_ungate(pod: Mapping[str, Any], reason: str, config: PlacementConfig,
                    policy: PlacementPolicy | None = None) -> Decision:
    """A decision that removes our gate without the images' platforms and keeps what is
    known (:func:`rules.place.placement.fallback_release`: the fallback architecture
    when one applies, the fallback operating systems): for the ordered uninstall and the
    stand-down (pods not placed within their deadline) and for a pod whose decision failed.
    ``skip`` when the pod no longer carries our gate.

    Raises:
        ValueError: ``pod`` has no ``metadata.resourceVersion``.
    """
    if not has_gate(pod):
        return Decision(Outcome.SKIP, REASON_NOT_GATED)
    return _rendered(pod, fallback_release(pod, reason, config, policy))


def unrecorded(decision: Decision, pod: Mapping[str, Any]) -> Decision:
    """``decision`` re-rendered for ``pod`` without the ``podplacement.io/decision``
    annotation (same affinity, labels, gate removal and Events): the controller's try after
    the API server refused a release because of its size (HTTP 413/422; the pod's own
    annotations may leave no room)."""
    facts = {f.name: getattr(decision, f.name) for f in fields(Placement)}
    return _rendered(pod, Placement(**{**facts, "record": {}}))


def plain_ungate(pod: Mapping[str, Any], reason: str) -> Decision:
    """A decision that only removes our gate (labels + annotation say why): the last resort
    when the API server refused even :func:`fallback_ungate`'s affinity, or when it could not
    be computed (:func:`rules.place.placement.ungate_only`)."""
    if not has_gate(pod):
        return Decision(Outcome.SKIP, REASON_NOT_GATED)
    return _rendered(pod, ungate_only(pod, reason))
