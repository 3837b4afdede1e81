"""Benchmark: NUMA decision time per pod (``rules.numa.decide_numa``).

Grid: 100, 1,000 and 5,000 nodes x 2, 4 and 8 NUMA zones x pod and container scope, all nodes
``single-numa-node``, random availability (seeded). For each cell it prints:

* ``cold``: every pod has a new shape (requests differ), so each node is fitted and scored;
  NRTs are already parsed (they are parsed once per resourceVersion, as in the controller).
* ``warm``: a burst of identical replicas; unchanged NRTs reuse the verdict of the first one.
* ``burst``: identical replicas ungated one after the other with in-flight accounting (each
  pod's request is held on its candidates, so those nodes are re-evaluated for the next one).
* ``churn``: new pod shapes while NRTs keep changing (1% of them get a new resourceVersion
  before each pod, as kubelets' topology exporters publish every 10-60 s).
* ``first``: the very first decision, which also parses every Node and NRT.

``--reference`` times the node-by-node reference code instead of the numpy fast path (both
give the same decisions; the property tests check it).

Target: <= 2 ms per pod at 1,000 nodes x 2 zones. Run:
``python bench/numa.py [--strategy LeastAllocated] [--pods 5] [--reference]``.
"""

from __future__ import annotations

import os
import sys

# Other scripts in bench/ (controller.py, inspect.py) would shadow packages and the standard
# library: replace this script's directory on sys.path by the project root before imports.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from podplacement.rules.config import TopologyConfig  # noqa: E402
from podplacement.rules.numa import (  # noqa: E402
    STRATEGIES,
    InFlight,
    TopologyCache,
    decide_numa,
    effective_requests,
)


def make_cluster(nodes: int, zones: int, scope: str,
                 rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Nodes and NRTs: each zone has 8..32 cpus and 16..64 Gi memory available, some zones
    a NIC; every object has a resourceVersion like informer-fed objects."""
    node_objs: list[dict[str, Any]] = []
    nrts: dict[str, dict[str, Any]] = {}
    for i in range(nodes):
        name = f"worker-{i:05d}"
        node_objs.append({
            "metadata": {"name": name, "resourceVersion": str(1000 + i),
                         "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": str(32 * zones), "memory": f"{64 * zones}Gi",
                                       "pods": "250", "example.com/nic": "4"}},
        })
        zone_list = []
        for z in range(zones):
            resources: list[dict[str, Any]] = [
                {"name": "cpu", "capacity": 32, "allocatable": 32,
                 "available": rng.randint(8, 32)},
                {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi",
                 "available": f"{rng.randint(16, 64)}Gi"},
            ]
            if z % 2 == 0:
                resources.append({"name": "example.com/nic", "capacity": "2",
                                  "allocatable": "2", "available": str(rng.randint(0, 2))})
            zone_list.append({
                "name": f"node-{z}", "type": "Node", "resources": resources,
                "costs": [{"name": f"node-{o}", "value": 10 if o == z else 20}
                          for o in range(zones)],
            })
        nrts[name] = {
            "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name, "resourceVersion": str(5000 + i)},
            "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                           {"name": "topologyManagerScope", "value": scope}],
            "zones": zone_list,
        }
    return node_objs, nrts


def make_pod(index: int) -> dict[str, Any]:
    """A Guaranteed pod (2 app containers + 1 init container); ``index`` varies the memory
    request so that different indexes are different shapes."""
    def res(cpu: str, mem: str) -> dict[str, Any]:
        return {"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}}
    return {
        "metadata": {"name": f"bench-{index}", "namespace": "bench", "uid": f"uid-{index}"},
        "spec": {
            "initContainers": [{"name": "init", "image": "busybox", "resources": res("1", "1Gi")}],
            "containers": [
                {"name": "app", "image": "app", "resources": res("6", f"{8192 + index}Mi")},
                {"name": "sidecar", "image": "proxy", "resources": res("1", "512Mi")},
            ],
        },
    }


def churn(nrts: dict[str, dict[str, Any]], count: int, rng: random.Random) -> None:
    """Replace ``count`` random NRTs by a new version (new resourceVersion, zone 0's cpu
    ``available`` changed), like informer updates do."""
    for name in rng.sample(sorted(nrts), count):
        old = nrts[name]
        zones = [dict(z) for z in old["zones"]]
        zones[0]["resources"] = [dict(r) for r in zones[0]["resources"]]
        zones[0]["resources"][0]["available"] = rng.randint(8, 32)
        meta = dict(old["metadata"])
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 100_000)
        nrts[name] = {**old, "metadata": meta, "zones": zones}


def measure(nodes: list[dict[str, Any]], nrts: dict[str, dict[str, Any]],
            config: TopologyConfig, pods: int, reference: bool = False
            ) -> tuple[float, list[float], list[float], list[float], list[float], int]:
    """Return the first decision's time, the cold, warm, burst and churn times (ms of CPU
    time per pod) and the feasible-node count. CPU time (``time.process_time``) keeps other
    processes on a shared machine out of the figures."""
    cache = TopologyCache()
    nrts = dict(nrts)
    start = time.process_time()
    decision = decide_numa(make_pod(0), nodes, nrts, config, cache=cache, reference=reference)
    first = (time.process_time() - start) * 1000
    cold: list[float] = []
    for i in range(1, pods + 1):
        pod = make_pod(i)
        start = time.process_time()
        decide_numa(pod, nodes, nrts, config, cache=cache, reference=reference)
        cold.append((time.process_time() - start) * 1000)
    warm: list[float] = []
    replica = make_pod(pods)
    for _ in range(pods):
        start = time.process_time()
        decide_numa(replica, nodes, nrts, config, cache=cache, reference=reference)
        warm.append((time.process_time() - start) * 1000)
    burst: list[float] = []
    inflight = InFlight()
    for i in range(pods):
        pod = make_pod(pods)
        start = time.process_time()
        result = decide_numa(pod, nodes, nrts, config, cache=cache, inflight=inflight,
                             reference=reference)
        burst.append((time.process_time() - start) * 1000)
        inflight.add(f"burst-{i}", f"bench/burst-{i}", effective_requests(pod),
                     result.candidates)
    changing: list[float] = []
    rng = random.Random(7)
    for i in range(pods):
        churn(nrts, max(1, len(nrts) // 100), rng)
        pod = make_pod(pods + 1 + i)
        start = time.process_time()
        decide_numa(pod, nodes, nrts, config, cache=cache, reference=reference)
        changing.append((time.process_time() - start) * 1000)
    return first, cold, warm, burst, changing, len(decision.scores)


def main() -> None:
    """Run the grid and print one row per cell."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="LeastAllocated", choices=STRATEGIES)
    parser.add_argument("--pods", type=int, default=5, help="pods timed per cell and mode")
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--zones", default="2,4,8")
    parser.add_argument("--reference", action="store_true",
                        help="time the node-by-node reference code instead of the fast path")
    args = parser.parse_args()
    config = TopologyConfig(enabled=True, scoring_strategy=args.strategy)
    path = "reference" if args.reference else "fast"
    print(f"strategy={args.strategy}, {path} path; ms of CPU time per pod, min/median of "
          f"{args.pods}; cold = new pod shape, warm = identical replica")
    header = f"{'nodes':>6} {'zones':>5} {'scope':>9} {'first':>8} {'cold min':>9} " \
             f"{'cold med':>9} {'warm min':>9} {'warm med':>9} {'burst med':>9} " \
             f"{'churn med':>9} {'feasible':>8}"
    print(header)
    print("-" * len(header))
    rng = random.Random(42)
    for n in (int(x) for x in args.nodes.split(",")):
        for zones in (int(x) for x in args.zones.split(",")):
            for scope in ("pod", "container"):
                nodes, nrts = make_cluster(n, zones, scope, rng)
                first, cold, warm, burst, changing, feasible = measure(
                    nodes, nrts, config, args.pods, args.reference)
                print(f"{n:>6} {zones:>5} {scope:>9} {first:>8.1f} {min(cold):>9.2f} "
                      f"{statistics.median(cold):>9.2f} {min(warm):>9.2f} "
                      f"{statistics.median(warm):>9.2f} {statistics.median(burst):>9.2f} "
                      f"{statistics.median(changing):>9.2f} {feasible:>8}")


if __name__ == "__main__":
    main()
