"""NodeResourceTopology (``topology.node.k8s.io/v1alpha2``) objects, parsed once per version.

Only zones of type ``Node`` named ``node-<N>`` are kept (others are ignored), and of each
resource only ``available`` is read. The Topology Manager policy and scope come from the
``topologyManagerPolicy`` / ``topologyManagerScope`` attributes, falling back to the
deprecated ``topologyPolicies`` list; attributes override it field by field (scheduler-plugins
``nodeconfig.TopologyManagerFromNodeResourceTopology``). Parsed objects are cached by
(name, resourceVersion) so a cluster-wide decision does not re-parse unchanged NRTs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.rules.numa._fit import columns_of
from podplacement.rules.numa._quantity import ALWAYS_ALLOCATABLE, score_value
from podplacement.rules.numa._score import score_columns_of
from podplacement.rules.podspec import parse_quantity

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"
SCOPE_CONTAINER = "container"
SCOPE_POD = "pod"
DEFAULT_MAX_NUMA_NODES = 8
LIMIT_NUMA_NODES = 1024
MAX_NUMA_ID = 64

#: The verdict of a node whose NodeResourceTopology does not parse (``{}``: the error).
INVALID_NRT = "invalid NodeResourceTopology: {}"
#: Policy/scope shown for a node that has no (readable) NodeResourceTopology.
NO_TOPOLOGY = "unknown"

ATTR_POLICY = "topologyManagerPolicy"
ATTR_SCOPE = "topologyManagerScope"
ATTR_MAX_NUMA_NODES = "topologyManagerMaxNUMANodes"
ATTR_FINGERPRINT = "nodeTopologyPodsFingerprint"
ATTR_FINGERPRINT_METHOD = "nodeTopologyPodsFingerprintMethod"
ANNOTATION_FINGERPRINT = "topology.node.k8s.io/fingerprint"

_VALID_POLICIES = frozenset({POLICY_NONE, POLICY_BEST_EFFORT, POLICY_RESTRICTED,
                             POLICY_SINGLE_NUMA_NODE})
_VALID_SCOPES = frozenset({SCOPE_CONTAINER, SCOPE_POD})
# The deprecated v1alpha2 ``topologyPolicies`` enum ("None" leaves the defaults alone).
_LEGACY_POLICIES = {
    "SingleNUMANodePodLevel": (POLICY_SINGLE_NUMA_NODE, SCOPE_POD),
    "SingleNUMANodeContainerLevel": (POLICY_SINGLE_NUMA_NODE, SCOPE_CONTAINER),
    "BestEffortPodLevel": (POLICY_BEST_EFFORT, SCOPE_POD),
    "BestEffortContainerLevel": (POLICY_BEST_EFFORT, SCOPE_CONTAINER),
    "RestrictedPodLevel": (POLICY_RESTRICTED, SCOPE_POD),
    "RestrictedContainerLevel": (POLICY_RESTRICTED, SCOPE_CONTAINER),
}
_ZONE_NAME_RE = re.compile(r"^node-(\d+)$")


@dataclass(frozen=True, slots=True)
class Zone:
    """One NUMA zone: ``numa_id`` from ``node-<N>``, ``available`` amounts (cpu in millicores),
    and ``costs`` (NUMA id -> distance) from the zone's ``costs`` list."""

    numa_id: int
    name: str
    available: Mapping[str, int]
    costs: Mapping[int, int]


@dataclass(frozen=True, slots=True, eq=False)
class Topology:
    """A parsed NodeResourceTopology (compared and hashed by identity: one object per version).

    Attributes:
        name: object name = node name.
        resource_version: ``metadata.resourceVersion`` ("" when absent).
        policy, scope: Topology Manager policy and scope.
        max_numa_nodes: ``topologyManagerMaxNUMANodes`` (default 8, capped at 1024).
        zones: the ``Node`` zones, sorted by NUMA id.
        fingerprint, fingerprint_method: the podfingerprint attribute (or legacy annotation)
            and its method attribute ("" when absent).
        zone_resources: every resource name any zone lists.
        zone_list: ``(numa_id, available)`` per zone, the form the fit and score code takes.
        zone_costs: each zone's ``costs``, in zone order.
        zone_values: each zone's ``available`` in score units (``Quantity.Value()``).
        columns: resource -> ``((1 << numa_id, available), ...)`` (the fit loop's form).
        score_columns: resource -> ``((zone index, available, value), ...)`` (the score's).
        amount_range: ``(smallest, largest)`` ``available`` amount of any zone (``(0, 0)``
            without any), so array code can tell at once whether its integers hold them.
    """

    name: str
    resource_version: str
    policy: str
    scope: str
    max_numa_nodes: int
    zones: tuple[Zone, ...]
    fingerprint: str
    fingerprint_method: str
    zone_resources: frozenset[str]
    zone_list: tuple[tuple[int, Mapping[str, int]], ...]
    zone_costs: tuple[Mapping[int, int], ...]
    zone_values: tuple[Mapping[str, int], ...]
    columns: Mapping[str, tuple[tuple[int, int], ...]]
    score_columns: Mapping[str, tuple[tuple[int, int, int], ...]]
    amount_range: tuple[int, int] = (0, 0)


def _attributes(obj: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for attr in obj.get("attributes") or ():
        if isinstance(attr, Mapping) and "name" in attr:
            out[str(attr["name"])] = str(attr.get("value", ""))
    return out


def _policy_from(nrt: Mapping[str, Any], attrs: Mapping[str, str]) -> tuple[str, str, int]:
    policy, scope, max_numa = POLICY_NONE, SCOPE_CONTAINER, DEFAULT_MAX_NUMA_NODES
    legacy = nrt.get("topologyPolicies") or ()
    if legacy:
        policy, scope = _LEGACY_POLICIES.get(str(legacy[0]), (policy, scope))
    if attrs.get(ATTR_SCOPE) in _VALID_SCOPES:
        scope = attrs[ATTR_SCOPE]
    if attrs.get(ATTR_POLICY) in _VALID_POLICIES:
        policy = attrs[ATTR_POLICY]
    raw_max = attrs.get(ATTR_MAX_NUMA_NODES, "")
    if raw_max.isdigit() and int(raw_max) > 1:
        max_numa = min(int(raw_max), LIMIT_NUMA_NODES)
    return policy, scope, max_numa


def topology_policy(nrt: Mapping[str, Any]) -> tuple[str, str]:
    """Return ``(policy, scope)`` of an NRT dict; defaults ``("none", "container")``.

    Attributes ``topologyManagerPolicy``/``topologyManagerScope`` win over the deprecated
    ``topologyPolicies`` list (whose first entry is read); invalid values are ignored.
    """
    policy, scope, _ = _policy_from(nrt, _attributes(nrt))
    return policy, scope


def _numa_id(name: object) -> int | None:
    match = _ZONE_NAME_RE.match(str(name))
    if not match:
        return None
    value = int(match.group(1))
    return value if value < MAX_NUMA_ID else None


def parse_topology(nrt: Mapping[str, Any]) -> Topology:
    """Parse an NRT dict (as the API returns it; quantities may be ints or strings).

    Raises:
        QuantityError: an ``available`` value is not a quantity.
    """
    meta = nrt.get("metadata") or {}
    attrs = _attributes(nrt)
    policy, scope, max_numa = _policy_from(nrt, attrs)
    zones: list[Zone] = []
    names: set[str] = set()
    for zone in nrt.get("zones") or ():
        if zone.get("type") != "Node":
            continue
        numa_id = _numa_id(zone.get("name"))
        if numa_id is None:
            continue
        available: dict[str, int] = {}
        for res in zone.get("resources") or ():
            rname = str(res.get("name"))
            available[rname] = parse_quantity(rname, res.get("available", 0))
        costs: dict[int, int] = {}
        for cost in zone.get("costs") or ():
            cid = _numa_id(cost.get("name"))
            if cid is not None:
                costs[cid] = int(cost.get("value", 0))
        names.update(available)
        zones.append(Zone(numa_id, str(zone.get("name")), available, costs))
    zones.sort(key=lambda z: z.numa_id)
    amounts = [amount for z in zones for amount in z.available.values()]
    fingerprint = attrs.get(ATTR_FINGERPRINT)
    if fingerprint is None:
        fingerprint = str((meta.get("annotations") or {}).get(ANNOTATION_FINGERPRINT, ""))
    return Topology(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        policy=policy,
        scope=scope,
        max_numa_nodes=max_numa,
        zones=tuple(zones),
        fingerprint=fingerprint,
        fingerprint_method=attrs.get(ATTR_FINGERPRINT_METHOD, ""),
        zone_resources=frozenset(names),
        zone_list=tuple((z.numa_id, z.available) for z in zones),
        zone_costs=tuple(z.costs for z in zones),
        zone_values=tuple(values_of(z.available) for z in zones),
        columns=columns_of([(z.numa_id, z.available) for z in zones]),
        score_columns=score_columns_of([(z.numa_id, z.available) for z in zones],
                                       [values_of(z.available) for z in zones]),
        amount_range=(min(amounts, default=0), max(amounts, default=0)),
    )


def values_of(available: Mapping[str, int]) -> dict[str, int]:
    """``available`` in score units: cpu in whole cores rounded up, others unchanged."""
    return {name: score_value(name, amount) for name, amount in available.items()}


@dataclass(frozen=True, slots=True, eq=False)
class NodeInfo:
    """What the NUMA rules read from a Node: the allocatable resource names and the
    ``kubernetes.io/hostname`` label (node name when the label is missing). Compared and
    hashed by identity."""

    name: str
    hostname: str
    allocatable: frozenset[str]


def parse_node(node: Mapping[str, Any], hostname_label: str) -> NodeInfo:
    """Parse a Node dict; cpu, memory, pods and ephemeral-storage always count as allocatable
    (the scheduler's NodeInfo keeps them even at zero)."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    hostname = str((meta.get("labels") or {}).get(hostname_label) or name)
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return NodeInfo(name, hostname, ALWAYS_ALLOCATABLE | frozenset(alloc))


class TopologyCache:
    """Parsed NRTs and Nodes by object name, re-parsed when the resourceVersion changes, plus
    a bounded memo of per-node verdicts by pod shape (for bursts of identical replicas), and
    the last cluster seen as arrays for the fast path (refreshed row by row).

    Memory stays bounded by the number of nodes (one parsed object per name) and
    ``max_memo`` verdicts. Objects without a resourceVersion are parsed on every call. Not
    thread-safe (the controller runs on one event loop).
    """

    def __init__(self, max_memo: int = 100_000) -> None:
        self._max_memo = max_memo
        #: name -> (resourceVersion, parsed object)
        self.parsed_nrts: dict[str, tuple[object, Topology]] = {}
        self.parsed_nodes: dict[str, tuple[object, NodeInfo]] = {}
        #: Verdicts by (Topology, NodeInfo, pod shape id[, in-flight holds]).
        self.memo: dict[tuple[object, ...], Any] = {}
        self._shapes: dict[tuple[object, ...], int] = {}
        self._next_shape = itertools.count(1)  # never reused, even after trim()
        #: The cluster as numpy arrays (``rules.numa._fast.ClusterArrays``), if built.
        self.arrays: Any = None

    def trim(self) -> None:
        """Drop the memo when it outgrew its bound (called once per decision)."""
        if len(self.memo) >= self._max_memo or len(self._shapes) >= self._max_memo:
            self.memo.clear()
            self._shapes.clear()

    def forget(self, name: str) -> None:
        """Drop the parsed Node and NRT called ``name`` (deleted objects)."""
        self.parsed_nrts.pop(name, None)
        self.parsed_nodes.pop(name, None)

    def shape_id(self, shape: tuple[object, ...]) -> int:
        """A small int standing for a (hashable) pod shape, stable until :meth:`trim` clears."""
        found = self._shapes.get(shape)
        if found is None:
            found = self._shapes[shape] = next(self._next_shape)
        return found

    def topology(self, nrt: Mapping[str, Any]) -> Topology:
        """Return the parsed NRT (cached). Raises QuantityError like :func:`parse_topology`."""
        meta = nrt.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if not rv:
            return parse_topology(nrt)
        name = str(meta.get("name", ""))
        hit = self.parsed_nrts.get(name)
        if hit is not None and hit[0] == rv:
            return hit[1]
        parsed = parse_topology(nrt)
        self.parsed_nrts[name] = (rv, parsed)
        return parsed

    def node(self, node: Mapping[str, Any], hostname_label: str) -> NodeInfo:
        """Return the parsed Node (cached)."""
        meta = node.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if not rv:
            return parse_node(node, hostname_label)
        name = str(meta.get("name", ""))
        hit = self.parsed_nodes.get(name)
        if hit is not None and hit[0] == rv:
            return hit[1]
        parsed = parse_node(node, hostname_label)
        self.parsed_nodes[name] = (rv, parsed)
        return parsed
