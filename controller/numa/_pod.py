"""Pod-side inputs of the NUMA rules: QoS class, per-container requests, effective requests.

All amounts are integers from :func:`parse_quantity` (cpu in millicores). A container's request
for a resource falls back to its limit when no request is given, which is the API server's
defaulting, so a pod read from a YAML file is judged like the stored pod would be.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from controller.numa._quantity import CPU, MEMORY, is_native, parse_quantity

GUARANTEED = "Guaranteed"
BURSTABLE = "Burstable"
BEST_EFFORT = "BestEffort"

_QOS_RESOURCES = (CPU, MEMORY)


@dataclass(frozen=True, slots=True)
class ContainerRequests:
    """One container's requests.

    Attributes:
        name: the container name.
        kind: ``"init"``, ``"sidecar"`` (init container with ``restartPolicy: Always``) or
            ``"app"``.
        requests: resource name -> amount (cpu in millicores); zero-valued entries kept.
    """

    name: str
    kind: str
    requests: Mapping[str, int]


def _resources(container: Mapping[str, Any], key: str) -> dict[str, int]:
    res = container.get("resources") or {}
    raw = res.get(key) or {}
    return {name: parse_quantity(name, value) for name, value in raw.items()}


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    out = _resources(container, "limits")
    out.update(_resources(container, "requests"))
    return out


def iter_containers(pod: Mapping[str, Any]) -> Iterator[ContainerRequests]:
    """Yield init containers (kind ``init``/``sidecar``) in order, then app containers.

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


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class (``status.qosClass`` when set, else computed like kubelet's GetPodQOS).

    Only cpu and memory count, and requests default to limits (API defaulting); a pod with
    neither requests nor limits is BestEffort; it is
    Guaranteed when every container has cpu and memory limits and the summed requests equal the
    summed limits. Pod-level ``spec.resources`` replaces the container sums when it names cpu or
    memory (KEP-2837).
    """
    status_qos = (pod.get("status") or {}).get("qosClass")
    if status_qos:
        return str(status_qos)
    spec = pod.get("spec") or {}
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    pod_level = spec.get("resources") or {}
    if any(r in (pod_level.get(k) or {}) for k in ("requests", "limits") for r in _QOS_RESOURCES):
        level_limits = _resources({"resources": pod_level}, "limits")
        level_requests = {**level_limits, **_resources({"resources": pod_level}, "requests")}
        for source, target in ((level_requests, requests), (level_limits, limits)):
            for name in _QOS_RESOURCES:
                if source.get(name, 0) > 0:
                    target[name] = source[name]
        guaranteed = all(r in limits for r in _QOS_RESOURCES)
    else:
        containers = [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]
        for container in containers:
            for key, target in (("requests", requests), ("limits", limits)):
                found = set()
                amounts = (_container_requests(container) if key == "requests"
                           else _resources(container, key))
                for name, amount in amounts.items():
                    if name in _QOS_RESOURCES and amount > 0:
                        target[name] = target.get(name, 0) + amount
                        found.add(name)
                if key == "limits" and not found.issuperset(_QOS_RESOURCES):
                    guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and all(limits.get(name) == amount for name, amount in requests.items()):
        if len(requests) == len(limits):
            return GUARANTEED
    return BURSTABLE


def effective_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's effective request per resource, as the scheduler accounts it.

    ``max(sum of app containers + sidecars, largest init container + the sidecars started
    before it) + spec.overhead`` (k8s component-helpers ``PodRequests``; restartable init
    containers count like app containers). Zero-valued names are kept.

    Raises:
        QuantityError: a request, limit or overhead is not a valid quantity.
    """
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for ctr in iter_containers(pod):
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
    overhead = (pod.get("spec") or {}).get("overhead") or {}
    for name, value in overhead.items():
        total[name] = total.get(name, 0) + parse_quantity(name, value)
    return total


def requests_non_native(pod: Mapping[str, Any]) -> bool:
    """True when any container requests a non-native (extended) resource (IncludeNonNative)."""
    return any(not is_native(name) for ctr in iter_containers(pod) for name in ctr.requests)
