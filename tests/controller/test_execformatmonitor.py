"""The exec-format-error monitor's I/O around the pure rules, with a recording API double and
a verification double: verify on suspicion, the exclusions published in the config's status,
taken back after a restart, and ``deleteFailedPods`` (once per owner, never a bare pod)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from podplacement.controller.execformatmonitor import (
    CONFIG_STATUS_PATH,
    REMEDY_GRACE_SECONDS,
    ExecFormatMonitor,
)
from podplacement.controller.metrics import Metrics
from podplacement.imageinspect import PlatformReport, VerifyReport
from podplacement.kubeclient import NotFound
from podplacement.rules.config import (
    EXEC_FORMAT_ANNOTATION,
    EXEC_FORMAT_LABEL,
    ImageInspectionConfig,
    PlacementConfig,
    excluded_from_status,
)
from podplacement.rules.findings import FindingsStore
from podplacement.rules.place.decision import EventSpec

INDEX = "sha256:" + "1" * 64
AMD_MANIFEST = "sha256:" + "4" * 64
ARM_MANIFEST = "sha256:" + "2" * 64
IMAGE = "reg.example/team/app:v1"
T0 = 1_800_000_000.0


class Api:
    """Pods by (namespace, name), the config object, and every request."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.config: dict[str, Any] = {"metadata": {"name": "cluster"}, "spec": {}}
        self.calls: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.calls.append((method, path, copy.deepcopy(body)))
        if path == CONFIG_STATUS_PATH:
            self.config.setdefault("status", {}).update(body["status"])
            return self.config
        parts = path.split("/")
        key = (parts[4], parts[6])
        if key not in self.pods:
            raise NotFound(404, "NotFound", path)
        pod = self.pods[key]
        if method == "GET":
            return copy.deepcopy(pod)
        if method == "PATCH":
            meta = pod["metadata"]
            assert body["metadata"]["resourceVersion"] == meta["resourceVersion"]
            meta.setdefault("labels", {}).update(body["metadata"]["labels"])
            meta.setdefault("annotations", {}).update(body["metadata"]["annotations"])
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            return copy.deepcopy(pod)
        if method == "DELETE":
            assert body["preconditions"]["uid"] == pod["metadata"]["uid"]
            del self.pods[key]
            return {}
        raise AssertionError(method)

    def requests(self, method: str, fragment: str = "") -> list[Any]:
        return [b for m, p, b in self.calls if m == method and fragment in p]


class Nodes:
    def get(self, name: str) -> dict[str, Any] | None:
        arch = {"arm-1": "arm64", "amd-1": "amd64"}.get(name)
        return None if arch is None else {"metadata": {"name": name, "labels": {
            "kubernetes.io/arch": arch, "kubernetes.io/os": "linux"}}}


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, EventSpec]] = []

    def emit(self, pod: dict[str, Any], spec: EventSpec) -> None:
        self.sent.append((pod["metadata"]["name"], spec))


def _pod(name: str, *, owner: str | None = "rs-1", node: str = "arm-1",
         code: int = 255, ran: int = 0, message: str = "") -> dict[str, Any]:
    refs = ([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": owner,
              "controller": True}] if owner else [])
    finished = f"2026-01-01T00:00:{ran:02d}Z"
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "resourceVersion": "1", "ownerReferences": refs,
                         "labels": {"podplacement.io/node-affinity": "set"},
                         "annotations": {"podplacement.io/decision": json.dumps(
                             {"images": [{"image": IMAGE, "digest": INDEX}]})}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": IMAGE}]},
            "status": {"containerStatuses": [{
                "name": "app", "image": IMAGE, "imageID": f"reg.example/team/app@{INDEX}",
                "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {
                    "reason": "Error", "exitCode": code, "message": message,
                    "startedAt": "2026-01-01T00:00:00Z", "finishedAt": finished}}}]}}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def verified(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``imageinspect.verify_image`` answering: arm64 holds an x86-64 binary."""
    calls: list[str] = []

    async def verify_image(_inspector: Any, reference: str, _creds: Sequence[Any] = (), *,
                           platforms: Sequence[str] | None = None, **_: Any) -> VerifyReport:
        calls.append(f"{reference} {','.join(platforms or ['all'])}")
        reports = (PlatformReport("linux/amd64", AMD_MANIFEST, "ok", "fine"),
                   PlatformReport("linux/arm64", ARM_MANIFEST, "mismatch",
                                  "/bin/busybox is an ELF file for x86-64"))
        return VerifyReport(reference, INDEX, "application/vnd.oci.image.index.v1+json",
                            1 << 20, tuple(r for r in reports
                                           if platforms is None or r.platform in platforms))

    from podplacement import imageinspect

    monkeypatch.setattr(imageinspect, "verify_image", verify_image)
    return calls


def _monitor(api: Api, config: PlacementConfig, clock: Clock,
             store: FindingsStore | None = None) -> tuple[ExecFormatMonitor, Events,
                                                          list[Any]]:
    events = Events()
    removed: list[Any] = []

    async def credentials(_pod: Any, _config: Any) -> list[Any]:
        return []

    async def on_excluded(excluded: Any) -> None:
        removed.append(excluded)

    monitor = ExecFormatMonitor(
        api, nodes=Nodes(), events=events, metrics=Metrics(),  # type: ignore[arg-type]
        config_source=lambda: (config, None), inspector=lambda: None,
        credentials=credentials, store=store, config_object=lambda: api.config,
        on_excluded=on_excluded, clock=clock)
    return monitor, events, removed


async def _settle(monitor: ExecFormatMonitor) -> None:
    while monitor._tasks:
        await asyncio.gather(*list(monitor._tasks))


CONFIG = PlacementConfig(image_inspection=ImageInspectionConfig(cache_ttl_seconds=3600.0))


async def test_a_runc_shaped_exit_is_verified_once_and_proven(verified: list[str]) -> None:
    api, clock = Api(), Clock()
    for name in ("a", "b"):
        api.pods[("team", name)] = _pod(name)
    monitor, events, removed = _monitor(api, CONFIG, clock)
    for name in ("a", "b"):
        await monitor.reconcile(f"team/{name}/uid-{name}")
    assert api.requests("PATCH", "/pods/") == []  # a suspicion alone writes nothing
    await _settle(monitor)
    # once for the digest, for the nodes' platform only
    assert verified == [f"reg.example/team/app@{INDEX} linux/arm64"]
    for name in ("a", "b"):
        await monitor.reconcile(f"team/{name}/uid-{name}")
    pod = api.pods[("team", "a")]
    assert pod["metadata"]["labels"][EXEC_FORMAT_LABEL] == "true"
    record = json.loads(pod["metadata"]["annotations"][EXEC_FORMAT_ANNOTATION])
    assert record["containers"]["app"]["proof"] == "verification"
    assert [s.reason for _, s in events.sent] == ["ExecFormatError"] * 2
    assert "proven by verification" in events.sent[0][1].message
    assert 'podplacement_exec_format_errors_total{arch="arm64"} 2.0' in \
        monitor.metrics.render().decode()
    # learned: the pair, under every digest of its content
    await monitor.learn()
    (x,) = monitor.current
    assert x.platform == "linux/arm64" and x.proof == "verification"
    assert set(x.digests) == {INDEX, ARM_MANIFEST}
    assert x.image == IMAGE and x.expires == T0 + 3600
    (status,) = api.requests("PATCH", CONFIG_STATUS_PATH)
    assert excluded_from_status(api.config)[0].digests == x.digests
    assert removed == [monitor.current]
    # nothing changed: no second status write
    await monitor.learn()
    assert len(api.requests("PATCH", CONFIG_STATUS_PATH)) == 1
    # the TTL passes without a new error: the exclusion goes, and the status says so
    clock.now = T0 + 3600
    await monitor.learn()
    assert monitor.current == () and excluded_from_status(api.config) == ()
    assert status is not None


async def test_an_honest_image_and_an_unrelated_crash_leave_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def honest(_inspector: Any, reference: str, *_: Any, **__: Any) -> VerifyReport:
        return VerifyReport(reference, INDEX, "x", 1, (
            PlatformReport("linux/amd64", AMD_MANIFEST, "ok", "fine"),
            PlatformReport("linux/arm64", ARM_MANIFEST, "ok", "fine")))

    from podplacement import imageinspect

    monkeypatch.setattr(imageinspect, "verify_image", honest)
    api, clock = Api(), Clock()
    api.pods[("team", "crash")] = _pod("crash")
    api.pods[("team", "slow")] = _pod("slow", code=1, ran=40)
    monitor, events, _ = _monitor(api, CONFIG, clock)
    for name in ("crash", "slow"):
        await monitor.reconcile(f"team/{name}/uid-{name}")
    await _settle(monitor)
    # only the suspicion was verified, and for the node's platform only
    assert list(monitor.reports) == [(INDEX, "linux/arm64")]
    for name in ("crash", "slow"):
        await monitor.reconcile(f"team/{name}/uid-{name}")
    await monitor.learn()
    assert events.sent == [] and monitor.current == ()
    assert api.requests("PATCH", "/pods/") == []
    assert excluded_from_status(api.config) == ()


async def test_delete_failed_pods_deletes_one_pod_per_owner_never_a_bare_one(
        verified: list[str]) -> None:
    api, clock = Api(), Clock()
    api.pods[("team", "a")] = _pod("a")
    api.pods[("team", "b")] = _pod("b")
    api.pods[("team", "bare")] = _pod("bare", owner=None)
    config = replace(CONFIG, delete_failed_pods=True)
    monitor, events, _ = _monitor(api, config, clock)
    for name in ("a", "b", "bare"):
        await monitor.reconcile(f"team/{name}/uid-{name}")
    await _settle(monitor)
    # proven, but not published yet: the remedy waits (and asks to run again)
    assert await monitor.reconcile("team/a/uid-a") == REMEDY_GRACE_SECONDS
    await monitor.learn()  # status written, catalog told
    assert await monitor.reconcile("team/a/uid-a") == REMEDY_GRACE_SECONDS  # the grace
    assert [m for m, _, _ in api.calls if m == "DELETE"] == []
    clock.now += REMEDY_GRACE_SECONDS
    for name in ("a", "b", "bare"):
        await monitor.reconcile(f"team/{name}/uid-{name}")
    deleted = [p for m, p, _ in api.calls if m == "DELETE"]
    assert deleted == ["/api/v1/namespaces/team/pods/a"]
    assert set(k[1] for k in api.pods) == {"b", "bare"}
    assert [s.action for n, s in events.sent if n == "a"] == ["Detect", "Delete"]
    assert "its ReplicaSet web-1 creates a new pod" in events.sent[1][1].message
    assert 'podplacement_exec_format_pods_deleted_total{owner_kind="ReplicaSet"} 1.0' in \
        monitor.metrics.render().decode()
    await monitor.learn()
    (gone,) = api.config["status"]["execFormatErrorMonitor"]["deletedPods"]
    assert gone["owner"]["uid"] == "rs-1" and gone["pod"] == "a"
    # a restarted controller takes back the exclusion and the owner: still no second delete
    again, _, _ = _monitor(api, config, clock)
    await again.learn()
    assert [x.platform for x in again.current] == ["linux/arm64"]
    assert "rs-1" in again.deleted
    clock.now += REMEDY_GRACE_SECONDS
    await again.reconcile("team/b/uid-b")
    await _settle(again)
    assert await again.reconcile("team/b/uid-b") is None
    assert len([1 for m, _, _ in api.calls if m == "DELETE"]) == 1
    # without the switch: never
    off, _, _ = _monitor(api, CONFIG, clock)
    await off.learn()
    assert not off._remedy_due(api.pods[("team", "b")], "arm64", "linux")


async def test_restart_rebuilds_evidence_below_the_threshold_from_the_records(
        verified: list[str]) -> None:
    """One exec format error before the restart (in the pod's record), one after: proof."""
    api, clock = Api(), Clock()
    first = _pod("a", code=1, message="exec /bin/sh: exec format error")
    api.pods[("team", "a")] = first
    monitor, _, _ = _monitor(api, CONFIG, clock)
    monitor.reports[(INDEX, "")] = _skip_verification(clock.now)  # it proves nothing
    await monitor.reconcile("team/a/uid-a")
    restarted, _, _ = _monitor(api, CONFIG, clock)
    restarted.reports[(INDEX, "")] = _skip_verification(clock.now)
    restarted.on_pod("ADDED", copy.deepcopy(api.pods[("team", "a")]), None)
    assert restarted.store.get(INDEX, "arm64", "team").errors == 1  # type: ignore[union-attr]
    second = _pod("b", code=1, message="exec /bin/sh: exec format error")
    api.pods[("team", "b")] = second
    await restarted.reconcile("team/b/uid-b")
    await restarted.learn()
    (x,) = restarted.current
    assert (x.proof, x.errors, x.namespace) == ("exec-format-errors", 2, "team")


def _skip_verification(at: float) -> Any:
    from podplacement.controller.execformatmonitor import _PlatformResult, _Verified

    return _Verified(at, INDEX, {"linux/arm64": _PlatformResult("incomplete", "cap", "")})
