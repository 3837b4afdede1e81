"""Score: how good is a node's NUMA layout for this pod, 0..100 (scheduler-plugins
NodeResourceTopologyMatch Score, with its integer arithmetic; facts re-implemented).

* MostAllocated / LeastAllocated: per zone, the weighted mean (all weights 1) over every
  requested resource of ``req*100//cap`` / ``(cap-req)*100//cap`` with values in whole units
  (``Quantity.Value()``: cpu in cores rounded up); a resource the zone lacks or cannot hold
  scores 0.
* BalancedAllocation: per zone ``int((1 - variance) * 100)`` over the fractions req/cap, using
  the sample variance (N-1); a fraction above 1 makes the zone score 0.
* Pod scope takes the smallest non-zero zone score; container scope the mean (truncated) over
  init and app containers, each scored against the unmodified zones.
* LeastNUMANodes: the fewest zones that together hold each container (or the pod), preferring
  the lowest average distance (zone ``costs``, a missing cost counts 255);
  ``100 - n*(100//maxNUMANodes)`` plus half a step when the distance is the minimum possible.
  It applies whatever the node's policy; the other strategies score only ``single-numa-node``
  nodes (others get 0).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from podplacement.rules.numa._fit import ZoneList
from podplacement.rules.numa._quantity import is_numa_affine, score_value

MAX_SCORE = 100
MIN_SCORE = 0
MAX_DISTANCE = 255
#: Upper bound on the zone combinations LeastNUMANodes tries for one size.
MAX_COMBINATIONS = 20_000

MOST_ALLOCATED = "MostAllocated"
LEAST_ALLOCATED = "LeastAllocated"
BALANCED_ALLOCATION = "BalancedAllocation"
LEAST_NUMA_NODES = "LeastNUMANodes"
STRATEGIES = (MOST_ALLOCATED, LEAST_ALLOCATED, BALANCED_ALLOCATION, LEAST_NUMA_NODES)


#: A request prepared for scoring: ``(name, amount, value)`` with ``value`` in score units.
ScoreItems = tuple[tuple[str, int, int], ...]


def score_items(requests: Mapping[str, int]) -> ScoreItems:
    """Prepare requests (zero-valued names included, as upstream iterates them all)."""
    return tuple((name, amount, score_value(name, amount))
                 for name, amount in sorted(requests.items()))


def _least_allocated(items: ScoreItems, available: Mapping[str, int],
                     values: Mapping[str, int]) -> int:
    total = 0
    for name, req, req_v in items:
        cap = available.get(name, 0)
        if cap <= 0 or req > cap:
            continue
        cap_v = values[name]
        total += (cap_v - req_v) * MAX_SCORE // cap_v
    return total // len(items) if items else 0


def _most_allocated(items: ScoreItems, available: Mapping[str, int],
                    values: Mapping[str, int]) -> int:
    total = 0
    for name, req, req_v in items:
        cap = available.get(name, 0)
        if cap <= 0 or req > cap:
            continue
        total += req_v * MAX_SCORE // values[name]
    return total // len(items) if items else 0


def _balanced_allocation(items: ScoreItems, available: Mapping[str, int],
                         values: Mapping[str, int]) -> int:
    fractions: list[float] = []
    for name, _, req_v in items:
        cap_v = values.get(name, 0)
        fraction = 1.0 if cap_v == 0 else req_v / cap_v
        if fraction > 1:
            return 0
        fractions.append(fraction)
    n = len(fractions)
    if n < 2:
        variance = 0.0  # a single sample has no variance (upstream would divide 0 by 0)
    else:
        mean = sum(fractions) / n
        squares = sum((x - mean) ** 2 for x in fractions)
        compensation = sum(x - mean for x in fractions)
        variance = (squares - compensation * compensation / n) / (n - 1)
    return int((1 - variance) * MAX_SCORE)


_ZONE_SCORERS = {
    MOST_ALLOCATED: _most_allocated,
    LEAST_ALLOCATED: _least_allocated,
    BALANCED_ALLOCATION: _balanced_allocation,
}


def zone_score(strategy: str, requests: Mapping[str, int], available: Mapping[str, int]) -> int:
    """Score one zone for ``requests`` with MostAllocated/LeastAllocated/BalancedAllocation.

    Raises:
        KeyError: unknown strategy.
    """
    values = {name: score_value(name, amount) for name, amount in available.items()}
    return _ZONE_SCORERS[strategy](score_items(requests), available, values)


#: resource -> ``((zone index, available, available in score units), ...)`` for the zones
#: listing it: LeastAllocated/MostAllocated read one column per requested resource.
ScoreColumns = Mapping[str, tuple[tuple[int, int, int], ...]]


def score_columns_of(zones: ZoneList, values: Sequence[Mapping[str, int]]
                     ) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """Build :data:`ScoreColumns` from zones and their amounts in score units."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for index, ((_, available), zone_values) in enumerate(zip(zones, values, strict=True)):
        for name, amount in available.items():
            out.setdefault(name, []).append((index, amount, zone_values[name]))
    return {name: tuple(col) for name, col in out.items()}


def _min_nonzero(strategy: str, items: ScoreItems, zones: ZoneList,
                 values: Sequence[Mapping[str, int]], columns: ScoreColumns | None) -> int:
    result = 0
    if strategy == LEAST_ALLOCATED or strategy == MOST_ALLOCATED:
        # Column-wise: this runs for every feasible node and container.
        cols = columns if columns is not None else score_columns_of(zones, values)
        least = strategy == LEAST_ALLOCATED
        totals = [0] * len(zones)
        for name, req, req_v in items:
            col = cols.get(name)
            if col is None:
                continue  # no zone lists it: 0 for every zone
            for index, cap, cap_v in col:
                if cap > 0 and req <= cap:
                    totals[index] += ((cap_v - req_v) if least else req_v) * MAX_SCORE // cap_v
        count = len(items)
        for total in totals:
            score = total // count if count else 0
            if result == 0 or (score != 0 and score < result):
                result = score
        return result
    scorer = _ZONE_SCORERS[strategy]
    for (_, available), zone_values in zip(zones, values, strict=True):
        score = scorer(items, available, zone_values)
        if result == 0 or (score != 0 and score < result):
            result = score
    return result


def score_pod_scope(strategy: str, items: ScoreItems, zones: ZoneList,
                    values: Sequence[Mapping[str, int]],
                    columns: ScoreColumns | None = None) -> int:
    """Pod scope: the smallest non-zero zone score for the effective request (0 if none).

    ``items`` from :func:`score_items`; ``values`` are the zones' amounts in score units;
    ``columns`` (optional) the same as :data:`ScoreColumns`, precomputed.
    """
    return _min_nonzero(strategy, items, zones, values, columns)


def score_container_scope(strategy: str, containers: Sequence[ScoreItems], zones: ZoneList,
                          values: Sequence[Mapping[str, int]],
                          columns: ScoreColumns | None = None) -> int:
    """Container scope: the truncated mean over containers of their pod-scope-style score."""
    if not containers:
        return 0
    if strategy == BALANCED_ALLOCATION:
        total = sum(_min_nonzero(strategy, items, zones, values, None) for items in containers)
        return int(total / len(containers))
    # LeastAllocated/MostAllocated: _min_nonzero's column loop, inlined over the containers.
    cols = columns if columns is not None else score_columns_of(zones, values)
    least = strategy == LEAST_ALLOCATED
    if not least and strategy != MOST_ALLOCATED:
        raise KeyError(strategy)
    zone_count = len(zones)
    grand = 0
    for items in containers:
        totals = [0] * zone_count
        for name, req, req_v in items:
            col = cols.get(name)
            if col is None:
                continue
            for index, cap, cap_v in col:
                if cap > 0 and req <= cap:
                    totals[index] += ((cap_v - req_v) if least else req_v) * MAX_SCORE // cap_v
        count = len(items)
        result = 0
        for subtotal in totals:
            score = subtotal // count if count else 0
            if result == 0 or (score != 0 and score < result):
                result = score
        grand += result
    return int(grand / len(containers))


# --- LeastNUMANodes ---------------------------------------------------------------------

def _avg_distance(zones: ZoneList, costs: Sequence[Mapping[int, int]],
                  combo: Sequence[int]) -> float:
    if not combo:
        return float(MAX_DISTANCE)
    accu = 0
    for i in combo:
        for j in combo:
            accu += costs[i].get(zones[j][0], MAX_DISTANCE)
    return accu / (len(combo) * len(combo))


def _fits_combination(zones: ZoneList, combo: Sequence[int], requests: Mapping[str, int],
                      guaranteed: bool) -> bool:
    for idx in combo:
        available = zones[idx][1]
        for name in requests:
            if name not in available:
                return False
    for name, req in requests.items():
        if req == 0:
            continue
        if not guaranteed and is_numa_affine(name):
            continue
        if sum(zones[idx][1].get(name, 0) for idx in combo) < req:
            return False
    return True


def numa_nodes_required(zones: ZoneList, costs: Sequence[Mapping[int, int]],
                        requests: Mapping[str, int],
                        guaranteed: bool) -> tuple[tuple[int, ...] | None, bool]:
    """The smallest set of zone indexes that holds ``requests``, lowest distance first.

    Returns ``(indexes, is_min_avg_distance)``, or ``(None, False)`` when no set fits.
    Combinations of each size are tried in lexicographic order (gonum ``combin``). Two
    guards keep exotic topologies bounded (the Topology Manager allows 8 NUMA nodes by
    default): when all usable zones together cannot hold the request no set is searched,
    and sizes with more than :data:`MAX_COMBINATIONS` combinations are not tried.
    """
    usable = tuple(i for i, (_, available) in enumerate(zones)
                   if all(name in available for name in requests))
    if not _fits_combination(zones, usable, requests, guaranteed):
        return None, False
    for size in range(1, len(zones) + 1):
        if math.comb(len(zones), size) > MAX_COMBINATIONS:
            break
        combos = list(itertools.combinations(range(len(zones)), size))
        min_avg = float(MAX_DISTANCE)
        for combo in combos:
            min_avg = min(min_avg, _avg_distance(zones, costs, combo))
        best: tuple[int, ...] | None = None
        best_distance = float(MAX_DISTANCE + 1)
        for combo in combos:
            if not _fits_combination(zones, combo, requests, guaranteed):
                continue
            distance = _avg_distance(zones, costs, combo)
            if distance == min_avg:
                return combo, True
            if distance < best_distance:
                best_distance, best = distance, combo
        if best is not None:
            return best, False
    return None, False


def _only_non_numa(zones: ZoneList, requests: Mapping[str, int]) -> bool:
    return not any(name in available for name in requests for _, available in zones)


def _normalize(count: int, min_distance: bool, max_numa_nodes: int) -> int:
    step = MAX_SCORE // max_numa_nodes
    score = MAX_SCORE - count * step
    return score + step // 2 if min_distance else score


def least_numa_pod_scope(zones: ZoneList, costs: Sequence[Mapping[int, int]],
                         requests: Mapping[str, int], guaranteed: bool,
                         max_numa_nodes: int) -> int:
    """LeastNUMANodes for pod scope (effective request); 100 when it needs no NUMA resource."""
    if _only_non_numa(zones, requests):
        return MAX_SCORE
    combo, min_distance = numa_nodes_required(zones, costs, requests, guaranteed)
    if combo is None:
        return MIN_SCORE
    return _normalize(len(combo), min_distance, max_numa_nodes)


def least_numa_container_scope(zones: ZoneList, costs: Sequence[Mapping[int, int]],
                               containers: Sequence[Mapping[str, int]], guaranteed: bool,
                               max_numa_nodes: int) -> int:
    """LeastNUMANodes for container scope: containers (init, then app) are placed in order and
    subtracted (filling the chosen zones in turn); the score uses the largest zone count and
    whether every container got a minimum-distance set."""
    work = [(zid, dict(available)) for zid, available in zones]
    max_count = 0
    all_min = True
    for requests in containers:
        if _only_non_numa(work, requests):
            continue
        combo, min_distance = numa_nodes_required(work, costs, requests, guaranteed)
        if combo is None:
            return MIN_SCORE
        all_min = all_min and min_distance
        max_count = max(max_count, len(combo))
        for name, req in requests.items():
            remaining = req
            for idx in combo:
                if remaining == 0:
                    break
                available = work[idx][1]
                if name in available:
                    take = min(remaining, available[name])
                    available[name] -= take
                    remaining -= take
    if max_count == 0:
        return MAX_SCORE
    return _normalize(max_count, all_min, max_numa_nodes)
