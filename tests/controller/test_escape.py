"""The pure rules of escaped pods (rules/monitor/escape.py): which bound pods without a
placement record are checked, the verdict against the node's (os, arch) pair, which of them
the repair deletes, one round of deletions per owner per minute (fake clock), the Event and
the record; and the shared scope rules (rules/scope.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, Platform, RegistryError
from podplacement.rules.config import (
    AFFINITY_LABEL,
    DECISION_ANNOTATION,
    ESCAPE_ANNOTATION,
    ESCAPE_CONDITION,
    ESCAPE_LABEL,
    ESCAPE_REASON,
    EXCLUDE_NAMESPACE_LABEL,
    GATE_LABEL,
    SCHEDULING_GATE,
    ExcludedPlatform,
)
from podplacement.rules.monitor.escape import (
    FIT,
    UNFIT,
    UNKNOWN,
    RepairRounds,
    Verdict,
    classify,
    condition_patch,
    created_with_node_name,
    event_spec,
    record_patch,
    repair_owner,
    skip_reason,
    watch_params,
)
from podplacement.rules.scope import (
    is_mirror_pod,
    namespace_opted_out,
    pod_skip_reason,
)

NS = "podplacement-system"
CONFIG_CREATED = 1_800_000_000.0  # 2027-01-15T08:00:00Z
IMAGE = "reg.example/app:1"
DIGEST = "sha256:" + "a" * 64
RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d4f", "uid": "rs-1",
      "controller": True, "blockOwnerDeletion": True}


#: A decision for a ppc64le-only image and the node affinity it wrote.
PPC64LE_RECORD = ('{"images":[{"image":"reg.example/app:1","platforms":["linux/ppc64le"]}],'
                  '"platforms":["linux/ppc64le"],"oses":["linux"],"archs":["ppc64le"],'
                  '"result":"set","reason":"required architectures ppc64le"}')
PPC64LE_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["ppc64le"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}


#: The escape condition of a recorded pod.
RECORDED = {"type": ESCAPE_CONDITION, "status": "True", "reason": "Fit"}


def escaped(**changes: Any) -> dict[str, Any]:
    """A pod of a ReplicaSet, created after the config, bound, without any record."""
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-5d4f-x", "namespace": "team-a", "uid": "pod-1",
                     "resourceVersion": "42", "creationTimestamp": "2027-01-15T08:00:05Z",
                     "labels": {"app": "web"}, "ownerReferences": [dict(RS)]},
        "spec": {"nodeName": "node-ppc64le", "containers": [{"name": "c", "image": IMAGE}]},
        "status": {"phase": "Pending"},
    }
    for path, value in changes.items():
        target = pod
        *parents, last = path.split("__")
        for p in parents:
            target = target.setdefault(p, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return pod


def node(name: str, arch: str | None, os: str | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if arch is not None:
        labels["kubernetes.io/arch"] = arch
    if os is not None:
        labels["kubernetes.io/os"] = os
    return {"metadata": {"name": name, "labels": labels}}


def image(*platforms: str, digest: str = DIGEST) -> ImageInfo:
    return ImageInfo(IMAGE, digest, "application/vnd.oci.image.index.v1+json",
                     tuple(Platform(*p.split("/")) for p in platforms))


def skip(pod: dict[str, Any], config_created: float | None = CONFIG_CREATED) -> str | None:
    return skip_reason(pod, own_namespace=NS, config_created=config_created)


# --- which pods ----------------------------------------------------------------------------


def test_the_watch_selects_bound_unrecorded_pods_outside_the_system_namespaces() -> None:
    params = watch_params(NS)
    # the recorded escapes are judged by rules.monitor.escape.recorded, not by their label
    assert params["labelSelector"] == f"!{AFFINITY_LABEL}"
    fields = params["fieldSelector"].split(",")
    assert fields[0] == "spec.nodeName!="
    assert {"status.phase!=Succeeded", "status.phase!=Failed",
            "metadata.namespace!=kube-system", "metadata.namespace!=kube-public",
            "metadata.namespace!=kube-node-lease", f"metadata.namespace!={NS}"} <= set(fields)


def test_a_bound_pod_without_a_placement_record_is_an_escape() -> None:
    assert skip(escaped()) is None


@pytest.mark.parametrize(("changes", "reason"), [
    ({"metadata__deletionTimestamp": "2027-01-15T08:01:00Z"}, "deleting"),
    ({"spec__nodeName": None}, "not_bound"),
    ({"metadata__labels": {AFFINITY_LABEL: "set"},
      "metadata__annotations": {DECISION_ANNOTATION: PPC64LE_RECORD},
      "spec__affinity": PPC64LE_AFFINITY}, "placed"),
    ({"metadata__labels": {ESCAPE_LABEL: "fit"}, "status__conditions": [RECORDED]},
     "recorded"),
    ({"spec__schedulingGates": [{"name": SCHEDULING_GATE}],
      "metadata__labels": {GATE_LABEL: "gated"}}, "gated"),
    ({"status__phase": "Succeeded"}, "ended"),
    ({"status__phase": "Failed"}, "ended"),
    ({"metadata__namespace": "kube-system"}, "system_namespace"),
    ({"metadata__namespace": NS}, "own_namespace"),
    ({"metadata__ownerReferences": [{"kind": "DaemonSet", "name": "ds", "uid": "d",
                                     "controller": True}]}, "daemonset"),
    ({"metadata__annotations": {"kubernetes.io/config.mirror": "abc"}}, "mirror_pod"),
    ({"metadata__ownerReferences": [{"kind": "Node", "name": "n", "uid": "n",
                                     "controller": True}]}, "mirror_pod"),
    ({"metadata__creationTimestamp": "2027-01-15T07:59:59Z"}, "predates_config"),
    ({"metadata__creationTimestamp": "yesterday"}, "predates_config"),
])
def test_pods_the_product_does_not_place_or_already_recorded_are_left_alone(
        changes: dict[str, Any], reason: str) -> None:
    assert skip(escaped(**changes)) == reason


@pytest.mark.parametrize("value", ["set", "not-set"])
def test_the_placement_label_alone_hides_nothing(value: str) -> None:
    """A label the pod's creator wrote, without the node affinity a placement writes: checked
    like a pod without it (tests/controller/test_escape_records.py has the rule)."""
    assert skip(escaped(metadata__labels={AFFINITY_LABEL: value})) is None
    assert skip(escaped(metadata__labels={AFFINITY_LABEL: value},
                        metadata__annotations={DECISION_ANNOTATION: PPC64LE_RECORD})) is None


def test_nothing_is_an_escape_without_a_config() -> None:
    assert skip(escaped(), config_created=None) == "no_config"


def test_a_pod_created_in_the_second_the_config_was_created_is_checked() -> None:
    assert skip(escaped(metadata__creationTimestamp="2027-01-15T08:00:00Z")) is None


def test_the_webhook_and_the_escape_monitor_share_the_scope_rules() -> None:
    from podplacement.rules.config import PlacementConfig
    from podplacement.webhook.gating import should_gate

    ds = escaped(metadata__ownerReferences=[{"kind": "DaemonSet", "name": "d", "uid": "d",
                                             "controller": True}], spec__nodeName=None)
    assert should_gate(ds, namespace="team-a", config=PlacementConfig(),
                       own_namespace=NS).reason == pod_skip_reason(ds, NS) == "daemonset"
    for ns, reason in (("kube-public", "system_namespace"), (NS, "own_namespace")):
        pod = escaped(metadata__namespace=ns, spec__nodeName=None)
        assert should_gate(pod, namespace=ns, config=PlacementConfig(),
                           own_namespace=NS).reason == pod_skip_reason(pod, NS) == reason


@pytest.mark.parametrize("odd", [
    {"metadata": "x", "spec": {"nodeName": "n"}},
    {"metadata": {"labels": ["a"], "ownerReferences": "rs", "annotations": 3,
                  "creationTimestamp": 7}, "spec": {"nodeName": "n"}, "status": "x"},
    {"metadata": {"ownerReferences": [None, 1, "x"]}, "spec": {"nodeName": "n"}},
    {},
])
def test_odd_pods_never_raise(odd: dict[str, Any]) -> None:
    assert skip(odd) is not None
    assert created_with_node_name(odd) is False
    verdict = classify(odd, node("n", "amd64"), {})
    assert verdict.outcome == UNKNOWN
    assert repair_owner(odd, verdict, delete_unfit_pods=True) == (None, "")
    assert is_mirror_pod(odd) is False


def test_namespace_opt_out_by_label_or_by_the_configs_selector() -> None:
    assert namespace_opted_out({EXCLUDE_NAMESPACE_LABEL: ""}, None)
    assert not namespace_opted_out({"team": "a"}, None)
    assert namespace_opted_out({"team": "a"}, {"matchLabels": {"team": "a"}})
    assert not namespace_opted_out({"team": "b"}, {"matchLabels": {"team": "a"}})
    # several requirements: applied exactly here (the webhook cannot negate them)
    both = {"matchLabels": {"team": "a"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["dev"]}]}
    assert namespace_opted_out({"team": "a", "tier": "dev"}, both)
    assert not namespace_opted_out({"team": "a", "tier": "prod"}, both)
    # empty, malformed: exclude nothing
    assert not namespace_opted_out({"team": "a"}, {})
    assert not namespace_opted_out({"team": "a"}, {"matchExpressions": [{"key": "team",
                                                                        "operator": "Like"}]})
    assert not namespace_opted_out({"team": "a"}, "team=a")


# Recorded from kube-apiserver v1.36.2: the scheduler's binding records no managed field;
# a pod created with spec.nodeName has f:nodeName in its creator's entry.
def _managed(with_node_name: bool) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {"f:containers": {'k:{"name":"c"}': {".": {}, "f:image": {}}},
                            "f:restartPolicy": {}, "f:schedulerName": {}}
    if with_node_name:
        spec["f:nodeName"] = {}
    return [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
             "time": "2027-01-15T08:00:05Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                          "f:spec": spec}}]


def test_a_pod_created_with_node_name_is_told_apart_by_its_managed_fields() -> None:
    assert not created_with_node_name(escaped(metadata__managedFields=_managed(False)))
    assert created_with_node_name(escaped(metadata__managedFields=_managed(True)))
    assert not created_with_node_name(escaped())


# --- the verdict ---------------------------------------------------------------------------


def test_fit_unfit_and_os_matters() -> None:
    images = {IMAGE: image("linux/amd64", "linux/arm64")}
    fit = classify(escaped(spec__nodeName="node-amd64-a"), node("node-amd64-a", "amd64",
                                                                  "linux"), images)
    assert (fit.outcome, fit.node_platform, fit.platforms) == (
        FIT, "linux/amd64", ("linux/amd64", "linux/arm64"))
    unfit = classify(escaped(), node("node-ppc64le", "ppc64le"), images)
    assert (unfit.outcome, unfit.node, unfit.node_platform) == (
        UNFIT, "node-ppc64le", "linux/ppc64le")
    assert "support only linux/amd64, linux/arm64" in unfit.reason
    windows = classify(escaped(spec__nodeName="node-windows"),
                       node("node-windows", "amd64", "windows"), images)
    assert (windows.outcome, windows.node_platform) == (UNFIT, "windows/amd64")


def test_every_image_counts_init_containers_too() -> None:
    pod = escaped(spec__nodeName="node-arm64",
                  spec__initContainers=[{"name": "i", "image": "reg.example/init:1"}])
    images = {IMAGE: image("linux/amd64", "linux/arm64"),
              "reg.example/init:1": image("linux/amd64", digest="sha256:" + "b" * 64)}
    verdict = classify(pod, node("node-arm64", "arm64"), images)
    assert verdict.outcome == UNFIT and verdict.platforms == ("linux/amd64",)
    nothing = {IMAGE: image("linux/arm64"), "reg.example/init:1": image("linux/amd64")}
    assert "no platform is supported" in classify(pod, node("node-arm64", "arm64"),
                                                  nothing).reason


def test_unknown_when_the_node_or_an_image_cannot_be_read() -> None:
    images = {IMAGE: image("linux/amd64")}
    assert classify(escaped(), None, images).outcome == UNKNOWN
    no_arch = classify(escaped(), node("node-ppc64le", None), images)
    assert no_arch.outcome == UNKNOWN and "kubernetes.io/arch" in no_arch.reason
    failed = classify(escaped(), node("node-ppc64le", "ppc64le"),
                      {IMAGE: RegistryError("registry down")})
    assert failed.outcome == UNKNOWN and "registry down" in failed.reason
    assert classify(escaped(), node("node-ppc64le", "ppc64le"), {}).outcome == UNKNOWN


def test_an_exec_format_exclusion_makes_a_listed_platform_unfit() -> None:
    x = ExcludedPlatform((DIGEST,), "linux", "arm64", "verification", 0, 1.0, 9e9, IMAGE, "")
    images = {IMAGE: image("linux/amd64", "linux/arm64")}
    pod = escaped(spec__nodeName="node-arm64")
    assert classify(pod, node("node-arm64", "arm64"), images).outcome == FIT
    verdict = classify(pod, node("node-arm64", "arm64"), images, [x])
    assert verdict.outcome == UNFIT and "excluded" in verdict.reason
    assert verdict.platforms == ("linux/amd64",)


# --- the repair ----------------------------------------------------------------------------

UNFIT_VERDICT = Verdict(UNFIT, "node-ppc64le", "linux/ppc64le", ("linux/amd64",), "r")


@pytest.mark.parametrize("kind", ["ReplicaSet", "StatefulSet", "Job"])
def test_an_unfit_pod_of_a_recreating_owner_is_deleted(kind: str) -> None:
    pod = escaped(metadata__ownerReferences=[{**RS, "kind": kind}])
    assert repair_owner(pod, UNFIT_VERDICT, delete_unfit_pods=True) == (
        (kind, "web-5d4f", "rs-1"), "")


def test_the_repair_leaves_fit_unknown_bare_and_node_name_pods_and_obeys_its_switch() -> None:
    pod = escaped()
    for outcome in (FIT, UNKNOWN):
        verdict = Verdict(outcome, "n", "linux/amd64", (), "r")
        assert repair_owner(pod, verdict, delete_unfit_pods=True) == (None, "")
    off = repair_owner(pod, UNFIT_VERDICT, delete_unfit_pods=False)
    assert off[0] is None and "deleteUnfitPods" in off[1]
    bare = repair_owner(escaped(metadata__ownerReferences=None), UNFIT_VERDICT,
                        delete_unfit_pods=True)
    assert bare[0] is None and "ReplicaSet, StatefulSet or Job" in bare[1]
    deployment_like = escaped(metadata__ownerReferences=[{**RS, "kind": "CronJob"}])
    assert repair_owner(deployment_like, UNFIT_VERDICT, delete_unfit_pods=True)[0] is None
    pinned = escaped(metadata__managedFields=_managed(True))
    kept = repair_owner(pinned, UNFIT_VERDICT, delete_unfit_pods=True)
    assert kept[0] is None and "spec.nodeName" in kept[1]


def test_one_round_of_deletions_per_owner_per_minute() -> None:
    t0 = 1_800_000_100.0
    rounds = RepairRounds(period=60.0)
    # the round starts with the first deletion; the owner's pods that existed then go too
    assert rounds.admit("rs-1", t0 - 30, t0) == 0.0
    assert rounds.admit("rs-1", t0 - 5, t0 + 2) == 0.0
    assert rounds.admit("rs-1", t0 - 1, t0 + 3) == 0.0
    # created in the second the round started, or after: maybe a replacement; next round
    assert rounds.admit("rs-1", t0 - 0.5, t0 + 3) == pytest.approx(57.0)
    assert rounds.admit("rs-1", t0 + 4, t0 + 10) == pytest.approx(50.0)
    assert rounds.admit("rs-1", None, t0 + 10) == pytest.approx(50.0)
    # other owners are not held back
    assert rounds.admit("rs-2", t0 + 4, t0 + 10) == 0.0
    # a minute after the round started, a new one
    assert rounds.admit("rs-1", t0 + 4, t0 + 60) == 0.0
    assert rounds.admit("rs-1", t0 + 59, t0 + 61) == 0.0  # existed when it started
    assert rounds.admit("rs-1", t0 + 60, t0 + 61) == pytest.approx(59.0)
    rounds.expire(t0 + 119)
    assert set(rounds.rounds) == {"rs-1"}
    rounds.expire(t0 + 120)
    assert rounds.rounds == {}


def test_the_rounds_remember_a_bounded_number_of_owners() -> None:
    rounds = RepairRounds(period=60.0, max_owners=3)
    for i in range(10):
        assert rounds.admit(f"o-{i}", 0.0, 100.0 + i) == 0.0
    assert list(rounds.rounds) == ["o-7", "o-8", "o-9"]


# --- what is written and said ----------------------------------------------------------------


def test_the_event_is_normal_only_for_a_pod_that_can_run_where_it_is() -> None:
    fit = Verdict(FIT, "node-amd64-a", "linux/amd64", ("linux/amd64",), "it can run there")
    spec = event_spec(fit)
    assert (spec.type, spec.reason, spec.action) == ("Normal", ESCAPE_REASON, "Detect")
    assert "node-amd64-a (linux/amd64)" in spec.message
    kept = event_spec(UNFIT_VERDICT, not_repaired="no ReplicaSet, StatefulSet or Job")
    assert (kept.type, kept.action) == ("Warning", "Detect")
    assert kept.message.endswith("not deleted: no ReplicaSet, StatefulSet or Job")
    deleted = event_spec(UNFIT_VERDICT, deleted_for=("ReplicaSet", "web-5d4f", "rs-1"))
    assert (deleted.type, deleted.action) == ("Warning", "Delete")
    assert "its ReplicaSet web-5d4f creates a new pod" in deleted.message
    unknown = event_spec(Verdict(UNKNOWN, "n", "", (), "node n was not found"))
    assert unknown.type == "Warning"
    long = event_spec(Verdict(UNFIT, "n", "linux/s390x", (), "x" * 3000))
    assert len(long.message) <= 1000


def test_the_record_is_a_guarded_label_and_annotation() -> None:
    pod = escaped()
    patch = record_patch(pod, UNFIT_VERDICT, now=1_800_000_123.7, not_repaired="why")
    meta = patch["metadata"]
    assert meta["resourceVersion"] == "42"
    assert meta["labels"] == {ESCAPE_LABEL: UNFIT}
    record = json.loads(meta["annotations"][ESCAPE_ANNOTATION])
    assert record == {"node": "node-ppc64le", "nodePlatform": "linux/ppc64le",
                      "platforms": ["linux/amd64"], "result": "unfit", "reason": "r",
                      "notDeleted": "why", "at": 1_800_000_123}
    # the record takes the pod out of the check once its condition is written too
    recorded = copy.deepcopy(pod)
    recorded["metadata"]["labels"].update(meta["labels"])
    assert skip(recorded) is None
    status = condition_patch(UNFIT_VERDICT, now=1_800_000_123.7)["status"]
    assert status == {"conditions": [{
        "type": ESCAPE_CONDITION, "status": "True", "reason": "Unfit",
        "message": event_spec(UNFIT_VERDICT).message, "lastTransitionTime":
            "2027-01-15T08:02:03Z"}]}
    recorded["status"].update(status)
    assert skip(recorded) == "recorded"


@pytest.mark.parametrize("labels", [{ESCAPE_LABEL: "fit"}, {ESCAPE_LABEL: "fit",
                                                            AFFINITY_LABEL: "set"}])
def test_an_escape_record_its_creator_wrote_hides_nothing(labels: dict[str, str]) -> None:
    """The label and annotation ``podplacement.io/placement-escaped`` without the condition
    only the ``pods/status`` subresource can write: checked like any escape."""
    record = json.dumps({"node": "node-ppc64le", "result": "fit", "at": 1})
    pod = escaped(metadata__labels=labels,
                  metadata__annotations={ESCAPE_ANNOTATION: record})
    assert skip(pod) is None
    for condition in ({**RECORDED, "status": "False"}, {**RECORDED, "type": "Ready"}, "x"):
        assert skip(escaped(metadata__labels=labels, status__conditions=[condition])) is None
    # the label removed (the runbook's way to ask for a new check): checked again
    assert skip(escaped(status__conditions=[RECORDED])) is None


# --- the switches and the requests ---------------------------------------------------------


def test_the_switches_default_on_and_refuse_non_booleans() -> None:
    from podplacement.rules.config import ConfigError, PlacementConfig

    default = PlacementConfig.from_object({"spec": {}})
    assert (default.escape_monitor, default.delete_unfit_pods) == (True, True)
    off = PlacementConfig.from_object({"spec": {"plugins": {"placementEscapes": {
        "deleteUnfitPods": False}}}})
    assert (off.escape_monitor, off.delete_unfit_pods) == (True, False)
    with pytest.raises(ConfigError, match=r"placementEscapes\.enabled"):
        PlacementConfig.from_object({"spec": {"plugins": {"placementEscapes": {
            "enabled": "yes"}}}})
    with pytest.raises(ConfigError, match="placementEscapes"):
        PlacementConfig.from_object({"spec": {"plugins": {"placementEscapes": ["on"]}}})


def test_the_monitor_and_the_deleter_need_no_request_beyond_the_controllers_table() -> None:
    from podplacement.controller.app import API_REQUESTS
    from podplacement.controller.escapemonitor import API_REQUESTS as MONITOR
    from podplacement.controller.poddelete import API_REQUESTS as DELETER

    assert set(MONITOR) | set(DELETER) <= set(API_REQUESTS)


def test_an_image_volume_the_node_cannot_pull_makes_the_pod_unfit() -> None:
    """KEP-4639: an escaped pod on amd64 whose container image runs there but whose image
    volume is arm64-only is unfit (the kubelet pulls the volume for the node's platform)."""
    pod = escaped(spec__nodeName="node-amd64")
    pod["spec"]["volumes"] = [{"name": "models", "image": {"reference": "reg.example/m:1"}}]
    images = {IMAGE: image("linux/amd64", "linux/arm64"),
              "reg.example/m:1": image("linux/arm64", digest="sha256:" + "b" * 64)}
    verdict = classify(pod, node("node-amd64", "amd64"), images)
    assert verdict.outcome == UNFIT and verdict.platforms == ("linux/arm64",), verdict
    # the volume's image not inspected: no verdict from the container's alone
    assert classify(pod, node("node-amd64", "amd64"), {IMAGE: images[IMAGE]}).outcome == UNKNOWN
