"""End to end: the controller in-process against localkube (or a real control plane through
the ``kube`` fixture) and the real registry. Each test works in its own namespace."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import (
    AFFINITY_LABEL,
    ARCH_LABEL,
    GATE_LABEL,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    SCHEDULING_GATE,
    WINDOWS_BUILD_LABEL,
)
from podplacement.rules.place.affinity import expression
from podplacement.sandbox.controlplane import WINDOWS_BUILD_2022
from tests.controller.conftest import (
    Images,
    StartController,
    create_pod,
    decision_of,
    dockerconfig_secret,
    events_for,
    eventually,
    gated_pod,
    get_pod,
    required_terms,
    wait_ungated,
)
from tests.harness.kube import KubeEnv
from tests.harness.registry import Registry

ZONE = expression("topology.kubernetes.io/zone", "In", ["zone-a", "zone-b"])
WORKER = expression("node-role.kubernetes.io/worker", "Exists")


def _arch(*archs: str) -> dict[str, Any]:
    return expression(ARCH_LABEL, "In", list(archs))


LINUX = expression(OS_LABEL, "In", ["linux"])


async def test_single_arch_image_gets_affinity_labels_annotation_and_event(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await start_controller()
    await create_pod(api, ns, gated_pod("single", [images.arm]))
    pod = await wait_ungated(api, ns, "single")
    assert "schedulingGates" not in pod["spec"]
    assert required_terms(pod) == [{"matchExpressions": [_arch("arm64"), LINUX]}]
    assert pod["metadata"]["labels"][GATE_LABEL] == "removed"
    assert pod["metadata"]["labels"][AFFINITY_LABEL] == "set"
    record = decision_of(pod)
    assert record["archs"] == ["arm64"] and record["result"] == "set"
    assert record["images"][0]["platforms"] == ["linux/arm64"]
    assert record["images"][0]["digest"].startswith("sha256:")
    events = await eventually(lambda: events_for(api, ns, "single"))
    assert [e["reason"] for e in events] == ["PlacementDecided"]


async def test_multi_arch_containers_and_init_containers_intersect(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await start_controller()
    await create_pod(api, ns, gated_pod("multi", [images.multi], init_images=[images.amd_arm]))
    pod = await wait_ungated(api, ns, "multi")
    assert required_terms(pod) == [{"matchExpressions": [_arch("amd64", "arm64"), LINUX]}]
    assert [i["image"] for i in decision_of(pod)["images"]] == [images.amd_arm, images.multi]


async def test_empty_intersection_requires_the_marker_and_warns(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await start_controller()
    await create_pod(api, ns, gated_pod("none", [images.arm, images.s390x]))
    pod = await wait_ungated(api, ns, "none")
    assert required_terms(pod) == [
        {"matchExpressions": [{"key": NO_SUPPORTED_PLATFORM_KEY, "operator": "Exists"}]}
    ]
    assert decision_of(pod)["result"] == "no-supported-platform"
    events = await eventually(lambda: events_for(api, ns, "none"))
    assert events[0]["reason"] == "NoSupportedPlatform" and events[0]["type"] == "Warning"


async def test_existing_terms_get_arch_anded_and_arch_terms_stay(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    own = _arch("s390x")
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [ZONE]},
                    {"matchExpressions": [WORKER, own]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            }
        }
    }
    await start_controller()
    await create_pod(api, ns, gated_pod("terms", [images.multi], affinity=affinity))
    pod = await wait_ungated(api, ns, "terms")
    arch = _arch("amd64", "arm64", "s390x")
    terms = required_terms(pod)
    assert terms[0] == {"matchExpressions": [ZONE, arch, LINUX]}
    assert terms[1] == {"matchExpressions": [WORKER, own, LINUX]}  # the user's arch pin stays
    assert terms[2]["matchExpressions"] == [arch, LINUX]
    assert terms[2]["matchFields"][0]["values"] == ["n1"]


async def test_node_selector_pin_keeps_affinity_and_bad_pin_warns(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await start_controller()
    await create_pod(api, ns, gated_pod("pin", [images.multi], node_selector={ARCH_LABEL: "arm64"}))
    await create_pod(
        api, ns, gated_pod("badpin", [images.arm], node_selector={ARCH_LABEL: "amd64"})
    )
    pod = await wait_ungated(api, ns, "pin")
    assert required_terms(pod) == [{"matchExpressions": [LINUX]}]  # the arch pin is the user's
    await wait_ungated(api, ns, "badpin")
    events = await eventually(lambda: events_for(api, ns, "badpin"))
    assert events[0]["reason"] == "IncompatibleNodeSelector"


async def test_windows_image_requires_windows_os(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await start_controller()
    await create_pod(api, ns, gated_pod("win", [images.windows]))
    pod = await wait_ungated(api, ns, "win")
    # the pusher's windows entries carry os.version 10.0.20348.x: the term requires that build
    assert required_terms(pod) == [
        {"matchExpressions": [_arch("amd64"), expression(OS_LABEL, "In", ["windows"]),
                              expression(WINDOWS_BUILD_LABEL, "In", [WINDOWS_BUILD_2022])]}
    ]


async def test_other_gate_is_kept(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await start_controller()
    await create_pod(
        api, ns, gated_pod("two", [images.arm], gates=["example.com/other", SCHEDULING_GATE])
    )
    pod = await wait_ungated(api, ns, "two")
    assert pod["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert required_terms(pod) == [{"matchExpressions": [_arch("arm64"), LINUX]}]


async def test_private_image_needs_the_secret_in_the_pods_namespace(
    api: KubeAPI,
    ckube: KubeEnv,
    namespace: str,
    images: Images,
    basic_registry: Registry,
    start_controller: StartController,
) -> None:
    ns = namespace
    other = f"{ns}-nosecret"
    ckube.ensure_namespace(other)
    try:
        await api.request(
            "POST",
            f"/api/v1/namespaces/{ns}/secrets",
            body=dockerconfig_secret("regcred", basic_registry),
        )
        await start_controller()
        await create_pod(api, ns, gated_pod("priv", [images.private], pull_secrets=["regcred"]))
        pod = await wait_ungated(api, ns, "priv")
        assert required_terms(pod) == [{"matchExpressions": [_arch("arm64", "ppc64le"), LINUX]}]
        # Same image, same secret name, namespace without the secret: the cached result of
        # the first pod must not be reused; inspection fails, retries, then falls back.
        await create_pod(api, other, gated_pod("priv", [images.private], pull_secrets=["regcred"]))
        pod2 = await wait_ungated(api, other, "priv", within=30)
        record = decision_of(pod2)
        assert record["result"] == "fallback"
        assert "error" in record["images"][0]
        assert required_terms(pod2) == [{"matchExpressions": [LINUX]}]  # never any node
        assert pod2["metadata"]["labels"][AFFINITY_LABEL] == "set"
    finally:
        ckube.delete(f"/api/v1/namespaces/{other}")


async def test_registry_down_retries_then_falls_back_and_ungates(
    api: KubeAPI, namespace: str, start_controller: StartController
) -> None:
    ns = namespace
    ctl = await start_controller()
    # nothing listens on port 9 of 127.0.0.1 (discard service is not running)
    await create_pod(api, ns, gated_pod("down", ["127.0.0.1:9/nothing/here:v1"]))
    pod = await wait_ungated(api, ns, "down", within=30)
    record = decision_of(pod)
    assert record["result"] == "fallback" and record["fallback"] is None
    assert required_terms(pod) == [{"matchExpressions": [LINUX]}]
    events = await eventually(lambda: _two_events(api, ns, "down"))
    assert sorted(e["reason"] for e in events) == ["ImageInspectionFailed", "PlacementFallback"]
    (fallback,) = [e for e in events if e["reason"] == "PlacementFallback"]
    assert "required kubernetes.io/os In [linux] (fallbackOperatingSystems)" in (
        fallback.get("note") or fallback.get("message") or "")
    assert ctl.metrics.processed.labels("retry")._value.get() == 5  # default maxRetries


async def _two_events(api: KubeAPI, ns: str, name: str) -> list[dict[str, Any]] | None:
    events = await events_for(api, ns, name)
    return events if len(events) >= 2 else None


async def test_conflicting_writes_are_retried_with_a_fresh_read(
    api: KubeAPI,
    ckube: KubeEnv,
    namespace: str,
    images: Images,
    monkeypatch: pytest.MonkeyPatch,
    start_controller: StartController,
) -> None:
    """Someone else writes the pod just before each of the controller's first two PATCHes:
    the API server itself refuses them as stale (the guarded patch's ``test`` of
    ``metadata.resourceVersion``), and the controller reads the pod again and succeeds."""
    ns = namespace
    path = f"/api/v1/namespaces/{ns}/pods/conflict"
    request = api.request
    bumped: list[str] = []

    async def racing_request(method: str, target: str, **kwargs: Any) -> Any:
        if method == "PATCH" and target == path and len(bumped) < 2:
            bumped.append(f"b{len(bumped)}")
            ckube.patch(path, {"metadata": {"labels": {"raced": bumped[-1]}}})
        return await request(method, target, **kwargs)

    monkeypatch.setattr(api, "request", racing_request)
    ctl = await start_controller()
    await create_pod(api, ns, gated_pod("conflict", [images.arm]))
    pod = await wait_ungated(api, ns, "conflict")
    assert required_terms(pod) == [{"matchExpressions": [_arch("arm64"), LINUX]}]
    assert pod["metadata"]["labels"]["raced"] == "b1"  # the other writer's change is kept
    # Both raced writes were refused by the server; a requeue triggered by the other writer's
    # events may meet one more stale version (timing), never a second successful write.
    assert ctl.metrics.conflicts._value.get() >= 2
    assert api.resource_counters[("patch", "pods", 200)] == 1


async def test_stale_pod_is_recomputed_from_the_latest_version(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await create_pod(api, ns, gated_pod("stale", [images.arm]))
    # a label change after creation: the controller's patch must carry the new RV
    await api.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/stale",
        body={"metadata": {"labels": {"touched": "yes"}}},
    )
    await start_controller()
    pod = await wait_ungated(api, ns, "stale")
    assert pod["metadata"]["labels"]["touched"] == "yes"


async def test_one_write_per_pod_and_metrics_endpoint(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    import aiohttp

    ns = namespace
    ctl = await start_controller(metrics_port=0, metrics_host="127.0.0.1")
    for i in range(10):
        await create_pod(api, ns, gated_pod(f"w{i}", [images.multi]))
    for i in range(10):
        await wait_ungated(api, ns, f"w{i}")
    assert api.resource_counters[("patch", "pods", 200)] == 10
    assert ctl.health is not None
    base = f"http://127.0.0.1:{ctl.health.port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/metrics") as r:
            text = await r.text()
        async with s.get(base + "/readyz") as r:
            assert r.status == 200
        async with s.get(base + "/healthz") as r:
            assert r.status == 200
    assert 'podplacement_pods_processed_total{outcome="set"} 10.0' in text
    assert 'podplacement_api_requests_total{code="200",verb="patch"} 10.0' in text
    assert "podplacement_ungate_seconds_count 10.0" in text


async def test_restart_mid_batch_loses_nothing(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    names = [f"b{i}" for i in range(30)]
    for n in names:
        await create_pod(api, ns, gated_pod(n, [images.amd_arm]))
    first = await start_controller(workers=1, rate=20, burst=1)

    async def some_done() -> bool:
        return first.metrics.processed.labels("set")._value.get() >= 3

    await eventually(some_done)
    await first.stop()
    await start_controller()
    for n in names:
        pod = await wait_ungated(api, ns, n)
        assert decision_of(pod)["archs"] == ["amd64", "arm64"]
        assert required_terms(pod) == [{"matchExpressions": [_arch("amd64", "arm64"), LINUX]}]


async def test_weights_and_user_preference_from_the_config(
    api: KubeAPI,
    ckube: KubeEnv,
    namespace: str,
    images: Images,
    start_controller: StartController,
) -> None:
    ns = namespace
    path = "/apis/podplacement.io/v1beta1/podplacementconfigs"
    existing = ckube.request("GET", f"{path}/cluster")
    if existing.status_code == 200:
        pytest.skip("a PodPlacementConfig 'cluster' already exists in this cluster")
    config = {
        "apiVersion": "podplacement.io/v1beta1",
        "kind": "PodPlacementConfig",
        "metadata": {"name": "cluster"},
        "spec": {
            "plugins": {
                "nodeAffinityScoring": {
                    "enabled": True,
                    "platforms": [
                        {"architecture": "arm64", "weight": 70},
                        {"architecture": "s390x", "weight": 5},
                    ],
                }
            }
        },
    }
    await api.request("POST", path, body=config)
    try:
        ctl = await start_controller()
        await eventually(lambda: _has_prefs(ctl))
        mine = {"weight": 9, "preference": {"matchExpressions": [_arch("amd64")]}}
        await create_pod(api, ns, gated_pod("w", [images.amd_arm]))
        await create_pod(
            api,
            ns,
            gated_pod(
                "mine",
                [images.amd_arm],
                affinity={
                    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [mine]}
                },
            ),
        )
        pod = await wait_ungated(api, ns, "w")
        pref = pod["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert pref == [{"weight": 70, "preference": {"matchExpressions": [_arch("arm64")]}}]
        kept = await wait_ungated(api, ns, "mine")
        assert kept["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ] == [mine]
    finally:
        await api.request("DELETE", f"{path}/cluster")


async def _has_prefs(ctl: Any) -> bool:
    return bool(ctl.config_source()[0].preferred_platforms)


async def test_pod_ungated_by_someone_else_is_left_alone(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await create_pod(api, ns, gated_pod("other", [images.arm]))
    await api.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/other",
        body=[{"op": "remove", "path": "/spec/schedulingGates/0"}],
    )
    ctl = await start_controller()
    await asyncio.wait_for(ctl.queue.wait_idle(), 20)
    pod = await get_pod(api, ns, "other")
    assert "affinity" not in pod["spec"]
    assert pod["metadata"]["labels"][GATE_LABEL] == "gated"


async def test_ungate_remaining_decides_within_the_deadline_else_the_fallback(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController
) -> None:
    ns = namespace
    await create_pod(api, ns, gated_pod("ok", [images.arm]))
    await create_pod(api, ns, gated_pod("stuck", ["127.0.0.1:9/down/image:v1"]))
    ctl = await start_controller(retry_base_delay=30.0)
    assert await ctl.ungate_remaining(0.5) == 2
    ok = await get_pod(api, ns, "ok")
    assert "schedulingGates" not in ok["spec"]
    assert required_terms(ok) == [{"matchExpressions": [_arch("arm64"), LINUX]}]
    stuck = await get_pod(api, ns, "stuck")
    # released without its images' platforms, still never to any node
    assert "schedulingGates" not in stuck["spec"]
    assert required_terms(stuck) == [{"matchExpressions": [LINUX]}]
    record = decision_of(stuck)
    assert record["result"] == "fallback" and record["reason"] == (
        "podplacement is being uninstalled; fallback: required kubernetes.io/os In [linux] "
        "(fallbackOperatingSystems); any kubernetes.io/arch (no fallbackArchitecture)")

    async def fallback_events() -> list[dict[str, Any]]:
        return [e for e in await events_for(api, ns, "stuck")
                if e["reason"] == "PlacementFallback"]

    (event,) = await eventually(fallback_events)
    assert (event.get("note") or event.get("message")) == record["reason"]


async def test_a_decision_that_fails_releases_the_pod_with_the_fallback(
    api: KubeAPI, namespace: str, images: Images, start_controller: StartController,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """An internal error while deciding never leaves the pod gated, nor releases it to any
    node: the fallback requirement is written (docs/how-it-decides.md, item 7)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr("podplacement.controller.reconciler.plan", broken)
    ns = namespace
    await start_controller()
    await create_pod(api, ns, gated_pod("odd", [images.arm]))
    pod = await wait_ungated(api, ns, "odd")
    assert required_terms(pod) == [{"matchExpressions": [LINUX]}]
    record = decision_of(pod)
    assert record["result"] == "fallback" and record["reason"].startswith(
        "internal error while deciding: boom; fallback: required kubernetes.io/os In [linux]")


async def test_pod_deleted_while_queued_is_dropped(
    api: KubeAPI, namespace: str, start_controller: StartController
) -> None:
    ns = namespace
    ctl = await start_controller(retry_base_delay=0.2)
    await create_pod(api, ns, gated_pod("gone", ["127.0.0.1:9/down/image:v1"]))

    async def retried() -> bool:
        return ctl.metrics.processed.labels("retry")._value.get() >= 1

    await eventually(retried)
    await api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/gone")
    await eventually(lambda: _idle(ctl))
    assert ctl.metrics.processed.labels("fallback")._value.get() == 0


async def _idle(ctl: Any) -> bool:
    return ctl.queue.pending == 0


async def test_global_pull_secret_from_the_config(
    api: KubeAPI,
    ckube: KubeEnv,
    namespace: str,
    images: Images,
    basic_registry: Registry,
    start_controller: StartController,
) -> None:
    ns = namespace
    holder = f"{ns}-global"
    ckube.ensure_namespace(holder)
    path = "/apis/podplacement.io/v1beta1/podplacementconfigs"
    await api.request(
        "POST",
        f"/api/v1/namespaces/{holder}/secrets",
        body=dockerconfig_secret("global", basic_registry),
    )
    await api.request(
        "POST",
        path,
        body={
            "apiVersion": "podplacement.io/v1beta1",
            "kind": "PodPlacementConfig",
            "metadata": {"name": "cluster"},
            "spec": {
                "imageInspection": {"globalPullSecretRef": {"namespace": holder, "name": "global"}}
            },
        },
    )
    try:
        ctl = await start_controller()
        await eventually(lambda: _has_global(ctl))
        # no imagePullSecrets on the pod, no secret in its namespace
        await create_pod(api, ns, gated_pod("g", [images.private]))
        pod = await wait_ungated(api, ns, "g")
        assert decision_of(pod)["result"] == "set"
        assert required_terms(pod) == [{"matchExpressions": [_arch("arm64", "ppc64le"), LINUX]}]
    finally:
        await api.request("DELETE", f"{path}/cluster")
        ckube.delete(f"/api/v1/namespaces/{holder}")


async def _has_global(ctl: Any) -> bool:
    return ctl.config_source()[0].image_inspection.global_pull_secret is not None


async def test_malformed_pull_secret_is_skipped_with_a_warning(
    api: KubeAPI,
    namespace: str,
    images: Images,
    basic_registry: Registry,
    start_controller: StartController,
) -> None:
    """A pull secret the API server accepts (valid JSON object) but whose docker config
    entry cannot be decoded (``imageinspect.CredentialError``) is skipped: the next secret
    still authenticates, the pod gets its affinity and one Warning names the bad secret."""
    ns = namespace
    bad_auth = base64.b64encode(b"no-colon-here").decode()
    broken = dockerconfig_secret("broken", basic_registry)
    broken["data"][".dockerconfigjson"] = base64.b64encode(
        json.dumps({"auths": {basic_registry.host: {"auth": bad_auth}}}).encode()
    ).decode()
    for secret in (broken, dockerconfig_secret("regcred", basic_registry)):
        await api.request("POST", f"/api/v1/namespaces/{ns}/secrets", body=secret)
    await start_controller()
    await create_pod(
        api, ns, gated_pod("mixed", [images.private], pull_secrets=["broken", "regcred"])
    )
    pod = await wait_ungated(api, ns, "mixed")
    assert required_terms(pod) == [{"matchExpressions": [_arch("arm64", "ppc64le"), LINUX]}]
    assert decision_of(pod)["result"] == "set"

    async def warned() -> list[dict[str, Any]]:
        return [e for e in await events_for(api, ns, "mixed")
                if e.get("reason") == "InvalidPullSecret"]

    (event,) = await eventually(warned)
    text = event.get("note") or event.get("message") or ""
    assert f"{ns}/broken" in text and event["type"] == "Warning"
    assert bad_auth not in text


async def test_a_pull_secret_name_that_is_no_secret_name_is_never_read(
    api: KubeAPI,
    namespace: str,
    images: Images,
    basic_registry: Registry,
    start_controller: StartController,
) -> None:
    """A pod's ``imagePullSecrets`` name that cannot be a Secret's (``..`` and ``/``: a path
    into another namespace) is skipped without a request (``kubeclient.secret_path``), with
    one ``InvalidPullSecret`` Warning; the pod's valid Secret after it still authenticates."""
    ns = namespace
    await api.request("POST", f"/api/v1/namespaces/{ns}/secrets",
                      body=dockerconfig_secret("regcred", basic_registry))
    await start_controller()

    def secret_reads() -> int:  # the controller shares ``api``; its counters count them
        return sum(n for (verb, resource, _), n in api.resource_counters.items()
                   if verb == "get" and resource == "secrets")

    before = secret_reads()
    await create_pod(api, ns, gated_pod("traversal", [images.private],
                                        pull_secrets=["../../other/secrets/regcred",
                                                      "regcred"]))
    pod = await wait_ungated(api, ns, "traversal")
    assert required_terms(pod) == [{"matchExpressions": [_arch("arm64", "ppc64le"), LINUX]}]

    async def warned() -> list[dict[str, Any]]:
        return [e for e in await events_for(api, ns, "traversal")
                if e.get("reason") == "InvalidPullSecret"]

    (event,) = await eventually(warned)
    text = event.get("note") or event.get("message") or ""
    assert "Secret name" in text and "may not contain '/'" in text
    assert secret_reads() - before == 1  # regcred only
