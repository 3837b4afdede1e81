"""NUMA-aware placement from NodeResourceTopology: fit and score (the scheduler-plugins
NodeResourceTopologyMatch rules), the per-pod decision, in-flight accounting and pod-set
fingerprints.

Pure code: plain Kubernetes dicts in, frozen dataclasses out, no I/O. Quantities are integers
(cpu in millicores, everything else in base units).
"""

from controller.numa._decide import NO_TOPOLOGY, NodeVerdict, NumaDecision, decide_numa
from controller.numa._fingerprint import pod_fingerprint, pod_hash
from controller.numa._fit import align, fit_container_scope, fit_pod_scope
from controller.numa._inflight import InFlight
from controller.numa._pod import (
    BEST_EFFORT,
    BURSTABLE,
    GUARANTEED,
    ContainerRequests,
    effective_requests,
    iter_containers,
    qos_class,
)
from controller.numa._quantity import QuantityError, format_quantity, parse_quantity
from controller.numa._score import STRATEGIES
from controller.numa._topology import (
    Topology,
    TopologyCache,
    Zone,
    parse_topology,
    topology_policy,
)

__all__ = [
    "BEST_EFFORT",
    "BURSTABLE",
    "GUARANTEED",
    "NO_TOPOLOGY",
    "STRATEGIES",
    "ContainerRequests",
    "InFlight",
    "NodeVerdict",
    "NumaDecision",
    "QuantityError",
    "Topology",
    "TopologyCache",
    "Zone",
    "align",
    "decide_numa",
    "effective_requests",
    "fit_container_scope",
    "fit_pod_scope",
    "format_quantity",
    "iter_containers",
    "parse_quantity",
    "parse_topology",
    "pod_fingerprint",
    "pod_hash",
    "qos_class",
    "topology_policy",
]
