"""The NUMA decision for one pod over the cluster's nodes: a verdict per eligible node, the
feasible nodes ranked by score, and the candidates to name in the pod's nodeAffinity.

Pure: plain dicts in (Pod, Nodes, NRTs by node name), frozen dataclasses out. Parsed NRTs and
Nodes are cached per resourceVersion in a module-level :class:`TopologyCache`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from controller.config import HOSTNAME_LABEL, TopologyConfig
from controller.numa._fit import (
    Columns,
    ContainerPlan,
    columns_of,
    fit_container_scope_columns,
    fit_pod_scope_columns,
    prepare,
)
from controller.numa._inflight import InFlight
from controller.numa._pod import (
    BEST_EFFORT,
    GUARANTEED,
    effective_requests,
    iter_containers,
    qos_class,
    requests_non_native,
)
from controller.numa._quantity import QuantityError
from controller.numa._score import (
    LEAST_NUMA_NODES,
    MAX_SCORE,
    STRATEGIES,
    ScoreColumns,
    least_numa_container_scope,
    least_numa_pod_scope,
    score_columns_of,
    score_container_scope,
    score_items,
    score_pod_scope,
)
from controller.numa._topology import (
    POLICY_SINGLE_NUMA_NODE,
    SCOPE_POD,
    NodeInfo,
    TopologyCache,
    values_of,
)

#: ``NodeVerdict.policy``/``scope`` of a node that has no NodeResourceTopology.
NO_TOPOLOGY = "unknown"
NODES_WITHOUT_TOPOLOGY_DENY = "Deny"

_CACHE = TopologyCache()


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """The outcome for one eligible node.

    Attributes:
        name: node name.
        feasible: the pod can be aligned there (or the node does not filter).
        reason: why not, human-readable (None when feasible).
        score: 0..100 when feasible, else None.
        policy, scope: the node's Topology Manager policy/scope (``"unknown"`` without NRT).
    """

    name: str
    feasible: bool
    reason: str | None
    score: int | None
    policy: str
    scope: str


@dataclass(frozen=True, slots=True)
class NumaDecision:
    """The NUMA decision for a pod.

    Attributes:
        needed: at least one eligible node's policy requires alignment for this pod (it has an
            NRT with ``single-numa-node`` and the pod is not a plain BestEffort pod).
        candidates: feasible node names, best score first (ties by name), at most
            ``max_candidate_nodes`` (0 means no limit).
        hostnames: the ``kubernetes.io/hostname`` label values of ``candidates`` (node name when
            the label is missing), in the same order.
        scores: node name -> score for every feasible node.
        verdicts: one per eligible node, sorted by name.
        strategy: the scoring strategy used.
    """

    needed: bool
    candidates: tuple[str, ...]
    hostnames: tuple[str, ...]
    scores: Mapping[str, int]
    verdicts: tuple[NodeVerdict, ...]
    strategy: str

    @property
    def feasible(self) -> bool:
        """True when at least one node is feasible."""
        return bool(self.scores)

    def policies(self) -> tuple[str, ...]:
        """Distinct ``policy/scope`` pairs seen on eligible nodes with an NRT, sorted."""
        return tuple(sorted({f"{v.policy}/{v.scope}" for v in self.verdicts
                             if v.policy != NO_TOPOLOGY}))

    def annotation(self) -> dict[str, Any]:
        """The NUMA part of the ``podplacement.io/decision`` annotation (compact JSON-ready):
        ``{"candidates": [...], "strategy": str, "policies": ["single-numa-node/pod", ...]}``.
        """
        return {"candidates": list(self.candidates), "strategy": self.strategy,
                "policies": list(self.policies())}


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


def decide_numa(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]],
                nrts: Mapping[str, Mapping[str, Any]], config: TopologyConfig, *,
                node_eligible: Callable[[Mapping[str, Any]], bool] = _always,
                inflight: InFlight | None = None,
                cache: TopologyCache | None = None) -> NumaDecision:
    """Decide where ``pod`` can be NUMA-aligned.

    Args:
        pod: the Pod dict.
        nodes: Node dicts; only those ``node_eligible`` accepts get a verdict (e.g. the nodes
            whose ``kubernetes.io/arch``/``os`` labels match the architecture decision).
        nrts: NodeResourceTopology dicts by node name.
        config: ``spec.topology``; with ``enabled`` false the decision is empty.
        inflight: pods already ungated towards nodes; their requests are held on those nodes.
        cache: parse cache (a module-level one by default).
    Returns:
        a :class:`NumaDecision` (fit and score rules in :mod:`controller.numa._fit` and
        :mod:`controller.numa._score`).
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
    qos = qos_class(pod)
    guaranteed = qos == GUARANTEED
    exempt = qos == BEST_EFFORT and not requests_non_native(pod)
    containers = list(iter_containers(pod))
    effective = effective_requests(pod)
    pod_requests = prepare(effective, guaranteed)
    plans = tuple(
        ContainerPlan(f"container {c.name}" if c.kind == "app" else f"init container {c.name}",
                      c.kind != "init", prepare(c.requests, guaranteed))
        for c in containers
    )
    score_inputs = [c.requests for c in containers]
    pod_items = score_items(effective)
    container_items = [score_items(c.requests) for c in containers]
    held_by_node = inflight.reservations() if inflight is not None else {}
    # Everything a node's verdict depends on besides the node and its NRT: identical pods
    # (replicas) reuse verdicts for unchanged NRTs.
    shape = cache.shape_id((
        strategy, qos, exempt, config.nodes_without_topology, tuple(sorted(effective.items())),
        tuple((c.kind, c.name, tuple(sorted(c.requests.items()))) for c in containers)))
    memo = cache.memo
    parsed_nodes = cache.parsed_nodes
    parsed_nrts = cache.parsed_nrts
    deny = config.nodes_without_topology == NODES_WITHOUT_TOPOLOGY_DENY
    aligning = not exempt

    verdicts: list[NodeVerdict] = []
    scores: dict[str, int] = {}
    infos: dict[str, NodeInfo] = {}
    needed = False
    # The loop is the hot path (thousands of nodes per pod): lookups are inlined.
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
            if deny:
                verdicts.append(NodeVerdict(name, False,
                                            "no NodeResourceTopology (nodesWithoutTopology=Deny)",
                                            None, NO_TOPOLOGY, NO_TOPOLOGY))
            else:
                score = 0 if guaranteed else MAX_SCORE
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
                verdicts.append(NodeVerdict(name, False, f"invalid NodeResourceTopology: {exc}",
                                            None, NO_TOPOLOGY, NO_TOPOLOGY))
                continue
        single = topo.policy == POLICY_SINGLE_NUMA_NODE
        if single and aligning:
            needed = True
        held = held_by_node.get(name) if held_by_node else None
        memo_key: tuple[object, ...] = (
            (topo, info, shape) if not held else (topo, info, shape, frozenset(held.items())))
        verdict = memo.get(memo_key)
        if verdict is not None:
            verdicts.append(verdict)
            if verdict.score is not None:
                scores[name] = verdict.score
            continue
        zones: Sequence[tuple[int, Mapping[str, int]]] = topo.zone_list
        values: Sequence[Mapping[str, int]] = topo.zone_values
        columns: Columns = topo.columns
        score_cols: ScoreColumns = topo.score_columns
        if held:
            zones = _hold(zones, held)
            values = [values_of(available) for _, available in zones]
            columns = columns_of(zones)
            score_cols = score_columns_of(zones, values)
        reason: str | None = None
        if single and aligning:
            if topo.scope == SCOPE_POD:
                reason = fit_pod_scope_columns(columns, pod_requests, info.allocatable)
            else:
                reason = fit_container_scope_columns(columns, plans, info.allocatable)
        if reason is not None:
            verdict = NodeVerdict(name, False, reason, None, topo.policy, topo.scope)
        else:
            if not guaranteed:
                score = MAX_SCORE
            elif strategy == LEAST_NUMA_NODES:
                if topo.scope == SCOPE_POD:
                    score = least_numa_pod_scope(zones, topo.zone_costs, effective, guaranteed,
                                                 topo.max_numa_nodes)
                else:
                    score = least_numa_container_scope(zones, topo.zone_costs, score_inputs,
                                                       guaranteed, topo.max_numa_nodes)
            elif not single:
                score = 0
            elif topo.scope == SCOPE_POD:
                score = score_pod_scope(strategy, pod_items, zones, values, score_cols)
            else:
                score = score_container_scope(strategy, container_items, zones, values,
                                              score_cols)
            scores[name] = score
            verdict = NodeVerdict(name, True, None, score, topo.policy, topo.scope)
        verdicts.append(verdict)
        memo[memo_key] = verdict

    # Two C-level sorts: by name, then (stable) by score, best first.
    ranked = sorted(sorted(scores), key=scores.__getitem__, reverse=True)
    limit = config.max_candidate_nodes
    if limit > 0:
        ranked = ranked[:limit]
    verdicts.sort(key=_by_name)
    return NumaDecision(
        needed=needed,
        candidates=tuple(ranked),
        hostnames=tuple(infos[n].hostname for n in ranked),
        scores=scores,
        verdicts=tuple(verdicts),
        strategy=strategy,
    )
