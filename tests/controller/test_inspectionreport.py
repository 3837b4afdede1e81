"""The webhook's inspection report format (rules.admit.inspectionreport), pure: what a
webhook writes, what the controller accepts of it, and the bounds."""

from __future__ import annotations

import json

from podplacement.imageinspect import ImageInfo, Platform
from podplacement.rules.admit import inspectionreport as ir
from podplacement.rules.learn import LearnedImage

NOW = 1_767_225_600.0
DIGEST = "sha256:" + "ab" * 32


def _info(ref: str = "reg.example/app:v1", fetched: float | None = NOW - 10,
          platforms: tuple[str, ...] = ("linux/arm64", "linux/amd64", "unknown/unknown"),
          digest: str = DIGEST) -> ImageInfo:
    return ImageInfo(ref, digest, "application/vnd.oci.image.index.v1+json",
                     tuple(Platform(*p.split("/")) for p in platforms), fetched)


def test_round_trip_keeps_what_the_catalog_publishes() -> None:
    entry = ir.report_entry(_info())
    assert entry == ("linux/amd64,linux/arm64", DIGEST, int(NOW - 10))
    text, kept = ir.encode_report({"reg.example/app:v1": entry}, NOW)
    assert kept == 1 and json.loads(text)["v"] == ir.REPORT_FORMAT
    report = ir.read_report(text, now=NOW)
    assert isinstance(report, ir.RawReport) and report.written == NOW
    (image, raw), = report.images.items()
    result = ir.reported_result(image, raw, now=NOW, ttl=3600)
    assert result is not None and (result.reference, result.digest, result.fetched_at) == (
        "reg.example/app:v1", DIGEST, NOW - 10)
    assert {(p.os, p.architecture) for p in result.platforms} == {
        ("linux", "amd64"), ("linux", "arm64")}


def test_results_the_catalog_could_not_publish_are_not_reported() -> None:
    assert ir.report_entry(_info(fetched=None)) is None  # no registry answer time
    assert ir.report_entry(_info(platforms=("unknown/unknown",))) is None
    assert ir.report_entry(_info(digest="md5:abc")) is None
    learned = LearnedImage("r", DIGEST, "", (Platform("linux", "amd64"),), (object(),),  # type: ignore[arg-type]
                           NOW)
    assert ir.report_entry(learned) is None  # a platform left out by an exclusion


def test_every_entry_is_validated_like_a_registry_answer() -> None:
    good = ["linux/amd64", DIGEST, int(NOW)]
    images = {
        "reg.example/ok:v1": good,
        "reg.example/future:v1": ["linux/amd64", DIGEST, int(NOW) + 999],  # record caps it
        "reg.example/old:v1": ["linux/amd64", DIGEST, int(NOW) - 7200],  # older than ttl
        "reg.example/pinned@sha256:" + "cd" * 32: ["linux/amd64", DIGEST, int(NOW) - 7200],
        "Not A Reference": good,
        "reg.example/unsorted:v1": ["linux/arm64,linux/amd64", DIGEST, int(NOW)],
        "reg.example/upper:v1": ["linux/AMD64", DIGEST, int(NOW)],
        "reg.example/digest:v1": ["linux/amd64", "sha256:xyz", int(NOW)],
        "reg.example/time:v1": ["linux/amd64", DIGEST, "soon"],
        "reg.example/bool:v1": ["linux/amd64", DIGEST, True],
        "reg.example/short:v1": ["linux/amd64", DIGEST],
    }
    text = json.dumps({"v": 1, "written": NOW, "images": images})
    report = ir.read_report(text, now=NOW)
    assert isinstance(report, ir.RawReport)
    taken = {i for i, raw in report.images.items()
             if ir.reported_result(i, raw, now=NOW, ttl=3600) is not None}
    assert taken == {"reg.example/ok:v1", "reg.example/future:v1",
                     "reg.example/pinned@sha256:" + "cd" * 32}
    assert ir.reported_result("reg.example/absent:v1", None, now=NOW, ttl=3600) is None


def test_a_value_of_another_format_is_ignored_whole_with_a_reason() -> None:
    for text, reason in ((None, "not a string"), ("{", "not JSON"), ("[1]", "not a JSON object"),
                         (json.dumps({"v": 2, "images": {}}), "format '2'"),
                         (json.dumps({"v": 1}), "no images object"),
                         (json.dumps({"v": 1, "images": {}}), "no written time"),
                         ("x" * (ir.MAX_REPORT_BYTES + 1), "over"),
                         (json.dumps({"v": 1, "written": 1, "images": {
                             f"r/i{i}:1": 0 for i in range(ir.MAX_REPORT_ENTRIES + 1)}}),
                          "images, over")):
        got = ir.read_report(text, now=NOW)
        assert isinstance(got, str) and reason in got, (text, got)


def test_the_report_is_bounded_in_entries_and_bytes_newest_kept() -> None:
    entries = {f"reg.example/app-{i:05d}/with/a/long/path/name:v{i}": (
        "linux/amd64,linux/arm64", DIGEST, int(NOW)) for i in range(ir.MAX_REPORT_ENTRIES + 50)}
    text, kept = ir.encode_report(entries, NOW)
    assert len(text) <= ir.MAX_REPORT_BYTES and 0 < kept <= ir.MAX_REPORT_ENTRIES
    last = list(entries)[-1]
    report = ir.read_report(text, now=NOW)
    assert isinstance(report, ir.RawReport) and last in report.images
    assert next(iter(entries)) not in report.images


def test_a_tag_answered_a_cache_ttl_ago_is_not_taken() -> None:
    raw = ["linux/amd64", DIGEST, int(NOW)]
    assert ir.reported_result("r/app:v1", raw, now=NOW + 3599, ttl=3600) is not None
    assert ir.reported_result("r/app:v1", raw, now=NOW + 3600, ttl=3600) is None
    pinned = "r/app@sha256:" + "cd" * 32  # content-addressed: never stale
    assert ir.reported_result(pinned, raw, now=NOW + 10**6, ttl=3600) is not None


def test_keys_and_written_times() -> None:
    assert ir.valid_key("podplacement-webhook-7d9f8-abcde")
    assert not ir.valid_key("a/b") and not ir.valid_key("") and not ir.valid_key("x" * 254)
    assert ir.decode_written(json.dumps({"v": 7, "written": 5})) == 5.0  # any version
    assert ir.decode_written("nope") is None and ir.decode_written(json.dumps([1])) is None
