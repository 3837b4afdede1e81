"""The exec-format-error rule (rules.monitor.execformat) with each runtime's exact words, the
pod's record, the Event, and the findings store (rules.findings): pure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podplacement.rules.config import (
    EXEC_FORMAT_ANNOTATION,
    EXEC_FORMAT_LABEL,
    EXEC_FORMAT_REASON,
    PlacementConfig,
)
from podplacement.rules.findings import FindingsStore, Verification
from podplacement.rules.monitor.execformat import (
    detect,
    event_spec,
    finding_of,
    needs_work,
    placement_digests,
    record_patch,
    recorded,
    unreported,
    updated_record,
    verification_entry,
)

DIGEST = "sha256:" + "ab" * 32
IMAGE_ID = f"registry.example/team/app@{DIGEST}"

# Each runtime's words, composed from its source (see rules/monitor/execformat.py).
RUNC = "exec /bin/sh: exec format error"  # runc internal/linux/linux.go Exec (os.PathError)
RUNC_1_0 = "standard_init_linux.go:228: exec user process caused: exec format error"
CRUN = "exec container process `/bin/sh`: Exec format error"  # crun container_init
CRUN_JSON = ('{"msg":"exec container process `/bin/sh`: Exec format error","level":"error",'
             '"time":"2026-01-01T00:00:00.000000000Z"}')
# containerd container_start.go: "failed to start containerd task %q: %w"
CONTAINERD_START = ('failed to start containerd task "0123abcd": OCI runtime start failed: '
                    f"{RUNC}: unknown")
CRIO_START = f"failed to start container 0123abcd: {CRUN}"  # CRI-O container_start.go


def status(name: str = "app", *, state: dict[str, Any] | None = None,
           last: dict[str, Any] | None = None, restarts: int = 1) -> dict[str, Any]:
    return {"name": name, "image": "registry.example/team/app:v1", "imageID": IMAGE_ID,
            "restartCount": restarts, "ready": False, "started": False,
            "state": state or {"waiting": {"reason": "CrashLoopBackOff",
                                           "message": "back-off 10s restarting failed container"}},
            "lastState": last or {}}


def terminated(reason: str, code: int, message: str) -> dict[str, Any]:
    return {"terminated": {"reason": reason, "exitCode": code, "message": message,
                           "startedAt": "2026-01-01T00:00:00Z",
                           "finishedAt": "2026-01-01T00:00:00Z"}}


CASES = {
    # containerd's StartError shape (exit 128), for a runtime that fails at start
    "containerd StartError": (status(last=terminated("StartError", 128, CONTAINERD_START)),
                              "lastState.terminated", "StartError", 128, "/bin/sh"),
    # containerd + runc 1.2+: init exits 255, the kubelet appends the log tail
    # (terminationMessagePolicy FallbackToLogsOnError)
    "containerd+runc log tail": (status(last=terminated("Error", 255, RUNC + "\n")),
                                 "lastState.terminated", "Error", 255, "/bin/sh"),
    # runc 1.1 exits 1 with the same words
    "runc 1.1 running": (status(state=terminated("Error", 1, RUNC)),
                         "state.terminated", "Error", 1, "/bin/sh"),
    "runc 1.0": (status(last=terminated("Error", 1, RUNC_1_0)),
                 "lastState.terminated", "Error", 1, None),
    # CRI-O + runc: the same log tail, CRI-O's reason "Error"
    "cri-o+runc": (status(last=terminated("Error", 255, RUNC)),
                   "lastState.terminated", "Error", 255, "/bin/sh"),
    # CRI-O + crun: exit 1, strerror's capital E, text or JSON log format
    "cri-o+crun text": (status(last=terminated("Error", 1, CRUN)),
                        "lastState.terminated", "Error", 1, "/bin/sh"),
    "cri-o+crun json": (status(last=terminated("Error", 1, CRUN_JSON)),
                        "lastState.terminated", "Error", 1, "/bin/sh"),
    # CRI-O, a start that fails: the kubelet's waiting reason RunContainerError
    "cri-o RunContainerError": (status(state={"waiting": {"reason": "RunContainerError",
                                                          "message": CRIO_START}}),
                                "state.waiting", "RunContainerError", None, "/bin/sh"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_runtime_shape_is_detected(case: str) -> None:
    item, field, reason, code, program = CASES[case]
    found = finding_of(item)
    assert found is not None
    assert (found.field, found.reason, found.exit_code, found.program) == (
        field, reason, code, program)
    assert found.digest == DIGEST and found.image_id == IMAGE_ID
    assert found.reference == IMAGE_ID


@pytest.mark.parametrize("item", [
    status(last=terminated("Error", 1, "")),
    status(last=terminated("Error", 255, "")),  # runc without FallbackToLogsOnError
    status(last=terminated("Error", 1, "panic: boom")),
    status(last=terminated("StartError", 128, 'failed to create containerd task: failed to '
                           'create shim task: OCI runtime create failed: runc create failed: '
                           'unable to start container process: exec: "nope": executable '
                           "file not found in $PATH: unknown")),
    status(last=terminated("OOMKilled", 137, "")),
    status(state={"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
])
def test_unrelated_failures_are_not_detected(item: dict[str, Any]) -> None:
    assert finding_of(item) is None


def pod(*, init: list[dict[str, Any]] | None = None, app: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "labels": labels or {"podplacement.io/node-affinity": "set"},
                         "annotations": annotations or {}},
            "spec": {"nodeName": "arm-1", "containers": [{"name": "app", "image": "x"}]},
            "status": {"initContainerStatuses": init or [], "containerStatuses": app or []}}


def test_init_and_app_containers_both_count_init_first() -> None:
    p = pod(init=[status("setup", last=terminated("Error", 255, RUNC))],
            app=[status("app", last=terminated("Error", 1, CRUN)), status("ok")])
    found = detect(p)
    assert [(f.container, f.init) for f in found] == [("setup", True), ("app", False)]


def test_one_event_per_container_and_restart() -> None:
    p = pod(app=[status(last=terminated("Error", 255, RUNC), restarts=2)])
    new = unreported(p)
    assert len(new) == 1
    record = updated_record(p, new, arch="arm64", node="arm-1", verification=lambda d: None)
    p["metadata"]["annotations"] = record_patch(p, record)["metadata"]["annotations"]
    p["metadata"]["labels"][EXEC_FORMAT_LABEL] = "true"
    assert unreported(p) == ()
    # reported, but its digest not verified yet by this controller: still work to do
    assert needs_work(p, lambda d: None)
    ok = verification_entry("ok", "fine", ())
    record = updated_record(p, (), arch="arm64", node="arm-1", verification=lambda d: ok)
    p["metadata"]["annotations"] = record_patch(p, record)["metadata"]["annotations"]
    assert not needs_work(p, lambda d: ok)
    p["status"]["containerStatuses"][0]["restartCount"] = 3
    assert [f.restart_count for f in unreported(p)] == [3]


def test_record_patch_is_guarded_and_carries_label_and_record() -> None:
    p = pod(app=[status(last=terminated("StartError", 128, CONTAINERD_START))])
    record = updated_record(p, unreported(p), arch="arm64", node="arm-1",
                            verification=lambda d: None)
    patch = record_patch(p, record)
    meta = patch["metadata"]
    assert meta["resourceVersion"] == "7"
    assert meta["labels"] == {EXEC_FORMAT_LABEL: "true"}
    doc = json.loads(meta["annotations"][EXEC_FORMAT_ANNOTATION])
    assert doc["containers"]["app"] == {"restartCount": 1, "imageID": IMAGE_ID,
                                        "digest": DIGEST, "arch": "arm64", "node": "arm-1"}


def test_a_verification_result_reaches_the_record_once() -> None:
    p = pod(app=[status(last=terminated("Error", 255, RUNC))],
            labels={"podplacement.io/node-affinity": "set", EXEC_FORMAT_LABEL: "true"})
    record = updated_record(p, unreported(p), arch="arm64", node="arm-1",
                            verification=lambda d: None)
    p["metadata"]["annotations"] = record_patch(p, record)["metadata"]["annotations"]
    entry = verification_entry("mismatch", "/bin/busybox is amd64, not arm64", ("linux/arm64",))
    assert needs_work(p, {DIGEST: entry}.get)
    record = updated_record(p, (), arch="arm64", node="arm-1", verification={DIGEST: entry}.get)
    assert record["verified"][DIGEST]["mismatched"] == ["linux/arm64"]
    p["metadata"]["annotations"] = record_patch(p, record)["metadata"]["annotations"]
    assert recorded(p)["verified"][DIGEST]["status"] == "mismatch"
    assert not needs_work(p, {DIGEST: entry}.get)


def test_event_names_container_digest_node_and_architecture() -> None:
    (f,) = detect(pod(init=[status("setup", last=terminated("Error", 255, RUNC), restarts=4)]))
    spec = event_spec(f, arch="arm64", node="arm-1")
    assert (spec.type, spec.reason) == ("Warning", EXEC_FORMAT_REASON)
    for part in ("init container setup", f"digest {DIGEST}", f"imageID {IMAGE_ID}",
                 "node arm-1 of architecture arm64", "restart 4", "running /bin/sh",
                 "exit code 255"):
        assert part in spec.message
    assert len(spec.message) <= 1000


def test_unreadable_record_counts_as_none() -> None:
    p = pod(app=[status(last=terminated("Error", 1, CRUN))],
            annotations={EXEC_FORMAT_ANNOTATION: "{not json"})
    assert recorded(p) == {"containers": {}, "verified": {}}
    assert len(unreported(p)) == 1


def test_store_counts_each_observation_once_and_proves_wrong() -> None:
    store = FindingsStore()
    store.record_error(DIGEST, "arm64", ("u1", "app", 1), 100.0, namespace="team")
    store.record_error(DIGEST, "arm64", ("u1", "app", 1), 101.0, namespace="team")
    e = store.get(DIGEST, "arm64", "team")
    assert e is not None and (e.errors, e.first_seen, e.last_seen) == (1, 100.0, 100.0)
    assert not store.proven_wrong(DIGEST, "arm64", namespace="team")
    store.record_error(DIGEST, "arm64", ("u2", "app", 0), 105.0, namespace="team")
    assert store.proven_wrong(DIGEST, "arm64", namespace="team")
    # errors prove the pair for their namespace only, never for every namespace
    assert not store.proven_wrong(DIGEST, "arm64")
    assert not store.proven_wrong(DIGEST, "amd64", namespace="team")
    store.record_verification(DIGEST, "amd64", Verification("ok", "fine", 110.0))
    store.record_verification(DIGEST, "s390x", Verification("mismatch", "x86", 110.0))
    assert store.proven_wrong(DIGEST, "s390x") and not store.proven_wrong(DIGEST, "amd64")
    assert store.verified(DIGEST)
    store.forget(DIGEST)
    assert len(store) == 0


def test_store_is_bounded() -> None:
    store = FindingsStore(max_entries=2)
    for i in range(3):
        store.record_error(f"sha256:{i}", "arm64", ("u", "c", 0), float(i), namespace="t")
    assert [e.digest for e in store] == ["sha256:1", "sha256:2"]


def test_config_switch_defaults_on() -> None:
    assert PlacementConfig.from_object({"spec": {}}).exec_format_monitor is True
    off = {"spec": {"plugins": {"execFormatErrorMonitor": {"enabled": False}}}}
    assert PlacementConfig.from_object(off).exec_format_monitor is False
    from podplacement.rules.config import ConfigError

    with pytest.raises(ConfigError):
        PlacementConfig.from_object(
            {"spec": {"plugins": {"execFormatErrorMonitor": {"enabled": "yes"}}}})


def test_the_monitor_needs_no_request_beyond_the_controllers_table() -> None:
    from podplacement.controller.app import API_REQUESTS
    from podplacement.controller.execformatmonitor import API_REQUESTS as MONITOR

    assert set(MONITOR) <= set(API_REQUESTS)


def test_placement_digests_name_containers_never_image_volumes() -> None:
    """An image volume (KEP-4639) runs nothing: the digests the monitor reads are the
    containers', even when a volume has a container's name."""
    record = {"images": [{"image": "a:1", "digest": "sha256:" + "a" * 64},
                         {"image": "b:1", "digest": "sha256:" + "b" * 64}]}
    pod = {"metadata": {"annotations": {"podplacement.io/decision": json.dumps(record)}},
           "spec": {"containers": [{"name": "c", "image": "a:1"}],
                    "volumes": [{"name": "c", "image": {"reference": "b:1"}},
                                {"name": "d", "image": {"reference": "a:1"}}]}}
    assert placement_digests(pod) == {"c": "sha256:" + "a" * 64}
