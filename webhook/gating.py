"""Pure gating rules: should a pod that is being created get podplacement's scheduling gate?

The webhook gates every pod the controller is responsible for: even a pod whose
architecture is pinned by the user may be pinned to an architecture its images can't run
on, and only the images tell. Every
"no" carries a short snake_case reason that the webhook uses as a metrics label. The input is
the pod as the AdmissionReview carries it (a plain dict, already defaulted by the API server);
fields with an unexpected type are treated as absent, so this module never raises on odd input.
No I/O, and no import from the controller; the rules it shares are the placement rules':
:mod:`rules.config`,
:mod:`rules.admit.predicates` (the pod-level skip rules, written next to the CEL of the
admission policy's ``matchConditions``) and :mod:`rules.scope` (the pods the product
leaves alone, a rule the escape monitor shares).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.rules.admit.predicates import (
    REASON_ALREADY_GATED,
    REASON_NO_CONFIG,
    REASON_NODE_NAME_SET,
    gate_skip_reason,
)
from podplacement.rules.config import (
    PlacementConfig,
)
from podplacement.rules.scope import (
    REASON_DAEMONSET,
    REASON_OWN_NAMESPACE,
    REASON_SYSTEM_NAMESPACE,
    is_daemonset_pod,
)

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

#: Skip reasons (metrics label values), in the order the rules are checked
#: (:func:`rules.admit.predicates.gate_skip_reason`; the namespace and DaemonSet reasons
#: are :mod:`rules.scope`'s).
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


def should_gate(
    pod: Mapping[str, Any],
    *,
    namespace: str,
    config: PlacementConfig | None,
    own_namespace: str,
) -> GateDecision:
    """Decide whether a pod being created gets the scheduling gate (docs/how-it-decides.md
    "The webhook: which pods get the gate").

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
        admission policy placed reaches the webhook only while no place policy is in force
        with its params object (the configuration's objectSelector,
        :func:`rules.admit.webhookconfig.object_selector`), and it is then placed
        again like any other pod (a mark a pod's creator set never skips placement,
        docs/design.md).
        Every other pod is gated: whether its placement needs a change (an architecture
        requirement, a Warning for a pin its images can't run on, a NUMA placement) depends
        on its images, which only the controller inspects.
    """
    skipped = gate_skip_reason(pod, namespace=namespace, own_namespace=own_namespace,
                               config=config)
    return GATED if skipped is None else _SKIPPED[skipped]
