"""The raw-JSON client and the informer against localkube: errors, verbs, list+watch,
resume from the last resourceVersion, relist on 410, bookmarks, an absent CRD, and the
informer without a cache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from localkube import LocalKube
from podplacement.kubeclient import (
    UNAVAILABLE_RETRY_SECONDS,
    ApiError,
    Informer,
    KubeAPI,
    next_backoff,
    request_resource,
    request_verb,
    retry_delay,
)
from tests.controller.conftest import eventually
from tests.harness.kube import KubeEnv, start_localkube


@pytest.fixture
def small_kube(tmp_path: Path) -> Iterator[tuple[LocalKube, KubeEnv]]:
    """A fresh localkube with a short watch history and fast bookmarks."""
    server, env = start_localkube(tmp_path, history_size=5, bookmark_interval=0.1)
    try:
        yield server, env
    finally:
        env.close()
        server.stop()


@pytest.fixture
async def small_api(small_kube: tuple[LocalKube, KubeEnv]) -> AsyncIterator[KubeAPI]:
    api = await KubeAPI.from_kubeconfig(str(small_kube[1].kubeconfig))
    await api.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
    )
    await api.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},
    )
    try:
        yield api
    finally:
        await api.close()


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"k": "v"},
    }


@pytest.mark.parametrize(
    ("method", "path", "verb", "resource"),
    [
        ("GET", "/api/v1/pods", "list", "pods"),
        ("GET", "/api/v1/namespaces/a/pods/p", "get", "pods"),
        ("GET", "/api/v1/namespaces/a/pods?watch=true", "watch", "pods"),
        ("PATCH", "/api/v1/namespaces/a/pods/p", "patch", "pods"),
        ("PATCH", "/api/v1/namespaces/a/pods/p/status", "patch", "pods/status"),
        ("POST", "/apis/events.k8s.io/v1/namespaces/a/events", "create", "events"),
        (
            "GET",
            "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster",
            "get",
            "podplacementconfigs",
        ),
        ("DELETE", "/api/v1/namespaces/a", "delete", "namespaces"),
        ("GET", "/api/v1/nodes", "list", "nodes"),
    ],
)
def test_request_verbs_and_resources(method: str, path: str, verb: str, resource: str) -> None:
    assert request_verb(method, path) == verb
    assert request_resource(path) == resource


async def test_errors_carry_the_status_fields(small_api: KubeAPI) -> None:
    with pytest.raises(ApiError) as info:
        await small_api.request("GET", "/api/v1/namespaces/a/pods/nope")
    assert info.value.status == 404 and info.value.reason == "NotFound" and info.value.not_found
    assert info.value.body is not None and info.value.body["kind"] == "Status"
    with pytest.raises(ApiError) as info:
        await small_api.request("GET", "/apis/nonexistent.example.com/v1/things")
    assert info.value.status == 404 and info.value.body is None  # text/plain 404
    assert small_api.counters[("get", 404)] == 1


async def test_transport_error_is_an_api_error_with_status_zero() -> None:
    api = KubeAPI.from_url("http://127.0.0.1:9", request_timeout=2)
    try:
        with pytest.raises(ApiError) as info:
            await api.request("GET", "/api/v1/pods")
        assert info.value.status == 0
        assert api.counters[("list", 0)] == 1
    finally:
        await api.close()


async def test_informer_lists_watches_and_resumes_from_last_rv(small_api: KubeAPI) -> None:
    api = small_api
    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("one", sel="x"))
    inf = Informer(api, "/api/v1/configmaps", {"labelSelector": "sel=x"}, watch_timeout=2)
    seen: list[tuple[str, str]] = []
    inf.add_handler(lambda t, o, old: seen.append((t, o["metadata"]["name"])))
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("two", sel="x"))
        await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("other"))
        await eventually(lambda: _has(inf, "a/two"))
        # leaving the selector is a DELETED event
        await api.request(
            "PATCH",
            "/api/v1/namespaces/a/configmaps/two",
            body={"metadata": {"labels": {"sel": "y"}}},
        )
        await eventually(lambda: _gone(inf, "a/two"))
        assert ("ADDED", "one") in seen and ("ADDED", "two") in seen
        assert ("DELETED", "two") in seen and "a/other" not in inf.cache
        await inf.stop()
        # restarted within the history window: resumes by watch, no relist
        await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("three", sel="x"))
        inf.start()
        await eventually(lambda: _has(inf, "a/three"))
        assert inf.lists == 1
    finally:
        await inf.stop()


async def test_informer_relists_after_410_gone(small_api: KubeAPI) -> None:
    api = small_api
    inf = Informer(api, "/api/v1/namespaces/a/configmaps", watch_timeout=2)
    deleted: list[str] = []
    inf.add_handler(
        lambda t, o, old: deleted.append(o["metadata"]["name"]) if t == "DELETED" else None
    )
    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("old"))
    inf.start()
    await asyncio.wait_for(inf.synced.wait(), 10)
    await inf.stop()
    # while stopped: more writes than the history keeps, and a delete
    await api.request("DELETE", "/api/v1/namespaces/a/configmaps/old")
    for i in range(12):
        await api.request("POST", "/api/v1/namespaces/b/configmaps", body=_cm(f"n{i}"))
    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("new"))
    inf.start()
    try:
        await eventually(lambda: _has(inf, "a/new"))
        assert inf.lists == 2  # the resumed watch got 410 and the informer listed again
        assert "a/old" not in inf.cache and deleted == ["old"]  # relist emits the difference
    finally:
        await inf.stop()


async def test_informer_without_cache_hands_on_events_and_relists_as_added(
    small_api: KubeAPI,
) -> None:
    api = small_api
    inf = Informer(api, "/api/v1/namespaces/a/configmaps", watch_timeout=2, keep_cache=False)
    seen: list[tuple[str, str, Any]] = []
    listed: list[str] = []  # the objects handed on while the informer said it was listing
    inf.add_handler(lambda t, o, old: seen.append((t, o["metadata"]["name"], old)))
    inf.add_handler(lambda t, o, old: listed.append(o["metadata"]["name"]) if inf.listing
                    else None)
    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("kept"))
    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("old"))
    inf.start()
    await asyncio.wait_for(inf.synced.wait(), 10)
    await api.request("PATCH", "/api/v1/namespaces/a/configmaps/kept",
                      body={"metadata": {"labels": {"l": "1"}}})
    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("added"))
    await api.request("DELETE", "/api/v1/namespaces/a/configmaps/added")
    await eventually(lambda: _saw(seen, ("DELETED", "added", None)))
    assert seen == [("ADDED", "kept", None), ("ADDED", "old", None),
                    ("MODIFIED", "kept", None), ("ADDED", "added", None),
                    ("DELETED", "added", None)]
    assert listed == ["kept", "old"] and not inf.listing
    assert not inf.cache and inf.get("a/kept") is None
    await inf.stop()
    # While stopped: "old" is deleted and the history overflows, so the resumed watch gets
    # 410 and the informer lists again: everything listed is ADDED again, and the deletion
    # it cannot see is not emitted.
    seen.clear()
    await api.request("DELETE", "/api/v1/namespaces/a/configmaps/old")
    for i in range(12):
        await api.request("POST", "/api/v1/namespaces/b/configmaps", body=_cm(f"n{i}"))
    inf.start()
    try:
        await eventually(lambda: _saw(seen, ("ADDED", "kept", None)))
        assert inf.lists == 2
        assert seen == [("ADDED", "kept", None)] and not inf.cache
    finally:
        await inf.stop()


def _trim(obj: dict[str, Any]) -> dict[str, Any]:
    """Keep metadata name/namespace/resourceVersion and a marker: what a transform keeps."""
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion")},
            "trimmed": sorted(obj.get("data") or {})}


async def test_transform_applies_to_listed_items_and_watch_events_before_cache_and_handlers(
    small_api: KubeAPI,
) -> None:
    api = small_api
    for name in ("one", "two", "three"):
        await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm(name))
    inf = Informer(api, "/api/v1/namespaces/a/configmaps", watch_timeout=2, page_size=2,
                   transform=_trim)
    seen: list[tuple[str, dict[str, Any], Any]] = []
    inf.add_handler(lambda t, o, old: seen.append((t, o, old)))
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        assert {t for t, _, _ in seen} == {"ADDED"} and len(seen) == 3  # two pages
        await api.request("PATCH", "/api/v1/namespaces/a/configmaps/one",
                          body={"data": {"z": "1"}})
        await api.request("DELETE", "/api/v1/namespaces/a/configmaps/two")
        await eventually(lambda: _gone(inf, "a/two"))
        assert inf.cache["a/one"]["trimmed"] == ["k", "z"] and "data" not in inf.cache["a/one"]
        assert all(set(o) == {"metadata", "trimmed"} for _, o, _ in seen)
        modified = [(o, old) for t, o, old in seen if t == "MODIFIED"]
        assert modified and modified[0][0]["trimmed"] == ["k", "z"]
        assert modified[0][1]["trimmed"] == ["k"] and set(modified[0][1]) == {"metadata",
                                                                              "trimmed"}
        deleted = [o for t, o, _ in seen if t == "DELETED"]
        assert [o["metadata"]["name"] for o in deleted] == ["two"] and "data" not in deleted[0]
    finally:
        await inf.stop()


async def test_a_transform_failing_on_a_watch_event_hands_the_object_on_whole(
    small_api: KubeAPI,
) -> None:
    api = small_api

    def picky(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "bad":
            raise ValueError("cannot trim")
        return _trim(obj)

    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("good"))
    inf = Informer(api, "/api/v1/namespaces/a/configmaps", watch_timeout=2, transform=picky)
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("bad"))
        await eventually(lambda: _has(inf, "a/bad"))
        assert inf.cache["a/bad"]["data"] == {"k": "v"} and "data" not in inf.cache["a/good"]
    finally:
        await inf.stop()


async def test_informer_without_cache_hands_each_page_on_as_it_arrives(
    small_api: KubeAPI,
) -> None:
    """A cache-less relist emits a page's objects before the next page is asked for; the
    resourceVersion and ``synced`` come after the last page, ``listing`` spans them all."""
    api = small_api
    for i in range(5):
        await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm(f"c{i}"))
    inf = Informer(api, "/api/v1/namespaces/a/configmaps", watch_timeout=2, page_size=2,
                   keep_cache=False, transform=_trim)
    # (name, list GETs answered so far, listing, resourceVersion set, synced) at each event
    seen: list[tuple[str, int, bool, bool, bool]] = []
    inf.add_handler(lambda t, o, old: seen.append((
        o["metadata"]["name"], api.counters[("list", 200)], inf.listing,
        bool(inf.resource_version), inf.synced.is_set())))
    lists_before = api.counters[("list", 200)]
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        assert [(name, gets - lists_before) for name, gets, *_ in seen] == [
            ("c0", 1), ("c1", 1), ("c2", 2), ("c3", 2), ("c4", 3)]
        assert all(listing and not rv and not synced for _, _, listing, rv, synced in seen)
        assert not inf.listing and inf.resource_version and not inf.cache
    finally:
        await inf.stop()


async def test_bookmarks_advance_the_resource_version(small_api: KubeAPI) -> None:
    api = small_api
    inf = Informer(api, "/api/v1/namespaces/a/configmaps", watch_timeout=5)
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        start_rv = int(inf.resource_version)
        created = await api.request("POST", "/api/v1/namespaces/b/configmaps", body=_cm("x"))
        target = int(created["metadata"]["resourceVersion"])
        await eventually(lambda: _rv_at_least(inf, target))
        assert int(inf.resource_version) > start_rv and not inf.cache
    finally:
        await inf.stop()


async def test_absent_resource_is_tolerated_and_picked_up_later(small_api: KubeAPI) -> None:
    api = small_api
    path = "/apis/example.com/v1/widgets"
    inf = Informer(
        api, path, tolerate_absent=True, min_backoff=0.05, max_backoff=0.2, watch_timeout=2
    )
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        assert inf.absent and not inf.cache
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Cluster",
                "names": {
                    "plural": "widgets",
                    "singular": "widget",
                    "kind": "Widget",
                    "listKind": "WidgetList",
                },
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
        await api.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
        )

        async def create() -> bool:
            try:
                await api.request(
                    "POST",
                    path,
                    body={
                        "apiVersion": "example.com/v1",
                        "kind": "Widget",
                        "metadata": {"name": "w1"},
                    },
                )
                return True
            except ApiError:
                return False

        await eventually(create)
        await eventually(lambda: _has(inf, "w1"))
        assert not inf.absent
    finally:
        await inf.stop()


async def _has(inf: Informer, key: str) -> bool:
    return key in inf.cache


async def _gone(inf: Informer, key: str) -> bool:
    return key not in inf.cache


async def _saw(seen: list[tuple[str, str, Any]], event: tuple[str, str, Any]) -> bool:
    return event in seen


async def _rv_at_least(inf: Informer, rv: int) -> bool:
    return int(inf.resource_version or 0) >= rv


@pytest.mark.parametrize(("status", "capped"), [(0, True), (429, True), (503, True),
                                                (500, True), (403, False), (422, False)])
def test_retry_delay_is_short_while_the_server_is_down(status: int, capped: bool) -> None:
    exc = ApiError(status, "x", "y")
    delays = [retry_delay(30.0, exc) for _ in range(200)]
    assert all(d <= UNAVAILABLE_RETRY_SECONDS for d in delays) is capped
    assert all(15.0 <= d < 45.0 for d in delays) is not capped
    assert 0.5 <= retry_delay(1.0, None) < 1.5
    # the backoff does not grow past the short wait during an outage, so the 403s of a
    # restarted server's warming authorizer start from it
    assert (next_backoff(0.8, exc, 30.0) <= UNAVAILABLE_RETRY_SECONDS) is capped
