"""One value for what a placement decision reads (issue #40, item 2):
:class:`rules.place.placement.PlacementInputs`, built once per path and passed whole to the
facts, the controller's decision, the plan and the admission renderer."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from podplacement.rules.config import PlacementConfig
from podplacement.rules.place import admission, decision, placement, plan
from podplacement.rules.place.placement import PlacementInputs
from tests.controller._pods import gated_pod, img

REPO = Path(__file__).resolve().parents[2]
IMAGES = {"reg/app:1": img("reg/app:1", "linux/arm64", "linux/amd64")}


def test_the_inputs_are_one_frozen_value() -> None:
    inputs = PlacementInputs(gated_pod(), IMAGES, PlacementConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.failures = 3  # type: ignore[misc]
    names = [f.name for f in dataclasses.fields(PlacementInputs)]
    assert names[:3] == ["pod", "images", "config"]
    assert {"nodes", "numa", "failures", "numa_waited_seconds", "config_error", "platforms",
            "path", "give_up", "policy", "taints"} <= set(names)


def test_the_entry_points_take_the_inputs_not_their_keywords() -> None:
    """placement_facts and decide read one PlacementInputs; plan adds only what the
    cluster gives (nodes, nrts, now, inflight, on_numa_error); the admission renderer reads
    one too."""
    assert list(inspect.signature(placement.placement_facts).parameters) == ["inputs"]
    assert list(inspect.signature(decision.decide).parameters) == ["inputs"]
    assert list(inspect.signature(plan.plan).parameters) == [
        "inputs", "nodes", "nrts", "now", "inflight", "on_numa_error"]
    assert list(inspect.signature(admission._decided_at_admission).parameters) == [
        "inputs", "outcomes"]


def test_no_module_spells_out_the_keywords_of_the_decision_again() -> None:
    """The keyword list (``numa_waited_seconds=``, ``give_up=``, ...) is passed only when a
    PlacementInputs is built or replaced, never to another function of rules/."""
    for path in sorted((REPO / "rules").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            keywords = {k.arg for k in node.keywords}
            if {"numa_waited_seconds", "taints"} & keywords:
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                assert name in ("PlacementInputs", "replace"), f"{path}:{node.lineno}"


def test_the_same_inputs_give_the_same_facts_on_every_path() -> None:
    """The controller's decision and the facts agree for one value; the webhook's path is
    the same value with ``path`` set."""
    pod = gated_pod()
    inputs = PlacementInputs(pod, IMAGES, PlacementConfig())
    facts = placement.placement_facts(inputs)
    decided = decision.decide(inputs)
    assert decided.annotation == facts.annotation and decided.outcome == facts.outcome
    planned = plan.plan(inputs, nodes=None, nrts={}, now=0.0)
    assert planned.annotation == facts.annotation
    admitted = admission.admission_placement(pod, IMAGES, PlacementConfig())
    assert admitted is not None
    webhook = placement.placement_facts(dataclasses.replace(inputs, path="webhook"))
    assert json.loads(admitted.annotation) == json.loads(webhook.annotation)
    assert json.loads(webhook.annotation)["path"] == "webhook"
