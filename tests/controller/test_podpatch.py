"""The one JSON patch: guarded by resourceVersion, removes only our gate."""

from __future__ import annotations

import pytest

from podplacement.rules.config import AFFINITY_LABEL, GATE_LABEL, SCHEDULING_GATE
from podplacement.rules.place.podpatch import build_pod_patch
from podplacement.rules.podspec import escape_token, gate_index
from tests.controller._pods import apply, gated_pod


def test_escape_json_pointer_tokens() -> None:
    assert escape_token("podplacement.io/node-affinity") == "podplacement.io~1node-affinity"
    assert escape_token("a~b/c") == "a~0b~1c"


def test_patch_starts_with_rv_test_and_ends_removing_only_our_gate() -> None:
    pod = gated_pod(gates=("example.com/other", SCHEDULING_GATE), rv="77")
    ops = build_pod_patch(
        pod, labels={GATE_LABEL: "removed", AFFINITY_LABEL: "set"}, annotations={"x/y": "{}"}
    )
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "77"}
    assert ops[-2:] == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": SCHEDULING_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    new = apply(pod, ops)
    assert new["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert new["metadata"]["labels"] == {GATE_LABEL: "removed", AFFINITY_LABEL: "set"}
    assert new["metadata"]["annotations"] == {"x/y": "{}"}


def test_last_gate_removed_drops_the_field() -> None:
    pod = gated_pod()
    new = apply(pod, build_pod_patch(pod))
    assert "schedulingGates" not in new["spec"]


def test_stale_resource_version_fails_the_test_op() -> None:
    from localkube.errors import StatusError

    pod = gated_pod(rv="5")
    ops = build_pod_patch(pod)
    pod["metadata"]["resourceVersion"] = "6"
    with pytest.raises(StatusError) as info:
        apply(pod, ops)
    assert info.value.code == 422  # the real server's answer to a failed test op


def test_labels_map_created_when_absent_and_removed_keys() -> None:
    pod = gated_pod(labels={})
    del pod["metadata"]["labels"]
    ops = build_pod_patch(pod, labels={"a": "1"}, ungate=False)
    assert ops[1] == {"op": "add", "path": "/metadata/labels", "value": {"a": "1"}}
    pod2 = gated_pod(labels={"a": "1", "b": "2"})
    ops2 = build_pod_patch(pod2, labels={"a": "1"}, remove_labels=["b", "zz"], ungate=False)
    assert ops2[1:] == [{"op": "remove", "path": "/metadata/labels/b"}]


def test_no_gate_means_no_gate_ops_and_rv_required() -> None:
    pod = gated_pod(gates=())
    assert gate_index(pod) is None
    assert [o["op"] for o in build_pod_patch(pod)] == ["test"]
    del pod["metadata"]["resourceVersion"]
    with pytest.raises(ValueError):
        build_pod_patch(pod)
