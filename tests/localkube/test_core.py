"""localkube core behaviour over real HTTP: CRUD, selectors, pagination, watch, CRDs,
discovery, fault injection. Expected values come from the kube-apiserver v1.36 recordings
in ``shared/reference`` (messages quoted there)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localkube import LocalKube
from podplacement.rules.config import (
    API_VERSION,
    CONFIG_NAME,
    CONFIG_PLURAL,
    GROUP,
    VERSION,
)
from tests.harness.kube import CRD_FILES, KubeEnv

PPC = f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}"
NRT2 = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
NRT1 = "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies"


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox:1.36"}]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}}, "spec": body}


def ppc(name: str = CONFIG_NAME, weight: Any = 50, arch: str = "arm64") -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "PodPlacementConfig", "metadata": {"name": name},
            "spec": {"plugins": {"nodeAffinityScoring": {
                "enabled": True, "platforms": [{"architecture": arch, "weight": weight}]}}}}


def watch_lines(kube: KubeEnv, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run a bounded watch (timeoutSeconds must be in params) and return its events."""
    with kube.client.stream("GET", path, params={"watch": "1", **params}, timeout=30) as r:
        assert r.status_code == 200
        return [json.loads(line) for line in r.iter_lines() if line.strip()]


@pytest.fixture
def ns(localkube: KubeEnv) -> Iterator[str]:
    name = f"core-{uuid.uuid4().hex[:8]}"
    localkube.ensure_namespace(name)
    yield name
    localkube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture(params=["localkube", pytest.param("real_kube", marks=pytest.mark.realcluster)])
def any_kube(request: pytest.FixtureRequest) -> KubeEnv:
    """localkube, and the real control plane when KUBEBUILDER_ASSETS is set (same checks)."""
    env: KubeEnv = request.getfixturevalue(request.param)
    return env


@pytest.fixture
def any_ns(any_kube: KubeEnv) -> Iterator[str]:
    name = f"core-{uuid.uuid4().hex[:8]}"
    any_kube.ensure_namespace(name)
    yield name
    any_kube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def small_kube(tmp_path: Path) -> Iterator[KubeEnv]:
    """localkube with a short history (5 events) and fast bookmarks (0.2 s)."""
    server = LocalKube(CRD_FILES, history_size=5, bookmark_interval=0.2).start()
    env = KubeEnv(url=server.url, kubeconfig=server.write_kubeconfig(tmp_path / "kc"),
                  kind="localkube", server=server)
    try:
        yield env
    finally:
        env.close()
        server.stop()


# --- CRUD ------------------------------------------------------------------------------------


def test_create_get_update_delete_pod(localkube: KubeEnv, ns: str) -> None:
    created = localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("p1", {"app": "x"}))
    meta = created["metadata"]
    assert meta["namespace"] == ns and meta["uid"] and meta["generation"] == 1
    rv = int(meta["resourceVersion"])
    assert created["status"]["phase"] == "Pending"

    got = localkube.get(f"/api/v1/namespaces/{ns}/pods/p1")
    assert got["metadata"]["uid"] == meta["uid"]

    again = localkube.request("POST", f"/api/v1/namespaces/{ns}/pods", json=pod("p1"))
    assert again.status_code == 409
    assert again.json()["reason"] == "AlreadyExists"
    assert again.json()["message"] == 'pods "p1" already exists'

    got["metadata"]["labels"]["v"] = "2"
    updated = localkube.request("PUT", f"/api/v1/namespaces/{ns}/pods/p1", json=got)
    assert updated.status_code == 200
    assert int(updated.json()["metadata"]["resourceVersion"]) > rv
    assert updated.json()["metadata"]["generation"] == 1  # metadata change: no bump

    stale = localkube.request("PUT", f"/api/v1/namespaces/{ns}/pods/p1", json=got)
    assert stale.status_code == 409
    assert stale.json()["reason"] == "Conflict"
    assert "the object has been modified" in stale.json()["message"]

    deleted = localkube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/p1")
    assert deleted.status_code == 200
    assert deleted.json()["kind"] == "Pod"
    assert deleted.json()["metadata"]["deletionTimestamp"]
    assert localkube.request("GET", f"/api/v1/namespaces/{ns}/pods/p1").status_code == 404


def test_generate_name_and_missing_namespace(localkube: KubeEnv, ns: str) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "gen-"}
    created = localkube.create(f"/api/v1/namespaces/{ns}/pods", body)
    name = created["metadata"]["name"]
    assert name.startswith("gen-") and len(name) == len("gen-") + 5

    r = localkube.request("POST", "/api/v1/namespaces/nope-ns/pods", json=pod("x"))
    assert r.status_code == 404
    assert r.json()["message"] == 'namespaces "nope-ns" not found'


def test_dry_run_create_is_not_persisted(localkube: KubeEnv, ns: str) -> None:
    r = localkube.request("POST", f"/api/v1/namespaces/{ns}/pods", json=pod("dry"),
                          params={"dryRun": "All"})
    assert r.status_code == 201
    assert "resourceVersion" not in r.json()["metadata"]
    assert localkube.request("GET", f"/api/v1/namespaces/{ns}/pods/dry").status_code == 404


def test_spec_change_bumps_generation_metadata_change_does_not(
    localkube: KubeEnv, ns: str
) -> None:
    localkube.create(f"/api/v1/namespaces/{ns}/pods",
                     pod("g", schedulingGates=[{"name": "example.com/gate"}]))
    p = localkube.patch(f"/api/v1/namespaces/{ns}/pods/g", {"metadata": {"labels": {"a": "b"}}})
    assert p["metadata"]["generation"] == 1
    p = localkube.patch(f"/api/v1/namespaces/{ns}/pods/g",
                        [{"op": "remove", "path": "/spec/schedulingGates"}], "json")
    assert p["metadata"]["generation"] == 2
    assert "schedulingGates" not in p["spec"]


def test_noop_patch_keeps_resource_version(localkube: KubeEnv, ns: str) -> None:
    created = localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("same", {"a": "b"}))
    p = localkube.patch(f"/api/v1/namespaces/{ns}/pods/same", {"metadata": {"labels": {"a": "b"}}})
    assert p["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_patch_with_stale_resource_version_precondition_conflicts(
    localkube: KubeEnv, ns: str
) -> None:
    created = localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("pre"))
    localkube.patch(f"/api/v1/namespaces/{ns}/pods/pre", {"metadata": {"labels": {"x": "1"}}})
    r = localkube.request("PATCH", f"/api/v1/namespaces/{ns}/pods/pre", content_type="merge",
                          json={"metadata": {"resourceVersion":
                                             created["metadata"]["resourceVersion"],
                                             "labels": {"x": "2"}}})
    assert r.status_code == 409 and r.json()["reason"] == "Conflict"


def test_patch_content_type_application_json_is_415(localkube: KubeEnv, ns: str) -> None:
    localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("ct"))
    r = localkube.request("PATCH", f"/api/v1/namespaces/{ns}/pods/ct", json={"a": 1},
                          content_type="application/json")
    assert r.status_code == 415
    assert r.json()["reason"] == "UnsupportedMediaType"


def test_binding_sets_node_and_rejects_gated_pods(localkube: KubeEnv, ns: str) -> None:
    localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("free"))
    localkube.create(f"/api/v1/namespaces/{ns}/pods",
                     pod("gated", schedulingGates=[{"name": "example.com/g"}]))
    binding: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "free"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
    r = localkube.request("POST", f"/api/v1/namespaces/{ns}/pods/free/binding", json=binding)
    assert r.status_code == 201 and r.json()["status"] == "Success"
    bound = localkube.get(f"/api/v1/namespaces/{ns}/pods/free")
    assert bound["spec"]["nodeName"] == "node-a"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True"
               for c in bound["status"]["conditions"])
    binding["metadata"]["name"] = "gated"
    r = localkube.request("POST", f"/api/v1/namespaces/{ns}/pods/gated/binding", json=binding)
    assert r.status_code == 409
    assert r.json()["message"] == ('Operation cannot be fulfilled on pods/binding "gated": pod'
                                   " gated has non-empty .spec.schedulingGates")


def test_bound_pod_delete_is_graceful(localkube: KubeEnv, ns: str) -> None:
    localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("b", nodeName="node-a"))
    r = localkube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/b")
    assert r.json()["metadata"]["deletionGracePeriodSeconds"] == 30
    assert localkube.request("GET", f"/api/v1/namespaces/{ns}/pods/b").status_code == 200
    r = localkube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/b",
                          params={"gracePeriodSeconds": "0"})
    assert r.status_code == 200
    assert localkube.request("GET", f"/api/v1/namespaces/{ns}/pods/b").status_code == 404


def test_delete_collection_returns_the_deleted_pods(localkube: KubeEnv, ns: str) -> None:
    for i in range(3):
        localkube.create(f"/api/v1/namespaces/{ns}/pods", pod(f"d{i}", {"del": str(i % 2)}))
    r = localkube.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                          params={"labelSelector": "del=0"})
    assert r.json()["kind"] == "PodList"
    assert sorted(i["metadata"]["name"] for i in r.json()["items"]) == ["d0", "d2"]
    left = localkube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    assert [i["metadata"]["name"] for i in left] == ["d1"]


def test_namespace_delete_removes_its_objects(localkube: KubeEnv) -> None:
    localkube.ensure_namespace("doomed-ns")
    localkube.create("/api/v1/namespaces/doomed-ns/configmaps",
                     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}})
    r = localkube.delete("/api/v1/namespaces/doomed-ns")
    assert r.json()["status"]["phase"] == "Terminating"
    assert localkube.request("GET", "/api/v1/namespaces/doomed-ns/configmaps/cm").status_code == 404


def test_node_create_gets_not_ready_taint(localkube: KubeEnv) -> None:
    node = localkube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                              "metadata": {"name": f"n-{uuid.uuid4().hex[:6]}"}})
    assert node["spec"]["taints"] == [{"key": "node.kubernetes.io/not-ready",
                                       "effect": "NoSchedule"}]
    assert "generation" not in node["metadata"]


# --- selectors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=a", ["p-a1", "p-a2"]),
        ("app==a,tier=web", ["p-a1"]),
        ("app!=a", ["p-b", "p-none"]),
        ("app in (a,b)", ["p-a1", "p-a2", "p-b"]),
        ("app notin (a)", ["p-b", "p-none"]),
        ("tier", ["p-a1", "p-b"]),
        ("!tier", ["p-a2", "p-none"]),
    ],
)
def test_label_selectors(localkube: KubeEnv, selector: str, expected: list[str]) -> None:
    ns = "labelsel"
    if localkube.request("GET", f"/api/v1/namespaces/{ns}").status_code == 404:
        localkube.ensure_namespace(ns)
        for name, labels in [("p-a1", {"app": "a", "tier": "web"}), ("p-a2", {"app": "a"}),
                             ("p-b", {"app": "b", "tier": "db"}), ("p-none", {})]:
            localkube.create(f"/api/v1/namespaces/{ns}/pods", pod(name, labels))
    items = localkube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                              params={"labelSelector": selector}).json()["items"]
    assert [i["metadata"]["name"] for i in items] == expected


def test_malformed_label_selector_is_400(localkube: KubeEnv) -> None:
    r = localkube.request("GET", "/api/v1/pods", params={"labelSelector": "a===b"})
    assert r.status_code == 400
    assert r.json()["message"] == "unable to parse requirement: found '=', expected: identifier"


def test_field_selectors(any_kube: KubeEnv, any_ns: str) -> None:
    localkube, ns = any_kube, any_ns
    localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("unbound"))
    localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("bound", nodeName="node-a"))

    def names(sel: str) -> list[str]:
        r = localkube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                              params={"fieldSelector": sel})
        assert r.status_code == 200, r.text
        return [i["metadata"]["name"] for i in r.json()["items"]]

    assert names("spec.nodeName=") == ["unbound"]
    assert names("spec.nodeName!=") == ["bound"]
    assert names("spec.nodeName==node-a,status.phase=Pending") == ["bound"]
    assert names("metadata.name=unbound") == ["unbound"]
    r = localkube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                          params={"fieldSelector": "spec.schedulingGates=x"})
    assert r.status_code == 400
    assert r.json()["message"] == "field label not supported: spec.schedulingGates"
    r = localkube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                          params={"fieldSelector": "spec.nodeName in (a,b)"})
    assert r.json()["message"] == ("invalid selector: 'spec.nodeName in (a,b)'; can't understand"
                                   " 'b)'")


# --- pagination -----------------------------------------------------------------------------


def test_pagination_with_continue_and_remaining_count(any_kube: KubeEnv, any_ns: str) -> None:
    localkube, ns = any_kube, any_ns
    for i in range(5):
        localkube.create(f"/api/v1/namespaces/{ns}/pods", pod(f"p-{i}", {"set": "page"}))
    path = f"/api/v1/namespaces/{ns}/pods"
    page = localkube.request("GET", path, params={"limit": "2"}).json()
    assert [i["metadata"]["name"] for i in page["items"]] == ["p-0", "p-1"]
    assert page["metadata"]["remainingItemCount"] == 3
    token = page["metadata"]["continue"]
    decoded = json.loads(base64.urlsafe_b64decode(token + "==="))
    assert decoded["start"] == "p-1\x00" and decoded["v"] == "meta.k8s.io/v1"
    seen = [i["metadata"]["name"] for i in page["items"]]
    for _ in range(5):
        page = localkube.request("GET", path, params={"limit": "2", "continue": token}).json()
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert seen == [f"p-{i}" for i in range(5)]
    assert "remainingItemCount" not in page["metadata"]

    with_selector = localkube.request("GET", path, params={"limit": "2",
                                                           "labelSelector": "set=page"}).json()
    assert "remainingItemCount" not in with_selector["metadata"]
    assert with_selector["metadata"]["continue"]

    bad = localkube.request("GET", path, params={"limit": "2", "continue": "garbage"})
    assert bad.status_code == 400
    assert bad.json()["message"] == ("invalid continue token: continue key is not valid: invalid"
                                     " character '\\u0081' looking for beginning of value")
    assert localkube.request("GET", path, params={"limit": "abc"}).status_code == 400


def test_list_at_exact_resource_version_shows_the_past(localkube: KubeEnv, ns: str) -> None:
    localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("old", {"v": "1"}))
    rv = localkube.get(f"/api/v1/namespaces/{ns}/pods")["metadata"]["resourceVersion"]
    localkube.patch(f"/api/v1/namespaces/{ns}/pods/old", {"metadata": {"labels": {"v": "2"}}})
    localkube.create(f"/api/v1/namespaces/{ns}/pods", pod("new"))
    past = localkube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                             params={"resourceVersion": rv,
                                     "resourceVersionMatch": "Exact"}).json()
    assert past["metadata"]["resourceVersion"] == rv
    assert [(i["metadata"]["name"], i["metadata"]["labels"]["v"]) for i in past["items"]] == [
        ("old", "1")]
    future = localkube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                               params={"resourceVersion": "99999999"})
    assert future.status_code == 504 and future.json()["reason"] == "Timeout"


# --- watch ----------------------------------------------------------------------------------


def test_watch_replays_from_resource_version_with_selector_transitions(
    any_kube: KubeEnv, any_ns: str
) -> None:
    localkube, ns = any_kube, any_ns
    path = f"/api/v1/namespaces/{ns}/pods"
    rv = localkube.get(path)["metadata"]["resourceVersion"]
    localkube.create(path, pod("w1", {"app": "watch"}))
    localkube.patch(f"{path}/w1", {"metadata": {"labels": {"step": "2"}}})
    localkube.patch(f"{path}/w1", {"metadata": {"labels": {"app": "other"}}})
    localkube.patch(f"{path}/w1", {"metadata": {"labels": {"app": "watch"}}})
    localkube.delete(f"{path}/w1")
    events = watch_lines(localkube, path, {"labelSelector": "app=watch", "resourceVersion": rv,
                                           "timeoutSeconds": "1"})
    types = [e["type"] for e in events]
    assert types == ["ADDED", "MODIFIED", "DELETED", "ADDED", "MODIFIED", "DELETED"]
    # leaving the selector: DELETED with the previous content, at the new resourceVersion
    assert events[2]["object"]["metadata"]["labels"] == {"app": "watch", "step": "2"}
    # deleting an unbound pod: MODIFIED (deletionTimestamp, grace 0), then DELETED (the real
    # v1.36.2 server; reference/watch-pods-events.jsonl)
    assert events[4]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


def test_watch_without_resource_version_sends_synthetic_added(
    localkube: KubeEnv, ns: str
) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    for i in range(3):
        localkube.create(path, pod(f"pre-{i}", {"set": "pre"}))
    for rv in (None, "0"):
        params: dict[str, Any] = {"labelSelector": "set=pre", "timeoutSeconds": "1"}
        if rv is not None:
            params["resourceVersion"] = rv
        events = watch_lines(localkube, path, params)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "pre-0"), ("ADDED", "pre-1"), ("ADDED", "pre-2")]


def test_watch_bookmarks_and_too_old_resource_version(small_kube: KubeEnv) -> None:
    small_kube.ensure_namespace("w")
    path = "/api/v1/namespaces/w/pods"
    for i in range(8):
        small_kube.create(path, pod(f"x{i}"))
    events = watch_lines(small_kube, path, {"resourceVersion": "1", "timeoutSeconds": "1"})
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["code"] == 410 and status["reason"] == "Expired"
    assert status["message"].startswith("too old resource version: 1 (")

    r = small_kube.request("GET", path, params={"resourceVersion": "2",
                                                "resourceVersionMatch": "Exact"})
    assert r.status_code == 410
    assert r.json()["message"] == "The resourceVersion for the provided list is too old."

    current = small_kube.get(path)["metadata"]["resourceVersion"]
    events = watch_lines(small_kube, path, {"resourceVersion": current, "timeoutSeconds": "1",
                                            "allowWatchBookmarks": "true"})
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"]["metadata"] == {"resourceVersion": current}
    assert events[0]["object"]["kind"] == "Pod"


def test_watch_binding_leaves_unscheduled_field_selector(localkube: KubeEnv, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    localkube.create(path, pod("tobind", {"set": "bind"}))
    rv = localkube.get(path)["metadata"]["resourceVersion"]
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "tobind"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
    localkube.create(f"{path}/tobind/binding", binding)
    events = watch_lines(localkube, path, {"fieldSelector": "spec.nodeName=",
                                           "resourceVersion": rv, "timeoutSeconds": "1"})
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("DELETED", "tobind")]


# --- custom resources ------------------------------------------------------------------------


def test_crd_validation_errors(fresh_localkube: KubeEnv) -> None:
    k = fresh_localkube
    r = k.request("POST", PPC, json=ppc(weight=0))
    assert r.status_code == 422
    assert r.json()["message"] == (
        'PodPlacementConfig.podplacement.io "cluster" is invalid: '
        "spec.plugins.nodeAffinityScoring.platforms[0].weight: Invalid value: 0: "
        "spec.plugins.nodeAffinityScoring.platforms[0].weight in body should be greater than or"
        " equal to 1")
    r = k.request("POST", PPC, json=ppc(name="other"))
    assert r.status_code == 422
    assert r.json()["details"]["causes"] == [{
        "reason": "FieldValueInvalid",
        "message": "Invalid value: PodPlacementConfig is a singleton: metadata.name must be"
                   " 'cluster'", "field": "<nil>"}]
    r = k.request("POST", PPC, json=ppc(arch="mips64"))
    causes = r.json()["details"]["causes"]
    assert causes[0]["reason"] == "FieldValueNotSupported"
    assert causes[-1]["message"].startswith("Invalid value: null: some validation rules")
    r = k.request("POST", PPC, json=ppc(weight="10"))
    assert r.json()["details"]["causes"][0]["reason"] == "FieldValueTypeInvalid"
    dup = ppc()
    dup["spec"]["plugins"]["nodeAffinityScoring"]["platforms"] = [
        {"architecture": "arm64", "weight": 10}, {"architecture": "arm64", "weight": 20}]
    r = k.request("POST", PPC, json=dup)
    assert r.json()["details"]["causes"] == [{
        "reason": "FieldValueDuplicate", "message": 'Duplicate value: {"architecture":"arm64"}',
        "field": "spec.plugins.nodeAffinityScoring.platforms[1]"}]


def test_crd_unknown_fields_pruned_or_strict(fresh_localkube: KubeEnv) -> None:
    k = fresh_localkube
    body = ppc()
    body["spec"]["unknownField"] = 1
    strict = k.request("POST", PPC, json=body,
                       params={"fieldValidation": "Strict", "dryRun": "All"})
    assert strict.status_code == 400
    assert strict.json()["message"] == (
        'PodPlacementConfig in version "v1beta1" cannot be handled as a PodPlacementConfig:'
        ' strict decoding error: unknown field "spec.unknownField"')
    r = k.request("POST", PPC, json=body)
    assert r.status_code == 201
    assert r.headers["Warning"] == '299 - "unknown field \\"spec.unknownField\\""'
    assert "unknownField" not in r.json()["spec"]
    again = k.request("POST", PPC, json=body)
    assert again.status_code == 409
    assert again.json()["message"] == 'podplacementconfigs.podplacement.io "cluster" already exists'


def test_crd_status_subresource_and_generation(fresh_localkube: KubeEnv) -> None:
    k = fresh_localkube
    created = k.create(PPC, ppc())
    assert created["metadata"]["generation"] == 1
    cur = k.get(f"{PPC}/{CONFIG_NAME}")
    cur["status"] = {"observedGeneration": 1}
    cur["spec"]["plugins"]["nodeAffinityScoring"]["enabled"] = False
    r = k.request("PUT", f"{PPC}/{CONFIG_NAME}/status", json=cur)
    assert r.status_code == 200
    out = r.json()
    assert out["status"] == {"observedGeneration": 1}
    assert out["spec"]["plugins"]["nodeAffinityScoring"]["enabled"] is True
    assert out["metadata"]["generation"] == 1
    main = k.patch(f"{PPC}/{CONFIG_NAME}", {"spec": {"plugins": {"nodeAffinityScoring": {
        "enabled": False}}}, "status": {"observedGeneration": 7}})
    assert main["metadata"]["generation"] == 2
    assert main["status"] == {"observedGeneration": 1}
    smp = k.request("PATCH", f"{PPC}/{CONFIG_NAME}", json={"metadata": {"labels": {"x": "y"}}},
                    content_type="strategic")
    assert smp.status_code == 415
    assert smp.json()["message"] == (
        "the body of the request was in an unknown format - accepted media types include:"
        " application/json-patch+json, application/merge-patch+json,"
        " application/apply-patch+yaml")
    rename = k.request("PATCH", f"{PPC}/{CONFIG_NAME}", content_type="json",
                       json=[{"op": "replace", "path": "/metadata/name", "value": "renamed"}])
    assert rename.status_code == 400
    d = k.request("DELETE", f"{PPC}/{CONFIG_NAME}")
    assert d.json()["kind"] == "Status" and d.json()["status"] == "Success"
    assert d.json()["details"]["group"] == GROUP


def test_crd_finalizer_blocks_deletion_until_removed(fresh_localkube: KubeEnv) -> None:
    k = fresh_localkube
    body = ppc()
    body["metadata"]["finalizers"] = ["podplacement.io/finalizer"]
    k.create(PPC, body)
    r = k.request("DELETE", f"{PPC}/{CONFIG_NAME}")
    assert r.status_code == 200
    assert r.json()["metadata"]["deletionTimestamp"]
    assert k.get(f"{PPC}/{CONFIG_NAME}")["metadata"]["deletionTimestamp"]
    k.patch(f"{PPC}/{CONFIG_NAME}", [{"op": "remove", "path": "/metadata/finalizers"}], "json")
    assert k.request("GET", f"{PPC}/{CONFIG_NAME}").status_code == 404


def test_nrt_served_in_both_versions_with_validation(fresh_localkube: KubeEnv) -> None:
    k = fresh_localkube
    nrt = {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
           "metadata": {"name": "node-a"}, "topologyPolicies": ["None"],
           "zones": [{"name": "node-0", "type": "Node", "resources": [
               {"name": "cpu", "capacity": 32, "allocatable": 30, "available": "8"}]}]}
    k.create(NRT2, nrt)
    v1 = k.get(f"{NRT1}/node-a")
    assert v1["apiVersion"] == "topology.node.k8s.io/v1alpha1"
    assert v1["zones"][0]["resources"][0]["capacity"] == 32
    bad = dict(nrt, metadata={"name": "bad"})
    bad["zones"] = [{"name": "node-0", "resources": [
        {"name": "cpu", "capacity": 1, "allocatable": 1, "available": "lots"}]}]
    r = k.request("POST", NRT2, json=bad)
    assert r.status_code == 422
    fields = [c["field"] for c in r.json()["details"]["causes"]]
    assert fields == ["zones[0].resources[0].available", "zones[0].type"]
    empty = k.request("POST", NRT2, json={"apiVersion": "topology.node.k8s.io/v1alpha2",
                                          "kind": "NodeResourceTopology",
                                          "metadata": {"name": "empty"}})
    assert empty.json()["message"] == (
        'NodeResourceTopology.topology.node.k8s.io "empty" is invalid: zones: Required value')


def test_crd_created_over_http_is_served(fresh_localkube: KubeEnv) -> None:
    k = fresh_localkube
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                            "type": "object", "properties": {"size": {
                                "type": "integer", "maximum": 3}}}}}}}]}}
    created = k.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert {c["type"] for c in created["status"]["conditions"]} == {"NamesAccepted",
                                                                  "Established"}
    k.ensure_namespace("wns")
    w: dict[str, Any] = {"apiVersion": "example.com/v1", "kind": "Widget",
                         "metadata": {"name": "w"}, "spec": {"size": 2}}
    assert k.create("/apis/example.com/v1/namespaces/wns/widgets", w)["spec"]["size"] == 2
    w["metadata"]["name"] = "big"
    w["spec"]["size"] = 4
    assert k.request("POST", "/apis/example.com/v1/namespaces/wns/widgets",
                     json=w).status_code == 422
    k.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    r = k.request("GET", "/apis/example.com/v1/namespaces/wns/widgets")
    assert r.status_code == 404 and r.text == "404 page not found\n"


# --- discovery ------------------------------------------------------------------------------


def test_discovery_documents(localkube: KubeEnv) -> None:
    core = localkube.get("/api/v1")
    names = {r["name"] for r in core["resources"]}
    assert {"pods", "pods/status", "pods/binding", "nodes", "namespaces", "events"} <= names
    groups = {g["name"] for g in localkube.get("/apis")["groups"]}
    assert {GROUP, "coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io",
            "topology.node.k8s.io"} <= groups
    ppc_list = localkube.get(f"/apis/{GROUP}/{VERSION}")
    entry = next(r for r in ppc_list["resources"] if r["name"] == CONFIG_PLURAL)
    assert entry["namespaced"] is False and entry["shortNames"] == ["ppc"]
    unknown = localkube.request("GET", "/apis/nosuch.example.com/v1/things")
    assert unknown.status_code == 404 and unknown.text == "404 page not found\n"
    r = localkube.request("GET", "/api/v1/nosuchresources")
    assert r.status_code == 404
    assert r.json()["message"] == "the server could not find the requested resource"
    assert localkube.get("/version")["major"] == "1"


# --- runner hooks ---------------------------------------------------------------------------


def test_fault_injection_and_request_log(fresh_localkube: KubeEnv) -> None:
    k = fresh_localkube
    assert k.server is not None
    k.ensure_namespace("f")
    k.create("/api/v1/namespaces/f/pods", pod("p"))
    k.server.inject_fault(409, 2, method="WRITE", plural="pods", name="p")
    assert k.request("GET", "/api/v1/namespaces/f/pods/p").status_code == 200  # reads pass
    statuses = [k.request("PATCH", "/api/v1/namespaces/f/pods/p", content_type="merge",
                          json={"metadata": {"labels": {"i": str(i)}}}).status_code
                for i in range(3)]
    assert statuses == [409, 409, 200]
    counts = k.server.request_counts()
    assert counts["patch"] == 3 and counts["create"] >= 2
    assert any(r.status == 409 and r.content_type == "application/merge-patch+json"
               for r in k.server.requests)


def test_kubernetes_python_client_list_watch_patch(fresh_localkube: KubeEnv) -> None:
    from kubernetes import client, config, watch

    k = fresh_localkube
    api_client = config.new_client_from_config(str(k.kubeconfig))
    v1: Any = client.CoreV1Api(api_client)
    try:
        v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="py")))
        v1.create_namespaced_pod("py", pod("pp", {"app": "py"}))
        listed: Any = v1.list_namespaced_pod("py", label_selector="app=py")
        assert [p.metadata.name for p in listed.items] == ["pp"]
        v1.patch_namespaced_pod("pp", "py", {"metadata": {"labels": {"x": "y"}}})
        w = watch.Watch()
        seen = [(e["type"], e["object"].metadata.name) for e in w.stream(
            v1.list_namespaced_pod, "py", resource_version=listed.metadata.resource_version,
            timeout_seconds=1)]
        assert seen == [("MODIFIED", "pp")]
        with pytest.raises(client.ApiException) as err:
            v1.read_namespaced_pod("missing", "py")
        assert err.value.status == 404
    finally:
        api_client.close()


def test_unsupported_create_content_type_is_415(localkube: KubeEnv, ns: str) -> None:
    r = localkube.request("POST", f"/api/v1/namespaces/{ns}/pods", content=b"x",
                          headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = localkube.request("POST", f"/api/v1/namespaces/{ns}/pods", content=b'{"apiVersion"',
                          headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["message"].startswith("the object provided is unrecognized (must be of type"
                                          " Pod)")
    assert isinstance(r, httpx.Response)


async def test_kubernetes_aio_client_watch_and_conflict(fresh_localkube: KubeEnv) -> None:
    from kubernetes.aio import client, config, watch

    k = fresh_localkube
    api_client: Any = await config.new_client_from_config(str(k.kubeconfig))
    try:
        v1: Any = client.CoreV1Api(api_client)
        await v1.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": "aio"}})
        created = await v1.create_namespaced_pod("aio", pod("ap", {"app": "aio"}))
        rv = created.metadata.resource_version
        await v1.patch_namespaced_pod("ap", "aio", {"metadata": {"labels": {"x": "1"}}})
        stale = {"metadata": {"resourceVersion": rv, "labels": {"x": "2"}}}
        with pytest.raises(client.ApiException) as err:
            await v1.patch_namespaced_pod("ap", "aio", stale)
        assert err.value.status == 409
        w = watch.Watch()
        seen = []
        async with w.stream(v1.list_namespaced_pod, "aio", resource_version=rv,
                            timeout_seconds=1) as stream:
            async for event in stream:
                seen.append((event["type"], event["object"].metadata.labels.get("x")))
        assert seen == [("MODIFIED", "1")]
    finally:
        await api_client.close()


def test_too_old_continue_token_is_410_with_fresh_token(small_kube: KubeEnv) -> None:
    small_kube.ensure_namespace("c")
    path = "/api/v1/namespaces/c/pods"
    for i in range(3):
        small_kube.create(path, pod(f"p{i}"))
    first = small_kube.request("GET", path, params={"limit": "1"}).json()
    token = first["metadata"]["continue"]
    for i in range(3, 9):
        small_kube.create(path, pod(f"p{i}"))
    r = small_kube.request("GET", path, params={"limit": "1", "continue": token})
    assert r.status_code == 410 and r.json()["reason"] == "Expired"
    fresh = r.json()["metadata"]["continue"]
    assert json.loads(base64.urlsafe_b64decode(fresh + "==="))["rv"] == -1
    follow = small_kube.request("GET", path, params={"limit": "2", "continue": fresh}).json()
    assert [i["metadata"]["name"] for i in follow["items"]] == ["p1", "p2"]


def test_status_write_gets_a_new_resource_version_and_history_is_untouched(
    localkube: KubeEnv, ns: str
) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    created = localkube.create(path, pod("st", {"v": "1"}))
    rv0 = created["metadata"]["resourceVersion"]
    status = localkube.patch(f"{path}/st/status", {"status": {"message": "hello"}})
    rv1 = status["metadata"]["resourceVersion"]
    assert int(rv1) > int(rv0)
    assert localkube.get(f"{path}/st")["metadata"]["resourceVersion"] == rv1
    localkube.patch(f"{path}/st", {"spec": {"activeDeadlineSeconds": 30}})
    past = localkube.request("GET", path, params={"resourceVersion": rv0,
                                                  "resourceVersionMatch": "Exact"}).json()
    old = past["items"][0]
    assert old["metadata"]["resourceVersion"] == rv0
    assert "message" not in old["status"] and "activeDeadlineSeconds" not in old["spec"]


def test_python_m_localkube_serves_crds_and_writes_kubeconfig(tmp_path: Path) -> None:
    import subprocess
    import sys

    kubeconfig = tmp_path / "kc"
    proc = subprocess.Popen(
        [sys.executable, "-m", "localkube", "--port", "0", "--kubeconfig", str(kubeconfig),
         *[arg for f in CRD_FILES for arg in ("--crd", str(f))]],
        stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("localkube listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[-1].strip()
        assert url in kubeconfig.read_text()
        r = httpx.get(f"{url}/apis/{GROUP}/{VERSION}", timeout=10)
        assert r.status_code == 200
        assert "PodPlacementConfig" in {res["kind"] for res in r.json()["resources"]}
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
        if proc.stdout is not None:
            proc.stdout.close()


def test_child_process_mode_with_admin_hooks(tmp_path: Path) -> None:
    with LocalKube(CRD_FILES, in_process=False) as server:
        env = KubeEnv(url=server.url, kubeconfig=server.write_kubeconfig(tmp_path / "kc"),
                      kind="localkube", server=server)
        try:
            env.ensure_namespace("cp")
            env.create("/api/v1/namespaces/cp/pods", pod("p"))
            server.inject_fault(503, 1, method="GET", plural="pods")
            r = env.request("GET", "/api/v1/namespaces/cp/pods/p")
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert r.json()["reason"] == "ServiceUnavailable"
            assert env.request("GET", "/api/v1/namespaces/cp/pods/p").status_code == 200
            verbs = [(rec.verb, rec.status) for rec in server.requests]
            assert ("get", 503) in verbs and ("create", 201) in verbs
            server.clear_requests()
            assert server.requests == []
            assert env.get(f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}")["items"] == []
        finally:
            env.close()


@pytest.fixture
def gating_webhook(tmp_path: Path) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """An HTTPS webhook on 127.0.0.1 (in a thread) that adds a scheduling gate and a label.

    Yields (url, caBundle, AdmissionReview requests seen).
    """
    import asyncio
    import ssl
    import threading

    from aiohttp import web

    from podplacement import certs

    ca = certs.generate_ca("test-webhook-ca")
    serving = certs.issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    seen: list[dict[str, Any]] = []

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        seen.append(review["request"])
        patch = [{"op": "add", "path": "/spec/schedulingGates",
                  "value": [{"name": "podplacement.io/scheduling-gate"}]},
                 {"op": "add", "path": "/metadata/labels", "value": {"gated": "yes"}}]
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": review["request"]["uid"], "allowed": True,
                                               "patchType": "JSONPatch", "patch": base64.b64encode(
                                                   json.dumps(patch).encode()).decode()}})

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/mutate", mutate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield (f"https://127.0.0.1:{holder['port']}/mutate",
               base64.b64encode(ca.cert_pem).decode(), seen)
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_create_goes_through_the_mutating_webhook(
    fresh_localkube: KubeEnv, gating_webhook: tuple[str, str, list[dict[str, Any]]]
) -> None:
    url, ca_bundle, seen = gating_webhook
    k = fresh_localkube
    k.ensure_namespace("wh")
    k.create("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "gate"},
        "webhooks": [{"name": "gate.example.com", "clientConfig": {"url": url,
                                                                   "caBundle": ca_bundle},
                      "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                                 "apiVersions": ["v1"], "resources": ["pods"]}],
                      "sideEffects": "None", "admissionReviewVersions": ["v1"],
                      "failurePolicy": "Fail", "timeoutSeconds": 5}]})
    body = pod("")
    body["metadata"] = {"generateName": "gen-"}
    created = k.create("/api/v1/namespaces/wh/pods", body)
    assert created["spec"]["schedulingGates"] == [{"name": "podplacement.io/scheduling-gate"}]
    assert created["metadata"]["labels"] == {"gated": "yes"}
    cond = next(c for c in created["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (cond["status"], cond["reason"]) == ("False", "SchedulingGated")
    assert len(seen) == 1
    review = seen[0]
    assert review["operation"] == "CREATE" and "name" not in review
    assert review["object"]["status"] == {}
    assert review["object"]["spec"]["restartPolicy"] == "Always"  # defaulted before the call
    dry = k.request("POST", "/api/v1/namespaces/wh/pods", json=pod("dry"),
                    params={"dryRun": "All"})
    assert dry.status_code == 201 and seen[-1]["dryRun"] is True
    cm = k.create("/api/v1/namespaces/wh/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "c"}})
    assert cm["metadata"]["name"] == "c" and len(seen) == 2  # rules match pods only


def test_a_watch_whose_client_hangs_up_at_once_is_not_logged_as_an_error(
        fresh_localkube: Any, caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp logs "Error handling request" with a traceback ("Cannot write to closing
    transport") for a handler that raises because its client left; localkube answers
    nobody instead."""
    import socket
    import struct
    import time
    from urllib.parse import urlsplit

    caplog.set_level("DEBUG", logger="aiohttp.server")
    where = urlsplit(fresh_localkube.url)
    for _ in range(10):
        with socket.create_connection((where.hostname, where.port)) as s:
            s.sendall(b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: localkube\r\n\r\n")
            # close with a reset, before the server writes the response headers
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(0.5)
    assert fresh_localkube.get("/api/v1/namespaces/default")["metadata"]["name"] == "default"
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [], [r.getMessage() for r in errors]
