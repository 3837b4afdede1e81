"""NUMA-aware placement from NodeResourceTopology: fit and score (the scheduler-plugins
NodeResourceTopologyMatch rules), the per-pod decision, in-flight accounting and pod-set
fingerprints.

Pure code: plain Kubernetes dicts in, frozen objects out, no I/O. Quantities are integers
(cpu in millicores, everything else in base units). :func:`decide_numa` runs fit and score
over the whole cluster as numpy arrays (``_fast``), kept per Node/NRT resourceVersion, and
falls back to the node-by-node reference code (``_fit``, ``_score``) where arrays do not apply;
``decide_numa(..., reference=True)`` forces the reference code (same result).
"""

from podplacement.rules.numa._decide import NodeVerdict, NumaDecision, decide_numa
from podplacement.rules.numa._fingerprint import pod_fingerprint, pod_hash
from podplacement.rules.numa._fit import align, fit_container_scope, fit_pod_scope
from podplacement.rules.numa._inflight import InFlight
from podplacement.rules.numa._quantity import format_quantity
from podplacement.rules.numa._score import STRATEGIES
from podplacement.rules.numa._topology import (
    NO_TOPOLOGY,
    Topology,
    TopologyCache,
    Zone,
    parse_topology,
    topology_policy,
)
from podplacement.rules.podspec import (
    BEST_EFFORT,
    BURSTABLE,
    GUARANTEED,
    ContainerRequests,
    QuantityError,
    effective_requests,
    iter_containers,
    parse_quantity,
    qos_class,
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
