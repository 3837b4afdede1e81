"""In-flight accounting: pods we ungated towards NUMA candidates count against those nodes
until the node's NodeResourceTopology reflects them (docs/numa.md).

NRTs lag 10-60 s behind the kubelet. Like the scheduler-plugins over-reserve cache, a pod
ungated towards a set of nodes has its effective request subtracted pessimistically from
**every** zone of **every** candidate node (we cannot know the zone the kubelet will pick).
Once bound (``spec.nodeName``), it counts only against that node, until:

* the node's NRT carries a ``nodeTopologyPodsFingerprint`` that matches the pods we know on
  that node (counted as its ``nodeTopologyPodsFingerprintMethod`` says) and that pod set
  includes the pod, or
* an NRT update (a new resourceVersion) arrives after the binding when the NRT has no
  fingerprint (numeric resourceVersions, which kube-apiserver's etcd revisions are, must also
  be newer than the pod's at binding, so an update written earlier but delivered later does
  not count); with a fingerprint that keeps mismatching (we may not see every pod), the
  second update after the binding releases it;
* or the pod is deleted or terminal, or ``max_age_seconds`` passed since it was added.

For fingerprints to match, :meth:`InFlight.observe_pod` must be fed every pod event of the
cluster (or at least of the NUMA nodes), not only the pods this controller gates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podplacement.rules.numa._fingerprint import (
    METHOD_EXCLUDE_TERMINAL,
    METHOD_WITH_EXCLUSIVE_RESOURCES,
    pod_fingerprint,
    pod_is_exclusive,
)
from podplacement.rules.numa._topology import Topology, parse_topology
from podplacement.rules.podspec import (
    CPU,
    ContainerRequests,
    QuantityError,
    iter_containers,
    parse_quantity,
    qos_class,
)

_TERMINAL = ("Succeeded", "Failed")


@dataclass(slots=True)
class _Entry:
    uid: str
    key: str
    requests: dict[str, int]
    nodes: tuple[str, ...]
    added_at: float
    bound_node: str | None = None
    bound_rv: int | None = None
    updates_since_binding: int = 0


@dataclass(slots=True)
class _KnownPod:
    namespace: str
    name: str
    phase: str
    qos: str
    containers: tuple[ContainerRequests, ...] = field(default_factory=tuple)


def _pod_key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    return f"{ns}/{name}", str(meta.get("uid", "")), ns


class InFlight:
    """Pessimistic accounting of pods ungated towards candidate nodes.

    Args:
        max_age_seconds: an entry is dropped this long after :meth:`add` whatever happened
            (bounds the damage of a missed event).
        clock: monotonic time source in seconds (injectable for tests).

    Not thread-safe: use it from the controller's event loop.
    """

    def __init__(self, *, max_age_seconds: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age = max_age_seconds
        self._clock = clock
        self._entries: dict[str, _Entry] = {}  # by pod key "ns/name"
        self._pods_by_node: dict[str, dict[str, _KnownPod]] = {}
        self._node_of_pod: dict[str, str] = {}
        self._nrt_versions: dict[str, str] = {}

    # --- bookkeeping -----------------------------------------------------------------------
    def add(self, pod_uid: str, pod_key: str, requests: Mapping[str, int],
            nodes: Sequence[str]) -> None:
        """Record that pod ``pod_key`` (``namespace/name``) was ungated towards ``nodes``.

        ``requests`` is the pod's effective request (:func:`effective_requests`, cpu in
        millicores). Adding the same key again replaces the entry.
        """
        self._entries[pod_key] = _Entry(pod_uid, pod_key, dict(requests), tuple(nodes),
                                        self._clock())
        bound = self._node_of_pod.get(pod_key)
        if bound:
            self._entries[pod_key].bound_node = bound

    def discard(self, pod_key: str) -> None:
        """Forget a pod (e.g. the ungating PATCH failed)."""
        self._entries.pop(pod_key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, pod_key: object) -> bool:
        return pod_key in self._entries

    def observe_pod(self, pod: Mapping[str, Any], *, deleted: bool = False) -> None:
        """Feed a pod event: binding (``spec.nodeName``), phase change or deletion."""
        key, uid, ns = _pod_key(pod)
        phase = str((pod.get("status") or {}).get("phase", ""))
        entry = self._entries.get(key)
        if entry is not None and uid and entry.uid and uid != entry.uid:
            entry = None  # same name, different pod: the tracked one is gone
            self._entries.pop(key, None)
        if deleted or phase in _TERMINAL:
            self._entries.pop(key, None)
            node = self._node_of_pod.pop(key, None)
            if node is not None:
                self._pods_by_node.get(node, {}).pop(key, None)
            return
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node:
            return
        try:
            known = _KnownPod(ns, key.split("/", 1)[1], phase, qos_class(pod),
                              tuple(iter_containers(pod)))
        except QuantityError:
            known = _KnownPod(ns, key.split("/", 1)[1], phase, "", ())
        previous = self._node_of_pod.get(key)
        if previous is not None and previous != node:  # recreated elsewhere, delete missed
            self._pods_by_node.get(previous, {}).pop(key, None)
        self._pods_by_node.setdefault(node, {})[key] = known
        self._node_of_pod[key] = node
        if entry is not None and entry.bound_node is None:
            entry.bound_node = node
            entry.bound_rv = _int_rv(pod)
            entry.updates_since_binding = 0

    def observe_nrt(self, nrt: Mapping[str, Any], *, topology: Topology | None = None) -> None:
        """Feed an NRT add/update; releases pods the NRT now accounts for. Unreadable NRTs
        are ignored.

        Args:
            nrt: the NRT dict.
            topology: its parsed form, if the caller already has it.
        """
        if topology is not None:
            topo = topology
        else:
            try:
                topo = parse_topology(nrt)
            except (QuantityError, TypeError, ValueError):
                return  # an NRT we cannot read proves nothing about our pods
        node = topo.name
        if topo.resource_version and self._nrt_versions.get(node) == topo.resource_version:
            return  # a re-delivery, not an update
        self._nrt_versions[node] = topo.resource_version
        bound = [e for e in self._entries.values() if e.bound_node == node]
        if not bound:
            return
        counted: set[str] | None = None
        if topo.fingerprint:
            counted = self._counted_pods(node, topo)
            pods = self._pods_by_node.get(node, {})
            if pod_fingerprint((pods[k].namespace, pods[k].name) for k in counted) \
                    != topo.fingerprint:
                counted = None
        nrt_rv = _int_rv(nrt)
        limit = 2 if topo.fingerprint else 1
        for entry in bound:
            if counted is not None and entry.key in counted:
                del self._entries[entry.key]  # the publisher counted the pod: definitive
                continue
            if nrt_rv is not None and entry.bound_rv is not None and nrt_rv <= entry.bound_rv:
                continue  # written before the binding, only delivered after it
            entry.updates_since_binding += 1
            if entry.updates_since_binding >= limit:
                del self._entries[entry.key]

    def _counted_pods(self, node: str, topo: Topology) -> set[str]:
        method = topo.fingerprint_method
        out: set[str] = set()
        for key, pod in self._pods_by_node.get(node, {}).items():
            if method == METHOD_EXCLUDE_TERMINAL:
                if pod.phase in _TERMINAL:
                    continue
            elif pod.phase != "Running":
                continue
            if method == METHOD_WITH_EXCLUSIVE_RESOURCES and not pod_is_exclusive(
                    pod.qos, pod.containers, topo.zone_resources):
                continue
            out.add(key)
        return out

    def expire(self, now: float | None = None) -> int:
        """Drop entries older than ``max_age_seconds``; returns how many were dropped."""
        now = self._clock() if now is None else now
        old = [k for k, e in self._entries.items() if now - e.added_at >= self._max_age]
        for key in old:
            del self._entries[key]
        return len(old)

    # --- reading ---------------------------------------------------------------------------
    def reservations(self) -> dict[str, dict[str, int]]:
        """Node name -> resource -> amount held by in-flight pods (after :meth:`expire`)."""
        self.expire()
        out: dict[str, dict[str, int]] = {}
        for entry in self._entries.values():
            targets = (entry.bound_node,) if entry.bound_node else entry.nodes
            for node in targets:
                held = out.setdefault(node, {})
                for name, amount in entry.requests.items():
                    if amount:
                        held[name] = held.get(name, 0) + amount
        return out

    def pending(self) -> list[tuple[str, tuple[str, ...]]]:
        """``(pod key, nodes it counts against)`` for every entry, sorted by key."""
        return sorted((e.key, (e.bound_node,) if e.bound_node else e.nodes)
                      for e in self._entries.values())

    def adjusted(self, nrts: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
        """Return ``nrts`` with in-flight requests subtracted from every zone's ``available``
        (clamped at 0). Unaffected NRTs are returned as the same objects; affected ones are
        copied (zones and resources only), with amounts written as quantity strings."""
        held = self.reservations()
        out: dict[str, Mapping[str, Any]] = dict(nrts)
        for node, amounts in held.items():
            nrt = nrts.get(node)
            if nrt is None:
                continue
            zones = []
            for zone in nrt.get("zones") or ():
                resources = []
                for res in zone.get("resources") or ():
                    name = str(res.get("name"))
                    if name in amounts:
                        res = dict(res)
                        res["available"] = _subtracted(name, res.get("available", 0),
                                                       amounts[name])
                    resources.append(res)
                zones.append({**zone, "resources": resources})
            copy = dict(nrt)
            copy["zones"] = zones
            # A new version key keeps parse caches from serving the unadjusted object.
            meta = dict(copy.get("metadata") or {})
            meta.pop("resourceVersion", None)
            copy["metadata"] = meta
            out[node] = copy
        return out


def _int_rv(obj: Mapping[str, Any]) -> int | None:
    """The resourceVersion as an int, when it is one. Kubernetes calls resourceVersions
    opaque; kube-apiserver's are etcd revisions, ordered across objects, so they are used to
    order an NRT update against a binding when both parse, and arrival order otherwise."""
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return int(rv) if isinstance(rv, str) and rv.isdigit() else None


def _subtracted(name: str, value: object, amount: int) -> str:
    left = max(0, parse_quantity(name, value) - amount)
    return f"{left}m" if name == CPU else str(left)
