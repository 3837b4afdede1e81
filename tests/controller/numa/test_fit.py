"""Fit rules (scheduler-plugins NodeResourceTopologyMatch filter), hand-computed cases."""

from __future__ import annotations

from tests.controller.numa._build import ctr, gpod, judge, node, nrt, pod

SNN = "single-numa-node"


def test_pod_scope_reports_the_best_zone_when_cpu_does_not_fit() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "32Gi"}, {"cpu": 6, "memory": "32Gi"}], scope="pod")
    v = judge(gpod("9"), topo)
    assert not v.feasible
    assert v.reason == "cannot align pod: cpu 9 > 8 available in best zone"
    assert v.score is None


def test_pod_scope_memory_message_uses_binary_units() -> None:
    topo = nrt("n", [{"cpu": 32, "memory": "32Gi"}, {"cpu": 32, "memory": "16Gi"}], scope="pod")
    v = judge(gpod("1", "40Gi"), topo)
    assert v.reason == "cannot align pod: memory 40Gi > 32Gi available in best zone"


def test_all_resources_must_fit_the_same_zone() -> None:
    # cpu fits only node-1, memory only node-0: no single zone holds both.
    topo = nrt("n", [{"cpu": 3, "memory": "16Gi"}, {"cpu": 5, "memory": "4Gi"}], scope="pod")
    v = judge(gpod("4", "8Gi"), topo)
    assert not v.feasible
    assert v.reason is not None and v.reason.startswith("cannot align pod: memory 8Gi fits no zone")
    assert judge(gpod("4", "4Gi"), topo).feasible


def test_pod_scope_uses_effective_request_of_all_containers() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "64Gi"}, {"cpu": 8, "memory": "64Gi"}], scope="pod")
    two = pod([ctr("a", {"cpu": "5", "memory": "1Gi"}), ctr("b", {"cpu": "4", "memory": "1Gi"})])
    assert judge(two, topo).reason == "cannot align pod: cpu 9 > 8 available in best zone"
    # container scope places them in different zones
    assert judge(two, nrt("n", [{"cpu": 8, "memory": "64Gi"}] * 2, scope="container")).feasible


def test_container_scope_subtracts_each_app_container_from_its_zone() -> None:
    two = pod([ctr("a", {"cpu": "4", "memory": "1Gi"}), ctr("b", {"cpu": "4", "memory": "1Gi"})])
    assert judge(two, nrt("n", [{"cpu": 6, "memory": "8Gi"}, {"cpu": 4, "memory": "8Gi"}])).feasible
    v = judge(two, nrt("n", [{"cpu": 6, "memory": "8Gi"}, {"cpu": 3, "memory": "8Gi"}]))
    # a -> node-0 (2 cpus left); b needs 4: node-0 has 2, node-1 has 3
    assert v.reason == "cannot align container b: cpu 4 > 3 available in best zone"


def test_container_scope_takes_the_lowest_numbered_zone_that_fits() -> None:
    two = pod([ctr("a", {"cpu": "4", "memory": "1Gi"}), ctr("b", {"cpu": "8", "memory": "1Gi"})])
    # a fits both zones and goes to node-0, leaving 4: b then fits nowhere.
    v = judge(two, nrt("n", [{"cpu": 8, "memory": "8Gi"}, {"cpu": 4, "memory": "8Gi"}]))
    assert v.reason == "cannot align container b: cpu 8 > 4 available in best zone"
    # swap the zones' contents: a -> node-0 (exactly 4), b -> node-1.
    assert judge(two, nrt("n", [{"cpu": 4, "memory": "8Gi"}, {"cpu": 8, "memory": "8Gi"}])).feasible


def test_init_containers_are_checked_against_unmodified_zones() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}, {"cpu": 4, "memory": "8Gi"}])
    ok = pod([ctr("app", {"cpu": "4", "memory": "1Gi"})],
             init=[ctr("setup", {"cpu": "8", "memory": "1Gi"})])
    assert judge(ok, topo).feasible
    bad = pod([ctr("app", {"cpu": "4", "memory": "1Gi"})],
              init=[ctr("setup", {"cpu": "10", "memory": "1Gi"})])
    assert judge(bad, topo).reason == \
        "cannot align init container setup: cpu 10 > 8 available in best zone"


def test_sidecar_keeps_its_zone_like_an_app_container() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}, {"cpu": 4, "memory": "8Gi"}])
    with_sidecar = pod([ctr("app", {"cpu": "6", "memory": "1Gi"})],
                       init=[ctr("proxy", {"cpu": "4", "memory": "1Gi"}, sidecar=True)])
    v = judge(with_sidecar, topo)
    assert v.reason == "cannot align container app: cpu 6 > 4 available in best zone"
    plain_init = pod([ctr("app", {"cpu": "6", "memory": "1Gi"})],
                     init=[ctr("proxy", {"cpu": "4", "memory": "1Gi"})])
    assert judge(plain_init, topo).feasible


def test_best_effort_pod_passes_without_extended_resources() -> None:
    tiny = nrt("n", [{"cpu": 0, "memory": 0}])
    assert judge(pod([ctr("app")]), tiny).feasible


def test_best_effort_pod_with_extended_resource_is_filtered() -> None:
    topo = nrt("n", [{"cpu": 4, "memory": "4Gi", "example.com/nic": 0}])
    be = pod([ctr("app", {"example.com/nic": "1"}, guaranteed=False)])
    n = node("n1", {"cpu": "8", "memory": "8Gi", "example.com/nic": "2"})
    v = judge(be, topo, node_obj=n)
    assert v.reason == "cannot align container app: example.com/nic 1 > 0 available in best zone"


def test_non_guaranteed_cpu_and_memory_fit_any_zone_listing_them() -> None:
    topo = nrt("n", [{"cpu": 2, "memory": "1Gi"}])
    burstable = pod([ctr("app", {"cpu": "10", "memory": "4Gi"}, guaranteed=False)])
    v = judge(burstable, topo)
    assert v.feasible and v.score == 100


def test_non_guaranteed_devices_are_still_counted() -> None:
    topo = nrt("n", [{"cpu": 2, "memory": "1Gi", "example.com/nic": 1}])
    n = node("n1", {"cpu": "8", "memory": "8Gi", "example.com/nic": "2"})
    burstable = pod([ctr("app", {"cpu": "1", "example.com/nic": "2"},
                         {"example.com/nic": "2"})])
    v = judge(burstable, topo, node_obj=n)
    assert v.reason == "cannot align container app: example.com/nic 2 > 1 available in best zone"


def test_zero_request_is_ignored_even_if_unknown_to_the_node() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}])
    assert judge(gpod("2", extra={"example.com/gpu": "0"}), topo).feasible


def test_resource_missing_from_node_allocatable_makes_node_unfit() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi", "example.com/nic": 4}], scope="pod")
    v = judge(gpod("2", extra={"example.com/nic": "1"}), topo)
    assert v.reason == "cannot align pod: example.com/nic is not in the node's allocatable"


def test_host_level_resources_no_zone_lists_are_skipped() -> None:
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi"}])
    n = node("n1", {"cpu": "8", "memory": "8Gi", "example.com/fpga": "1"})
    p = gpod("2", extra={"ephemeral-storage": "10Gi", "example.com/fpga": "1"})
    assert judge(p, topo, node_obj=n).feasible


def test_cpu_memory_or_hugepages_no_zone_lists_make_node_unfit() -> None:
    n = node("n1", {"cpu": "8", "memory": "8Gi", "hugepages-2Mi": "1Gi"})
    no_hp = nrt("n", [{"cpu": 8, "memory": "8Gi"}])
    v = judge(gpod("2", extra={"hugepages-2Mi": "512Mi"}), no_hp, node_obj=n)
    assert v.reason == "cannot align container app: hugepages-2Mi is not reported by any NUMA zone"
    no_mem = nrt("n", [{"cpu": 8}])
    assert judge(gpod("2"), no_mem).reason == \
        "cannot align container app: memory is not reported by any NUMA zone"


def test_devices_are_aligned_with_cpu_and_memory() -> None:
    n = node("n1", {"cpu": "64", "memory": "64Gi", "example.com/nic": "4",
                    "intel.com/l3_cache_ways": "16"})
    topo = nrt("n", [{"cpu": 16, "memory": "16Gi", "intel.com/l3_cache_ways": 2},
                     {"cpu": 4, "memory": "16Gi", "example.com/nic": 2,
                      "intel.com/l3_cache_ways": 8}])
    # the NIC is only on node-1, which has too few cpus
    v = judge(gpod("8", extra={"example.com/nic": "1"}), topo, node_obj=n)
    assert not v.feasible
    assert judge(gpod("4", extra={"example.com/nic": "1"}), topo, node_obj=n).feasible
    # RDT cache ways: 4 ways exist only on node-1
    assert judge(gpod("2", extra={"intel.com/l3_cache_ways": "4"}), topo, node_obj=n).feasible
    v = judge(gpod("8", extra={"intel.com/l3_cache_ways": "4"}), topo, node_obj=n)
    assert v.reason is not None and "intel.com/l3_cache_ways 4 fits no zone" in v.reason


def test_only_single_numa_node_policy_filters() -> None:
    for policy in ("none", "best-effort", "restricted"):
        topo = nrt("n", [{"cpu": 1, "memory": "1Gi"}], policy=policy)
        v = judge(gpod("9"), topo)
        assert v.feasible and v.policy == policy
        assert v.score == 0  # LeastAllocated scores only single-numa-node nodes


def test_nodes_without_topology_allow_and_deny() -> None:
    allowed = judge(gpod("9"), None)
    assert allowed.feasible and allowed.score == 0 and allowed.policy == "unknown"
    burstable = pod([ctr("app", {"cpu": "1"}, guaranteed=False)])
    assert judge(burstable, None).score == 100
    denied = judge(gpod("9"), None, without="Deny")
    assert not denied.feasible
    assert denied.reason == "no NodeResourceTopology (nodesWithoutTopology=Deny)"


def test_missing_allocatable_means_only_the_always_present_resources() -> None:
    n = {"metadata": {"name": "n1"}}
    topo = nrt("n", [{"cpu": 8, "memory": "8Gi", "example.com/nic": 1}])
    assert judge(gpod("2"), topo, node_obj=n).feasible
    assert not judge(gpod("2", extra={"example.com/nic": "1"}), topo, node_obj=n).feasible


def test_zones_that_are_not_numa_nodes_are_ignored() -> None:
    topo = nrt("n", [{"cpu": 2, "memory": "8Gi"}])
    topo["zones"].append({"name": "socket-0", "type": "Socket",
                          "resources": [{"name": "cpu", "available": 64}]})
    topo["zones"].append({"name": "numa-1", "type": "Node",
                          "resources": [{"name": "cpu", "available": 64}]})
    assert judge(gpod("4"), topo).reason == \
        "cannot align container app: cpu 4 > 2 available in best zone"


def test_container_scope_non_guaranteed_subtracts_devices_only() -> None:
    n = node("n1", {"cpu": "8", "memory": "8Gi", "example.com/nic": "2"})

    def two() -> dict:
        return pod([ctr(c, {"cpu": "4", "example.com/nic": "1"}, {"example.com/nic": "1"})
                    for c in ("a", "b")])
    # cpu is not counted for a Burstable pod (2 cpus listed are enough), the NIC is:
    # a takes node-0's NIC, b goes to node-1
    both = nrt("n", [{"cpu": 2, "memory": "1Gi", "example.com/nic": 1},
                     {"cpu": 2, "memory": "1Gi", "example.com/nic": 1}])
    assert judge(two(), both, node_obj=n).feasible
    one = nrt("n", [{"cpu": 2, "memory": "1Gi", "example.com/nic": 1},
                    {"cpu": 2, "memory": "1Gi"}])
    assert judge(two(), one, node_obj=n).reason == \
        "cannot align container b: example.com/nic 1 > 0 available in best zone"
