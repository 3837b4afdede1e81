"""The memo of a pure function of a pod (controller/podmemo.py) and the admission feed's use
of it: the replicas of a workload placed alike are judged once, and whatever the function
reads that differs (a field of the pod, the catalog's value, the config object) is judged
again, never answered from the memo."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from podplacement.controller.podmemo import InputMemo
from podplacement.imageinspect import Inspector
from podplacement.rules.config import ARCH_LABEL, PlacementConfig
from podplacement.rules.place.decision import INCOMPATIBLE_NODE_SELECTOR
from tests.controller.test_admissionfeed import Feed, _placed


def test_equal_parts_and_the_same_context_objects_are_computed_once() -> None:
    memo: InputMemo[int] = InputMemo(size=3)
    calls: list[int] = []

    def f(n: int) -> int:
        calls.append(n)
        return n * 2

    ctx = object()
    assert memo.get({"a": [1, 2], "b": "x"}, (ctx,), lambda: f(1)) == 2
    assert memo.get({"b": "x", "a": [1, 2]}, (ctx,), lambda: f(1)) == 2  # key order: same
    assert calls == [1]
    assert memo.get({"a": [1, 2], "b": "y"}, (ctx,), lambda: f(2)) == 4  # another part
    assert memo.get({"a": [1, 2], "b": "x"}, (object(),), lambda: f(3)) == 6  # another context
    assert memo.get({"a": [1, 2], "b": "x"}, (), lambda: f(4)) == 8  # no context
    assert calls == [1, 2, 3, 4]
    assert (memo.hits, memo.misses, len(memo)) == (1, 4, 2)  # a key holds one context
    # parts JSON cannot encode are computed each time, never kept
    assert memo.get({"a": {1, 2}}, (), lambda: f(5)) == 10
    assert memo.get({"a": {1, 2}}, (), lambda: f(5)) == 10
    assert calls[-2:] == [5, 5]
    with pytest.raises(ValueError):
        InputMemo(size=0)


def test_another_scope_empties_the_memo() -> None:
    memo: InputMemo[int] = InputMemo()
    config, nodes = object(), object()
    memo.get(["a"], (), lambda: 1, scope=(config, nodes))
    memo.get(["b"], (), lambda: 2, scope=(config, nodes))
    assert len(memo) == 2 and memo.get(["a"], (), lambda: 9, scope=(config, nodes)) == 1
    relabelled = object()  # a Node changed: a new inventory
    assert memo.get(["a"], (), lambda: 3, scope=(config, relabelled)) == 3
    assert len(memo) == 1  # the entries of the old inventory are gone, not kept alive
    assert memo.get(["b"], (), lambda: 4, scope=(config, relabelled)) == 4


def test_an_exception_is_not_kept() -> None:
    memo: InputMemo[int] = InputMemo()

    def boom() -> int:
        raise RuntimeError("odd")

    with pytest.raises(RuntimeError):
        memo.get(["p"], (), boom)
    assert memo.get(["p"], (), lambda: 7) == 7


def _replica(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    """``pod`` as another replica: its own uid, name and token volume."""
    out = copy.deepcopy(pod)
    out["metadata"].update({"uid": uid, "name": f"p-{uid}"})
    token = f"kube-api-access-{uid}"
    out["spec"]["volumes"] = [{"name": token, "projected": {"sources": []}}]
    for c in out["spec"]["containers"]:
        c["volumeMounts"] = [{"name": token, "mountPath": "/var/run/secrets"}]
    return out


def test_the_feed_tells_each_replica_and_judges_their_decision_once(
        inspector: Inspector) -> None:
    f = Feed(inspector)
    pinned = _placed("u0", "reg/amd:1", node_selector={ARCH_LABEL: "arm64"})
    for i in range(20):
        f.feed.on_pod("ADDED", _replica(pinned, f"u{i}"), None)
    assert [uid for uid, _ in f.events.sent] == [f"u{i}" for i in range(20)]
    assert {e.reason for _, e in f.events.sent} == {INCOMPATIBLE_NODE_SELECTOR}
    assert (f.feed.told_memo.misses, f.feed.told_memo.hits) == (1, 19)
    # another spec (no selector to warn about): judged again, nothing told
    f.feed.on_pod("ADDED", _placed("v1", "reg/amd:1"), None)
    assert len(f.events.sent) == 20 and f.feed.told_memo.misses == 2
    # another config object: judged again (what it says may differ)
    f.feed.config_source = lambda: (PlacementConfig(), None)
    f.feed.on_pod("ADDED", _replica(pinned, "w1"), None)
    assert f.feed.told_memo.misses == 3 and f.events.sent[-1][0] == "w1"
    # the catalog's value of its image changed: judged again
    f.store.record("reg/amd:1", [("linux", "amd64")], 0.0)
    before = f.feed.told_memo.misses
    f.feed.on_pod("ADDED", _replica(pinned, "w2"), None)
    assert f.store.get("reg/amd:1") is not None
    assert f.feed.told_memo.misses == before + 1


def test_a_spec_part_leaves_out_only_what_no_rule_reads() -> None:
    from podplacement.controller.podmemo import placement_spec

    token = {"name": "kube-api-access-x7k2p", "projected": {"sources": []}}
    image_volume = {"name": "data", "image": {"reference": "reg/data:1"}}
    spec = {"containers": [{"name": "c", "image": "reg/a:1", "imagePullPolicy": "Always",
                            "volumeMounts": [{"name": "kube-api-access-x7k2p"}]}],
            "initContainers": [{"name": "i", "image": "reg/i:1", "volumeMounts": []}],
            "volumes": [token, image_volume], "nodeSelector": {ARCH_LABEL: "arm64"}}
    assert placement_spec(spec) == {
        "containers": [{"name": "c", "image": "reg/a:1", "imagePullPolicy": "Always"}],
        "initContainers": [{"name": "i", "image": "reg/i:1"}],
        "volumes": [image_volume], "nodeSelector": {ARCH_LABEL: "arm64"}}
    other = copy.deepcopy(spec)
    other["volumes"][0]["name"] = other["containers"][0]["volumeMounts"][0]["name"] = "x"
    assert placement_spec(other) == placement_spec(spec)  # two replicas: one part
    assert placement_spec(None) is None and placement_spec([1]) == [1]


def test_no_rule_reads_what_a_spec_part_leaves_out() -> None:
    """placement_spec's premise: rules/ reads no ``volumeMounts`` and the volumes only in
    ``pod_images`` (their ``image`` source) and the policy's CEL (its image volumes)."""
    import pathlib
    import re

    import podplacement.rules as rules

    readers = {}
    for path in pathlib.Path(rules.__file__).parent.rglob("*.py"):
        code = "\n".join(line for line in path.read_text().splitlines()
                         if not line.lstrip().startswith("#"))
        assert "volumeMounts" not in code, path
        uses = re.findall(r"_entries\(spec, VOLUMES\)|\bVOLUMES\b|\[.volumes.\]|"
                          r"\.get\(.volumes.\)", code)
        if uses:
            readers[path.name] = len(uses)
    # placement.py: the constant and pod_images; predicates.py: the import and the CEL's
    # image volumes (v.?image), which reads nothing else of a volume
    assert readers == {"placement.py": 2, "predicates.py": 2}, readers
