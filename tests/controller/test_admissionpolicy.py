"""The MutatingAdmissionPolicy podplacement-gate and its binding, as pure data (the real
API server evaluates them in tests/test_faults_realcluster.py)."""

from __future__ import annotations

import copy
from typing import Any

from controller import admissionpolicy as ap
from controller.config import ADMISSION_POLICY_NAME, GATE_LABEL, SCHEDULING_GATE
from controller.webhookconfig import webhook_namespace_selection

CONFIG: dict[str, Any] = {
    "apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
    "metadata": {"name": "cluster", "uid": "u-1"},
    "spec": {"namespaceSelector": {"matchLabels": {"team": "legacy"}}},
}


def test_policy_gates_pod_creates_and_never_denies() -> None:
    policy = ap.desired_policy(CONFIG)
    spec = policy["spec"]
    assert policy["metadata"]["name"] == ADMISSION_POLICY_NAME
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert spec["failurePolicy"] == "Ignore" and spec["reinvocationPolicy"] == "Never"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
         "resources": ["pods"]}]
    (mutation,) = spec["mutations"]
    assert mutation["patchType"] == "ApplyConfiguration"
    expression = mutation["applyConfiguration"]["expression"]
    assert f'name: "{SCHEDULING_GATE}"' in expression and f'"{GATE_LABEL}": "gated"' in expression
    names = [c["name"] for c in spec["matchConditions"]]
    assert names == ["not-bound", "not-daemonset", "not-gated"]


def test_binding_uses_the_webhooks_namespace_selection() -> None:
    selection = webhook_namespace_selection(CONFIG, "podplacement-system")
    binding = ap.desired_binding(CONFIG, selection)
    assert binding["spec"]["policyName"] == ADMISSION_POLICY_NAME
    exprs = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert {"key": "team", "operator": "NotIn", "values": ["legacy"]} in exprs
    system = next(e for e in exprs if e["key"] == "kubernetes.io/metadata.name")
    assert {"kube-system", "podplacement-system"} <= set(system["values"])


def test_drift_is_a_changed_field_we_set_not_a_server_default() -> None:
    desired = ap.desired_policy(CONFIG)
    live = copy.deepcopy(desired)
    live["spec"]["matchConstraints"]["namespaceSelector"] = {}  # defaulted by the server
    live["spec"]["matchConstraints"]["objectSelector"] = {}
    assert not ap.policy_drifted(live, desired)
    live["spec"]["failurePolicy"] = "Fail"
    assert ap.policy_drifted(live, desired)
    live = copy.deepcopy(desired)
    live["spec"]["matchConditions"].pop()
    assert ap.policy_drifted(live, desired)
