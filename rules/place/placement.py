"""The placement rule for one pod, as facts: what to write, not how (pure, no I/O).

Inputs are plain data: the pod (dict), the inspection result of each of its images
(``ImageInfo`` or the exception), the parsed :class:`~rules.config.PlacementConfig`,
the cluster's node inventory and, when NUMA placement applies, a NUMA decision.
:func:`placement_facts` turns them into a frozen :class:`Placement`: the supported (os,
architecture) pairs, the expressions ANDed into each required term (or the new terms), the
preferred terms, the labels, the decision annotation's facts, the outcome, reason and
warnings. Three renderers write the same facts (DESIGN "one rule, three renderers"): the
controller's PATCH and the webhook's admission patch (:mod:`rules.place.render`), and the
admission policy's CEL (:mod:`rules.admit.admissionpolicy`), which imports its texts from here.

Rules (docs/how-it-decides.md, "The controller: one gated pod"):

- Supported platforms = intersection over all images of (os, architecture)
  (:mod:`rules.platforms`).
- Never a node the images can't run on: a node is admissible only when its (os,
  architecture) pair is one every image supports. The required affinity is
  :func:`rules.place.affinity.platform_requirement`: required terms are ORed and the
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
- Pools at zero (docs/pools/autoscalers.md): when the nodes are known and no node has any
  (os, architecture) pair the written required terms admit, the pod is placed all the same
  (required ``kubernetes.io/arch In [...]`` as usual: no fallback, no hold) and left
  Pending for an autoscaler, which creates a node of such a platform from the pod's
  required affinity; the annotation's ``noNodeYet`` lists those pairs and the Normal Event
  ``PlatformNotInCluster`` says so (:func:`platforms_without_node`).
- Preferred terms from ``nodeAffinityScoring`` (one per supported arch with a weight) unless
  the pod already prefers an architecture.
- Inspection failures: outcome ``retry`` (Warning ``ImageInspectionFailed`` on the first
  one) until ``imageInspection.maxRetries`` failed rounds, then ``fallback``: the
  requirement of :func:`rules.place.fallback.fallback_requirement` (the fallback
  architecture when one applies, always the fallback operating systems, default
  ``kubernetes.io/os In [linux]``; never released to any node). The webhook, deciding at
  admission while no controller runs, falls back at once (``give_up``): no later attempt
  would follow. The ordered uninstall releases the pods it could not place with the same
  requirement (:func:`fallback_release`).
- A namespace's placement policy (:mod:`rules.policy`, docs/guide/policies.md),
  when one matches the pod: its weights and fallback replace the cluster's; its
  ``allowedArchitectures`` are ANDed into the supported pairs, with the Warning
  ``ArchitecturesNotAllowed`` naming the pairs removed, or, when none remains, the
  unsatisfiable marker and ``NoSupportedPlatform``; the annotation's ``policy`` and the label
  ``podplacement.io/policy`` name it.
- Architecture taints (:mod:`rules.tolerations`): for each known taint keyed
  ``kubernetes.io/arch`` (on the Nodes, or configured for pools without a node) whose value
  is an architecture the placement admits for the images, the pod gets the matching
  toleration unless it already tolerates it; the annotation's ``tolerations`` lists what
  was added. Never for the fallback, never for another key.
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
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from podplacement.rules.config import (
    AFFINITY_LABEL,
    AFFINITY_LABEL_NOT_SET,
    AFFINITY_LABEL_SET,
    ARCH_LABEL,
    GATE_LABEL,
    GATE_LABEL_REMOVED,
    HOSTNAME_LABEL,
    NUMA_LABEL,
    NUMA_LABEL_PLACED,
    NUMA_LABEL_WAITING,
    OS_LABEL,
    POLICY_LABEL,
    RECORD_CATALOG,  # written by the admission policy only (config.admission_mark)
    PlacementConfig,
)
from podplacement.rules.learn import (
    LearnedImage,
    describe,
    exclusion_note,
    iso,
    learned_images,
)
from podplacement.rules.place.affinity import (
    AffinityPlan,
    Pair,
    PlatformRequirement,
    TermRestriction,
    arch_preferences,
    expression,
    hostname_requirement,
    platform_requirement,
    required_terms,
    unsatisfiable_marker,
)
from podplacement.rules.place.fallback import fallback_requirement
from podplacement.rules.platforms import (
    ImageLike,
    NodeInventory,
    PlatformSet,
    os_version_of,
    supported_platforms,
)
from podplacement.rules.policy import PlacementPolicy, narrow
from podplacement.rules.tolerations import ArchTaint, arch_tolerations

# --- texts: every renderer imports these, none retypes them -------------------------------


class Outcome(enum.StrEnum):
    """The outcome of a placement.

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


# Event reasons (events.k8s.io/v1, CamelCase) and types.
PLACEMENT_DECIDED = "PlacementDecided"
NO_SUPPORTED_PLATFORM_EVENT = "NoSupportedPlatform"
IMAGE_INSPECTION_FAILED = "ImageInspectionFailed"
#: Normal Event: no node of any platform the pod may run on exists yet; the pod is placed
#: for them and waits for one (an autoscaler creates it from the pod's required affinity;
#: docs/pools/autoscalers.md). Sent with the decision's own Event, on every path. It
#: replaces the Warning ``ArchitectureNotInCluster`` of earlier releases.
PLATFORM_NOT_IN_CLUSTER = "PlatformNotInCluster"
INCOMPATIBLE_NODE_SELECTOR = "IncompatibleNodeSelector"
INCOMPATIBLE_NODE_AFFINITY = "IncompatibleNodeAffinity"
PARTIALLY_COMPATIBLE_AFFINITY = "PartiallyCompatibleAffinity"
PLATFORMS_LEFT_OUT = "PlatformsLeftOut"
WAITING_FOR_NUMA = "WaitingForNUMAResources"
PLACEMENT_FALLBACK = "PlacementFallback"
INVALID_PULL_SECRET = "InvalidPullSecret"
ARCHITECTURES_NOT_ALLOWED = "ArchitecturesNotAllowed"
#: Normal Event: a platform of one of the pod's images was left out because it is excluded
#: for that image's digest (docs/exec-format-errors.md, "Learn"; sent with the decision's
#: own Event, on every path).
EXEC_FORMAT_EXCLUSION = "ExecFormatExclusion"

NORMAL = "Normal"
WARNING = "Warning"

# Warnings that mean the pod cannot run where the user sent it (emitted before the others).
_CANNOT_RUN = frozenset(
    {NO_SUPPORTED_PLATFORM_EVENT, INCOMPATIBLE_NODE_SELECTOR, INCOMPATIBLE_NODE_AFFINITY}
)

#: The end of both ``IncompatibleNodeSelector`` notes (written once).
_CANNOT_RUN_THERE = "; the pod cannot run there"
#: How lists are joined in reasons ("required architectures amd64, arm64").
LIST_SEPARATOR = ", "
#: Reasons; ``{}`` stands for the :data:`LIST_SEPARATOR`-joined values.
REASON_REQUIRED_ARCHITECTURES = "required architectures {}"
REASON_REQUIRED_PLATFORMS = "required platforms {}"
REASON_NO_SUPPORTED_PLATFORM = "no platform is supported by every image of the pod"
REASON_NO_IMAGES = "pod has no container images"
REASON_ALREADY_PINNED = "every required term already pins the architecture and OS with In"
REASON_NOT_GATED = "pod no longer carries the podplacement scheduling gate"
REASON_NOT_ALLOWED = ("no platform every image supports is allowed by placement policy {} "
                      "(allowedArchitectures)")

#: The fields of the ``podplacement.io/decision`` annotation, in the order they are written.
RECORD_PATH = "path"
RECORD_IMAGES = "images"
RECORD_CONFIG_ERROR = "configError"
RECORD_POLICY = "policy"
RECORD_NOT_ALLOWED = "notAllowed"
RECORD_FALLBACK = "fallback"
RECORD_PLATFORMS = "platforms"
RECORD_OSES = "oses"
RECORD_PAIRS = "pairs"
#: The decision's Windows build constraint, ``{"windows/amd64": ["10.0.17763"]}``: per
#: windows pair, the builds every image supports (absent: none; docs/pools/windows-builds.md).
RECORD_WINDOWS_BUILDS = "windowsBuilds"
RECORD_NUMA = "numa"
RECORD_ARCHS = "archs"
#: The (os/arch) pairs the pod may run on, when no node of any of them exists yet
#: (:func:`platforms_without_node`); written only by a decision that saw the nodes.
RECORD_NO_NODE = "noNodeYet"
#: The tolerations added for architecture taints, as ``kubernetes.io/arch=<arch>:<effect>``
#: (written only when some were added; :mod:`rules.tolerations`).
RECORD_TOLERATIONS = "tolerations"
RECORD_RESULT = "result"
RECORD_REASON = "reason"
RECORD_FIELDS = (RECORD_PATH, RECORD_CATALOG, RECORD_IMAGES, RECORD_CONFIG_ERROR,
                 RECORD_POLICY, RECORD_FALLBACK, RECORD_PLATFORMS, RECORD_NOT_ALLOWED, RECORD_OSES,
                 RECORD_PAIRS, RECORD_WINDOWS_BUILDS, RECORD_NUMA, RECORD_ARCHS, RECORD_NO_NODE,
                 RECORD_TOLERATIONS, RECORD_RESULT,
                 RECORD_REASON)
#: Written last, only in the compact form of an annotation over :data:`MAX_DECISION_BYTES`:
#: ``"compact":1`` (images' platforms replaced by their count, long lists cut) or ``2`` (only
#: the outcome, the reason and the number of images).
RECORD_COMPACT = "compact"
#: The compact form's count of an image's platforms, and of the pod's images (form 2).
RECORD_PLATFORM_COUNT = "platformCount"
RECORD_IMAGE_COUNT = "imageCount"

#: Largest ``podplacement.io/decision`` annotation written, in bytes of compact JSON: 32 KiB,
#: an eighth of the 256 KiB the API server allows for all of a pod's annotations together
#: (``TotalAnnotationSizeLimitB``), so the decision never makes a pod's PATCH too large nor
#: leaves the pod's own annotations without room. A pod of 60 images with 10 platforms each
#: writes about 10 kB; one whose record is larger gets the compact form
#: (:func:`bounded_record`).
MAX_DECISION_BYTES = 32 * 1024
#: In the compact form: most values kept of a list (supported platforms, pairs, archs, ...),
#: the longest image reference and reason kept (characters).
_COMPACT_LIST = 64
_COMPACT_IMAGE = 256
_COMPACT_REASON = 1000


#: The pod's container lists whose images are placed, in the order they are read (the
#: admission policy's ``images`` reads the same). ``ephemeralContainers`` are not among
#: them: the API server refuses them in a pod create (checked on v1.36.2:
#: tests/test_tenant_imagevol_realcluster.py); only the ``ephemeralcontainers``
#: subresource adds them afterwards, and a debug container its node cannot run fails
#: alone, the pod's own containers keep running.
CONTAINER_LISTS = ("initContainers", "containers")
#: The pod's list of volumes; an entry with ``image`` is an image volume (KEP-4639, GA in
#: Kubernetes 1.36): the kubelet pulls ``image.reference`` for the node's platform with the
#: pod's pull secrets, so it is one of the pod's images, read after the containers'.
VOLUMES = "volumes"
#: The ``volumes[].image`` fields: the reference (as a container's ``image``) and the pull
#: policy (as a container's ``imagePullPolicy``; the API server defaults it like one).
IMAGE_VOLUME = "image"
IMAGE_VOLUME_REFERENCE = "reference"
IMAGE_VOLUME_PULL_POLICY = "pullPolicy"
#: The ``imagePullPolicy`` that makes the controller revalidate a tag on every pod.
PULL_ALWAYS = "Always"
#: Most distinct images of one pod that are inspected: 64. Kubernetes sets no limit on a
#: pod's containers; real pods name a few images (an app and its sidecars), and 64 keeps
#: what one pod can make the controller or the webhook fetch (64 manifests of at most
#: 1 MiB, ``imageinspect`` bounds) and write (64 entries in the decision) small. A pod over
#: the bound is not inspected at all: each image counts as failed
#: (:func:`too_many_images`), so the controller releases it with the fallback and the
#: webhook leaves it to the controller.
MAX_POD_IMAGES = 64


def too_many_images(pod: Mapping[str, Any]) -> LookupError | None:
    """The error each image of ``pod`` gets when the pod names more than
    :data:`MAX_POD_IMAGES` distinct images (message: "the pod names N distinct images,
    more than the 64 inspected"), else None. Pure."""
    count = len(unique_images(pod))
    if count <= MAX_POD_IMAGES:
        return None
    return LookupError(f"the pod names {count} distinct images, more than the "
                       f"{MAX_POD_IMAGES} inspected")


def reason_text(template: str, values: Sequence[str]) -> str:
    """``template`` (one of the ``REASON_*`` with ``{}``) with ``values`` joined by
    :data:`LIST_SEPARATOR`."""
    return template.format(LIST_SEPARATOR.join(values))


def pairs_text(pairs: Sequence[Pair]) -> list[str]:
    """``["os/arch", ...]``: pairs as the annotation and the params object write them."""
    return [f"{o}/{a}" for o, a in pairs]


def placed_labels(*, affinity_set: bool, numa_placed: bool = False,
                  policy: str | None = None) -> dict[str, str]:
    """The labels of a pod whose gate is removed: ``scheduling-gate=removed``, ``numa=placed``
    when NUMA candidates were written, ``node-affinity=set|not-set``, and
    ``podplacement.io/policy=<name>`` when a placement policy applied."""
    labels = {GATE_LABEL: GATE_LABEL_REMOVED}
    if numa_placed:
        labels[NUMA_LABEL] = NUMA_LABEL_PLACED
    labels[AFFINITY_LABEL] = AFFINITY_LABEL_SET if affinity_set else AFFINITY_LABEL_NOT_SET
    if policy:
        labels[POLICY_LABEL] = policy
    return labels


def compact_json(payload: Mapping[str, Any]) -> str:
    """The annotation's JSON: no spaces (``separators=(",", ":")``)."""
    return json.dumps(payload, separators=(",", ":"))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _compact_image(entry: Any) -> Any:
    """An image's entry of the compact form: its reference (cut), digest or error, and the
    number of its platforms instead of the list."""
    if not isinstance(entry, Mapping):
        return entry
    out: dict[str, Any] = {"image": _cut(str(entry.get("image") or ""), _COMPACT_IMAGE)}
    for key in ("digest", "error"):
        if isinstance(entry.get(key), str):
            out[key] = _cut(entry[key], _COMPACT_IMAGE)
    if isinstance(entry.get("platforms"), list):
        out[RECORD_PLATFORM_COUNT] = len(entry["platforms"])
    return out


def bounded_record(record: Mapping[str, Any],
                   limit: int = MAX_DECISION_BYTES) -> Mapping[str, Any]:
    """``record`` (the decision annotation's facts) when its compact JSON is at most
    ``limit`` bytes; else its compact form 1: each image's platforms replaced by their
    count (``platformCount``; its digest kept, which the exec format monitor reads), lists
    cut to their first 64 values, the reason to 1,000 characters, and ``"compact":1``; and
    when even that is over the limit (thousands of images, a huge NUMA record), form 2: the
    path, catalog, policy, fallback, result and reason, the number of images
    (``imageCount``) and ``"compact":2``, well under 2 kB. Readers of the annotation
    (:mod:`rules.monitor.admitted`) take an entry without ``platforms`` as unknown. Pure."""
    if len(compact_json(record).encode()) <= limit:
        return record
    images = record.get(RECORD_IMAGES)
    form: dict[str, Any] = {}
    for key, value in record.items():
        if key == RECORD_IMAGES and isinstance(value, list):
            form[key] = [_compact_image(e) for e in value]
        elif isinstance(value, list):
            form[key] = value[:_COMPACT_LIST]
        elif isinstance(value, str):
            form[key] = _cut(value, _COMPACT_REASON)
        else:
            form[key] = value
    form[RECORD_COMPACT] = 1
    if len(compact_json(form).encode()) <= limit:
        return form
    short = {k: _cut(str(record[k]), _COMPACT_REASON) if isinstance(record[k], str)
             else record[k]
             for k in (RECORD_PATH, RECORD_CATALOG, RECORD_POLICY, RECORD_FALLBACK,
                       RECORD_RESULT, RECORD_REASON)
             if k in record and (record[k] is None or isinstance(record[k], str))}
    short[RECORD_IMAGE_COUNT] = len(images) if isinstance(images, list) else 0
    short[RECORD_COMPACT] = 2
    return short


# --- input and output types --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventSpec:
    """An Event to emit about the pod: ``type`` Normal|Warning, ``reason`` CamelCase,
    ``message`` human-readable (<= 1 kB once sent), ``action`` (events.k8s.io/v1)."""

    type: str
    reason: str
    message: str
    action: str = "Place"


@dataclass(frozen=True, slots=True)
class ContainerImage:
    """One image the pod pulls: ``container`` name (for an image volume, the volume's
    name), ``image`` reference as written, ``pull_policy`` (``Always`` means revalidate
    with the registry; a container's ``imagePullPolicy``, an image volume's
    ``pullPolicy``), ``init`` flag (an init container's), ``volume`` flag (an image
    volume's: nothing runs from it, so no exec format error can come of it)."""

    container: str
    image: str
    pull_policy: str = "IfNotPresent"
    init: bool = False
    volume: bool = False


class NumaLike(Protocol):
    """The fields of ``rules.numa.NumaDecision`` this module reads."""

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
class Placement:
    """The facts of one pod's placement; renderers write them (:mod:`rules.place.render`,
    :mod:`rules.admit.admissionpolicy`).

    Attributes:
        outcome: an :class:`Outcome`: ``set``, ``not-set``, ``fallback``,
            ``no-supported-platform``, ``wait-numa`` (the gate stays), ``retry`` (nothing
            written; inspect again after backoff) or ``skip`` (pod not ours to handle).
        reason: one sentence for logs and the annotation.
        ungate: True when our gate is removed.
        platforms: the supported platform set (None when images failed); its ``pairs`` are
            the supported (os, architecture) pairs (:attr:`pairs`).
        architectures: the architectures required (empty: none).
        requirement: the platform requirement written into the required node affinity
            (:func:`rules.place.affinity.platform_requirement`: the exact (os, architecture)
            pairs per term and those left out), or None when the images gave none
            (inspection failed, no images, no common platform).
        required: the restriction of each required term: the expressions ANDed into each
            existing term (by index), or the new terms of a pod without terms (index None);
            KEP-3838 appends only.
        preferred: the PreferredSchedulingTerms appended.
        tolerations: the tolerations appended to ``spec.tolerations`` for the architecture
            taints of the admitted architectures (:func:`rules.tolerations.arch_tolerations`).
        labels: the labels set; ``remove_labels``: the labels removed.
        record: the facts of the ``podplacement.io/decision`` annotation, in
            :data:`RECORD_FIELDS` order (empty: no annotation written).
        warnings: every Warning, the most serious first (the pod cannot run at all).
        events: the Events to emit: the first warning, else ``PlacementDecided``; then
            ``PlatformNotInCluster`` when no node of a platform the pod may run on exists
            yet, and ``ExecFormatExclusion`` when an exclusion narrowed the images'
            platforms.
        numa: the NUMA decision the placement was made with, or None when NUMA placement
            was off.
    """

    outcome: Outcome
    reason: str
    ungate: bool = False
    platforms: PlatformSet | None = None
    architectures: tuple[str, ...] = ()
    requirement: PlatformRequirement | None = None
    required: tuple[TermRestriction, ...] = ()
    preferred: tuple[dict[str, Any], ...] = ()
    tolerations: tuple[dict[str, str], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    remove_labels: tuple[str, ...] = ()
    record: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[EventSpec, ...] = ()
    events: tuple[EventSpec, ...] = ()
    numa: NumaLike | None = None

    @property
    def pairs(self) -> tuple[Pair, ...]:
        """The supported (os, architecture) pairs, sorted (empty: none or unknown)."""
        return self.platforms.pairs if self.platforms is not None else ()

    @property
    def annotation(self) -> str:
        """The compact JSON of ``podplacement.io/decision`` ("" when not written), at most
        :data:`MAX_DECISION_BYTES` bytes (:func:`bounded_record`)."""
        return compact_json(bounded_record(self.record)) if self.record else ""

    @property
    def numa_placed(self) -> bool:
        """True when the required terms are narrowed to NUMA candidates (the reconciler
        then holds the pod's requests on them: in-flight accounting)."""
        return self.labels.get(NUMA_LABEL) == NUMA_LABEL_PLACED


def _entries(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """The mappings of list ``spec[key]`` (another type counts as absent)."""
    items = spec.get(key)
    if not isinstance(items, list | tuple):
        return []
    return [item for item in items if isinstance(item, Mapping)]


def pod_images(pod: Mapping[str, Any]) -> list[ContainerImage]:
    """Every image the pod pulls, as written, duplicates kept, in this order: those of
    ``initContainers``, of ``containers``, then the image volumes' ``image.reference``
    (KEP-4639; ``pullPolicy`` in the role of ``imagePullPolicy``). The one enumeration of
    a pod's images: the controller, the webhook, the admission policy's ``images``
    (:data:`rules.admit.predicates.CEL_IMAGES`), ``explain``, the catalog feed and the monitors
    read it (through :func:`unique_images`). ``ephemeralContainers`` do not count (see
    :data:`CONTAINER_LISTS`). Entries of an unexpected type, and an empty image or
    reference, are skipped (never raises)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    out: list[ContainerImage] = []
    for kind in CONTAINER_LISTS:
        for c in _entries(spec, kind):
            if c.get("image"):
                out.append(
                    ContainerImage(
                        str(c.get("name") or ""),
                        str(c["image"]),
                        str(c.get("imagePullPolicy") or "IfNotPresent"),
                        kind == "initContainers",
                    )
                )
    for v in _entries(spec, VOLUMES):
        source = v.get(IMAGE_VOLUME)
        if isinstance(source, Mapping) and source.get(IMAGE_VOLUME_REFERENCE):
            out.append(
                ContainerImage(
                    str(v.get("name") or ""),
                    str(source[IMAGE_VOLUME_REFERENCE]),
                    str(source.get(IMAGE_VOLUME_PULL_POLICY) or "IfNotPresent"),
                    volume=True,
                )
            )
    return out


def unique_images(pod: Mapping[str, Any]) -> dict[str, bool]:
    """Distinct image references in :func:`pod_images` order (containers' and image
    volumes') → ``pull_always`` (any container using it has ``imagePullPolicy: Always``,
    or any image volume ``pullPolicy: Always``)."""
    out: dict[str, bool] = {}
    for ci in pod_images(pod):
        out[ci.image] = out.get(ci.image, False) or ci.pull_policy == PULL_ALWAYS
    return out


def short_error(exc: BaseException) -> str:
    """``exc`` in at most 200 characters (its type name when it has no text)."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def event_message(text: str) -> str:
    """``text`` cut to an Event's 1 kB."""
    return text if len(text) <= 1000 else text[:997] + "..."


def _warning(reason: str, text: str, action: str = "Place") -> EventSpec:
    return EventSpec(WARNING, reason, event_message(text), action)


# --- step 1: the images' results ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Inspection:
    """The pod's distinct images (pod order), each one's result, and the failed ones."""

    wanted: tuple[str, ...]
    results: Mapping[str, Any]
    errors: Mapping[str, BaseException]


def _image_entry(image: str, result: Any) -> dict[str, Any]:
    if isinstance(result, BaseException):
        return {"image": image, "error": short_error(result)}
    entry: dict[str, Any] = {"image": image}
    digest = getattr(result, "digest", None)
    if digest:
        entry["digest"] = digest
    entry["platforms"] = list(dict.fromkeys(
        f"{p.os}/{p.architecture}" + (f"/{p.variant}" if p.variant else "")
        + (f"@{v}" if (v := os_version_of(p)) else "")
        for p in getattr(result, "platforms", ())))
    if isinstance(result, LearnedImage):
        entry["excluded"] = [{"platform": x.platform, "proof": x.proof,
                              "since": iso(x.since or x.last_seen), "until": iso(x.expires)}
                             for x in result.excluded]
    return entry


def _exclusion_event(inspection: _Inspection) -> EventSpec | None:
    """The Normal ``ExecFormatExclusion`` Event of a pod whose images lost a platform to an
    exclusion (which image digest, which platform, since and until when, in our own words:
    :func:`rules.learn.exclusion_note`), or None."""
    notes = [exclusion_note(image, result.digest, x)
             for image in inspection.wanted
             if isinstance(result := inspection.results[image], LearnedImage)
             for x in result.excluded]
    if not notes:
        return None
    return EventSpec(NORMAL, EXEC_FORMAT_EXCLUSION, event_message("; ".join(notes)), "Place")


def _learned_note(inspection: _Inspection) -> str:
    """What exclusions left out of the images, for the reason (docs/exec-format-errors.md,
    "Learn"): ``linux/arm64 of IMAGE excluded: exec format error ...``."""
    notes: list[str] = []
    for image in inspection.wanted:
        result = inspection.results[image]
        if isinstance(result, LearnedImage):
            notes += [describe(x).replace(" excluded:", f" of {image} excluded:", 1)
                      for x in result.excluded]
    return "; ".join(notes)


def _inspection(pod: Mapping[str, Any],
                images: Mapping[str, ImageLike | BaseException]) -> _Inspection:
    """Each distinct image's result; a missing one counts as failed (not inspected)."""
    wanted = tuple(unique_images(pod))
    found = {i: images.get(i) for i in wanted}
    results = {i: LookupError("image not inspected") if r is None else r
               for i, r in found.items()}
    errors = {i: r for i, r in results.items() if isinstance(r, BaseException)}
    return _Inspection(wanted, results, errors)


def _retry(inspection: _Inspection, failures: int, max_retries: int) -> Placement:
    """Outcome ``retry``: the first failed image named; its Warning on the first round only."""
    first = next(iter(inspection.errors))
    msg = (f"inspecting image {first} failed (attempt {failures + 1} of {max_retries + 1}): "
           f"{short_error(inspection.errors[first])}")
    failed = _warning(IMAGE_INSPECTION_FAILED, msg, "Inspect")
    return Placement(Outcome.RETRY, msg, events=(failed,) if failures == 0 else ())


# --- step 2: the platform part -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Part:
    """What one step decides: outcome and reason, the annotation facts it adds, its
    warnings, and what it ANDs into the required terms (a platform requirement, then
    expressions with the key whose ``In`` pin keeps them out) and the preferred terms;
    ``notices``: Normal Events sent with the decision's own (``PlatformNotInCluster``)."""

    outcome: Outcome
    reason: str
    record: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[EventSpec, ...] = ()
    platforms: PlatformSet | None = None
    architectures: tuple[str, ...] = ()
    requirement: PlatformRequirement | None = None
    required: tuple[tuple[dict[str, Any], str | None], ...] = ()
    preferred: tuple[dict[str, Any], ...] = ()
    notices: tuple[EventSpec, ...] = ()


def _fallback(pod: Mapping[str, Any], inspection: _Inspection, config: PlacementConfig,
              when: str, policy: PlacementPolicy | None) -> _Part:
    """Inspection given up: outcome ``fallback``, the requirement of
    :func:`rules.place.fallback.fallback_requirement` (the fallback architecture when one
    applies, the fallback operating systems, the user's pins kept) ANDed into every term."""
    fallback = fallback_requirement(pod, config, policy)
    names = LIST_SEPARATOR.join(inspection.errors)
    reason = f"image inspection failed {when} ({names}); {fallback.text}"
    return _Part(Outcome.FALLBACK, reason, {RECORD_FALLBACK: fallback.fallback_architecture},
                 (_warning(PLACEMENT_FALLBACK, reason),), architectures=fallback.architectures,
                 required=fallback.required)


def _unsatisfiable(platforms: PlatformSet, entries: Sequence[Mapping[str, Any]]) -> _Part:
    """No platform common to all images: the marker no node has, in every term."""
    detail = "; ".join(f"{e['image']}: {','.join(e.get('platforms', [])) or 'none'}"
                       + (" (excluded " + ",".join(x["platform"] for x in e["excluded"]) + ")"
                          if e.get("excluded") else "")
                       for e in entries)
    return _Part(Outcome.NO_SUPPORTED_PLATFORM, REASON_NO_SUPPORTED_PLATFORM,
                 {RECORD_PLATFORMS: platforms.strings()},
                 (_warning(NO_SUPPORTED_PLATFORM_EVENT,
                           f"{REASON_NO_SUPPORTED_PLATFORM}: {detail}"),),
                 platforms, required=((unsatisfiable_marker(), ""),))


def _supported(pod: Mapping[str, Any], platforms: PlatformSet, config: PlacementConfig,
               node_selector: Mapping[str, Any], nodes: NodeInventory | None) -> _Part:
    """The exact pairs into the required terms, the preferred architectures, and the
    warnings about the user's pins and the cluster."""
    archs = platforms.architectures
    requirement = platform_requirement(pod, platforms.pairs, dict(platforms.builds))
    record: dict[str, Any] = {RECORD_PLATFORMS: platforms.strings(),
                              RECORD_OSES: list(platforms.oses)}
    if platforms.builds:
        record[RECORD_WINDOWS_BUILDS] = platforms.build_strings()
    if len(platforms.oses) > 1:
        # archs and oses combined are not what the pod may run on: record the exact pairs
        record[RECORD_PAIRS] = pairs_text(requirement.pairs)
    pinned = node_selector.get(ARCH_LABEL)
    preferred: list[dict[str, Any]] = []
    if pinned is None and config.preferred_platforms:
        weights = {p.architecture: p.weight for p in config.preferred_platforms}
        preferred = arch_preferences(pod, archs, weights)
    warnings = platform_warnings(requirement, node_selector,
                                 has_terms=bool(required_terms(pod)))
    waiting = platforms_without_node(requirement, nodes)
    notices: tuple[EventSpec, ...] = ()
    if waiting:
        record[RECORD_NO_NODE] = pairs_text(waiting)
        notices = (EventSpec(NORMAL, PLATFORM_NOT_IN_CLUSTER,
                             event_message(no_node_text(pairs_text(waiting))), "Place"),)
    outcome, reason = _platform_reason(requirement, platforms, pinned)
    return _Part(outcome, reason, record, tuple(warnings), platforms, archs, requirement,
                 preferred=tuple(preferred), notices=notices)


def _platform_reason(requirement: PlatformRequirement, platforms: PlatformSet,
                     pinned: Any) -> tuple[Outcome, str]:
    """``set`` when the requirement writes an expression, else ``not-set`` and why."""
    if requirement.appended and len(platforms.oses) > 1:
        return Outcome.SET, reason_text(REASON_REQUIRED_PLATFORMS, pairs_text(requirement.pairs))
    if requirement.appended:
        return Outcome.SET, reason_text(REASON_REQUIRED_ARCHITECTURES, platforms.architectures)
    if pinned is not None:
        return Outcome.NOT_SET, f"nodeSelector pins {ARCH_LABEL}={pinned}; affinity left as is"
    return Outcome.NOT_SET, REASON_ALREADY_PINNED


def platforms_without_node(requirement: PlatformRequirement,
                           nodes: NodeInventory | None) -> tuple[Pair, ...]:
    """The (os, architecture) pairs the pod may run on when no node of any of them exists
    yet (a pool that starts at zero, docs/pools/autoscalers.md), else ``()``.

    The pod may run on the pairs its written required terms admit
    (:attr:`rules.place.affinity.PlatformRequirement.pairs`, the ``nodeSelector`` included). The
    pod is placed for them all the same and stays Pending until a node of one registers:
    cluster-autoscaler and Karpenter read its required ``kubernetes.io/arch``/``os`` terms
    to choose what to create, and they act only on a pod the scheduler marked unschedulable,
    never on a gated one (cluster-autoscaler FAQ "How does scale-up work?"; Karpenter docs,
    "Scheduling"), so holding it gated would keep that node from ever coming.

    Args:
        requirement: the platform requirement written (:func:`rules.place.affinity.
            platform_requirement`).
        nodes: the cluster's node inventory, or None when unknown (the admission paths):
            nothing is said then, nor while no node at all is known (``node_count`` 0: a
            cache not filled yet).
    Returns:
        the pairs, sorted; ``()`` also when the user's own pins let no term admit a
        supported pair, or admit values no image supports (the pod may run there under
        emulation: it does not wait for ours).
    """
    if nodes is None or not nodes.node_count:
        return ()
    if not requirement.selected or not requirement.compatible:
        return ()
    if (requirement.outside_architectures or requirement.outside_oses
            or requirement.outside_pairs):
        return ()
    pairs = requirement.pairs
    if not pairs or set(pairs) & nodes.pairs:
        return ()
    return pairs


def no_node_text(platforms: Sequence[str]) -> str:
    """What the ``PlatformNotInCluster`` Event and ``explain`` say of ``platforms``
    (``os/arch`` strings: :func:`pairs_text` of :func:`platforms_without_node`, as the
    annotation's ``noNodeYet`` records them): ``no node of linux/arm64 exists yet: the pod
    waits for one (an autoscaler can create it)``."""
    return (f"no node of {LIST_SEPARATOR.join(platforms)} exists yet: the pod waits for one "
            "(an autoscaler can create it)")


def allowed_platforms(platforms: PlatformSet, policy: PlacementPolicy | None
                      ) -> tuple[PlatformSet, tuple[Pair, ...]]:
    """``platforms`` less the pairs the policy's ``allowedArchitectures`` remove
    (:func:`rules.policy.narrow`), and the removed pairs."""
    kept, removed = narrow(platforms.pairs, policy)
    if not removed:
        return platforms, ()
    variants = tuple(v for v in platforms.variants if (v[0], v[1]) in kept)
    builds = tuple(b for b in platforms.builds if b[0] in kept)
    return PlatformSet(kept, variants, platforms.image_count, builds), removed


def _not_allowed(platforms: PlatformSet, removed: Sequence[Pair],
                 policy: PlacementPolicy) -> _Part:
    """The policy allows none of the supported pairs: the unsatisfiable marker."""
    reason = reason_text(REASON_NOT_ALLOWED, [policy.name])
    message = (f"{reason}: allowed {LIST_SEPARATOR.join(policy.allowed_architectures or ())}, "
               f"removed {_listed(removed)}")
    return _Part(Outcome.NO_SUPPORTED_PLATFORM, reason,
                 {RECORD_PLATFORMS: [], RECORD_NOT_ALLOWED: pairs_text(removed)},
                 (_warning(NO_SUPPORTED_PLATFORM_EVENT, message),),
                 platforms, required=((unsatisfiable_marker(), ""),))


def _platform_part(pod: Mapping[str, Any], inspection: _Inspection, config: PlacementConfig,
                   *, nodes: NodeInventory | None, platforms: PlatformSet | None,
                   when: str, policy: PlacementPolicy | None = None) -> _Part:
    """The platform part: fallback after failures, nothing for a pod without images, the
    unsatisfiable marker, or the supported pairs (less those the policy does not allow)."""
    raw = (pod.get("spec") or {}).get("nodeSelector") or {}
    node_selector: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    if inspection.errors:
        return _fallback(pod, inspection, config, when, policy)
    if not inspection.wanted:
        return _Part(Outcome.NOT_SET, REASON_NO_IMAGES)
    found = (platforms if platforms is not None else
             supported_platforms([inspection.results[i] for i in inspection.wanted]))
    if found.empty:
        return _unsatisfiable(found, [_image_entry(i, inspection.results[i])
                                      for i in inspection.wanted])
    kept, removed = allowed_platforms(found, policy)
    if not removed:
        return _supported(pod, found, config, node_selector, nodes)
    assert policy is not None
    if kept.empty:
        return _not_allowed(kept, removed, policy)
    part = _supported(pod, kept, config, node_selector, nodes)
    warning = _warning(ARCHITECTURES_NOT_ALLOWED,
                       f"placement policy {policy.name} allows only architectures "
                       f"{LIST_SEPARATOR.join(policy.allowed_architectures or ())}: removed "
                       f"{_listed(removed)} from the platforms every image supports")
    return replace(part, record={**part.record,
                                             RECORD_NOT_ALLOWED: pairs_text(removed)},
                               warnings=(*part.warnings, warning))


# --- the warnings about the user's pins --------------------------------------------------


def platform_warnings(requirement: PlatformRequirement, node_selector: Mapping[str, Any],
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

    Rule sources: docs/how-it-decides.md, :func:`rules.place.affinity.platform_requirement`.
    """
    if not requirement.selected:
        return _selector_warnings(requirement, node_selector)
    if not has_terms:
        return []
    if not requirement.compatible:
        return [_incompatible_affinity(requirement)]
    return [*_left_out_warnings(requirement), *_partial_warnings(requirement)]


def _supported_values(supported: Sequence[Pair]) -> dict[str, tuple[list[str], str]]:
    return {ARCH_LABEL: (sorted({a for _, a in supported}), "architectures"),
            OS_LABEL: (sorted({o for o, _ in supported}), "operating systems")}


def _listed(pairs: Sequence[Pair]) -> str:
    return LIST_SEPARATOR.join(pairs_text(pairs)) or "none"


def _selector_warnings(requirement: PlatformRequirement,
                       node_selector: Mapping[str, Any]) -> list[EventSpec]:
    """``IncompatibleNodeSelector``: per pinned value no image supports, else one for a
    pair of pins that no image supports together."""
    out: list[EventSpec] = []
    for key, (known, noun) in _supported_values(requirement.supported).items():
        pin = node_selector.get(key)
        if pin is not None and str(pin) not in known:
            out.append(_warning(INCOMPATIBLE_NODE_SELECTOR,
                                f"nodeSelector {key}={pin} is not among the {noun} supported "
                                f"by every image ({', '.join(known)}){_CANNOT_RUN_THERE}"))
    if out:
        return out
    pins = ", ".join(f"{k}={node_selector.get(k)}" for k in (OS_LABEL, ARCH_LABEL))
    return [_warning(INCOMPATIBLE_NODE_SELECTOR,
                     f"nodeSelector {pins} names no platform every image supports "
                     f"({_listed(requirement.supported)}){_CANNOT_RUN_THERE}")]


def _incompatible_affinity(requirement: PlatformRequirement) -> EventSpec:
    outside = {ARCH_LABEL: requirement.outside_architectures,
               OS_LABEL: requirement.outside_oses}
    named = "; ".join(f"{k} {', '.join(v)}" for k, v in outside.items() if v)
    return _warning(INCOMPATIBLE_NODE_AFFINITY,
                    f"no required nodeSelectorTerm admits a platform the images support "
                    f"({_listed(requirement.supported)}); the terms' own pins allow only "
                    f"{named or 'other os/arch pairs'}; the pod's affinity is kept as written")


def _left_out_warnings(requirement: PlatformRequirement) -> list[EventSpec]:
    """``PlatformsLeftOut``: the pairs each term no longer admits, grouped by pairs."""
    left: dict[tuple[Pair, ...], list[str]] = {}
    for term in requirement.terms:
        if term.left_out:
            left.setdefault(term.left_out, []).append(str(term.index))
    if not left:
        return []
    return [_warning(PLATFORMS_LEFT_OUT,
                     "each required nodeSelectorTerm keeps the platforms of one OS (a gated "
                     "pod's terms can only be narrowed, KEP-3838): left out "
                     + "; ".join(f"{_listed(pairs)} from nodeSelectorTerms {', '.join(idx)}"
                                 for pairs, idx in left.items()))]


def _partial_warnings(requirement: PlatformRequirement) -> list[EventSpec]:
    """``PartiallyCompatibleAffinity``: pinned values, or pinned pairs, no image supports."""
    out: list[EventSpec] = []
    outside = {ARCH_LABEL: requirement.outside_architectures,
               OS_LABEL: requirement.outside_oses}
    for key, (known, noun) in _supported_values(requirement.supported).items():
        if outside[key]:
            out.append(_warning(PARTIALLY_COMPATIBLE_AFFINITY,
                                f"required nodeSelectorTerms also admit {key} "
                                f"{', '.join(outside[key])}, where the images cannot run "
                                f"(supported {noun}: {', '.join(known)}); those terms are "
                                "kept as written"))
    if requirement.outside_pairs:
        out.append(_warning(PARTIALLY_COMPATIBLE_AFFINITY,
                            f"required nodeSelectorTerms pin os/arch pairs the images do not "
                            f"support together ({_listed(requirement.outside_pairs)}; "
                            f"supported: {_listed(requirement.supported)}); those pins are "
                            "kept as written"))
    return out


# --- step 3: NUMA ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Numa:
    """The NUMA part: the annotation's ``numa`` facts, and either the candidates (required
    hostnames, preferred by score), the wait (``waiting``: its message), or the fallback
    without NUMA placement (``note`` and its warning)."""

    info: Mapping[str, Any]
    placed: bool = False
    waiting: str | None = None
    note: str = ""
    required: tuple[tuple[dict[str, Any], str | None], ...] = ()
    preferred: tuple[dict[str, Any], ...] = ()
    warnings: tuple[EventSpec, ...] = ()


def _numa_part(numa: NumaLike, config: PlacementConfig, waited: float) -> _Numa:
    """Candidates → ``kubernetes.io/hostname In [...]`` and one preferred term per
    candidate weighted by its score; none → wait until ``maxWaitSeconds`` (or not at all
    with ``unsatisfiable: Ungate``), then the fallback without NUMA placement."""
    info: dict[str, Any] = {"strategy": numa.strategy, "candidates": list(numa.candidates)}
    # node_policies() avoids building one verdict object per node (large clusters).
    policies = [p for p in numa.node_policies() if p]
    if policies:
        info["policy"] = policies if len(policies) > 1 else policies[0]
    if numa.candidates:
        preferred = tuple(
            {"weight": max(1, int(numa.scores.get(name, 0))),
             "preference": {"matchExpressions": [expression(HOSTNAME_LABEL, "In", [host])]}}
            for name, host in zip(numa.candidates, numa.hostnames, strict=False))
        return _Numa(info, placed=True,
                     note=f"NUMA candidates {', '.join(numa.candidates)}",
                     required=((hostname_requirement(list(numa.hostnames)), ""),),
                     preferred=preferred)
    topology = config.topology
    if topology.unsatisfiable != "Ungate" and waited < topology.max_wait_seconds:
        return _Numa(info, waiting=("no node can align the pod's resources to NUMA zones "
                                    f"now; waiting up to {int(topology.max_wait_seconds)}s"))
    why = ("unsatisfiable: Ungate" if topology.unsatisfiable == "Ungate"
           else f"waited {int(waited)}s >= maxWaitSeconds")
    note = f"no NUMA-aligned node ({why}); ungated without NUMA placement"
    return _Numa({**info, "result": "ungated-without-numa"}, note=note,
                 warnings=(_warning(PLACEMENT_FALLBACK, note),))


def _waiting(pod: Mapping[str, Any], part: _Part, numa: NumaLike, message: str) -> Placement:
    """Outcome ``wait-numa``: the label ``numa=waiting``, the gate kept; the Warning only
    when the pod starts waiting."""
    already = _current_labels(pod).get(NUMA_LABEL) == NUMA_LABEL_WAITING
    return Placement(Outcome.WAIT_NUMA, message, labels={NUMA_LABEL: NUMA_LABEL_WAITING},
                     events=() if already else (_warning(WAITING_FOR_NUMA, message, "Wait"),),
                     platforms=part.platforms, architectures=part.architectures,
                     requirement=part.requirement, numa=numa)


# --- step 4: the settled placement -------------------------------------------------------


def _current_labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = (pod.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _restrictions(pod: Mapping[str, Any], parts: Sequence[_Part | _Numa]
                  ) -> tuple[tuple[TermRestriction, ...], tuple[dict[str, Any], ...]]:
    """What the parts AND into the required terms, in order (the platform requirement
    first), and the preferred terms they append (:class:`rules.place.affinity.AffinityPlan`)."""
    terms = AffinityPlan(pod)
    for part in parts:
        if isinstance(part, _Part) and part.requirement is not None:
            terms.apply_platforms(part.requirement)
        for expr, unless_key in part.required:
            terms.require(expr, unless_key=unless_key)
        for term in part.preferred:
            terms.prefer(term["weight"], term["preference"]["matchExpressions"])
    return terms.restrictions(), terms.preferred_terms()


def _events(warnings: Sequence[EventSpec], reason: str) -> tuple[tuple[EventSpec, ...],
                                                                  tuple[EventSpec, ...]]:
    """The warnings, most serious first, and the one Event to emit: the first warning,
    else ``PlacementDecided``."""
    ordered = tuple(sorted(warnings, key=lambda w: w.reason not in _CANNOT_RUN))
    if ordered:
        return ordered, ordered[:1]
    return ordered, (EventSpec(NORMAL, PLACEMENT_DECIDED,
                               event_message(f"{reason}; scheduling gate removed"), "Ungate"),)


def toleration_text(toleration: Mapping[str, str]) -> str:
    """``kubernetes.io/arch=arm64:NoSchedule``: an added toleration as the decision
    annotation names it."""
    return f"{toleration['key']}={toleration['value']}:{toleration['effect']}"


def admitted_architectures(part: _Part) -> tuple[str, ...]:
    """The architectures the platform part admits for the images: those of the supported
    pairs some required term admits and the ``nodeSelector`` allows, sorted; ``()`` for
    the fallback, a pod without images and an unsatisfiable one."""
    requirement = part.requirement
    if requirement is None or part.outcome not in (Outcome.SET, Outcome.NOT_SET):
        return ()
    selected = set(requirement.selected)
    return tuple(sorted({a for o, a in requirement.pairs if (o, a) in selected}))


def _settled(pod: Mapping[str, Any], head: Mapping[str, Any], part: _Part,
             numa_part: _Numa | None, numa: NumaLike | None,
             policy: PlacementPolicy | None = None,
             taints: Sequence[ArchTaint] = ()) -> Placement:
    """The gate removed: the parts' restrictions, the tolerations of the architecture
    taints, the labels, the annotation's facts and the Event."""
    tolerations = arch_tolerations(admitted_architectures(part), pod, taints)
    parts: list[_Part | _Numa] = [part] if numa_part is None else [part, numa_part]
    required, preferred = _restrictions(pod, parts)
    placed = numa_part is not None and numa_part.placed
    note = numa_part.note if numa_part is not None else ""
    reason = "; ".join(r for r in (part.reason, note) if r)
    outcome = Outcome.SET if placed and part.outcome == Outcome.NOT_SET else part.outcome
    labels = placed_labels(affinity_set=any(t.expressions for t in required) or bool(preferred),
                           numa_placed=placed, policy=policy.name if policy else None)
    waiting = _current_labels(pod).get(NUMA_LABEL) == NUMA_LABEL_WAITING
    facts = {**head, **part.record, RECORD_ARCHS: list(part.architectures),
             RECORD_RESULT: outcome, RECORD_REASON: reason}
    if tolerations:
        facts[RECORD_TOLERATIONS] = [toleration_text(t) for t in tolerations]
    if numa_part is not None:
        facts[RECORD_NUMA] = numa_part.info
    warnings, events = _events(
        [*part.warnings, *(numa_part.warnings if numa_part is not None else ())], reason)
    events = (*events, *part.notices)
    return Placement(
        outcome, reason, ungate=True, platforms=part.platforms,
        architectures=part.architectures, requirement=part.requirement, required=required,
        preferred=preferred, tolerations=tolerations, labels=labels,
        remove_labels=(NUMA_LABEL,) if waiting and not placed else (),
        record={k: facts[k] for k in RECORD_FIELDS if k in facts},
        warnings=warnings, events=events, numa=numa)


@dataclass(frozen=True)
class PlacementInputs:
    """What a placement decision reads, built once per path (the controller's
    :func:`rules.place.plan.plan`, the webhook's :mod:`rules.place.admission`, the admission
    feed's :mod:`rules.monitor.admitted`) and passed whole to :func:`placement_facts`,
    :func:`rules.place.decision.decide` and the admission renderer.

    Only ``pod``, ``images`` and ``config`` are required; every other field has the value
    that means "not known" or "not this path".

    Fields:
        pod: the Pod (dict): the gated pod the controller reads, or the object being
            created (the webhook); its gate is not consulted by :func:`placement_facts`.
        images: result per distinct image reference of the pod (``ImageInfo`` or the
            exception raised inspecting it). Images missing from the map count as errors.
        config: the parsed PodPlacementConfig (defaults when none exists).
        nodes: node inventory (``PlatformNotInCluster`` and the annotation's
            ``noNodeYet``, :func:`platforms_without_node`); None: unknown.
        numa: the NUMA decision for the pod, or None when topology placement is off.
        failures: inspection rounds of this pod that already failed before this one.
        numa_waited_seconds: how long the pod has waited for NUMA candidates so far
            (seconds).
        config_error: the PodPlacementConfig could not be parsed (defaults are used; the
            annotation mentions it).
        platforms: the supported platforms of the pod's images when the caller already
            computed them (:func:`rules.place.plan.plan` does, once per pod); else computed
            by :func:`placement_facts`.
        path: the admission path that places the pod, written first into the annotation
            as ``"path"`` (``"webhook"``, docs/how-it-decides.md "The webhook after the
            policy"); None (the controller) writes no ``path``.
        give_up: set when no later attempt will follow (the webhook deciding at admission
            while no controller runs): an image without a result means the fallback at
            once, whatever ``failures`` says, and these words replace "after N attempts"
            in the reason (e.g. ``"at admission, no controller running"``).
        policy: the namespace's placement policy that applies to the pod
            (:func:`rules.policy.policy_for`), or None: the cluster's config alone.
        taints: the architecture taints seen on the Nodes
            (:func:`rules.tolerations.node_arch_taints`; the controller's view), or None:
            those the controller published in the config's status (the admission paths).
            With the configured ones (``spec.architectureTaints``,
            :meth:`rules.tolerations.ArchitectureTaints.known`) they give the tolerations.
    """

    pod: Mapping[str, Any]
    images: Mapping[str, ImageLike | BaseException]
    config: PlacementConfig
    nodes: NodeInventory | None = None
    numa: NumaLike | None = None
    failures: int = 0
    numa_waited_seconds: float = 0.0
    config_error: str | None = None
    platforms: PlatformSet | None = None
    path: str | None = None
    give_up: str | None = None
    policy: PlacementPolicy | None = None
    taints: Sequence[ArchTaint] | None = None


def placement_facts(inputs: PlacementInputs) -> Placement:
    """The placement of ``inputs.pod``, as facts (the module docstring's rules).

    Args:
        inputs: what the decision reads (:class:`PlacementInputs`, whose fields say what
            each one means).

    Exclusions: the platforms of ``config.excluded`` are left out of the results whose
    digest they name (:func:`rules.learn.learned_images`;
    docs/exec-format-errors.md, "Learn"); the images' entries in the annotation list them as
    ``excluded`` and the reason says why.

    Returns:
        the :class:`Placement`. Never raises for odd pod specs: they end in an ungate.
    """
    pod, images, config, policy = inputs.pod, inputs.images, inputs.config, inputs.policy
    failures, give_up, numa = inputs.failures, inputs.give_up, inputs.numa
    if policy is not None:
        config = policy.applied_to(config)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    inspection = _inspection(pod, learned_images(images, config.excluded, namespace=namespace))
    max_retries = config.image_inspection.max_retries
    if inspection.errors and give_up is None and failures < max_retries:
        return _retry(inspection, failures, max_retries)
    when = give_up if give_up is not None else f"after {failures + 1} attempts"
    part = _platform_part(pod, inspection, config, nodes=inputs.nodes,
                          platforms=inputs.platforms, when=when, policy=policy)
    learned = _learned_note(inspection)
    if learned and part.outcome != Outcome.FALLBACK:
        part = replace(part, reason=f"{part.reason}; {learned}")
    numa_part = None
    if numa is not None and numa.needed and part.outcome != Outcome.NO_SUPPORTED_PLATFORM:
        numa_part = _numa_part(numa, config, inputs.numa_waited_seconds)
        if numa_part.waiting is not None:
            return _waiting(pod, part, numa, numa_part.waiting)
    head: dict[str, Any] = {} if inputs.path is None else {RECORD_PATH: inputs.path}
    head[RECORD_IMAGES] = [_image_entry(i, inspection.results[i]) for i in inspection.wanted]
    if inputs.config_error:
        head[RECORD_CONFIG_ERROR] = inputs.config_error[:200]
    if policy is not None:
        head[RECORD_POLICY] = policy.name
    settled = _settled(pod, head, part, numa_part, numa, policy,
                       config.architecture_taints.known(inputs.taints))
    told = _exclusion_event(inspection)
    return settled if told is None else replace(settled, events=(*settled.events, told))


def fallback_release(pod: Mapping[str, Any], reason: str, config: PlacementConfig,
                     policy: PlacementPolicy | None = None) -> Placement:
    """Our gate removed without the images' platforms, keeping what is known: outcome
    ``fallback``, the requirement of :func:`rules.place.fallback.fallback_requirement`
    ANDed into every required term (a pod without terms gets one), the Warning
    ``PlacementFallback``; for the ordered uninstall and the stand-down (pods not placed
    within their deadline) and for a pod whose decision failed.

    Args:
        pod: the gated Pod (dict).
        reason: why it is released (the requirement's text is appended).
        config: the PodPlacementConfig in force; policy: the namespace's policy matching the
            pod, or None.

    Returns:
        the :class:`Placement`. Never raises for odd pod specs.
    """
    if policy is not None:
        config = policy.applied_to(config)
    fallback = fallback_requirement(pod, config, policy)
    reason = f"{reason}; {fallback.text}"
    terms = AffinityPlan(pod)
    for expr, unless_key in fallback.required:
        terms.require(expr, unless_key=unless_key)
    required = terms.restrictions()
    warning = _warning(PLACEMENT_FALLBACK, reason)
    facts: dict[str, Any] = {RECORD_FALLBACK: fallback.fallback_architecture,
                             RECORD_ARCHS: list(fallback.architectures),
                             RECORD_RESULT: Outcome.FALLBACK, RECORD_REASON: reason}
    if policy is not None:
        facts[RECORD_POLICY] = policy.name
    return Placement(
        Outcome.FALLBACK, reason, ungate=True, architectures=fallback.architectures,
        required=required,
        labels=placed_labels(affinity_set=any(t.expressions for t in required),
                             policy=policy.name if policy else None),
        remove_labels=(NUMA_LABEL,) if NUMA_LABEL in _current_labels(pod) else (),
        record={k: facts[k] for k in RECORD_FIELDS if k in facts},
        warnings=(warning,), events=(warning,))


def ungate_only(pod: Mapping[str, Any], reason: str) -> Placement:
    """Only our gate removed (labels and annotation say why), with the Warning
    ``PlacementFallback``: the last resort when the API server refused even the fallback's
    affinity (:func:`fallback_release`), or when that could not be computed."""
    return Placement(
        Outcome.NOT_SET, reason, ungate=True, labels=placed_labels(affinity_set=False),
        remove_labels=(NUMA_LABEL,) if NUMA_LABEL in _current_labels(pod) else (),
        record={RECORD_RESULT: Outcome.NOT_SET, RECORD_REASON: reason},
        events=(_warning(PLACEMENT_FALLBACK, reason),))
