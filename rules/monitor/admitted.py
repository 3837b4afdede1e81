"""What the controller learns from a pod placed at admission, and what it tells about it
(pure, no I/O).

A pod the MutatingAdmissionPolicy or the webhook placed carries ``"path":"admission"`` or
``"path":"webhook"`` first in its ``podplacement.io/decision`` annotation, and the label
``podplacement.io/node-affinity``; the controller's watch of placed pods
(:mod:`controller.placedwatch`) hands it to :mod:`controller.admissionfeed`, which acts on
these rules (docs/how-it-decides.md "Placement inside the API server": "The catalog fills
itself from every path"; docs/reference/labels-events-metrics.md "Events"):

- :func:`images_to_learn`: the images the controller inspects itself, anonymously, to
  publish in the admission policy's catalog: those of a pod placed at admission that the
  catalog lacks, when the pod has no pull Secret and the config no global one (the
  catalog's "anonymous only" rule, :mod:`rules.admit.imageparams`). The annotation is
  never trusted for platforms: a pod's creator can write it. It only makes the controller
  look; what is published is what the controller's own inspection says.
- :func:`admission_warning`: the Warning Event of the pod's decision, the one the
  controller sends for its own decisions: the facts of
  :func:`rules.place.placement.placement_facts` for the pod as it was before placement,
  recomputed from the platforms the decision was taken with (the webhook records each
  image's in the annotation; the policy read the catalog, whose entries the controller
  keeps). The pod as created is not stored: the placement appended to its node affinity
  (KEP-3838), so :func:`before_placement` proposes what it was, and only a candidate whose
  recomputed decision renders exactly the stored annotation and node affinity counts. What
  may have been appended to each term is checked against what the placement itself appends
  to that term (:func:`consistent_cuts`), so the proposals stay few however many terms a
  pod has. A
  decision that cannot be reproduced so (the config, the exclusions or the catalog changed
  since, a pod placed while no controller ran, an annotation that is not ours) tells
  nothing rather than something else.
- :func:`recently_created`: a pod a (re)list hands on was created a while ago; its Event
  is sent only when it is recent (a new leader covers the pods placed while none led).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from podplacement.imageinspect import OS_VERSION_RE, ImageInfo, Platform
from podplacement.rules.admit.admissionpolicy import ADMISSION_PATH, admission_record
from podplacement.rules.admit.imageparams import value_pairs
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    RECORD_CATALOG,
    PlacementConfig,
)
from podplacement.rules.monitor.explain import apply_patch
from podplacement.rules.place.admission import PATH_WEBHOOK
from podplacement.rules.place.affinity import (
    node_affinity,
    preferred_terms,
    required_terms,
    restriction_ops,
)
from podplacement.rules.place.placement import (
    EXEC_FORMAT_EXCLUSION,
    PLATFORM_NOT_IN_CLUSTER,
    RECORD_IMAGES,
    RECORD_PATH,
    RECORD_TOLERATIONS,
    WARNING,
    EventSpec,
    Placement,
    PlacementInputs,
    compact_json,
    placement_facts,
    unique_images,
)
from podplacement.rules.platforms import NodeInventory
from podplacement.rules.podspec import pull_secret_refs
from podplacement.rules.policy import PlacementPolicy
from podplacement.rules.tolerations import without_added

__all__ = [
    "ADMISSION_PATHS",
    "MAX_CANDIDATES",
    "admission_path",
    "admission_warning",
    "before_placement",
    "consistent_cuts",
    "decision_record",
    "images_to_learn",
    "recently_created",
]

#: The Normal Events told about a pod placed at admission, besides its Warning.
_TOLD_NORMAL = frozenset({PLATFORM_NOT_IN_CLUSTER, EXEC_FORMAT_EXCLUSION})

#: The ``path`` values of the decisions taken at admission: the policy's, the webhook's.
ADMISSION_PATHS = (ADMISSION_PATH, PATH_WEBHOOK)
#: Pods before placement tried at most for one pod (a pod with many required terms of its
#: own tells nothing beyond that: :func:`before_placement`).
MAX_CANDIDATES = 64
#: Expressions a placement appends to one existing required term, at most: ``arch In``
#: then ``os In`` (:func:`rules.place.affinity.platform_requirement`), or the
#: unsatisfiable marker.
_MAX_APPENDED = 2
_APPENDED_KEYS = frozenset({ARCH_LABEL, OS_LABEL, NO_SUPPORTED_PLATFORM_KEY})
#: One part of a recorded platform (the CRD's pattern for ``spec.images`` values).
_PART = re.compile(r"[a-z0-9_.-]+")


def decision_record(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``podplacement.io/decision`` annotation of ``pod`` as JSON, or None (absent, not
    JSON, not an object)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(DECISION_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def admission_path(record: Mapping[str, Any] | None) -> str | None:
    """``"admission"`` or ``"webhook"`` when ``record`` (:func:`decision_record`) is a
    decision taken at admission, else None (the controller's decisions have no path)."""
    path = (record or {}).get(RECORD_PATH)
    return path if path in ADMISSION_PATHS else None


def images_to_learn(pod: Mapping[str, Any], record: Mapping[str, Any] | None,
                    config: PlacementConfig, known: Callable[[str], bool]) -> tuple[str, ...]:
    """The images of ``pod`` the controller inspects anonymously to publish them (module
    docstring): none unless the pod was placed at admission (:func:`admission_path`) and
    has no pull Secret, nor the config a global one
    (:func:`rules.podspec.pull_secret_refs` is empty); else its distinct images,
    in pod order, that ``known`` (the catalog's membership) says are not published."""
    if admission_path(record) is None or pull_secret_refs(pod, config):
        return ()
    return tuple(image for image in unique_images(pod) if not known(image))


def always_images(pod: Mapping[str, Any], config: PlacementConfig) -> tuple[str, ...]:
    """The images ``pod`` pulls with ``imagePullPolicy: Always`` when it has no pull Secret,
    nor the config a global one (the catalog holds anonymous results only), in pod order:
    the tags whose digest the controller keeps checking while such pods come
    (:mod:`rules.freshness`); ``()`` otherwise."""
    if pull_secret_refs(pod, config):
        return ()
    return tuple(image for image, always in unique_images(pod).items() if always)


def recently_created(pod: Mapping[str, Any], now: float, window: float) -> bool:
    """True when ``pod``'s ``metadata.creationTimestamp`` (the API server's clock) is less
    than ``window`` seconds before ``now`` (unix seconds), or after it; False without one."""
    raw = (pod.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(raw, str) or not raw:
        return False
    try:
        created = dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return now - created < window


# --- the platforms the decision was taken with ------------------------------------------------


def _platform(text: object) -> Platform | None:
    """``os/arch[/variant][@os.version]`` as the annotation writes it (the version only for
    windows entries that carry one, :meth:`imageinspect.Platform.text`; the releases before
    it wrote none), each part of the CRD's pattern."""
    base, at, version = str(text).partition("@")
    parts = base.split("/")
    if not 2 <= len(parts) <= 3 or not all(_PART.fullmatch(p) for p in parts):
        return None
    if at and not OS_VERSION_RE.fullmatch(version):
        return None
    return Platform(parts[0], parts[1], parts[2] if len(parts) == 3 else None,
                    version or None)


def _recorded_results(record: Mapping[str, Any]) -> dict[str, ImageInfo] | None:
    """Per image of the webhook's annotation, its result as the webhook had it: the
    platforms listed, plus those an exclusion took out (placement takes them out again),
    and the digest. None when an image has no platforms (an error) or one is malformed."""
    out: dict[str, ImageInfo] = {}
    for entry in record.get(RECORD_IMAGES) or ():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("platforms"), list):
            return None
        excluded = [x.get("platform") for x in entry.get("excluded") or ()
                    if isinstance(x, Mapping)]
        platforms = [_platform(p) for p in [*entry["platforms"], *excluded]]
        digest = entry.get("digest") or ""
        if not isinstance(digest, str) or any(p is None for p in platforms):
            return None
        image = str(entry.get("image") or "")
        out[image] = ImageInfo(image, digest, "", tuple(p for p in platforms if p))
    return out


def _catalog_results(pod: Mapping[str, Any], catalog: Callable[[str], str | None]
                     ) -> dict[str, ImageInfo] | None:
    """Per image of ``pod``, its catalog entry as a result (the pairs the policy read), or
    None when one is not in the catalog (any more)."""
    out: dict[str, ImageInfo] = {}
    for image in unique_images(pod):
        value = catalog(image)
        pairs = value_pairs(value) if value is not None else None
        if not pairs:
            return None
        out[image] = ImageInfo(image, "", "", tuple(Platform(o, a) for o, a in pairs))
    return out


# --- the pod before placement ------------------------------------------------------------


def _with_node_affinity(pod: Mapping[str, Any], terms: Sequence[Mapping[str, Any]] | None,
                        preferred: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``pod`` with its node affinity replaced by ``terms`` (None: no required affinity)
    and ``preferred``; an empty node affinity (and then affinity) is left out."""
    spec = dict(pod.get("spec") or {})
    affinity = dict(spec.get("affinity") or {})
    na: dict[str, Any] = {}
    if terms is not None:
        na["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [dict(t) for t in terms]}
    if preferred:
        na["preferredDuringSchedulingIgnoredDuringExecution"] = [dict(t) for t in preferred]
    affinity.pop("nodeAffinity", None)
    if na:
        affinity["nodeAffinity"] = na
    if affinity:
        spec["affinity"] = affinity
    else:
        spec.pop("affinity", None)
    return {**pod, "spec": spec}


def _appendable(term: Mapping[str, Any]) -> int:
    """How many trailing expressions of ``term`` a placement may have appended: up to
    :data:`_MAX_APPENDED`, on the keys it writes."""
    exprs = list(term.get("matchExpressions") or [])
    count = 0
    for e in reversed(exprs[-_MAX_APPENDED:]):
        if not (isinstance(e, Mapping) and e.get("key") in _APPENDED_KEYS):
            break
        count += 1
    return count


def _arch_preferences(preferred: Sequence[Mapping[str, Any]]) -> int:
    """How many trailing preferred terms have the shape a placement appends: one
    ``kubernetes.io/arch In [one value]`` (:func:`rules.place.affinity.arch_preference`)."""
    count = 0
    for term in reversed(preferred):
        exprs = (term.get("preference") or {}).get("matchExpressions") or []
        if not (len(exprs) == 1 and isinstance(exprs[0], Mapping)
                and exprs[0].get("key") == ARCH_LABEL and exprs[0].get("operator") == "In"
                and len(exprs[0].get("values") or ()) == 1):
            break
        count += 1
    return count


#: What a placement of a candidate pod appends (:func:`consistent_cuts`): the expressions
#: ANDed into each of its required terms, in order, and the preferred terms appended.
Appends = Callable[[Mapping[str, Any]],
                   tuple[Sequence[Sequence[Mapping[str, Any]]], Sequence[Mapping[str, Any]]]]


def consistent_cuts(pod: Mapping[str, Any], appends: Appends
                    ) -> tuple[list[list[int]], list[int]]:
    """Per required term of ``pod`` (a pod placed by the webhook), how many trailing
    expressions the placement may have appended to it, and how many trailing preferred
    terms, each list the likeliest (the most appended) first: the cuts
    :func:`before_placement` combines.

    A cut counts only when the placement of the pod so cut appends exactly the cut
    expressions to that term (or exactly the cut preferred terms), as ``appends`` (the
    placement of a candidate: :func:`rules.place.placement.placement_facts`, its ``required``
    and ``preferred``) says. What a placement appends to a term depends on that term, the
    ``nodeSelector`` and the platforms alone (:func:`rules.place.affinity.platform_requirement`,
    :meth:`rules.place.affinity.AffinityPlan.require`), and its preferred terms on the pod's own
    preferred terms alone (:func:`rules.place.affinity.arch_preferences`), so every term is
    judged in the same few probes: probe ``n`` cuts each term by its ``n``-th possible cut
    (at most :data:`MAX_CANDIDATES` probes, each one call of ``appends``). Were that
    independence ever broken, a cut would be missed and the decision tell nothing (the
    caller renders every candidate in full), never something else.

    Raises what ``appends`` raises."""
    preferred = preferred_terms(pod)
    pref_cuts = list(range(_arch_preferences(preferred), -1, -1))
    terms = required_terms(pod)
    term_cuts = [list(range(_appendable(t), -1, -1)) for t in terms]
    kept_terms: list[set[int]] = [set() for _ in terms]
    kept_pref: set[int] = set()
    probes = min(MAX_CANDIDATES, max([len(pref_cuts), *(len(c) for c in term_cuts)]))
    for n in range(probes):
        cuts = [c[min(n, len(c) - 1)] for c in term_cuts]
        j = pref_cuts[min(n, len(pref_cuts) - 1)]
        required, appended_pref = appends(_with_node_affinity(
            pod, _cut(terms, cuts) if terms else None, preferred[:len(preferred) - j]))
        for i, (term, k) in enumerate(zip(terms, cuts, strict=True)):
            exprs = list(term.get("matchExpressions") or [])
            if i < len(required) and list(required[i]) == exprs[len(exprs) - k:]:
                kept_terms[i].add(k)
        if list(appended_pref) == list(preferred[len(preferred) - j:]):
            kept_pref.add(j)
    return ([[k for k in c if k in kept] for c, kept in zip(term_cuts, kept_terms, strict=True)],
            [j for j in pref_cuts if j in kept_pref])


def before_placement(pod: Mapping[str, Any], path: str, appends: Appends | None = None
                     ) -> Iterator[dict[str, Any]]:
    """What ``pod`` (placed at admission by ``path``) may have been when it was created,
    the likeliest first: at most :data:`MAX_CANDIDATES`.

    A placement only appends to the node affinity [KEP-3838]: new required terms when the
    pod had none, else up to two expressions at the end of each of its terms, and
    architecture preferences after its own preferred terms when it had none on the
    architecture. The policy places only pods without node affinity
    (:mod:`rules.admit.admissionpolicy`), so for ``"admission"`` there is one
    candidate. With ``appends`` (the placement of a candidate), only the cuts
    :func:`consistent_cuts` keeps are combined; without it, every cut of the appended keys
    is (their product soon passes the bound with several terms). The caller keeps the
    candidate whose decision renders the pod's own annotation and node affinity
    (:func:`admission_warning`).

    Raises what ``appends`` raises."""
    if path == ADMISSION_PATH:
        yield _with_node_affinity(pod, None, ())
        return
    preferred = preferred_terms(pod)
    terms = required_terms(pod)
    if appends is not None:
        term_cuts, pref_cuts = consistent_cuts(pod, appends)
    else:
        term_cuts = [list(range(_appendable(t), -1, -1)) for t in terms]
        pref_cuts = list(range(_arch_preferences(preferred), -1, -1))
    own_preferred = [preferred[:len(preferred) - j] for j in pref_cuts]
    # no terms of its own (the usual pod), then each term less what may have been appended
    own_terms: Iterator[Sequence[Mapping[str, Any]] | None] = itertools.chain(
        [None], (_cut(terms, cuts) for cuts in itertools.product(*term_cuts)) if terms else ())
    pairs = ((req, pref) for req in own_terms for pref in own_preferred)  # lazily
    for req, pref in itertools.islice(pairs, MAX_CANDIDATES):
        yield _with_node_affinity(pod, req, pref)


def _cut(terms: Sequence[Mapping[str, Any]], cuts: Sequence[int]) -> list[dict[str, Any]]:
    """``terms``, each without its last ``cuts[i]`` expressions."""
    out = []
    for term, k in zip(terms, cuts, strict=True):
        exprs = list(term.get("matchExpressions") or [])
        out.append({**term, "matchExpressions": exprs[:len(exprs) - k]})
    return out


def _renders(candidate: Mapping[str, Any], placement: Placement, pod: Mapping[str, Any],
             path: str, annotation: str, catalog_uid: str = "") -> bool:
    """True when ``placement`` of ``candidate`` writes exactly ``pod``'s annotation and node
    affinity (the renderers of :mod:`rules.place.render` and
    :func:`rules.admit.admissionpolicy.admission_record`; ``catalog_uid``: the params object's
    uid the policy's record names, which only says which catalog it read)."""
    record = (placement.annotation if path == PATH_WEBHOOK
              else compact_json(admission_record(placement, catalog_uid)))
    if not placement.ungate or record != annotation:
        return False
    ops = restriction_ops(candidate, placement.required, placement.preferred)
    affinity = (candidate.get("spec") or {}).get("affinity")
    doc = {"spec": {"affinity": affinity} if affinity is not None else {}}
    try:
        placed = apply_patch(doc, ops, copy_values=False)
    except (ValueError, LookupError, TypeError):
        return False
    return bool(node_affinity(placed) == node_affinity(pod))


def _admission_placement(
    pod: Mapping[str, Any],
    record: Mapping[str, Any] | None,
    config: PlacementConfig,
    *,
    catalog: Callable[[str], str | None],
    nodes: NodeInventory | None = None,
    policy: PlacementPolicy | None = None,
) -> Placement | None:
    """The decision that placed ``pod`` at admission, reproduced, or None (module
    docstring). The candidate is matched against the stored annotation as the admission
    path decided it, without nodes (neither the policy nor the webhook sees any); the
    placement returned is then the same decision with ``nodes``, whose Events also say
    what the nodes tell (``PlatformNotInCluster``). Never raises for odd pods or
    annotations."""
    path = admission_path(record)
    annotation = ((pod.get("metadata") or {}).get("annotations") or {}).get(DECISION_ANNOTATION)
    if path is None or record is None or not isinstance(annotation, str):
        return None
    results = (_recorded_results(record) if path == PATH_WEBHOOK
               else _catalog_results(pod, catalog))
    if results is None or set(results) != set(unique_images(pod)):
        return None
    decided = PATH_WEBHOOK if path == PATH_WEBHOOK else None
    catalog_uid = record.get(RECORD_CATALOG)
    uid = catalog_uid if isinstance(catalog_uid, str) else ""

    def placed(candidate: Mapping[str, Any]) -> Placement:
        # the admission paths see no node: the record is reproduced without them
        return placement_facts(PlacementInputs(candidate, results, config, path=decided,
                                               policy=policy))

    def appends(candidate: Mapping[str, Any]) -> tuple[
            list[tuple[dict[str, Any], ...]], tuple[dict[str, Any], ...]]:
        placement = placed(candidate)
        return [t.expressions for t in placement.required], placement.preferred

    def with_nodes(candidate: Mapping[str, Any], placement: Placement) -> Placement:
        if nodes is None:
            return placement
        try:  # the same decision with the nodes: its Events say what the nodes tell
            return placement_facts(PlacementInputs(candidate, results, config, nodes=nodes,
                                                   path=decided, policy=policy))
        except Exception:
            return placement

    try:
        # the tolerations the placement appended are not the creator's (rules.tolerations)
        base = without_added(pod, record.get(RECORD_TOLERATIONS))
        if path == PATH_WEBHOOK:
            # the usual pod had no node affinity of its own: its candidate is the first
            # before_placement proposes (no terms, every appendable preference cut), and
            # when it renders, consistent_cuts keeps its cuts: try it before probing
            first = _usual_candidate(base)
            placement = placed(first)
            if _renders(first, placement, pod, path, annotation, uid):
                return with_nodes(first, placement)
        for candidate in before_placement(base, path, appends):
            placement = placed(candidate)
            if _renders(candidate, placement, pod, path, annotation, uid):
                return with_nodes(candidate, placement)
    except Exception:  # an odd spec: it tells nothing
        return None
    return None


def _usual_candidate(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` (placed by the webhook) as it was when it had no node affinity of its own:
    no required terms, and its preferred terms less every trailing one of the shape a
    placement appends (:func:`before_placement`'s first proposal whenever that cut is
    consistent; a candidate that renders the stored pod exactly always is)."""
    preferred = preferred_terms(pod)
    return _with_node_affinity(pod, None, preferred[:len(preferred) - _arch_preferences(
        preferred)])


def admission_warning(
    pod: Mapping[str, Any],
    record: Mapping[str, Any] | None,
    config: PlacementConfig,
    *,
    catalog: Callable[[str], str | None],
    nodes: NodeInventory | None = None,
    policy: PlacementPolicy | None = None,
) -> EventSpec | None:
    """The Warning Event of the decision that placed ``pod`` at admission, as the
    controller sends it for its own (one per decision, the most serious first;
    docs/reference/labels-events-metrics.md "Events"), or None: no Warning, or a decision
    that cannot be reproduced (module docstring). Arguments: :func:`admission_events`."""
    placement = _admission_placement(pod, record, config, catalog=catalog, nodes=nodes,
                                     policy=policy)
    if placement is None:
        return None
    return next((e for e in placement.events if e.type == WARNING), None)


def admission_events(
    pod: Mapping[str, Any],
    record: Mapping[str, Any] | None,
    config: PlacementConfig,
    *,
    catalog: Callable[[str], str | None],
    nodes: NodeInventory | None = None,
    policy: PlacementPolicy | None = None,
) -> tuple[EventSpec, ...]:
    """The Events the controller tells about a pod placed at admission: the decision's
    Warning (:func:`admission_warning`), the Normal ``PlatformNotInCluster`` when no node
    of a platform the pod may run on exists yet, and the Normal ``ExecFormatExclusion``
    when an exclusion took a platform out of its images (no ``PlacementDecided``).

    Args:
        pod: the placed Pod as stored (its node affinity includes what the placement wrote).
        record: its decision annotation, parsed (:func:`decision_record`).
        config: the PodPlacementConfig in force, with the exclusions the controller places
            with.
        catalog: image → its catalog value (``"linux/amd64,linux/arm64"``) or None: the
            platforms a decision of the policy was taken with.
        nodes: the cluster's node inventory (``PlatformNotInCluster``, as the controller
            tells it), or None: unknown.
        policy: the namespace's placement policy matching the pod, or None.
    Returns:
        the Events, none when the decision cannot be reproduced. Never raises for odd
        pods or annotations.
    """
    placement = _admission_placement(pod, record, config, catalog=catalog, nodes=nodes,
                                     policy=policy)
    if placement is None:
        return ()
    return tuple(e for e in placement.events
                 if e.type == WARNING or e.reason in _TOLD_NORMAL)
