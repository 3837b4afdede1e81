"""Hand-written cases for localkube.podrules: defaulting, QoS, create and update validation."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localkube import podrules
from localkube.errors import StatusError
from podplacement.rules.config import SCHEDULING_GATE


def _container(name: str = "c", image: str = "busybox:1.36", **resources: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": image}
    if resources:
        container["resources"] = resources
    return container


def _pod(
    *containers: dict[str, Any], gates: list[str] | None = None, **spec: Any
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}},
        "spec": {"containers": list(containers) or [_container()], **spec},
    }
    if gates is not None:
        pod["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return pod


def _created(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    podrules.prepare_pod_create(out)
    return out


def _causes(exc: StatusError) -> list[tuple[str, str, str]]:
    assert exc.details is not None
    return [(c["reason"], c["field"], c["message"]) for c in exc.details["causes"]]


# --- quantities and QoS ---------------------------------------------------------------------


def test_qos_and_quantities_are_the_products_own() -> None:
    """One quantity grammar and one QoS rule: localkube uses the product's
    (rules.podspec); only the canonical text the API server stores is its own."""
    from podplacement.rules import podspec

    assert podrules.compute_qos_class is podspec.compute_qos_class
    assert podrules.quantity_exact is podspec.quantity_exact
    with pytest.raises(ValueError):
        podrules.canonical_quantity("lots")


@pytest.mark.parametrize(
    ("containers", "init", "qos"),
    [
        ([_container()], [], "BestEffort"),
        ([_container(requests={"cpu": "0", "memory": "0"})], [], "BestEffort"),
        ([_container(requests={"cpu": "100m"})], [], "Burstable"),
        ([_container(limits={"cpu": "1", "memory": "1Gi"})], [], "Guaranteed"),
        (
            [
                _container(
                    requests={"cpu": "1000m", "memory": "1024Mi"},
                    limits={"cpu": "1", "memory": "1Gi"},
                )
            ],
            [],
            "Guaranteed",
        ),
        (
            [
                _container(
                    requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"}
                )
            ],
            [],
            "Burstable",
        ),
        ([_container(limits={"cpu": "1"})], [], "Burstable"),
        (
            [_container("a", limits={"cpu": "1", "memory": "1Gi"}), _container("b")],
            [],
            "Burstable",
        ),
        (
            [_container("a", limits={"cpu": "1", "memory": "1Gi"})],
            [_container("i")],
            "Burstable",
        ),
        ([_container(requests={"ephemeral-storage": "1Gi"})], [], "BestEffort"),
    ],
)
def test_qos_class(containers: list[dict[str, Any]], init: list[dict[str, Any]], qos: str) -> None:
    pod = _pod(*containers)
    if init:
        pod["spec"]["initContainers"] = init
    assert _created(pod)["status"]["qosClass"] == qos


# --- defaulting -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("docker.io/library/busybox:1.36", "IfNotPresent"),
        ("localhost:5000/team/app", "Always"),
        ("localhost:5000/team/app:v1", "IfNotPresent"),
        ("quay.io/x/y@sha256:" + "a" * 64, "IfNotPresent"),
        ("quay.io/x/y:latest@sha256:" + "a" * 64, "Always"),
    ],
)
def test_image_pull_policy(image: str, policy: str) -> None:
    assert podrules.image_pull_policy(image) == policy


def test_defaults_match_the_recorded_stored_pod_fields() -> None:
    container = {**_container(image="busybox"), "ports": [{"containerPort": 80}]}
    pod = _created(_pod(container))
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Always"
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["dnsPolicy"] == "ClusterFirst"
    assert spec["schedulerName"] == "default-scheduler"
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
    assert spec["priority"] == 0 and spec["enableServiceLinks"] is True
    container = spec["containers"][0]
    assert container["imagePullPolicy"] == "Always"
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "File"
    assert container["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert spec["tolerations"] == [
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ]
    assert pod["status"] == {"phase": "Pending", "qosClass": "BestEffort"}


def test_requests_default_from_limits() -> None:
    pod = _created(_pod(_container(limits={"cpu": "1", "memory": "1Gi"}, requests={"cpu": "500m"})))
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}


def test_existing_tolerations_for_the_taints_are_kept() -> None:
    own = {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 5,
    }
    pod = _created(_pod(tolerations=[own]))
    keys = [(t["key"], t.get("tolerationSeconds")) for t in pod["spec"]["tolerations"]]
    assert keys == [("node.kubernetes.io/not-ready", 5), ("node.kubernetes.io/unreachable", 300)]


def test_gated_pod_gets_the_scheduling_gated_condition() -> None:
    pod = _created(_pod(gates=[SCHEDULING_GATE]))
    (condition,) = pod["status"]["conditions"]
    assert condition["type"] == "PodScheduled"
    assert condition["status"] == "False"
    assert condition["reason"] == "SchedulingGated"
    assert condition["message"] == "Scheduling is blocked due to non-empty scheduling gates"
    assert condition["lastProbeTime"] is None
    assert condition["lastTransitionTime"].endswith("Z")
    assert list(pod["status"]) == ["phase", "conditions", "qosClass"]


def test_prepare_pod_create_is_idempotent() -> None:
    once = _created(_pod(gates=[SCHEDULING_GATE]))
    twice = copy.deepcopy(once)
    podrules.prepare_pod_create(twice)
    assert twice == once


def test_user_status_is_replaced_at_create() -> None:
    pod = _pod()
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.1"}
    assert _created(pod)["status"] == {"phase": "Pending", "qosClass": "BestEffort"}


# --- create validation ----------------------------------------------------------------------


def test_pod_without_containers_is_rejected_like_the_real_server() -> None:
    pod = _pod()
    pod["metadata"] = {"name": "x"}
    pod["spec"]["containers"] = []
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(pod)
    assert info.value.body() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Pod "x" is invalid: spec.containers: Required value',
        "reason": "Invalid",
        "details": {
            "name": "x",
            "kind": "Pod",
            "causes": [
                {
                    "reason": "FieldValueRequired",
                    "message": "Required value",
                    "field": "spec.containers",
                }
            ],
        },
        "code": 422,
    }


def test_invalid_pod_name() -> None:
    pod = _pod()
    pod["metadata"]["name"] = "Bad_Name"
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(pod)
    assert info.value.message == (
        'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 '
        "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
        "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    )


def test_generate_name_without_name_is_accepted() -> None:
    pod = _pod()
    pod["metadata"] = {"generateName": "web-"}
    podrules.prepare_pod_create(pod)
    pod["metadata"] = {}
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(pod)
    assert _causes(info.value) == [
        ("FieldValueRequired", "metadata.name", "Required value: name or generateName is required")
    ]


def test_duplicate_gate_is_rejected() -> None:
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(_pod(gates=[SCHEDULING_GATE, SCHEDULING_GATE]))
    assert (
        info.value.message
        == f'Pod "p" is invalid: spec.schedulingGates[1]: Duplicate value: "{SCHEDULING_GATE}"'
    )


def test_gate_names_must_be_qualified_names() -> None:
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(_pod(gates=["Bad/x", "-bad"]))
    causes = _causes(info.value)
    assert [c[1] for c in causes] == ["spec.schedulingGates[0]", "spec.schedulingGates[1]"]
    assert causes[0][2].startswith(
        'Invalid value: "Bad/x": prefix part a lowercase RFC 1123 subdomain'
    )
    assert causes[1][2] == (
        "Invalid value: \"-bad\": name part must consist of alphanumeric characters, '-', '_' or "
        "'.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
        "'my.name',  or '123-abc', regex used for validation is "
        "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )


def test_qualified_name_rules() -> None:
    assert podrules.qualified_name_errors("podplacement.io/scheduling-gate") == []
    assert podrules.qualified_name_errors("a/b/c")[0].startswith("a qualified name must consist")
    assert podrules.qualified_name_errors("/x") == ["prefix part must be non-empty"]
    assert "name part must be no more than 63 characters" in podrules.qualified_name_errors(
        "a" * 64
    )


# --- update validation ----------------------------------------------------------------------


def _update_error(old: dict[str, Any], new: dict[str, Any]) -> StatusError:
    with pytest.raises(StatusError) as info:
        podrules.validate_pod_update(old, new)
    return info.value


def test_image_labels_and_new_tolerations_may_change_on_any_pod() -> None:
    old = _created(_pod())
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "busybox:1.37"
    new["metadata"]["labels"]["extra"] = "1"
    new["spec"]["tolerations"].append({"key": "k", "operator": "Exists"})
    new["spec"]["tolerations"][0]["tolerationSeconds"] = 10
    podrules.validate_pod_update(old, new)


def test_existing_toleration_cannot_change() -> None:
    old = _created(_pod())
    new = copy.deepcopy(old)
    new["spec"]["tolerations"][0]["effect"] = "NoSchedule"
    assert _causes(_update_error(old, new))[0] == (
        "FieldValueForbidden",
        "spec.tolerations",
        "Forbidden: existing toleration can not be modified except its tolerationSeconds",
    )


def test_containers_cannot_be_added() -> None:
    old = _created(_pod())
    new = copy.deepcopy(old)
    new["spec"]["containers"].append(_container("d"))
    assert _causes(_update_error(old, new)) == [
        (
            "FieldValueForbidden",
            "spec.containers",
            "Forbidden: pod updates may not add or remove containers",
        )
    ]


def test_active_deadline_may_be_set_and_lowered_only() -> None:
    old = _created(_pod())
    new = copy.deepcopy(old)
    new["spec"]["activeDeadlineSeconds"] = 100
    podrules.validate_pod_update(old, new)
    higher = copy.deepcopy(new)
    higher["spec"]["activeDeadlineSeconds"] = 200
    assert _causes(_update_error(new, higher)) == [
        (
            "FieldValueInvalid",
            "spec.activeDeadlineSeconds",
            "Invalid value: 200: must be less than or equal to previous value",
        )
    ]


def test_name_is_immutable() -> None:
    old = _created(_pod())
    new = copy.deepcopy(old)
    new["metadata"]["name"] = "q"
    assert _causes(_update_error(old, new))[0][1] == "metadata.name"


def test_removing_one_gate_of_two_and_the_last_gate() -> None:
    old = _created(_pod(gates=["example.com/a", SCHEDULING_GATE]))
    new = copy.deepcopy(old)
    new["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    podrules.validate_pod_update(old, new)
    last = copy.deepcopy(new)
    last["spec"]["schedulingGates"] = []
    podrules.validate_pod_update(new, last)
    assert "schedulingGates" not in last["spec"]  # emptied list dropped, like Go's omitempty


def test_adding_gates_reports_each_new_gate_at_its_index() -> None:
    old = _created(_pod(gates=[SCHEDULING_GATE]))
    new = copy.deepcopy(old)
    new["spec"]["schedulingGates"] = [
        {"name": "a.io/x"},
        {"name": SCHEDULING_GATE},
        {"name": "b.io/y"},
    ]
    assert [c[1] for c in _causes(_update_error(old, new))] == [
        "spec.schedulingGates[0].name",
        "spec.schedulingGates[2].name",
    ]


def _terms(*expressions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": e} for e in expressions]
            }
        }
    }


ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
ARCH = {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}


def test_gated_pod_may_narrow_affinity_and_ungate_in_one_update() -> None:
    old = _created(_pod(gates=[SCHEDULING_GATE], affinity=_terms([ZONE], [])))
    new = copy.deepcopy(old)
    new["spec"]["affinity"] = _terms([ZONE, ARCH], [ARCH])
    new["spec"]["nodeSelector"] = {"disk": "ssd"}
    del new["spec"]["schedulingGates"]
    podrules.validate_pod_update(old, new)


def test_gated_pod_may_not_change_an_existing_expression() -> None:
    old = _created(_pod(gates=[SCHEDULING_GATE], affinity=_terms([ZONE])))
    new = copy.deepcopy(old)
    new["spec"]["affinity"] = _terms([ARCH, ZONE])
    assert _causes(_update_error(old, new)) == [
        (
            "FieldValueInvalid",
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0]",
            'Invalid value: {"MatchExpressions":[{"Key":"kubernetes.io/arch","Operator":"In",'
            '"Values":["arm64"]},{"Key":"zone","Operator":"In","Values":["a"]}],'
            '"MatchFields":null}: '
            "only additions are allowed (no mutations or deletions)",
        )
    ]


def test_ungated_pod_may_not_change_affinity_and_the_error_carries_a_diff() -> None:
    old = _created(_pod(affinity=_terms([ZONE])))
    new = copy.deepcopy(old)
    new["spec"]["affinity"] = _terms([ZONE, ARCH])
    (cause,) = _causes(_update_error(old, new))
    reason, field, message = cause
    assert (reason, field) == ("FieldValueForbidden", "spec")
    head, diff = message.split("\n", 1)
    assert head == "Forbidden: " + podrules.UPDATE_FORBIDDEN_MESSAGE
    assert diff.startswith("@@ ")
    assert '+        "Key": "kubernetes.io/arch",\n' in diff


def test_ungated_pod_spec_change_outside_the_mutable_fields_is_forbidden() -> None:
    old = _created(_pod())
    new = copy.deepcopy(old)
    new["spec"]["nodeName"] = "node-1"
    (cause,) = _causes(_update_error(old, new))
    assert '+ "NodeName": "node-1",' in cause[2]
    assert '- "NodeName": "",' in cause[2]


def test_a_wildcard_toleration_suppresses_the_default_ones() -> None:
    pod = _created(_pod(tolerations=[{"operator": "Exists"}]))
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]
    no_schedule_only = _created(_pod(tolerations=[{"operator": "Exists", "effect": "NoSchedule"}]))
    assert len(no_schedule_only["spec"]["tolerations"]) == 3


REQUIRED_TERMS = (
    "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
)


def test_match_fields_takes_one_node_name() -> None:
    """docs/design.md: matchFields on metadata.name takes one value only
    (ValidateNodeSelectorTerm)."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}
                        ]
                    }
                ]
            }
        }
    }
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(_pod(affinity=affinity))
    assert _causes(info.value) == [
        (
            "FieldValueRequired",
            f"{REQUIRED_TERMS}[0].matchFields[0].values",
            "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node "
            "field selector",
        )
    ]


def test_node_affinity_requirements_are_validated() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "zone", "operator": "In"},
                            {"key": "zone", "operator": "Exists", "values": ["a"]},
                            {"key": "zone", "operator": "Near", "values": ["a"]},
                        ],
                        "matchFields": [
                            {"key": "spec.nodeName", "operator": "In", "values": ["n"]}
                        ],
                    }
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 0,
                    "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                }
            ],
        }
    }
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(_pod(affinity=affinity))
    assert [(c[0], c[1]) for c in _causes(info.value)] == [
        ("FieldValueRequired", f"{REQUIRED_TERMS}[0].matchExpressions[0].values"),
        ("FieldValueForbidden", f"{REQUIRED_TERMS}[0].matchExpressions[1].values"),
        ("FieldValueInvalid", f"{REQUIRED_TERMS}[0].matchExpressions[2].operator"),
        ("FieldValueInvalid", f"{REQUIRED_TERMS}[0].matchFields[0].key"),
        (
            "FieldValueInvalid",
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        ),
    ]


def test_required_node_affinity_needs_a_term() -> None:
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
        }
    }
    with pytest.raises(StatusError) as info:
        podrules.prepare_pod_create(_pod(affinity=affinity))
    assert _causes(info.value) == [
        (
            "FieldValueRequired",
            REQUIRED_TERMS,
            "Required value: must have at least one node selector term",
        )
    ]


def test_an_update_producing_an_invalid_affinity_is_rejected() -> None:
    old = _created(_pod(gates=[SCHEDULING_GATE]))
    new = copy.deepcopy(old)
    new["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}
                        ]
                    }
                ]
            }
        }
    }
    assert [c[1] for c in _causes(_update_error(old, new))] == [
        f"{REQUIRED_TERMS}[0].matchFields[0].values"
    ]


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("1000m", "1"),
        ("0.5", "500m"),
        ("2000", "2k"),
        ("1500", "1500"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1.5Ki", "1536"),
        ("129e6", "129e6"),
        ("128974848", "128974848"),
        ("0.0000000001", "1n"),
        (2, "2"),
    ],
)
def test_quantities_are_stored_in_canonical_form(given: str | int, stored: str) -> None:
    pod = _created(_pod(_container(requests={"memory": given})))
    assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == stored
