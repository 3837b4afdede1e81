"""The one JSON patch that records a placement decision on a gated pod (pure, no I/O).

One write per pod: a JSON patch that starts with
``test /metadata/resourceVersion`` (optimistic concurrency: a stale pod gets 422 with a
generic message from the real server, not 409 — ``reference/optimistic-concurrency.json``),
then the affinity ``add`` ops, the labels, the decision annotation, and finally
``test`` + ``remove /spec/schedulingGates/<i>`` for our gate only. Other gates stay; the
server deletes the field when the last gate goes (``reference/gates-b-remove-gate.json``).
The ``test`` on the gate name guards against removing someone else's gate when indexes
shifted (``remove /spec/schedulingGates/0`` silently removes whichever gate is first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from podplacement.rules.config import SCHEDULING_GATE
from podplacement.rules.podspec import escape_token, gate_index

__all__ = ["Op", "build_pod_patch", "gate_removal_ops", "map_ops", "resource_version_test",
           "toleration_ops"]

Op = dict[str, Any]


def map_ops(
    pod: Mapping[str, Any],
    field: str,
    set_values: Mapping[str, str],
    remove_keys: Sequence[str] = (),
) -> list[Op]:
    """Ops setting ``metadata.<field>`` (``labels``/``annotations``) entries and removing
    ``remove_keys`` that are present. Creates the map whole when the pod has none."""
    current = (pod.get("metadata") or {}).get(field)
    ops: list[Op] = []
    if not isinstance(current, Mapping):
        if set_values:
            ops.append({"op": "add", "path": f"/metadata/{field}", "value": dict(set_values)})
        return ops
    for key, value in set_values.items():
        if current.get(key) != value:
            ops.append({"op": "add", "path": f"/metadata/{field}/{escape_token(key)}",
                        "value": value})
    for key in remove_keys:
        if key in current and key not in set_values:
            ops.append({"op": "remove", "path": f"/metadata/{field}/{escape_token(key)}"})
    return ops


def toleration_ops(pod: Mapping[str, Any], tolerations: Sequence[Mapping[str, str]]) -> list[Op]:
    """Ops appending ``tolerations`` to the pod's ``spec.tolerations``: ``add
    /spec/tolerations/-`` per toleration when the pod has the list, else one ``add
    /spec/tolerations`` of the whole list. The pod's own entries are never touched (the API
    server allows only additions to a pod's tolerations on update, ``ValidatePodUpdate``).
    ``[]`` when there is nothing to add."""
    if not tolerations:
        return []
    spec = pod.get("spec")
    current = spec.get("tolerations") if isinstance(spec, Mapping) else None
    if not isinstance(current, list):
        return [{"op": "add", "path": "/spec/tolerations",
                 "value": [dict(t) for t in tolerations]}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": dict(t)} for t in tolerations]


def resource_version_test(pod: Mapping[str, Any]) -> Op:
    """``test /metadata/resourceVersion``: optimistic concurrency for a PATCH (a stale pod
    gets 422 from the real server, ``reference/optimistic-concurrency.json``).

    Raises:
        ValueError: the pod has no ``metadata.resourceVersion`` (not from the API server).
    """
    rv = (pod.get("metadata") or {}).get("resourceVersion")
    if not rv:
        raise ValueError("pod has no metadata.resourceVersion")
    return {"op": "test", "path": "/metadata/resourceVersion", "value": rv}


def gate_removal_ops(pod: Mapping[str, Any], gate: str = SCHEDULING_GATE) -> list[Op]:
    """``test`` + ``remove`` of ``gate`` at its current index in ``spec.schedulingGates``
    (the ``test`` on the name guards against removing another gate when indexes shifted);
    ``[]`` when the pod does not carry it. Other gates stay [KEP-3521]."""
    idx = gate_index(pod, gate)
    if idx is None:
        return []
    return [{"op": "test", "path": f"/spec/schedulingGates/{idx}/name", "value": gate},
            {"op": "remove", "path": f"/spec/schedulingGates/{idx}"}]


def build_pod_patch(
    pod: Mapping[str, Any],
    affinity_ops: Sequence[Op] = (),
    *,
    labels: Mapping[str, str] | None = None,
    remove_labels: Sequence[str] = (),
    annotations: Mapping[str, str] | None = None,
    ungate: bool = True,
    gate: str = SCHEDULING_GATE,
) -> list[Op]:
    """Assemble the single JSON patch for ``pod``.

    Order: ``test`` resourceVersion, affinity adds, label and annotation ops, then (when
    ``ungate``) ``test`` + ``remove`` of our gate at its current index. ``ungate`` with the
    gate already absent adds no gate ops.

    Raises:
        ValueError: the pod has no ``metadata.resourceVersion`` (not from the API server).
    """
    ops: list[Op] = [resource_version_test(pod)]
    ops.extend(affinity_ops)
    ops.extend(map_ops(pod, "labels", labels or {}, remove_labels))
    ops.extend(map_ops(pod, "annotations", annotations or {}))
    if ungate:
        ops.extend(gate_removal_ops(pod, gate))
    return ops
