"""The whole placement decision for one gated pod, as pure code.

Inputs are plain data: the pod (dict), the inspection result of each of its images
(``ImageInfo`` or the exception), the parsed :class:`~controller.config.PlacementConfig`,
the cluster's node inventory and, when NUMA placement applies, a NUMA decision. The output
is a frozen :class:`Decision`: the one JSON patch to send, the labels and annotation it
sets, the event to emit and the outcome. No I/O; the reconciler does the reading and the
writing (STYLE.md, controller-runtime habits).

Rules (README "How it decides", "The controller: one gated pod"):

- Supported platforms = intersection over all images of (os, architecture)
  (:mod:`controller.platforms`).
- Never a node the images can't run on: a node is admissible only when its (os,
  architecture) pair is one every image supports. The required affinity is
  :func:`controller.affinity.platform_requirement`: required terms are ORed and the
  expressions of a term ANDed (scheduler NodeSelectorTerm semantics), so ``arch In A`` AND
  ``os In O`` is exact only for OSes that support the same architectures. A pod without
  required terms gets one new term per such OS group (linux-only images: the one term
  ``kubernetes.io/arch In [archs]`` AND ``kubernetes.io/os In [linux]``). A pod with terms
  keeps them [KEP-3838: a gated pod's affinity may only be narrowed, expressions appended
  to existing terms, never a new term]: each term is narrowed to one OS group (the one with
  Linux, else the first by OS name, among the pairs the term admits) and the pairs it
  admitted outside that group are named in the Warning ``PlatformsLeftOut``.
- The user's pins: an ``In`` list on ``kubernetes.io/arch``/``os`` in a term is kept as
  written when its supported values lie inside the term's group (else narrowed by an
  appended ``In``); values it names that no image supports stay, with the Warning
  ``PartiallyCompatibleAffinity`` (the user may rely on emulation); when the pins let no
  term admit a supported pair, the Warning ``IncompatibleNodeAffinity``.
- A ``nodeSelector`` pinning ``kubernetes.io/arch`` (or ``os``) is the user's explicit pin
  (ANDed with every term): nothing is written for that key; a pin that admits no supported
  pair gives the Warning ``IncompatibleNodeSelector``.
- Empty intersection: the requirement ``podplacement.io/no-supported-platform Exists`` and
  Warning ``NoSupportedPlatform``.
- Supported architectures that no node has: Warning ``ArchitectureNotInCluster``.
- Preferred terms from ``nodeAffinityScoring`` (one per supported arch with a weight) unless
  the pod already prefers an architecture.
- Inspection failures: outcome ``retry`` (Warning ``ImageInspectionFailed`` on the first
  one) until ``imageInspection.maxRetries`` failed rounds, then ``fallback``:
  ``fallbackArchitecture`` when set, else ungated without an architecture requirement.
  The webhook, deciding at admission while no controller runs, falls back at once
  (``give_up``): no later attempt would follow.
- NUMA: candidates → ``kubernetes.io/hostname In [...]`` into every term, preferred
  hostname terms weighted by score and the label ``podplacement.io/numa=placed`` (the
  controller's binding feed watches only pods with it); none → ``wait-numa`` (label
  ``podplacement.io/numa=waiting``, still gated) until ``maxWaitSeconds`` or at once with
  ``unsatisfiable: Ungate``, then ungated arch-only with Warning ``PlacementFallback``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.affinity import (
    AffinityPlan,
    PlatformRequirement,
    arch_preferences,
    expression,
    hostname_requirement,
    required_terms,
    unsatisfiable_marker,
)
from controller.config import (
    AFFINITY_LABEL,
    AFFINITY_LABEL_NOT_SET,
    AFFINITY_LABEL_SET,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
    GATE_LABEL_REMOVED,
    HOSTNAME_LABEL,
    NUMA_LABEL,
    NUMA_LABEL_PLACED,
    NUMA_LABEL_WAITING,
    OS_LABEL,
    PlacementConfig,
)
from controller.platforms import ImageLike, NodeInventory, PlatformSet, supported_platforms
from controller.podpatch import build_pod_patch
from controller.podspec import has_gate


class Outcome(enum.StrEnum):
    """The outcome of a :class:`Decision`.

    A :class:`enum.StrEnum`: every member *is* its string value, so the ``result`` of the
    ``podplacement.io/decision`` annotation (``json.dumps``), the ``outcome`` label of
    ``podplacement_pods_processed_total`` and log lines read exactly as the plain strings
    did. Where a plain ``str`` is required (``yaml.safe_dump`` refuses ``str`` subclasses),
    use ``str(outcome)`` or ``outcome.value``.
    """

    SET = "set"
    NOT_SET = "not-set"
    FALLBACK = "fallback"
    NO_SUPPORTED_PLATFORM = "no-supported-platform"
    WAIT_NUMA = "wait-numa"
    RETRY = "retry"
    SKIP = "skip"


# The module-level names existing imports use (aliases of the members).
SET = Outcome.SET
NOT_SET = Outcome.NOT_SET
FALLBACK = Outcome.FALLBACK
NO_SUPPORTED_PLATFORM = Outcome.NO_SUPPORTED_PLATFORM
WAIT_NUMA = Outcome.WAIT_NUMA
RETRY = Outcome.RETRY
SKIP = Outcome.SKIP

# Event reasons
PLACEMENT_DECIDED = "PlacementDecided"
NO_SUPPORTED_PLATFORM_EVENT = "NoSupportedPlatform"
IMAGE_INSPECTION_FAILED = "ImageInspectionFailed"
ARCH_NOT_IN_CLUSTER = "ArchitectureNotInCluster"
INCOMPATIBLE_NODE_SELECTOR = "IncompatibleNodeSelector"
INCOMPATIBLE_NODE_AFFINITY = "IncompatibleNodeAffinity"
PARTIALLY_COMPATIBLE_AFFINITY = "PartiallyCompatibleAffinity"
PLATFORMS_LEFT_OUT = "PlatformsLeftOut"
WAITING_FOR_NUMA = "WaitingForNUMAResources"
PLACEMENT_FALLBACK = "PlacementFallback"
INVALID_PULL_SECRET = "InvalidPullSecret"

NORMAL = "Normal"
WARNING = "Warning"

# Warnings that mean the pod cannot run where the user sent it (emitted before the others).
_CANNOT_RUN = frozenset(
    {NO_SUPPORTED_PLATFORM_EVENT, INCOMPATIBLE_NODE_SELECTOR, INCOMPATIBLE_NODE_AFFINITY}
)


@dataclass(frozen=True, slots=True)
class EventSpec:
    """An Event to emit about the pod: ``type`` Normal|Warning, ``reason`` CamelCase,
    ``message`` human-readable (<= 1 kB once sent), ``action`` (events.k8s.io/v1)."""

    type: str
    reason: str
    message: str
    action: str = "Place"


def invalid_pull_secret_event(namespace: str, name: str, error: BaseException) -> EventSpec:
    """The Warning ``InvalidPullSecret`` for a pull Secret whose payload cannot be decoded
    (``imageinspect.CredentialError``; its text names the entry, never the secret's data):
    the secret is skipped and the images are inspected with the remaining credentials."""
    return EventSpec(WARNING, INVALID_PULL_SECRET, _event_message(
        f"pull secret {namespace}/{name} is unusable and was skipped: {_short_error(error)}"
    ), "Inspect")


@dataclass(frozen=True, slots=True)
class ContainerImage:
    """One container's image: ``container`` name, ``image`` reference as written,
    ``pull_policy`` (``Always`` means revalidate with the registry), ``init`` flag."""

    container: str
    image: str
    pull_policy: str = "IfNotPresent"
    init: bool = False


class NumaLike(Protocol):
    """The fields of ``controller.numa.NumaDecision`` this module reads."""

    @property
    def needed(self) -> bool: ...
    @property
    def candidates(self) -> tuple[str, ...]: ...
    @property
    def hostnames(self) -> tuple[str, ...]: ...
    @property
    def scores(self) -> Mapping[str, int]: ...
    @property
    def strategy(self) -> str: ...
    def node_policies(self) -> tuple[str, ...]: ...
    def policies(self) -> tuple[str, ...]: ...
    @property
    def verdicts(self) -> Sequence[Any]: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The decision for one pod.

    Attributes:
        outcome: an :class:`Outcome`: ``set``, ``not-set``, ``fallback``,
            ``no-supported-platform``, ``wait-numa`` (patch keeps the gate), ``retry`` (no
            patch; inspect again after backoff) or ``skip`` (pod not ours to handle: no
            patch).
        reason: one sentence for logs and the annotation.
        patch: the JSON-patch ops (empty for ``retry``/``skip``).
        ungate: True when the patch removes our gate.
        labels: labels the patch sets.
        annotation: the compact JSON of ``podplacement.io/decision`` ("" when not written).
        events: Events to emit (at most one per decision).
        platforms: the supported platform set (None when images failed).
        architectures: the architectures required (empty: none).
        requirement: the platform requirement written into the required node affinity
            (:func:`controller.affinity.platform_requirement`: the exact (os, architecture)
            pairs per term and those left out), or None when the images gave none
            (inspection failed, no images, no common platform).
        numa: the NUMA decision the placement was made with (typed candidates, hostnames,
            scores and per-node verdicts), or None when NUMA placement was off.
        numa_placed: True when the patch narrows the pod to NUMA candidates (the
            reconciler then holds the pod's requests on them: in-flight accounting).
    """

    outcome: Outcome
    reason: str
    patch: tuple[dict[str, Any], ...] = ()
    ungate: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    annotation: str = ""
    events: tuple[EventSpec, ...] = ()
    platforms: PlatformSet | None = None
    architectures: tuple[str, ...] = ()
    requirement: PlatformRequirement | None = None
    numa: NumaLike | None = None
    numa_placed: bool = False


def pod_images(pod: Mapping[str, Any]) -> list[ContainerImage]:
    """The images of ``initContainers`` then ``containers`` (as written, duplicates kept)."""
    spec = pod.get("spec") or {}
    out: list[ContainerImage] = []
    for kind, init in (("initContainers", True), ("containers", False)):
        for c in spec.get(kind) or []:
            if isinstance(c, Mapping) and c.get("image"):
                out.append(
                    ContainerImage(
                        str(c.get("name") or ""),
                        str(c["image"]),
                        str(c.get("imagePullPolicy") or "IfNotPresent"),
                        init,
                    )
                )
    return out


def unique_images(pod: Mapping[str, Any]) -> dict[str, bool]:
    """Distinct image references in pod order → ``pull_always`` (any container using it
    has ``imagePullPolicy: Always``)."""
    out: dict[str, bool] = {}
    for ci in pod_images(pod):
        out[ci.image] = out.get(ci.image, False) or ci.pull_policy == "Always"
    return out


def _image_entry(image: str, result: Any) -> dict[str, Any]:
    if isinstance(result, BaseException):
        return {"image": image, "error": _short_error(result)}
    entry: dict[str, Any] = {"image": image}
    digest = getattr(result, "digest", None)
    if digest:
        entry["digest"] = digest
    plats = []
    for p in getattr(result, "platforms", ()):
        s = f"{p.os}/{p.architecture}" + (f"/{p.variant}" if p.variant else "")
        plats.append(s)
    entry["platforms"] = plats
    return entry


def _pairs_text(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{o}/{a}" for o, a in pairs) or "none"


def _platform_warnings(requirement: PlatformRequirement, node_selector: Mapping[str, Any],
                       *, has_terms: bool) -> list[EventSpec]:
    """The Warnings about the user's pins and the narrowing, for a non-empty supported set.

    - ``IncompatibleNodeSelector``: the ``nodeSelector`` pins ``kubernetes.io/arch`` or
      ``os`` so that no supported pair is left (a value no image supports, or an os and
      arch that each are supported but not as a pair). Nothing else is said then.
    - ``IncompatibleNodeAffinity``: the pod has required terms and their ``In`` pins let no
      term admit a supported pair; the message names the pinned values no image supports.
    - ``PlatformsLeftOut``: a term was narrowed to one OS group (KEP-3838 forbids the new
      terms that would keep the others); the message names the pairs left out per term.
    - ``PartiallyCompatibleAffinity``: the terms' ``In`` pins also admit values no image
      supports (kept: the user may rely on emulation), or pin a supported os and a
      supported architecture that no image supports together.

    Rule sources: README "How it decides", :func:`controller.affinity.platform_requirement`.
    """
    out: list[EventSpec] = []
    supported = requirement.supported
    values = {ARCH_LABEL: (sorted({a for _, a in supported}), "architectures"),
              OS_LABEL: (sorted({o for o, _ in supported}), "operating systems")}
    if not requirement.selected:
        for key, (known, noun) in values.items():
            pin = node_selector.get(key)
            if pin is not None and str(pin) not in known:
                out.append(EventSpec(WARNING, INCOMPATIBLE_NODE_SELECTOR, _event_message(
                    f"nodeSelector {key}={pin} is not among the {noun} supported "
                    f"by every image ({', '.join(known)}); the pod cannot run there")))
        if not out:
            pins = ", ".join(f"{k}={node_selector.get(k)}" for k in (OS_LABEL, ARCH_LABEL))
            out.append(EventSpec(WARNING, INCOMPATIBLE_NODE_SELECTOR, _event_message(
                f"nodeSelector {pins} names no platform every image supports "
                f"({_pairs_text(supported)}); the pod cannot run there")))
        return out
    if not has_terms:
        return out
    outside = {ARCH_LABEL: requirement.outside_architectures,
               OS_LABEL: requirement.outside_oses}
    if not requirement.compatible:
        named = "; ".join(f"{k} {', '.join(v)}" for k, v in outside.items() if v)
        out.append(EventSpec(WARNING, INCOMPATIBLE_NODE_AFFINITY, _event_message(
            f"no required nodeSelectorTerm admits a platform the images support "
            f"({_pairs_text(supported)}); the terms' own pins allow only "
            f"{named or 'other os/arch pairs'}; the pod's affinity is kept as written")))
        return out
    left: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for term in requirement.terms:
        if term.left_out:
            left.setdefault(term.left_out, []).append(str(term.index))
    if left:
        out.append(EventSpec(WARNING, PLATFORMS_LEFT_OUT, _event_message(
            "each required nodeSelectorTerm keeps the platforms of one OS (a gated pod's "
            "terms can only be narrowed, KEP-3838): left out "
            + "; ".join(f"{_pairs_text(pairs)} from nodeSelectorTerms {', '.join(idx)}"
                        for pairs, idx in left.items()))))
    for key, (known, noun) in values.items():
        if outside[key]:
            out.append(EventSpec(WARNING, PARTIALLY_COMPATIBLE_AFFINITY, _event_message(
                f"required nodeSelectorTerms also admit {key} {', '.join(outside[key])}, "
                f"where the images cannot run (supported {noun}: {', '.join(known)}); "
                "those terms are kept as written")))
    if requirement.outside_pairs:
        out.append(EventSpec(WARNING, PARTIALLY_COMPATIBLE_AFFINITY, _event_message(
            f"required nodeSelectorTerms pin os/arch pairs the images do not support "
            f"together ({_pairs_text(requirement.outside_pairs)}; supported: "
            f"{_pairs_text(supported)}); those pins are kept as written")))
    return out


def _short_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _annotation(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"))


def _event_message(text: str) -> str:
    return text if len(text) <= 1000 else text[:997] + "..."


def decide(
    pod: Mapping[str, Any],
    images: Mapping[str, ImageLike | BaseException],
    config: PlacementConfig,
    *,
    nodes: NodeInventory | None = None,
    numa: NumaLike | None = None,
    failures: int = 0,
    numa_waited_seconds: float = 0.0,
    config_error: str | None = None,
    platforms: PlatformSet | None = None,
    path: str | None = None,
    give_up: str | None = None,
) -> Decision:
    """Decide placement for ``pod``.

    Args:
        pod: the gated Pod (dict, with ``metadata.resourceVersion``).
        images: result per distinct image reference of the pod (``ImageInfo`` or the
            exception raised inspecting it). Images missing from the map count as errors.
        config: the parsed PodPlacementConfig (defaults when none exists).
        nodes: node inventory (for ``ArchitectureNotInCluster``); None: unknown.
        numa: the NUMA decision for the pod, or None when topology placement is off.
        failures: inspection rounds of this pod that already failed before this one.
        numa_waited_seconds: how long the pod has waited for NUMA candidates so far.
        config_error: the PodPlacementConfig could not be parsed (defaults are used; the
            annotation mentions it).
        platforms: the supported platforms of the pod's images when the caller already
            computed them (:func:`controller.plan.plan` does, once per pod); else computed
            here.
        path: the admission path that places the pod, written first into the annotation
            as ``"path"`` (``"webhook"`` for the webhook, README "The webhook after the
            policy"); None (the controller) writes no ``path``.
        give_up: set when no later attempt will follow (the webhook deciding at admission
            while no controller runs): an image without a result means the fallback at
            once, whatever ``failures`` says, and these words replace "after N attempts"
            in the reason (e.g. ``"at admission, no controller running"``).

    Returns:
        a :class:`Decision`. Never raises for odd pod specs: they end in an ungate.
    """
    if not has_gate(pod):
        return Decision(SKIP, "pod no longer carries the podplacement scheduling gate")
    spec = pod.get("spec") or {}
    wanted = list(unique_images(pod))
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}
    for img in wanted:
        res = images.get(img)
        if res is None:
            res = LookupError("image not inspected")
        results[img] = res
        if isinstance(res, BaseException):
            errors[img] = res
    record: dict[str, Any] = {} if path is None else {"path": path}
    record["images"] = [_image_entry(i, results[i]) for i in wanted]
    if config_error:
        record["configError"] = config_error[:200]

    if errors and give_up is None and failures < config.image_inspection.max_retries:
        first = next(iter(errors))
        msg = (
            f"inspecting image {first} failed (attempt {failures + 1} of "
            f"{config.image_inspection.max_retries + 1}): {_short_error(errors[first])}"
        )
        failed = EventSpec(WARNING, IMAGE_INSPECTION_FAILED, _event_message(msg), "Inspect")
        return Decision(RETRY, msg, events=(failed,) if failures == 0 else ())

    plan = AffinityPlan(pod)
    node_selector = spec.get("nodeSelector") or {}
    if not isinstance(node_selector, Mapping):
        node_selector = {}
    warnings: list[EventSpec] = []
    given_platforms, platforms = platforms, None
    archs: tuple[str, ...] = ()
    requirement: PlatformRequirement | None = None
    outcome: Outcome = SET
    reason = ""

    if errors:
        fallback = config.fallback_architecture
        names = ", ".join(errors)
        when = give_up if give_up is not None else f"after {failures + 1} attempts"
        if fallback and ARCH_LABEL not in node_selector:
            plan.require(expression(ARCH_LABEL, "In", [fallback]))
            archs = (fallback,)
            reason = (
                f"image inspection failed {when} ({names}); "
                f"fallbackArchitecture {fallback} required"
            )
        else:
            reason = (
                f"image inspection failed {when} ({names}); "
                "ungated without an architecture requirement"
            )
        outcome = FALLBACK
        record["fallback"] = fallback or None
        warnings.append(EventSpec(WARNING, PLACEMENT_FALLBACK, _event_message(reason)))
    elif not wanted:
        outcome = NOT_SET
        reason = "pod has no container images"
    else:
        platforms = (given_platforms if given_platforms is not None
                     else supported_platforms([results[i] for i in wanted]))
        record["platforms"] = platforms.strings()
        if platforms.empty:
            outcome = NO_SUPPORTED_PLATFORM
            plan.require(unsatisfiable_marker(), unless_key="")
            reason = "no platform is supported by every image of the pod"
            warnings.append(
                EventSpec(WARNING, NO_SUPPORTED_PLATFORM_EVENT, _event_message(
                    reason + ": " + "; ".join(
                        f"{e['image']}: {','.join(e.get('platforms', [])) or 'none'}"
                        for e in record["images"]
                    )
                ))
            )
        else:
            archs = platforms.architectures
            record["oses"] = list(platforms.oses)
            pinned = node_selector.get(ARCH_LABEL)
            requirement = plan.require_platforms(platforms.pairs)
            if len(platforms.oses) > 1:
                # archs and oses combined are not what the pod may run on: record the exact pairs
                record["pairs"] = [f"{o}/{a}" for o, a in requirement.pairs]
            added = requirement.appended
            warnings.extend(_platform_warnings(requirement, node_selector,
                                               has_terms=bool(required_terms(pod))))
            if pinned is None and config.preferred_platforms:
                weights = {p.architecture: p.weight for p in config.preferred_platforms}
                for term in arch_preferences(pod, archs, weights):
                    plan.prefer(term["weight"], term["preference"]["matchExpressions"])
            if added and len(platforms.oses) > 1:
                reason = "required platforms " + ", ".join(record["pairs"])
            elif added:
                reason = f"required architectures {', '.join(archs)}"
            elif pinned is not None:
                outcome = NOT_SET
                reason = f"nodeSelector pins {ARCH_LABEL}={pinned}; affinity left as is"
            else:
                outcome = NOT_SET
                reason = "every required term already pins the architecture and OS with In"
            if (
                nodes is not None
                and nodes.node_count
                and not set(archs) & nodes.architectures
            ):
                warnings.append(EventSpec(WARNING, ARCH_NOT_IN_CLUSTER, _event_message(
                    f"no node in the cluster has any of the supported architectures "
                    f"{', '.join(archs)} (nodes: {', '.join(sorted(nodes.architectures))})"
                )))

    labels = {GATE_LABEL: GATE_LABEL_REMOVED}
    remove_labels: list[str] = []
    current_labels = (pod.get("metadata") or {}).get("labels") or {}
    numa_waiting = current_labels.get(NUMA_LABEL) == NUMA_LABEL_WAITING

    # NUMA (only meaningful once the platform is known and satisfiable).
    if numa is not None and numa.needed and outcome not in (NO_SUPPORTED_PLATFORM,):
        info: dict[str, Any] = {
            "strategy": numa.strategy,
            "candidates": list(numa.candidates),
        }
        # node_policies() avoids building one verdict object per node (large clusters).
        policies = [p for p in numa.node_policies() if p]
        if policies:
            info["policy"] = policies if len(policies) > 1 else policies[0]
        record["numa"] = info
        if numa.candidates:
            plan.require(hostname_requirement(list(numa.hostnames)), unless_key="")
            for name, host in zip(numa.candidates, numa.hostnames, strict=False):
                score = int(numa.scores.get(name, 0))
                plan.prefer(max(1, score), [expression(HOSTNAME_LABEL, "In", [host])])
            reason = (reason + "; " if reason else "") + (
                f"NUMA candidates {', '.join(numa.candidates)}"
            )
            if outcome == NOT_SET:
                outcome = SET
            # The binding feed selects on this label (only these pods, never all pods).
            labels[NUMA_LABEL] = NUMA_LABEL_PLACED
        else:
            cfg = config.topology
            if cfg.unsatisfiable != "Ungate" and numa_waited_seconds < cfg.max_wait_seconds:
                msg = (
                    "no node can align the pod's resources to NUMA zones now; "
                    f"waiting up to {int(cfg.max_wait_seconds)}s"
                )
                wait_patch = build_pod_patch(
                    pod, labels={NUMA_LABEL: NUMA_LABEL_WAITING}, ungate=False
                )
                wait_events = () if numa_waiting else (
                    EventSpec(WARNING, WAITING_FOR_NUMA, _event_message(msg), "Wait"),
                )
                return Decision(
                    WAIT_NUMA,
                    msg,
                    patch=tuple(wait_patch) if not numa_waiting else (),
                    ungate=False,
                    labels={NUMA_LABEL: NUMA_LABEL_WAITING},
                    events=wait_events,
                    platforms=platforms,
                    architectures=archs,
                    requirement=requirement,
                    numa=numa,
                )
            why = (
                "unsatisfiable: Ungate"
                if cfg.unsatisfiable == "Ungate"
                else f"waited {int(numa_waited_seconds)}s >= maxWaitSeconds"
            )
            note = f"no NUMA-aligned node ({why}); ungated without NUMA placement"
            reason = (reason + "; " if reason else "") + note
            info["result"] = "ungated-without-numa"
            warnings.append(EventSpec(WARNING, PLACEMENT_FALLBACK, _event_message(note)))
    if numa_waiting and NUMA_LABEL not in labels:
        remove_labels.append(NUMA_LABEL)

    affinity_ops = plan.ops()
    set_affinity = bool(affinity_ops)
    labels[AFFINITY_LABEL] = AFFINITY_LABEL_SET if set_affinity else AFFINITY_LABEL_NOT_SET
    record["archs"] = list(archs)
    record["result"] = outcome
    record["reason"] = reason
    annotation = _annotation(record)
    patch = build_pod_patch(
        pod,
        affinity_ops,
        labels=labels,
        remove_labels=remove_labels,
        annotations={DECISION_ANNOTATION: annotation},
        ungate=True,
    )
    if warnings:
        # One Event per decision: the most serious first (the pod cannot run at all).
        warnings.sort(key=lambda w: w.reason not in _CANNOT_RUN)
        events: tuple[EventSpec, ...] = (warnings[0],)
    else:
        events = (EventSpec(NORMAL, PLACEMENT_DECIDED, _event_message(
            f"{reason}; scheduling gate removed"
        ), "Ungate"),)
    return Decision(
        outcome,
        reason,
        patch=tuple(patch),
        ungate=True,
        labels=labels,
        annotation=annotation,
        events=events,
        platforms=platforms,
        architectures=archs,
        requirement=requirement,
        numa=numa,
        numa_placed=labels.get(NUMA_LABEL) == NUMA_LABEL_PLACED,
    )


def plain_ungate(pod: Mapping[str, Any], reason: str) -> Decision:
    """A decision that only removes our gate (labels + annotation say why): for ordered
    uninstall past its deadline and for pods whose spec cannot be decided at all."""
    if not has_gate(pod):
        return Decision(SKIP, "pod no longer carries the podplacement scheduling gate")
    record = {"result": NOT_SET, "reason": reason}
    annotation = _annotation(record)
    labels = {GATE_LABEL: GATE_LABEL_REMOVED, AFFINITY_LABEL: AFFINITY_LABEL_NOT_SET}
    current = (pod.get("metadata") or {}).get("labels") or {}
    patch = build_pod_patch(
        pod,
        labels=labels,
        remove_labels=[NUMA_LABEL] if NUMA_LABEL in current else [],
        annotations={DECISION_ANNOTATION: annotation},
    )
    return Decision(
        NOT_SET,
        reason,
        patch=tuple(patch),
        ungate=True,
        labels=labels,
        annotation=annotation,
        events=(EventSpec(WARNING, PLACEMENT_FALLBACK, _event_message(reason)),),
    )
