"""Evidence a tenant cannot write (docs/exec-format-errors.md, "What is evidence", "Who it
applies to"): pure rules of rules.findings / rules.learn / rules.config and the monitor's
I/O with the API double of test_execformatmonitor.

- times read from outside the controller's clock are cut to now, so no exclusion outlives
  now + TTL; a status item of an earlier release, or one resting on errors without a
  namespace, is not taken back;
- exec format errors exclude for their namespace only; only the controller's own
  verification, of the image's own program, excludes for every namespace;
- a pod's record annotation is not evidence;
- a pod placed without an excluded platform gets ``ExecFormatExclusion`` (which digest,
  platform, since when) and its annotation says since when.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, Platform, PlatformReport, VerifyReport
from podplacement.rules.config import (
    EXEC_FORMAT_ANNOTATION,
    ExcludedPlatform,
    PlacementConfig,
    excluded_from_status,
)
from podplacement.rules.findings import (
    PROOF_ERRORS,
    PROOF_VERIFICATION,
    FindingsStore,
    Verification,
    seen_at,
)
from podplacement.rules.learn import exclusions, hit, learned_images
from podplacement.rules.monitor.admitted import admission_events, decision_record
from podplacement.rules.place.admission import admission_placement
from podplacement.rules.place.decision import NORMAL, Outcome
from podplacement.rules.place.placement import EXEC_FORMAT_EXCLUSION, PlacementInputs
from podplacement.rules.place.plan import plan
from tests.controller import test_execformatmonitor as monitor_tests
from tests.controller._pods import gated_pod
from tests.controller.test_admission import _json_patch
from tests.controller.test_execformatmonitor import (
    AMD_MANIFEST,
    ARM_MANIFEST,
    CONFIG,
    INDEX,
    T0,
    Api,
    Clock,
    _monitor,
    _pod,
    _settle,
)

TTL = 3600.0
TEN_YEARS = 10 * 365 * 86400.0
OTHER = "sha256:" + "7" * 64
#: the verification double of test_execformatmonitor (a pytest fixture)
verified = monitor_tests.verified


def lying(digest: str = INDEX, ref: str = "reg/app:1") -> ImageInfo:
    return ImageInfo(ref, digest, "application/vnd.oci.image.index.v1+json",
                     (Platform("linux", "amd64"), Platform("linux", "arm64")))


def in_namespace(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["namespace"] = namespace
    return pod


# --- times ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    (T0 + TEN_YEARS, T0), (T0 - 5, T0 - 5), (int(T0), T0),
    (True, None), ("1800000000", None), (float("nan"), None), (-1, None), (None, None)])
def test_a_time_from_outside_is_never_later_than_now(value: Any, expected: float | None) -> None:
    assert seen_at(value, T0) == expected


def test_no_exclusion_lasts_past_now_plus_the_ttl() -> None:
    store = FindingsStore()
    store.record_verification(INDEX, "amd64", Verification("mismatch", "x", T0 + TEN_YEARS))
    store.record_error(INDEX, "arm64", ("u1", "c", 0), T0 + TEN_YEARS, namespace="team")
    store.record_error(INDEX, "arm64", ("u2", "c", 0), T0 + TEN_YEARS, namespace="team")
    found = exclusions(store, now=T0, ttl=TTL)
    assert len(found) == 2
    assert all(x.last_seen == T0 and x.expires == T0 + TTL for x in found)
    # the learn loop's round: expire, then the exclusions in force
    assert store.expire(T0, TTL) == 0
    assert all(e.latest == T0 for e in store)
    assert store.expire(T0 + TTL, TTL) == 2
    assert exclusions(store, now=T0 + TTL, ttl=TTL) == ()


def test_a_published_item_of_an_earlier_release_is_not_taken_back() -> None:
    """The status an earlier release wrote from a forged record: no ``since``."""
    forged = {"digests": [INDEX], "platform": "linux/amd64", "proof": "exec-format-errors",
              "errors": 2, "lastSeen": int(T0 + TEN_YEARS),
              "expires": int(T0 + TEN_YEARS + TTL), "image": "reg/app:1", "reason": "2"}
    obj = {"status": {"execFormatErrorMonitor": {"excluded": [forged]}}}
    assert excluded_from_status(obj) == ()
    # with since, but resting on errors without a namespace: never for every namespace
    obj["status"]["execFormatErrorMonitor"]["excluded"] = [{**forged, "since": int(T0)}]
    assert excluded_from_status(obj) == ()
    assert PlacementConfig.from_object(obj).excluded == ()


def test_a_published_expiry_is_cut_to_one_ttl_after_the_last_evidence() -> None:
    item = {"digests": [INDEX], "platform": "linux/arm64", "proof": "verification",
            "errors": 0, "lastSeen": int(T0), "expires": int(T0 + TEN_YEARS),
            "since": int(T0), "reason": "x"}
    obj = {"spec": {"imageInspection": {"cacheTTL": "1h"}},
           "status": {"execFormatErrorMonitor": {"excluded": [item]}}}
    (x,) = excluded_from_status(obj, max_age=TTL)
    assert x.expires == T0 + TTL
    (parsed,) = PlacementConfig.from_object(obj).excluded
    assert parsed.expires == T0 + TTL


async def test_a_restart_cuts_a_published_future_time_to_now() -> None:
    api, clock = Api(), Clock()
    x = ExcludedPlatform((INDEX,), "linux", "arm64", PROOF_VERIFICATION, 0,
                         T0 + TEN_YEARS, T0 + TEN_YEARS + TTL, "reg/app:1", "x",
                         since=T0 + TEN_YEARS)
    api.config["status"] = {"execFormatErrorMonitor": {"excluded": [x.to_status()]}}
    monitor, _, _ = _monitor(api, CONFIG, clock)
    await monitor.learn()
    (now,) = monitor.current
    assert now.last_seen == T0 and now.expires == T0 + TTL
    (published,) = excluded_from_status(api.config)
    assert published.expires == T0 + TTL


# --- scope --------------------------------------------------------------------------------


def test_errors_exclude_only_for_their_namespace() -> None:
    store = FindingsStore()
    for uid in ("u1", "u2"):
        store.record_error(INDEX, "amd64", (uid, "c", 0), T0, namespace="team-a")
    (x,) = exclusions(store, now=T0, ttl=TTL)
    assert (x.proof, x.namespace) == (PROOF_ERRORS, "team-a")
    config = replace(PlacementConfig(), excluded=(x,))
    for namespace, archs in (("team-a", ("arm64",)), ("team-b", ("amd64", "arm64"))):
        decision = plan(
            PlacementInputs(in_namespace(gated_pod(), namespace), {"reg/app:1": lying()}, config),
            nodes=None, nrts={}, now=T0,
        )
        assert decision.architectures == archs, namespace
    assert hit(INDEX, "linux", "amd64", (x,), namespace="team-b") is None
    assert hit(INDEX, "linux", "amd64", (x,), namespace="team-a") is x
    assert learned_images({"reg/app:1": lying()}, (x,), namespace="team-b") == {
        "reg/app:1": lying()}
    # no number of errors, in as many namespaces, proves anything for every namespace
    for n in range(5):
        store.record_error(INDEX, "amd64", (f"v{n}", "c", 0), T0, namespace=f"ns-{n}")
    assert all(x.namespace for x in exclusions(store, now=T0, ttl=TTL))
    assert not store.proven_wrong(INDEX, "amd64")


def test_only_a_verification_excludes_for_every_namespace() -> None:
    store = FindingsStore()
    store.record_verification(INDEX, "arm64", Verification("mismatch", "x", T0),
                              aliases=[ARM_MANIFEST])
    store.record_error(INDEX, "arm64", ("u1", "c", 0), T0, namespace="team-a")
    store.record_error(INDEX, "arm64", ("u2", "c", 0), T0, namespace="team-a")
    (x,) = exclusions(store, now=T0, ttl=TTL)  # the namespace's is covered by it
    assert (x.proof, x.namespace) == (PROOF_VERIFICATION, "")
    config = replace(PlacementConfig(), excluded=(x,))
    decision = plan(
        PlacementInputs(in_namespace(gated_pod(), "team-b"), {"reg/app:1": lying()}, config),
        nodes=None, nrts={}, now=T0,
    )
    assert decision.architectures == ("amd64",)


# --- records are not evidence --------------------------------------------------------------


def _forged(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with the record mallory writes at creation: two errors and a verification
    of team-b's digest on amd64, ten years ahead, and no error in its status."""
    at = int(T0 + TEN_YEARS)
    pod["metadata"]["annotations"][EXEC_FORMAT_ANNOTATION] = json.dumps({
        "containers": {c: {"restartCount": 0, "imageID": f"reg/b@{OTHER}", "digest": OTHER,
                           "arch": "amd64", "node": "amd-1", "at": at} for c in ("x", "y")},
        "verified": {OTHER: {"status": "mismatch", "reason": "forged",
                             "mismatched": ["linux/amd64"], "at": at}}})
    pod["status"]["containerStatuses"][0]["lastState"] = {}
    return pod


async def test_a_forged_record_is_no_evidence(verified: list[str]) -> None:
    api, clock = Api(), Clock()
    monitor, events, _ = _monitor(api, CONFIG, clock)
    for name in ("a", "b"):
        pod = _forged(_pod(name))
        api.pods[("team", name)] = pod
        monitor.on_pod("ADDED", copy.deepcopy(pod), None)
    await monitor.learn()
    assert len(monitor.store) == 0 and monitor.current == ()
    assert excluded_from_status(api.config) == () and events.sent == []
    assert verified == []


async def test_a_record_counts_again_only_what_the_status_shows(verified: list[str]) -> None:
    """A restart re-derives a reported error from the status; the record's own digest,
    architecture and future time are not used."""
    api, clock = Api(), Clock()
    pod = _pod("a", code=1, message="exec /bin/sh: exec format error")
    pod["metadata"]["annotations"][EXEC_FORMAT_ANNOTATION] = json.dumps({"containers": {
        "app": {"restartCount": 1, "digest": OTHER, "arch": "amd64",
                "at": int(T0 + TEN_YEARS)}}})
    monitor, _, _ = _monitor(api, CONFIG, clock)
    monitor.on_pod("ADDED", pod, None)
    assert monitor.store.get(OTHER, "amd64", "team") is None
    e = monitor.store.get(INDEX, "arm64", "team")  # the status's digest, the node's arch
    assert e is not None and e.errors == 1 and e.last_seen == T0


async def test_verification_reads_the_images_own_program(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod's ``command`` could name any file of someone else's image: it is not what the
    controller verifies."""
    seen: list[tuple[Any, Any]] = []

    async def verify_image(_inspector: Any, reference: str, _creds: Sequence[Any] = (), *,
                           command: Any = None, args: Any = None, **_: Any) -> VerifyReport:
        seen.append((command, args))
        return VerifyReport(reference, INDEX, "x", 1, (
            PlatformReport("linux/amd64", AMD_MANIFEST, "ok", "fine"),
            PlatformReport("linux/arm64", ARM_MANIFEST, "ok", "fine")))

    from podplacement import imageinspect

    monkeypatch.setattr(imageinspect, "verify_image", verify_image)
    api, clock = Api(), Clock()
    pod = _pod("a", code=1, message="exec /etc/passwd: exec format error")
    pod["spec"]["containers"][0].update(command=["/etc/passwd"], args=["x"])
    api.pods[("team", "a")] = pod
    monitor, _, _ = _monitor(api, CONFIG, clock)
    await monitor.reconcile("team/a/uid-a")
    await _settle(monitor)
    assert seen == [(None, None)]


# --- the pod is told ---------------------------------------------------------------------


def _verified_exclusion() -> ExcludedPlatform:
    return ExcludedPlatform((INDEX, ARM_MANIFEST), "linux", "arm64", PROOF_VERIFICATION, 0,
                            T0, T0 + TTL, "reg/app:1", "/bin/busybox: x86-64 ELF",
                            since=T0 - 60)


def test_a_pod_placed_without_an_excluded_platform_is_told_which_and_since_when() -> None:
    config = replace(PlacementConfig(), excluded=(_verified_exclusion(),))
    decision = plan(
        PlacementInputs(in_namespace(gated_pod(), "team-b"), {"reg/app:1": lying()}, config),
        nodes=None, nrts={}, now=T0,
    )
    assert decision.outcome == Outcome.SET and decision.architectures == ("amd64",)
    (told,) = [e for e in decision.events if e.reason == EXEC_FORMAT_EXCLUSION]
    assert told.type == NORMAL
    for part in (f"digest {INDEX}", "platform linux/arm64 excluded since "
                 "2027-01-15T07:59:00Z until 2027-01-15T09:00:00Z", "verification"):
        assert part in told.message
    assert "busybox" not in told.message  # our own words only
    (entry,) = json.loads(decision.annotation)["images"]
    assert entry["excluded"][0]["since"] == "2027-01-15T07:59:00Z"
    # nothing excluded: no such Event
    plain = plan(
        PlacementInputs(gated_pod(), {"reg/app:1": lying()}, PlacementConfig()),
        nodes=None, nrts={}, now=T0,
    )
    assert not [e for e in plain.events if e.reason == EXEC_FORMAT_EXCLUSION]


def test_a_pod_the_webhook_placed_is_told_by_the_controller_too() -> None:
    config = replace(PlacementConfig(), excluded=(_verified_exclusion(),))
    pod = in_namespace(gated_pod(), "team-b")
    answer = admission_placement(pod, {"reg/app:1": lying()}, config)
    assert answer is not None
    stored = _json_patch(pod, list(answer.patch))
    specs = admission_events(stored, decision_record(stored), config, catalog={}.get)
    assert [s.reason for s in specs] == [EXEC_FORMAT_EXCLUSION]


async def test_a_preset_label_and_record_do_not_keep_the_image_from_being_verified(
        verified: list[str]) -> None:
    """The creator presets the label and a record saying every restart was reported and the
    digest verified: the controller still verifies the digest itself."""
    api, clock = Api(), Clock()
    pod = _pod("a", code=1, message="exec /bin/sh: exec format error")
    pod["metadata"]["labels"]["podplacement.io/exec-format-error"] = "true"
    pod["metadata"]["annotations"][EXEC_FORMAT_ANNOTATION] = json.dumps({
        "containers": {"app": {"restartCount": 999}},
        "verified": {INDEX: {"status": "ok", "reason": "forged", "mismatched": []}}})
    api.pods[("team", "a")] = pod
    monitor, _, _ = _monitor(api, CONFIG, clock)
    monitor.on_pod("ADDED", copy.deepcopy(pod), None)
    assert monitor.queue.is_pending("team/a/uid-a")
    await monitor.reconcile("team/a/uid-a")
    await _settle(monitor)
    assert verified == [f"reg.example/team/app@{INDEX} all"]
    await monitor.learn()
    (x,) = monitor.current
    assert (x.platform, x.proof, x.namespace) == ("linux/arm64", PROOF_VERIFICATION, "")


def test_verifying_again_what_was_taken_back_does_not_make_it_younger() -> None:
    store = FindingsStore()
    store.adopt([INDEX], "arm64", os="linux", proof=PROOF_VERIFICATION, errors=0,
                last_seen=T0 - 100, reason="x", since=T0 - 200)
    store.record_verification(INDEX, "arm64", Verification("mismatch", "x", T0))
    (x,) = exclusions(store, now=T0, ttl=TTL)
    assert (x.last_seen, x.expires, x.since) == (T0 - 100, T0 - 100 + TTL, T0 - 200)
    # a different finding is new evidence
    store.record_verification(INDEX, "arm64", Verification("ok", "fine", T0 + 1))
    assert exclusions(store, now=T0 + 1, ttl=TTL) == ()


async def test_a_forged_decision_digest_is_no_alias_of_a_verified_exclusion(
        verified: list[str]) -> None:
    """The decision annotation's image digest is the creator's to write: it never names
    content for every namespace."""
    api, clock = Api(), Clock()
    pod = _pod("a", code=1, message="exec /bin/sh: exec format error")
    pod["metadata"]["annotations"]["podplacement.io/decision"] = json.dumps(
        {"images": [{"image": pod["spec"]["containers"][0]["image"], "digest": OTHER}]})
    api.pods[("team", "a")] = pod
    monitor, _, _ = _monitor(api, CONFIG, clock)
    await monitor.reconcile("team/a/uid-a")
    await _settle(monitor)
    await monitor.learn()
    (x,) = monitor.current
    assert x.namespace == "" and OTHER not in x.digests
    assert set(x.digests) == {INDEX, ARM_MANIFEST}
