"""The exec-format-error monitor on the real control plane (``real_kube``; skipped without
binaries). The plane has no kubelet: the test writes container statuses through
``pods/status`` as a kubelet would, with each runtime's words, on an arm64 node it creates,
for pods of a lying image in the test registry (its arm64 entry holds an amd64 binary)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from podplacement.controller.app import Controller, ControllerOptions
from podplacement.imageinspect import Inspector, RegistriesConfig
from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import (
    AFFINITY_LABEL,
    EXEC_FORMAT_ANNOTATION,
    EXEC_FORMAT_LABEL,
    EXEC_FORMAT_REASON,
)
from tests.controller.conftest import events_for, eventually
from tests.controller.test_execformat import CONTAINERD_START, CRIO_START, CRUN_JSON, RUNC
from tests.harness.kube import KubeEnv
from tests.harness.oci import Pusher
from tests.harness.registry import Registry
from tests.imageinspect._images import elf, file, layer, symlink

pytestmark = pytest.mark.realcluster

NOW = "2026-01-01T00:00:00Z"


@pytest.fixture
def real_namespace(real_kube: KubeEnv) -> Iterator[str]:
    name = f"xfe-{uuid.uuid4().hex[:8]}"
    real_kube.ensure_namespace(name)
    try:
        yield name
    finally:
        real_kube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def arm_node(real_kube: KubeEnv) -> Iterator[str]:
    name = f"xfe-arm-{uuid.uuid4().hex[:6]}"
    real_kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux",
                                 "kubernetes.io/hostname": name}}})
    try:
        yield name
    finally:
        real_kube.delete(f"/api/v1/nodes/{name}")


@pytest.fixture
async def real_api(real_kube: KubeEnv, real_namespace: str) -> AsyncIterator[KubeAPI]:
    api = await KubeAPI.from_kubeconfig(str(real_kube.kubeconfig))
    try:
        await api.request("POST", f"/api/v1/namespaces/{real_namespace}/serviceaccounts",
                          body={"apiVersion": "v1", "kind": "ServiceAccount",
                                "metadata": {"name": "default"}})
    except ApiError as exc:
        if exc.status != 409:
            raise
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def lying_image(registry: Registry, pusher: Any) -> str:
    """``repo@digest`` of an index whose arm64 entry holds an amd64 /bin/busybox."""
    p: Pusher = pusher(registry)
    bb = layer([file("bin/busybox", elf("amd64")), symlink("bin/sh", "busybox")])
    children = []
    for arch in ("amd64", "arm64"):
        img = p.image("xfe/lying", None, architecture=arch, fmt="oci", layers=[bb],
                      process={"Cmd": ["sh"]})
        children.append((img, {"os": "linux", "architecture": arch}))
    digest = p.index("xfe/lying", "v1", children).digest
    return f"{registry.host}/xfe/lying@{digest}"


def _pod(name: str, node: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {AFFINITY_LABEL: "set"}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": image}]}}


def _status(image: str, restarts: int, *, state: dict[str, Any] | None = None,
            last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"status": {"phase": "Running", "containerStatuses": [{
        "name": "app", "image": image, "imageID": image, "ready": False, "started": False,
        "restartCount": restarts,
        "state": state or {"waiting": {"reason": "CrashLoopBackOff",
                                       "message": "back-off 10s restarting failed container"}},
        "lastState": last or {}}]}}


def _terminated(reason: str, code: int, message: str, *,
                started: str = NOW) -> dict[str, Any]:
    return {"terminated": {"reason": reason, "exitCode": code, "message": message,
                           "startedAt": started, "finishedAt": NOW}}


SHAPES = {
    "containerd": {"last": _terminated("StartError", 128, CONTAINERD_START)},
    "runc": {"last": _terminated("Error", 255, RUNC + "\n")},
    "crun": {"last": _terminated("Error", 1, CRUN_JSON)},
    "crio": {"state": {"waiting": {"reason": "RunContainerError", "message": CRIO_START}}},
}


async def _write_status(api: KubeAPI, ns: str, name: str, body: dict[str, Any]) -> None:
    await api.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", body=body)


async def _ours(api: KubeAPI, ns: str, name: str) -> list[dict[str, Any]]:
    return [e for e in await events_for(api, ns, name) if e.get("reason") == EXEC_FORMAT_REASON]


async def test_exec_format_errors_of_each_runtime_on_an_arm64_node(
        real_api: KubeAPI, real_namespace: str, arm_node: str, lying_image: str,
        registry: Registry) -> None:
    ns = real_namespace
    digest = lying_image.split("@", 1)[1]
    insp = Inspector(registries=RegistriesConfig().with_insecure(registry.host), retries=0)
    ctl = Controller(real_api, ControllerOptions(leader_election=False, metrics_port=None,
                                                 workers=2, retry_base_delay=0.05),
                     inspector=insp)
    await ctl.start()
    try:
        await ctl.wait_synced(30)
        for shape in SHAPES:
            await real_api.request("POST", f"/api/v1/namespaces/{ns}/pods",
                                   body=_pod(shape, arm_node, lying_image))
        await real_api.request("POST", f"/api/v1/namespaces/{ns}/pods",
                               body=_pod("unrelated", arm_node, lying_image))
        for shape, kw in SHAPES.items():
            await _write_status(real_api, ns, shape, _status(lying_image, 1, **kw))
        # exit 1 after running for half a minute: no suspicion (it ran), nothing verified
        await _write_status(real_api, ns, "unrelated", _status(
            lying_image, 1, last=_terminated("Error", 1, "", started="2025-12-31T23:59:30Z")))

        for shape in SHAPES:
            events = await eventually(lambda s=shape: _ours(real_api, ns, s), within=20)
            assert len(events) == 1, events
            note = events[0].get("note") or events[0].get("message") or ""
            assert events[0]["type"] == "Warning"
            for part in ("container app", f"digest {digest}", f"imageID {lying_image}",
                         f"node {arm_node} of architecture arm64", "restart 1"):
                assert part in note, (shape, note)
            pod = await real_api.request("GET", f"/api/v1/namespaces/{ns}/pods/{shape}")
            assert pod["metadata"]["labels"][EXEC_FORMAT_LABEL] == "true"

        # verification ran once for the digest and reached the records
        async def verified() -> dict[str, Any] | None:
            pod = await real_api.request("GET", f"/api/v1/namespaces/{ns}/pods/runc")
            doc = json.loads(pod["metadata"]["annotations"].get(EXEC_FORMAT_ANNOTATION, "{}"))
            return (doc.get("verified") or {}).get(digest)

        entry = await eventually(verified, within=30)
        assert entry["status"] == "mismatch" and entry["mismatched"] == ["linux/arm64"]
        # the errors are evidence for their namespace, the verification for every one
        errors = ctl.findings.get(digest, "arm64", ns)
        assert errors is not None and errors.errors == len(SHAPES)
        evidence = ctl.findings.get(digest, "arm64")
        assert evidence is not None and evidence.verification is not None
        assert evidence.verification.status == "mismatch"
        assert ctl.findings.proven_wrong(digest, "arm64")
        amd = ctl.findings.get(digest, "amd64")
        assert amd is not None and amd.verification is not None
        assert amd.verification.status == "ok"

        metrics = ctl.metrics.render().decode()
        assert f'podplacement_exec_format_errors_total{{arch="arm64"}} {float(len(SHAPES))}' \
            in metrics
        assert 'podplacement_image_verifications_total{status="mismatch"} 1.0' in metrics

        # the same restart written again: no second Event; the next restart: one more
        await _write_status(real_api, ns, "runc", _status(
            lying_image, 1, last=_terminated("Error", 255, RUNC + "\nagain\n")))
        await asyncio.sleep(2.0)
        assert len(await _ours(real_api, ns, "runc")) == 1
        await _write_status(real_api, ns, "runc", _status(
            lying_image, 2, last=_terminated("Error", 255, RUNC + "\n")))
        events = await eventually(
            lambda: _ours_at_least(real_api, ns, "runc", 2), within=20)
        assert len(events) == 2

        # the unrelated failure: nothing
        pod = await real_api.request("GET", f"/api/v1/namespaces/{ns}/pods/unrelated")
        assert EXEC_FORMAT_LABEL not in (pod["metadata"].get("labels") or {})
        assert await _ours(real_api, ns, "unrelated") == []
    finally:
        await ctl.stop()
        await insp.aclose()


async def _ours_at_least(api: KubeAPI, ns: str, name: str, n: int) -> list[dict[str, Any]]:
    events = await _ours(api, ns, name)
    return events if len(events) >= n else []


async def test_switched_off_the_monitor_writes_nothing(
        real_kube: KubeEnv, real_api: KubeAPI, real_namespace: str, arm_node: str,
        lying_image: str) -> None:
    ns = real_namespace
    real_kube.apply_crds()
    config = {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
              "metadata": {"name": "cluster"},
              "spec": {"plugins": {"execFormatErrorMonitor": {"enabled": False}}}}
    real_kube.create("/apis/podplacement.io/v1beta1/podplacementconfigs", config)
    ctl = Controller(real_api, ControllerOptions(leader_election=False, metrics_port=None,
                                                 workers=2))
    try:
        await ctl.start()
        await ctl.wait_synced(30)
        await eventually(lambda: _off(ctl), within=10)
        await real_api.request("POST", f"/api/v1/namespaces/{ns}/pods",
                               body=_pod("off", arm_node, lying_image))
        await _write_status(real_api, ns, "off", _status(lying_image, 1, **SHAPES["runc"]))
        await asyncio.sleep(3.0)
        pod = await real_api.request("GET", f"/api/v1/namespaces/{ns}/pods/off")
        assert EXEC_FORMAT_LABEL not in (pod["metadata"].get("labels") or {})
        assert await _ours(real_api, ns, "off") == []
    finally:
        await ctl.stop()
        real_kube.delete("/apis/podplacement.io/v1beta1/podplacementconfigs/cluster")


async def _off(ctl: Controller) -> bool:
    return not ctl.config_source()[0].exec_format_monitor
