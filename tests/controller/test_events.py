"""Event bodies follow the shapes the real server accepts (reference/events.json)."""

from __future__ import annotations

import datetime as dt
import re

from podplacement.controller.events import REPORTING_CONTROLLER, event_body
from podplacement.rules.place.decision import EventSpec

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7"}}
NOW = dt.datetime(2026, 11, 22, 5, 55, 15, 0, tzinfo=dt.UTC)


def test_events_k8s_io_body_has_the_required_fields() -> None:
    body = event_body(
        POD, EventSpec("Warning", "NoSupportedPlatform", "x" * 2000), instance="i-0", now=NOW
    )
    assert body["apiVersion"] == "events.k8s.io/v1"
    # MicroTime must carry microseconds even when they are zero (400 otherwise)
    assert body["eventTime"] == "2026-11-22T05:55:15.000000Z"
    assert body["reportingController"] == REPORTING_CONTROLLER and body["action"] == "Place"
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "u",
        "resourceVersion": "7",
    }
    assert len(body["note"]) <= 1000  # the server rejects notes over 1 kB
    assert body["metadata"]["namespace"] == "ns"
    assert re.fullmatch(r"p\.[0-9a-f]{16}", body["metadata"]["name"])


def test_core_v1_body_uses_involved_object_and_counts() -> None:
    body = event_body(
        POD, EventSpec("Normal", "PlacementDecided", "ok"), instance="i-0", now=NOW, api="v1"
    )
    assert body["involvedObject"]["name"] == "p" and body["count"] == 1
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-11-22T05:55:15Z"
    assert body["type"] == "Normal" and body["message"] == "ok"
