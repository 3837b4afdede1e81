"""The cluster's NodeResourceTopologies as numpy arrays, and the fit and score rules run over
every node at once (the controller's fast path; :mod:`rules.numa._fit` and
:mod:`rules.numa._score` are the reference the results must equal).

:class:`ClusterArrays` holds, per zone resource, an ``(nodes, zone slots)`` int64 array of
``available`` and a bool array saying which zones list it; zone slots are sorted by NUMA id, so
"the lowest-numbered zone that fits" is the first fitting slot. It is refreshed row by row
from the informer-fed dicts: a row is re-read only when its Node's or NRT's resourceVersion
changed (objects without one are re-read on every call). Rows whose amounts could overflow
int64 arithmetic (negative or above :data:`LIMIT`) are marked for the reference code.

Needs numpy; pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress, count, repeat
from operator import itemgetter, ne
from typing import Any

import numpy as np
from numpy.typing import NDArray

from podplacement.rules.numa._fit import ContainerPlan, Request
from podplacement.rules.numa._quantity import ALWAYS_ALLOCATABLE
from podplacement.rules.numa._score import MAX_SCORE, ScoreItems
from podplacement.rules.numa._topology import (
    INVALID_NRT,
    NO_TOPOLOGY,
    POLICY_SINGLE_NUMA_NODE,
    SCOPE_POD,
    NodeInfo,
    Topology,
    TopologyCache,
)
from podplacement.rules.podspec import CPU, QuantityError

BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]

#: Largest amount the arrays hold: ``LIMIT * MAX_SCORE`` stays below 2**63.
LIMIT = 1 << 56

#: Row status: no NRT, an NRT that does not parse, an NRT in the arrays, an NRT for the
#: reference code (amounts out of the arrays' range).
STATUS_NONE = 0
STATUS_INVALID = 1
STATUS_OK = 2
STATUS_REFERENCE = 3

_metadata = itemgetter("metadata")
_name = itemgetter("name")
_resource_version = itemgetter("resourceVersion")
#: Stands for a missing NRT while gathering resourceVersions (its own is a constant).
_ABSENT = object()
_NO_NRT: Mapping[str, Any] = {"metadata": {"resourceVersion": _ABSENT}}


class _Rebuild(Exception):
    """A changed row does not fit the arrays' shape (new resource, more zones)."""


def _in_range(topo: Topology) -> bool:
    low, high = topo.amount_range
    return 0 <= low and high <= LIMIT


class ClusterArrays:
    """One row per node of the ``nodes`` sequence last seen, in that order.

    Attributes:
        names: node names (unique, non-empty strings).
        node_rvs, nrt_rvs: the resourceVersions the rows were read at (a constant marker for
            a node without NRT; a fresh ``object()`` for objects without a resourceVersion, so
            they never match and are re-read on every call).
        infos, topos: parsed Node and NRT per row (topo ``None`` without a readable NRT).
        errors: ``"invalid NodeResourceTopology: ..."`` for NRTs that do not parse, else None.
        policies, scopes: the NRT's policy and scope per row (``"unknown"`` without one).
        status: per row, one of the ``STATUS_*`` codes (int8).
        single: the NRT's policy is ``single-numa-node``; pod_scope: its scope is ``pod``.
        avail, listed: resource -> ``(rows, slots)`` int64 amounts / bool "zone lists it".
        listed_any: resource -> ``(rows,)`` bool "some zone lists it".
        name_order: row indexes sorted by name; name_rank: each row's position in it.
        index: name -> row.

    The lists are replaced, never mutated, when rows change (decisions keep references to
    them for lazily built verdicts); the arrays are updated in place.
    """

    def __init__(self, names: list[str], node_rvs: list[object], nrt_rvs: list[object],
                 infos: list[NodeInfo], topos: list[Topology | None],
                 errors: list[str | None]) -> None:
        rows = len(names)
        self.names = names
        self.node_rvs = node_rvs
        self.nrt_rvs = nrt_rvs
        self.infos = infos
        self.topos = topos
        self.errors = errors
        self.policies = [NO_TOPOLOGY if t is None else t.policy for t in topos]
        self.scopes = [NO_TOPOLOGY if t is None else t.scope for t in topos]
        self.size = rows
        self.index = {name: i for i, name in enumerate(names)}
        self.name_order = sorted(range(rows), key=names.__getitem__)
        rank = np.empty(rows, dtype=np.int64)
        rank[np.asarray(self.name_order, dtype=np.int64)] = np.arange(rows, dtype=np.int64)
        self.name_rank: IntArray = rank
        usable = [t for t in topos if t is not None and _in_range(t)]
        self.slots = max([1, *(len(t.zones) for t in usable)])
        resources = sorted({name for t in usable for name in t.zone_resources})
        shape = (rows, self.slots)
        self.avail: dict[str, IntArray] = {r: np.zeros(shape, dtype=np.int64) for r in resources}
        self.listed: dict[str, BoolArray] = {r: np.zeros(shape, dtype=np.bool_)
                                             for r in resources}
        self.listed_any: dict[str, BoolArray] = {r: np.zeros(rows, dtype=np.bool_)
                                                 for r in resources}
        self.status = np.zeros(rows, dtype=np.int8)
        self.single = np.zeros(rows, dtype=np.bool_)
        self.pod_scope = np.zeros(rows, dtype=np.bool_)
        self._alloc: dict[str, BoolArray] = {}
        for i in range(rows):
            self._fill(i, fresh=True)

    def _fill(self, i: int, *, fresh: bool = False) -> None:
        topo = self.topos[i]
        if not fresh:
            for name in self.avail:
                self.avail[name][i] = 0
                self.listed[name][i] = False
                self.listed_any[name][i] = False
            for name, has in self._alloc.items():
                has[i] = name in self.infos[i].allocatable
        if topo is None:
            self.status[i] = STATUS_INVALID if self.errors[i] is not None else STATUS_NONE
            self.single[i] = False
            self.pod_scope[i] = False
            return
        self.single[i] = topo.policy == POLICY_SINGLE_NUMA_NODE
        self.pod_scope[i] = topo.scope == SCOPE_POD
        if not _in_range(topo):
            self.status[i] = STATUS_REFERENCE
            return
        if len(topo.zones) > self.slots or not topo.zone_resources <= self.avail.keys():
            raise _Rebuild
        self.status[i] = STATUS_OK
        for slot, (_, available) in enumerate(topo.zone_list):
            for name, amount in available.items():
                self.avail[name][i, slot] = amount
                self.listed[name][i, slot] = True
                self.listed_any[name][i] = True

    def allocatable(self, name: str) -> BoolArray:
        """``(rows,)``: the node's allocatable names ``name`` (cached per name)."""
        found = self._alloc.get(name)
        if found is None:
            found = np.fromiter((name in info.allocatable for info in self.infos),
                                dtype=np.bool_, count=self.size)
            self._alloc[name] = found
        return found

    def update(self, dirty: Sequence[int], node_rvs: list[object], nrt_rvs: list[object],
               infos: Mapping[int, NodeInfo], topos: Mapping[int, Topology | None],
               errors: Mapping[int, str | None]) -> bool:
        """Re-read the ``dirty`` rows; False when the arrays must be rebuilt instead."""
        self.infos = list(self.infos)
        self.topos = list(self.topos)
        self.errors = list(self.errors)
        self.policies = list(self.policies)
        self.scopes = list(self.scopes)
        for i in dirty:
            topo = topos[i]
            self.infos[i] = infos[i]
            self.topos[i] = topo
            self.errors[i] = errors[i]
            self.policies[i] = NO_TOPOLOGY if topo is None else topo.policy
            self.scopes[i] = NO_TOPOLOGY if topo is None else topo.scope
        try:
            for i in dirty:
                self._fill(i)
        except _Rebuild:
            return False
        self.node_rvs = node_rvs
        self.nrt_rvs = nrt_rvs
        return True


def _slow_gather(nodes: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[Any]]:
    metas = [node.get("metadata") or {} for node in nodes]
    return ([meta.get("name", "") for meta in metas],
            [meta.get("resourceVersion") for meta in metas])


def _slow_nrt_rvs(nrts: Sequence[Mapping[str, Any]]) -> list[Any]:
    return [_ABSENT if nrt is _NO_NRT else (nrt.get("metadata") or {}).get("resourceVersion")
            for nrt in nrts]


def refresh(cache: TopologyCache, nodes: Sequence[Mapping[str, Any]],
            nrts: Mapping[str, Mapping[str, Any]], hostname_label: str) -> ClusterArrays | None:
    """Return the cache's :class:`ClusterArrays` for ``nodes``/``nrts``, re-reading only rows
    whose objects changed (a new node list, resource or wider zone count rebuilds them).

    Returns None when the node list cannot be arrayed (duplicate, empty or non-string names):
    the caller then uses the reference code.
    """
    try:
        metas = list(map(_metadata, nodes))
        names: list[Any] = list(map(_name, metas))
        node_rvs: list[Any] = list(map(_resource_version, metas))
    except (KeyError, TypeError):
        names, node_rvs = _slow_gather(nodes)
    if not all(node_rvs):
        node_rvs = [rv or object() for rv in node_rvs]
    snap: ClusterArrays | None = cache.arrays
    if snap is None or snap.names != names:
        snap = None
        if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            cache.arrays = None
            return None
    found = list(map(nrts.get, names, repeat(_NO_NRT)))
    try:
        nrt_rvs: list[Any] = list(map(_resource_version, map(_metadata, found)))
    except (KeyError, TypeError):
        nrt_rvs = _slow_nrt_rvs(found)
    if not all(nrt_rvs):
        nrt_rvs = [rv or object() for rv in nrt_rvs]
    nrt_objs: Sequence[Mapping[str, Any]] = found  # _NO_NRT is read as "no NRT" by _read
    if snap is not None:
        dirty: set[int] = set()
        if node_rvs != snap.node_rvs:
            dirty.update(compress(count(), map(ne, node_rvs, snap.node_rvs)))
        if nrt_rvs != snap.nrt_rvs:
            dirty.update(compress(count(), map(ne, nrt_rvs, snap.nrt_rvs)))
        if not dirty:
            return snap
        infos, topos, errors = {}, {}, {}
        for i in sorted(dirty):
            infos[i], topos[i], errors[i] = _read(cache, nodes[i], nrt_objs[i], hostname_label)
        if snap.update(sorted(dirty), node_rvs, nrt_rvs, infos, topos, errors):
            return snap
    read = [_read(cache, node, nrt, hostname_label) for node, nrt in zip(nodes, nrt_objs,
                                                                          strict=True)]
    snap = ClusterArrays(names, node_rvs, nrt_rvs, [r[0] for r in read], [r[1] for r in read],
                         [r[2] for r in read])
    cache.arrays = snap
    return snap


def _read(cache: TopologyCache, node: Mapping[str, Any], nrt: Mapping[str, Any] | None,
          hostname_label: str) -> tuple[NodeInfo, Topology | None, str | None]:
    info = cache.node(node, hostname_label)
    if nrt is None or nrt is _NO_NRT:
        return info, None, None
    try:
        return info, cache.topology(nrt), None
    except (QuantityError, TypeError, ValueError) as exc:
        return info, None, INVALID_NRT.format(exc)


# --- kernels ----------------------------------------------------------------------------

def held_avail(snap: ClusterArrays, names: Sequence[str],
               held: Mapping[int, Mapping[str, int]]) -> dict[str, IntArray]:
    """``available`` per resource in ``names`` (those some zone lists), with the amounts
    ``held`` (row -> resource -> amount) taken from every listing zone of those rows,
    clamped at 0 (the in-flight hold). Arrays without holds are the snapshot's own."""
    out: dict[str, IntArray] = {}
    for name in names:
        base = snap.avail.get(name)
        if base is None:
            continue
        rows = [i for i, amounts in held.items() if amounts.get(name)]
        if rows:
            idx = np.asarray(rows, dtype=np.int64)
            amounts = np.asarray([held[i][name] for i in rows], dtype=np.int64)
            base = base.copy()
            base[idx] = np.maximum(base[idx] - amounts[:, None], 0)
        out[name] = base
    return out


def _align(snap: ClusterArrays, requests: Sequence[Request],
           avail: Mapping[str, IntArray]) -> tuple[BoolArray, BoolArray]:
    """Vectorised :func:`rules.numa._fit.align_columns`: per row, fits or not, and the
    mask of zone slots that hold every counted request."""
    ok = np.ones(snap.size, dtype=np.bool_)
    mask = np.ones((snap.size, snap.slots), dtype=np.bool_)
    for req in requests:
        name = req.name
        if name not in ALWAYS_ALLOCATABLE:
            ok &= snap.allocatable(name)
        listed = snap.listed.get(name)
        if listed is None:  # no zone of any node lists it
            if not req.host_level:
                ok[:] = False
            continue
        fits = listed if req.relaxed else listed & (avail[name] >= req.amount)
        if req.host_level:
            fits = fits | ~snap.listed_any[name][:, None]
        mask &= fits
    ok &= mask.any(axis=1)
    return ok, mask


def fit_pod_scope(snap: ClusterArrays, requests: Sequence[Request],
                  avail: Mapping[str, IntArray]) -> BoolArray:
    """``(rows,)``: the pod's effective request fits one zone (pod scope)."""
    return _align(snap, requests, avail)[0]


def fit_container_scope(snap: ClusterArrays, plans: Sequence[ContainerPlan],
                        avail: Mapping[str, IntArray]) -> BoolArray:
    """``(rows,)``: every container can be aligned in order (container scope; app containers
    and sidecars are subtracted from the lowest-numbered zone that fits)."""
    ok = np.ones(snap.size, dtype=np.bool_)
    current = dict(avail)
    copied: set[str] = set()
    rows = np.arange(snap.size)
    last = len(plans) - 1
    for index, plan in enumerate(plans):
        fits, mask = _align(snap, plan.requests, current)
        ok &= fits
        if not plan.keeps or not plan.requests or index == last:
            continue
        chosen = mask.argmax(axis=1)  # first fitting slot = lowest NUMA id
        for req in plan.requests:
            if req.relaxed or req.name not in snap.listed:
                continue
            if req.name not in copied:
                current[req.name] = current[req.name].copy()
                copied.add(req.name)
            arr = current[req.name]
            hit = snap.listed[req.name][rows, chosen]
            arr[rows[hit], chosen[hit]] -= req.amount
    return ok


def _cpu_values(name: str, amounts: IntArray) -> IntArray:
    if name == CPU:
        return -((-amounts) // 1000)
    return amounts


def _min_nonzero(items: ScoreItems, avail: Mapping[str, IntArray], least: bool,
                 shape: tuple[int, int]) -> IntArray:
    total = np.zeros(shape, dtype=np.int64)
    for name, req, req_v in items:
        cap = avail.get(name)
        if cap is None:
            continue
        good = (cap > 0) & (cap >= req)
        cap_v = np.where(good, _cpu_values(name, cap), 1)
        numerator = (cap_v - req_v) * MAX_SCORE if least else req_v * MAX_SCORE
        total += np.where(good, numerator // cap_v, 0)
    if not items:
        return np.zeros(shape[0], dtype=np.int64)
    scores = total // len(items)
    smallest = np.where(scores > 0, scores, np.iinfo(np.int64).max).min(axis=1)
    return np.where(smallest == np.iinfo(np.int64).max, 0, smallest)


def score_pod_scope(snap: ClusterArrays, items: ScoreItems, avail: Mapping[str, IntArray],
                    least: bool) -> IntArray:
    """``(rows,)`` LeastAllocated (``least``) or MostAllocated pod-scope scores: the smallest
    non-zero zone score (see :func:`rules.numa._score.score_pod_scope`)."""
    return _min_nonzero(items, avail, least, (snap.size, snap.slots))


def score_container_scope(snap: ClusterArrays, containers: Sequence[ScoreItems],
                          avail: Mapping[str, IntArray], least: bool) -> IntArray:
    """``(rows,)`` container-scope scores: the truncated mean of the containers' scores."""
    if not containers:
        return np.zeros(snap.size, dtype=np.int64)
    grand = np.zeros(snap.size, dtype=np.int64)
    for items in containers:
        grand += _min_nonzero(items, avail, least, (snap.size, snap.slots))
    return grand // len(containers)
