"""Gating rules of webhook.gating (issue 4, webhook rule 2)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from podplacement.rules.config import (
    ARCH_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
    TopologyConfig,
)
from podplacement.webhook import gating
from podplacement.webhook.gating import GateDecision, should_gate
from tests.harness.reference import REFERENCE

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


def _placed(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    pod = plain_pod()
    pod["metadata"]["labels"] = labels
    pod["metadata"]["annotations"] = annotations
    return pod


@pytest.mark.parametrize(("labels", "annotations"), [
    # what the policy writes (any catalog uid), preset by the pod's creator
    ({"podplacement.io/scheduling-gate": "removed"},
     {"podplacement.io/decision":
      '{"path":"admission","catalog":"0b0e","archs":["amd64"],"result":"set"}'}),
    ({"podplacement.io/scheduling-gate": "removed"},
     {"podplacement.io/decision": '{"path":"admission","archs":["amd64"],"result":"set"}'}),
    ({"podplacement.io/scheduling-gate": "removed"}, {}),
    ({"podplacement.io/scheduling-gate": "removed"},
     {"podplacement.io/decision": '{"result":"set"}'}),
    ({}, {"podplacement.io/decision": '{"path":"admission"}'}),
    ({"podplacement.io/scheduling-gate": "gated"},
     {"podplacement.io/decision": '{"path":"admission"}'}),
    ({"podplacement.io/node-affinity": "set", "podplacement.io/policy": "p"},
     {"podplacement.io/decision": '{"path":"webhook","result":"set"}'}),
])
def test_no_label_or_annotation_of_the_pod_skips_it(
        labels: dict[str, str], annotations: dict[str, str]) -> None:
    """What a pod's creator can set is never trusted (docs/design.md): the pods the policy
    placed are kept from the webhook by its configuration's matchCondition, which checks
    the current params object's uid (tests/controller/test_lifecycle_webhookconfig.py)."""
    decision = decide(_placed(labels, annotations))
    assert decision.gate and decision.reason == "gated"


def test_pod_with_another_gate_is_gated() -> None:
    assert decide(plain_pod(schedulingGates=[{"name": "example.com/other"}])).gate


PINNED = [
    {"nodeSelector": {ARCH_LABEL: "amd64"}},
    {"nodeSelector": {"kubernetes.io/os": "linux"}},
    {"affinity": arch_required([ARCH_EXPR], [ZONE_EXPR, ARCH_EXPR])},
    {"affinity": arch_required([ARCH_EXPR], [ZONE_EXPR])},
    {"affinity": arch_required([{"key": ARCH_LABEL, "operator": "NotIn", "values": ["s390x"]}])},
    {"affinity": arch_required()},
]


@pytest.mark.parametrize("spec", PINNED)
def test_pods_the_user_pinned_are_gated_too(spec: dict[str, Any]) -> None:
    # A pin may name an architecture the images can't run on: only the controller, which
    # reads the images, can tell, and warn (issue 13).
    assert decide(plain_pod(**spec)) == GateDecision(True, "gated")


def test_nothing_to_decide_is_no_longer_a_reason() -> None:
    assert "nothing_to_decide" not in gating.SKIP_REASONS
    pod = plain_pod(nodeSelector={ARCH_LABEL: "amd64"})
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [ARCH_EXPR]}}]}}
    assert decide(pod).gate and decide(pod, config=NUMA).gate


NUMA = PlacementConfig(topology=TopologyConfig(enabled=True))


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
