"""Tolerations for architecture taints: the one rule (pure, no I/O).

Clusters taint the nodes of an architecture pool so that pods that cannot run there stay
away: GKE Standard taints every Arm node ``kubernetes.io/arch=arm64:NoSchedule``
("Prepare an Arm workload for deployment", GKE docs), and EKS and on-premises clusters taint
their Graviton, ppc64le or s390x pools the same way. GKE adds the matching toleration
itself, but only at the pod's creation and only for a pod whose ``nodeSelector`` or node
affinity names ``arm64`` then; the affinity the controller writes comes later (a PATCH of
the gated pod), and a multi-architecture pod names no single architecture at all. Without
the toleration, a pod placed on ``amd64, arm64`` can never use the Arm pool, and one placed
arm64-only is unschedulable (docs/pools/tainted-pools.md).

So a pod whose placement admits an architecture gets the toleration of each known taint
keyed ``kubernetes.io/arch`` whose value is one of the architectures its images support
(:func:`arch_tolerations`), unless it already tolerates that taint. Only additions: the
pod's own tolerations are kept, and the API server accepts appending to a pod's
``spec.tolerations`` on update (``ValidatePodUpdate``: "spec.tolerations: only additions
to existing tolerations"; checked on v1.36.2 by tests/test_pools_tainted_realcluster.py).
Never a toleration for another taint key, never one for an architecture the images do
not support, never one for a pod released by the fallback (its images are unknown).

The known taints are those the Nodes carry (:func:`node_arch_taints`, kept by the Node
informer's view, :mod:`rules.nodeview`) together with the configured ones for pools that
have no node yet (``spec.architectureTaints.taints`` of the PodPlacementConfig,
:class:`ArchitectureTaints`). The controller publishes their union for the admission
paths (the params object's ``spec.architectureTaints``, the config's
``status.architectureTaints``), so the three renderings add the same tolerations.

Matching follows Kubernetes' ``Toleration.ToleratesTaint`` (k8s.io/api core/v1
toleration.go; API reference "Toleration v1 core"): an empty ``effect`` matches every
effect, an empty ``key`` (with ``Exists``) matches every key, ``Exists`` matches every
value, ``Equal`` (or no operator) matches the equal value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ARCH_TAINT_KEY",
    "MAX_ARCH_TAINTS",
    "TAINT_EFFECTS",
    "TOLERATE_DISABLED",
    "TOLERATE_ENABLED",
    "ArchTaint",
    "ArchitectureTaints",
    "TaintError",
    "arch_tolerations",
    "node_arch_taints",
    "parse_taints",
    "taints_value",
    "tolerates",
    "toleration_of",
    "without_added",
]

#: The taint key these tolerations are for: the well-known node label of the architecture
#: (the taint carries the label's key and the architecture as its value).
ARCH_TAINT_KEY = "kubernetes.io/arch"
#: The taint effects Kubernetes knows (core/v1 ``TaintEffect``).
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: ``spec.architectureTaints.tolerate`` values.
TOLERATE_ENABLED = "Enabled"
TOLERATE_DISABLED = "Disabled"
#: Most architecture taints kept (configured plus seen on Nodes): a few architectures times
#: three effects is the real world; the bound keeps a Node set with odd taint values from
#: growing what every pod's decision and the params object carry.
MAX_ARCH_TAINTS = 32
#: A taint value is a label value (the architecture): at most 63 characters of
#: ``[A-Za-z0-9._-]``, starting and ending alphanumeric.
_VALUE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class TaintError(ValueError):
    """A configured architecture taint is unusable (message: which and why)."""


@dataclass(frozen=True, slots=True, order=True)
class ArchTaint:
    """A node taint ``kubernetes.io/arch=<value>:<effect>``: ``value`` the architecture
    (``arm64``), ``effect`` one of :data:`TAINT_EFFECTS`."""

    value: str
    effect: str

    def as_dict(self) -> dict[str, str]:
        """``{"value": ..., "effect": ...}``: the config's and the params object's item."""
        return {"value": self.value, "effect": self.effect}


@dataclass(frozen=True, slots=True)
class ArchitectureTaints:
    """``spec.architectureTaints`` of the PodPlacementConfig: ``tolerate`` (default True,
    ``Enabled``) and the ``taints`` of pools that have no node yet (sorted, no duplicates),
    together with ``observed``: the taints the controller published from the Nodes in the
    config's ``status.architectureTaints`` (read with the object, so that the webhook and
    ``explain`` see what the controller sees)."""

    tolerate: bool = True
    taints: tuple[ArchTaint, ...] = ()
    observed: tuple[ArchTaint, ...] = ()

    def known(self, nodes: Iterable[ArchTaint] | None = None) -> tuple[ArchTaint, ...]:
        """The taints to tolerate: configured, plus ``nodes`` (the taints seen on the
        Nodes) when given, else the published ``observed``; sorted, at most
        :data:`MAX_ARCH_TAINTS`; empty when ``tolerate`` is off."""
        if not self.tolerate:
            return ()
        seen = set(self.taints) | set(self.observed if nodes is None else nodes)
        return tuple(sorted(seen))[:MAX_ARCH_TAINTS]


def _taint(value: Any, effect: Any) -> ArchTaint | None:
    if not isinstance(value, str) or not _VALUE_RE.match(value):
        return None
    if effect not in TAINT_EFFECTS:
        return None
    return ArchTaint(value, str(effect))


def parse_taints(items: Any, path: str, *, strict: bool = True) -> tuple[ArchTaint, ...]:
    """A list of ``{value, effect}`` (the config's ``taints``, the published ``observed``)
    → sorted distinct :class:`ArchTaint`.

    Args:
        items: the list (None: empty).
        path: where it was read, for the error (``spec.architectureTaints.taints``).
        strict: raise on a bad item (the operator's spec); else drop it (a published list).
    Raises:
        TaintError: ``strict`` and not a list, more than :data:`MAX_ARCH_TAINTS` items, or
            an item whose value is not a label value or whose effect is not one of
            :data:`TAINT_EFFECTS`.
    """
    if items is None:
        return ()
    if not isinstance(items, list | tuple):
        if strict:
            raise TaintError(f"{path}: must be a list, got {type(items).__name__}")
        return ()
    if strict and len(items) > MAX_ARCH_TAINTS:
        raise TaintError(f"{path}: at most {MAX_ARCH_TAINTS} taints, got {len(items)}")
    out: set[ArchTaint] = set()
    for i, item in enumerate(items[:MAX_ARCH_TAINTS]):
        taint = (_taint(item.get("value"), item.get("effect"))
                 if isinstance(item, Mapping) else None)
        if taint is None:
            if strict:
                raise TaintError(f"{path}[{i}]: needs value (an architecture, a label "
                                 f"value) and effect ({', '.join(TAINT_EFFECTS)})")
            continue
        out.add(taint)
    return tuple(sorted(out))


def taints_value(taints: Iterable[ArchTaint]) -> list[dict[str, str]]:
    """The taints as the params object and the config's status publish them (sorted)."""
    return [t.as_dict() for t in sorted(set(taints))]


def node_arch_taints(nodes: Iterable[Mapping[str, Any]]) -> tuple[ArchTaint, ...]:
    """The distinct taints keyed ``kubernetes.io/arch`` on ``nodes`` (Node dicts, or their
    informer views), sorted, at most :data:`MAX_ARCH_TAINTS`. Other keys, values that are
    not label values and unknown effects are ignored. Never raises."""
    out: set[ArchTaint] = set()
    for node in nodes:
        spec = node.get("spec")
        taints = spec.get("taints") if isinstance(spec, Mapping) else None
        if not isinstance(taints, list):
            continue
        for t in taints:
            if isinstance(t, Mapping) and t.get("key") == ARCH_TAINT_KEY:
                taint = _taint(t.get("value"), t.get("effect"))
                if taint is not None:
                    out.add(taint)
    return tuple(sorted(out))[:MAX_ARCH_TAINTS]


def tolerates(toleration: Mapping[str, Any], taint: ArchTaint,
              key: str = ARCH_TAINT_KEY) -> bool:
    """True when ``toleration`` (a pod's, as the API gives it) tolerates the taint
    ``key=<taint.value>:<taint.effect>``: Kubernetes' ``Toleration.ToleratesTaint``
    (k8s.io/api core/v1 toleration.go): an empty effect matches all effects, an empty key
    matches all keys, ``Exists`` matches all values, ``Equal`` or no operator the equal
    value. A malformed toleration tolerates nothing."""
    t_effect = toleration.get("effect") or ""
    if t_effect and t_effect != taint.effect:
        return False
    t_key = toleration.get("key") or ""
    if t_key and t_key != key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == taint.value
    return False


def toleration_of(taint: ArchTaint) -> dict[str, str]:
    """The toleration added for ``taint``: ``{key: kubernetes.io/arch, operator: Equal,
    value: <arch>, effect: <effect>}`` (no ``tolerationSeconds``: a NoExecute pool's pod
    stays bound)."""
    return {"key": ARCH_TAINT_KEY, "operator": "Equal", "value": taint.value,
            "effect": taint.effect}


def pod_tolerations(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's ``spec.tolerations`` entries that are objects (another shape: none)."""
    spec = pod.get("spec")
    items = spec.get("tolerations") if isinstance(spec, Mapping) else None
    if not isinstance(items, list):
        return []
    return [t for t in items if isinstance(t, Mapping)]


def arch_tolerations(architectures: Sequence[str], pod: Mapping[str, Any],
                     taints: Iterable[ArchTaint]) -> tuple[dict[str, str], ...]:
    """The tolerations to ADD to ``pod`` for the architecture taints ``taints``.

    Args:
        architectures: the architectures the pod's placement admits for its images (the
            supported ones, less what a policy removed); never the fallback's (a pod
            released without its images' platforms gets nothing: pass ``()``).
        pod: the Pod (dict); its ``spec.tolerations`` are read, never changed.
        taints: the known architecture taints (:meth:`ArchitectureTaints.known`).

    Returns:
        one :func:`toleration_of` per taint whose value is in ``architectures`` and that no
        toleration of the pod already tolerates (:func:`tolerates`), sorted by (value,
        effect); ``()`` when none. Never raises.
    """
    admitted = set(architectures)
    own = pod_tolerations(pod)
    return tuple(toleration_of(t) for t in sorted(set(taints))
                 if t.value in admitted and not any(tolerates(o, t) for o in own))


def without_added(pod: Mapping[str, Any], added: Any) -> Mapping[str, Any]:
    """``pod`` as it was before a placement appended the tolerations its decision annotation
    lists (``added``: the record's ``tolerations``, ``kubernetes.io/arch=<arch>:<effect>``
    texts): those entries removed from the end of ``spec.tolerations`` when they are there,
    in order; else ``pod`` itself. For reproducing an admission decision
    (:mod:`rules.monitor.admitted`). Never raises."""
    if not isinstance(added, list) or not added:
        return pod
    wanted: list[dict[str, str]] = []
    for text in added:
        key, _, rest = str(text).partition("=")
        value, _, effect = rest.rpartition(":")
        if key != ARCH_TAINT_KEY or not value or not effect:
            return pod
        wanted.append(toleration_of(ArchTaint(value, effect)))
    own = pod_tolerations(pod)
    spec = pod.get("spec")
    items = spec.get("tolerations") if isinstance(spec, Mapping) else None
    if not isinstance(items, list) or len(own) != len(items) or len(items) < len(wanted):
        return pod
    tail = [dict(t) for t in items[len(items) - len(wanted):]]
    if tail != wanted:
        return pod
    assert isinstance(spec, Mapping)
    return {**pod, "spec": {**spec, "tolerations": items[:len(items) - len(wanted)]}}
