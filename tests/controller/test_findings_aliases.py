"""A published exclusion taken back by a new leader, then verified again under another
digest of the same content, stays one exclusion with its own times (plain data: the
store, the learn rule and the status round trip the monitor uses)."""

from __future__ import annotations

import pytest

from podplacement.rules.config import excluded_from_status
from podplacement.rules.findings import FindingsStore, Verification, seen_at
from podplacement.rules.learn import exclusions, status_patch

TTL = 3600.0
LOW = "sha256:" + "0" * 64
HIGH = "sha256:" + "f" * 64
REASON = "/bin/busybox is a program for x86-64, not aarch64"
REF = "registry.test/learn/lying@"


def _verify(store: FindingsStore, index: str, manifest: str, at: float) -> None:
    """What the monitor's verification records: under the pod's imageID digest (the
    index), aliased to the index and the platform manifest digests."""
    store.record_verification(index, "arm64", Verification("mismatch", REASON, at, REF + index),
                              os="linux", aliases=[index, manifest],
                              image="registry.test/learn/lying:v1")


def _adopt(store: FindingsStore, obj: dict[str, object], now: float) -> None:
    """:meth:`controller.execformatmonitor.ExecFormatMonitor.adopt`'s calls, for one
    exclusion."""
    for x in excluded_from_status(obj, max_age=TTL):
        last_seen = seen_at(x.last_seen, now)
        assert last_seen is not None
        store.adopt(x.digests, x.architecture, os=x.os, proof=x.proof, errors=x.errors,
                    last_seen=last_seen, image=x.image, reason=x.reason,
                    namespace=x.namespace, since=seen_at(x.since, last_seen) or last_seen)


@pytest.mark.parametrize(("index", "manifest"), [(HIGH, LOW), (LOW, HIGH)],
                         ids=["index-sorts-last", "index-sorts-first"])
def test_a_new_leaders_verification_confirms_the_exclusion_it_took_back(
        index: str, manifest: str) -> None:
    first = FindingsStore()
    _verify(first, index, manifest, 1000.0)
    (published,) = exclusions(first, now=1000.0, ttl=TTL)
    obj = {"status": status_patch([published], [])["status"]}

    leader = FindingsStore()  # after the restart: a new store, the status taken back
    _adopt(leader, obj, 1005.0)
    _verify(leader, index, manifest, 1009.0)  # the same pod's digest verified again

    (again,) = exclusions(leader, now=1010.0, ttl=TTL)
    assert len(leader) == 1
    assert set(again.digests) == {index, manifest}
    assert (again.since, again.last_seen, again.expires) == (
        published.since, published.last_seen, published.expires)
    assert again.proof == published.proof and again.reason == published.reason


def test_evidence_is_found_under_any_digest_of_its_content() -> None:
    store = FindingsStore()
    store.adopt([LOW, HIGH], "arm64", os="linux", proof="exec-format-errors", errors=2,
                last_seen=1000.0, namespace="team-a", since=990.0)
    store.record_error(HIGH, "arm64", ("uid", "app", 3), 1010.0, namespace="team-a")
    assert len(store) == 1
    e = store.get(HIGH, "arm64", "team-a")
    assert e is not None and e.digest == LOW and e.errors == 2 and e.last_seen == 1010.0
    assert store.proven_wrong(HIGH, "arm64", namespace="team-a")
    # another namespace's, or another architecture's, evidence stays apart
    store.record_error(HIGH, "arm64", ("uid2", "app", 0), 1011.0, namespace="team-b")
    store.record_error(HIGH, "amd64", ("uid3", "app", 0), 1011.0, namespace="team-a")
    assert len(store) == 3


@pytest.mark.parametrize(("index", "manifest"), [(HIGH, LOW), (LOW, HIGH)],
                         ids=["index-sorts-last", "index-sorts-first"])
def test_a_verification_before_the_take_back_does_not_make_it_young(
        index: str, manifest: str) -> None:
    first = FindingsStore()
    _verify(first, index, manifest, 1000.0)
    (published,) = exclusions(first, now=1000.0, ttl=TTL)
    obj = {"status": status_patch([published], [])["status"]}

    leader = FindingsStore()
    _verify(leader, index, manifest, 1009.0)  # the new leader verified before it adopted
    _adopt(leader, obj, 1010.0)

    (again,) = exclusions(leader, now=1011.0, ttl=TTL)
    assert len(leader) == 1
    assert (again.since, again.last_seen, again.expires) == (
        published.since, published.last_seen, published.expires)
