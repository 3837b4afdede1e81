"""The NUMA decision for one pod over the cluster's nodes: a verdict per eligible node, the
feasible nodes ranked by score, and the candidates to name in the pod's nodeAffinity.

Pure: plain dicts in (Pod, Nodes, NRTs by node name), frozen objects out. Parsed NRTs and
Nodes are cached per resourceVersion in a module-level :class:`TopologyCache`.

Two paths compute the same decision. The reference path judges node by node with
:mod:`rules.numa._fit` and :mod:`rules.numa._score`. The fast path (numpy, see
:mod:`rules.numa._fast`) runs fit and LeastAllocated/MostAllocated scores over all nodes
at once and leaves to the reference code only the nodes it does not array (amounts beyond
int64 range) and the BalancedAllocation/LeastNUMANodes scores. Human-readable reasons are
built only when read (``podplacement explain``), by the reference code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

import podplacement.rules.numa._fast as _fast
from podplacement.rules.config import HOSTNAME_LABEL, TopologyConfig
from podplacement.rules.numa._fit import (
    Columns,
    ContainerPlan,
    Request,
    columns_of,
    fit_container_scope_columns,
    fit_pod_scope_columns,
    prepare,
)
from podplacement.rules.numa._inflight import InFlight
from podplacement.rules.numa._quantity import is_native
from podplacement.rules.numa._score import (
    BALANCED_ALLOCATION,
    LEAST_ALLOCATED,
    LEAST_NUMA_NODES,
    MAX_SCORE,
    STRATEGIES,
    ScoreColumns,
    ScoreItems,
    least_numa_container_scope,
    least_numa_pod_scope,
    score_columns_of,
    score_container_scope,
    score_items,
    score_pod_scope,
)
from podplacement.rules.numa._topology import (
    INVALID_NRT,
    NO_TOPOLOGY,
    POLICY_SINGLE_NUMA_NODE,
    SCOPE_POD,
    NodeInfo,
    Topology,
    TopologyCache,
    values_of,
)
from podplacement.rules.podspec import (
    BEST_EFFORT,
    GUARANTEED,
    QuantityError,
    effective_requests,
    iter_containers,
    qos_class,
)

NODES_WITHOUT_TOPOLOGY_DENY = "Deny"
_DENY_REASON = "no NodeResourceTopology (nodesWithoutTopology=Deny)"

_CACHE = TopologyCache()


class NodeVerdict(tuple[Any, ...]):
    """The outcome for one eligible node (immutable; compared and hashed by value).

    Attributes:
        name: node name.
        feasible: the pod can be aligned there (or the node does not filter).
        reason: why not, human-readable (None when feasible); may be computed on first read
            (``explain``), which is why the fast path can skip it.
        score: 0..100 when feasible, else None.
        policy, scope: the node's Topology Manager policy/scope (``"unknown"`` without NRT).

    A tuple underneath (thousands are built per decision; a tuple is the cheapest immutable
    object), read through the attributes above only.
    """

    __slots__ = ()

    def __new__(cls, name: str, feasible: bool, reason: str | None, score: int | None,
                policy: str, scope: str, *,
                explain: Callable[[], str | None] | None = None) -> NodeVerdict:
        """``explain``, when given, computes ``reason`` on first read (``reason`` is ignored)."""
        # The last item is the reason, or a [None, explain] cell that caches it once computed
        # (no cell for the common case: fewer objects for the garbage collector to track).
        return tuple.__new__(cls, (name, feasible, score, policy, scope,
                                   reason if explain is None else [None, explain]))

    @property
    def name(self) -> str:
        """Node name."""
        value: str = self[0]
        return value

    @property
    def feasible(self) -> bool:
        """The pod can be aligned on the node."""
        value: bool = self[1]
        return value

    @property
    def score(self) -> int | None:
        """0..100 when feasible, else None."""
        value: int | None = self[2]
        return value

    @property
    def policy(self) -> str:
        """Topology Manager policy (``"unknown"`` without NRT)."""
        value: str = self[3]
        return value

    @property
    def scope(self) -> str:
        """Topology Manager scope (``"unknown"`` without NRT)."""
        value: str = self[4]
        return value

    @property
    def reason(self) -> str | None:
        """Why the node is not feasible (None when it is)."""
        value = self[5]
        if isinstance(value, list):
            if value[1] is not None:
                value[0], value[1] = value[1](), None
            value = value[0]
        reason: str | None = value
        return reason

    def _key(self) -> tuple[object, ...]:
        return (self.name, self.feasible, self.reason, self.score, self.policy, self.scope)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeVerdict):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, NodeVerdict):
            return NotImplemented
        return self._key() != other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self.name, self.feasible, self.reason, self.score, self.policy, self.scope)

    def __repr__(self) -> str:
        return (f"NodeVerdict(name={self.name!r}, feasible={self.feasible!r}, "
                f"reason={self.reason!r}, score={self.score!r}, policy={self.policy!r}, "
                f"scope={self.scope!r})")


class NumaDecision:
    """The NUMA decision for a pod (immutable).

    Attributes:
        needed: at least one eligible node's policy requires alignment for this pod (it has an
            NRT with ``single-numa-node`` and the pod is not a plain BestEffort pod).
        candidates: feasible node names, best score first (ties by name), at most
            ``max_candidate_nodes`` (0 means no limit).
        hostnames: the ``kubernetes.io/hostname`` label values of ``candidates`` (node name when
            the label is missing), in the same order.
        scores: node name -> score for every feasible node.
        verdicts: one per eligible node, sorted by name (built on first read when the
            constructor got a callable).
        strategy: the scoring strategy used.
    """

    __slots__ = (
        "_node_policies",
        "_policies",
        "_verdicts",
        "candidates",
        "hostnames",
        "needed",
        "scores",
        "strategy",
    )

    needed: bool
    candidates: tuple[str, ...]
    hostnames: tuple[str, ...]
    scores: Mapping[str, int]
    strategy: str
    _verdicts: tuple[NodeVerdict, ...] | Callable[[], tuple[NodeVerdict, ...]]
    _policies: Callable[[], tuple[str, ...]] | None
    _node_policies: Callable[[], tuple[str, ...]] | None

    def __init__(self, needed: bool, candidates: tuple[str, ...], hostnames: tuple[str, ...],
                 scores: Mapping[str, int],
                 verdicts: tuple[NodeVerdict, ...] | Callable[[], tuple[NodeVerdict, ...]],
                 strategy: str, *,
                 policies: Callable[[], tuple[str, ...]] | None = None,
                 node_policies: Callable[[], tuple[str, ...]] | None = None) -> None:
        """``verdicts`` may be a callable building them on first read; ``policies`` and
        ``node_policies`` likewise compute those methods without building the verdicts."""
        for attr, value in (("needed", needed), ("candidates", candidates),
                            ("hostnames", hostnames), ("scores", scores),
                            ("strategy", strategy), ("_verdicts", verdicts),
                            ("_policies", policies), ("_node_policies", node_policies)):
            object.__setattr__(self, attr, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"NumaDecision is immutable (cannot set {name!r})")

    @property
    def verdicts(self) -> tuple[NodeVerdict, ...]:
        """One verdict per eligible node, sorted by name."""
        found = self._verdicts
        if callable(found):
            found = found()
            object.__setattr__(self, "_verdicts", found)
        verdicts: tuple[NodeVerdict, ...] = found
        return verdicts

    @property
    def feasible(self) -> bool:
        """True when at least one node is feasible."""
        return bool(self.scores)

    def policies(self) -> tuple[str, ...]:
        """Distinct ``policy/scope`` pairs seen on eligible nodes with an NRT, sorted."""
        if self._policies is not None:
            policies: tuple[str, ...] = self._policies()
            return policies
        return tuple(sorted({f"{v.policy}/{v.scope}" for v in self.verdicts
                             if v.policy != NO_TOPOLOGY}))

    def node_policies(self) -> tuple[str, ...]:
        """Distinct Topology Manager policies of the eligible nodes, sorted, ``"unknown"``
        standing for nodes without a readable NRT: ``{v.policy for v in verdicts}`` without
        building the verdicts (thousands of objects on a large cluster)."""
        if self._node_policies is not None:
            policies: tuple[str, ...] = self._node_policies()
            return policies
        return tuple(sorted({v.policy for v in self.verdicts}))

    def annotation(self) -> dict[str, Any]:
        """The NUMA part of the ``podplacement.io/decision`` annotation (compact JSON-ready):
        ``{"candidates": [...], "strategy": str, "policies": ["single-numa-node/pod", ...]}``.
        """
        return {"candidates": list(self.candidates), "strategy": self.strategy,
                "policies": list(self.policies())}

    def __repr__(self) -> str:
        return (f"NumaDecision(needed={self.needed!r}, candidates={self.candidates!r}, "
                f"strategy={self.strategy!r}, feasible nodes={len(self.scores)})")


def _always(_: Mapping[str, Any]) -> bool:
    return True


_by_name = attrgetter("name")


def _hold(zones: Sequence[tuple[int, Mapping[str, int]]],
          held: Mapping[str, int]) -> list[tuple[int, Mapping[str, int]]]:
    out: list[tuple[int, Mapping[str, int]]] = []
    for numa_id, available in zones:
        copy = dict(available)
        for name, amount in held.items():
            if name in copy:
                copy[name] = max(0, copy[name] - amount)
        out.append((numa_id, copy))
    return out


@dataclass(frozen=True, slots=True)
class _Shape:
    """Everything a node's verdict depends on besides the node, its NRT and holds."""

    strategy: str
    guaranteed: bool
    aligning: bool
    deny: bool
    effective: Mapping[str, int]
    pod_requests: tuple[Request, ...]
    plans: tuple[ContainerPlan, ...]
    score_inputs: tuple[Mapping[str, int], ...]
    pod_items: ScoreItems
    container_items: tuple[ScoreItems, ...]
    resources: tuple[str, ...]
    shape_id: int


def _prepare(pod: Mapping[str, Any], config: TopologyConfig, cache: TopologyCache) -> _Shape:
    qos = qos_class(pod)
    guaranteed = qos == GUARANTEED
    containers = list(iter_containers(pod))
    # IncludeNonNative: a BestEffort pod asking for an extended resource is still judged
    exempt = qos == BEST_EFFORT and not any(
        not is_native(name) for c in containers for name in c.requests)
    effective = effective_requests(pod)
    plans = tuple(
        ContainerPlan(f"container {c.name}" if c.kind == "app" else f"init container {c.name}",
                      c.kind != "init", prepare(c.requests, guaranteed))
        for c in containers
    )
    # Identical pods (replicas) share an id, so the memo reuses verdicts for unchanged NRTs.
    shape_id = cache.shape_id((
        config.scoring_strategy, qos, exempt, config.nodes_without_topology,
        tuple(sorted(effective.items())),
        tuple((c.kind, c.name, tuple(sorted(c.requests.items()))) for c in containers)))
    resources = sorted({*effective, *(name for c in containers for name in c.requests)})
    return _Shape(
        strategy=config.scoring_strategy,
        guaranteed=guaranteed,
        aligning=not exempt,
        deny=config.nodes_without_topology == NODES_WITHOUT_TOPOLOGY_DENY,
        effective=effective,
        pod_requests=prepare(effective, guaranteed),
        plans=plans,
        score_inputs=tuple(c.requests for c in containers),
        pod_items=score_items(effective),
        container_items=tuple(score_items(c.requests) for c in containers),
        resources=tuple(resources),
        shape_id=shape_id,
    )


def _judge(shape: _Shape, topo: Topology, info: NodeInfo,
           held: Mapping[str, int] | None) -> NodeVerdict:
    """The reference verdict for a node with a parsed NRT (``held``: in-flight amounts)."""
    zones: Sequence[tuple[int, Mapping[str, int]]] = topo.zone_list
    values: Sequence[Mapping[str, int]] = topo.zone_values
    columns: Columns = topo.columns
    score_cols: ScoreColumns = topo.score_columns
    if held:
        zones = _hold(zones, held)
        values = [values_of(available) for _, available in zones]
        columns = columns_of(zones)
        score_cols = score_columns_of(zones, values)
    single = topo.policy == POLICY_SINGLE_NUMA_NODE
    reason: str | None = None
    if single and shape.aligning:
        if topo.scope == SCOPE_POD:
            reason = fit_pod_scope_columns(columns, shape.pod_requests, info.allocatable)
        else:
            reason = fit_container_scope_columns(columns, shape.plans, info.allocatable)
    if reason is not None:
        return NodeVerdict(info.name, False, reason, None, topo.policy, topo.scope)
    strategy = shape.strategy
    if not shape.guaranteed:
        score = MAX_SCORE
    elif strategy == LEAST_NUMA_NODES:
        if topo.scope == SCOPE_POD:
            score = least_numa_pod_scope(zones, topo.zone_costs, shape.effective, True,
                                         topo.max_numa_nodes)
        else:
            score = least_numa_container_scope(zones, topo.zone_costs, shape.score_inputs,
                                               True, topo.max_numa_nodes)
    elif not single:
        score = 0
    elif topo.scope == SCOPE_POD:
        score = score_pod_scope(strategy, shape.pod_items, zones, values, score_cols)
    else:
        score = score_container_scope(strategy, shape.container_items, zones, values,
                                      score_cols)
    return NodeVerdict(info.name, True, None, score, topo.policy, topo.scope)


def _judge_memo(shape: _Shape, topo: Topology, info: NodeInfo,
                held: Mapping[str, int] | None, memo: dict[tuple[object, ...], Any]
                ) -> NodeVerdict:
    key: tuple[object, ...] = ((topo, info, shape.shape_id) if not held
                               else (topo, info, shape.shape_id, frozenset(held.items())))
    verdict: NodeVerdict | None = memo.get(key)
    if verdict is None:
        verdict = memo[key] = _judge(shape, topo, info, held)
    return verdict


def _reference(shape: _Shape, nodes: Sequence[Mapping[str, Any]],
               nrts: Mapping[str, Mapping[str, Any]], config: TopologyConfig,
               node_eligible: Callable[[Mapping[str, Any]], bool],
               held_by_node: Mapping[str, Mapping[str, int]],
               cache: TopologyCache) -> NumaDecision:
    """The decision node by node (the rules' reference implementation)."""
    memo = cache.memo
    parsed_nodes = cache.parsed_nodes
    parsed_nrts = cache.parsed_nrts
    verdicts: list[NodeVerdict] = []
    scores: dict[str, int] = {}
    infos: dict[str, NodeInfo] = {}
    needed = False
    for node in nodes:
        if not node_eligible(node):
            continue
        meta = node.get("metadata") or {}
        hit = parsed_nodes.get(meta.get("name", ""))
        rv = meta.get("resourceVersion")
        info = hit[1] if hit is not None and rv and hit[0] == rv \
            else cache.node(node, HOSTNAME_LABEL)
        name = info.name
        infos[name] = info
        nrt = nrts.get(name)
        if nrt is None:
            if shape.deny:
                verdicts.append(NodeVerdict(name, False, _DENY_REASON, None, NO_TOPOLOGY,
                                            NO_TOPOLOGY))
            else:
                score = 0 if shape.guaranteed else MAX_SCORE
                scores[name] = score
                verdicts.append(NodeVerdict(name, True, None, score, NO_TOPOLOGY, NO_TOPOLOGY))
            continue
        nrt_hit = parsed_nrts.get(name)
        nrt_rv = (nrt.get("metadata") or {}).get("resourceVersion")
        if nrt_hit is not None and nrt_rv and nrt_hit[0] == nrt_rv:
            topo = nrt_hit[1]
        else:
            try:
                topo = cache.topology(nrt)
            except (QuantityError, TypeError, ValueError) as exc:
                verdicts.append(NodeVerdict(name, False, INVALID_NRT.format(exc),
                                            None, NO_TOPOLOGY, NO_TOPOLOGY))
                continue
        if topo.policy == POLICY_SINGLE_NUMA_NODE and shape.aligning:
            needed = True
        held = held_by_node.get(name) if held_by_node else None
        verdict = _judge_memo(shape, topo, info, held, memo)
        verdicts.append(verdict)
        if verdict.score is not None:
            scores[name] = verdict.score

    # Two C-level sorts: by name, then (stable) by score, best first.
    ranked = sorted(sorted(scores), key=scores.__getitem__, reverse=True)
    limit = config.max_candidate_nodes
    if limit > 0:
        ranked = ranked[:limit]
    verdicts.sort(key=_by_name)
    return NumaDecision(needed, tuple(ranked), tuple(infos[n].hostname for n in ranked),
                        scores, tuple(verdicts), shape.strategy)


def _in_range(amounts: Mapping[str, int]) -> bool:
    return all(0 <= amount <= _fast.LIMIT for amount in amounts.values())


def _fast_snapshot(shape: _Shape, nodes: Sequence[Mapping[str, Any]],
                   nrts: Mapping[str, Mapping[str, Any]],
                   held_by_node: Mapping[str, Mapping[str, int]],
                   cache: TopologyCache) -> _fast.ClusterArrays | None:
    """The cluster's arrays, refreshed for ``nodes``/``nrts``; None when the pod's requests
    or the holds are out of the arrays' range, or the nodes cannot be arrayed."""
    if not all(_in_range(amounts) for amounts in (shape.effective, *shape.score_inputs)):
        return None
    if not all(_in_range(amounts) for amounts in held_by_node.values()):
        return None
    return _fast.refresh(cache, nodes, nrts, HOSTNAME_LABEL)


def _eligible_rows(nodes: Sequence[Mapping[str, Any]],
                   node_eligible: Callable[[Mapping[str, Any]], bool],
                   size: int) -> _fast.BoolArray:
    """Per row of ``nodes``, whether ``node_eligible`` accepts the node (``(size,)`` bool)."""
    if node_eligible is _always:
        return np.ones(size, dtype=np.bool_)
    return np.fromiter((bool(node_eligible(node)) for node in nodes), dtype=np.bool_,
                       count=size)


def _fast_fit(shape: _Shape, snap: _fast.ClusterArrays, eligible: _fast.BoolArray,
              avail: Mapping[str, _fast.IntArray]
              ) -> tuple[_fast.BoolArray, _fast.IntArray, _fast.BoolArray]:
    """The fit over all rows: ``(feasible, score, fits)``, ``fits`` the eligible rows with a
    usable NRT the pod fits on, ``feasible`` those plus the rows without NRT that pass
    (``nodesWithoutTopology``), ``score`` set for the latter only."""
    status, single, pod_scope = snap.status, snap.single, snap.pod_scope
    size = snap.size
    feasible = np.zeros(size, dtype=np.bool_)
    score = np.zeros(size, dtype=np.int64)
    if not shape.deny:
        without = eligible & (status == _fast.STATUS_NONE)
        feasible |= without
        score[without] = 0 if shape.guaranteed else MAX_SCORE

    ok_rows = eligible & (status == _fast.STATUS_OK)
    fits = ok_rows.copy()
    if shape.aligning:
        filtered = ok_rows & single
        rows = filtered & pod_scope
        if rows.any():
            fits &= ~rows | _fast.fit_pod_scope(snap, shape.pod_requests, avail)
        rows = filtered & ~pod_scope
        if rows.any():
            fits &= ~rows | _fast.fit_container_scope(snap, shape.plans, avail)
    feasible |= fits
    return feasible, score, fits


def _fast_score(shape: _Shape, snap: _fast.ClusterArrays, eligible: _fast.BoolArray,
                fits: _fast.BoolArray, avail: Mapping[str, _fast.IntArray],
                score: _fast.IntArray) -> tuple[_fast.IntArray, _fast.BoolArray]:
    """The array scores of the rows that fit: ``(score, by_reference)``, ``by_reference``
    the rows left to the reference code (out-of-range NRTs, and the strategies scored node
    by node: LeastNUMANodes, BalancedAllocation)."""
    single, pod_scope = snap.single, snap.pod_scope
    by_reference = eligible & (snap.status == _fast.STATUS_REFERENCE)
    strategy = shape.strategy
    if not shape.guaranteed:
        score[fits] = MAX_SCORE
    elif strategy == LEAST_NUMA_NODES:
        by_reference |= fits
    elif strategy == BALANCED_ALLOCATION:
        by_reference |= fits & single
    else:
        least = strategy == LEAST_ALLOCATED
        rows = fits & single & pod_scope
        if rows.any():
            score = np.where(rows, _fast.score_pod_scope(snap, shape.pod_items, avail, least),
                             score)
        rows = fits & single & ~pod_scope
        if rows.any():
            score = np.where(rows, _fast.score_container_scope(snap, shape.container_items,
                                                               avail, least), score)
    return score, by_reference


def _judge_rows(shape: _Shape, snap: _fast.ClusterArrays, by_reference: _fast.BoolArray,
                feasible: _fast.BoolArray, score: _fast.IntArray,
                held_by_node: Mapping[str, Mapping[str, int]],
                cache: TopologyCache) -> dict[int, NodeVerdict]:
    """Judge the ``by_reference`` rows with the reference code, writing their outcome into
    ``feasible`` and ``score`` (in place); returns their verdicts by row."""
    names, infos, topos = snap.names, snap.infos, snap.topos
    judged: dict[int, NodeVerdict] = {}
    for i in np.flatnonzero(by_reference).tolist():
        topo = topos[i]
        assert topo is not None
        verdict = _judge_memo(shape, topo, infos[i], held_by_node.get(names[i]), cache.memo)
        judged[i] = verdict
        feasible[i] = verdict.feasible
        score[i] = verdict.score if verdict.score is not None else 0
    return judged


def _fast_rank(snap: _fast.ClusterArrays, chosen: _fast.IntArray, score: _fast.IntArray,
               limit: int) -> tuple[dict[str, int], list[int]]:
    """``(scores, ranked)``: node name -> score of the ``chosen`` rows (the eligible feasible
    ones), and the rows of the candidates, best score first, ties by name, at most ``limit``
    (0: no limit)."""
    names = snap.names
    chosen_scores = score[chosen]
    chosen_names = names if len(chosen) == snap.size else [names[i] for i in chosen.tolist()]
    scores = dict(zip(chosen_names, chosen_scores.tolist(), strict=True))
    order = np.lexsort((snap.name_rank[chosen], -chosen_scores))
    if limit > 0:
        order = order[:limit]
    ranked: list[int] = chosen[order].tolist()
    return scores, ranked


def _lazy_verdicts(shape: _Shape, snap: _fast.ClusterArrays, eligible: _fast.BoolArray,
                   feasible: _fast.BoolArray, score: _fast.IntArray,
                   judged: Mapping[int, NodeVerdict],
                   held_by_node: Mapping[str, Mapping[str, int]]
                   ) -> Callable[[], tuple[NodeVerdict, ...]]:
    """A callable building the verdicts of the eligible rows, sorted by name (reasons of
    infeasible rows on first read, see :func:`_infeasible`)."""
    names, infos, topos, errors = snap.names, snap.infos, snap.topos, snap.errors
    name_order = snap.name_order
    policies, scopes = snap.policies, snap.scopes

    def verdicts() -> tuple[NodeVerdict, ...]:
        elig, feas, scored = eligible.tolist(), feasible.tolist(), score.tolist()
        out: list[NodeVerdict] = []
        append = out.append
        for i in name_order:
            if not elig[i]:
                continue
            if judged and i in judged:
                append(judged[i])
            elif feas[i]:
                append(NodeVerdict(names[i], True, None, scored[i], policies[i], scopes[i]))
            else:
                append(_infeasible(shape, names[i], topos[i], errors[i], infos[i],
                                   held_by_node.get(names[i])))
        return tuple(out)

    return verdicts


def _lazy_policies(snap: _fast.ClusterArrays, eligible: _fast.BoolArray
                   ) -> tuple[Callable[[], tuple[str, ...]], Callable[[], tuple[str, ...]]]:
    """Callables for :meth:`NumaDecision.policies` and :meth:`NumaDecision.node_policies`
    over the eligible rows, without building the verdicts."""
    policies, scopes = snap.policies, snap.scopes

    def distinct_policies() -> tuple[str, ...]:
        return tuple(sorted({f"{policy}/{scope}" for policy, scope, elig
                             in zip(policies, scopes, eligible.tolist(), strict=True)
                             if elig and policy != NO_TOPOLOGY}))

    def node_policies() -> tuple[str, ...]:
        return tuple(sorted({policy for policy, elig in zip(policies, eligible.tolist(),
                                                            strict=True) if elig}))

    return distinct_policies, node_policies


def _fast_decide(shape: _Shape, nodes: Sequence[Mapping[str, Any]],
                 nrts: Mapping[str, Mapping[str, Any]], config: TopologyConfig,
                 node_eligible: Callable[[Mapping[str, Any]], bool],
                 held_by_node: Mapping[str, Mapping[str, int]],
                 cache: TopologyCache) -> NumaDecision | None:
    """The decision over numpy arrays; None when the inputs are not for arrays (amounts out
    of int64 range, node names that are not unique non-empty strings)."""
    snap = _fast_snapshot(shape, nodes, nrts, held_by_node, cache)
    if snap is None:
        return None
    eligible = _eligible_rows(nodes, node_eligible, snap.size)
    index = snap.index
    held_rows = {index[name]: amounts for name, amounts in held_by_node.items()
                 if amounts and name in index}
    needed = shape.aligning and bool(
        (eligible & (snap.status >= _fast.STATUS_OK) & snap.single).any())
    avail = _fast.held_avail(snap, shape.resources, held_rows)
    feasible, score, fits = _fast_fit(shape, snap, eligible, avail)
    score, by_reference = _fast_score(shape, snap, eligible, fits, avail, score)
    judged = _judge_rows(shape, snap, by_reference, feasible, score, held_by_node, cache)
    scores, ranked = _fast_rank(snap, np.flatnonzero(eligible & feasible), score,
                                config.max_candidate_nodes)
    names, infos = snap.names, snap.infos
    distinct_policies, node_policies = _lazy_policies(snap, eligible)
    return NumaDecision(needed, tuple(names[i] for i in ranked),
                        tuple(infos[i].hostname for i in ranked), scores,
                        _lazy_verdicts(shape, snap, eligible, feasible, score, judged,
                                       held_by_node),
                        shape.strategy, policies=distinct_policies, node_policies=node_policies)


def _infeasible(shape: _Shape, name: str, topo: Topology | None, error: str | None,
                info: NodeInfo, held: Mapping[str, int] | None) -> NodeVerdict:
    """The verdict of a node the fast path found infeasible; the reason is left to the
    reference code, run when (if ever) it is read."""
    if topo is not None:
        return NodeVerdict(name, False, None, None, topo.policy, topo.scope,
                           explain=lambda: _judge(shape, topo, info, held).reason)
    return NodeVerdict(name, False, error if error is not None else _DENY_REASON, None,
                       NO_TOPOLOGY, NO_TOPOLOGY)


def decide_numa(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]],
                nrts: Mapping[str, Mapping[str, Any]], config: TopologyConfig, *,
                node_eligible: Callable[[Mapping[str, Any]], bool] = _always,
                inflight: InFlight | None = None,
                cache: TopologyCache | None = None,
                reference: bool = False) -> NumaDecision:
    """Decide where ``pod`` can be NUMA-aligned.

    Args:
        pod: the Pod dict.
        nodes: Node dicts; only those ``node_eligible`` accepts get a verdict (e.g. the nodes
            whose ``kubernetes.io/arch``/``os`` labels match the architecture decision).
        nrts: NodeResourceTopology dicts by node name.
        config: ``spec.topology``; with ``enabled`` false the decision is empty.
        inflight: pods already ungated towards nodes; their requests are held on those nodes.
        cache: parse cache (a module-level one by default).
        reference: judge node by node with the reference code (same result, slower; for
            tests and comparisons).
    Returns:
        a :class:`NumaDecision` (fit and score rules in :mod:`rules.numa._fit` and
        :mod:`rules.numa._score`); its verdicts and their reasons may be built on first
        read.
    Raises:
        ValueError: unknown ``config.scoring_strategy``.
        QuantityError: the pod has an invalid quantity.
    """
    strategy = config.scoring_strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown NUMA scoring strategy {strategy!r} (want one of "
                         f"{', '.join(STRATEGIES)})")
    if not config.enabled:
        return NumaDecision(False, (), (), {}, (), strategy)
    cache = cache if cache is not None else _CACHE
    cache.trim()
    shape = _prepare(pod, config, cache)
    held_by_node = inflight.reservations() if inflight is not None else {}
    if not reference:
        decision = _fast_decide(shape, nodes, nrts, config, node_eligible, held_by_node, cache)
        if decision is not None:
            return decision
    return _reference(shape, nodes, nrts, config, node_eligible, held_by_node, cache)
