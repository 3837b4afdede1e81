"""Fit: can the Topology Manager of a node align this pod? (scheduler-plugins
NodeResourceTopologyMatch Filter, facts re-implemented.)

* Only ``single-numa-node`` nodes are filtered; every other policy passes.
* A BestEffort pod passes unless it requests a non-native (extended) resource.
* Pod scope: the pod's effective request must fit one zone.
* Container scope: init containers are checked against the zones as they are; app containers,
  in order, each go to the lowest-numbered zone that fits and are subtracted from it.
  Restartable init containers (sidecars) keep their resources for the pod's life, so they are
  checked and subtracted like app containers, in init order (with no sidecars this is exactly
  the upstream rule).
* Per request: a zero request is ignored; a resource missing from the node's allocatable makes
  the node unfit; a host-level resource (ephemeral-storage, storage, extended) that no zone
  lists is skipped; any other resource no zone lists (cpu, memory, hugepages) makes the node
  unfit. For non-Guaranteed pods cpu/memory/hugepages fit any zone that lists them; devices are
  always counted. A zone fits when it satisfies every counted resource at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from podplacement.rules.numa._quantity import (
    format_quantity,
    is_host_level,
    is_numa_affine,
)

#: ``(numa_id, available)`` pairs, sorted by NUMA id.
ZoneList = Sequence[tuple[int, Mapping[str, int]]]


@dataclass(frozen=True, slots=True)
class Request:
    """One non-zero request prepared for the fit loop.

    ``relaxed`` is true for cpu/memory/hugepages of a non-Guaranteed pod (any zone listing the
    resource fits, nothing is subtracted).
    """

    name: str
    amount: int
    relaxed: bool
    host_level: bool


def prepare(requests: Mapping[str, int], guaranteed: bool) -> tuple[Request, ...]:
    """Drop zero requests and order the rest (cpu, memory, then by name) for stable reasons."""
    order = sorted(requests, key=lambda n: (n != "cpu", n != "memory", n))
    return tuple(
        Request(name, requests[name], (not guaranteed) and is_numa_affine(name),
                is_host_level(name))
        for name in order
        if requests[name] != 0
    )


#: resource -> ``((1 << numa_id, available), ...)`` for the zones that list the resource, in
#: NUMA-id order: the form the fit loop reads (one lookup per request, not per zone).
Columns = Mapping[str, tuple[tuple[int, int], ...]]


def columns_of(zones: ZoneList) -> dict[str, tuple[tuple[int, int], ...]]:
    """Turn ``(numa_id, available)`` zones into :data:`Columns`."""
    out: dict[str, list[tuple[int, int]]] = {}
    for numa_id, available in sorted(zones, key=lambda z: z[0]):
        for name, amount in available.items():
            out.setdefault(name, []).append((1 << numa_id, amount))
    return {name: tuple(col) for name, col in out.items()}


def align_columns(columns: Columns, requests: Sequence[Request],
                  allocatable: frozenset[str]) -> tuple[int, str | None]:
    """Find the zone the kubelet would pick for ``requests`` (see :func:`align`)."""
    mask = -1  # every bit set: all NUMA ids still possible
    for req in requests:
        name = req.name
        if name not in allocatable:
            return -1, f"{name} is not in the node's allocatable"
        col = columns.get(name)
        if not col:
            if req.host_level:
                continue
            return -1, f"{name} is not reported by any NUMA zone"
        fits = 0
        if req.relaxed:
            for bit, _ in col:
                fits |= bit
        else:
            wanted = req.amount
            for bit, amount in col:
                if amount >= wanted:
                    fits |= bit
        mask &= fits
        if not mask:
            if not fits:
                best = max(amount for _, amount in col)
                return -1, (f"{name} {format_quantity(name, req.amount)} > "
                            f"{format_quantity(name, best)} available in best zone")
            return -1, (f"{name} {format_quantity(name, req.amount)} fits no zone that also "
                        "holds the other requested resources")
    if mask == -1:
        return 0, None
    return (mask & -mask).bit_length() - 1, None


def align(zones: ZoneList, requests: Sequence[Request],
          allocatable: frozenset[str]) -> tuple[int, str | None]:
    """Find the zone the kubelet would pick for ``requests``.

    Returns:
        ``(numa_id, None)`` with the lowest fitting NUMA id (0 when no request constrains the
        zone, like a full bitmask), or ``(-1, reason)``.
    """
    return align_columns(columns_of(zones), requests, allocatable)


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """A container prepared for container-scope fit: ``label`` is used in reasons
    (``container app``, ``init container setup``); ``keeps`` is true when its resources stay
    allocated (app containers and sidecars)."""

    label: str
    keeps: bool
    requests: tuple[Request, ...]


def fit_pod_scope_columns(columns: Columns, requests: Sequence[Request],
                          allocatable: frozenset[str]) -> str | None:
    """Pod scope on :data:`Columns` (see :func:`fit_pod_scope`)."""
    _, reason = align_columns(columns, requests, allocatable)
    return None if reason is None else f"cannot align pod: {reason}"


def fit_container_scope_columns(columns: Columns, containers: Sequence[ContainerPlan],
                                allocatable: frozenset[str]) -> str | None:
    """Container scope on :data:`Columns` (see :func:`fit_container_scope`)."""
    current: dict[str, tuple[tuple[int, int], ...]] | None = None
    last = len(containers) - 1
    for index, ctr in enumerate(containers):
        numa_id, reason = align_columns(columns if current is None else current,
                                        ctr.requests, allocatable)
        if reason is not None:
            return f"cannot align {ctr.label}: {reason}"
        if not ctr.keeps or not ctr.requests or index == last:
            continue  # nothing to hold, or nobody left to see it
        if current is None:
            current = dict(columns)  # copy-on-write: the parsed columns are shared
        chosen = 1 << numa_id
        for req in ctr.requests:
            col = current.get(req.name)
            if req.relaxed or not col:
                continue
            for i, (bit, amount) in enumerate(col):
                if bit == chosen:
                    current[req.name] = (*col[:i], (bit, amount - req.amount), *col[i + 1:])
                    break
    return None


def fit_pod_scope(zones: ZoneList, requests: Sequence[Request],
                  allocatable: frozenset[str]) -> str | None:
    """Pod scope: return None when the effective request fits one zone, else the reason."""
    return fit_pod_scope_columns(columns_of(zones), requests, allocatable)


def fit_container_scope(zones: ZoneList, containers: Sequence[ContainerPlan],
                        allocatable: frozenset[str]) -> str | None:
    """Container scope: return None when every container can be aligned, else the reason."""
    return fit_container_scope_columns(columns_of(zones), containers, allocatable)
