"""JSONPatch built by webhook.patch against the recorded answers and stored pods."""

from __future__ import annotations

import copy
import json

import pytest

from podplacement.rules.config import GATE_LABEL, SCHEDULING_GATE
from podplacement.rules.podspec import escape_token
from podplacement.webhook.patch import gate_patch
from tests.webhook.reference import apply_add_ops, raw_body, recorded_answer, stored_pod


@pytest.mark.parametrize("case", ["a-plain-pod", "a-no-labels", "b-deployment-pod"])
def test_patch_equals_recorded_answer(case: str) -> None:
    pod = json.loads(raw_body(case))["request"]["object"]
    assert gate_patch(pod) == recorded_answer(case)["webhook_answer"]["decoded_patch"]


@pytest.mark.parametrize("case", ["a-plain-pod", "a-no-labels", "b-deployment-pod"])
def test_patched_pod_has_the_stored_gates_and_labels(case: str) -> None:
    pod = json.loads(raw_body(case))["request"]["object"]
    patched = apply_add_ops(copy.deepcopy(pod), gate_patch(pod))
    stored = stored_pod(case)
    assert patched["metadata"]["labels"] == stored["metadata"]["labels"]
    assert patched["spec"]["schedulingGates"] == stored["spec"]["schedulingGates"]


def test_existing_gates_get_an_append() -> None:
    pod = {"metadata": {"labels": {}}, "spec": {"schedulingGates": [{"name": "other"}]}}
    ops = gate_patch(pod)
    assert ops[0] == {"op": "add", "path": "/spec/schedulingGates/-",
                      "value": {"name": SCHEDULING_GATE}}
    patched = apply_add_ops(copy.deepcopy(pod), ops)
    assert patched["spec"]["schedulingGates"] == [{"name": "other"}, {"name": SCHEDULING_GATE}]
    assert patched["metadata"]["labels"] == {GATE_LABEL: "gated"}


def test_null_gates_and_labels_are_created() -> None:
    pod = {"metadata": {"labels": None}, "spec": {"schedulingGates": None}}
    patched = apply_add_ops(copy.deepcopy(pod), gate_patch(pod))
    assert patched["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    assert patched["metadata"]["labels"] == {GATE_LABEL: "gated"}


@pytest.mark.parametrize(("token", "escaped"),
                         [("a/b", "a~1b"), ("a~b", "a~0b"), ("~/", "~0~1"), ("plain", "plain")])
def test_json_pointer_escaping(token: str, escaped: str) -> None:
    assert escape_token(token) == escaped
