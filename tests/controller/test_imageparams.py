"""The params object's content (rules.admit.imageparams): TTL of tag references counted from
when a registry answered (not from the last record, not from a restart), digest references
kept, LRU bounds by entries and by JSON bytes of spec.images plus spec.learned, canonical
values, malformed input skipped, adoption of a live object with its ages, and the
dirty/version protocol a writer relies on. Times are explicit unix seconds."""

from __future__ import annotations

import orjson
import pytest

from podplacement.rules.admit.imageparams import ParamsStore, is_pinned, platforms_value

DIGEST = "sha256:" + "ab" * 32
TAG_A = "registry.example:5000/team/a:v1"
TAG_B = "registry.example:5000/team/b:v1"
PINNED = f"registry.example:5000/team/c@{DIGEST}"
AMD = [("linux", "amd64")]
AMD_ARM = [("linux", "arm64"), ("linux", "amd64")]


def _json_size(store: ParamsStore) -> int:
    return len(orjson.dumps(store.images())) + len(orjson.dumps(store.learned()))


# --- values -----------------------------------------------------------------------------
def test_value_is_sorted_deduplicated_and_comma_separated() -> None:
    pairs = [("linux", "s390x"), ("linux", "amd64"), ("linux", "arm64"), ("linux", "amd64"),
             ("windows", "amd64")]
    assert platforms_value(pairs) == "linux/amd64,linux/arm64,linux/s390x,windows/amd64"


@pytest.mark.parametrize("pairs", [
    [],
    [("linux", "amd64"), ("Linux", "arm64")],
    [("linux", "arm/v7")],
    [("linux", "")],
    [("linux", "amd 64")],
    [("linux", "arch-" + "x" * 40 + f"{i}") for i in range(6)],  # longer than 256
])
def test_an_image_with_no_or_malformed_pairs_is_not_recorded(
        pairs: list[tuple[str, str]]) -> None:
    store = ParamsStore(60)
    assert store.record(TAG_A, pairs, now=0) is False
    assert TAG_A not in store and store.images() == {} and not store.dirty


def test_a_malformed_result_removes_the_stale_entry_of_that_image() -> None:
    store = ParamsStore(60)
    store.record(TAG_A, AMD, now=0)
    assert store.record(TAG_A, [("linux", "Arm64")], now=1) is True
    assert store.images() == {}


def test_a_string_that_is_not_an_image_reference_is_not_recorded() -> None:
    store = ParamsStore(60)
    assert store.record("UPPER/Case:v1", AMD, now=0) is False
    assert store.record("ab" * 32, AMD, now=0) is False  # an image ID
    assert len(store) == 0


@pytest.mark.parametrize(("image", "pinned"), [
    (TAG_A, False),
    ("nginx", False),
    (PINNED, True),
    (f"ghcr.io/org/app:v2@{DIGEST}", True),
    (f"ghcr.io/org/app@sha512:{'cd' * 64}", True),
    ("not a reference", None),
])
def test_digest_references_are_told_apart_from_tags(image: str, pinned: bool | None) -> None:
    assert is_pinned(image) is pinned


# --- record -----------------------------------------------------------------------------
def test_images_maps_references_to_values_with_sorted_keys() -> None:
    store = ParamsStore(60)
    store.record(TAG_B, AMD, now=0)
    store.record(TAG_A, AMD_ARM, now=1)
    images = store.images()
    assert list(images) == [TAG_A, TAG_B]
    assert images == {TAG_A: "linux/amd64,linux/arm64", TAG_B: "linux/amd64"}


def test_record_reports_whether_the_published_content_changed() -> None:
    store = ParamsStore(60)
    assert store.record(TAG_A, AMD, now=0) is True
    # the same answer again (a cached copy): nothing to publish
    assert store.record(TAG_A, list(reversed(AMD)) + AMD, now=1, learned=0) is False
    assert store.record(TAG_A, AMD_ARM, now=2, learned=2) is True
    assert store.get(TAG_A) == "linux/amd64,linux/arm64"
    # a new registry answer with the same value: its learned second is published
    assert store.record(TAG_A, AMD_ARM, now=3.5) is True
    assert store.learned() == {TAG_A: 3}
    assert store.record(TAG_A, AMD_ARM, now=3.9) is False  # the same second


def test_remove_drops_an_entry_once() -> None:
    store = ParamsStore(60)
    store.record(TAG_A, AMD, now=0)
    assert store.remove(TAG_A) is True
    assert store.remove(TAG_A) is False
    assert store.images() == {}


# --- TTL --------------------------------------------------------------------------------
def test_tag_references_expire_after_the_ttl() -> None:
    store = ParamsStore(100)
    store.record(TAG_A, AMD, now=0)
    store.record(TAG_B, AMD, now=50)
    assert store.expire(99.9) == 0
    assert store.expire(100) == 1
    assert list(store.images()) == [TAG_B]
    assert store.expire(150) == 1
    assert store.images() == {}


def test_a_new_registry_answer_restarts_the_age() -> None:
    store = ParamsStore(100)
    store.record(TAG_A, AMD, now=0)
    store.record(TAG_B, AMD, now=10)
    store.record(TAG_A, AMD, now=90)  # fetched again at 90: same value, but younger
    assert store.expire(120) == 1
    assert list(store.images()) == [TAG_A]
    assert store.expire(190) == 1


def test_re_recording_a_cached_result_keeps_the_age() -> None:
    """The inspector answered from its cache: the result carries the time the registry
    answered (0), so the entry still expires 100 s after 0, however often it is recorded."""
    store = ParamsStore(100)
    store.record(TAG_A, AMD_ARM, now=0.5, learned=0)
    store.mark_clean(store.version)
    for now in (30, 60, 99):
        assert store.record(TAG_A, AMD_ARM, now=now, learned=0) is False
    assert not store.dirty and store.learned_at(TAG_A) == 0
    assert store.expire(99.9) == 0
    assert store.expire(100) == 1 and store.images() == {}


def test_an_older_result_never_replaces_a_newer_one() -> None:
    store = ParamsStore(100)
    store.record(TAG_A, AMD, now=50, learned=50)  # the tag moved: amd64 only since 50
    # a lookup served from a copy fetched at 10, before the move
    assert store.record(TAG_A, AMD_ARM, now=51, learned=10) is False
    assert store.images() == {TAG_A: "linux/amd64"} and store.learned() == {TAG_A: 50}


def test_a_learned_time_in_the_future_counts_as_now() -> None:
    store = ParamsStore(100)
    store.record(TAG_A, AMD, now=10, learned=5_000)
    assert store.learned_at(TAG_A) == 10
    assert store.expire(110) == 1


def test_a_result_already_older_than_the_ttl_is_not_recorded() -> None:
    store = ParamsStore(100)
    assert store.record(TAG_A, AMD, now=200, learned=100) is False
    assert TAG_A not in store and not store.dirty
    assert store.record(PINNED, AMD, now=200, learned=0) is True  # digests never expire


def test_the_ttl_given_at_construction_applies_to_the_first_entry() -> None:
    store = ParamsStore(20)
    store.record(TAG_A, AMD, now=1000)
    assert store.expire(1019.9) == 0
    assert store.expire(1020) == 1


def test_a_wall_clock_set_back_does_not_extend_an_entry_beyond_the_ttl() -> None:
    store = ParamsStore(100)
    store.record(TAG_A, AMD, now=1_700_003_600)
    store.mark_clean(store.version)
    # the clock is set back an hour: the entry counts as learned at the new now
    assert store.expire(1_700_000_000) == 0
    assert store.learned() == {TAG_A: 1_700_000_000} and store.dirty
    assert store.expire(1_700_000_099.9) == 0
    assert store.expire(1_700_000_100) == 1


def test_digest_references_do_not_expire() -> None:
    store = ParamsStore(100)
    store.record(PINNED, AMD, now=0)
    store.record(TAG_A, AMD, now=0)
    assert store.expire(10_000) == 1
    assert list(store.images()) == [PINNED]


def test_a_new_ttl_applies_to_existing_entries() -> None:
    store = ParamsStore(3600)
    store.record(TAG_A, AMD, now=0)
    assert store.expire(60) == 0
    store.ttl_seconds = 30
    assert store.expire(60) == 1
    store.record(TAG_B, AMD, now=61)
    store.set_ttl(0)
    assert store.expire(61) == 1
    assert store.record(TAG_B, AMD, now=62) is False  # with TTL 0 a tag is never kept
    with pytest.raises(ValueError, match="negative"):
        store.set_ttl(-1)


# --- bounds -----------------------------------------------------------------------------
def test_the_least_recently_recorded_entry_goes_first_at_the_entry_bound() -> None:
    store = ParamsStore(60, max_entries=3)
    for i, image in enumerate(["r/a:1", "r/b:1", "r/c:1"]):
        store.record(image, AMD, now=i)
    store.record("r/a:1", AMD, now=3)  # refreshed: now the most recent
    assert store.record("r/d:1", AMD, now=4) is True
    assert sorted(store.images()) == ["r/a:1", "r/c:1", "r/d:1"]
    store.record(PINNED, AMD, now=5)
    store.record("r/e:1", AMD, now=6)
    assert set(store.images()) == {PINNED, "r/d:1", "r/e:1"}
    store.record("r/f:1", AMD, now=7)
    store.record("r/g:1", AMD, now=8)  # a digest reference is evicted like any other
    assert sorted(store.images()) == ["r/e:1", "r/f:1", "r/g:1"]


def test_a_touched_entry_is_evicted_last_at_the_entry_bound() -> None:
    store = ParamsStore(60, max_entries=3)
    for i, image in enumerate(["r/a:1", "r/b:1", "r/c:1"]):
        store.record(image, AMD, now=i)
    assert store.touch("r/a:1") is True  # a pod of r/a:1 seen placed: now the most recent
    store.record("r/d:1", AMD, now=4)
    assert sorted(store.images()) == ["r/a:1", "r/c:1", "r/d:1"]
    store.touch("r/c:1")
    store.touch("r/a:1")
    store.record("r/e:1", AMD, now=5)  # r/d:1, recorded after r/c:1, was used before it
    assert sorted(store.images()) == ["r/a:1", "r/c:1", "r/e:1"]


def test_a_touched_entry_is_evicted_last_at_the_byte_bound() -> None:
    one = len(orjson.dumps({"r/i-00:1": "linux/amd64"})) + len(orjson.dumps({"r/i-00:1": 0}))
    store = ParamsStore(60, max_bytes=one + 2 * (one - 2))
    for i in range(3):
        store.record(f"r/i-{i:02d}:1", AMD, now=i)
    store.touch("r/i-00:1")
    store.record("r/i-03:1", AMD, now=3)
    assert sorted(store.images()) == ["r/i-00:1", "r/i-02:1", "r/i-03:1"]


def test_a_touch_changes_nothing_published_so_no_write_follows() -> None:
    store = ParamsStore(60)
    store.record(TAG_A, AMD, now=100)
    store.record(TAG_B, AMD, now=101)
    store.mark_clean(store.version)
    version, images, learned = store.version, store.images(), store.learned()
    assert store.touch(TAG_A) is True
    assert store.touch("r/absent:1") is False and "r/absent:1" not in store
    assert not store.dirty and store.version == version
    assert store.images() == images and store.learned() == learned
    # nor does a touch make an entry younger: it expires by its learned time
    assert store.expire(160) == 1 and TAG_A not in store


def test_adopted_entries_can_be_touched_out_of_the_eviction_order() -> None:
    store = ParamsStore(100, max_entries=2)
    store.adopt({TAG_A: "linux/amd64", TAG_B: "linux/amd64"}, now=20,
                learned={TAG_A: 5, TAG_B: 15})
    store.touch(TAG_A)  # adopted oldest first, then used
    store.record("r/z:1", AMD, now=21)
    assert set(store.images()) == {TAG_A, "r/z:1"}


def test_the_byte_bound_holds_for_the_json_of_both_maps() -> None:
    one = len(orjson.dumps({"r/i-00:1": "linux/amd64"})) + len(orjson.dumps({"r/i-00:1": 0}))
    # room for exactly three such entries (each adds its own size less the braces, plus a
    # comma in each map)
    bound = one + 2 * (one - 2)
    store = ParamsStore(60, max_bytes=bound)
    for i in range(3):
        store.record(f"r/i-{i:02d}:1", AMD, now=i)
    assert len(store) == 3 and store.json_size == _json_size(store) == bound
    store.record("r/i-03:1", AMD, now=3)
    assert sorted(store.images()) == ["r/i-01:1", "r/i-02:1", "r/i-03:1"]
    # a longer value for a recent entry pushes out the least recent one
    store.record("r/i-03:1", [*AMD_ARM, ("linux", "s390x")], now=4)
    assert sorted(store.images()) == ["r/i-02:1", "r/i-03:1"]
    assert store.json_size == _json_size(store) <= bound


def test_the_learned_times_count_in_the_byte_bound() -> None:
    """Two tag entries fit by spec.images alone, not with both spec.learned items; a digest
    entry has no learned item."""
    tag_1, tag_2 = "r/aaaa:1", "r/bbbb:1"
    both = len(orjson.dumps({tag_1: "linux/amd64", tag_2: "linux/amd64"}))
    store = ParamsStore(60, max_bytes=both + len(orjson.dumps({tag_2: 1_700_000_001})))
    store.record(tag_1, AMD, now=1_700_000_000)
    store.record(tag_2, AMD, now=1_700_000_001)
    assert list(store.images()) == [tag_2]
    assert store.json_size == _json_size(store) <= store.max_bytes
    pinned = ParamsStore(60, max_bytes=len(orjson.dumps({PINNED: "linux/amd64"})) + 2)
    pinned.record(PINNED, AMD, now=0)
    assert len(pinned) == 1 and pinned.learned() == {}
    assert pinned.json_size == _json_size(pinned) == pinned.max_bytes


def test_an_entry_larger_than_the_byte_bound_is_not_recorded() -> None:
    store = ParamsStore(60, max_bytes=60)
    store.record("r/a:1", AMD, now=0)
    assert store.record("r/" + "x" * 60 + ":1", AMD, now=1) is False
    assert list(store.images()) == ["r/a:1"]


def test_the_running_byte_count_matches_the_serialised_maps() -> None:
    store = ParamsStore(10, max_entries=50)
    assert store.json_size == _json_size(store) == 4
    for i in range(200):
        image = f"reg.example/t{i % 70}/s{i % 13}:v{i % 5}"
        if i % 11 == 0:
            image = f"reg.example/t{i % 70}@{DIGEST}"
        pairs = AMD_ARM[: 1 + i % 2] if i % 3 else [("linux", "s390x"), ("windows", "amd64")]
        # learned times of 1 to 10 digits; some older than the entry's (cached copies)
        store.record(image, pairs, now=10**(i % 10) + i * 0.1, learned=10**(i % 10) - i % 4)
        if i % 17 == 0:
            store.expire(i * 0.1)
        if i % 23 == 0:
            store.remove(image)
        assert store.json_size == _json_size(store)
    assert len(store) <= 50


def test_bounds_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        ParamsStore(60, max_entries=0)
    with pytest.raises(ValueError, match="max_bytes"):
        ParamsStore(60, max_bytes=3)


# --- dirty / version --------------------------------------------------------------------
def test_dirty_until_the_written_version_is_marked_clean() -> None:
    store = ParamsStore(60)
    assert not store.dirty
    store.record(TAG_A, AMD, now=0)
    assert store.dirty
    version = store.version
    store.mark_clean(version)
    assert not store.dirty
    store.record(TAG_A, AMD, now=1, learned=0)  # a cached copy publishes nothing new
    assert not store.dirty


def test_a_failed_write_keeps_the_store_dirty() -> None:
    store = ParamsStore(60)
    store.record(TAG_A, AMD, now=0)
    _version, _images = store.version, store.images()  # the write fails: no mark_clean
    assert store.dirty


def test_a_record_during_an_in_flight_write_is_not_lost() -> None:
    store = ParamsStore(60)
    store.record(TAG_A, AMD, now=0)
    version, images = store.version, store.images()
    store.record(TAG_B, AMD, now=1)  # while the write is in flight
    store.mark_clean(version)  # the write of `images` succeeded
    assert images == {TAG_A: "linux/amd64"}
    assert store.dirty
    store.mark_clean(store.version)
    assert not store.dirty


def test_expiry_and_eviction_make_the_store_dirty() -> None:
    store = ParamsStore(10, max_entries=1)
    store.record(TAG_A, AMD, now=0)
    store.mark_clean(store.version)
    store.expire(10)
    assert store.dirty and len(store) == 0
    store.record(PINNED, AMD, now=11)
    store.mark_clean(store.version)
    store.record(TAG_B, AMD, now=12)
    assert store.dirty and list(store.images()) == [TAG_B]


# --- adopt ---------------------------------------------------------------------------
def test_adopting_exactly_the_live_object_leaves_the_store_clean() -> None:
    store = ParamsStore(100)
    live = {TAG_A: "linux/amd64,linux/arm64", PINNED: "linux/amd64"}
    assert store.adopt(live, now=1005, learned={TAG_A: 1000}) == 2
    assert store.images() == live and store.learned() == {TAG_A: 1000}
    assert not store.dirty


def test_adopted_entries_keep_their_learned_times() -> None:
    """A restarted controller (or a new leader) does not make entries young again: each
    expires TTL after the time in spec.learned, however often it is adopted."""
    live = {TAG_A: "linux/amd64,linux/arm64", TAG_B: "linux/amd64", PINNED: "linux/amd64"}
    learned = {TAG_A: 1000, TAG_B: 1050}
    first = ParamsStore(100)
    assert first.adopt(live, now=1060, learned=learned) == 3
    second = ParamsStore(100)  # restarted again, 30 s later, from what the first wrote
    assert second.adopt(first.images(), now=1090, learned=first.learned()) == 3
    assert second.expire(1099.9) == 0
    assert second.expire(1100) == 1 and TAG_A not in second
    assert second.expire(1150) == 1 and list(second.images()) == [PINNED]


def test_an_adopted_learned_time_in_the_future_counts_as_now() -> None:
    store = ParamsStore(100)
    assert store.adopt({TAG_A: "linux/amd64"}, now=1000, learned={TAG_A: 9_999_999}) == 1
    assert store.learned() == {TAG_A: 1000}
    assert store.dirty  # the corrected time is written back
    assert store.expire(1100) == 1


def test_a_tag_without_a_learned_time_is_not_adopted() -> None:
    """Unknown age counts as expired (it may be anything up to the object's age); a digest
    needs no learned time."""
    store = ParamsStore(100)
    live = {TAG_A: "linux/amd64", TAG_B: "linux/amd64", PINNED: "linux/amd64"}
    bad: dict[str, object] = {TAG_B: "yesterday"}
    assert store.adopt(live, now=1000, learned=bad) == 1
    assert store.images() == {PINNED: "linux/amd64"} and store.learned() == {}
    assert store.dirty  # the next write drops them from the object
    legacy = ParamsStore(100)
    assert legacy.adopt(live, now=1000) == 1  # an object from before spec.learned


def test_a_tag_already_past_the_ttl_is_not_adopted() -> None:
    store = ParamsStore(20)
    live = {TAG_A: "linux/amd64", TAG_B: "linux/amd64"}
    assert store.adopt(live, now=1000, learned={TAG_A: 980, TAG_B: 981}) == 1
    assert list(store.images()) == [TAG_B] and store.dirty


def test_adopt_drops_malformed_entries_and_normalises_values() -> None:
    store = ParamsStore(100)
    live: dict[str, object] = {
        TAG_A: "linux/arm64,linux/amd64,linux/arm64",
        TAG_B: "linux/AMD64",
        "r/x:1": "linux",
        "r/y:1": 42,
        "Not A Reference": "linux/amd64",
        PINNED: "linux/amd64",
    }
    learned = dict.fromkeys([TAG_A, TAG_B, "r/x:1", "r/y:1"], 0)
    assert store.adopt(live, now=0, learned=learned) == 2
    assert store.images() == {TAG_A: "linux/amd64,linux/arm64", PINNED: "linux/amd64"}
    assert store.dirty


def test_a_learned_item_without_its_image_makes_the_store_dirty() -> None:
    store = ParamsStore(100)
    assert store.adopt({TAG_A: "linux/amd64"}, now=10,
                       learned={TAG_A: 10, TAG_B: 10}) == 1
    assert store.learned() == {TAG_A: 10} and store.dirty


def test_adopted_entries_are_older_than_recorded_ones_for_the_bounds() -> None:
    store = ParamsStore(100, max_entries=3)
    store.record(TAG_A, AMD_ARM, now=10)
    live = {TAG_A: "linux/amd64", TAG_B: "linux/amd64", PINNED: "linux/amd64",
            "r/z:1": "linux/amd64"}
    learned = {TAG_A: 15, TAG_B: 5, "r/z:1": 8}
    assert store.adopt(live, now=20, learned=learned) == 2
    # the store's own value wins; the bound evicts adopted entries first, oldest first
    assert store.images() == {TAG_A: "linux/amd64,linux/arm64", PINNED: "linux/amd64",
                              "r/z:1": "linux/amd64"}
    assert store.learned() == {TAG_A: 10, "r/z:1": 8}
    assert store.expire(108) == 1 and "r/z:1" not in store
    assert store.expire(110) == 1
    assert store.images() == {PINNED: "linux/amd64"}
