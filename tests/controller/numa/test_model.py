"""Quantities, QoS classes, effective requests and NRT parsing."""

from __future__ import annotations

import json

import pytest

from podplacement.rules.numa import (
    QuantityError,
    effective_requests,
    format_quantity,
    parse_quantity,
    parse_topology,
    qos_class,
    topology_policy,
)
from tests.controller.numa._build import ctr, nrt, pod
from tests.harness.reference import REFERENCE as _REFERENCE_DIR

REFERENCE = _REFERENCE_DIR / "crd-noderesourcetopology.json"


@pytest.mark.parametrize(("resource", "value", "expected"), [
    ("cpu", "500m", 500),
    ("cpu", "2", 2000),
    ("cpu", 4, 4000),
    ("cpu", "0.1", 100),
    ("cpu", "100n", 1),          # rounded up like MilliValue()
    ("memory", "2Gi", 2 * 1024**3),
    ("memory", "1e3", 1000),
    ("memory", "1.5", 2),        # rounded up like Value()
    ("memory", "1k", 1000),
    ("memory", "1E", 10**18),    # exa, not an exponent
    ("memory", "1Ki", 1024),
    ("example.com/nic", "3", 3),
    ("hugepages-2Mi", "512Mi", 512 * 1024**2),
])
def test_parse_quantity(resource: str, value: object, expected: int) -> None:
    assert parse_quantity(resource, value) == expected


@pytest.mark.parametrize("bad", ["lots", "", "1.2.3", "Gi", True, None, "5 Gi"])
def test_parse_quantity_rejects_garbage(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity("memory", bad)


def test_format_quantity() -> None:
    assert format_quantity("cpu", 9000) == "9"
    assert format_quantity("cpu", 1500) == "1500m"
    assert format_quantity("memory", 40 * 1024**3) == "40Gi"
    assert format_quantity("memory", 1000) == "1000"
    assert format_quantity("hugepages-1Gi", 2 * 1024**3) == "2Gi"
    assert format_quantity("example.com/nic", 2048) == "2048"


def test_qos_classes() -> None:
    assert qos_class(pod([ctr("a")])) == "BestEffort"
    assert qos_class(pod([ctr("a", {"cpu": "1", "memory": "1Gi"})])) == "Guaranteed"
    assert qos_class(pod([ctr("a", {"cpu": "1"}, guaranteed=False)])) == "Burstable"
    # limits only: requests default to limits
    assert qos_class(pod([ctr("a", None, {"cpu": "1", "memory": "1Gi"})])) == "Guaranteed"
    # requests below limits
    assert qos_class(pod([ctr("a", {"cpu": "1", "memory": "1Gi"},
                              {"cpu": "2", "memory": "1Gi"})])) == "Burstable"
    # one container without memory limit spoils it
    mixed = pod([ctr("a", {"cpu": "1", "memory": "1Gi"}), ctr("b", {"cpu": "1"})])
    assert qos_class(mixed) == "Burstable"
    # extended resources alone do not make a pod Burstable
    assert qos_class(pod([ctr("a", {"example.com/nic": "1"})])) == "BestEffort"
    # pod-level resources (KEP-2837) replace the container sums
    pod_level = pod([ctr("a"), ctr("b")])
    pod_level["spec"]["resources"] = {"limits": {"cpu": "2", "memory": "2Gi"}}
    assert qos_class(pod_level) == "Guaranteed"
    pod_level["spec"]["resources"]["requests"] = {"cpu": "1"}
    assert qos_class(pod_level) == "Burstable"
    # the API server's verdict wins
    stored = pod([ctr("a")])
    stored["status"] = {"qosClass": "Burstable"}
    assert qos_class(stored) == "Burstable"


def test_effective_requests_max_of_apps_and_largest_init_plus_overhead() -> None:
    p = pod([ctr("a", {"cpu": "1", "memory": "1Gi"}), ctr("b", {"cpu": "2", "memory": "1Gi"})],
            init=[ctr("i1", {"cpu": "4", "memory": "512Mi"}),
                  ctr("i2", {"cpu": "1", "memory": "3Gi"})],
            overhead={"cpu": "250m", "memory": "128Mi"})
    assert effective_requests(p) == {"cpu": 4250, "memory": 3 * 1024**3 + 128 * 1024**2}


def test_effective_requests_count_sidecars_like_app_containers() -> None:
    # sidecar s (1 cpu) runs along the app (2 cpu) and along the later init container i (2 cpu)
    p = pod([ctr("a", {"cpu": "2", "memory": "1Gi"})],
            init=[ctr("s", {"cpu": "1", "memory": "1Gi"}, sidecar=True),
                  ctr("i", {"cpu": "2", "memory": "1Gi"})])
    # apps + sidecars = 3 cpu / 2Gi; init i with the sidecar = 3 cpu / 2Gi
    assert effective_requests(p) == {"cpu": 3000, "memory": 2 * 1024**3}
    bigger_init = pod([ctr("a", {"cpu": "2", "memory": "1Gi"})],
                      init=[ctr("s", {"cpu": "1", "memory": "1Gi"}, sidecar=True),
                            ctr("i", {"cpu": "5", "memory": "1Gi"})])
    assert effective_requests(bigger_init)["cpu"] == 6000


def test_reference_nrt_with_ints_and_strings() -> None:
    if not REFERENCE.exists():
        pytest.skip("recorded reference exchanges not available")
    data = json.loads(REFERENCE.read_text())
    created = next(e for e in data["exchanges"] if e["request"]["method"] == "POST"
                   and e["response"]["status"] == 201
                   and e["response"]["body"].get("kind") == "NodeResourceTopology")
    created = created["response"]["body"]
    topo = parse_topology(created)
    assert topo.name == "node-a"
    assert (topo.policy, topo.scope) == ("single-numa-node", "container")
    assert [z.numa_id for z in topo.zones] == [0, 1]
    assert topo.zones[0].available == {"cpu": 22000, "memory": 40 * 1024**3,
                                       "example.com/nic": 1}
    assert topo.zones[1].available["hugepages-2Mi"] == 512 * 1024**2
    assert topo.zones[1].costs == {0: 20, 1: 10}
    assert topo.zone_resources == {"cpu", "memory", "example.com/nic", "hugepages-2Mi"}


@pytest.mark.parametrize(("legacy", "attrs", "expected"), [
    (None, {}, ("none", "container")),
    (["SingleNUMANodePodLevel"], {}, ("single-numa-node", "pod")),
    (["RestrictedContainerLevel"], {}, ("restricted", "container")),
    (["BestEffortPodLevel"], {}, ("best-effort", "pod")),
    (["None"], {}, ("none", "container")),
    # attributes override the deprecated list, field by field
    (["SingleNUMANodePodLevel"], {"topologyManagerScope": "container"},
     ("single-numa-node", "container")),
    (None, {"topologyManagerPolicy": "bogus", "topologyManagerScope": "pod"}, ("none", "pod")),
])
def test_topology_policy(legacy: list[str] | None, attrs: dict[str, str],
                         expected: tuple[str, str]) -> None:
    obj = nrt("n", [{"cpu": 1}], policy=None, scope=None, attrs=attrs, legacy=legacy)
    assert topology_policy(obj) == expected


def test_max_numa_nodes_attribute_is_validated() -> None:
    def max_of(value: str) -> int:
        return parse_topology(nrt("n", [{"cpu": 1}],
                                  attrs={"topologyManagerMaxNUMANodes": value})).max_numa_nodes
    assert max_of("16") == 16
    assert max_of("1") == 8       # must be > 1
    assert max_of("x") == 8
    assert max_of("5000") == 1024  # capped


def test_zones_are_sorted_by_numa_id_whatever_the_list_order() -> None:
    obj = nrt("n", [{"cpu": 1}, {"cpu": 2}, {"cpu": 3}])
    obj["zones"].reverse()
    assert [z.numa_id for z in parse_topology(obj).zones] == [0, 1, 2]


def test_fingerprint_attribute_and_legacy_annotation() -> None:
    obj = nrt("n", [{"cpu": 1}], attrs={"nodeTopologyPodsFingerprint": "pfp0v001abc",
                                        "nodeTopologyPodsFingerprintMethod": "all"})
    topo = parse_topology(obj)
    assert (topo.fingerprint, topo.fingerprint_method) == ("pfp0v001abc", "all")
    legacy = nrt("n", [{"cpu": 1}])
    legacy["metadata"]["annotations"] = {"topology.node.k8s.io/fingerprint": "pfp0v001def"}
    assert parse_topology(legacy).fingerprint == "pfp0v001def"
