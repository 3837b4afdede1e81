"""Fuzzing /mutate: random, truncated and garbage bodies and wrong types in every field of a
recorded AdmissionReview never give a 5xx, a crash or a denial."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podplacement.rules.config import PlacementConfig, PlatformWeight, TopologyConfig
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import StaticConfigSource
from tests.webhook.asgi import asgi_post
from tests.webhook.reference import RAW_CASES, raw_body

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# Preferred platforms and NUMA on, so every gating rule is exercised.
CONFIG = PlacementConfig(preferred_platforms=(PlatformWeight("arm64", 10),),
                         topology=TopologyConfig(enabled=True))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    # raise_server_exceptions: an exception escaping the app fails the test (not just a 500).
    with TestClient(create_app(StaticConfigSource(CONFIG)), raise_server_exceptions=True) as c:
        yield c


def check(client: TestClient, content: bytes) -> None:
    resp = client.post("/mutate", content=content)
    assert resp.status_code in (200, 400), resp.text
    body = resp.json()
    if resp.status_code == 200:
        assert body["response"]["allowed"] is True
        assert isinstance(body["response"]["uid"], str)
    else:
        assert isinstance(body["error"], str) and body["error"]


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path (dict keys / list indexes) in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from paths(value, (*prefix, i))


REVIEWS = {case: json.loads(raw_body(case)) for case in RAW_CASES}
ALL_PATHS = [(case, p) for case, doc in REVIEWS.items() for p in paths(doc)]


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(client: TestClient, content: bytes) -> None:
    check(client, content)


@FUZZ
@given(st.sampled_from(sorted(RAW_CASES)), st.integers(min_value=0, max_value=6000))
def test_truncated_bodies(client: TestClient, case: str, cut: int) -> None:
    check(client, raw_body(case)[:cut])


@FUZZ
@given(json_values)
def test_garbage_json(client: TestClient, value: Any) -> None:
    check(client, json.dumps(value).encode())


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(ALL_PATHS), json_values, st.booleans())
def test_wrong_type_in_any_field(
    client: TestClient, target: tuple[str, tuple[Any, ...]], value: Any, delete: bool
) -> None:
    case, path = target
    doc = copy.deepcopy(REVIEWS[case])
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    check(client, json.dumps(doc).encode())


WRONG_TYPES: list[Any] = [None, 0, "x", [], {}]


async def test_every_field_with_every_wrong_type() -> None:
    """Deterministic sweep: each field of each recorded review replaced by each JSON type
    (and deleted); hypothesis above samples combinations, this covers every field."""
    app = create_app(StaticConfigSource(CONFIG))
    checked = 0
    for case, path in ALL_PATHS:
        for value in [*WRONG_TYPES, "<delete>"]:
            doc = copy.deepcopy(REVIEWS[case])
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if value == "<delete>":
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
            status, body = await asgi_post(app, json.dumps(doc).encode())
            assert status in (200, 400), (case, path, value, body)
            if status == 200:
                assert body["response"]["allowed"] is True
            checked += 1
    assert checked == len(ALL_PATHS) * (len(WRONG_TYPES) + 1)
    # Odd types are handled by design (400 or treated as absent), not by the catch-all.
    metrics = app.state.metrics
    assert metrics.registry.get_sample_value("podplacement_webhook_errors_total") == 0
    gated = metrics.registry.get_sample_value("podplacement_webhook_gated_pods_total")
    assert gated is not None and 0 < gated < checked
