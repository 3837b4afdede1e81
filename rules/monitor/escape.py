"""Escapes: pods that reached a node with no placement record, what their node makes of
them, and the one repair (docs/escaped-pods.md).

Every placing path writes the label ``podplacement.io/node-affinity`` (``set`` / ``not-set``,
:func:`rules.place.placement.placed_labels`): the admission policy, the webhook, the
controller's PATCH, a plain ungate. A pod bound to a node without it escaped placement:
admitted while the webhook was unreachable with ``spec.admission.mechanism: Webhook``
(``failurePolicy: Ignore``), created before the admission objects existed, or created with
``spec.nodeName`` already set (the webhook skips those, ``node_name_set``: the pod alone
cannot tell them apart; they are reported like the others and never deleted, see
:func:`repair_owner`). The rules, pure (no I/O, no clock: callers pass ``now``):

- :func:`watch_params`: what the API server selects (no placement label, no escape record,
  bound, not ended, not in a system namespace or the product's own); :func:`skip_reason`
  what the monitor still leaves alone (the pods the product deliberately does not place,
  :mod:`rules.scope`, and the pods created before the PodPlacementConfig existed:
  nothing was placed then).
- :func:`record_doubt` and :func:`placement_doubt`: the label and the decision annotation
  are what a pod's creator can write too, so a labelled pod (which the monitor sees through
  the watch of placed pods) is left alone only when its record reproduces from its spec (the
  node affinity its decision says was written is there) and its node is one that spec
  admits; any other is checked like a pod without the label (DESIGN: "no label ... hides a
  pod from a monitor").
- :func:`classify`: the node's ``(kubernetes.io/os, kubernetes.io/arch)`` pair against the
  pairs every image supports (:func:`rules.place.plan.pod_platforms`, with the exec
  format exclusions in force: :func:`rules.learn.learned_images`): ``fit``,
  ``unfit`` or ``unknown`` (an image not inspectable, the node gone or without an
  architecture label).
- :func:`repair_owner`: an ``unfit`` pod is deleted, so that its owner creates a new pod
  that is placed, when ``spec.plugins.placementEscapes.deleteUnfitPods`` is on, a
  ReplicaSet, StatefulSet or Job controls it (:func:`rules.learn.remedy_owner`) and
  it was not created with ``spec.nodeName`` (:func:`created_with_node_name`: its owner would
  put the new pod on the same node). :class:`RepairRounds`: one round of deletions per owner
  per minute.
- :func:`event_spec`, :func:`record_patch` and :func:`condition_patch`: the
  ``PlacementEscaped`` Event and the record on the pod (label and annotation
  ``podplacement.io/placement-escaped``, and the pod condition of that type written through
  ``pods/status``, which a pod's creator cannot write: :func:`recorded`) that spares it
  further checks, so a relist, a restart or a new leader reports it once.

Fields with an unexpected type are treated as absent: nothing here raises on odd input.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import (
    AFFINITY_LABEL,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    ESCAPE_ANNOTATION,
    ESCAPE_CONDITION,
    ESCAPE_LABEL,
    ESCAPE_REASON,
    LINUX,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    SYSTEM_NAMESPACES,
    WINDOWS,
    WINDOWS_BUILD_LABEL,
    ExcludedPlatform,
)
from podplacement.rules.learn import learned_images, remedy_owner
from podplacement.rules.monitor.admitted import decision_record
from podplacement.rules.place.affinity import (
    admits_node,
    platform_requirement,
    required_terms,
    term_has_key,
)
from podplacement.rules.place.decision import NORMAL, WARNING, EventSpec
from podplacement.rules.place.fallback import decided_by_pod
from podplacement.rules.place.placement import (
    REASON_NO_SUPPORTED_PLATFORM,
    RECORD_ARCHS,
    RECORD_PLATFORMS,
    RECORD_RESULT,
    RECORD_WINDOWS_BUILDS,
    Outcome,
    compact_json,
    event_message,
    short_error,
    unique_images,
)
from podplacement.rules.place.plan import parse_time, pod_platforms
from podplacement.rules.platforms import ImageLike, PlatformSet
from podplacement.rules.podspec import has_gate
from podplacement.rules.scope import pod_skip_reason

__all__ = [
    "FIT",
    "OUTCOMES",
    "REPAIRED",
    "REPAIR_PERIOD_SECONDS",
    "UNFIT",
    "UNKNOWN",
    "RepairRounds",
    "Verdict",
    "classify",
    "condition_patch",
    "created_at",
    "created_with_node_name",
    "event_spec",
    "placement_doubt",
    "record_doubt",
    "record_patch",
    "recorded",
    "repair_owner",
    "skip_reason",
    "watch_params",
]

#: Verdicts (the label's values) and, with :data:`REPAIRED`, the outcomes of
#: ``podplacement_escaped_pods_total{outcome}``.
FIT = "fit"
UNFIT = "unfit"
UNKNOWN = "unknown"
REPAIRED = "repaired"
OUTCOMES = (REPAIRED, UNFIT, FIT, UNKNOWN)

#: Seconds between two rounds of repair deletions of one owner.
REPAIR_PERIOD_SECONDS = 60.0
#: Owners :class:`RepairRounds` remembers at most (the oldest round goes first).
MAX_REPAIR_OWNERS = 10_000

#: Skip reasons of :func:`skip_reason` (besides :mod:`rules.scope`'s).
SKIP_NO_CONFIG = "no_config"
SKIP_PREDATES_CONFIG = "predates_config"
SKIP_NOT_BOUND = "not_bound"
SKIP_PLACED = "placed"
SKIP_RECORDED = "recorded"
SKIP_GATED = "gated"
SKIP_DELETING = "deleting"
SKIP_ENDED = "ended"

#: The node labels a placement writes requirements on: what :func:`placement_doubt`
#: judges the pod's node by.
PLACEMENT_KEYS = (OS_LABEL, ARCH_LABEL, WINDOWS_BUILD_LABEL, NO_SUPPORTED_PLATFORM_KEY)
#: Platforms a decision annotation may list for :func:`record_doubt` to check it (a real
#: image index lists well under 100; more is no record of ours, and checking it would cost
#: the event loop time in proportion to its square).
MAX_RECORDED_PLATFORMS = 128
#: One part of a recorded ``os/arch`` (the catalog CRD's pattern, at most 63 characters).
_PART = re.compile(r"[a-z0-9_.-]{1,63}")

#: What :func:`record_doubt` says (the Event and the record name it).
DOUBT_NO_RECORD = f"it has no readable {DECISION_ANNOTATION} annotation"
DOUBT_NOTHING_WRITTEN = ("its decision records no requirement written into its node "
                         "affinity")
DOUBT_PLATFORMS = "its decision's platforms are not a list of os/arch pairs we write"
DOUBT_AFFINITY = ("its node affinity lacks the requirement its decision records (the "
                  "placement would write more)")
DOUBT_MARKER = (f"not every required term carries the {NO_SUPPORTED_PLATFORM_KEY} marker its "
                "decision records")
DOUBT_FALLBACK = ("its node affinity does not decide the operating system (and the "
                  "architecture it records) as the fallback writes it")

_ENDED_PHASES = ("Succeeded", "Failed")
_NO_MAP: Mapping[str, Any] = {}


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _NO_MAP


def watch_params(own_namespace: str) -> dict[str, str]:
    """The list+watch parameters of the escape monitor: label selector
    ``!podplacement.io/node-affinity`` and field selector ``spec.nodeName!=`` (bound),
    ``status.phase`` neither ``Succeeded`` nor ``Failed``, and ``metadata.namespace`` none of
    the system namespaces nor ``own_namespace``; the API server supports both selectors on
    pods (checked against kube-apiserver v1.36). The recorded escapes are not left out by
    the selector: their label ``podplacement.io/placement-escaped`` is a pod's creator's to
    write too, so :func:`recorded` judges them (a few pods: the escapes found so far)."""
    fields = ["spec.nodeName!="] + [f"status.phase!={p}" for p in _ENDED_PHASES] + [
        f"metadata.namespace!={ns}" for ns in sorted(SYSTEM_NAMESPACES | {own_namespace})]
    return {"labelSelector": f"!{AFFINITY_LABEL}", "fieldSelector": ",".join(fields)}


def recorded(pod: Mapping[str, Any]) -> bool:
    """True when the escape monitor recorded ``pod``: the label
    ``podplacement.io/placement-escaped`` and the pod condition of the same type
    (:data:`rules.config.ESCAPE_CONDITION`, :func:`condition_patch`), status ``True``. The
    label and the annotation alone are what a pod's creator can write; the condition is
    written through ``pods/status``, which they cannot (the API server resets a pod's status
    on create and ignores it on update). Removing the label asks for a new check
    (docs/escaped-pods.md, runbook)."""
    if ESCAPE_LABEL not in _map(_map(pod.get("metadata")).get("labels")):
        return False
    conditions = _map(pod.get("status")).get("conditions")
    return any(_map(c).get("type") == ESCAPE_CONDITION and _map(c).get("status") == "True"
               for c in (conditions if isinstance(conditions, list) else ()))


def skip_reason(pod: Mapping[str, Any], *, own_namespace: str,
                config_created: float | None,
                node: Mapping[str, Any] | None = None,
                doubt: Callable[[Mapping[str, Any], Mapping[str, Any] | None], str | None]
                | None = None) -> str | None:
    """Why the escape monitor leaves ``pod`` alone, or None when it is an escape to check
    (its namespace's opt-out is checked apart: :func:`rules.scope.namespace_opted_out`
    needs the Namespace's labels).

    Args:
        pod: the Pod dict.
        own_namespace: the product's namespace.
        config_created: unix seconds of the PodPlacementConfig's ``creationTimestamp``, or
            None when there is no config (nothing is placed then: ``no_config``).
        node: the pod's Node dict (None: not known), for :func:`placement_doubt`.
        doubt: what computes :func:`placement_doubt` (None: that function), e.g. a memo of
            it; it must return what :func:`placement_doubt` returns for the same pod and
            node.

    Returns:
        One of the ``SKIP_*`` reasons or :mod:`rules.scope`'s, or None. A pod
        created before the config (whole seconds: created in the same second counts as
        after), or whose creation time does not parse, predates it. A pod with the label
        ``podplacement.io/node-affinity`` is ``placed`` only when :func:`placement_doubt`
        has no doubt (checked last: it parses the decision); otherwise it is checked like a
        pod without the label.
    """
    if config_created is None:
        return SKIP_NO_CONFIG
    metadata = _map(pod.get("metadata"))
    spec = _map(pod.get("spec"))
    if metadata.get("deletionTimestamp"):
        return SKIP_DELETING
    if not spec.get("nodeName"):
        return SKIP_NOT_BOUND
    labels = _map(metadata.get("labels"))
    if recorded(pod):
        return SKIP_RECORDED
    if has_gate(pod):
        return SKIP_GATED
    if _map(pod.get("status")).get("phase") in _ENDED_PHASES:
        return SKIP_ENDED
    scoped = pod_skip_reason(pod, own_namespace)
    if scoped is not None:
        return scoped
    created = created_at(pod)
    if created is None or created < config_created:
        return SKIP_PREDATES_CONFIG
    if AFFINITY_LABEL in labels and (doubt or placement_doubt)(pod, node) is None:
        return SKIP_PLACED
    return None


def _recorded_pairs(record: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """The (os, arch) pairs of the decision's ``platforms`` (``["linux/amd64", ...]``, as
    :meth:`rules.platforms.PlatformSet.strings` writes them), or None when it is not
    such a list of at most :data:`MAX_RECORDED_PLATFORMS` entries."""
    listed = record.get(RECORD_PLATFORMS)
    if not isinstance(listed, list) or len(listed) > MAX_RECORDED_PLATFORMS:
        return None
    pairs: list[tuple[str, str]] = []
    for item in listed:
        parts = item.split("/") if isinstance(item, str) else []
        if len(parts) != 2 or not all(_PART.fullmatch(p) for p in parts):
            return None
        pairs.append((parts[0], parts[1]))
    return pairs


def _recorded_builds(record: Mapping[str, Any]) -> dict[tuple[str, str], list[str]]:
    """The decision's ``windowsBuilds`` (``{"windows/amd64": ["10.0.17763"]}``) as pairs ->
    builds; entries that are not ``windows/arch`` -> a list of at most
    :data:`MAX_RECORDED_PLATFORMS` strings are not read."""
    raw = record.get(RECORD_WINDOWS_BUILDS)
    out: dict[tuple[str, str], list[str]] = {}
    if not isinstance(raw, Mapping):
        return out
    for key, builds in list(raw.items())[:MAX_RECORDED_PLATFORMS]:
        parts = key.split("/") if isinstance(key, str) else []
        if (len(parts) == 2 and parts[0] == WINDOWS and _PART.fullmatch(parts[1])
                and isinstance(builds, list) and len(builds) <= MAX_RECORDED_PLATFORMS
                and all(isinstance(b, str) and _PART.fullmatch(b) for b in builds)):
            out[(parts[0], parts[1])] = builds
    return out


def record_doubt(pod: Mapping[str, Any]) -> str | None:
    """Why ``pod``'s placement record does not reproduce from its spec, or None when it
    does: its ``podplacement.io/decision`` annotation records a requirement and the pod's
    node affinity already carries it, so that applying that decision again would write
    nothing (the renderers only append: :mod:`rules.place.render`, KEP-3838).

    The label ``podplacement.io/node-affinity`` and the annotation are what a pod's
    creator can write too (DESIGN: "no label or annotation they can write hides a pod
    from a monitor"); the spec's node affinity is what the scheduler enforces. So a record
    counts only when what it says was written is there, by the decision's result:

    - ``set`` / ``not-set``: its ``platforms`` (the pairs every image supports, as the
      decision took them) are non-empty and :func:`rules.place.affinity.platform_requirement`
      of the pod as stored, for those pairs, appends no expression: every required term
      (or the ``nodeSelector``) already admits only such pairs, as the placement left it
      (new terms ``arch In`` AND ``os In``, or those ANDed into the user's terms, or the
      user's own pins, kept as written).
    - ``no-supported-platform``: every required term carries the unsatisfiable marker
      (:func:`rules.place.affinity.unsatisfiable_marker`), and there are terms.
    - ``fallback``: the pod decides the OS, and the architecture when the decision
      records ``archs``, itself (:func:`rules.place.fallback.decided_by_pod`): what the
      fallback writes (:func:`rules.place.fallback.fallback_requirement`) or the user's pins
      it keeps.
    - anything else (no annotation, not JSON, a release without affinity such as the
      webhook's ``controller-unavailable`` or :func:`rules.place.placement.ungate_only`): no
      requirement was written, so the label proves nothing.

    What the record claims about the images is not checked (that would take a registry
    request per pod): a record and an affinity that agree restrict the pod as a user's own
    pins would, which the placement keeps too. Whether the pod's node is one its affinity
    admits is :func:`placement_doubt`'s. Pure; never raises for odd input.
    """
    record = decision_record(pod)
    if record is None:
        return DOUBT_NO_RECORD
    result = record.get(RECORD_RESULT)
    if result in (Outcome.SET, Outcome.NOT_SET):
        pairs = _recorded_pairs(record)
        if not pairs:
            return DOUBT_PLATFORMS
        builds = _recorded_builds(record)
        return DOUBT_AFFINITY if platform_requirement(pod, pairs, builds).appended else None
    if result == Outcome.NO_SUPPORTED_PLATFORM:
        terms = required_terms(pod)
        if terms and all(term_has_key(t, NO_SUPPORTED_PLATFORM_KEY) for t in terms):
            return None
        return DOUBT_MARKER
    if result == Outcome.FALLBACK:
        archs = record.get(RECORD_ARCHS)
        if decided_by_pod(pod, OS_LABEL) and (not archs or decided_by_pod(pod, ARCH_LABEL)):
            return None
        return DOUBT_FALLBACK
    return DOUBT_NOTHING_WRITTEN


def _node_platform(node: Mapping[str, Any]) -> str:
    labels = _map(_map(node.get("metadata")).get("labels"))
    return f"{labels.get(OS_LABEL) or '?'}/{labels.get(ARCH_LABEL) or '?'}"


def placement_doubt(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> str | None:
    """Why the label ``podplacement.io/node-affinity`` on the bound ``pod`` does not spare
    it the escape check, or None when it does.

    A bound pod whose node can't run its images is an escape whatever labels it carries;
    the label may only skip the check (and its registry requests) for a pod whose record
    reproduces from its spec (:func:`record_doubt`) and whose node, ``node`` (the Node
    dict; None: not known, not judged), is one that spec admits on the labels a placement
    writes (:data:`PLACEMENT_KEYS`, :func:`rules.place.affinity.admits_node`): the scheduler
    binds only there, so a node outside it was named by the pod's creator
    (``spec.nodeName``).

    Returns:
        None, or one clause for the Event and the record (e.g. "its node affinity lacks the
        requirement its decision records ...").
    """
    doubt = record_doubt(pod)
    if doubt is not None:
        return doubt
    if node is not None:
        labels = _map(_map(node.get("metadata")).get("labels"))
        if not admits_node(pod, labels, PLACEMENT_KEYS):
            return (f"its node's {_node_platform(node)} is not one its required node "
                    "affinity admits (the scheduler did not bind it there)")
    return None


def created_at(pod: Mapping[str, Any]) -> float | None:
    """The pod's ``creationTimestamp`` in unix seconds, or None when absent or malformed."""
    value = _map(pod.get("metadata")).get("creationTimestamp")
    return parse_time(value) if isinstance(value, str) else None


def created_with_node_name(pod: Mapping[str, Any]) -> bool:
    """True when ``spec.nodeName`` was written by whoever created the pod, not by the
    scheduler: a ``managedFields`` entry owns ``f:spec`` → ``f:nodeName``. The scheduler's
    binding (``pods/binding``) records no managed field, and ``nodeName`` cannot be changed
    by an update (checked against kube-apiserver v1.36). Without ``managedFields`` (a server
    that drops them) it cannot be told: False."""
    entries = _map(pod.get("metadata")).get("managedFields")
    for entry in entries if isinstance(entries, list) else ():
        fields = _map(_map(entry).get("fieldsV1"))
        if "f:nodeName" in _map(fields.get("f:spec")):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an escaped pod's node makes of it.

    Attributes:
        outcome: :data:`FIT`, :data:`UNFIT` or :data:`UNKNOWN`.
        node: ``spec.nodeName``.
        node_platform: the node's ``os/arch`` (``kubernetes.io/os``, ``linux`` when absent,
            and ``kubernetes.io/arch``), or ``""`` when unknown.
        platforms: the ``os/arch`` pairs every image of the pod supports (exclusions
            applied), or ``()`` when unknown.
        reason: one sentence on the verdict.
    """

    outcome: str
    node: str
    node_platform: str
    platforms: tuple[str, ...]
    reason: str


def _node_pair(node: Mapping[str, Any]) -> tuple[str, str] | None:
    labels = _map(_map(node.get("metadata")).get("labels"))
    arch = labels.get(ARCH_LABEL)
    if not isinstance(arch, str) or not arch:
        return None
    os_name = labels.get(OS_LABEL)
    return (os_name if isinstance(os_name, str) and os_name else LINUX), arch


def _first_error(pod: Mapping[str, Any],
                 images: Mapping[str, ImageLike | BaseException]) -> str:
    for image in unique_images(pod):
        result = images.get(image)
        if result is None:
            return f"image {image} was not inspected"
        if isinstance(result, BaseException):
            return f"inspecting image {image} failed: {short_error(result)}"
    return "an image could not be inspected"


def _listed(pairs: PlatformSet) -> str:
    return ", ".join(pairs.strings()) if pairs.pairs else "none"


def classify(pod: Mapping[str, Any], node: Mapping[str, Any] | None,
             images: Mapping[str, ImageLike | BaseException],
             excluded: Sequence[ExcludedPlatform] = ()) -> Verdict:
    """The :class:`Verdict` on ``pod`` (bound to ``node``, the Node dict, or None when it
    does not exist): ``fit`` when the node's (os, arch) pair is one every image supports
    (for a windows pair whose images carry ``os.version``: and the node's
    ``node.kubernetes.io/windows-build`` is one of their builds), ``unfit`` when not,
    ``unknown`` when that cannot be told.

    Args:
        pod: the Pod dict.
        node: its Node dict, or None.
        images: per distinct image reference, the inspection result or the exception
            inspecting it raised (a missing image counts as not inspected).
        excluded: the exec format exclusions in force; a pair excluded for an image's
            digest is not one it supports (docs/exec-format-errors.md, "Learn").
    """
    node_name = str(_map(pod.get("spec")).get("nodeName") or "")
    if node is None:
        return Verdict(UNKNOWN, node_name, "", (), f"node {node_name} was not found")
    pair = _node_pair(node)
    if pair is None:
        return Verdict(UNKNOWN, node_name, "", (),
                       f"node {node_name} has no {ARCH_LABEL} label")
    platform = f"{pair[0]}/{pair[1]}"
    if not unique_images(pod):
        return Verdict(UNKNOWN, node_name, platform, (), "the pod has no container images")
    raw = pod_platforms(pod, images)
    namespace = str(_map(pod.get("metadata")).get("namespace") or "")
    learned = (pod_platforms(pod, learned_images(images, excluded, namespace=namespace))
               if raw is not None else None)
    if raw is None or learned is None:
        return Verdict(UNKNOWN, node_name, platform, (), _first_error(pod, images))
    supported = tuple(learned.strings())
    builds = learned.builds_of(pair)
    node_build = _map(_map(node.get("metadata")).get("labels")).get(WINDOWS_BUILD_LABEL)
    if pair in learned.pairs and builds is not None and node_build not in builds:
        shown = node_build if isinstance(node_build, str) and node_build else "unknown"
        return Verdict(UNFIT, node_name, platform, supported,
                       f"windows build {shown} not supported: its images support "
                       f"{platform} only on builds {', '.join(builds)} "
                       f"({WINDOWS_BUILD_LABEL}): it can't run on the node")
    if pair in learned.pairs:
        return Verdict(FIT, node_name, platform, supported,
                       f"its images support {_listed(learned)}, which includes the "
                       f"node's {platform}: it can run there")
    if pair in raw.pairs:
        why = (f"its images list {platform}, but it is excluded for their digest after "
               f"exec format errors; they support {_listed(learned)}")
    elif learned.empty:
        why = REASON_NO_SUPPORTED_PLATFORM
    else:
        why = f"its images support only {_listed(learned)}"
    return Verdict(UNFIT, node_name, platform, supported,
                   f"{why}: it can't run on the node's {platform}")


#: Why an ``unfit`` pod is not deleted (the Event and the record say it).
NOT_REPAIRED_SWITCHED_OFF = "spec.plugins.placementEscapes.deleteUnfitPods is false"
NOT_REPAIRED_NO_OWNER = "no ReplicaSet, StatefulSet or Job controls it"
NOT_REPAIRED_NODE_NAME = ("it was created with spec.nodeName set (its owner would put a new "
                          "pod on the same node)")


def repair_owner(pod: Mapping[str, Any], verdict: Verdict, *, delete_unfit_pods: bool
                 ) -> tuple[tuple[str, str, str] | None, str]:
    """Whether the repair deletes ``pod``: ``((kind, name, uid) of its owner, "")`` when it
    does, ``(None, why not)`` when the pod is ``unfit`` but stays, ``(None, "")`` for
    ``fit`` and ``unknown`` pods (never deleted: the product deletes only what it knows
    can't run).

    The owner is the one :func:`rules.learn.remedy_owner` finds for
    ``deleteFailedPods`` too: the controlling ReplicaSet, StatefulSet or Job, whose
    controller creates a new pod for a deleted one. A pod created with ``spec.nodeName``
    (:func:`created_with_node_name`) stays: its template names the node, so the new pod
    would land there again.
    """
    if verdict.outcome != UNFIT:
        return None, ""
    if not delete_unfit_pods:
        return None, NOT_REPAIRED_SWITCHED_OFF
    if created_with_node_name(pod):
        return None, NOT_REPAIRED_NODE_NAME
    owner = remedy_owner(pod)
    if owner is None:
        return None, NOT_REPAIRED_NO_OWNER
    return owner, ""


class RepairRounds:
    """At most one round of repair deletions per owner per ``period`` seconds.

    A round starts with the first deletion admitted for an owner; during it the owner's
    pods that already existed when it started (``creationTimestamp`` at least one whole
    second before: the API's timestamps have whole seconds) may be deleted too, so that
    every pod of a Deployment that escaped together is repaired together. A pod created
    since may be the replacement of one the round deleted: it waits for the next round, so
    a replacement that escapes again (the webhook still down) is deleted at most once a
    minute, never in a loop. Memory: one float per owner, at most ``max_owners`` (the
    oldest round is forgotten first), expired by :meth:`expire`.

    Args:
        period: seconds between two rounds of one owner.
        max_owners: owners remembered at most.
    """

    def __init__(self, period: float = REPAIR_PERIOD_SECONDS,
                 max_owners: int = MAX_REPAIR_OWNERS) -> None:
        self.period = period
        self.max_owners = max(1, max_owners)
        #: owner UID → unix seconds its current round started (oldest first)
        self.rounds: dict[str, float] = {}

    def admit(self, owner_uid: str, created_at: float | None, now: float) -> float:
        """Whether a pod of ``owner_uid`` created at ``created_at`` (unix seconds; None:
        unknown, counted as just now) may be deleted at ``now``: 0.0 when it may (a new
        round starts when none is running), else the seconds until the next round."""
        start = self.rounds.get(owner_uid)
        if start is None or now - start >= self.period:
            self.rounds.pop(owner_uid, None)
            self.rounds[owner_uid] = now
            while len(self.rounds) > self.max_owners:
                self.rounds.pop(next(iter(self.rounds)))
            return 0.0
        if created_at is not None and created_at + 1.0 <= start:
            return 0.0
        return max(0.001, start + self.period - now)

    def expire(self, now: float) -> None:
        """Forget the rounds that ended by ``now``."""
        for owner in [o for o, start in self.rounds.items() if now - start >= self.period]:
            self.rounds.pop(owner, None)


def _summary(verdict: Verdict, doubt: str = "") -> str:
    where = f"{verdict.node} ({verdict.node_platform})" if verdict.node_platform else (
        verdict.node)
    if doubt:
        return (f"bound to node {where} with a {AFFINITY_LABEL} label that its spec does not "
                f"bear out ({doubt[:300]}): checked as a pod without a placement; "
                f"{verdict.reason}")
    return (f"bound to node {where} without a placement by podplacement (no {AFFINITY_LABEL} "
            f"label: admitted while the webhook was unreachable, created before the "
            f"admission objects existed, or created with spec.nodeName); {verdict.reason}")


def event_spec(verdict: Verdict, *, deleted_for: tuple[str, str, str] | None = None,
               not_repaired: str = "", doubt: str = "") -> EventSpec:
    """The ``PlacementEscaped`` Event: Normal for a ``fit`` pod, Warning otherwise (it can't
    run there, or that is unknown); action ``Delete`` when the repair deleted it
    (``deleted_for``: the owner), else ``Detect``, with why an ``unfit`` pod stays.
    ``doubt``: why the pod's ``podplacement.io/node-affinity`` label did not spare it the
    check (:func:`placement_doubt`; empty: it has no such label)."""
    text = _summary(verdict, doubt)
    if deleted_for is not None:
        text += (f"; deleted (spec.plugins.placementEscapes.deleteUnfitPods) so that its "
                 f"{deleted_for[0]} {deleted_for[1]} creates a new pod, which is placed")
        return EventSpec(WARNING, ESCAPE_REASON, event_message(text), "Delete")
    if not_repaired:
        text += f"; not deleted: {not_repaired}"
    kind = NORMAL if verdict.outcome == FIT else WARNING
    return EventSpec(kind, ESCAPE_REASON, event_message(text), "Detect")


def record_patch(pod: Mapping[str, Any], verdict: Verdict, *, now: float,
                 not_repaired: str = "", doubt: str = "") -> dict[str, Any]:
    """The JSON merge patch that records the verdict on the pod, guarded by its
    ``resourceVersion`` (a stale copy gets 409): label ``podplacement.io/placement-escaped``
    = the outcome, and the annotation of the same key, compact JSON ``{"node",
    "nodePlatform", "platforms", "result", "reason", "notDeleted" (unfit pods that stay),
    "labelDoubted" (a pod whose ``podplacement.io/node-affinity`` label did not spare it
    the check: :func:`placement_doubt`), "at"}`` (unix seconds)."""
    record: dict[str, Any] = {"node": verdict.node, "nodePlatform": verdict.node_platform,
                              "platforms": list(verdict.platforms),
                              "result": verdict.outcome, "reason": verdict.reason[:500]}
    if not_repaired:
        record["notDeleted"] = not_repaired[:300]
    if doubt:
        record["labelDoubted"] = doubt[:300]
    record["at"] = int(now)
    metadata: dict[str, Any] = {
        "labels": {ESCAPE_LABEL: verdict.outcome},
        "annotations": {ESCAPE_ANNOTATION: compact_json(record)},
    }
    rv = _map(pod.get("metadata")).get("resourceVersion")
    if isinstance(rv, str) and rv:
        metadata["resourceVersion"] = rv
    return {"metadata": metadata}


#: The reason of the escape condition per verdict (CamelCase, as condition reasons are).
_CONDITION_REASONS = {FIT: "Fit", UNFIT: "Unfit", UNKNOWN: "Unknown"}


def condition_patch(verdict: Verdict, *, now: float, doubt: str = "") -> dict[str, Any]:
    """The strategic merge patch of ``pods/status`` that writes the escape condition
    (:data:`rules.config.ESCAPE_CONDITION`, status ``True``, reason ``Fit`` / ``Unfit`` /
    ``Unknown``, the Event's text as message, ``lastTransitionTime`` = ``now``, unix seconds):
    what makes the record one the product wrote (:func:`recorded`). Pod conditions merge by
    ``type``; the kubelet keeps the condition types it does not own."""
    stamp = _dt.datetime.fromtimestamp(int(now), _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [{
        "type": ESCAPE_CONDITION, "status": "True",
        "reason": _CONDITION_REASONS.get(verdict.outcome, "Unknown"),
        "message": _summary(verdict, doubt)[:1000], "lastTransitionTime": stamp}]}}
