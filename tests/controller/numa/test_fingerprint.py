"""Pod-set fingerprints (podfingerprint pfp0v001)."""

from __future__ import annotations

import struct

import xxhash

from podplacement.rules.numa import pod_fingerprint, pod_hash


def test_fingerprint_by_hand_from_the_algorithm() -> None:
    pods = [("ns2", "b"), ("ns1", "a")]
    hashes = []
    for ns, name in pods:
        seed = xxhash.xxh64(ns.encode()).intdigest()
        hashes.append(xxhash.xxh64(name.encode(), seed=seed).intdigest())
    payload = b"".join(struct.pack("<Q", h) for h in sorted(hashes))
    expected = "pfp0v001" + xxhash.xxh64(payload, seed=0).hexdigest()
    assert pod_fingerprint(pods) == expected
    assert pod_hash("ns1", "a") in hashes


def test_fingerprint_of_no_pods_is_the_hash_of_nothing() -> None:
    assert pod_fingerprint([]) == "pfp0v001ef46db3751d8e999"


def test_fingerprint_ignores_order_and_depends_on_namespace() -> None:
    a = pod_fingerprint([("x", "p1"), ("y", "p2"), ("z", "p3")])
    assert a == pod_fingerprint([("z", "p3"), ("x", "p1"), ("y", "p2")])
    assert a != pod_fingerprint([("y", "p1"), ("x", "p2"), ("z", "p3")])
    assert len(a) == 8 + 16


def test_fingerprint_matches_published_compatibility_vectors() -> None:
    # testdata/compat-tiny-3pods-1ns and compat-small-10pods-3ns of the podfingerprint project
    tiny = [("production", "jaeger-dpgjk"), ("production", "nginx-rt684"),
            ("production", "envoy-g9m22")]
    assert pod_fingerprint(tiny) == "pfp0v001607b76a0e9d3aeb4"
    small = [("analytics", "controller-69dkj"), ("kube-public", "subscriber-tq6v7"),
             ("kube-public", "transformer-hfbng"), ("kube-public", "validator-c6pn5"),
             ("kube-system", "proxy-wszrd"), ("middleware", "processor-jkrl4"),
             ("network", "gateway-vsll5"), ("network", "importer-kzdfr"),
             ("network", "importer-q5vt9"), ("staging", "prometheus-bwgbn")]
    assert pod_fingerprint(small) == "pfp0v001567144e4a561bb5a"
