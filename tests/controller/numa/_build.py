"""Builders for NUMA tests: Kubernetes dicts shaped like the API returns them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from podplacement.rules.config import TopologyConfig
from podplacement.rules.numa import NodeVerdict, TopologyCache, decide_numa

Res = Mapping[str, Any]


def nrt(name: str, zones: Sequence[Res], *, policy: str | None = "single-numa-node",
        scope: str | None = "container", costs: Sequence[Mapping[str, int]] | None = None,
        attrs: Mapping[str, str] | None = None, rv: str | None = None,
        legacy: Sequence[str] | None = None) -> dict[str, Any]:
    """An NRT whose zone ``i`` is ``node-i`` with ``available`` from ``zones[i]``; default
    costs are 10 to itself and 20 to others."""
    attributes = []
    if policy is not None:
        attributes.append({"name": "topologyManagerPolicy", "value": policy})
    if scope is not None:
        attributes.append({"name": "topologyManagerScope", "value": scope})
    for key, value in (attrs or {}).items():
        attributes.append({"name": key, "value": value})
    zone_objs = []
    for i, avail in enumerate(zones):
        zone_costs = (costs[i] if costs is not None else
                      {f"node-{j}": 10 if i == j else 20 for j in range(len(zones))})
        zone_objs.append({
            "name": f"node-{i}", "type": "Node",
            "costs": [{"name": k, "value": v} for k, v in zone_costs.items()],
            "resources": [{"name": k, "capacity": v, "allocatable": v, "available": v}
                          for k, v in avail.items()],
        })
    obj: dict[str, Any] = {
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name}, "zones": zone_objs,
    }
    if attributes:
        obj["attributes"] = attributes
    if rv is not None:
        obj["metadata"]["resourceVersion"] = rv
    if legacy is not None:
        obj["topologyPolicies"] = list(legacy)
    return obj


def node(name: str, allocatable: Res | None = None, hostname: str | None = None,
         arch: str = "amd64") -> dict[str, Any]:
    """A Node with the given allocatable (default: plenty of cpu and memory)."""
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": hostname or name,
                                              "kubernetes.io/arch": arch,
                                              "kubernetes.io/os": "linux"}},
        "status": {"allocatable": dict(allocatable or {"cpu": "128", "memory": "512Gi",
                                                       "pods": "110"})},
    }


def ctr(name: str, requests: Res | None = None, limits: Res | None = None, *,
        guaranteed: bool = True, sidecar: bool = False) -> dict[str, Any]:
    """A container; with ``guaranteed`` the limits equal the requests."""
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = dict(requests)
    if limits is not None:
        resources["limits"] = dict(limits)
    elif guaranteed and requests is not None:
        resources["limits"] = dict(requests)
    out: dict[str, Any] = {"name": name, "image": "busybox", "resources": resources}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(containers: Sequence[dict[str, Any]], init: Sequence[dict[str, Any]] = (), *,
        name: str = "p", namespace: str = "default", uid: str = "uid-p",
        overhead: Res | None = None, node_name: str | None = None,
        phase: str | None = None) -> dict[str, Any]:
    """A Pod with the given containers."""
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if overhead:
        spec["overhead"] = dict(overhead)
    if node_name:
        spec["nodeName"] = node_name
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace, "uid": uid},
                           "spec": spec}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def gpod(cpu: str, memory: str = "1Gi", extra: Res | None = None, **kw: Any) -> dict[str, Any]:
    """A Guaranteed single-container pod (container ``app``)."""
    return pod([ctr("app", {"cpu": cpu, "memory": memory, **(extra or {})})], **kw)


def judge(pod: dict[str, Any], nrt: dict[str, Any] | None, *,
          node_obj: dict[str, Any] | None = None, strategy: str = "LeastAllocated",
          without: str = "Allow") -> NodeVerdict:
    """Run the decision for one node ``n1`` (the NRT is renamed to match) and return its
    verdict."""
    n = node_obj or node("n1")
    nrts = {} if nrt is None else {"n1": {**nrt, "metadata": {**nrt["metadata"], "name": "n1"}}}
    cfg = TopologyConfig(enabled=True, scoring_strategy=strategy, nodes_without_topology=without)
    decision = decide_numa(pod, [n], nrts, cfg, cache=TopologyCache())
    assert len(decision.verdicts) == 1
    return decision.verdicts[0]
