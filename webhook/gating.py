"""Pure gating rules: should a pod that is being created get podplacement's scheduling gate?

The webhook gates a pod only when the controller may have something to decide about it
(architecture from its images, a preferred-architecture term, or a NUMA placement). Every
"no" carries a short snake_case reason that the webhook uses as a metrics label. The input is
the pod as the AdmissionReview carries it (a plain dict, already defaulted by the API server);
fields with an unexpected type are treated as absent, so this module never raises on odd input.
No I/O, and no import from the controller except :mod:`controller.config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from controller.config import ARCH_LABEL, SCHEDULING_GATE, SYSTEM_NAMESPACES, PlacementConfig

#: Skip reasons (metrics label values), in the order the rules are checked.
REASON_NO_CONFIG = "no_config"
REASON_SYSTEM_NAMESPACE = "system_namespace"
REASON_OWN_NAMESPACE = "own_namespace"
REASON_NODE_NAME_SET = "node_name_set"
REASON_DAEMONSET = "daemonset"
REASON_ALREADY_GATED = "already_gated"
REASON_NOTHING_TO_DECIDE = "nothing_to_decide"
#: The reason that goes with ``gate=True``.
REASON_GATED = "gated"

SKIP_REASONS = (
    REASON_NO_CONFIG,
    REASON_SYSTEM_NAMESPACE,
    REASON_OWN_NAMESPACE,
    REASON_NODE_NAME_SET,
    REASON_DAEMONSET,
    REASON_ALREADY_GATED,
    REASON_NOTHING_TO_DECIDE,
)

# Resources that count for the QoS class (Kubernetes "supported QoS compute resources").
_QOS_RESOURCES = ("cpu", "memory")


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
    """Decide whether a pod being created gets the scheduling gate (issue 4, webhook rule 2).

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
        already carries our gate; nothing to decide (see :func:`needs_decision`).
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
    if _owned_by_daemonset(_map(pod.get("metadata"))):
        return _SKIPPED[REASON_DAEMONSET]
    if _has_gate(spec):
        return _SKIPPED[REASON_ALREADY_GATED]
    if not _needs_decision(pod, spec, config):
        return _SKIPPED[REASON_NOTHING_TO_DECIDE]
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


def has_gate(pod: Mapping[str, Any]) -> bool:
    """True when ``spec.schedulingGates`` already lists podplacement's gate."""
    return _has_gate(_map(pod.get("spec")))


def _has_gate(spec: Mapping[str, Any]) -> bool:
    for gate in _list(spec.get("schedulingGates")):
        if _map(gate).get("name") == SCHEDULING_GATE:
            return True
    return False


def needs_decision(pod: Mapping[str, Any], config: PlacementConfig) -> bool:
    """True when the controller may change something about this pod's placement.

    That is the case unless all three hold: the architecture is pinned by the user
    (:func:`arch_pinned`), there is no preferred-architecture term to add (the config has no
    preferred platforms, or the pod already has a preferred term on ``kubernetes.io/arch``),
    and no NUMA decision is possible (:func:`numa_relevant`).
    """
    return _needs_decision(pod, _map(pod.get("spec")), config)


def _needs_decision(pod: Mapping[str, Any], spec: Mapping[str, Any],
                    config: PlacementConfig) -> bool:
    if not _arch_pinned(spec):
        return True
    if config.preferred_platforms and not _has_arch_preference(spec):
        return True
    return numa_relevant(pod, config)


def arch_pinned(pod: Mapping[str, Any]) -> bool:
    """True when the user fixed the architecture: ``nodeSelector[kubernetes.io/arch]`` is set,
    or every required nodeSelectorTerm has a ``kubernetes.io/arch`` matchExpression.

    The second rule mirrors the controller's affinity merge (DESIGN.md): it ANDs the
    architecture requirement only into terms without such an expression, so when every term
    has one there is nothing for it to add. Required terms are ORed (Kubernetes nodeAffinity).
    """
    return _arch_pinned(_map(pod.get("spec")))


def _arch_pinned(spec: Mapping[str, Any]) -> bool:
    if ARCH_LABEL in _map(spec.get("nodeSelector")):
        return True
    required = _map(
        _map(_map(spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = _list(required.get("nodeSelectorTerms"))
    if not terms:
        return False
    for term in terms:
        if not _term_has_arch(term):
            return False
    return True


def _term_has_arch(term: Any) -> bool:
    for expr in _list(_map(term).get("matchExpressions")):
        if _map(expr).get("key") == ARCH_LABEL:
            return True
    return False


def has_arch_preference(pod: Mapping[str, Any]) -> bool:
    """True when a preferred nodeAffinity term has a ``kubernetes.io/arch`` expression."""
    return _has_arch_preference(_map(pod.get("spec")))


def _has_arch_preference(spec: Mapping[str, Any]) -> bool:
    affinity = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    for item in _list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution")):
        if _term_has_arch(_map(item).get("preference")):
            return True
    return False


def numa_relevant(pod: Mapping[str, Any], config: PlacementConfig) -> bool:
    """True when NUMA placement is enabled and the pod is Guaranteed or asks for an extended
    resource (the pods the kubelet's topology manager aligns; scheduler-plugins
    NodeResourceTopologyMatch filters only those)."""
    if not config.topology.enabled:
        return False
    return qos_class(pod) == "Guaranteed" or requests_extended_resource(pod)


def is_extended_resource(name: str) -> bool:
    """Kubernetes ``IsExtendedResourceName``: a domain-prefixed name outside
    ``kubernetes.io/`` that is not a ``requests.`` quota name (e.g. ``example.com/gpu``)."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def requests_extended_resource(pod: Mapping[str, Any]) -> bool:
    """True when any container or init container requests or limits an extended resource."""
    for container in _containers(pod):
        resources = _map(_map(container).get("resources"))
        for section in ("requests", "limits"):
            if any(
                isinstance(k, str) and is_extended_resource(k)
                for k in _map(resources.get(section))
            ):
                return True
    return False


def _containers(pod: Mapping[str, Any]) -> list[Any]:
    spec = _map(pod.get("spec"))
    return _list(spec.get("containers")) + _list(spec.get("initContainers"))


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class, computed like Kubernetes ``ComputePodQOS``.

    Returns ``"Guaranteed"``, ``"Burstable"`` or ``"BestEffort"``. Only ``cpu`` and ``memory``
    count. With pod-level ``spec.resources`` those decide; otherwise containers and init
    containers are summed (ephemeral containers have no resources). Guaranteed needs cpu and
    memory limits in every container (or at pod level) and summed requests equal to summed
    limits; a request left out where a limit is given defaults to the limit, as API defaulting
    does. Unparseable quantities count as absent.
    """
    spec = _map(pod.get("spec"))
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    pod_resources = _map(spec.get("resources"))
    if pod_resources.get("requests") or pod_resources.get("limits"):
        sources = [pod_resources]
    else:
        sources = [_map(_map(c).get("resources")) for c in _containers(pod)]
    for resources in sources:
        lims = _positive_quantities(_map(resources.get("limits")))
        reqs = _positive_quantities(_map(resources.get("requests")))
        for name, qty in lims.items():
            reqs.setdefault(name, qty)
        for name, qty in reqs.items():
            requests[name] = requests.get(name, Decimal(0)) + qty
        for name, qty in lims.items():
            limits[name] = limits.get(name, Decimal(0)) + qty
        if not all(name in lims for name in _QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and len(requests) == len(limits):
        if all(limits.get(name) == qty for name, qty in requests.items()):
            return "Guaranteed"
    return "Burstable"


def _positive_quantities(values: Mapping[str, Any]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for name in _QOS_RESOURCES:
        qty = parse_quantity(values.get(name))
        if qty is not None and qty > 0:
            out[name] = qty
    return out


_BINARY_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_DECIMAL_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
}


def parse_quantity(value: Any) -> Decimal | None:
    """Parse a Kubernetes resource.Quantity (``"100m"``, ``"1Gi"``, ``"1e3"``, ``2``) into a
    Decimal in base units; None when it is not a valid quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    try:
        if text[-2:] in _BINARY_SUFFIXES:
            return Decimal(text[:-2]) * _BINARY_SUFFIXES[text[-2:]]
        if text[-1:] in _DECIMAL_SUFFIXES and not text[-1:].isdigit():
            return Decimal(text[:-1]) * _DECIMAL_SUFFIXES[text[-1:]]
        number = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None
