"""Score strategies (scheduler-plugins NodeResourceTopologyMatch score), hand-computed."""

from __future__ import annotations

import pytest

from tests.controller.numa._build import ctr, gpod, judge, nrt, pod

# node-0: cpu 8, memory 32Gi; node-1: cpu 16, memory 64Gi; pod: cpu 4, memory 8Gi.
TWO_ZONES = [{"cpu": 8, "memory": "32Gi"}, {"cpu": 16, "memory": "64Gi"}]


@pytest.mark.parametrize(("strategy", "expected"), [
    # node-0: cpu (8-4)*100//8=50, mem (32-8)*100//32=75 -> 125//2=62
    # node-1: cpu (16-4)*100//16=75, mem (64-8)*100//64=87 -> 162//2=81; min non-zero 62
    ("LeastAllocated", 62),
    # node-0: 4*100//8=50, 8*100//32=25 -> 37; node-1: 25, 12 -> 18; min 18
    ("MostAllocated", 18),
    # node-0: fractions .5,.25 -> sample variance .03125 -> int(96.875)=96;
    # node-1: .25,.125 -> .0078125 -> 99; min 96
    ("BalancedAllocation", 96),
])
def test_pod_scope_takes_the_smallest_zone_score(strategy: str, expected: int) -> None:
    v = judge(gpod("4", "8Gi"), nrt("n", TWO_ZONES, scope="pod"), strategy=strategy)
    assert v.feasible and v.score == expected


def test_zone_scoring_zero_is_not_the_minimum() -> None:
    # node-0 lists neither cpu nor memory: it scores 0 and is skipped; node-1 scores 81.
    n = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "64", "memory": "128Gi",
                                                                "example.com/nic": "2"}}}
    topo = nrt("n", [{"example.com/nic": 1}, {"cpu": 16, "memory": "64Gi"}], scope="pod")
    assert judge(gpod("4", "8Gi"), topo, node_obj=n).score == 81


def test_cpu_counts_in_whole_cores_rounded_up_for_scores() -> None:
    # cpu 500m -> 1 core: (3-1)*100//3=66; memory (4-1)*100//4=75; (66+75)//2=70
    topo = nrt("n", [{"cpu": 3, "memory": "4Gi"}], scope="pod")
    assert judge(gpod("500m", "1Gi"), topo).score == 70


def test_container_scope_is_the_truncated_mean_over_init_and_app_containers() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "32Gi"}])
    two = pod([ctr("a", {"cpu": "4", "memory": "8Gi"}), ctr("b", {"cpu": "2", "memory": "4Gi"})])
    # a: 62 (see above); b: cpu (8-2)*100//8=75, mem (32-4)*100//32=87 -> 81; mean 71.5 -> 71
    assert judge(two, topo).score == 71
    three = pod(two["spec"]["containers"], init=[ctr("c", {"cpu": "1", "memory": "1Gi"})])
    # c: cpu 87, mem 96 -> 91; (91+62+81)/3 = 78
    assert judge(three, topo).score == 78


def test_non_guaranteed_pods_score_100() -> None:
    burstable = pod([ctr("app", {"cpu": "4", "memory": "8Gi"}, guaranteed=False)])
    for strategy in ("LeastAllocated", "MostAllocated", "BalancedAllocation", "LeastNUMANodes"):
        assert judge(burstable, nrt("n", TWO_ZONES), strategy=strategy).score == 100


def _lnn(p: dict, topo: dict) -> int | None:
    return judge(p, topo, strategy="LeastNUMANodes").score


def test_least_numa_nodes_one_zone_at_minimum_distance() -> None:
    # 100 - 1*(100//8) + (100//8)//2 = 100 - 12 + 6
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}] * 2, scope="pod")
    assert _lnn(gpod("4"), topo) == 94


def test_least_numa_nodes_two_zones() -> None:
    # policy none does not filter; pod needs node-0+node-1, avg distance (10+20+20+10)/4 = 15 is
    # the minimum for pairs: 100 - 24 + 6
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}] * 2, policy="none", scope="pod")
    assert _lnn(gpod("12"), topo) == 82


def test_least_numa_nodes_missing_cost_counts_255() -> None:
    costs = [{"node-0": 10, "node-2": 20}, {"node-1": 10, "node-2": 20},
             {"node-0": 20, "node-1": 20, "node-2": 10}]
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}, {"cpu": 8, "memory": "8Gi"},
                     {"cpu": 2, "memory": "8Gi"}], policy="none", scope="pod", costs=costs)
    # pairs: (0,1) avg (10+255+255+10)/4 = 132.5 and fits; (0,2),(1,2) avg 15 but hold 10 cpus.
    # The fitting pair is not at the minimum distance: 100 - 2*12, no bonus.
    assert _lnn(gpod("12"), topo) == 76


def test_least_numa_nodes_uses_max_numa_nodes_attribute() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}] * 2, scope="pod",
               attrs={"topologyManagerMaxNUMANodes": "4"})
    assert _lnn(gpod("4"), topo) == 100 - 25 + 12


def test_least_numa_nodes_container_scope_places_and_subtracts_in_order() -> None:
    zones = [{"cpu": 8, "memory": "8Gi"}] * 2
    a = ctr("a", {"cpu": "6", "memory": "1Gi"})
    b = ctr("b", {"cpu": "6", "memory": "1Gi"})
    # a -> node-0 (2 left), b -> node-1 (2 left): one zone each, minimum distance
    assert _lnn(pod([a, b]), nrt("n", zones, policy="none")) == 94
    # d needs 3 cpus: only node-0+node-1 together (2+2): two zones
    d = ctr("d", {"cpu": "3", "memory": "1Gi"})
    assert _lnn(pod([a, b, d]), nrt("n", zones, policy="none")) == 82
    # c needs 6: nothing left can hold it
    c = ctr("c", {"cpu": "6", "memory": "1Gi"})
    assert _lnn(pod([a, b, c]), nrt("n", zones, policy="none")) == 0


def test_least_numa_nodes_only_non_numa_resources_score_100() -> None:
    n = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "64", "memory": "128Gi",
                                                                "example.com/nic": "2"}}}
    topo = nrt("n", [{"example.com/nic": 1}], policy="none", scope="pod")
    assert judge(gpod("4"), topo, node_obj=n, strategy="LeastNUMANodes").score == 100


def test_least_numa_nodes_scores_nodes_of_any_policy() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}], policy="best-effort", scope="pod")
    assert _lnn(gpod("4"), topo) == 94
    assert judge(gpod("4"), topo, strategy="LeastAllocated").score == 0


def test_least_numa_nodes_stays_bounded_on_huge_topologies() -> None:
    # 40 zones of 1 cpu: a 30-cpu pod would need C(40, 30) combinations; the request is
    # searched only up to sizes with at most 20,000 combinations, then scores 0.
    zones = [{"cpu": 1, "memory": "1Gi"}] * 40
    topo = nrt("n", zones, policy="none", scope="pod", costs=[{}] * 40)
    assert _lnn(gpod("30", "1Gi"), topo) == 0
    # too big for all zones together: no search at all
    assert _lnn(gpod("41", "1Gi"), topo) == 0
    # fits one zone: with every cost missing each single zone averages 255, which is then the
    # minimum, so the bonus applies: 100 - 12 + 6
    assert _lnn(gpod("1", "1Gi"), topo) == 94


def test_zero_valued_requests_still_count_in_the_average() -> None:
    # upstream iterates every requested name: gpu (0 requested, absent from the zone) scores 0
    # cpu 50 + memory 75 + gpu 0 -> 125 // 3 = 41
    topo = nrt("n", [{"cpu": 8, "memory": "32Gi"}], scope="pod")
    assert judge(gpod("4", "8Gi", extra={"example.com/gpu": "0"}), topo).score == 41
