"""The metrics added for the Grafana dashboard (docs/reference/labels-events-metrics.md):
``podplacement_placed_at_admission_total{path}`` counts each pod placed at admission once, by
a path from a closed set (a forged record's path adds no label value), never a controller's
decision nor a relist's old pod; ``podplacement_params_evictions_total`` counts the entries
the catalog's bounds drop (not expiry); ``podplacement_params_bytes`` is the catalog's size;
``podplacement_oldest_gated_pod_seconds`` the oldest gated pod's age."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families

from podplacement.controller.admissionfeed import AdmissionFeed
from podplacement.controller.metrics import Metrics
from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.config import DECISION_ANNOTATION, PlacementConfig
from tests.controller.test_admissionfeed import T_NOW, Events, _by_controller, _placed

IMAGE = "registry.test/dash/app:v1"


def _feed(listing: bool = False) -> tuple[AdmissionFeed, Metrics]:
    metrics = Metrics()
    adopted = asyncio.Event()
    adopted.set()
    feed = AdmissionFeed(
        store=ParamsStore(3600), inspector=lambda: None, publish=lambda image, result: None,
        publishing=lambda: False, config_source=lambda: (PlacementConfig(), None),
        events=Events(), metrics=metrics,  # type: ignore[arg-type]
        listing=lambda: listing, adopted=adopted, clock=lambda: T_NOW)
    return feed, metrics


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_each_pod_placed_at_admission_counts_once_by_its_path() -> None:
    feed, metrics = _feed()
    pod = _placed("u1", IMAGE)
    path = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])["path"]
    feed.on_pod("ADDED", pod, None)
    feed.on_pod("MODIFIED", pod, None)  # only ADDED: a pod enters the selector once
    feed.on_pod("ADDED", _by_controller("u2", IMAGE), None)  # the controller's: no path
    assert _samples(metrics, "podplacement_placed_at_admission_total") == {
        (("path", path),): 1.0}


def test_a_forged_path_adds_no_label_value() -> None:
    feed, metrics = _feed()
    forged = _by_controller("u3", IMAGE)
    record = json.loads(forged["metadata"]["annotations"][DECISION_ANNOTATION])
    forged["metadata"]["annotations"][DECISION_ANNOTATION] = json.dumps(
        {**record, "path": "x" * 200})
    feed.on_pod("ADDED", forged, None)
    assert _samples(metrics, "podplacement_placed_at_admission_total") == {}


def test_a_relists_old_pods_are_not_counted_again() -> None:
    feed, metrics = _feed(listing=True)
    old = _placed("u4", IMAGE, created="2020-01-01T00:00:00Z")
    feed.on_pod("ADDED", old, None)
    assert _samples(metrics, "podplacement_placed_at_admission_total") == {}
    # a recent pod of the same relist counts
    feed.on_pod("ADDED", _placed("u5", IMAGE), None)
    assert sum(_samples(metrics, "podplacement_placed_at_admission_total").values()) == 1.0


def test_evictions_count_what_the_bounds_drop_and_bytes_the_catalog_size() -> None:
    store = ParamsStore(3600, max_entries=2)
    for i in range(5):
        store.record(f"registry.test/app:v{i}", [("linux", "amd64")], T_NOW)
    assert len(store) == 2 and store.evictions == 3
    store.expire(T_NOW + 7200)  # expiry by age is not an eviction
    assert store.evictions == 3
    metrics = Metrics()
    metrics.sources.catalog = lambda: (store.json_size, store.evictions)
    metrics.sources.oldest_gated = lambda: 12.5
    assert _samples(metrics, "podplacement_params_evictions_total") == {(): 3.0}
    assert _samples(metrics, "podplacement_params_bytes") == {(): float(store.json_size)}
    assert _samples(metrics, "podplacement_oldest_gated_pod_seconds") == {(): 12.5}
