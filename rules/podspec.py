"""The pod rules shared by the controller and the webhook (pure: no I/O, plain dicts in).

One home for rules that used to be copied:

* :func:`parse_quantity` / :func:`quantity_exact` / :func:`quantity_milli`: Kubernetes
  ``resource.Quantity`` syntax (apimachinery ``pkg/api/resource``);
* :func:`qos_class`: the pod's QoS class (kubernetes ``pkg/apis/core/helper/qos``
  ``ComputePodQOS`` on the defaulted pod);
* :func:`iter_containers` / :func:`effective_requests`: the scheduler's pod requests
  (k8s component-helpers ``resource.PodRequests``, KEP-753 sidecars);
* :func:`gate_index` / :func:`has_gate`: presence of podplacement's scheduling gate;
* :func:`escape_token` / :func:`unescape_pointer`: JSON pointers (RFC 6901);
* :func:`node_eligible`: which nodes are placement candidates for a pod;
* :func:`pull_secret_refs`: which pull Secrets a pod's images are pulled with.

The webhook imports this module, so it imports nothing from the controller except
:mod:`rules.config` (and the standard library).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from podplacement.rules.config import (
    ARCH_LABEL,
    GATE_LABEL,
    GATE_LABEL_GATED,
    LINUX,
    OS_LABEL,
    SCHEDULING_GATE,
    WINDOWS_BUILD_LABEL,
    PlacementConfig,
)

CPU = "cpu"
MEMORY = "memory"

GUARANTEED = "Guaranteed"
BURSTABLE = "Burstable"
BEST_EFFORT = "BestEffort"

#: Resources that decide the QoS class (qos.go ``supportedQoSComputeResources``).
QOS_RESOURCES = (CPU, MEMORY)
_HUGEPAGES_PREFIX = "hugepages-"

# --- quantities ----------------------------------------------------------------------------

_MULTIPLIERS: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
# ASCII digits only ([0-9], never \d: Python's \d matches any Unicode digit), no "_" (int()
# and Fraction() accept "1_000", the API server does not). The exponent form is tried before
# the bare "E" (exa) suffix, as the apimachinery parser does.
_QUANTITY_RE = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?",
    re.ASCII,
)
# Go's strings.TrimSpace (Quantity.UnmarshalJSON trims before parsing): ASCII whitespace here.
_SPACE = " \t\n\r\v\f"
# Exponents beyond this are refused instead of building huge integers (apimachinery refuses
# values whose scale does not fit either).
_MAX_EXPONENT = 1000


class QuantityError(ValueError):
    """A resource quantity does not follow the Kubernetes quantity grammar.

    Attributes:
        text: the offending value as given.
    """

    def __init__(self, text: object) -> None:
        super().__init__(f"invalid resource quantity {text!r}")
        self.text = text


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    match = _QUANTITY_RE.fullmatch(text.strip(_SPACE))
    if not match:
        raise QuantityError(text)
    sign, number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent is not None:
        power = int(exponent)
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(text)
        value *= Fraction(10) ** power
    else:
        value *= _MULTIPLIERS[suffix or ""]
    return -value if sign == "-" else value


def quantity_exact(value: object) -> Fraction:
    """The exact value of a quantity, in base units (cores for cpu, bytes for memory).

    Args:
        value: a quantity string (``"500m"``, ``"2Gi"``, ``"1e3"``, ``" 1 "``: surrounding
            ASCII whitespace is trimmed like ``Quantity.UnmarshalJSON``) or a JSON number
            (int or finite float).
    Returns:
        the value as a :class:`~fractions.Fraction` (no rounding).
    Raises:
        QuantityError: not a Kubernetes quantity (empty, ``"1_000"``, ``"NaN"``, ``"Inf"``,
            non-ASCII digits, a bool, None, ...).
    Rule: apimachinery ``pkg/api/resource`` ``ParseQuantity`` grammar: optional sign, digits
    with an optional fraction, then a binary suffix (Ki..Ei), a decimal suffix (n u m "" k M G
    T P E) or a decimal exponent (``e``/``E`` and a signed integer).
    """
    if isinstance(value, bool):
        raise QuantityError(value)
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, str):
        return _parse_text(value)
    if isinstance(value, float):
        # repr() of nan/inf is "nan"/"inf": refused by the grammar like any other garbage
        return _parse_text(repr(value))
    raise QuantityError(value)


def parse_quantity(resource: str, value: object) -> int:
    """Parse a quantity into an integer: millicores for ``cpu``, base units otherwise.

    Args:
        resource: the resource name (decides the unit).
        value: a quantity string (``"500m"``, ``"2Gi"``, ``"1e3"``) or a JSON number.
    Returns:
        the amount, rounded up like ``Quantity.MilliValue()`` (cpu) / ``Quantity.Value()``.
    Raises:
        QuantityError: the value is not a Kubernetes quantity (see :func:`quantity_exact`).
    """
    if isinstance(value, str):
        return _parse_str(resource == CPU, value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000 if resource == CPU else value
    exact = quantity_exact(value)
    return _ceil(exact * 1000) if resource == CPU else _ceil(exact)


@lru_cache(maxsize=4096)
def _parse_str(cpu: bool, text: str) -> int:
    # Pods of one workload repeat the same few strings: skip the Fraction arithmetic.
    exact = _parse_text(text)
    return _ceil(exact * 1000) if cpu else _ceil(exact)


def quantity_milli(value: object) -> int:
    """A quantity in thousandths of its base unit, rounded up: the value the API server
    stores (``SetDefaults_ResourceList`` rounds every request and limit up to milli scale:
    ``"100n"`` cpu is stored as ``"1m"``, ``"1.5"`` memory as ``"1500m"``).

    Raises:
        QuantityError: not a Kubernetes quantity (see :func:`quantity_exact`).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000
    return _ceil(quantity_exact(value) * 1000)


# --- containers and requests ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerRequests:
    """One container's requests.

    Attributes:
        name: the container name.
        kind: ``"init"``, ``"sidecar"`` (init container with ``restartPolicy: Always``) or
            ``"app"``.
        requests: resource name -> amount (:func:`parse_quantity` units: cpu in millicores);
            zero-valued entries kept.
    """

    name: str
    kind: str
    requests: Mapping[str, int]


def _map(value: Any) -> Mapping[str, Any]:
    # ``type(...) is dict`` first: decoded JSON is always a dict, the ABC check is slower.
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return {}


def _resources(container: Mapping[str, Any], key: str) -> dict[str, int]:
    raw = (container.get("resources") or {}).get(key) or {}
    return {name: parse_quantity(name, value) for name, value in raw.items()}


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    # API defaulting (SetDefaults_Pod): a request that is absent takes the limit's value.
    out = _resources(container, "limits")
    out.update(_resources(container, "requests"))
    return out


def iter_containers(pod: Mapping[str, Any]) -> Iterator[ContainerRequests]:
    """Yield init containers (kind ``init``/``sidecar``) in order, then app containers.

    Requests absent from a container take its limits (the API server's defaulting), so a pod
    read from a YAML file is judged like the stored pod would be.

    Raises:
        QuantityError: a request or limit is not a valid quantity.
    """
    spec = pod.get("spec") or {}
    for container in spec.get("initContainers") or ():
        kind = "sidecar" if container.get("restartPolicy") == "Always" else "init"
        yield ContainerRequests(str(container.get("name", "")), kind,
                                _container_requests(container))
    for container in spec.get("containers") or ():
        yield ContainerRequests(str(container.get("name", "")), "app",
                                _container_requests(container))


def _aggregate(containers: Iterator[ContainerRequests]) -> dict[str, int]:
    """``max(sum of app containers + sidecars, each init container + the sidecars started
    before it)`` per resource (component-helpers ``AggregateContainerRequests``)."""
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for ctr in containers:
        if ctr.kind == "app":
            for name, amount in ctr.requests.items():
                total[name] = total.get(name, 0) + amount
            continue
        if ctr.kind == "sidecar":
            for name, amount in ctr.requests.items():
                total[name] = total.get(name, 0) + amount
                sidecars[name] = sidecars.get(name, 0) + amount
            current = dict(sidecars)
        else:
            current = dict(sidecars)
            for name, amount in ctr.requests.items():
                current[name] = current.get(name, 0) + amount
        for name, amount in current.items():
            if amount > init_max.get(name, -1):
                init_max[name] = amount
    for name, amount in init_max.items():
        if amount > total.get(name, -1):
            total[name] = amount
    return total


def effective_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's effective request per resource, as the scheduler accounts it.

    Returns:
        resource name -> amount (:func:`parse_quantity` units: cpu in millicores, others in
        base units, rounded up); zero-valued names are kept. The amount is ``max(sum of app
        containers + sidecars, largest init container + the sidecars started before it) +
        spec.overhead``: k8s component-helpers ``resource.PodRequests``, where restartable
        init containers (``restartPolicy: Always``, KEP-753) count like app containers.
    Raises:
        QuantityError: a request, limit or overhead is not a valid quantity.
    """
    total = _aggregate(iter_containers(pod))
    overhead = (pod.get("spec") or {}).get("overhead") or {}
    for name, value in overhead.items():
        total[name] = total.get(name, 0) + parse_quantity(name, value)
    return total


# --- QoS ----------------------------------------------------------------------------------


def _qos_amounts(raw: Any) -> dict[str, int]:
    """cpu and memory of a resource list in milli-units (as stored), zero and below dropped."""
    out: dict[str, int] = {}
    for name, value in _map(raw).items():
        if name in QOS_RESOURCES:
            amount = quantity_milli(value)
            if amount > 0:  # qos.go: only quantity.Cmp(zeroQuantity) == 1 counts
                out[name] = amount
    return out


def _milli_requests(container: Mapping[str, Any]) -> dict[str, int]:
    res = _map(container.get("resources"))
    out = {name: quantity_milli(v) for name, v in _map(res.get("limits")).items()
           if name in QOS_RESOURCES}
    out.update({name: quantity_milli(v) for name, v in _map(res.get("requests")).items()
                if name in QOS_RESOURCES})
    return out


def _pod_level_requests(spec: Mapping[str, Any], pod_level: Mapping[str, Any]) -> dict[str, int]:
    """Pod-level cpu/memory requests after ``defaultPodRequests`` (KEP-2837): with pod-level
    limits set, an absent pod-level request takes the containers' aggregated request, else
    the pod-level limit."""
    raw_requests = _map(pod_level.get("requests"))
    requests = {name: quantity_milli(v) for name, v in raw_requests.items()
                if name in QOS_RESOURCES}
    limits = _map(pod_level.get("limits"))
    if not limits:
        return requests
    containers = [
        ContainerRequests("", "sidecar" if c.get("restartPolicy") == "Always" else "init",
                          _milli_requests(c))
        for c in spec.get("initContainers") or ()
    ] + [ContainerRequests("", "app", _milli_requests(c)) for c in spec.get("containers") or ()]
    aggregated = _aggregate(iter(containers))
    for name in QOS_RESOURCES:
        if name not in requests:
            if name in aggregated:
                requests[name] = aggregated[name]
            elif name in limits:
                requests[name] = quantity_milli(limits[name])
    return requests


def compute_qos_class(pod: Mapping[str, Any]) -> str:
    """The QoS class the API server computes for ``pod`` at creation, ignoring ``status``.

    Args:
        pod: a Pod dict, defaulted or not (a pod read from a YAML file is judged like the
            stored pod would be).
    Returns:
        ``"Guaranteed"``, ``"Burstable"`` or ``"BestEffort"``.
    Raises:
        QuantityError: a request or limit is not a valid quantity.
    Rule: kubernetes ``pkg/apis/core/helper/qos`` ``ComputePodQOS`` run on the pod after the
    API server's defaulting (``pkg/apis/core/v1`` ``SetDefaults_Pod``, as of v1.36):

    * only cpu and memory count, and only quantities above zero; quantities are compared as
      stored, rounded up to milli scale (``SetDefaults_ResourceList``);
    * a container's *absent* request takes its limit (``requests: {memory: "0"}`` stays 0);
    * pod-level ``spec.resources`` (KEP-2837), when present, decides alone; an absent
      pod-level request is defaulted (when pod-level limits exist) from the containers'
      aggregated request, else from the pod-level limit (``defaultPodRequests``);
    * otherwise every container, init containers included, is summed; Guaranteed needs cpu
      and memory limits on every container;
    * no request and no limit at all: BestEffort; requests equal to limits for every
      resource (and the same resources): Guaranteed; else Burstable.
    """
    spec = _map(pod.get("spec"))
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    pod_level = spec.get("resources")
    # PodLevelResources on, PodLevelResourcesFixKubeletQOSClass off (v1.36 defaults): any
    # spec.resources object, even {}, takes the pod-level branch (checked on a real server).
    if pod_level is not None:
        pod_level = _map(pod_level)
        requests = {k: v for k, v in _pod_level_requests(spec, pod_level).items() if v > 0}
        raw_limits = _map(pod_level.get("limits"))
        if raw_limits:
            limits = _qos_amounts(raw_limits)
            if not all(name in limits for name in QOS_RESOURCES):
                guaranteed = False
    else:
        for container in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ())):
            container_limits = _qos_amounts(_map(container.get("resources")).get("limits"))
            for name, amount in _milli_requests(container).items():
                if amount > 0:
                    requests[name] = requests.get(name, 0) + amount
            for name, amount in container_limits.items():
                limits[name] = limits.get(name, 0) + amount
            if not all(name in container_limits for name in QOS_RESOURCES):
                guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and all(limits.get(name) == amount for name, amount in requests.items()):
        if len(requests) == len(limits):
            return GUARANTEED
    return BURSTABLE


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class: ``status.qosClass`` when set, else :func:`compute_qos_class`.

    Returns:
        ``"Guaranteed"``, ``"Burstable"`` or ``"BestEffort"``.
    Raises:
        QuantityError: a request or limit is not a valid quantity (only when computed).
    Rule: kubernetes ``pkg/apis/core/helper/qos`` ``GetPodQOS``.
    """
    status_qos = _map(pod.get("status")).get("qosClass")
    if status_qos:
        return str(status_qos)
    return compute_qos_class(pod)


# --- the scheduling gate -------------------------------------------------------------------


def gate_index(pod: Mapping[str, Any], gate: str = SCHEDULING_GATE) -> int | None:
    """Index of ``gate`` in the pod's ``spec.schedulingGates``, or None when absent.

    Args:
        pod: a Pod dict; fields of an unexpected type count as absent (never raises).
        gate: the gate name (default: podplacement's
            :data:`rules.config.SCHEDULING_GATE`).
    Returns:
        the index of the first entry whose ``name`` is ``gate``, or None.
    Rule: ``spec.schedulingGates`` is a list of ``{"name": ...}`` (KEP-3521).
    """
    spec = pod.get("spec")
    if type(spec) is not dict and not isinstance(spec, Mapping):
        return None
    gates = spec.get("schedulingGates")
    if type(gates) is not list and not isinstance(gates, list | tuple):
        return None
    for i, entry in enumerate(gates):
        if (type(entry) is dict or isinstance(entry, Mapping)) and entry.get("name") == gate:
            return i
    return None


def has_gate(pod: Mapping[str, Any], gate: str = SCHEDULING_GATE) -> bool:
    """True when the pod's ``spec.schedulingGates`` lists ``gate`` (see :func:`gate_index`;
    never raises on odd input)."""
    return gate_index(pod, gate) is not None


def lost_gate_label(pod: Mapping[str, Any]) -> bool:
    """True when ``pod`` carries our gate but its label ``podplacement.io/scheduling-gate`` is
    not ``gated`` (another value, or none): the controller's watch of ``=gated`` no longer
    sees it, so the label must be set again (a pod's creator can update the label of a gated
    pod). Never raises."""
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    if isinstance(labels, Mapping) and labels.get(GATE_LABEL) == GATE_LABEL_GATED:
        return False
    return has_gate(pod)


def gate_label_ops(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch ops that set the label ``podplacement.io/scheduling-gate=gated`` on a pod
    that carries our gate (the label the controller watches; a pod's creator may have set
    another value, or none), ``[]`` when it says ``gated`` already. The labels map is
    created when absent. Used at admission by the webhook and by the controller."""
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    if isinstance(labels, Mapping):
        if labels.get(GATE_LABEL) == GATE_LABEL_GATED:
            return []
        return [{"op": "add", "path": "/metadata/labels/" + escape_token(GATE_LABEL),
                 "value": GATE_LABEL_GATED}]
    return [{"op": "add", "path": "/metadata/labels", "value": {GATE_LABEL: GATE_LABEL_GATED}}]


# --- JSON pointers ------------------------------------------------------------------------


def escape_token(token: str) -> str:
    """Escape one JSON-pointer reference token: ``~`` → ``~0``, then ``/`` → ``~1``
    (RFC 6901 section 3). ``"a~b/c"`` → ``"a~0b~1c"``."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape_pointer(pointer: str) -> list[str]:
    """Split a JSON pointer into its unescaped reference tokens (RFC 6901 sections 3-4:
    ``~1`` → ``/`` first, then ``~0`` → ``~``, so ``~01`` is ``~1``).

    Returns:
        the tokens; ``[]`` for ``""`` (the whole document).
    Raises:
        ValueError: the pointer is neither empty nor starts with ``/``.
    """
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"bad JSON pointer {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


# --- nodes -------------------------------------------------------------------------------


def node_ineligibility(node: Mapping[str, Any], node_selector: Mapping[str, Any],
                       platforms: Collection[tuple[str, str]] | None,
                       builds: Mapping[tuple[str, str], Sequence[str]] | None = None
                       ) -> str | None:
    """Why ``node`` is not a placement candidate for a pod, or None when it is.

    Args:
        node: a Node dict.
        node_selector: the pod's ``spec.nodeSelector`` (label -> value, all must match).
        platforms: the (os, architecture) pairs every image of the pod supports; None when
            not known (no platform constraint); empty when the images share none.
        builds: per windows pair, the builds every image supports
            (:attr:`rules.platforms.PlatformSet.builds`); a pair not in it: any build.
    Returns:
        None when every ``node_selector`` label equals the node's label and, when
        ``platforms`` is not None, the node's pair (``kubernetes.io/os``, ``"linux"`` when
        unlabelled; ``kubernetes.io/arch``) is one of ``platforms``. Otherwise the reason:
        ``"nodeSelector k=v does not match (actual|unset)"`` (first mismatching key) or
        ``"platform os/arch is not supported by every image (supported: a/b, ...)"`` or
        ``"windows build B not supported (supported: b1, ...)"`` (the node's
        ``node.kubernetes.io/windows-build`` is not one of its pair's ``builds``).
    Rule: the pod's nodeSelector (scheduler NodeAffinity plugin, exact label match) and the
    architecture decision podplacement injects (``kubernetes.io/os`` / ``kubernetes.io/arch``
    well-known labels).
    """
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in node_selector.items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match ({labels.get(key) or 'unset'})"
    if platforms is None:
        return None
    pair = (str(labels.get(OS_LABEL) or LINUX), str(labels.get(ARCH_LABEL) or ""))
    if pair in platforms:
        wanted = (builds or {}).get(pair)
        build = labels.get(WINDOWS_BUILD_LABEL)
        if wanted is None or build in wanted:
            return None
        return (f"windows build {build or 'unknown'} not supported "
                f"(supported: {', '.join(wanted)})")
    supported = ", ".join(f"{os_}/{arch}" for os_, arch in sorted(platforms)) or "none"
    return (f"platform {pair[0]}/{pair[1] or 'unknown'} is not supported by every image "
            f"(supported: {supported})")


def node_eligible(node: Mapping[str, Any], node_selector: Mapping[str, Any],
                  platforms: Collection[tuple[str, str]] | None,
                  builds: Mapping[tuple[str, str], Sequence[str]] | None = None) -> bool:
    """True when ``node`` is a placement candidate (:func:`node_ineligibility` is None).

    Args and rule: see :func:`node_ineligibility`.
    """
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in node_selector.items():
        if labels.get(key) != value:
            return False
    if platforms is None:
        return True
    pair = (labels.get(OS_LABEL) or LINUX, labels.get(ARCH_LABEL) or "")
    if pair not in platforms:
        return False
    wanted = (builds or {}).get(pair)
    return wanted is None or labels.get(WINDOWS_BUILD_LABEL) in wanted


# --- pull secrets --------------------------------------------------------------------------

def pull_secret_refs(pod: Mapping[str, Any], config: PlacementConfig,
                     namespace: str | None = None) -> list[tuple[str, str]]:
    """The pull Secrets ``pod`` is inspected with, as (namespace, name), in order: its
    ``imagePullSecrets`` in its own namespace (``namespace``, else ``metadata.namespace``,
    else ``default``; the ServiceAccount admission plugin already merged the service
    account's), duplicates dropped, then the config's global pull secret
    (``imageInspection.globalPullSecretRef``) when not already listed. The kubelet's order;
    the controller reads these; the webhook reads none, it only asks whether there are any
    (:func:`webhook.admitinspect.needs_credentials`)."""
    ns = namespace or str(_map(pod.get("metadata")).get("namespace") or "default")
    spec = _map(pod.get("spec"))
    names = [str(ref.get("name")) for ref in spec.get("imagePullSecrets") or ()
             if isinstance(ref, Mapping) and ref.get("name")]
    refs = [(ns, name) for name in dict.fromkeys(names)]
    ref = config.image_inspection.global_pull_secret
    if ref is not None and (ref.namespace, ref.name) not in refs:
        refs.append((ref.namespace, ref.name))
    return refs
