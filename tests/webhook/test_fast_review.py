"""The selective msgspec decoding of /mutate (webhook.review.parse_review_fast) answers exactly
like the whole-body orjson path, and the fields it keeps cover everything the gating rules and
the patch read."""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.rules.config import PlacementConfig, PlatformWeight, TopologyConfig
from podplacement.webhook import review as review_module
from podplacement.webhook.app import create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.gating import should_gate
from podplacement.webhook.patch import gate_patch
from podplacement.webhook.review import BadReview
from tests.webhook.asgi import asgi_post
from tests.webhook.reference import RAW_CASES, raw_body

pytest.importorskip("msgspec")

# Preferred platforms and NUMA on, so every gating rule is reached.
ALL_RULES = PlacementConfig(preferred_platforms=(PlatformWeight("arm64", 10),),
                            topology=TopologyConfig(enabled=True))
# Preferred platforms without NUMA: every rule but the NUMA ones, on the lean decoder.
PREFERRED_ONLY = PlacementConfig(preferred_platforms=(PlatformWeight("arm64", 10),))
REVIEWS = {case: json.loads(raw_body(case)) for case in RAW_CASES}


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


def fast_path_takes(body: bytes) -> bool:
    """True when the fast path answers ``body`` (decodes it) instead of declining it."""
    try:
        return review_module.parse_review_fast(body) is not None
    except BadReview:
        return True


class Answers:
    """Posts a body to one app twice, through the fast path and with it switched off."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, config: PlacementConfig) -> None:
        self.monkeypatch = monkeypatch
        self.decoder = review_module._REVIEW_DECODER
        self.app = create_app(StaticConfigSource(config), own_namespace="podplacement-system")
        self.fast_taken = 0

    async def both(self, body: bytes) -> tuple[tuple[int, Any], tuple[int, Any]]:
        self.monkeypatch.setattr(review_module, "_REVIEW_DECODER", self.decoder)
        self.fast_taken += fast_path_takes(body)
        fast = await asgi_post(self.app, body)
        self.monkeypatch.setattr(review_module, "_REVIEW_DECODER", None)
        slow = await asgi_post(self.app, body)
        return fast, slow


def test_recorded_reviews_take_the_fast_path() -> None:
    for case in RAW_CASES:
        parsed = review_module.parse_review_fast(raw_body(case))
        assert parsed is not None, case
        api_version, request = parsed
        assert api_version == REVIEWS[case]["apiVersion"]
        assert request["uid"] == REVIEWS[case]["request"]["uid"]
        # managedFields and the like are not decoded at all.
        assert "managedFields" not in request["object"]["metadata"]


@pytest.mark.parametrize(
    "body",
    [
        b"", b"{not json", b"[]", b"null", b"{}", b'{"request": null}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}',
        # Non-ASCII: declined by the fast path (it does not check skipped UTF-8).
        raw_body("a-plain-pod").replace(b'"refcap"', '"réf"'.encode()),
        raw_body("a-plain-pod").replace(b'"refcap"', b'"\xff"'),
        # Duplicate keys: the last one wins on both paths.
        raw_body("a-plain-pod").replace(b'"operation":"CREATE"',
                                        b'"operation":"CREATE","operation":"UPDATE"'),
        raw_body("a-plain-pod").replace(b'"operation":"CREATE"',
                                        b'"operation":"UPDATE","operation":"CREATE"'),
        raw_body("a-plain-pod").replace(b'"refcap"', b'"\\ud800"'),
        raw_body("a-plain-pod") + b" x",
        raw_body("a-plain-pod")[:-1] + b",}",
    ],
)
async def test_odd_bodies_get_the_same_answer(
    monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    answers = Answers(monkeypatch, ALL_RULES)
    fast, slow = await answers.both(body)
    assert fast == slow


@pytest.mark.parametrize("config", [ALL_RULES, PREFERRED_ONLY], ids=["numa-on", "numa-off"])
async def test_every_field_with_every_type_gets_the_same_answer(
    monkeypatch: pytest.MonkeyPatch, config: PlacementConfig
) -> None:
    """Each field of each recorded review replaced by each JSON type (and deleted), under a
    config with every rule on (and one without NUMA placement, which takes the lean
    decoder): the fast path answers exactly like the orjson path."""
    answers = Answers(monkeypatch, config)
    outcomes: set[tuple[int, bool]] = set()
    checked = 0
    for case, doc in REVIEWS.items():
        for path in paths(doc):
            values: list[Any] = [None, 0, "x", [], {}, {"a": [1]}, True, "<delete>"]
            for value in values:
                changed = copy.deepcopy(doc)
                parent = changed
                for key in path[:-1]:
                    parent = parent[key]
                if value == "<delete>":
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = value
                fast, slow = await answers.both(json.dumps(changed).encode())
                assert fast == slow, (case, path, value)
                outcomes.add((fast[0], "patch" in fast[1].get("response", {})))
                checked += 1
    # The sweep reached gated, admitted-unchanged and rejected answers, mostly on the fast path.
    assert outcomes == {(200, True), (200, False), (400, False)}
    assert answers.fast_taken > checked // 2


class Recording(dict[str, Any]):
    """A dict that records the path of every key read through it (and through the dicts and
    lists it hands out); list indexes are recorded as ``[]``."""

    def __init__(self, data: dict[str, Any], path: tuple[str, ...], seen: set[tuple[str, ...]]):
        super().__init__(data)
        self.path, self.seen = path, seen

    def _wrap(self, key: str, value: Any) -> Any:
        return wrap(value, (*self.path, key), self.seen)

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add((*self.path, key))
        return self._wrap(key, super().get(key, default))

    def __getitem__(self, key: str) -> Any:
        self.seen.add((*self.path, key))
        return self._wrap(key, super().__getitem__(key))

    def __contains__(self, key: object) -> bool:
        self.seen.add((*self.path, str(key)))
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        self.seen.add((*self.path, "*"))
        return super().__iter__()

    def items(self) -> Any:
        self.seen.add((*self.path, "*"))
        return [(k, self._wrap(k, v)) for k, v in super().items()]


def wrap(value: Any, path: tuple[str, ...], seen: set[tuple[str, ...]]) -> Any:
    if isinstance(value, dict) and not isinstance(value, Recording):
        return Recording(value, path, seen)
    if isinstance(value, list):
        return [wrap(item, (*path, "[]"), seen) for item in value]
    return value


def kept_paths(
    td: Any, prefix: tuple[str, ...] = ()
) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """``(objects, subtrees)``: paths of the fast path's TypedDicts whose listed keys only
    are kept, and paths of fields typed Any, kept whole with everything below them."""
    objects: set[tuple[str, ...]] = {prefix}
    subtrees: set[tuple[str, ...]] = set()
    for name, hint in typing.get_type_hints(td).items():
        path = (*prefix, name)
        if hint is Any:
            subtrees.add(path)
            continue
        objects.add(path)
        for arg in typing.get_args(hint):
            if typing.is_typeddict(arg):
                more = kept_paths(arg, path)
            elif typing.get_origin(arg) is list:
                (item,) = typing.get_args(arg)
                objects.add((*path, "[]"))
                more = kept_paths(item, (*path, "[]"))
            else:
                continue
            objects |= more[0]
            subtrees |= more[1]
    return objects, subtrees


def covered(path: tuple[str, ...], kept: tuple[set[tuple[str, ...]], set[tuple[str, ...]]]) -> bool:
    objects, subtrees = kept
    return path in objects or any(path[:n] in subtrees for n in range(1, len(path) + 1))


@pytest.mark.parametrize(
    "configs",
    [[ALL_RULES, PlacementConfig(topology=TopologyConfig(enabled=True))],
     [PREFERRED_ONLY, PlacementConfig()]],
    ids=["numa-on", "numa-off"],
)
def test_gating_and_patch_read_only_the_decoded_fields(configs: list[PlacementConfig]) -> None:
    """Guards the TypedDicts: a new rule that reads a pod field they drop would see it as
    absent on the fast path; this fails first."""
    kept = kept_paths(review_module._Pod)
    seen: set[tuple[str, ...]] = set()
    pods = [doc["request"]["object"] for doc in REVIEWS.values()]
    for pod in pods:
        for config in configs:
            recording = wrap(copy.deepcopy(pod), (), seen)
            should_gate(recording, namespace="default", config=config,
                        own_namespace="podplacement-system")
            gate_patch(recording)
    # The deepest rule was reached: the gates were read item by item.
    assert ("spec", "schedulingGates") in seen
    assert [p for p in sorted(seen) if not covered(p, kept)] == []


def test_the_lean_decoder_drops_what_the_rules_do_not_read() -> None:
    body = raw_body("a-plain-pod")
    _, lean = review_module.parse_review(body)
    spec = lean["object"]["spec"]
    assert "containers" not in spec and "affinity" not in spec
    assert lean["object"]["metadata"]["labels"] == {}
