"""Shared names and the PodPlacementConfig model.

This module is the one place where podplacement's API group, label keys, gate name and
annotation keys are spelled out (docs/design.md, "Names"); every other module imports them
from here. It also turns the ``PodPlacementConfig`` custom resource (a plain dict as the
Kubernetes JSON API returns it) into a frozen :class:`PlacementConfig`. The webhook imports
this module, so it must stay free of I/O and of imports from the rest of the controller.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from podplacement.imageinspect import DEFAULT_REFUSED_NETWORKS, IPNetwork, parse_networks
from podplacement.rules.tolerations import (
    TOLERATE_DISABLED,
    TOLERATE_ENABLED,
    ArchitectureTaints,
    TaintError,
    parse_taints,
)

# --- API --------------------------------------------------------------------------------
GROUP = "podplacement.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
CONFIG_KIND = "PodPlacementConfig"
CONFIG_PLURAL = "podplacementconfigs"
CONFIG_NAME = "cluster"
CONFIG_FINALIZER = f"{GROUP}/finalizer"
#: The errors of a preferred-platforms entry, shared with the policy's (:mod:`rules.policy`);
#: ``{!r}`` stands for the value.
INVALID_ARCHITECTURE = "invalid or duplicate architecture {!r}"
INVALID_WEIGHT = "weight must be an integer 1..100, got {!r}"

#: The namespaced placement policy (docs/guide/policies.md).
POLICY_KIND = "PodPlacementPolicy"
POLICY_PLURAL = "podplacementpolicies"

# --- Pod mutation names -----------------------------------------------------------------
SCHEDULING_GATE = f"{GROUP}/scheduling-gate"
GATE_LABEL = f"{GROUP}/scheduling-gate"
GATE_LABEL_GATED = "gated"
GATE_LABEL_REMOVED = "removed"
AFFINITY_LABEL = f"{GROUP}/node-affinity"
AFFINITY_LABEL_SET = "set"
AFFINITY_LABEL_NOT_SET = "not-set"
NUMA_LABEL = f"{GROUP}/numa"
NUMA_LABEL_WAITING = "waiting"
NUMA_LABEL_PLACED = "placed"
DECISION_ANNOTATION = f"{GROUP}/decision"
#: Label set on a pod placed under a PodPlacementPolicy: the policy's name (its namespace is
#: the pod's). The controller counts the pods carrying it into the policy's status.
POLICY_LABEL = f"{GROUP}/policy"
EXCLUDE_NAMESPACE_LABEL = f"{GROUP}/exclude-pod-placement"
NO_SUPPORTED_PLATFORM_KEY = f"{GROUP}/no-supported-platform"
#: Label set on a pod once a container of it failed with an exec format error; the annotation
#: of the same key holds what was seen (:mod:`rules.monitor.execformat`).
EXEC_FORMAT_LABEL = f"{GROUP}/exec-format-error"
EXEC_FORMAT_LABEL_TRUE = "true"
EXEC_FORMAT_ANNOTATION = f"{GROUP}/exec-format-error"
#: The Warning Event reason of a detection.
EXEC_FORMAT_REASON = "ExecFormatError"
#: Owners whose pods ``deleteFailedPods`` may delete (their controller recreates them).
REMEDIABLE_OWNER_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Job"})
#: Label and annotation (same key) the escape monitor writes on a pod that reached a node with
#: no placement record (:mod:`rules.monitor.escape`): the label's value is the verdict
#: (``fit``, ``unfit``, ``unknown``), the annotation's compact JSON says why.
ESCAPE_LABEL = f"{GROUP}/placement-escaped"
ESCAPE_ANNOTATION = f"{GROUP}/placement-escaped"
#: The pod condition type (same key) the escape monitor writes through ``pods/status``, which
#: a pod's creator cannot write (the API server resets ``status`` on create and keeps it on an
#: update of the pod; the ``edit`` role has no ``pods/status`` rights): the record counts only
#: with it, since the label and annotation are theirs to write too.
ESCAPE_CONDITION = f"{GROUP}/placement-escaped"
#: The Event reason of an escaped pod.
ESCAPE_REASON = "PlacementEscaped"
#: Longest ``status.execFormatErrorMonitor.excluded`` and ``.deletedPods`` lists.
MAX_EXCLUSIONS = 256
#: The PodPlacementConfig's status field where the controller publishes the architecture
#: taints it sees on the Nodes (``observed``; :mod:`rules.tolerations`).
STATUS_ARCH_TAINTS = "architectureTaints"
MAX_DELETED_PODS = 256
#: The proof of an exclusion that applies in every namespace: the controller's own
#: verification of the image's binaries (:data:`rules.findings.PROOF_VERIFICATION`).
EXCLUSION_PROOF_VERIFICATION = "verification"
#: Digests one exclusion names at most (the CRD's ``maxItems``).
MAX_EXCLUSION_DIGESTS = 8
WEBHOOK_CONFIGURATION_NAME = "podplacement-webhook"
WEBHOOK_NAME = "pods.podplacement.io"
#: The controller's leader-election Lease (in its own namespace); the webhook watches it.
LEASE_NAME = "podplacement-controller"
#: Seconds a released (or missing) controller Lease may stay without a holder before the
#: webhook treats the controller as gone and places pods itself: longer than a handover
#: (a standby takes a released Lease within one retry period, about 2 s), shorter than the
#: wait of a stopping leader before it stands down and releases the gated pods (at least
#: this plus one second: controller.app), so no pod the webhook gated meanwhile is left.
LEASE_RELEASED_GRACE_SECONDS = 4.0
#: deploy/'s ServiceAccount of the controller (the one whose finalizer guards the uninstall).
CONTROLLER_SERVICE_ACCOUNT = "podplacement-controller"
#: The MutatingAdmissionPolicy and its binding that gate pods inside the API server.
ADMISSION_POLICY_NAME = "podplacement-gate"
#: ``spec.admission.mechanism``: the policy when the API server serves it, or the webhook only.
ADMISSION_AUTO = "Auto"
ADMISSION_WEBHOOK = "Webhook"
#: ``spec.admission.fastPaths``: place warm pods at admission, or always gate.
FAST_PATHS_ENABLED = "Enabled"
FAST_PATHS_DISABLED = "Disabled"
#: ``spec.admission.inspectionBudget``: seconds the webhook may spend, counted from the start
#: of a review, inspecting (or, for ``imagePullPolicy: Always``, revalidating) a gated pod's
#: images it does not know yet before it leaves the pod to the controller; 0 inspects
#: nothing at admission. The default is a few registry round trips on a nearby registry.
DEFAULT_INSPECTION_BUDGET = 0.3
#: ``spec.admission.pullAlwaysFreshness``: seconds for which the controller's check of a
#: tag's digest lets the admission policy place a pod that pulls that tag with
#: ``imagePullPolicy: Always`` (:mod:`rules.freshness`); 0 leaves every such pod to
#: the webhook or the controller, which check the digest per pod. The kubelet pulls seconds
#: after admission anyway: an answer this old closes the same race as a fresh one.
DEFAULT_PULL_ALWAYS_FRESHNESS = 5.0
#: Its upper bound (also the CRD's CEL rule).
MAX_PULL_ALWAYS_FRESHNESS = 60.0
#: Its upper bound (also the CRD's CEL rule): the API server waits for the webhook at most
#: its configuration's ``timeoutSeconds`` (5 s, ``rules.admit.webhookconfig``) and then
#: applies ``failurePolicy: Ignore``; 1 s stays for the connection, the body and the answer.
MAX_INSPECTION_BUDGET = 4.0
#: The params object of the admission policy: ``ImagePlatformCatalog`` named ``cluster`` in the
#: product's namespace; its catalog (:mod:`rules.admit.imageparams`): ``spec.repositories``
#: (repository → tag or digest suffix → platform-set code), ``spec.platformSets`` (code →
#: sorted, comma-separated ``os/arch`` platforms) and ``spec.learnedAt`` (repository → tag
#: suffix → unix second a registry answered for it); anonymous inspection results only.
PARAMS_KIND = "ImagePlatformCatalog"
PARAMS_PLURAL = "imageplatformcatalogs"
PARAMS_NAME = "cluster"
#: Bounds of the params object (also in the CRD's schema): entries (references), and bytes
#: of the ``spec.repositories``, ``spec.platformSets`` and ``spec.learnedAt`` maps together.
#: The byte bound binds first: a tag reference costs at least about 25 bytes there (its
#: suffix with its code, and its suffix with a ten-digit time), so 1,000,000 bytes hold
#: fewer than 40,000; the CRD's ``maxProperties`` of each map is :data:`PARAMS_MAX_ENTRIES`.
PARAMS_MAX_ENTRIES = 50_000
PARAMS_MAX_BYTES = 1_000_000
#: ``maxProperties`` of ``spec.platformSets`` in the CRD (distinct platform sets in use:
#: a handful in practice; a set beyond it is not recorded).
PARAMS_MAX_SETS = 1000
#: ``maxProperties`` of the previous release's flat ``spec.images``/``spec.learned`` (still
#: read on an upgrade, never written).
PARAMS_LEGACY_MAX_ENTRIES = 5000
FIELD_MANAGER = "podplacement"
#: What the admission policy's place branch writes first into the decision annotation.
ADMISSION_PATH_MARK = '"path":"admission"'
#: The decision annotation's field that names the catalog (the params object, by its
#: ``metadata.uid``) the admission policy placed the pod from (:func:`admission_mark`).
RECORD_CATALOG = "catalog"


def admission_mark(catalog_uid: str) -> str:
    """The text that starts the decision annotation of a pod the admission policy placed
    from the params object whose ``metadata.uid`` is ``catalog_uid``:
    ``"path":"admission","catalog":"<uid>"``.

    The webhook configuration's matchCondition skips a pod only when its annotation
    carries the mark of the params object that exists now (written by the controller,
    :func:`rules.admit.webhookconfig.desired_webhook_configuration`). A pod's creator
    can copy a mark from another pod, but only while that params object exists, and while
    it exists the policy runs on every pod it matches and overwrites the annotation (place)
    or sets the gate label (gate), so a copied mark never skips placement; a new params
    object has a new uid, which makes every old mark stale (docs/design.md: what a pod's
    creator can set is never trusted).
    """
    return f'{ADMISSION_PATH_MARK},"{RECORD_CATALOG}":"{catalog_uid}"'

#: Data key of the ConfigMap named by ``spec.imageInspection.registriesConfigMapRef``.
REGISTRIES_CONF_KEY = "registries.conf"

# --- Well-known Kubernetes names --------------------------------------------------------
ARCH_LABEL = "kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"
#: The ``kubernetes.io/os`` value of Linux nodes (also assumed for a node without the label,
#: as the kubelet sets it on every node); the OS a term keeps first when one term cannot name
#: several OSes exactly (``rules.place.affinity.platform_requirement``).
LINUX = "linux"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: The ``kubernetes.io/os`` value of Windows nodes.
WINDOWS = "windows"
#: The node label the kubelet sets on Windows nodes to the host's build, ``major.minor.build``
#: (e.g. ``10.0.17763``); a process-isolated Windows container runs only on a host of its
#: image's build (kubernetes.io: "Well-Known Labels, Annotations and Taints",
#: ``node.kubernetes.io/windows-build``; "Windows containers in Kubernetes").
WINDOWS_BUILD_LABEL = "node.kubernetes.io/windows-build"
#: The annotation the kubelet puts on the mirror pod of a static pod (its manifest's hash).
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
DEFAULT_NAMESPACE = "podplacement-system"
ARCHITECTURES = ("amd64", "arm64", "ppc64le", "s390x")
#: The ``kubernetes.io/os`` values of the nodes the kubelet runs on (the CRD's enum of
#: ``spec.fallbackOperatingSystems``).
OPERATING_SYSTEMS = (LINUX, WINDOWS)
#: ``spec.fallbackOperatingSystems`` when unset: a pod released without its images'
#: platforms still requires a Linux node (``rules.place.fallback``).
DEFAULT_FALLBACK_OPERATING_SYSTEMS = (LINUX,)

# --- NodeResourceTopology ---------------------------------------------------------------
NRT_GROUP = "topology.node.k8s.io"
NRT_VERSION = "v1alpha2"
NRT_PLURAL = "noderesourcetopologies"

METRICS_PREFIX = "podplacement_"

#: ``spec.logVerbosity`` -> loggers set to DEBUG (Normal: none; the ``--log-level`` applies).
LOG_VERBOSITY_LOGGERS: dict[str, tuple[str, ...]] = {
    "Normal": (),
    "Debug": ("podplacement.controller", "podplacement.imageinspect", "podplacement.webhook",
              "podplacement.certs"),
    "Trace": ("podplacement.controller", "podplacement.imageinspect", "podplacement.webhook",
              "podplacement.certs", "aiohttp.client", "kubernetes"),
}

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


class ConfigError(ValueError):
    """A PodPlacementConfig field has a value the controller cannot use.

    Attributes:
        path: the JSON path of the field, e.g. ``spec.imageInspection.cacheTTL``.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def parse_duration(text: str, path: str = "duration") -> float:
    """Parse a Go ``time.Duration`` string (``"6h"``, ``"1h30m"``, ``"90s"``) into seconds.

    Raises:
        ConfigError: the text is empty or not a sequence of ``<number><h|m|s|ms>``.
    """
    text = text.strip()
    pos, total = 0, 0.0
    for match in _DURATION_RE.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ConfigError(path, f"invalid duration {text!r} (want e.g. '6h', '30m', '90s')")
    return total


@dataclass(frozen=True, slots=True)
class PlatformWeight:
    """One preferred architecture and its scheduler weight (1..100)."""

    architecture: str
    weight: int


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """A namespaced object reference (``{namespace, name}``)."""

    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class TopologyConfig:
    """``spec.topology``: NUMA-aware placement settings (see controller NUMA code).

    ``scoring_strategy`` is one of MostAllocated, LeastAllocated, BalancedAllocation,
    LeastNUMANodes (scheduler-plugins NodeResourceTopologyMatch score strategies).
    """

    enabled: bool = False
    scoring_strategy: str = "LeastAllocated"
    max_candidate_nodes: int = 16
    nodes_without_topology: str = "Allow"
    max_wait_seconds: float = 300.0
    unsatisfiable: str = "Wait"


@dataclass(frozen=True, slots=True)
class ImageInspectionConfig:
    """``spec.imageInspection``: registry lookups (TTL in seconds, timeout in seconds).

    ``refused_networks`` is ``refusedNetworks``: the networks no registry, token realm or
    redirect may be reached in (``imageinspect.parse_networks``); when the field is set it
    replaces the default ``imageinspect.DEFAULT_REFUSED_NETWORKS`` (link-local and the
    clouds' metadata addresses; not loopback).
    """

    cache_ttl_seconds: float = 6 * 3600.0
    max_retries: int = 5
    registry_timeout_seconds: float = 10.0
    global_pull_secret: ObjectRef | None = None
    registries_config_map: ObjectRef | None = None
    refused_networks: tuple[IPNetwork, ...] = parse_networks(DEFAULT_REFUSED_NETWORKS)


@dataclass(frozen=True, slots=True)
class ExcludedPlatform:
    """One (image content, platform) pair the controller learned is wrong: placement drops
    the platform from every image result whose digest is one of :attr:`digests`
    (docs/exec-format-errors.md, "Learn"; the rule: :func:`rules.learn.exclusions`).

    Scope (docs/exec-format-errors.md, "Who it applies to"): an exclusion proven by the
    controller's own verification of the image's binaries (``proof`` ``verification``)
    applies in every namespace (:attr:`namespace` ``""``); one resting on exec format errors
    alone (``exec-format-errors``: words a container can print itself) applies only to the
    pods of the :attr:`namespace` they were seen in (:meth:`applies_to`).

    Attributes:
        digests: the digests of that content (sorted): the digest the node ran (the status
            ``imageID``) and, when verification ran, the index digest and the platform's
            own manifest digest (for an exclusion of one namespace, also the digest
            placement recorded for the pod's image reference).
        os, architecture: the platform excluded (``linux``, ``arm64``).
        proof: ``verification`` (its binary is for another machine) or
            ``exec-format-errors`` (at least two on nodes of that architecture).
        errors: exec format errors counted.
        last_seen: unix seconds of the latest evidence (an error, or the verification), as
            the controller's clock saw it (never later than when it was seen).
        expires: unix seconds when the exclusion ends unless new evidence comes
            (``last_seen`` + ``imageInspection.cacheTTL``, never more).
        image: an image reference, as written in a pod, that ran the digest.
        reason: one sentence on the proof (the verification's reason, or the error count).
        namespace: the one namespace whose pods it applies to; ``""``: every namespace
            (only with ``proof`` ``verification``).
        since: unix seconds of its first evidence (the verification, or the first error).
    """

    digests: tuple[str, ...]
    os: str
    architecture: str
    proof: str
    errors: int = 0
    last_seen: float = 0.0
    expires: float = 0.0
    image: str = ""
    reason: str = ""
    namespace: str = ""
    since: float = 0.0

    def applies_to(self, namespace: str | None) -> bool:
        """Whether the exclusion applies to a pod of ``namespace`` (None: a reader that
        places no pod of any one namespace, e.g. the catalog: every exclusion counts)."""
        return namespace is None or not self.namespace or self.namespace == namespace

    @property
    def platform(self) -> str:
        """``os/architecture``."""
        return f"{self.os}/{self.architecture}"

    def to_status(self) -> dict[str, Any]:
        """The ``status.execFormatErrorMonitor.excluded[]`` item. Times are whole unix
        seconds: the last evidence rounded down, and the expiry the same span after that
        (rounded up), so that an exclusion taken back from the status after a restart
        publishes the same values (never a younger one)."""
        last_seen = math.floor(self.last_seen)
        expires = math.ceil(last_seen + (self.expires - self.last_seen))
        out: dict[str, Any] = {"digests": list(self.digests[:MAX_EXCLUSION_DIGESTS]),
                               "platform": self.platform, "proof": self.proof,
                               "errors": self.errors, "lastSeen": last_seen,
                               "expires": expires, "image": self.image[:512],
                               "reason": self.reason[:300],
                               "since": min(math.floor(self.since), last_seen)}
        if self.namespace:
            out["namespace"] = self.namespace
        return out

    @classmethod
    def from_status(cls, item: Any, *, max_age: float | None = None
                    ) -> ExcludedPlatform | None:
        """Parse one ``excluded[]`` item; None when it is malformed (no digest, a platform
        that is not ``os/arch``, times that are not numbers), when it has no ``since`` (an
        item an earlier release wrote: its evidence may have come from a pod's annotation,
        so it is not taken back), or when it rests on errors alone (``proof`` other than
        ``verification``) without a ``namespace``: such evidence never applies cluster-wide.
        With ``max_age`` (seconds, ``imageInspection.cacheTTL``), ``expires`` is cut to
        ``lastSeen`` + ``max_age``."""
        if not isinstance(item, Mapping):
            return None
        digests = item.get("digests")
        platform = item.get("platform")
        if (not isinstance(digests, list) or not digests
                or not all(isinstance(d, str) and d for d in digests)
                or not isinstance(platform, str)):
            return None
        os_name, sep, arch = platform.partition("/")
        if not sep or not os_name or not arch or "/" in arch:
            return None
        numbers = [item.get(k, 0) for k in ("errors", "lastSeen", "expires", "since")]
        if (any(isinstance(n, bool) or not isinstance(n, int | float) for n in numbers)
                or "since" not in item):
            return None
        proof, namespace = str(item.get("proof") or ""), item.get("namespace") or ""
        if not isinstance(namespace, str) or (proof != EXCLUSION_PROOF_VERIFICATION
                                              and not namespace):
            return None
        last_seen, expires = float(numbers[1]), float(numbers[2])
        if max_age is not None:
            expires = min(expires, last_seen + max_age)
        return cls(tuple(sorted(set(digests))), os_name, arch, proof,
                   int(numbers[0]), last_seen, expires,
                   str(item.get("image") or ""), str(item.get("reason") or ""),
                   namespace, min(float(numbers[3]), last_seen))


def excluded_from_status(obj: Mapping[str, Any], *, max_age: float | None = None
                         ) -> tuple[ExcludedPlatform, ...]:
    """The exclusions a PodPlacementConfig object carries in
    ``status.execFormatErrorMonitor.excluded`` (items :meth:`ExcludedPlatform.from_status`
    refuses skipped, at most :data:`MAX_EXCLUSIONS`; ``max_age``: see there). The leading
    controller keeps that list to the exclusions in force: it removes one when it expires,
    so readers (the webhook) take the list as it is."""
    status = obj.get("status")
    monitor = status.get("execFormatErrorMonitor") if isinstance(status, Mapping) else None
    items = monitor.get("excluded") if isinstance(monitor, Mapping) else None
    if not isinstance(items, list):
        return ()
    out = [x for x in (ExcludedPlatform.from_status(i, max_age=max_age)
                       for i in items[:MAX_EXCLUSIONS]) if x is not None]
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """The parsed spec of the PodPlacementConfig ``cluster``.

    ``namespace_selector`` is a metav1.LabelSelector dict (opt-out: matching namespaces are
    not processed); ``preferred_platforms`` is empty unless
    ``plugins.nodeAffinityScoring.enabled`` is true; ``exec_format_monitor`` is
    ``plugins.execFormatErrorMonitor.enabled`` (default true: detection, Events, metrics),
    ``exec_format_learn`` its ``learn`` (default true: placement leaves out the platforms
    proven wrong) and ``delete_failed_pods`` its ``deleteFailedPods`` (default false).
    ``escape_monitor`` is ``plugins.placementEscapes.enabled`` (default true: pods that
    reached a node with no placement record get the ``PlacementEscaped`` Event, the
    ``podplacement.io/placement-escaped`` record and the metric) and ``delete_unfit_pods``
    its ``deleteUnfitPods`` (default true: such a pod on a node its images can't run is
    deleted when a ReplicaSet, StatefulSet or Job controls it; :mod:`rules.monitor.escape`).
    ``excluded`` is not spec: the exclusions in force that the controller published in
    ``status.execFormatErrorMonitor.excluded`` (:func:`excluded_from_status`), read with the
    object so that every reader of the config (the webhook, ``explain``) places as the
    controller does; empty unless both ``enabled`` and ``learn`` are true.
    ``admission_inspection_budget`` is in seconds (``spec.admission.inspectionBudget``,
    0..:data:`MAX_INSPECTION_BUDGET`); ``admission_pull_always_freshness`` too
    (``spec.admission.pullAlwaysFreshness``, 0..:data:`MAX_PULL_ALWAYS_FRESHNESS`).
    ``architecture_taints`` is ``spec.architectureTaints`` (``tolerate``, ``taints``) with
    the taints published in ``status.architectureTaints.observed``
    (:class:`rules.tolerations.ArchitectureTaints`).
    ``fallback_operating_systems`` is ``spec.fallbackOperatingSystems``, sorted, never empty:
    the ``kubernetes.io/os`` values a pod released without its images' platforms still requires
    (:func:`rules.place.fallback.fallback_requirement`).
    """

    log_verbosity: str = "Normal"
    namespace_selector: Mapping[str, Any] | None = None
    preferred_platforms: tuple[PlatformWeight, ...] = ()
    fallback_architecture: str | None = None
    fallback_operating_systems: tuple[str, ...] = DEFAULT_FALLBACK_OPERATING_SYSTEMS
    image_inspection: ImageInspectionConfig = field(default_factory=ImageInspectionConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    admission_mechanism: str = ADMISSION_AUTO
    admission_fast_paths: str = FAST_PATHS_ENABLED
    exec_format_monitor: bool = True
    exec_format_learn: bool = True
    delete_failed_pods: bool = False
    escape_monitor: bool = True
    delete_unfit_pods: bool = True
    excluded: tuple[ExcludedPlatform, ...] = ()
    admission_inspection_budget: float = DEFAULT_INSPECTION_BUDGET
    admission_pull_always_freshness: float = DEFAULT_PULL_ALWAYS_FRESHNESS
    architecture_taints: ArchitectureTaints = field(default_factory=ArchitectureTaints)
    generation: int = 0

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PlacementConfig:
        """Build from a PodPlacementConfig object (``{"metadata": ..., "spec": ...}``).

        Missing fields take their defaults. Raises:
            ConfigError: a field has the wrong type or an unusable value.
        """
        spec = obj.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise ConfigError("spec", "must be an object")
        plugins = _mapping(spec, "plugins", "spec")
        scoring = plugins.get("nodeAffinityScoring") or {}
        platforms: list[PlatformWeight] = []
        if scoring.get("enabled"):
            seen: set[str] = set()
            for i, item in enumerate(scoring.get("platforms") or []):
                path = f"spec.plugins.nodeAffinityScoring.platforms[{i}]"
                arch, weight = item.get("architecture"), item.get("weight")
                if not isinstance(arch, str) or arch in seen:
                    raise ConfigError(path, INVALID_ARCHITECTURE.format(arch))
                if not isinstance(weight, int) or not 1 <= weight <= 100:
                    raise ConfigError(path, INVALID_WEIGHT.format(weight))
                seen.add(arch)
                platforms.append(PlatformWeight(arch, weight))
        ii = _mapping(spec, "imageInspection", "spec")
        inspection = ImageInspectionConfig(
            cache_ttl_seconds=parse_duration(
                str(ii.get("cacheTTL", "6h")), "spec.imageInspection.cacheTTL"
            ),
            max_retries=_int(ii, "maxRetries", 5, "spec.imageInspection"),
            registry_timeout_seconds=float(
                _int(ii, "registryTimeoutSeconds", 10, "spec.imageInspection")
            ),
            global_pull_secret=_ref(ii.get("globalPullSecretRef"), "globalPullSecretRef"),
            registries_config_map=_ref(ii.get("registriesConfigMapRef"), "registriesConfigMapRef"),
            refused_networks=_networks(ii.get("refusedNetworks", DEFAULT_REFUSED_NETWORKS),
                                       "spec.imageInspection.refusedNetworks"),
        )
        topo = _mapping(spec, "topology", "spec")
        topology = TopologyConfig(
            enabled=bool(topo.get("enabled", False)),
            scoring_strategy=str(topo.get("scoringStrategy", "LeastAllocated")),
            max_candidate_nodes=_int(topo, "maxCandidateNodes", 16, "spec.topology"),
            nodes_without_topology=str(topo.get("nodesWithoutTopology", "Allow")),
            max_wait_seconds=float(_int(topo, "maxWaitSeconds", 300, "spec.topology")),
            unsatisfiable=str(topo.get("unsatisfiable", "Wait")),
        )
        selector = spec.get("namespaceSelector")
        admission = _mapping(spec, "admission", "spec")
        mechanism = admission.get("mechanism", ADMISSION_AUTO)
        if mechanism not in (ADMISSION_AUTO, ADMISSION_WEBHOOK):
            raise ConfigError("spec.admission.mechanism",
                              f"must be {ADMISSION_AUTO} or {ADMISSION_WEBHOOK}, got {mechanism!r}")
        fast_paths = admission.get("fastPaths", FAST_PATHS_ENABLED)
        if fast_paths not in (FAST_PATHS_ENABLED, FAST_PATHS_DISABLED):
            raise ConfigError("spec.admission.fastPaths", f"must be {FAST_PATHS_ENABLED} or "
                              f"{FAST_PATHS_DISABLED}, got {fast_paths!r}")
        switches = _switches(_mapping(plugins, "execFormatErrorMonitor", "spec.plugins"),
                             "spec.plugins.execFormatErrorMonitor",
                             {"enabled": True, "learn": True, "deleteFailedPods": False})
        learn = switches["enabled"] and switches["learn"]
        escapes = _switches(_mapping(plugins, "placementEscapes", "spec.plugins"),
                            "spec.plugins.placementEscapes",
                            {"enabled": True, "deleteUnfitPods": True})
        inspection_budget = _bounded_duration(
            admission, "inspectionBudget", DEFAULT_INSPECTION_BUDGET, MAX_INSPECTION_BUDGET,
            " (the webhook's timeout is 5s)")
        freshness = _bounded_duration(admission, "pullAlwaysFreshness",
                                      DEFAULT_PULL_ALWAYS_FRESHNESS, MAX_PULL_ALWAYS_FRESHNESS)
        return cls(
            log_verbosity=str(spec.get("logVerbosity", "Normal")),
            namespace_selector=selector if isinstance(selector, Mapping) else None,
            preferred_platforms=tuple(platforms),
            fallback_architecture=spec.get("fallbackArchitecture") or None,
            fallback_operating_systems=_operating_systems(spec.get("fallbackOperatingSystems")),
            image_inspection=inspection,
            topology=topology,
            admission_mechanism=str(mechanism),
            admission_fast_paths=str(fast_paths),
            exec_format_monitor=switches["enabled"],
            exec_format_learn=switches["learn"],
            delete_failed_pods=switches["deleteFailedPods"],
            escape_monitor=escapes["enabled"],
            delete_unfit_pods=escapes["deleteUnfitPods"],
            excluded=(excluded_from_status(obj, max_age=inspection.cache_ttl_seconds)
                      if learn else ()),
            admission_inspection_budget=inspection_budget,
            admission_pull_always_freshness=freshness,
            architecture_taints=_architecture_taints(spec, obj),
            generation=int((obj.get("metadata") or {}).get("generation") or 0),
        )


def _architecture_taints(spec: Mapping[str, Any], obj: Mapping[str, Any]
                         ) -> ArchitectureTaints:
    """``spec.architectureTaints`` (``tolerate``: ``Enabled`` | ``Disabled``, default
    ``Enabled``; ``taints``: the pools without a node yet) and the taints the controller
    published from the Nodes in ``status.architectureTaints.observed`` (malformed items
    dropped). :mod:`rules.tolerations`.

    Raises:
        ConfigError: ``tolerate`` is another value, or ``taints`` is malformed.
    """
    section = _mapping(spec, "architectureTaints", "spec")
    tolerate = section.get("tolerate", TOLERATE_ENABLED)
    if tolerate not in (TOLERATE_ENABLED, TOLERATE_DISABLED):
        raise ConfigError("spec.architectureTaints.tolerate",
                          f"must be {TOLERATE_ENABLED} or {TOLERATE_DISABLED}, "
                          f"got {tolerate!r}")
    try:
        taints = parse_taints(section.get("taints"), "spec.architectureTaints.taints")
    except TaintError as exc:
        raise ConfigError("spec.architectureTaints.taints", str(exc)) from None
    status = obj.get("status")
    published = status.get(STATUS_ARCH_TAINTS) if isinstance(status, Mapping) else None
    observed = parse_taints(published.get("observed") if isinstance(published, Mapping)
                            else None, "status.architectureTaints.observed", strict=False)
    return ArchitectureTaints(tolerate == TOLERATE_ENABLED, taints, observed)


def _bounded_duration(admission: Mapping[str, Any], key: str, default: float,
                      maximum: float, why: str = "") -> float:
    """``spec.admission.<key>``: a Go duration in seconds, ``default`` when absent.

    Raises:
        ConfigError: not a duration, or over ``maximum`` seconds (``why`` says why).
    """
    raw = admission.get(key)
    path = f"spec.admission.{key}"
    value = default if raw is None else parse_duration(str(raw), path)
    if value > maximum:
        raise ConfigError(path, f"must be at most {maximum:g}s{why}, got {raw!r}")
    return value


def _mapping(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}.{key}", "must be an object")
    return value


def _operating_systems(value: Any) -> tuple[str, ...]:
    """``spec.fallbackOperatingSystems``: a non-empty list of :data:`OPERATING_SYSTEMS`
    (duplicates dropped, sorted); absent or null: :data:`DEFAULT_FALLBACK_OPERATING_SYSTEMS`."""
    path = "spec.fallbackOperatingSystems"
    if value is None:
        return DEFAULT_FALLBACK_OPERATING_SYSTEMS
    if not isinstance(value, list) or not value:
        raise ConfigError(path, f"must be a non-empty list, got {value!r}")
    for item in value:
        if item not in OPERATING_SYSTEMS:
            raise ConfigError(path, f"must list only {', '.join(OPERATING_SYSTEMS)}, "
                                    f"got {item!r}")
    return tuple(sorted(set(value)))


def _switches(parent: Mapping[str, Any], path: str, defaults: Mapping[str, bool]
              ) -> dict[str, bool]:
    """The boolean fields ``defaults`` names, read from ``parent`` (absent: the default).

    Raises:
        ConfigError: a field is not a boolean.
    """
    out: dict[str, bool] = {}
    for key, default in defaults.items():
        value = parent.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{path}.{key}", f"must be a boolean, got {value!r}")
        out[key] = value
    return out


def _networks(value: Any, path: str) -> tuple[IPNetwork, ...]:
    """A list of CIDR strings → networks (``imageinspect.parse_networks``); ConfigError on
    another shape."""
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(path, "must be a list of CIDR strings")
    try:
        return parse_networks(value)
    except ValueError as exc:
        raise ConfigError(path, str(exc)) from None


def _int(parent: Mapping[str, Any], key: str, default: int, path: str) -> int:
    value = parent.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{path}.{key}", f"must be a non-negative integer, got {value!r}")
    return value


def _ref(value: Any, name: str) -> ObjectRef | None:
    if not value:
        return None
    if not isinstance(value, Mapping) or not value.get("name"):
        raise ConfigError(f"spec.imageInspection.{name}", "needs namespace and name")
    return ObjectRef(str(value.get("namespace") or DEFAULT_NAMESPACE), str(value["name"]))


def config_or_defaults(obj: Mapping[str, Any] | None) -> tuple[PlacementConfig, str | None]:
    """The one fallback of every reader of the PodPlacementConfig ``cluster``: its parsed
    form, or the defaults when there is none (error None) or when it does not parse (the
    error's text; the controller then decides with the defaults, so pods still get
    ungated, and says so in its status and the decision annotation).

    Never raises.
    """
    if not obj:
        return PlacementConfig(), None
    try:
        return PlacementConfig.from_object(obj), None
    except (ConfigError, TypeError, ValueError, AttributeError) as exc:
        return PlacementConfig(), str(exc)
