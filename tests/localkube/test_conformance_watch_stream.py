"""watch-pods-events.jsonl: the raw watch stream framing of the real kube-apiserver.

The recording holds the exact lines a labelSelector watch with bookmarks received. Clients
(the kubernetes client's watch, our informers) parse line by line, so localkube must frame
its stream the same way: one compact JSON object per line, keys ``type`` then ``object``,
full objects with ``kind``/``apiVersion`` for ADDED/MODIFIED/DELETED, and BOOKMARK objects
that carry the resource's ``kind``/``apiVersion`` and only ``metadata.resourceVersion``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.harness.kube import KubeEnv
from tests.harness.reference import REFERENCE

RECORDED = REFERENCE / "watch-pods-events.jsonl"


def _recorded_lines() -> list[str]:
    if not RECORDED.exists():
        pytest.skip(f"reference recording not found at {RECORDED}")
    return RECORDED.read_text().splitlines()


def _shape(event: dict[str, Any]) -> tuple[Any, ...]:
    obj = event["object"]
    meta = obj["metadata"]
    if event["type"] == "BOOKMARK":
        return ("BOOKMARK", obj.get("kind"), obj.get("apiVersion"), tuple(sorted(meta)))
    return (event["type"], obj.get("kind"), obj.get("apiVersion"), meta.get("name"))


def test_recorded_stream_is_one_compact_object_per_line() -> None:
    for line in _recorded_lines():
        event = json.loads(line)
        assert list(event) == ["type", "object"]
        assert line == json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def test_localkube_frames_a_watch_like_the_recording(fresh_localkube: KubeEnv) -> None:
    recorded = [json.loads(line) for line in _recorded_lines()]
    k = fresh_localkube
    k.ensure_namespace("watch")
    pods = "/api/v1/namespaces/watch/pods"
    rv = k.get(pods)["metadata"]["resourceVersion"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "w1", "labels": {"app": "watch"}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    k.create(pods, pod)
    k.patch(f"{pods}/w1", {"metadata": {"annotations": {"a": "1"}}})
    k.delete(f"{pods}/w1")
    r = k.request("GET", pods, params={"watch": "1", "labelSelector": "app=watch",
                                       "allowWatchBookmarks": "true", "resourceVersion": rv,
                                       "timeoutSeconds": "2"}, timeout=15)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    lines = r.text.splitlines()
    assert r.text.endswith("\n") and all(lines)
    got = [json.loads(line) for line in lines]
    for line, event in zip(lines, got, strict=True):
        assert list(event) == ["type", "object"]
        assert line == json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    # Same event sequence and object shapes as the recording's first pod life cycle.
    want = [_shape(e) for e in recorded[:4]]  # ADDED, MODIFIED, MODIFIED, DELETED of w1
    have = [_shape(e) for e in got if e["type"] != "BOOKMARK"]
    assert have[0] == want[0] and have[-1] == want[3]
    assert {s[0] for s in have[1:-1]} <= {"MODIFIED"}
    bookmarks = [_shape(e) for e in got if e["type"] == "BOOKMARK"]
    assert bookmarks, "allowWatchBookmarks=true must yield a BOOKMARK within 2 s"
    assert bookmarks[0] == _shape(recorded[-1])
