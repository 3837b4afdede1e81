"""What a pod released without its images' platforms still requires (pure, no I/O).

A pod is released without a placement when its images could not be inspected: the
controller gives up after ``imageInspection.maxRetries`` failed rounds, the webhook decides
at admission while no controller runs, or the ordered uninstall and the last controller's
stand-down release the pods still gated. Such a pod is never released to any node: it keeps
what is known (docs/how-it-decides.md, item 7). :func:`fallback_requirement` is the one
rule; the controller's decision, the webhook's outage answer and the uninstall's release
all import it (through :mod:`rules.place.placement`).

- ``kubernetes.io/arch In [the fallback]``: the namespace PodPlacementPolicy's
  ``fallbackArchitecture``, else the cluster's, kept inside the policy's
  ``allowedArchitectures`` (else those): :func:`rules.policy.fallback_architectures`.
  No fallback: no architecture requirement.
- ``kubernetes.io/os In [spec.fallbackOperatingSystems]`` (default ``[linux]``), always.
- The user's pins are kept, as the platform requirement keeps them: nothing is written for a
  key the pod's ``nodeSelector`` pins; each expression is ANDed into every required
  nodeSelectorTerm that does not restrict its key with ``In`` (never a new ORed term, which
  would loosen the user's terms; a pod without terms gets one new term:
  :meth:`rules.place.affinity.AffinityPlan.require`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import ARCH_LABEL, OS_LABEL, PlacementConfig
from podplacement.rules.place.affinity import allowed_values, expression, required_terms
from podplacement.rules.policy import PlacementPolicy, fallback_architectures

__all__ = ["FallbackRequirement", "decided_by_pod", "fallback_requirement"]

#: The config field the operating systems come from (named in reasons).
OS_SOURCE = "fallbackOperatingSystems"


@dataclass(frozen=True, slots=True)
class FallbackRequirement:
    """What a pod released without its images' platforms requires.

    Attributes:
        architectures: the ``kubernetes.io/arch`` values written (sorted; empty: none, either
            no fallback architecture applies or the pod pins the architecture itself).
        oses: the ``kubernetes.io/os`` values written (sorted; empty only when the pod
            pins the OS itself).
        expressions: the NodeSelectorRequirements ANDed into every required term that does
            not pin their key with ``In`` (or the one new term of a pod without terms), in
            order: the architecture first.
        fallback_architecture: the ``fallbackArchitecture`` in force (the policy's, else
            the cluster's) when it is the one written; None otherwise.
        text: what was applied, for the reason and the Event, e.g. ``"fallback: required
            kubernetes.io/arch In [arm64] (fallbackArchitecture), kubernetes.io/os In
            [linux] (fallbackOperatingSystems)"``.
    """

    architectures: tuple[str, ...]
    oses: tuple[str, ...]
    expressions: tuple[dict[str, Any], ...]
    fallback_architecture: str | None
    text: str

    @property
    def required(self) -> tuple[tuple[dict[str, Any], None], ...]:
        """:attr:`expressions` as ``(expression, unless_key)`` pairs for
        :meth:`rules.place.affinity.AffinityPlan.require` (None: the expression's own key)."""
        return tuple((e, None) for e in self.expressions)


def _pinned(pod: Mapping[str, Any], node_selector: Mapping[str, Any], key: str) -> bool:
    """True when the pod itself decides ``key`` everywhere: its ``nodeSelector`` pins it, or
    every one of its required terms restricts it with ``In``."""
    if key in node_selector:
        return True
    terms = required_terms(pod)
    return bool(terms) and all(allowed_values(t, key) is not None for t in terms)


def decided_by_pod(pod: Mapping[str, Any], key: str) -> bool:
    """True when the pod itself decides the label ``key`` (``kubernetes.io/arch`` or
    ``os``) everywhere: its ``nodeSelector`` pins it, or every one of its required terms
    restricts it with ``In``. :func:`fallback_requirement` then writes nothing for ``key``,
    so a pod the fallback released decides both keys it wrote (the escape monitor's check
    that a fallback record reproduces, :func:`rules.monitor.escape.record_doubt`)."""
    spec = pod.get("spec")
    raw = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    return _pinned(pod, raw if isinstance(raw, Mapping) else {}, key)


def _listed(values: Sequence[str]) -> str:
    return f"[{', '.join(values)}]"


def fallback_requirement(pod: Mapping[str, Any], config: PlacementConfig,
                         policy: PlacementPolicy | None = None) -> FallbackRequirement:
    """The requirement of ``pod`` released without its images' platforms (module docstring).

    Args:
        pod: the Pod (dict): its ``nodeSelector`` and required terms are read for the user's
            pins; fields of an unexpected type count as absent.
        config: the PodPlacementConfig, parsed (``fallbackArchitecture``,
            ``fallbackOperatingSystems``), the cluster's or the policy's view of it
            (:meth:`rules.policy.PlacementPolicy.applied_to`): the policy's
            fallback wins either way.
        policy: the namespace's PodPlacementPolicy that applies to the pod, or None.

    Returns:
        the :class:`FallbackRequirement`. Pure; never raises for odd pod specs.
    """
    spec = pod.get("spec")
    raw = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    node_selector: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    archs = fallback_architectures(config, policy)
    own = (policy.fallback_architecture if policy is not None else None) \
        or config.fallback_architecture
    arch = own if own in archs else None
    oses = tuple(sorted(set(config.fallback_operating_systems)))
    written: list[dict[str, Any]] = []
    required: list[str] = []
    other: list[str] = []
    if _pinned(pod, node_selector, ARCH_LABEL):
        archs, arch = (), None
        other.append(f"{ARCH_LABEL} as the pod pins it")
    elif archs:
        source = "fallbackArchitecture" if arch else "allowedArchitectures"
        if policy is not None and (policy.fallback_architecture == arch if arch
                                   else policy.allowed_architectures is not None):
            source += f" of placement policy {policy.name}"
        written.append(expression(ARCH_LABEL, "In", list(archs)))
        required.append(f"{ARCH_LABEL} In {_listed(archs)} ({source})")
    else:
        other.append(f"any {ARCH_LABEL} (no fallbackArchitecture)")
    if _pinned(pod, node_selector, OS_LABEL):
        oses = ()
        other.append(f"{OS_LABEL} as the pod pins it")
    else:
        written.append(expression(OS_LABEL, "In", list(oses)))
        required.append(f"{OS_LABEL} In {_listed(oses)} ({OS_SOURCE})")
    clauses = ([f"required {', '.join(required)}"] if required else []) + other
    return FallbackRequirement(tuple(archs), oses, tuple(written), arch,
                               "fallback: " + "; ".join(clauses))
