"""Gating rules of webhook.gating (issue 4, webhook rule 2)."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any

import pytest

from controller.config import (
    ARCH_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
    PlatformWeight,
    TopologyConfig,
)
from tests.harness.reference import REFERENCE
from webhook import gating
from webhook.gating import GateDecision, qos_class, should_gate

CONFIG = PlacementConfig()
OWN = "podplacement-system"


def recorded_pod(name: str = "a-plain-pod") -> dict[str, Any]:
    review = json.loads((REFERENCE / f"admission-review-raw-{name}.json").read_bytes())
    return review["request"]["object"]


def plain_pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "apps", "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


def decide(pod: dict[str, Any], config: PlacementConfig | None = CONFIG,
           namespace: str = "apps") -> GateDecision:
    return should_gate(pod, namespace=namespace, config=config, own_namespace=OWN)


def arch_required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}


ARCH_EXPR = {"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]}
ZONE_EXPR = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}


def test_recorded_plain_pod_is_gated() -> None:
    assert decide(recorded_pod()) == GateDecision(True, "gated")


def test_recorded_deployment_pod_is_gated() -> None:
    pod = recorded_pod("b-deployment-pod")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert decide(pod).gate


def test_no_config_gates_nothing() -> None:
    assert decide(recorded_pod(), config=None) == GateDecision(False, "no_config")


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "kube-node-lease"])
def test_system_namespaces_are_skipped(namespace: str) -> None:
    assert decide(plain_pod(), namespace=namespace) == GateDecision(False, "system_namespace")


def test_own_namespace_is_skipped() -> None:
    assert decide(plain_pod(), namespace=OWN) == GateDecision(False, "own_namespace")


def test_node_name_set_is_skipped() -> None:
    assert decide(plain_pod(nodeName="node-a")).reason == "node_name_set"


def test_empty_node_name_does_not_skip() -> None:
    assert decide(plain_pod(nodeName="")).gate


def test_daemonset_controller_owner_is_skipped() -> None:
    pod = plain_pod()
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u",
         "controller": True, "blockOwnerDeletion": True}]
    assert decide(pod).reason == "daemonset"


def test_daemonset_owner_that_is_not_the_controller_does_not_skip() -> None:
    pod = plain_pod()
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u"}]
    assert decide(pod).gate


def test_pod_with_our_gate_is_skipped() -> None:
    pod = plain_pod(schedulingGates=[{"name": "other"}, {"name": SCHEDULING_GATE}])
    assert decide(pod).reason == "already_gated"


def test_pod_with_another_gate_is_gated() -> None:
    assert decide(plain_pod(schedulingGates=[{"name": "example.com/other"}])).gate


def test_arch_in_node_selector_means_nothing_to_decide() -> None:
    pod = plain_pod(nodeSelector={ARCH_LABEL: "amd64"})
    assert decide(pod) == GateDecision(False, "nothing_to_decide")


def test_os_node_selector_alone_does_not_pin_the_arch() -> None:
    assert decide(plain_pod(nodeSelector={"kubernetes.io/os": "linux"})).gate


def test_arch_expression_in_every_required_term_means_nothing_to_decide() -> None:
    pod = plain_pod(affinity=arch_required([ARCH_EXPR], [ZONE_EXPR, ARCH_EXPR]))
    assert decide(pod).reason == "nothing_to_decide"


def test_arch_expression_missing_from_one_term_is_gated() -> None:
    pod = plain_pod(affinity=arch_required([ARCH_EXPR], [ZONE_EXPR]))
    assert decide(pod).gate


def test_empty_term_list_does_not_pin() -> None:
    assert decide(plain_pod(affinity=arch_required())).gate


def test_preferred_platforms_to_add_gate_a_pinned_pod() -> None:
    config = PlacementConfig(preferred_platforms=(PlatformWeight("arm64", 50),))
    pod = plain_pod(nodeSelector={ARCH_LABEL: "amd64"})
    assert decide(pod, config=config).gate


def test_existing_arch_preference_means_no_preference_to_add() -> None:
    config = PlacementConfig(preferred_platforms=(PlatformWeight("arm64", 50),))
    pod = plain_pod(nodeSelector={ARCH_LABEL: "amd64"})
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [ARCH_EXPR]}}]}}
    assert decide(pod, config=config).reason == "nothing_to_decide"


def guaranteed_resources() -> dict[str, Any]:
    both = {"cpu": "1", "memory": "1Gi"}
    return {"requests": dict(both), "limits": dict(both)}


NUMA = PlacementConfig(topology=TopologyConfig(enabled=True))


def test_guaranteed_pinned_pod_is_gated_when_numa_is_enabled() -> None:
    pod = plain_pod(nodeSelector={ARCH_LABEL: "amd64"})
    pod["spec"]["containers"][0]["resources"] = guaranteed_resources()
    assert decide(pod, config=NUMA).gate
    assert decide(pod, config=CONFIG).reason == "nothing_to_decide"


def test_burstable_pinned_pod_is_not_gated_for_numa() -> None:
    pod = plain_pod(nodeSelector={ARCH_LABEL: "amd64"})
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert decide(pod, config=NUMA).reason == "nothing_to_decide"


def test_extended_resource_pinned_pod_is_gated_when_numa_is_enabled() -> None:
    pod = plain_pod(nodeSelector={ARCH_LABEL: "amd64"})
    pod["spec"]["initContainers"] = [
        {"name": "i", "image": "x", "resources": {"limits": {"example.com/gpu": "1"}}}]
    assert decide(pod, config=NUMA).gate


@pytest.mark.parametrize(
    ("name", "extended"),
    [("example.com/gpu", True), ("nvidia.com/gpu", True), ("cpu", False),
     ("hugepages-2Mi", False), ("kubernetes.io/foo", False), ("node.kubernetes.io/x", False),
     ("requests.example.com/gpu", False)],
)
def test_extended_resource_names(name: str, extended: bool) -> None:
    assert gating.is_extended_resource(name) is extended


def with_resources(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
                   pod_level: dict[str, Any] | None = None) -> dict[str, Any]:
    pod = plain_pod()
    pod["spec"]["containers"] = [{"name": f"c{i}", "resources": r}
                                 for i, r in enumerate(containers)]
    if init:
        pod["spec"]["initContainers"] = [{"name": f"i{i}", "resources": r}
                                         for i, r in enumerate(init)]
    if pod_level is not None:
        pod["spec"]["resources"] = pod_level
    return pod


def test_qos_best_effort() -> None:
    assert qos_class(with_resources({}, {})) == "BestEffort"


def test_qos_guaranteed_with_equal_requests_and_limits_in_different_units() -> None:
    res = {"requests": {"cpu": "500m", "memory": "1024Mi"},
           "limits": {"cpu": "0.5", "memory": "1Gi"}}
    assert qos_class(with_resources(res)) == "Guaranteed"


def test_qos_limits_only_default_requests_to_limits() -> None:
    assert qos_class(with_resources({"limits": {"cpu": "1", "memory": "1Gi"}})) == "Guaranteed"


def test_qos_init_container_without_limits_makes_burstable() -> None:
    pod = with_resources(guaranteed_resources(), init=({"requests": {"cpu": "100m"}},))
    assert qos_class(pod) == "Burstable"


def test_qos_init_container_with_limits_keeps_guaranteed() -> None:
    pod = with_resources(guaranteed_resources(), init=(guaranteed_resources(),))
    assert qos_class(pod) == "Guaranteed"


def test_qos_missing_memory_limit_is_burstable() -> None:
    res = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
    assert qos_class(with_resources(res)) == "Burstable"


def test_qos_requests_below_limits_is_burstable() -> None:
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert qos_class(with_resources(res)) == "Burstable"


def test_qos_zero_quantities_do_not_count() -> None:
    assert qos_class(with_resources({"requests": {"cpu": "0", "memory": "0"}})) == "BestEffort"


def test_qos_pod_level_resources_decide() -> None:
    pod = with_resources({}, pod_level={"limits": {"cpu": "2", "memory": "2Gi"}})
    assert qos_class(pod) == "Guaranteed"


def test_recorded_pod_is_burstable() -> None:
    # app container: requests 100m/64Mi < limits 200m/128Mi; sidecar and init have none.
    assert qos_class(recorded_pod()) == "Burstable"


@pytest.mark.parametrize(
    ("text", "value"),
    [("100m", Decimal("0.1")), ("1Gi", Decimal(2**30)), ("1e3", Decimal(1000)),
     ("2k", Decimal(2000)), ("1.5", Decimal("1.5")), (3, Decimal(3)), ("1E", Decimal("1e18"))],
)
def test_parse_quantity(text: Any, value: Decimal) -> None:
    assert gating.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1Zi", "NaN", "Infinity", None, True, [], "m"])
def test_parse_quantity_rejects(text: Any) -> None:
    assert gating.parse_quantity(text) is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.__setitem__("spec", "x"),
        lambda p: p["spec"].__setitem__("affinity", []),
        lambda p: p["spec"].__setitem__("nodeSelector", "amd64"),
        lambda p: p["spec"].__setitem__("containers", {"a": 1}),
        lambda p: p["metadata"].__setitem__("ownerReferences", [1, None, "x"]),
        lambda p: p["spec"].__setitem__("schedulingGates", [None, 3]),
    ],
)
def test_wrong_types_are_treated_as_absent(mutate: Any) -> None:
    pod = copy.deepcopy(recorded_pod())
    mutate(pod)
    assert decide(pod, config=NUMA).gate
