"""The MutatingAdmissionPolicy podplacement-gate and its binding, as pure data (the real
API server evaluates them in tests/controller/test_admissionpolicy_place_realcluster.py and
tests/test_faults_realcluster.py)."""

from __future__ import annotations

import copy
from typing import Any

from podplacement.rules.admit import admissionpolicy as ap
from podplacement.rules.admit.predicates import cel_string
from podplacement.rules.admit.webhookconfig import webhook_namespace_selection
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    API_VERSION,
    PARAMS_KIND,
    PARAMS_NAME,
    SCHEDULING_GATE,
    PlacementConfig,
    PlatformWeight,
    TopologyConfig,
)
from podplacement.rules.ownership import namespace_owner

CONFIG: dict[str, Any] = {
    "apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
    "metadata": {"name": "cluster", "uid": "u-1"},
    "spec": {"namespaceSelector": {"matchLabels": {"team": "legacy"}}},
}
NS = "podplacement-system"
OWNER = namespace_owner({"metadata": {"name": NS, "uid": "ns-1"}})
WEIGHTED = PlacementConfig(preferred_platforms=(PlatformWeight("arm64", 60),
                                                PlatformWeight("amd64", 5)))


def test_policy_gates_pod_creates_and_never_denies() -> None:
    policy = ap.desired_policy(PlacementConfig(), OWNER)
    spec = policy["spec"]
    assert policy["metadata"]["name"] == ADMISSION_POLICY_NAME
    assert policy["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Namespace", "name": NS, "uid": "ns-1"}]
    assert spec["failurePolicy"] == "Ignore" and spec["reinvocationPolicy"] == "Never"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
         "resources": ["pods"]}]
    # the place policy writes its skip rules into the JSONPatch, the gate-only one keeps them
    # as matchConditions
    assert "matchConditions" not in spec
    gate_only = ap.desired_policy(PlacementConfig(admission_fast_paths="Disabled"), OWNER)
    names = [c["name"] for c in gate_only["spec"]["matchConditions"]]
    assert names == ["not-bound", "not-daemonset", "not-gated"]


def test_without_an_owner_the_objects_have_no_owner_references() -> None:
    assert "ownerReferences" not in ap.desired_policy(PlacementConfig())["metadata"]
    assert namespace_owner(None) == [] and namespace_owner({"metadata": {"name": NS}}) == []


def test_default_config_places_or_gates_with_one_json_patch() -> None:
    spec = ap.desired_policy(PlacementConfig())["spec"]
    assert spec["paramKind"] == {"apiVersion": API_VERSION, "kind": PARAMS_KIND}
    (patch,) = spec["mutations"]
    assert patch["patchType"] == "JSONPatch"
    expression = patch["jsonPatch"]["expression"]
    # the skip rules first (a bound or DaemonSet pod: no op), then a pod created with our
    # gate (the label only), then place or gate
    skip, rest = expression.split(f" ? {ap.NO_PATCH} : ", 1)
    assert "object.spec.nodeName" in skip and "'DaemonSet'" in skip
    assert "!variables.placed ? (has(object.spec.schedulingGates) ? [] : " in rest
    assert f"name: '{SCHEDULING_GATE}'" in expression
    assert "'/spec/schedulingGates/-'" in expression
    assert "jsonpatch.escapeKey('podplacement.io/scheduling-gate'), value: 'gated'" in expression


def test_variables_are_declared_before_use() -> None:
    variables = ap.desired_policy(WEIGHTED)["spec"]["variables"]
    names = [v["name"] for v in variables]
    assert names == ["images", "repos", "sets", "refs", "codes", "fresh", "known", "free",
                     "policies", "labels", "matched", "hasPolicy", "single", "first", "lists",
                     "pairs", "archs", "linuxOnly", "allowedOk", "placed", "weights",
                     "preferredArchs", "archTaints", "ownTolerations", "addTolerations",
                     "decision"]
    for i, var in enumerate(variables):
        later = names[i:]
        assert not any(f"variables.{n}" in var["expression"] for n in later), var["name"]


def test_fast_paths_disabled_or_numa_gate_only_but_keep_the_params_dead_man_switch() -> None:
    for config in (PlacementConfig(admission_fast_paths="Disabled"),
                   PlacementConfig(topology=TopologyConfig(enabled=True))):
        assert not ap.places(config)
        spec = ap.desired_policy(config)["spec"]
        assert "variables" not in spec
        assert spec["paramKind"] == {"apiVersion": API_VERSION, "kind": PARAMS_KIND}
        (mutation,) = spec["mutations"]
        assert mutation["applyConfiguration"]["expression"] == ap.GATE_MUTATION


def test_placement_config_parses_the_object_or_falls_back_to_defaults() -> None:
    obj = copy.deepcopy(CONFIG)
    obj["spec"]["admission"] = {"fastPaths": "Disabled"}
    assert "variables" not in ap.desired_policy(ap.placement_config(obj))["spec"]
    obj["spec"]["admission"] = {"fastPaths": "Sometimes"}  # invalid: the defaults apply
    assert ap.placement_config(obj) == PlacementConfig()
    assert "variables" in ap.desired_policy(ap.placement_config(obj))["spec"]
    assert ap.placement_config(None) == PlacementConfig()


def test_preferred_weights_are_the_policys_or_the_clusters_cel_literals() -> None:
    weighted = ap.desired_policy(WEIGHTED)["spec"]
    (mutation,) = weighted["mutations"]
    patch = mutation["jsonPatch"]["expression"]
    assert "variables.weights[a]" in patch
    assert "?preferredDuringSchedulingIgnoredDuringExecution" in patch
    weights = {v["name"]: v["expression"] for v in weighted["variables"]}["weights"]
    assert weights.endswith("variables.matched[0].weights : {'amd64': 5, 'arm64': 60}")
    plain = {v["name"]: v["expression"]
             for v in ap.desired_policy(PlacementConfig())["spec"]["variables"]}
    assert plain["weights"].endswith(": {}")


def test_label_and_annotation_keys_are_escaped_and_maps_created_when_absent() -> None:
    patch = ap.place_patch_mutation()
    assert "jsonpatch.escapeKey('podplacement.io/scheduling-gate')" in patch
    assert "jsonpatch.escapeKey('podplacement.io/decision')" in patch
    assert "has(object.metadata.labels) ?" in patch
    assert "has(object.metadata.annotations) ?" in patch
    assert "has(object.spec.affinity) ?" in patch


def test_cel_string_quotes_safely() -> None:
    assert cel_string('{"a":1}') == "'{\"a\":1}'"
    assert cel_string("it's") == '"it\'s"'
    assert cel_string("back\\slash") == '"back\\\\slash"'


def test_binding_uses_the_webhooks_namespace_selection_and_the_params() -> None:
    selection = webhook_namespace_selection(CONFIG, "podplacement-system")
    binding = ap.desired_binding(selection, params_namespace=NS, owner=OWNER)
    assert binding["spec"]["policyName"] == ADMISSION_POLICY_NAME
    assert binding["spec"]["paramRef"] == {"name": PARAMS_NAME, "namespace": NS,
                                           "parameterNotFoundAction": "Allow"}
    assert binding["metadata"]["ownerReferences"] == OWNER
    exprs = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert {"key": "team", "operator": "NotIn", "values": ["legacy"]} in exprs
    system = next(e for e in exprs if e["key"] == "kubernetes.io/metadata.name")
    assert {"kube-system", "podplacement-system"} <= set(system["values"])


def test_drift_is_a_changed_field_we_set_not_a_server_default() -> None:
    desired = ap.desired_policy(WEIGHTED, OWNER)
    live = copy.deepcopy(desired)
    live["spec"]["matchConstraints"]["namespaceSelector"] = {}  # defaulted by the server
    live["spec"]["matchConstraints"]["objectSelector"] = {}
    assert not ap.policy_drifted(live, desired)
    live["spec"]["failurePolicy"] = "Fail"
    assert ap.policy_drifted(live, desired)
    live = copy.deepcopy(desired)
    live["spec"]["mutations"][0]["jsonPatch"]["expression"] += " "
    assert ap.policy_drifted(live, desired)
    gate_only = ap.desired_policy(PlacementConfig(admission_fast_paths="Disabled"), OWNER)
    live = copy.deepcopy(gate_only)
    live["spec"]["matchConditions"].pop()
    assert ap.policy_drifted(live, gate_only)


def test_a_config_change_is_drift() -> None:
    live = ap.desired_policy(PlacementConfig(), OWNER)
    assert ap.policy_drifted(live, ap.desired_policy(WEIGHTED, OWNER))
    assert ap.policy_drifted(ap.desired_policy(PlacementConfig(admission_fast_paths="Disabled"),
                                               OWNER), live)
    assert ap.policy_drifted(live, ap.desired_policy(
        PlacementConfig(admission_fast_paths="Disabled"), OWNER))
    assert not ap.policy_drifted(live, ap.desired_policy(PlacementConfig(), OWNER))


def test_the_empty_params_object_is_the_bindings_param_and_is_never_reverted() -> None:
    obj = ap.params_object(NS)
    assert (obj["apiVersion"], obj["kind"]) == (API_VERSION, PARAMS_KIND)
    assert obj["metadata"]["name"] == PARAMS_NAME and obj["spec"] == {"repositories": {}}
    assert obj["metadata"]["namespace"] == NS
    live = {**obj, "spec": {"repositories": {"reg/a": {":1": "a"}}}}
    assert not ap.never_drifted(live, obj)
