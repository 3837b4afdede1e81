"""Properties of the fit (hypothesis): monotone in ``available``, blind to zone list order."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podplacement.rules.numa._fit import (
    ContainerPlan,
    fit_container_scope,
    fit_pod_scope,
    prepare,
)
from podplacement.rules.podspec import (
    GUARANTEED,
    effective_requests,
    iter_containers,
    qos_class,
)
from tests.controller.numa._build import ctr, judge, node, nrt, pod

ALLOC = frozenset({"cpu", "memory", "pods", "ephemeral-storage", "example.com/nic"})

zone_st = st.fixed_dictionaries({}, optional={
    "cpu": st.integers(0, 16), "memory": st.integers(0, 16), "example.com/nic": st.integers(0, 4),
})
request_st = st.fixed_dictionaries(
    {"cpu": st.integers(1, 12), "memory": st.integers(1, 12)},
    optional={"example.com/nic": st.integers(0, 3)},
)
guaranteed_st = st.booleans()
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _pod(app: list[dict[str, int]], init: list[dict[str, int]], guaranteed: bool) -> dict[str, Any]:
    def mk(prefix: str, reqs: list[dict[str, int]]) -> list[dict[str, Any]]:
        out = []
        for i, r in enumerate(reqs):
            requests = {k: (str(v) if k != "memory" else f"{v}Gi") for k, v in r.items()}
            if guaranteed:
                out.append(ctr(f"{prefix}{i}", requests))
            else:  # burstable: cpu/memory requests below limits, devices request == limit
                limits = {k: v for k, v in requests.items() if k == "example.com/nic"}
                out.append(ctr(f"{prefix}{i}", requests, limits or None, guaranteed=False))
        return out
    return pod(mk("app", app), init=mk("init", init))


def _zones(avail: list[dict[str, int]]) -> list[tuple[int, dict[str, int]]]:
    conv = {"cpu": 1000, "memory": 1024**3, "example.com/nic": 1}
    return [(i, {k: v * conv[k] for k, v in z.items()}) for i, z in enumerate(avail)]


def _fits(p: dict[str, Any], zones: list[tuple[int, dict[str, int]]], scope: str) -> bool:
    guaranteed = qos_class(p) == GUARANTEED
    if scope == "pod":
        return fit_pod_scope(zones, prepare(effective_requests(p), guaranteed), ALLOC) is None
    plans = [ContainerPlan(c.name, c.kind != "init", prepare(c.requests, guaranteed))
             for c in iter_containers(p)]
    return fit_container_scope(zones, plans, ALLOC) is None


@SETTINGS
@given(zones=st.lists(zone_st, min_size=1, max_size=4), app=st.lists(request_st, min_size=1,
       max_size=3), init=st.lists(request_st, max_size=2), guaranteed=guaranteed_st,
       scope=st.sampled_from(["pod", "container"]), data=st.data())
def test_more_available_never_turns_fit_into_unfit(
        zones: list[dict[str, int]], app: list[dict[str, int]], init: list[dict[str, int]],
        guaranteed: bool, scope: str, data: st.DataObject) -> None:
    p = _pod(app, init, guaranteed)
    base = _zones(zones)
    if not _fits(p, base, scope):
        return
    # "more available" = a larger ``available`` for a resource the zone reports; making a zone
    # report a new resource is a different topology (a host-level resource no zone listed is
    # skipped, once listed it is counted).
    zone = data.draw(st.integers(0, len(zones) - 1), label="zone")
    listed = sorted(base[zone][1])
    if not listed:
        return
    name = data.draw(st.sampled_from(listed), label="resource")
    extra = data.draw(st.integers(1, 8), label="extra")
    grown = [(i, dict(avail)) for i, avail in base]
    grown[zone][1][name] += extra
    assert _fits(p, grown, scope)


@SETTINGS
@given(zones=st.lists(zone_st, min_size=1, max_size=4), app=st.lists(request_st, min_size=1,
       max_size=3), init=st.lists(request_st, max_size=2), guaranteed=guaranteed_st,
       scope=st.sampled_from(["pod", "container"]), data=st.data())
def test_fit_does_not_depend_on_the_order_zones_are_listed(
        zones: list[dict[str, int]], app: list[dict[str, int]], init: list[dict[str, int]],
        guaranteed: bool, scope: str, data: st.DataObject) -> None:
    p = _pod(app, init, guaranteed)
    topo = nrt("n1", [{k: (f"{v}Gi" if k == "memory" else v) for k, v in z.items()}
                      for z in zones], scope=scope)
    n = node("n1", {"cpu": "64", "memory": "64Gi", "example.com/nic": "8"})
    before = judge(p, topo, node_obj=n)
    shuffled = data.draw(st.permutations(topo["zones"]), label="order")
    after = judge(p, {**topo, "zones": list(shuffled)}, node_obj=n)
    assert before == after


@SETTINGS
@given(zones=st.lists(zone_st, min_size=1, max_size=4), app=st.lists(request_st, min_size=1,
       max_size=3), init=st.lists(request_st, max_size=2), guaranteed=guaranteed_st,
       data=st.data())
def test_pod_scope_fit_does_not_depend_on_which_zone_holds_what(
        zones: list[dict[str, int]], app: list[dict[str, int]], init: list[dict[str, int]],
        guaranteed: bool, data: st.DataObject) -> None:
    p = _pod(app, init, guaranteed)
    permuted = data.draw(st.permutations(zones), label="relabelled")
    assert _fits(p, _zones(zones), "pod") == _fits(p, _zones(list(permuted)), "pod")


@SETTINGS
@given(zones=st.lists(zone_st, min_size=1, max_size=4), app=st.lists(request_st, min_size=1,
       max_size=3), strategy=st.sampled_from(["LeastAllocated", "MostAllocated",
                                               "BalancedAllocation"]))
def test_column_scoring_equals_the_per_zone_formula(
        zones: list[dict[str, int]], app: list[dict[str, int]], strategy: str) -> None:
    from podplacement.rules.numa._score import (
        score_container_scope,
        score_items,
        zone_score,
    )
    from podplacement.rules.numa._topology import values_of

    p = _pod(app, [], True)
    zl = _zones(zones)
    values = [values_of(avail) for _, avail in zl]
    per_container = []
    for c in iter_containers(p):
        expected = 0
        for _, avail in zl:  # upstream: smallest non-zero zone score
            s = zone_score(strategy, c.requests, avail)
            if expected == 0 or (s != 0 and s < expected):
                expected = s
        per_container.append(expected)
    items = [score_items(c.requests) for c in iter_containers(p)]
    assert score_container_scope(strategy, items, zl, values) == \
        int(sum(per_container) / len(per_container))
