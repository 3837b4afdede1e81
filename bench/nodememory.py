"""What the controller's informers hold, without a cluster: the product's own
:class:`kubeclient.Informer` relisting from an in-process API double that serves pre-encoded
JSON pages (decoded with orjson, as :class:`kubeclient.KubeAPI` does), measured with
tracemalloc (Python heap; MiB = 2**20 bytes).

- ``nodes``: ``--nodes`` Nodes shaped like bench/scale.py's (:func:`bench.scale.fake_nodes`
  and :func:`bench.scale.node_bulk`: ``--node-images`` images, five conditions, nodeInfo,
  addresses, a cloud's labels) plus what the API server adds (uid, resourceVersion,
  creationTimestamp, managedFields of the two writers), cached whole (no transform: the
  controller before the node transform) and through the controller's transform
  (:func:`rules.nodeview.node_view`): the heap held after the list, and the peak
  during it above the level before it.
- ``nrts``: ``--nrt-share`` of the nodes with bench/scale.py's NodeResourceTopology, cached
  whole (the NRT informer has no transform).
- ``cache-less relist``: ``--pods`` placed pods listed by a cache-less informer (the placed-pods
  watch) whose handler keeps nothing: the peak above the level before it when every page is
  held before the objects are handed on (:meth:`kubeclient.KubeAPI.list_all`, what the
  informer did before) and when each page is handed on as it arrives (the informer now).

Usage: ``python bench/nodememory.py [--nodes 5000] [--node-images 30] [--nrt-share 0.1]
[--pods 30000] [--page-size 500]``.
"""

from __future__ import annotations

import os
import sys

# bench/inspect.py would shadow the standard library's ``inspect``: put the project root
# first on sys.path instead of this script's directory.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import tracemalloc  # noqa: E402
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import orjson  # noqa: E402

from bench.scale import fake_nodes, node_bulk, nrt_for, nrt_nodes  # noqa: E402
from podplacement.kubeclient import Informer, KubeAPI  # noqa: E402
from podplacement.rules.config import (  # noqa: E402
    AFFINITY_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
)
from podplacement.rules.nodeview import node_view  # noqa: E402

MIB = 2**20
NOW = "2026-11-27T10:00:00Z"


class PagedApi:
    """Serves ``objects`` as list pages of ``page_size`` (pre-encoded JSON, decoded per page
    as :meth:`KubeAPI.list_pages` does); the informer's ``api`` for :meth:`Informer.relist`."""

    def __init__(self, objects: Sequence[Mapping[str, Any]], page_size: int) -> None:
        self.pages = [orjson.dumps({"metadata": {"resourceVersion": "100"},
                                    "items": list(objects[i:i + page_size])})
                      for i in range(0, len(objects), page_size)]

    async def list_pages(self, path: str, *, params: Mapping[str, str] | None = None,
                         page_size: int = 500
                         ) -> AsyncGenerator[tuple[list[dict[str, Any]], str], None]:
        for raw in self.pages:
            page = orjson.loads(raw)
            items: list[dict[str, Any]] = page["items"]
            rv = str(page["metadata"]["resourceVersion"])
            del page
            yield items, rv
            del items

    async def list_all(self, path: str, *, params: Mapping[str, str] | None = None,
                       page_size: int = 500) -> tuple[list[dict[str, Any]], str]:
        result: tuple[list[dict[str, Any]], str] = await KubeAPI.list_all(
            self, path, params=params, page_size=page_size)  # type: ignore[arg-type]
        return result


def _fields(obj: Any) -> Any:
    """A FieldsV1 shape for ``obj`` (``f:key`` per map key, lists atomic)."""
    if isinstance(obj, dict):
        return {f"f:{k}": _fields(v) for k, v in obj.items()}
    return {}


def api_node(index: int, node: Any, images: int) -> dict[str, Any]:
    """bench/scale.py's node as the API server returns it after its create and status patch."""
    manifest, status = node_bulk(node, images)
    obj = {**manifest, "status": status["status"]}
    meta = obj["metadata"]
    meta.update({"uid": f"{index:08x}-0000-4000-8000-000000000000",
                 "resourceVersion": str(1000 + index), "creationTimestamp": NOW})
    meta["managedFields"] = [
        {"manager": "bench", "operation": "Update", "apiVersion": "v1", "time": NOW,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": _fields(
             {k: meta[k] for k in ("labels", "annotations")}), "f:spec": _fields(obj["spec"])}},
        {"manager": "bench", "operation": "Update", "apiVersion": "v1", "time": NOW,
         "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:status": _fields(obj["status"])}}]
    return obj


def placed_pod(index: int) -> dict[str, Any]:
    """A pod placed by the product and bound (a fake node: Pending), as the API returns it."""
    name = f"p-{index:06d}"
    decision = json.dumps({"platforms": {"registry.example.test/app:v1": [
        "linux/amd64", "linux/arm64"]}, "archs": ["amd64", "arm64"], "reason": "placed"},
        separators=(",", ":"))
    term = {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In",
                                  "values": ["amd64", "arm64"]}]}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "bench", "uid": f"{index:08x}-1111-4000-8000-0000",
            "resourceVersion": str(10**6 + index), "creationTimestamp": NOW,
            "labels": {"app": "bench", GATE_LABEL: "removed", AFFINITY_LABEL: "set"},
            "annotations": {DECISION_ANNOTATION: decision},
            "managedFields": [{"manager": "loadgen", "operation": "Update", "apiVersion": "v1",
                               "time": NOW, "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {"f:containers": {}}}},
                              {"manager": "podplacement", "operation": "Update",
                               "apiVersion": "v1", "time": NOW, "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {}},
                                            "f:spec": {"f:affinity": {}}}}]},
        "spec": {
            "containers": [{"name": "c", "image": "registry.example.test/app:v1",
                            "resources": {}, "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File",
                            "imagePullPolicy": "IfNotPresent",
                            "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                                              "mountPath": "/var/run/secrets/kubernetes.io/"
                                                           "serviceaccount"}]}],
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}},
            "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "serviceAccount": "default", "nodeName": f"n-linux-amd64-{index % 2000:05d}",
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [{"key": f"node.kubernetes.io/{t}", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}
                            for t in ("not-ready", "unreachable")],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": NOW}]},
    }


def _heap() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def relist(objects: Sequence[Mapping[str, Any]], page_size: int, *,
                 keep_cache: bool = True,
                 transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 whole: bool = False) -> dict[str, float]:
    """Relist ``objects`` through an informer; MiB held after it and peak above before it
    (``whole``: every page held first, then handed on, as before the paged relist)."""
    api = PagedApi(objects, page_size)
    inf = Informer(api, "/x", page_size=page_size, keep_cache=keep_cache,  # type: ignore[arg-type]
                   transform=transform)
    handed = [0]
    inf.add_handler(lambda t, o, old: handed.__setitem__(0, handed[0] + 1))
    before = _heap()
    tracemalloc.reset_peak()
    if whole:
        items, _ = await api.list_all("/x", page_size=page_size)
        for obj in items:
            inf._emit("ADDED", obj, None)
        del items
    else:
        await inf.relist()
    peak = tracemalloc.get_traced_memory()[1] - before
    held = _heap() - before
    assert handed[0] == len(objects), (handed[0], len(objects))
    out = {"objects": float(len(objects)), "held_mib": held / MIB, "peak_mib": peak / MIB,
           "json_mib": sum(len(p) for p in api.pages) / MIB}
    del inf, api
    return out


async def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every figure of the module docstring, in MiB."""
    nodes = fake_nodes(args.nodes)
    node_objs = [api_node(i, n, args.node_images) for i, n in enumerate(nodes)]
    nrts = [nrt_for(n) for n in nrt_nodes(nodes, args.nrt_share)]
    for i, obj in enumerate(nrts):
        obj["metadata"].update({"uid": f"{i:08x}-2222", "resourceVersion": str(5000 + i),
                                "creationTimestamp": NOW})
    pods = [placed_pod(i) for i in range(args.pods)]
    tracemalloc.start()
    try:
        out = {"nodes, whole": await relist(node_objs, args.page_size),
               "nodes, node_view": await relist(node_objs, args.page_size, transform=node_view),
               "nrts, whole": await relist(nrts, args.page_size),
               "cache-less relist, every page held":
                   await relist(pods, args.page_size, keep_cache=False, whole=True),
               "cache-less relist, page by page":
                   await relist(pods, args.page_size, keep_cache=False)}
    finally:
        tracemalloc.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the figures (MiB of Python heap); 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000, help="fake nodes (default 5000)")
    ap.add_argument("--node-images", type=int, default=30,
                    help="entries of each node's status.images (default 30, as bench/scale.py)")
    ap.add_argument("--nrt-share", type=float, default=0.1,
                    help="share of the Linux nodes with an NRT (default 0.1)")
    ap.add_argument("--pods", type=int, default=30000,
                    help="placed pods of the cache-less relist (default 30000)")
    ap.add_argument("--page-size", type=int, default=500, help="list page size (default 500)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    out = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'informer':38} {'objects':>8} {'JSON MiB':>9} {'held MiB':>9} {'peak MiB':>9}")
    for name, row in out.items():
        print(f"{name:38} {row['objects']:8.0f} {row['json_mib']:9.1f} {row['held_mib']:9.1f} "
              f"{row['peak_mib']:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
