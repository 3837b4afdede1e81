"""Amounts and resource-name classes the NUMA rules use.

Quantities are parsed by :func:`rules.podspec.parse_quantity` (integers: cpu in
millicores, every other resource in base units, rounded up like ``Quantity.MilliValue()`` /
``Value()``). Scores use :func:`score_value`, which is ``Quantity.Value()`` (cpu in whole
cores, rounded up), as the scheduler-plugins score code does.
"""

from __future__ import annotations

from podplacement.rules.podspec import CPU, MEMORY

PODS = "pods"
EPHEMERAL_STORAGE = "ephemeral-storage"
STORAGE = "storage"
HUGEPAGES_PREFIX = "hugepages-"

#: Resources a node's allocatable always has (the scheduler's NodeInfo.Allocatable keeps them
#: even at zero), so they never fail the "missing from the node's allocatable" check.
ALWAYS_ALLOCATABLE = frozenset({CPU, MEMORY, PODS, EPHEMERAL_STORAGE})

_BINARY_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
                 ("Ki", 2**10))


def score_value(resource: str, amount: int) -> int:
    """``Quantity.Value()`` of an amount from :func:`parse_quantity` (cpu: whole cores, up)."""
    if resource == CPU:
        return -((-amount) // 1000)
    return amount


def format_quantity(resource: str, amount: int) -> str:
    """Render an amount for humans: cpu ``"9"``/``"500m"``, memory-like ``"40Gi"``, else int."""
    if resource == CPU:
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if amount > 0 and (resource in (MEMORY, EPHEMERAL_STORAGE, STORAGE)
                       or resource.startswith(HUGEPAGES_PREFIX)):
        for suffix, unit in _BINARY_UNITS:
            if amount % unit == 0:
                return f"{amount // unit}{suffix}"
    return str(amount)


def is_hugepages(resource: str) -> bool:
    """True for ``hugepages-<size>`` (v1helper.IsHugePageResourceName)."""
    return resource.startswith(HUGEPAGES_PREFIX)


def is_native(resource: str) -> bool:
    """True for names without a domain or in ``kubernetes.io/`` (v1helper.IsNativeResource)."""
    return "/" not in resource or resource.startswith("kubernetes.io/")


def is_numa_affine(resource: str) -> bool:
    """cpu, memory and hugepages must expose NUMA affinity (scheduler-plugins numaresources)."""
    return resource == CPU or resource == MEMORY or resource.startswith(HUGEPAGES_PREFIX)


def is_host_level(resource: str) -> bool:
    """Resources that may lack NUMA affinity: ephemeral-storage, storage, extended resources."""
    return resource == EPHEMERAL_STORAGE or resource == STORAGE or not is_native(resource)
