"""Pure JSONPatch construction for the gate the webhook adds to a pod being created.

Two operations (RFC 6902), in the order the recorded answers use (``reference/admission-a-*``):
the scheduling gate into ``spec.schedulingGates`` and the gate label into
``metadata.labels``. ``add`` on a path whose parent is missing fails to apply, and the API
server then rejects the pod with a 500 even under failurePolicy Ignore (recorded in
``admission-d-g-webhook-failures.json``), so a missing list or map is created whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeGuard

from podplacement.rules.config import (
    DECISION_ANNOTATION,
    GATE_LABEL,
    GATE_LABEL_GATED,
    SCHEDULING_GATE,
)
from podplacement.rules.place.placement import placed_labels
from podplacement.rules.podspec import escape_token, gate_index

__all__ = ["CONTROLLER_UNAVAILABLE", "gate_patch", "patch_shape", "release_patch"]

#: The decision result written when the webhook releases a pod because no controller runs.
CONTROLLER_UNAVAILABLE = "controller-unavailable"


def patch_shape(pod: Mapping[str, Any]) -> tuple[bool, bool]:
    """``(spec.schedulingGates is a list, metadata.labels is an object)``: the only facts
    about ``pod`` that :func:`gate_patch` depends on (a cache key for the encoded patch)."""
    # ``type(...) is dict`` first: decoded JSON is always a dict, and the Mapping ABC check
    # costs several times more (this runs once per gated pod).
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if _is_map(spec) else None
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if _is_map(metadata) else None
    return type(gates) is list or isinstance(gates, list), _is_map(labels)


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)


def gate_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the JSONPatch ops that gate ``pod`` (the AdmissionReview ``request.object``).

    * ``spec.schedulingGates`` present (a list): append ``{"name": gate}`` at ``/-``;
      absent: add the whole list ``[{"name": gate}]``.
    * ``metadata.labels`` present (an object): add ``/metadata/labels/<escaped key>`` =
      ``"gated"``; absent: add ``/metadata/labels`` = ``{key: "gated"}``.

    Returns a list of two ``{"op": "add", "path": ..., "value": ...}`` dicts.
    """
    has_gates, has_labels = patch_shape(pod)
    ops: list[dict[str, Any]] = []
    if has_gates:
        ops.append({"op": "add", "path": "/spec/schedulingGates/-",
                    "value": {"name": SCHEDULING_GATE}})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates",
                    "value": [{"name": SCHEDULING_GATE}]})
    if has_labels:
        ops.append({"op": "add", "path": "/metadata/labels/" + escape_token(GATE_LABEL),
                    "value": GATE_LABEL_GATED})
    else:
        ops.append({"op": "add", "path": "/metadata/labels",
                    "value": {GATE_LABEL: GATE_LABEL_GATED}})
    return ops


def release_patch(pod: Mapping[str, Any], reason: str) -> list[dict[str, Any]]:
    """The JSONPatch ops that release ``pod`` from our gate at admission (no controller is
    running, and the pod's shape does not fit the decision's patch; :mod:`webhook.outage`):
    remove our entry of ``spec.schedulingGates`` (other gates stay), set the labels of a pod
    released without affinity (:func:`rules.place.placement.placed_labels`:
    ``podplacement.io/scheduling-gate=removed``, ``podplacement.io/node-affinity=not-set``,
    the placement record every path writes; it records no requirement, so the escape monitor
    still checks the bound pod against its node: :func:`rules.monitor.escape.record_doubt`) and the
    decision annotation ``{"result": "controller-unavailable", "reason":
    reason}``; ``[]`` when the pod does not carry our gate. Missing label or annotation maps
    are created whole."""
    index = gate_index(pod)
    if index is None:
        return []
    ops: list[dict[str, Any]] = [{"op": "remove", "path": f"/spec/schedulingGates/{index}"}]
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if _is_map(metadata) else None
    annotations = metadata.get("annotations") if _is_map(metadata) else None
    released = placed_labels(affinity_set=False)
    if _is_map(labels):
        ops += [{"op": "add", "path": "/metadata/labels/" + escape_token(key), "value": value}
                for key, value in released.items()]
    else:
        ops.append({"op": "add", "path": "/metadata/labels", "value": released})
    decision = json.dumps({"result": CONTROLLER_UNAVAILABLE, "reason": reason},
                          separators=(",", ":"))
    if _is_map(annotations):
        ops.append({"op": "add",
                    "path": "/metadata/annotations/" + escape_token(DECISION_ANNOTATION),
                    "value": decision})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {DECISION_ANNOTATION: decision}})
    return ops
