"""Two renderers of one placement's facts as RFC 6902 JSON patches (pure, no I/O).

The facts (:class:`rules.place.placement.Placement`) say what to write; these functions say
how, for the two objects it is written to (DESIGN "one rule, three renderers"):

- :func:`controller_patch`: the controller's one PATCH of the gated pod: ``test
  /metadata/resourceVersion`` (optimistic concurrency), the affinity ``add`` ops, the
  labels, the decision annotation, then ``test`` + ``remove`` of our gate
  (:mod:`rules.place.podpatch`);
- :func:`admission_patch`: the webhook's patch of the pod being created (an AdmissionReview's
  ``request.object``): the same ops without the resourceVersion ``test`` (the object has
  none yet), and the gate ops only when the object carries our gate (the admission policy
  added it); without it there is nothing to remove.

Both derive every path from the object they patch, so the pod the webhook's patch makes of
the admission object is the pod the controller's PATCH makes of the gated pod created from
it. The third renderer, the admission policy's CEL, is :mod:`rules.admit.admissionpolicy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podplacement.rules.config import DECISION_ANNOTATION
from podplacement.rules.place.affinity import restriction_ops
from podplacement.rules.place.placement import Placement
from podplacement.rules.place.podpatch import (
    Op,
    gate_removal_ops,
    map_ops,
    resource_version_test,
    toleration_ops,
)

__all__ = ["admission_patch", "controller_patch"]


def _changes(pod: Mapping[str, Any], placement: Placement) -> list[Op]:
    """The ops that write ``placement`` into ``pod``, in the PATCH's order: affinity,
    tolerations (appended), labels, annotation, gate removal (KEP-3838 appends; KEP-3521
    gate removal last)."""
    ops = restriction_ops(pod, placement.required, placement.preferred)
    ops += toleration_ops(pod, placement.tolerations)
    ops += map_ops(pod, "labels", placement.labels, placement.remove_labels)
    if placement.record:
        ops += map_ops(pod, "annotations", {DECISION_ANNOTATION: placement.annotation})
    if placement.ungate:
        ops += gate_removal_ops(pod)
    return ops


def controller_patch(pod: Mapping[str, Any], placement: Placement) -> tuple[Op, ...]:
    """The controller's PATCH writing ``placement`` into the gated ``pod``.

    Returns:
        ``()`` when nothing changes (``retry``, ``skip``, a pod already waiting for NUMA
        candidates); else the ``test`` of the pod's resourceVersion, then the changes.

    Raises:
        ValueError: something changes and ``pod`` has no ``metadata.resourceVersion``.
    """
    changes = _changes(pod, placement)
    return (resource_version_test(pod), *changes) if changes else ()


def admission_patch(pod: Mapping[str, Any], placement: Placement) -> tuple[Op, ...]:
    """The admission patch writing ``placement`` into the object being created (with or
    without our gate): :func:`controller_patch` without the resourceVersion ``test``."""
    return tuple(_changes(pod, placement))
