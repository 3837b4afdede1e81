"""bench/catalogsim.py's model of the two catalog layouts: the flat one it simulates (the
release before's ``spec.images`` + ``spec.learned``) counts the bytes that layout serialises
to, and the dense one is the product's ``ParamsStore``; the densities the docs quote
(docs/benchmarks.md, "The catalog's ceiling") come out of the same functions."""

from __future__ import annotations

import orjson

from bench.catalogsim import (
    NOW,
    PAIRS,
    FlatLRU,
    capacity,
    ceiling,
    reference,
    scale_reference,
    zipf_draws,
)
from podplacement.rules.admit.imageparams import ParamsStore, platforms_value
from podplacement.rules.config import PARAMS_MAX_BYTES


def test_the_flat_model_counts_the_bytes_of_the_flat_maps() -> None:
    refs = [scale_reference(k, 3) for k in range(50)] + [reference(k, 60) for k in range(50)]
    flat = FlatLRU(max_entries=10**9)
    for ref in refs:
        flat.record(ref)
    value = platforms_value(PAIRS)
    images = dict.fromkeys(refs, value)
    learned = dict.fromkeys(refs, int(NOW))
    assert flat.bytes == len(orjson.dumps(images)) + len(orjson.dumps(learned))


def test_the_dense_layout_holds_three_times_the_scale_references() -> None:
    flat_held, flat_bytes, dense_held, dense_bytes = capacity(lambda k: scale_reference(k, 3))
    assert dense_held >= 3 * flat_held and dense_bytes * 3 <= flat_bytes
    assert dense_held * dense_bytes <= PARAMS_MAX_BYTES
    # nothing shared: a little better only
    flat_held, _, dense_held, _ = capacity(lambda k: reference(k, 60))
    assert flat_held < dense_held < 1.2 * flat_held


def test_the_ceiling_is_the_products_store_fed_at_once() -> None:
    refs = [scale_reference(r, 3) for r in zipf_draws(500, 1.1, 3000, 7)]
    hits = ceiling(refs)
    store = ParamsStore(86400.0)
    seen: set[str] = set()
    for ref, hit in zip(refs, hits, strict=True):
        assert hit == (ref in seen)  # 500 tags: nothing is evicted
        seen.add(ref)
        store.record(ref, PAIRS, NOW)
    assert len(store) == len(seen)
