"""The escape monitor's I/O around the pure rules (controller/escapemonitor.py), with a
recording API double: what the watch queues, the repair (UID precondition, one round per
owner), the record and Event of the pods that stay, the namespace opt-out, inspection
retries and the switches. The real control plane runs it end to end in
tests/test_faults_realcluster.py."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from podplacement.controller.escapemonitor import EscapeMonitor, InspectLater
from podplacement.controller.metrics import Metrics
from podplacement.controller.reconciler import pod_key
from podplacement.imageinspect import ImageInfo, Platform, RegistryError
from podplacement.kubeclient import ApiError, NotFound
from podplacement.rules.config import (
    AFFINITY_LABEL,
    DECISION_ANNOTATION,
    ESCAPE_ANNOTATION,
    ESCAPE_LABEL,
    EXCLUDE_NAMESPACE_LABEL,
    ImageInspectionConfig,
    PlacementConfig,
)
from podplacement.rules.place.decision import EventSpec

IMAGE = "reg.example/app:1"
AMD64_ONLY = ImageInfo(IMAGE, "sha256:" + "a" * 64, "application/vnd.oci.image.manifest.v1+json",
                       (Platform("linux", "amd64"),))
T0 = 1_800_000_100.0  # 100 s after the config was created


class Api:
    """Pods by (namespace, name), Namespaces by name, and every request."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.namespaces: dict[str, dict[str, str]] = {"team": {}}
        self.calls: list[tuple[str, str, Any]] = []
        self.forbid_delete = False

    async def request(self, method: str, path: str, body: Any = None, **opts: Any) -> Any:
        self.calls.append((method, path, copy.deepcopy(body)))
        parts = path.split("/")
        if len(parts) == 5:  # /api/v1/namespaces/NAME
            if parts[4] not in self.namespaces:
                raise NotFound(404, "NotFound", path)
            return {"metadata": {"name": parts[4], "labels": self.namespaces[parts[4]]}}
        key = (parts[4], parts[6])
        if key not in self.pods:
            raise NotFound(404, "NotFound", path)
        pod = self.pods[key]
        if method == "GET":
            return copy.deepcopy(pod)
        if method == "PATCH" and path.endswith("/status"):
            assert opts["content_type"] == "application/strategic-merge-patch+json"
            conditions = pod.setdefault("status", {}).setdefault("conditions", [])
            for c in body["status"]["conditions"]:
                conditions[:] = [o for o in conditions if o["type"] != c["type"]] + [c]
            pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
            return copy.deepcopy(pod)
        if method == "PATCH":
            meta = pod["metadata"]
            assert body["metadata"]["resourceVersion"] == meta["resourceVersion"]
            meta.setdefault("labels", {}).update(body["metadata"]["labels"])
            meta.setdefault("annotations", {}).update(body["metadata"]["annotations"])
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            return copy.deepcopy(pod)
        if method == "DELETE":
            if self.forbid_delete:
                raise ApiError(403, "Forbidden", "pods is forbidden")
            assert body["preconditions"]["uid"] == pod["metadata"]["uid"]
            del self.pods[key]
            return {}
        raise AssertionError(method)

    def requests(self, method: str) -> list[tuple[str, Any]]:
        return [(p, b) for m, p, b in self.calls if m == method]


class Nodes:
    def get(self, name: str) -> dict[str, Any] | None:
        pair = {"amd-1": ("linux", "amd64"), "ppc-1": ("linux", "ppc64le"),
                "win-1": ("windows", "amd64")}.get(name)
        return None if pair is None else {"metadata": {"name": name, "labels": {
            "kubernetes.io/os": pair[0], "kubernetes.io/arch": pair[1]}}}


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, EventSpec]] = []

    def emit(self, pod: dict[str, Any], spec: EventSpec) -> None:
        self.sent.append((pod["metadata"]["name"], spec))


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _pod(name: str, node: str, *, owner: str | None = "rs-1", created: int = 50,
         ns: str = "team") -> dict[str, Any]:
    refs = ([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": owner,
              "controller": True}] if owner else [])
    stamp = f"2027-01-15T08:{created // 60:02d}:{created % 60:02d}Z"
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "resourceVersion": "1", "creationTimestamp": stamp,
                         "ownerReferences": refs, "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": IMAGE}]},
            "status": {"phase": "Pending"}}


#: The decision annotation and node affinity the controller writes for an amd64-only image.
AMD64_RECORD = ('{"images":[{"image":"reg.example/app:1","platforms":["linux/amd64"]}],'
                '"platforms":["linux/amd64"],"oses":["linux"],"archs":["amd64"],'
                '"result":"set","reason":"required architectures amd64"}')
AMD64_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}


def _placed(name: str, node: str, *, record: bool = True, affinity: bool = True,
            owner: str | None = "rs-1") -> dict[str, Any]:
    """A pod with the placement label, and (``record``, ``affinity``) the decision and the
    node affinity of an amd64 placement: the product's, or copied by the pod's creator."""
    pod = _pod(name, node, owner=owner)
    pod["metadata"]["labels"][AFFINITY_LABEL] = "set"
    if record:
        pod["metadata"]["annotations"] = {DECISION_ANNOTATION: AMD64_RECORD}
    if affinity:
        pod["spec"]["affinity"] = copy.deepcopy(AMD64_AFFINITY)
    return pod


class Setup:
    def __init__(self, config: PlacementConfig, images: dict[str, Any]) -> None:
        self.api = Api()
        self.events = Events()
        self.metrics = Metrics()
        self.clock = Clock()
        self.config = config
        self.images = images
        self.monitor = EscapeMonitor(
            self.api,  # type: ignore[arg-type]
            nodes=Nodes(),  # type: ignore[arg-type]
            events=self.events,  # type: ignore[arg-type]
            metrics=self.metrics, config_source=lambda: (self.config, None),
            config_object=lambda: {"metadata": {"name": "cluster",
                                                "creationTimestamp": "2027-01-15T08:00:00Z"}},
            credentials=self._credentials, inspect_images=self._inspect,
            own_namespace="podplacement-system", clock=self.clock)

    async def _credentials(self, pod: Any, config: Any) -> list[Any]:
        return []

    async def _inspect(self, pod: Any, creds: Any) -> dict[str, Any]:
        return dict(self.images)

    def add(self, pod: dict[str, Any]) -> str:
        self.api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        return pod_key(pod)

    def count(self, outcome: str) -> float:
        return self.metrics.registry.get_sample_value(
            "podplacement_escaped_pods_total", {"outcome": outcome}) or 0.0


@pytest.fixture
def setup() -> Setup:
    return Setup(PlacementConfig(), {IMAGE: AMD64_ONLY})


async def test_the_repair_deletes_the_unfit_pods_of_a_round_and_records_the_fit_ones(
        setup: Setup) -> None:
    keys = [setup.add(_pod("on-ppc", "ppc-1")), setup.add(_pod("on-win", "win-1")),
            setup.add(_pod("on-amd", "amd-1"))]
    for key in keys:
        assert await setup.monitor.reconcile(key) is None
    deleted = setup.api.requests("DELETE")
    assert [p.rsplit("/", 1)[1] for p, _ in deleted] == ["on-ppc", "on-win"]
    assert [b["preconditions"] for _, b in deleted] == [{"uid": "uid-on-ppc"},
                                                        {"uid": "uid-on-win"}]
    fit = setup.api.pods[("team", "on-amd")]["metadata"]
    assert fit["labels"][ESCAPE_LABEL] == "fit"
    assert json.loads(fit["annotations"][ESCAPE_ANNOTATION])["nodePlatform"] == "linux/amd64"
    assert [(n, s.type, s.action) for n, s in setup.events.sent] == [
        ("on-ppc", "Warning", "Delete"), ("on-win", "Warning", "Delete"),
        ("on-amd", "Normal", "Detect")]
    assert (setup.count("repaired"), setup.count("fit")) == (2, 1)
    # the ReplicaSet's new pod escapes again (the webhook still down): next round
    setup.clock.now = T0 + 10
    again = setup.add(_pod("again", "ppc-1", created=105))
    wait = await setup.monitor.reconcile(again)
    assert wait == pytest.approx(50.0)
    assert len(setup.api.requests("DELETE")) == 2 and len(setup.events.sent) == 3
    setup.clock.now = T0 + 60
    assert await setup.monitor.reconcile(again) is None
    assert len(setup.api.requests("DELETE")) == 3


async def test_unfit_pods_that_stay_say_why(setup: Setup) -> None:
    bare = setup.add(_pod("bare", "ppc-1", owner=None))
    assert await setup.monitor.reconcile(bare) is None
    setup.api.forbid_delete = True
    refused = setup.add(_pod("refused", "ppc-1", owner="rs-2"))
    assert await setup.monitor.reconcile(refused) is None
    for name, why in (("bare", "no ReplicaSet, StatefulSet or Job"),
                      ("refused", "the delete was refused")):
        meta = setup.api.pods[("team", name)]["metadata"]
        assert meta["labels"][ESCAPE_LABEL] == "unfit"
        assert why in json.loads(meta["annotations"][ESCAPE_ANNOTATION])["notDeleted"]
    assert [(s.type, s.action) for _, s in setup.events.sent] == [("Warning", "Detect")] * 2
    assert setup.count("unfit") == 2
    setup.config = replace(setup.config, delete_unfit_pods=False)
    setup.api.forbid_delete = False
    off = setup.add(_pod("off", "ppc-1", owner="rs-3"))
    assert await setup.monitor.reconcile(off) is None
    assert "deleteUnfitPods" in setup.events.sent[-1][1].message
    assert setup.api.requests("DELETE") == [("/api/v1/namespaces/team/pods/refused",
                                             {"apiVersion": "v1", "kind": "DeleteOptions",
                                              "preconditions": {"uid": "uid-refused"}})]


async def test_an_opted_out_namespace_is_left_alone(setup: Setup) -> None:
    setup.api.namespaces["quiet"] = {EXCLUDE_NAMESPACE_LABEL: "yes"}
    setup.api.namespaces["team-b"] = {"tier": "dev"}
    setup.config = replace(setup.config, namespace_selector={"matchLabels": {"tier": "dev"}})
    for ns in ("quiet", "team-b", "gone"):
        key = setup.add(_pod(f"p-{ns}", "ppc-1", ns=ns))
        assert await setup.monitor.reconcile(key) is None
    assert {m for m, _, _ in setup.api.calls} == {"GET"}
    assert setup.events.sent == []


async def test_an_image_not_inspected_is_retried_then_unknown(setup: Setup) -> None:
    setup.images = {IMAGE: RegistryError("registry down")}
    key = setup.add(_pod("p", "ppc-1"))
    with pytest.raises(InspectLater):
        await setup.monitor.reconcile(key)
    assert setup.api.requests("PATCH") == []
    setup.config = replace(setup.config,
                           image_inspection=ImageInspectionConfig(max_retries=0))
    assert await setup.monitor.reconcile(key) is None
    meta = setup.api.pods[("team", "p")]["metadata"]
    assert meta["labels"][ESCAPE_LABEL] == "unknown"
    assert "registry down" in json.loads(meta["annotations"][ESCAPE_ANNOTATION])["reason"]
    assert setup.api.requests("DELETE") == [] and setup.count("unknown") == 1


async def test_the_watch_queues_only_escapes_and_the_switch_stops_everything(
        setup: Setup) -> None:
    placed = _placed("placed", "amd-1")
    old = _pod("old", "ppc-1")
    old["metadata"]["creationTimestamp"] = "2027-01-15T07:59:55Z"
    escaped = _pod("escaped", "ppc-1")
    for pod in (placed, old, escaped):
        setup.monitor.on_pod("ADDED", pod, None)
    assert setup.monitor.queue.is_pending(pod_key(escaped))
    assert not setup.monitor.queue.is_pending(pod_key(placed))
    assert not setup.monitor.queue.is_pending(pod_key(old))
    setup.monitor.on_pod("DELETED", escaped, None)
    assert not setup.monitor.queue.is_pending(pod_key(escaped))
    setup.config = replace(setup.config, escape_monitor=False)
    assert not setup.monitor.enabled()
    key = setup.add(escaped)
    assert await setup.monitor.reconcile(key) is None
    assert setup.api.calls == []


@pytest.mark.parametrize(("record", "affinity", "node"), [
    (False, False, "win-1"),  # the label alone
    (True, False, "win-1"),  # and a decision copied from a placed pod
    (True, True, "win-1"),  # and its node affinity: the node named with spec.nodeName
    (False, False, "amd-1"),  # the label alone, on a node the image can run on
])
async def test_a_labelled_pod_whose_record_does_not_hold_is_an_escape(
        setup: Setup, record: bool, affinity: bool, node: str) -> None:
    """The placed pods' watch hands every labelled pod to :meth:`EscapeMonitor.on_pod`: one
    whose label its spec does not bear out is queued, checked, recorded and reported as an
    escape (same Event, record and metric), the doubt named; an honest one is left alone
    with no request."""
    honest = _placed("honest", "amd-1")
    forged = _placed("forged", node, record=record, affinity=affinity, owner=None)
    for pod in (honest, forged):
        setup.add(pod)
        setup.monitor.on_pod("ADDED", pod, None)
    assert not setup.monitor.queue.is_pending(pod_key(honest))
    assert setup.monitor.queue.is_pending(pod_key(forged))
    assert setup.api.calls == []
    assert await setup.monitor.reconcile(pod_key(forged)) is None
    outcome = "fit" if node == "amd-1" else "unfit"
    meta = setup.api.pods[("team", "forged")]["metadata"]
    assert meta["labels"][ESCAPE_LABEL] == outcome
    assert json.loads(meta["annotations"][ESCAPE_ANNOTATION])["labelDoubted"]
    [(name, spec)] = setup.events.sent
    assert (name, spec.reason) == ("forged", "PlacementEscaped")
    assert "does not bear out" in spec.message
    assert setup.count(outcome) == 1
    # recorded: no longer queued by its next watch event
    setup.monitor.queue.discard(pod_key(forged))
    setup.monitor.on_pod("MODIFIED", setup.api.pods[("team", "forged")], None)
    assert not setup.monitor.queue.is_pending(pod_key(forged))
    assert await setup.monitor.reconcile(pod_key(honest)) is None
    assert len(setup.events.sent) == 1


async def test_a_labelled_unfit_pod_of_an_owner_is_repaired_like_any_escape(
        setup: Setup) -> None:
    forged = _placed("forged", "ppc-1", record=False, affinity=False)
    key = setup.add(forged)
    assert await setup.monitor.reconcile(key) is None
    assert [p for p, _ in setup.api.requests("DELETE")] == ["/api/v1/namespaces/team/pods/forged"]
    [(_, spec)] = setup.events.sent
    assert (spec.type, spec.action) == ("Warning", "Delete") and setup.count("repaired") == 1


async def test_an_escape_record_written_by_the_pods_creator_is_checked_again(
        setup: Setup) -> None:
    """The label and annotation ``podplacement.io/placement-escaped`` preset by the pod's
    creator (``fit``, on a node its image can't run): not recorded without the condition
    only ``pods/status`` writes, so the pod is checked, recorded ``unfit`` with the
    condition, and reported once."""
    forged = _pod("forged", "ppc-1", owner=None)
    forged["metadata"]["labels"][ESCAPE_LABEL] = "fit"
    forged["metadata"]["annotations"] = {ESCAPE_ANNOTATION: '{"result":"fit"}'}
    key = setup.add(forged)
    setup.monitor.on_pod("ADDED", forged, None)
    assert setup.monitor.queue.is_pending(key)
    assert await setup.monitor.reconcile(key) is None
    pod = setup.api.pods[("team", "forged")]
    assert pod["metadata"]["labels"][ESCAPE_LABEL] == "unfit"
    assert [c["reason"] for c in pod["status"]["conditions"]] == ["Unfit"]
    assert [p for p, _ in setup.api.requests("PATCH")] == [
        "/api/v1/namespaces/team/pods/forged", "/api/v1/namespaces/team/pods/forged/status"]
    assert len(setup.events.sent) == 1 and setup.count("unfit") == 1
    setup.monitor.queue.discard(key)
    setup.monitor.on_pod("MODIFIED", pod, None)
    assert not setup.monitor.queue.is_pending(key)
    assert await setup.monitor.reconcile(key) is None and len(setup.events.sent) == 1
