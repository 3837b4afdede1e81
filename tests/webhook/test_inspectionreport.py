"""The webhook's inspection report writer (webhook.inspectionreport): what it notes from the
place cache, what one write sends (a merge patch of its own key, the stale keys of gone
replicas removed), its bounds and its errors. The API is a recorder: the real API server
path is tests/test_admission_paths_realcluster.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, Platform
from podplacement.kubeclient import ApiError, NotFound
from podplacement.rules.admit.inspectionreport import MAX_REPORT_ENTRIES, REPORT_CONFIGMAP
from podplacement.webhook.inspectionreport import InspectionReport, report_path
from podplacement.webhook.placecache import PlaceCache

NOW = 1_767_225_600.0
DIGEST = "sha256:" + "ab" * 32


class Api:
    """Records requests; answers with the ConfigMap holding ``others`` and what was sent."""

    def __init__(self, others: dict[str, str] | None = None) -> None:
        self.sent: list[tuple[str, str, Any]] = []
        self.others = others or {}
        self.fail: Exception | None = None

    async def request(self, method: str, path: str, *, body: Any = None,
                      **_: Any) -> dict[str, Any]:
        self.sent.append((method, path, body))
        if self.fail is not None:
            raise self.fail
        return {"metadata": {"name": REPORT_CONFIGMAP},
                "data": {**self.others, **{k: v for k, v in body["data"].items() if v}}}


def _info(ref: str, fetched: float = NOW - 5) -> ImageInfo:
    return ImageInfo(ref, DIGEST, "", (Platform("linux", "amd64"),), fetched)


def _report(api: Api, clock: list[float]) -> InspectionReport:
    return InspectionReport(api, "podplacement-system", "webhook-a",  # type: ignore[arg-type]
                            ttl=lambda: 3600.0, clock=lambda: clock[0], window=90.0)


async def test_a_write_patches_its_own_key_with_what_the_place_cache_stored_and_served(
) -> None:
    api, clock = Api({"gone": json.dumps({"v": 1, "written": NOW - 600, "images": {}}),
                      "newer": json.dumps({"v": 9, "images": {}})}), [NOW]
    report = _report(api, clock)
    cache = PlaceCache(object(), on_result=report.note, clock=lambda: clock[0])  # type: ignore[arg-type]
    cache.store("reg.example/a:v1", _info("reg.example/a:v1"))
    assert await report.write()
    method, path, body = api.sent[-1]
    assert (method, path) == ("PATCH", report_path("podplacement-system"))
    assert set(body["data"]) == {"webhook-a"}  # only its own key
    doc = json.loads(body["data"]["webhook-a"])
    assert doc["images"] == {"reg.example/a:v1": ["linux/amd64", DIGEST, int(NOW - 5)]}
    # the next write removes the gone replica's key (written 10 minutes ago), not the
    # newer webhook's
    assert await report.write()
    assert api.sent[-1][2]["data"]["gone"] is None and "newer" not in api.sent[-1][2]["data"]


def test_noting_the_same_answer_again_changes_nothing() -> None:
    report = _report(Api(), [NOW])
    report.note("r/a:1", _info("r/a:1"))
    report._changed = False
    report.note("r/a:1", _info("r/a:1"))  # a cache hit: same registry answer
    assert not report._changed
    report.note("r/a:1", _info("r/a:1", fetched=NOW - 1))  # a newer answer
    assert report._changed
    report.note("r/x:1", ValueError("not a result"))
    report.note("r/y:1", ImageInfo("r/y:1", DIGEST, "", (), NOW))  # nothing to publish
    long = "r/" + "a" * 600 + ":1"  # longer than the controller reads
    report.note(long, _info(long))
    assert len(report) == 1


async def test_bounds_window_and_ttl() -> None:
    clock = [NOW]
    report = _report(Api(), clock)
    for i in range(MAX_REPORT_ENTRIES + 10):
        report.note(f"r/i{i}:1", _info(f"r/i{i}:1"))
    assert len(report) == MAX_REPORT_ENTRIES
    clock[0] = NOW + 91  # noted longer ago than the window
    report.note("r/new:1", _info("r/new:1", fetched=NOW + 90))
    assert await report.write()
    assert len(report) == 1
    clock[0] = NOW + 90 + 3600  # answered a cacheTTL ago
    assert report._expiring()


async def test_errors_are_logged_once_and_never_raised(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    api = Api()
    report = _report(api, [NOW])
    report.note("r/a:1", _info("r/a:1"))
    api.fail = NotFound(404, "NotFound", "configmaps not found")
    with caplog.at_level(logging.WARNING):
        assert not await report.write()
        assert not await report.write()
    assert sum("not found" in r.message for r in caplog.records) == 1
    assert report._changed  # written again later
    api.fail = ApiError(403, "Forbidden", "no")
    assert not await report.write()
    api.fail = None
    assert await report.write() and report.writes == 1


def test_a_key_that_is_not_a_configmap_key_is_refused() -> None:
    with pytest.raises(ValueError):
        InspectionReport(Api(), "ns", "a/b", ttl=lambda: 1.0)  # type: ignore[arg-type]


async def test_a_failed_write_is_retried_with_a_backoff() -> None:
    api, clock = Api(), [NOW]
    report = _report(api, clock)
    report.note("r/a:1", _info("r/a:1"))
    api.fail = NotFound(404, "NotFound", "configmaps not found")  # the leader creates it soon
    assert not await report.write()
    assert report._backoff == report.interval
    assert not await report.write()
    assert report._backoff == 2 * report.interval
    for _ in range(10):
        await report.write()
    assert report._backoff == 30.0  # bounded
    api.fail = None
    assert await report.write() and report._backoff == 0.0
    doc = json.loads(api.sent[-1][2]["data"]["webhook-a"])
    assert "r/a:1" in doc["images"]  # what was noted while it failed is sent whole
