"""The params object's content (rules.admit.imageparams): TTL of tag references counted from
when a registry answered (not from the last record, not from a restart), digest references
kept, LRU bounds by entries and by JSON bytes of spec.images plus spec.learned, canonical
values, malformed input skipped, adoption of a live object with its ages, and the
dirty/version protocol a writer relies on. Times are explicit unix seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from podplacement.rules.admit.imageparams import (
    CODE_MAX_LENGTH,
    ParamsStore,
    flat_catalog,
    is_pinned,
    platform_set,
    platforms_value,
    set_code,
    split_reference,
)
from podplacement.rules.config import (
    PARAMS_LEGACY_MAX_ENTRIES,
    PARAMS_MAX_BYTES,
    PARAMS_MAX_ENTRIES,
    PARAMS_MAX_SETS,
)

ROOT = Path(__file__).resolve().parents[2]

DIGEST = "sha256:" + "ab" * 32
TAG_A = "registry.example:5000/team/a:v1"
TAG_B = "registry.example:5000/team/b:v1"
PINNED = f"registry.example:5000/team/c@{DIGEST}"
AMD = [("linux", "amd64")]
AMD_ARM = [("linux", "arm64"), ("linux", "amd64")]


def _json_size(store: ParamsStore) -> int:
    return sum(len(orjson.dumps(m)) for m in store.catalog().values())


def _size_of(*records: tuple[str, list[tuple[str, str]], float]) -> int:
    """The catalog's JSON bytes holding exactly these (image, pairs, now) records."""
    store = ParamsStore(10**12)
    for image, pairs, now in records:
        store.record(image, pairs, now=now)
    assert store.json_size == _json_size(store)
    return store.json_size


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
    store = ParamsStore(60, max_bytes=_size_of(*((f"r/i-{i:02d}:1", AMD, i) for i in range(3))))
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


def test_the_byte_bound_holds_for_the_json_of_the_three_maps() -> None:
    # room for exactly three such entries
    bound = _size_of(*((f"r/i-{i:02d}:1", AMD, i) for i in range(3)))
    store = ParamsStore(60, max_bytes=bound)
    for i in range(3):
        store.record(f"r/i-{i:02d}:1", AMD, now=i)
    assert len(store) == 3 and store.json_size == _json_size(store) == bound
    store.record("r/i-03:1", AMD, now=3)
    assert sorted(store.images()) == ["r/i-01:1", "r/i-02:1", "r/i-03:1"]
    # a new platform set (its item) for the most recent entry pushes out the least recent
    # ones; the set nobody uses any more goes with them
    store.record("r/i-03:1", AMD_ARM, now=4)
    assert sorted(store.images()) == ["r/i-03:1"]
    assert store.catalog()["platformSets"] == {"b": platform_set("linux/amd64,linux/arm64")}
    assert store.json_size == _json_size(store) <= bound


def test_the_learned_times_count_in_the_byte_bound() -> None:
    """Two tag entries fit without their spec.learnedAt items, not with both; a digest
    entry has no learned item."""
    tag_1, tag_2 = "r/aaaa:1", "r/bbbb:1"
    both = _size_of((tag_1, AMD, 1_700_000_000), (tag_2, AMD, 1_700_000_001))
    store = ParamsStore(60, max_bytes=both - len(",\"r/aaaa\":{\":1\":1700000000}"))
    store.record(tag_1, AMD, now=1_700_000_000)
    store.record(tag_2, AMD, now=1_700_000_001)
    assert list(store.images()) == [tag_2]
    assert store.json_size == _json_size(store) <= store.max_bytes
    pinned = ParamsStore(60, max_bytes=_size_of((PINNED, AMD, 0)))
    pinned.record(PINNED, AMD, now=0)
    assert len(pinned) == 1 and pinned.learned() == {}
    assert pinned.json_size == _json_size(pinned) == pinned.max_bytes


def test_an_entry_larger_than_the_byte_bound_is_not_recorded() -> None:
    store = ParamsStore(60, max_bytes=_size_of(("r/a:1", AMD, 0)) + 20)
    store.record("r/a:1", AMD, now=0)
    assert store.record("r/" + "x" * 60 + ":1", AMD, now=1) is False
    assert list(store.images()) == ["r/a:1"]


def test_the_running_byte_count_matches_the_serialised_maps() -> None:
    store = ParamsStore(10, max_entries=50)
    assert store.json_size == _json_size(store) == 6
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
        ParamsStore(60, max_bytes=5)


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


# --- the dense layout ---------------------------------------------------------------------
def test_a_repository_is_written_once_for_its_tags() -> None:
    store = ParamsStore(60)
    store.record("reg.example:5000/team/a:v1", AMD, now=100)
    store.record("reg.example:5000/team/a:v2", AMD_ARM, now=101)
    store.record(f"reg.example:5000/team/a@{DIGEST}", AMD, now=102)
    store.record("nginx", AMD, now=103)
    assert store.catalog() == {
        "repositories": {"nginx": {"": "a"},
                         "reg.example:5000/team/a": {":v1": "a", ":v2": "b", f"@{DIGEST}": "a"}},
        "platformSets": {"a": platform_set("linux/amd64"),
                         "b": platform_set("linux/amd64,linux/arm64")},
        "learnedAt": {"nginx": {"": 103}, "reg.example:5000/team/a": {":v1": 100, ":v2": 101}},
    }
    assert store.code_of("nginx") == "a" and store.code_of("nginx:1") is None


def test_codes_are_stable_while_used_and_a_set_nobody_uses_goes_away() -> None:
    store = ParamsStore(60)
    store.record("r/a:1", AMD, now=0)
    store.record("r/b:1", AMD_ARM, now=0)
    store.record("r/c:1", [("linux", "s390x")], now=0)
    assert [store.code_of(i) for i in ("r/a:1", "r/b:1", "r/c:1")] == ["a", "b", "c"]
    store.remove("r/b:1")
    assert set(store.catalog()["platformSets"]) == {"a", "c"}
    assert store.code_of("r/a:1") == "a" and store.code_of("r/c:1") == "c"
    store.record("r/d:1", [("linux", "ppc64le")], now=1)  # the first free code again
    assert store.code_of("r/d:1") == "b"
    # a changed value: its old set, used by nobody else, goes; the new one takes the first
    # free code (a code names one set in one written object, never across objects' reads)
    store.record("r/a:1", [("linux", "riscv64")], now=2)
    assert store.code_of("r/a:1") == "a"
    assert store.catalog()["platformSets"]["a"]["platforms"] == "linux/riscv64"
    assert len(store.catalog()["platformSets"]) == 3


@pytest.mark.parametrize("seed", range(6))
def test_the_running_byte_count_is_exact_after_random_operations(seed: int) -> None:
    """Records (new, changed, older, newer), touches, removals, expiry, evictions by both
    bounds and a clock set back: the running count is the serialised size of the three maps
    after every step, within the bound, and the catalog reads back flat as the store."""
    import random

    rng = random.Random(seed)
    sets = [AMD, AMD_ARM, [("linux", "s390x")], [("windows", "amd64"), ("linux", "arm64")]]
    store = ParamsStore(100, max_entries=rng.choice([5, 50, 1000]),
                        max_bytes=rng.choice([300, 2000, 100_000]))
    now = 1_700_000_000.0
    for _ in range(600):
        now += rng.random() * 3 - (40 if rng.random() < 0.01 else 0)
        k = rng.randrange(60)
        image = rng.choice([f"reg.example:5000/r{k % 7}:t{k}", f"r{k % 5}",
                            f"r{k % 3}@sha256:{k:064x}", f"a/b{k % 4}:x{k}@sha256:{k:064x}"])
        op = rng.random()
        if op < 0.6:
            store.record(image, rng.choice(sets), now, learned=now - rng.random() * 50)
        elif op < 0.7:
            store.remove(image)
        elif op < 0.8:
            store.expire(now)
        else:
            store.touch(image)
        assert store.json_size == _json_size(store) <= store.max_bytes
    assert flat_catalog(store.catalog()) == (store.images(), store.learned())


def test_adopting_the_dense_object_it_wrote_keeps_codes_and_stays_clean() -> None:
    store = ParamsStore(3600)
    store.record("r/a:1", AMD, now=100)
    store.record("r/b:1", AMD_ARM, now=100)
    store.record("r/c@" + DIGEST, [("linux", "s390x")], now=100)
    store.remove("r/a:1")  # code "a" free: the live codes are kept, not renumbered
    spec = store.catalog()
    again = ParamsStore(3600)
    assert again.adopt_spec(spec, now=200) == 2
    assert again.catalog() == spec and not again.dirty


def test_adopting_the_flat_object_of_the_release_before_keeps_it_and_rewrites_it() -> None:
    """An in-place upgrade: the flat spec.images/spec.learned are adopted with their ages,
    and the store is dirty so that the next write is the dense layout."""
    spec = {"images": {TAG_A: "linux/amd64", PINNED: "linux/amd64,linux/arm64"},
            "learned": {TAG_A: 150}}
    store = ParamsStore(3600)
    assert store.adopt_spec(spec, now=200) == 2
    assert store.images() == spec["images"] and store.learned() == spec["learned"]
    assert store.dirty


@pytest.mark.parametrize("spec", [
    # a repository and suffix that do not split back so (the tag in the repository)
    {"repositories": {"r/a:1": {"": "a"}}, "platformSets": {"a": {"platforms": "linux/amd64"}},
     "learnedAt": {"r/a:1": {"": 150}}},
    # a code with no set, and a set nobody uses
    {"repositories": {"r/a": {":1": "z"}}, "platformSets": {"a": {"platforms": "linux/amd64"}},
     "learnedAt": {"r/a": {":1": 150}}},
    # a set that is not canonical
    {"repositories": {"r/a": {":1": "a"}},
     "platformSets": {"a": {"platforms": "linux/arm64,linux/amd64"}},
     "learnedAt": {"r/a": {":1": 150}}},
    # a learned time for a digest
    {"repositories": {"r/a": {"@" + DIGEST: "a"}},
     "platformSets": {"a": {"platforms": "linux/amd64"}}, "learnedAt": {"r/a": {"@" + DIGEST: 1}}},
    # a code that is not one
    {"repositories": {"r/a": {":1": "A1"}}, "platformSets": {"A1": {"platforms": "linux/amd64"}},
     "learnedAt": {"r/a": {":1": 150}}},
])
def test_an_adopted_object_not_in_canonical_form_is_rewritten(spec: dict[str, Any]) -> None:
    store = ParamsStore(3600)
    store.adopt_spec(spec, now=200)
    assert store.dirty
    assert all(split_reference(i) for i in store.images())
    for image in store.images():
        repo, suffix = split_reference(image)
        assert store.catalog()["repositories"][repo][suffix] == store.code_of(image)


def test_the_crd_bounds_are_the_configured_ones() -> None:
    """maxProperties of every map of the catalog in the CRD are rules/config.py's (the
    byte bound binds first), the codes' pattern and length are the store's."""
    crd = yaml.safe_load((ROOT / "deploy/crds/imageplatformcatalog.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    for name in ("repositories", "learnedAt"):
        assert props[name]["maxProperties"] == PARAMS_MAX_ENTRIES
        assert props[name]["additionalProperties"]["maxProperties"] == PARAMS_MAX_ENTRIES
        assert props[name]["x-kubernetes-map-type"] == "atomic"
    assert props["platformSets"]["maxProperties"] == PARAMS_MAX_SETS
    code = props["repositories"]["additionalProperties"]["additionalProperties"]
    assert code["maxLength"] == CODE_MAX_LENGTH and code["pattern"] == "^[a-z]{1,8}$"
    assert len(set_code(PARAMS_MAX_SETS)) <= CODE_MAX_LENGTH
    for name in ("images", "learned"):
        assert props[name]["maxProperties"] == PARAMS_LEGACY_MAX_ENTRIES
    # the smallest tag entry (a one-character tag, a one-letter code, a ten-digit time) is
    # more than PARAMS_MAX_BYTES / PARAMS_MAX_ENTRIES bytes: the byte bound binds first
    smallest = len(',":1":"a"') + len(',":1":1700000000')
    assert smallest * PARAMS_MAX_ENTRIES > PARAMS_MAX_BYTES


def test_a_set_beyond_the_crd_bound_is_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    from podplacement.rules.admit import imageparams

    monkeypatch.setattr(imageparams, "PARAMS_MAX_SETS", 2)
    store = ParamsStore(60)
    assert store.record("r/a:1", AMD, now=0) and store.record("r/b:1", AMD_ARM, now=0)
    assert store.record("r/c:1", [("linux", "s390x")], now=0) is False
    assert store.record("r/c:1", AMD, now=0) is True  # an existing set
    assert len(store.catalog()["platformSets"]) == 2


def test_set_codes_are_short_and_distinct() -> None:
    codes = [set_code(n) for n in range(1000)]
    assert codes[:3] == ["a", "b", "c"] and codes[25] == "z" and codes[26] == "aa"
    assert len(set(codes)) == 1000 and max(map(len, codes)) == 3


def test_a_platform_set_carries_what_the_policy_reads_of_it() -> None:
    """The per-set facts: pairs, archs, the linux flag and, for a linux set, the decision's
    texts exactly as the controller's record writes them (the offline CEL checks compare
    whole decisions; this pins the item)."""
    assert platform_set("linux/amd64,linux/arm64") == {
        "platforms": "linux/amd64,linux/arm64", "pairs": ["linux/amd64", "linux/arm64"],
        "archs": ["amd64", "arm64"], "linux": True,
        "head": ',"platforms":["linux/amd64","linux/arm64"],"oses":["linux"],'
                '"archs":["amd64","arm64"]',
        "tail": ',"result":"set","reason":"required architectures amd64, arm64"'}
    assert platform_set("linux/arm64,windows/amd64") == {
        "platforms": "linux/arm64,windows/amd64", "pairs": ["linux/arm64", "windows/amd64"],
        "archs": ["arm64", "amd64"], "linux": False}
