"""Pure gating rules: should a pod that is being created get podplacement's scheduling gate?

The webhook gates every pod the controller is responsible for: even a pod whose
architecture is pinned by the user may be pinned to an architecture its images can't run
on, and only the images tell. Every
"no" carries a short snake_case reason that the webhook uses as a metrics label. The input is
the pod as the AdmissionReview carries it (a plain dict, already defaulted by the API server);
fields with an unexpected type are treated as absent, so this module never raises on odd input.
No I/O, and no import from the controller except :mod:`controller.core.config` and the pure
:mod:`controller.core.podspec` (which holds the gate-presence rule, shared with the controller).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.controller.core.config import (
    SYSTEM_NAMESPACES,
    PlacementConfig,
)
from podplacement.controller.core.podspec import has_gate

__all__ = [
    "GATED",
    "REASON_ALREADY_GATED",
    "REASON_DAEMONSET",
    "REASON_GATED",
    "REASON_NODE_NAME_SET",
    "REASON_NO_CONFIG",
    "REASON_OWN_NAMESPACE",
    "REASON_SYSTEM_NAMESPACE",
    "SKIP_REASONS",
    "GateDecision",
    "is_daemonset_pod",
    "should_gate",
]

#: Skip reasons (metrics label values), in the order the rules are checked.
REASON_NO_CONFIG = "no_config"
REASON_SYSTEM_NAMESPACE = "system_namespace"
REASON_OWN_NAMESPACE = "own_namespace"
REASON_NODE_NAME_SET = "node_name_set"
REASON_DAEMONSET = "daemonset"
REASON_ALREADY_GATED = "already_gated"
#: The reason that goes with ``gate=True``.
REASON_GATED = "gated"

SKIP_REASONS = (
    REASON_NO_CONFIG,
    REASON_SYSTEM_NAMESPACE,
    REASON_OWN_NAMESPACE,
    REASON_NODE_NAME_SET,
    REASON_DAEMONSET,
    REASON_ALREADY_GATED,
)



@dataclass(frozen=True, slots=True)
class GateDecision:
    """The webhook's verdict for one pod.

    Attributes:
        gate: True when the pod must get the scheduling gate and the gate label.
        reason: ``"gated"`` when ``gate`` is true, else one of :data:`SKIP_REASONS`.
    """

    gate: bool
    reason: str


GATED = GateDecision(True, REASON_GATED)
_SKIPPED = {reason: GateDecision(False, reason) for reason in SKIP_REASONS}


# Shared read-only stand-ins for an absent or mistyped field (never mutated).
_NO_MAP: Mapping[str, Any] = {}
_NO_LIST: list[Any] = []


def _map(value: Any) -> Mapping[str, Any]:
    # ``type(...) is dict`` first: parsed JSON is always a dict, and the Mapping ABC check
    # costs several times more (this runs ~30 times per admission).
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return _NO_MAP


def _list(value: Any) -> list[Any]:
    return value if type(value) is list or isinstance(value, list) else _NO_LIST


def should_gate(
    pod: Mapping[str, Any],
    *,
    namespace: str,
    config: PlacementConfig | None,
    own_namespace: str,
) -> GateDecision:
    """Decide whether a pod being created gets the scheduling gate (README "The webhook:
    which pods get the gate").

    Args:
        pod: the Pod object of the AdmissionReview (``request.object``), a plain dict.
        namespace: the pod's namespace (``request.namespace``).
        config: the parsed PodPlacementConfig ``cluster``; None when it does not exist, in
            which case nothing is gated.
        own_namespace: the namespace the controller and webhook run in (never gated).

    Returns:
        A :class:`GateDecision`. Rules, first match wins: no config; a system namespace
        (``kube-system``, ``kube-public``, ``kube-node-lease``); the own namespace;
        ``spec.nodeName`` set (the scheduler is bypassed, a gate would be pointless); the
        controlling ownerReference is a DaemonSet (its pods are bound per node); the pod
        already carries our gate. No label or annotation of the pod is trusted: a pod the
        admission policy placed reaches the webhook only when the configuration's
        matchCondition did not recognise the current params object's mark
        (:func:`controller.core.webhookconfig.match_conditions`), and it is then placed
        again like any other pod (a mark a pod's creator set never skips placement,
        DESIGN.md).
        Every other pod is gated: whether its placement needs a change (an architecture
        requirement, a Warning for a pin its images can't run on, a NUMA placement) depends
        on its images, which only the controller inspects.
    """
    if config is None:
        return _SKIPPED[REASON_NO_CONFIG]
    if namespace in SYSTEM_NAMESPACES:
        return _SKIPPED[REASON_SYSTEM_NAMESPACE]
    if namespace == own_namespace:
        return _SKIPPED[REASON_OWN_NAMESPACE]
    spec = _map(pod.get("spec"))
    if spec.get("nodeName"):
        return _SKIPPED[REASON_NODE_NAME_SET]
    metadata = _map(pod.get("metadata"))
    if _owned_by_daemonset(metadata):
        return _SKIPPED[REASON_DAEMONSET]
    if has_gate(pod):
        return _SKIPPED[REASON_ALREADY_GATED]
    return GATED


# The public predicates take the pod; should_gate calls their private forms with the parts
# it already extracted (this runs on every admission: fewer lookups and calls).


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    """True when an ownerReference with ``controller: true`` has kind ``DaemonSet``."""
    return _owned_by_daemonset(_map(pod.get("metadata")))


def _owned_by_daemonset(metadata: Mapping[str, Any]) -> bool:
    for ref in _list(metadata.get("ownerReferences")):
        ref = _map(ref)
        if ref.get("controller") is True and ref.get("kind") == "DaemonSet":
            return True
    return False

