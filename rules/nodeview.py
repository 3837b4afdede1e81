"""What the controller keeps of a Node: the fields its code reads, nothing else.

A kubelet's Node carries a bulk the controller never reads (``status.images``,
``conditions``, ``nodeInfo``, ``managedFields``, annotations): about 37 KB of Python objects
per node, 184 MiB for 5,000 nodes. The Node informer applies :func:`node_view` to every
object before caching it (client-go's ``cache.TransformFunc``, as kube-scheduler-like
controllers trim ``managedFields``), so a replica holds only :data:`NODE_FIELDS`.

Readers of the Node informer's objects, and the fields they read:

- ``metadata.name``: the cache key (:func:`kubeclient.client.object_key`), the NUMA decision
  (:mod:`rules.numa`), ``explain``, the NUMA cache's forgetting of deleted nodes;
- ``metadata.namespace``: the cache key (absent on Nodes; kept if present);
- ``metadata.resourceVersion``: the informer's change detection on a relist, the NUMA parse
  cache and arrays (:class:`rules.numa.TopologyCache`);
- ``metadata.labels`` (all of them: a pod's ``nodeSelector`` may name any label):
  :func:`rules.podspec.node_eligible` / ``node_ineligibility`` (nodeSelector,
  ``kubernetes.io/os`` / ``arch``), :func:`rules.platforms.node_inventory`,
  :func:`rules.monitor.escape.classify`, the exec-format-error monitor's node platform,
  the admission feed's inventory refresh, the NUMA decision's ``kubernetes.io/hostname``;
- ``status.allocatable``: the NUMA decision's allocatable resource names
  (:func:`rules.numa._topology.parse_node`);
- ``spec.taints``, only the entries keyed ``kubernetes.io/arch``: the architecture taints
  a placed pod gets tolerations for (:func:`rules.tolerations.node_arch_taints`). Other
  taints (``not-ready``, ``unschedulable``, a pool's own) are dropped: a node carries a few
  and the controller never reads them.

``tests/controller/test_nodeview.py`` runs those readers over a full Node that records every
field read and fails if one is not kept here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podplacement.rules.tolerations import ARCH_TAINT_KEY

#: The Node fields the controller reads, as paths (each kept whole when present).
NODE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "resourceVersion"),
    ("metadata", "labels"),
    ("status", "allocatable"),
    ("spec", "taints"),
)

_METADATA = tuple(path[1] for path in NODE_FIELDS if path[0] == "metadata")


def node_view(node: Mapping[str, Any]) -> dict[str, Any]:
    """The Node dict ``node`` with only :data:`NODE_FIELDS` (the values are the same
    objects, not copies).

    Args:
        node: a Node as the API server returns it (any mapping; malformed parts dropped).
    Returns:
        ``{"metadata": {name, namespace, resourceVersion, labels present in node}}`` plus
        ``{"status": {"allocatable": ...}}`` when the node has it, and ``{"spec":
        {"taints": [{key, value, effect}, ...]}}`` with only its taints keyed
        ``kubernetes.io/arch`` (``timeAdded`` dropped) when it has any, shared between the
        views of the same taints. ``metadata`` is always there (the NUMA arrays read it by
        key). Never raises.
    """
    meta = node.get("metadata")
    kept: dict[str, Any] = {}
    if isinstance(meta, Mapping):
        kept = {key: meta[key] for key in _METADATA if key in meta}
    view: dict[str, Any] = {"metadata": kept}
    status = node.get("status")
    if isinstance(status, Mapping) and "allocatable" in status:
        view["status"] = {"allocatable": status["allocatable"]}
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    if isinstance(taints, list):
        arch = tuple((str(t.get("value") or ""), str(t.get("effect") or "")) for t in taints
                     if isinstance(t, Mapping) and t.get("key") == ARCH_TAINT_KEY)
        if arch:
            view["spec"] = _taints_spec(arch)
    return view


#: The ``spec`` of the views with architecture taints, one object per distinct set (a pool's
#: nodes share one): a view holds no taint of its own, so 5,000 tainted nodes cost what
#: untainted ones do (docs/benchmarks.md). Readers never change a view. Bounded: past
#: :data:`_MAX_SHARED` distinct sets, a view gets its own copy.
_SHARED: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
_MAX_SHARED = 256


def _taints_spec(kept: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """``{"taints": [{key: kubernetes.io/arch, value, effect}, ...]}`` for ``kept``
    ((value, effect) pairs), shared between the views with the same set."""
    shared = _SHARED.get(kept)
    if shared is not None:
        return shared
    spec = {"taints": [{"key": ARCH_TAINT_KEY, "value": v, "effect": e} for v, e in kept]}
    if len(_SHARED) < _MAX_SHARED:
        _SHARED[kept] = spec
    return spec
