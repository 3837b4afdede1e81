"""Learning from exec format errors (rules.findings' rule, rules.learn),
verify on suspicion (rules.monitor.execformat) and the config's switches: pure."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, Platform
from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.config import (
    DECISION_ANNOTATION,
    ConfigError,
    ExcludedPlatform,
    PlacementConfig,
    excluded_from_status,
)
from podplacement.rules.findings import (
    PROOF_ERRORS,
    FindingsStore,
    Verification,
    proof_of,
)
from podplacement.rules.learn import (
    DeletedPod,
    LearnedImage,
    deleted_from_status,
    exclusions,
    hit,
    learned_images,
    merge,
    remedy_owner,
    status_patch,
    touches,
)
from podplacement.rules.monitor.execformat import (
    PROOF_VERIFICATION,
    SUSPECT_MAX_RUN_SECONDS,
    event_spec,
    findings_of,
    needs_work,
    pending_suspicions,
    placement_digests,
    suspicion_of,
    updated_record,
    verification_entry,
)
from podplacement.rules.monitor.explain import explain, render_table
from podplacement.rules.place.admission import admission_placement
from podplacement.rules.place.decision import Outcome
from podplacement.rules.place.placement import PlacementInputs
from podplacement.rules.place.plan import plan
from tests.controller._pods import gated_pod
from tests.controller.test_execformat import pod, status, terminated

INDEX = "sha256:" + "1" * 64       # the index the tag points to (imageID, placement)
ARM_MANIFEST = "sha256:" + "2" * 64  # its arm64 entry
NEW_INDEX = "sha256:" + "3" * 64   # the tag moved: a rebuilt image
TTL = 6 * 3600.0
NS = "team"
T0 = 1_800_000_000.0


def lying(digest: str = INDEX, ref: str = "reg/app:1") -> ImageInfo:
    return ImageInfo(ref, digest, "application/vnd.oci.image.index.v1+json",
                     (Platform("linux", "amd64"), Platform("linux", "arm64", "v8")))


def excluded(*digests: str, arch: str = "arm64", proof: str = PROOF_VERIFICATION,
             expires: float = T0 + TTL) -> ExcludedPlatform:
    return ExcludedPlatform(tuple(sorted(digests)), "linux", arch, proof, 1, T0, expires,
                            "reg/app:1", "/bin/busybox is an ELF file for x86-64, not arm64")


# --- the learn rule ------------------------------------------------------------------------


def test_one_error_is_no_proof_two_distinct_errors_are() -> None:
    store = FindingsStore()
    store.record_error(INDEX, "arm64", ("u1", "app", 1), T0, namespace=NS)
    assert exclusions(store, now=T0, ttl=TTL) == ()
    store.record_error(INDEX, "arm64", ("u1", "app", 1), T0 + 1, namespace=NS)  # the same again
    assert exclusions(store, now=T0 + 1, ttl=TTL) == ()
    store.record_error(INDEX, "arm64", ("u2", "app", 0), T0 + 5, namespace=NS)
    (x,) = exclusions(store, now=T0 + 5, ttl=TTL)
    assert (x.platform, x.proof, x.errors) == ("linux/arm64", PROOF_ERRORS, 2)
    assert x.expires == T0 + 5 + TTL and x.digests == (INDEX,)
    # errors on amd64 nodes prove nothing about arm64 and vice versa
    store.record_error(INDEX, "amd64", ("u3", "app", 0), T0 + 6, namespace=NS)
    assert [e.architecture for e in exclusions(store, now=T0 + 6, ttl=TTL)] == ["arm64"]


def test_a_verification_mismatch_is_proof_alone_an_ok_is_not() -> None:
    store = FindingsStore()
    store.record_verification(INDEX, "amd64", Verification("ok", "fine", T0))
    store.record_verification(INDEX, "arm64", Verification("mismatch", "x86-64", T0),
                              aliases=[INDEX, ARM_MANIFEST])
    (x,) = exclusions(store, now=T0, ttl=TTL)
    assert (x.platform, x.proof, x.reason) == ("linux/arm64", PROOF_VERIFICATION, "x86-64")
    assert x.digests == (INDEX, ARM_MANIFEST)
    e = store.get(INDEX, "arm64")
    assert e is not None and proof_of(e) == PROOF_VERIFICATION
    store.record_verification(INDEX, "s390x", Verification("incomplete", "cap", T0))
    assert len(exclusions(store, now=T0, ttl=TTL)) == 1


def test_an_exclusion_ends_one_ttl_after_the_last_error_and_a_new_error_extends_it() -> None:
    store = FindingsStore()
    store.record_error(INDEX, "arm64", ("u1", "app", 0), T0, namespace=NS)
    store.record_error(INDEX, "arm64", ("u2", "app", 0), T0 + 100, namespace=NS)
    assert exclusions(store, now=T0 + 100 + TTL - 1, ttl=TTL)
    assert exclusions(store, now=T0 + 100 + TTL, ttl=TTL) == ()
    # a new error before the end moves it
    store.record_error(INDEX, "arm64", ("u3", "app", 0), T0 + 100 + TTL - 10, namespace=NS)
    (x,) = exclusions(store, now=T0 + 100 + TTL, ttl=TTL)
    assert x.expires == T0 + 100 + 2 * TTL - 10 and x.errors == 3
    # the TTL passes without one: forgotten, and a single error afterwards is no proof
    assert store.expire(T0 + 100 + 2 * TTL - 10, TTL) == 1
    store.record_error(INDEX, "arm64", ("u4", "app", 0), T0 + 3 * TTL, namespace=NS)
    assert exclusions(store, now=T0 + 3 * TTL, ttl=TTL) == ()


def test_a_verified_exclusion_expires_too() -> None:
    store = FindingsStore()
    store.record_verification(INDEX, "arm64", Verification("mismatch", "x86-64", T0))
    assert store.expire(T0 + TTL - 1, TTL) == 0
    assert exclusions(store, now=T0 + TTL - 1, ttl=TTL)
    assert store.expire(T0 + TTL, TTL) == 1 and len(store) == 0


def test_a_new_digest_is_placed_by_what_its_index_says() -> None:
    x = excluded(INDEX, ARM_MANIFEST)
    out = learned_images({"reg/app:1": lying(NEW_INDEX)}, (x,), namespace=NS)
    assert not isinstance(out["reg/app:1"], LearnedImage)
    assert not touches(lying(NEW_INDEX), (x,))
    assert hit(NEW_INDEX, "linux", "arm64", (x,), namespace=NS) is None
    assert hit(ARM_MANIFEST, "linux", "arm64", (x,), namespace=NS) is x
    assert hit(INDEX, "linux", "amd64", (x,), namespace=NS) is None


def test_adopted_exclusions_keep_their_count_without_double_counting() -> None:
    store = FindingsStore()
    store.adopt([INDEX, ARM_MANIFEST], "arm64", os="linux", proof=PROOF_ERRORS, errors=2,
                last_seen=T0, image="reg/app:1", namespace=NS)
    (x,) = exclusions(store, now=T0, ttl=TTL)
    assert (x.errors, x.proof, x.expires, x.digests) == (2, PROOF_ERRORS, T0 + TTL,
                                                         (INDEX, ARM_MANIFEST))
    # the pods' records then give the same two errors again: still two
    store.record_error(INDEX, "arm64", ("u1", "app", 0), T0 - 5, namespace=NS)
    store.record_error(INDEX, "arm64", ("u2", "app", 0), T0, namespace=NS)
    assert store.get(INDEX, "arm64", NS).errors == 2  # type: ignore[union-attr]
    store.record_error(INDEX, "arm64", ("u3", "app", 0), T0 + 1, namespace=NS)
    assert store.get(INDEX, "arm64", NS).errors == 3  # type: ignore[union-attr]
    verified = FindingsStore()
    verified.adopt([INDEX], "arm64", os="linux", proof=PROOF_VERIFICATION, errors=1,
                   last_seen=T0, reason="x86-64")
    (v,) = exclusions(verified, now=T0, ttl=TTL)
    assert (v.proof, v.reason) == (PROOF_VERIFICATION, "x86-64")


# --- every path places without the excluded platform -----------------------------------------


def test_the_controller_leaves_the_excluded_platform_out_and_says_why() -> None:
    config = replace(PlacementConfig(), excluded=(excluded(INDEX, ARM_MANIFEST),))
    decision = plan(
        PlacementInputs(gated_pod(images=("reg/app:1",)), {"reg/app:1": lying()}, config),
        nodes=None, nrts={}, now=T0,
    )
    assert decision.outcome == Outcome.SET and decision.architectures == ("amd64",)
    record = json.loads(decision.annotation)
    (entry,) = record["images"]
    assert entry["platforms"] == ["linux/amd64"]
    assert entry["excluded"] == [{"platform": "linux/arm64", "proof": "verification",
                                  "since": "2027-01-15T08:00:00Z",
                                  "until": "2027-01-15T14:00:00Z"}]
    assert "linux/arm64 of reg/app:1 excluded: exec format error proven by verification" \
        in record["reason"]
    # without the exclusion: both
    both = plan(
        PlacementInputs(gated_pod(images=("reg/app:1",)), {"reg/app:1": lying()},
                        PlacementConfig()),
        nodes=None, nrts={}, now=T0,
    )
    assert both.architectures == ("amd64", "arm64")


def test_the_webhook_places_as_the_controller_does() -> None:
    config = replace(PlacementConfig(), excluded=(excluded(INDEX),))
    p = gated_pod(images=("reg/app:1",))
    answer = admission_placement(p, {"reg/app:1": lying()}, config)
    assert answer is not None
    assert '"arm64"' not in json.dumps(list(answer.patch))
    record = json.loads(answer.annotation)
    assert record["path"] == "webhook" and record["archs"] == ["amd64"]
    assert record["images"][0]["excluded"][0]["platform"] == "linux/arm64"


def test_every_platform_excluded_means_no_supported_platform() -> None:
    config = replace(PlacementConfig(), excluded=(excluded(INDEX), excluded(INDEX, arch="amd64")))
    decision = plan(
        PlacementInputs(gated_pod(images=("reg/app:1",)), {"reg/app:1": lying()}, config),
        nodes=None, nrts={}, now=T0,
    )
    assert decision.outcome == Outcome.NO_SUPPORTED_PLATFORM
    assert "excluded linux/amd64,linux/arm64" in decision.events[0].message


def test_learned_images_is_idempotent_and_keeps_other_images() -> None:
    x = excluded(INDEX)
    first = learned_images({"reg/app:1": lying(), "reg/other:1": lying(NEW_INDEX, "reg/other:1"),
                            "reg/bad:1": LookupError("x")}, (x,), namespace=NS)
    again = learned_images(first, (x,), namespace=NS)
    assert first == again
    learned = first["reg/app:1"]
    assert isinstance(learned, LearnedImage)
    assert [str(p) for p in learned.platforms] == ["linux/amd64"] and learned.excluded == (x,)
    assert not isinstance(first["reg/other:1"], LearnedImage)


def test_explain_names_the_exclusion_for_the_image_and_the_node() -> None:
    config = replace(PlacementConfig(), excluded=(excluded(INDEX),))
    nodes = [{"metadata": {"name": n, "labels": {"kubernetes.io/arch": a,
                                                 "kubernetes.io/os": "linux"}}}
             for n, a in (("amd-1", "amd64"), ("arm-1", "arm64"))]
    report = explain(gated_pod(images=("reg/app:1",)), nodes, {}, {"reg/app:1": lying()},
                     config, now=T0)
    assert report["platforms"] == ["linux/amd64"]
    assert report["images"][0]["excluded"][0]["proof"] == "verification"
    arm = next(n for n in report["nodes"] if n["name"] == "arm-1")
    assert not arm["feasible"] and "linux/arm64 of reg/app:1 excluded" in arm["reason"]
    assert "Excluded (learned from exec format errors):" in render_table(report)


# --- the config and its status ---------------------------------------------------------------


def _config_object(excluded_items: list[Any], **monitor: Any) -> dict[str, Any]:
    return {"spec": {"plugins": {"execFormatErrorMonitor": monitor}},
            "status": {"execFormatErrorMonitor": {"excluded": excluded_items}}}


def test_switches_default_and_gate_the_published_exclusions() -> None:
    x = excluded(INDEX, ARM_MANIFEST)
    items = [x.to_status(), {"digests": [], "platform": "linux/arm64"},
             {"digests": [INDEX], "platform": "arm64"}, "junk"]
    on = PlacementConfig.from_object(_config_object(items))
    assert (on.exec_format_learn, on.delete_failed_pods) == (True, False)
    (parsed,) = on.excluded
    assert parsed.digests == x.digests and parsed.platform == "linux/arm64"
    assert parsed.expires == x.expires and parsed.reason == x.reason
    assert PlacementConfig.from_object(_config_object(items, learn=False)).excluded == ()
    assert PlacementConfig.from_object(_config_object(items, enabled=False)).excluded == ()
    assert PlacementConfig.from_object(
        _config_object([], deleteFailedPods=True)).delete_failed_pods is True
    with pytest.raises(ConfigError):
        PlacementConfig.from_object(_config_object([], deleteFailedPods="yes"))
    with pytest.raises(ConfigError):
        PlacementConfig.from_object(_config_object([], learn=1))


def test_status_round_trip_and_merge() -> None:
    x = excluded(INDEX, ARM_MANIFEST)
    gone = DeletedPod("ReplicaSet", "web-1", "rs-uid", "team", "web-1-abc", T0)
    patch = status_patch((x,), (gone,))
    assert excluded_from_status(patch) == (replace(x, errors=1),)
    assert deleted_from_status(patch) == (gone,)
    # the leader's own exclusion of the same pair wins; an expired published one is dropped
    own = replace(x, errors=3)
    other = excluded(NEW_INDEX)
    stale = excluded("sha256:" + "9" * 64, expires=T0 - 1)
    assert merge((own,), (x, other, stale), now=T0) == (own, other)


# --- the remedy's owner rule ----------------------------------------------------------------


@pytest.mark.parametrize(("refs", "expected"), [
    ([{"kind": "ReplicaSet", "name": "web-1", "uid": "u", "controller": True}],
     ("ReplicaSet", "web-1", "u")),
    ([{"kind": "StatefulSet", "name": "db", "uid": "s", "controller": True}],
     ("StatefulSet", "db", "s")),
    ([{"kind": "Job", "name": "j", "uid": "j", "controller": True}], ("Job", "j", "j")),
    ([], None),  # a bare pod: never
    ([{"kind": "ReplicaSet", "name": "web-1", "uid": "u"}], None),  # not its controller
    ([{"kind": "DaemonSet", "name": "d", "uid": "d", "controller": True}], None),
    ([{"kind": "Workflow", "name": "w", "uid": "w", "controller": True}], None),
])
def test_only_pods_a_replicaset_statefulset_or_job_controls(
        refs: list[dict[str, Any]], expected: tuple[str, str, str] | None) -> None:
    assert remedy_owner({"metadata": {"ownerReferences": refs}}) == expected


def test_a_pod_being_deleted_is_never_deleted_again() -> None:
    refs = [{"kind": "ReplicaSet", "name": "w", "uid": "u", "controller": True}]
    assert remedy_owner({"metadata": {"ownerReferences": refs,
                                      "deletionTimestamp": "2026-01-01T00:00:00Z"}}) is None


# --- the catalog --------------------------------------------------------------------------


def test_the_catalog_drops_entries_of_excluded_digests() -> None:
    store = ParamsStore(TTL)
    store.record("reg/app:1", [("linux", "amd64"), ("linux", "arm64")], T0, digest=INDEX)
    store.record("reg/app:2", [("linux", "amd64")], T0, digest=NEW_INDEX)
    store.record(f"reg/app@{INDEX}", [("linux", "amd64"), ("linux", "arm64")], T0)
    assert store.digest_of(f"reg/app@{INDEX}") == INDEX
    assert sorted(store.remove_digests({INDEX})) == ["reg/app:1", f"reg/app@{INDEX}"]
    assert list(store.images()) == ["reg/app:2"]
    # an entry adopted after a restart (digest unknown) goes when a failing pod named it
    adopted = ParamsStore(TTL)
    adopted.adopt({"reg/app:1": "linux/amd64,linux/arm64"}, T0,
                  learned={"reg/app:1": int(T0)})
    assert adopted.digest_of("reg/app:1") is None
    assert adopted.remove_digests({INDEX}, images=["reg/app:1"]) == ["reg/app:1"]


# --- verify on suspicion ------------------------------------------------------------------


def exited(code: int, *, started: str = "2026-01-01T00:00:00Z",
           finished: str = "2026-01-01T00:00:01Z", message: str = "",
           reason: str = "Error") -> dict[str, Any]:
    return {"terminated": {"reason": reason, "exitCode": code, "message": message,
                           "startedAt": started, "finishedAt": finished}}


@pytest.mark.parametrize("state", [exited(255), exited(1),
                                   exited(255, finished="2026-01-01T00:00:02Z"),
                                   exited(1, message=" \n")])
def test_the_runc_and_crun_shape_is_a_suspicion(state: dict[str, Any]) -> None:
    s = suspicion_of(status(last=state))
    assert s is not None and s.digest is not None
    assert s.finding.proof == PROOF_VERIFICATION
    assert s.finding.ran_seconds is not None
    assert s.finding.ran_seconds <= SUSPECT_MAX_RUN_SECONDS
    assert suspicion_of(status(state=state)) is not None


@pytest.mark.parametrize("state", [
    exited(1, finished="2026-01-01T00:00:30Z"),          # ran for a while
    exited(1, message="config file not found"),         # said something
    exited(137), exited(2), exited(0, reason="Completed"),
    exited(255, reason="OOMKilled"),
    exited(255, started="", finished=""),                # no times: cannot tell
    exited(255, started="2026-01-01T00:00:05Z"),         # clock went backwards
    terminated("StartError", 128, "exec format error"),  # words: a finding already
])
def test_other_exits_are_no_suspicion(state: dict[str, Any]) -> None:
    assert suspicion_of(status(last=state)) is None


def test_a_suspicion_becomes_a_finding_only_when_verification_flags_the_node() -> None:
    p = pod(app=[status(last=exited(255))])
    digest = suspicion_of(status(last=exited(255))).digest  # type: ignore[union-attr]
    assert digest is not None
    unknown: dict[str, dict[str, Any]] = {}
    assert pending_suspicions(p, unknown.get)
    assert needs_work(p, unknown.get, architecture="arm64")
    assert findings_of(p, unknown.get, architecture="arm64") == ()
    flagged = {digest: verification_entry("mismatch", "x86-64 binary", ("linux/arm64",),
                                          at=T0)}
    (f,) = findings_of(p, flagged.get, architecture="arm64")
    assert f.proof == PROOF_VERIFICATION and f.exit_code == 255
    assert needs_work(p, flagged.get, architecture="arm64")
    assert findings_of(p, flagged.get, architecture="amd64") == ()
    assert not needs_work(p, flagged.get, architecture="amd64")
    ok = {digest: verification_entry("ok", "fine", (), at=T0)}
    assert not needs_work(p, ok.get, architecture="arm64")
    record = updated_record(p, (f,), arch="arm64", node="arm-1", verification=flagged.get,
                            findings=(f,), at=T0)
    assert record["containers"]["app"]["proof"] == "verification"
    assert record["containers"]["app"]["at"] == int(T0)
    assert record["verified"][digest]["mismatched"] == ["linux/arm64"]
    spec = event_spec(f, arch="arm64", node="arm-1", verified=flagged[digest])
    assert "proven by verification" in spec.message and "x86-64 binary" in spec.message
    assert "exit code 255" in spec.message and "node arm-1 of architecture arm64" in spec.message


def test_the_digest_placement_saw_is_read_from_the_decision() -> None:
    p = pod(app=[status(last=exited(255))])
    p["spec"] = {"containers": [{"name": "app", "image": "reg/app:1"}]}
    p["metadata"].setdefault("annotations", {})[DECISION_ANNOTATION] = json.dumps(
        {"images": [{"image": "reg/app:1", "digest": INDEX, "platforms": []}]})
    assert placement_digests(p) == {"app": INDEX}


def test_a_restart_publishes_the_same_times_never_younger() -> None:
    store = FindingsStore()
    store.record_verification(INDEX, "arm64", Verification("mismatch", "x86-64", T0 + 0.7))
    (before,) = exclusions(store, now=T0 + 1, ttl=TTL)
    published = before.to_status()
    adopted = FindingsStore()
    (x,) = excluded_from_status(status_patch((before,), ()))
    adopted.adopt(x.digests, x.architecture, os=x.os, proof=x.proof, errors=x.errors,
                  last_seen=x.last_seen, reason=x.reason)
    (after,) = exclusions(adopted, now=T0 + 1, ttl=TTL)
    assert after.to_status() == published
    assert after.expires <= before.expires
