"""Pod-set fingerprints as NRT publishers compute them (k8stopologyawareschedwg/podfingerprint,
version ``pfp0v001``).

Each pod is hashed as ``xxh64(name, seed=xxh64(namespace))``; the hashes are sorted and their
little-endian 8-byte encodings are hashed again with xxh64 (seed 0). The fingerprint is
``"pfp0v001"`` followed by that digest in hex. NRTs carry it in the
``nodeTopologyPodsFingerprint`` attribute, with ``nodeTopologyPodsFingerprintMethod`` naming the
pods counted (``all``, ``with-exclusive-resources``, ``exclude-terminal``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

import xxhash

from podplacement.rules.numa._quantity import is_hugepages, is_native
from podplacement.rules.podspec import CPU, GUARANTEED, MEMORY, ContainerRequests

PREFIX = "pfp0"
VERSION = "v001"
METHOD_ALL = "all"
METHOD_WITH_EXCLUSIVE_RESOURCES = "with-exclusive-resources"
METHOD_EXCLUDE_TERMINAL = "exclude-terminal"


def pod_hash(namespace: str, name: str) -> int:
    """The 64-bit hash of one pod: xxh64 of the name seeded with xxh64 of the namespace."""
    seed = xxhash.xxh64_intdigest(namespace.encode())
    return int(xxhash.xxh64_intdigest(name.encode(), seed=seed))


def pod_fingerprint(pods: Iterable[tuple[str, str]]) -> str:
    """Fingerprint of a set of pods given as ``(namespace, name)`` pairs (order does not matter).

    Example: the empty set gives ``"pfp0v001ef46db3751d8e999"`` (xxh64 of no bytes).
    """
    hashes = sorted(pod_hash(ns, name) for ns, name in pods)
    digest = xxhash.xxh64(b"".join(struct.pack("<Q", h) for h in hashes)).hexdigest()
    return PREFIX + VERSION + digest


def container_is_exclusive(qos: str, requests: Mapping[str, int],
                           nrt_resources: frozenset[str]) -> bool:
    """True when a container holds exclusive resources (scheduler-plugins resourcerequests):
    an extended resource the NRT reports, or for Guaranteed pods whole cpus, memory or
    hugepages."""
    for name, amount in requests.items():
        if not is_native(name):
            if name in nrt_resources:
                return True
            continue
        if qos != GUARANTEED:
            continue
        if name == CPU and amount > 0 and amount % 1000 == 0:
            return True
        if (name == MEMORY or is_hugepages(name)) and amount > 0:
            return True
    return False


def pod_is_exclusive(qos: str, containers: Iterable[ContainerRequests],
                     nrt_resources: frozenset[str]) -> bool:
    """True when an app container or a sidecar holds exclusive resources (plain init
    containers finish and are not counted)."""
    return any(ctr.kind != "init" and container_is_exclusive(qos, ctr.requests, nrt_resources)
               for ctr in containers)
