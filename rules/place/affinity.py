"""Node-affinity JSON-patch builders for a gated pod (pure, no I/O).

While a pod is gated its required node affinity may only be narrowed [KEP-3838]: with
existing ``nodeSelectorTerms`` only new ``matchExpressions`` may be appended to terms;
expressions never change and terms are never added or removed. Merge and strategic-merge
patches replace ``nodeSelectorTerms`` whole, so this module emits JSON-patch ``add`` ops
that append with ``/-`` (``reference/gates-c-mutable-directives-gated.json``).

Required terms are ORed and the expressions inside a term are ANDed, so a requirement is
ANDed into **every** term (never added as a new ORed term, which would loosen the user's
constraints). When there are no terms, new terms are created: one for a plain requirement,
one per OS group for the platform requirement (:func:`platform_requirement`: a node is
admitted only when its (os, architecture) *pair* is one every image supports, which
``arch In A`` AND ``os In O`` over several OSes would not ensure). Preferred terms are fully
mutable; they are appended as well so the user's own preferences stay untouched.

Use :class:`AffinityPlan` to combine several requirements into one op list, or the
convenience functions (:func:`require_architectures`, ...) for one requirement.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import (
    ARCH_LABEL,
    HOSTNAME_LABEL,
    LINUX,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    WINDOWS,
    WINDOWS_BUILD_LABEL,
)

_AFF = "/spec/affinity"
_NA = _AFF + "/nodeAffinity"
#: JSON pointers of ``spec.affinity`` and its ``nodeAffinity`` (what a pod without node
#: affinity gets in one ``add``: :func:`restriction_ops`).
AFFINITY_PATH = _AFF
NODE_AFFINITY_PATH = _NA
_REQ = _NA + "/requiredDuringSchedulingIgnoredDuringExecution"
_TERMS = _REQ + "/nodeSelectorTerms"
_PREF = _NA + "/preferredDuringSchedulingIgnoredDuringExecution"

Op = dict[str, Any]


def expression(key: str, operator: str, values: Sequence[str] | None = None) -> dict[str, Any]:
    """A NodeSelectorRequirement dict (``values`` omitted for Exists/DoesNotExist)."""
    expr: dict[str, Any] = {"key": key, "operator": operator}
    if values is not None:
        expr["values"] = list(values)
    return expr


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def node_affinity(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec.affinity.nodeAffinity`` of ``pod`` or ``{}``."""
    aff = _spec(pod).get("affinity") or {}
    return (aff.get("nodeAffinity") or {}) if isinstance(aff, Mapping) else {}


def required_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's required ``nodeSelectorTerms`` (``[]`` when none)."""
    req = node_affinity(pod).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = req.get("nodeSelectorTerms") if isinstance(req, Mapping) else None
    return [t if isinstance(t, Mapping) else {} for t in (terms or [])]


def preferred_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's PreferredSchedulingTerms (``[]`` when none)."""
    pref = node_affinity(pod).get("preferredDuringSchedulingIgnoredDuringExecution")
    return [t for t in (pref or []) if isinstance(t, Mapping)]


def term_has_key(term: Mapping[str, Any], key: str) -> bool:
    """True when a NodeSelectorTerm has a ``matchExpressions`` entry on ``key``."""
    return any(
        isinstance(e, Mapping) and e.get("key") == key for e in term.get("matchExpressions") or []
    )


def allowed_values(term: Mapping[str, Any], key: str) -> frozenset[str] | None:
    """The values of label ``key`` that a NodeSelectorTerm admits when it restricts ``key``
    with ``In``: the intersection of its ``In`` lists minus its ``NotIn`` lists (empty with
    ``DoesNotExist``). ``None`` when the term has no ``In`` expression on ``key`` (it then
    admits any value not excluded, including values no image supports).

    Rule: Kubernetes NodeSelectorRequirement semantics (expressions of a term are ANDed).
    """
    allowed: frozenset[str] | None = None
    excluded: set[str] = set()
    absent = False
    for e in term.get("matchExpressions") or []:
        if not isinstance(e, Mapping) or e.get("key") != key:
            continue
        values = [str(v) for v in e.get("values") or []]
        op = e.get("operator")
        if op == "In":
            allowed = frozenset(values) if allowed is None else allowed & frozenset(values)
        elif op == "NotIn":
            excluded.update(values)
        elif op == "DoesNotExist":
            absent = True
    if allowed is None:
        return None
    return frozenset() if absent else allowed - excluded


def has_preference_on(pod: Mapping[str, Any], key: str) -> bool:
    """True when any preferred term of the pod has an expression on ``key``."""
    return any(term_has_key(t.get("preference") or {}, key) for t in preferred_terms(pod))


# --- the platform requirement: exact (os, architecture) pairs ---------------------------

#: An (os, architecture) pair: the ``kubernetes.io/os`` and ``kubernetes.io/arch`` of a node.
Pair = tuple[str, str]


def _expression_admits(expr: Mapping[str, Any], value: str) -> bool:
    """True when one NodeSelectorRequirement admits a node whose label (its key) is
    ``value`` (scheduler semantics, k8s.io/component-helpers nodeaffinity: ``Gt``/``Lt``
    compare integers, and a value that is no integer matches neither)."""
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return True
    if op in ("Gt", "Lt"):
        try:
            have, bound = int(value), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # DoesNotExist, or an operator the API server would have refused


def _expression_admits_labels(expr: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """True when one NodeSelectorRequirement admits a node with ``labels`` (scheduler
    semantics: a label the node lacks fails ``In``, ``Exists``, ``Gt`` and ``Lt`` and passes
    ``NotIn`` and ``DoesNotExist``)."""
    value = labels.get(str(expr.get("key")))
    if value is None:
        return expr.get("operator") in ("NotIn", "DoesNotExist")
    return _expression_admits(expr, str(value))


def admits_node(pod: Mapping[str, Any], node_labels: Mapping[str, Any],
                keys: Iterable[str]) -> bool:
    """True when ``pod``'s required node affinity and ``nodeSelector``, judged on the label
    ``keys`` only, admit a node whose labels are ``node_labels``: the scheduler's rule
    (k8s.io/component-helpers nodeaffinity ``GetRequiredNodeAffinity``: the
    ``nodeSelector`` ANDed with the required terms, terms ORed, expressions of a term ANDed;
    no terms: any node) restricted to ``keys``, so a node is not judged by labels the
    placement does not write (a zone a user pins may change without making anything
    escape). Expressions on other keys and ``matchFields`` are not judged. Pure; never
    raises for odd specs."""
    wanted = frozenset(keys)
    raw = _spec(pod).get("nodeSelector")
    selector: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    for key in wanted & set(selector):
        if key not in node_labels or str(node_labels[key]) != str(selector[key]):
            return False
    terms = required_terms(pod)
    return not terms or any(
        all(_expression_admits_labels(e, node_labels)
            for e in t.get("matchExpressions") or []
            if isinstance(e, Mapping) and e.get("key") in wanted)
        for t in terms)


def _admits(term: Mapping[str, Any], selector: Mapping[str, Any], pair: Pair) -> bool:
    """True when ``term``'s expressions on ``kubernetes.io/os`` and ``kubernetes.io/arch``
    and the pod's ``nodeSelector`` on those keys admit a node of ``pair`` (its other
    expressions, on other labels, are not judged here)."""
    for key, value in zip((OS_LABEL, ARCH_LABEL), pair, strict=True):
        pin = selector.get(key)
        if pin is not None and str(pin) != value:
            return False
        for e in term.get("matchExpressions") or []:
            if isinstance(e, Mapping) and e.get("key") == key and not _expression_admits(e, value):
                return False
    return True


def _pins(term: Mapping[str, Any], selector: Mapping[str, Any], key: str) -> frozenset[str] | None:
    """The values of ``key`` the user pinned for ``term``: its ``In`` lists
    (:func:`allowed_values`) and the pod's ``nodeSelector`` value, ANDed; None: no pin."""
    pinned = allowed_values(term, key)
    pin = selector.get(key)
    if pin is not None:
        pinned = frozenset({str(pin)}) if pinned is None else pinned & {str(pin)}
    return pinned


def _os_groups(pairs: Iterable[Pair]) -> list[tuple[str, ...]]:
    """The OSes of ``pairs``, grouped by their set of architectures in ``pairs`` (OSes with
    the same architectures share a group: ``os In [group] AND arch In [archs]`` is then exactly
    their pairs), each group sorted, the groups ordered by their first OS."""
    archs: dict[str, set[str]] = {}
    for os_, arch in pairs:
        archs.setdefault(os_, set()).add(arch)
    groups: dict[frozenset[str], list[str]] = {}
    for os_ in sorted(archs):
        groups.setdefault(frozenset(archs[os_]), []).append(os_)
    return sorted(tuple(g) for g in groups.values())


def _chosen(groups: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """The group a term keeps when it cannot keep them all: the one with Linux, else the
    first (its first OS sorts first)."""
    return next((g for g in groups if LINUX in g), groups[0])


def group_expressions(archs: Iterable[str], oses: Iterable[str]) -> list[dict[str, Any]]:
    """The expressions admitting exactly an OS group's pairs when nothing is pinned:
    ``kubernetes.io/arch In [sorted archs]`` then ``kubernetes.io/os In [sorted oses]`` (a
    new term of :func:`platform_requirement`; for linux-only images the one term of a pod
    without terms, which the admission policy writes too)."""
    return [expression(ARCH_LABEL, "In", sorted(archs)), expression(OS_LABEL, "In", sorted(oses))]


def _narrowing(term: Mapping[str, Any], selector: Mapping[str, Any], oses: Sequence[str],
               supported: Sequence[Pair], known_pairs: Sequence[Pair] | None = None
               ) -> list[dict[str, Any]]:
    """The expressions that restrict ``term`` to the supported pairs of ``oses``:
    ``kubernetes.io/arch In [archs every OS of the group supports]`` then
    ``kubernetes.io/os In [oses]``. A key the user pinned (:func:`_pins`) gets nothing when
    its supported pinned values already lie inside the group; else the narrowed pin
    ``key In [pinned values inside the group, plus pinned values no image supports]`` (a pin
    is never narrowed to nothing: it is then left as written)."""
    archs_of: dict[str, set[str]] = {}
    for os_, arch in supported:
        archs_of.setdefault(os_, set()).add(arch)
    wanted = {
        ARCH_LABEL: set.intersection(*(archs_of[o] for o in oses)),
        OS_LABEL: set(oses),
    }
    pins = {key: _pins(term, selector, key) for key in (ARCH_LABEL, OS_LABEL)}
    if pins[ARCH_LABEL] is None and pins[OS_LABEL] is None:
        return group_expressions(wanted[ARCH_LABEL], wanted[OS_LABEL])
    every = supported if known_pairs is None else known_pairs
    known = {ARCH_LABEL: {a for _, a in every}, OS_LABEL: {o for o, _ in every}}
    out: list[dict[str, Any]] = []
    for key, pinned in pins.items():
        if pinned is None:
            out.append(expression(key, "In", sorted(wanted[key])))
        elif not (pinned & known[key]) <= wanted[key]:
            keep = (pinned & wanted[key]) | (pinned - known[key])
            if keep:
                out.append(expression(key, "In", sorted(keep)))
    return out


@dataclass(frozen=True, slots=True)
class TermPlatforms:
    """The platform requirement of one required NodeSelectorTerm.

    Attributes:
        index: the index of the pod's existing term in ``nodeSelectorTerms``; None for a
            new term (a pod without terms).
        expressions: the NodeSelectorRequirements to AND into the term, after its own.
        pairs: the supported (os, architecture) pairs the term admits once they are
            appended (sorted; judged by its ``kubernetes.io/os``/``arch`` expressions and the
            pod's ``nodeSelector``, not by its expressions on other labels).
        left_out: the supported pairs the term admitted before and no longer does: a term
            keeps the pairs of one OS group when one term cannot name all of them exactly.
        builds: the Windows builds the term's ``node.kubernetes.io/windows-build In``
            expression admits (sorted), empty when it has none.
    """

    index: int | None
    expressions: tuple[dict[str, Any], ...]
    pairs: tuple[Pair, ...]
    left_out: tuple[Pair, ...] = ()
    builds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlatformRequirement:
    """What :func:`platform_requirement` does to a pod's required node affinity.

    Attributes:
        supported: the (os, architecture) pairs every image supports, sorted.
        terms: one :class:`TermPlatforms` per existing required term, in order, or the new
            terms of a pod without terms.
        selected: the supported pairs the pod's ``nodeSelector`` admits (empty: its
            ``kubernetes.io/os``/``arch`` pin names no supported platform).
        compatible: False when the pod has required terms and the user's pins (``In`` lists
            and the ``nodeSelector``) let no term admit a supported pair.
        outside_architectures / outside_oses: values that the terms' ``In`` lists admit
            and no image supports, sorted (the user's explicit choice, e.g. emulation; a key
            the ``nodeSelector`` pins is not reported here).
        outside_pairs: pairs of a supported os and a supported architecture that are not
            supported together and that a term still admits because the user's own pins
            name them (a pin is never narrowed to nothing), sorted.
    """

    supported: tuple[Pair, ...]
    terms: tuple[TermPlatforms, ...]
    selected: tuple[Pair, ...]
    compatible: bool = True
    outside_architectures: tuple[str, ...] = ()
    outside_oses: tuple[str, ...] = ()
    outside_pairs: tuple[Pair, ...] = ()

    @property
    def pairs(self) -> tuple[Pair, ...]:
        """The supported pairs some term admits after the requirement, sorted."""
        return tuple(sorted({p for t in self.terms for p in t.pairs}))

    @property
    def excluded(self) -> tuple[Pair, ...]:
        """The supported pairs a term left out and no term admits any more, sorted: the
        nodes of these platforms are no longer candidates because of the narrowing."""
        admitted = set(self.pairs)
        return tuple(sorted({p for t in self.terms for p in t.left_out} - admitted))

    @property
    def appended(self) -> int:
        """How many expressions the requirement writes."""
        return sum(len(t.expressions) for t in self.terms)


BuildMap = Mapping[Pair, Sequence[str]]


def _windows_partitions(candidates: Iterable[Pair], builds: BuildMap
                        ) -> list[tuple[tuple[str, ...], tuple[Pair, ...]]]:
    """The windows pairs of ``candidates`` grouped by their build list (``()``: any build),
    sorted by build list: one term can admit ``arch In A`` AND ``windows-build In B`` only
    for architectures that share the builds B (never the cross product, as for OS pairs)."""
    parts: dict[tuple[str, ...], list[Pair]] = {}
    for pair in sorted(set(candidates)):
        if pair[0] == WINDOWS:
            parts.setdefault(tuple(sorted(builds.get(pair) or ())), []).append(pair)
    return sorted((b, tuple(p)) for b, p in parts.items())


def _constrained(group: Sequence[str], candidates: Iterable[Pair], builds: BuildMap) -> bool:
    """True when ``group`` holds windows and a windows pair of ``candidates`` has builds."""
    return WINDOWS in group and any(p[0] == WINDOWS and builds.get(p) for p in candidates)


def _group_terms(term: Mapping[str, Any], selector: Mapping[str, Any], group: Sequence[str],
                 candidates: Sequence[Pair], pairs: Sequence[Pair], builds: BuildMap
                 ) -> list[tuple[list[dict[str, Any]], tuple[str, ...]]]:
    """The expression lists (each with its builds) that admit ``group``'s pairs: one
    (:func:`_narrowing`) unless windows in the group has a build constraint; then the
    other OSes of the group get one, and windows one per build partition of its
    ``candidates`` pairs, with ``node.kubernetes.io/windows-build In [builds]`` after the
    os expression (not when the term's own ``In`` on that key admits only those builds):
    a windows node of another build is not admitted (kubernetes.io, "Windows containers in
    Kubernetes", version compatibility)."""
    if not _constrained(group, candidates, builds):
        return [(_narrowing(term, selector, group, pairs), ())]
    out: list[tuple[list[dict[str, Any]], tuple[str, ...]]] = []
    others = tuple(o for o in group if o != WINDOWS)
    if others:
        out.append((_narrowing(term, selector, others, pairs), ()))
    rest = [p for p in pairs if p[0] != WINDOWS]
    for part_builds, part in _windows_partitions(candidates, builds):
        exprs = _narrowing(term, selector, (WINDOWS,), [*rest, *part], pairs)
        pinned = allowed_values(term, WINDOWS_BUILD_LABEL)
        if part_builds and (pinned is None or not pinned <= set(part_builds)):
            exprs.append(expression(WINDOWS_BUILD_LABEL, "In", list(part_builds)))
        out.append((exprs, part_builds))
    return out


def platform_requirement(pod: Mapping[str, Any], supported: Iterable[Pair],
                         builds: BuildMap | None = None) -> PlatformRequirement:
    """The required node affinity that admits only nodes whose (os, architecture) pair is
    one every image supports.

    Rule (docs/how-it-decides.md, item 4): required terms are ORed and the expressions of a
    term are ANDed (scheduler NodeSelectorTerm semantics), and ``kubernetes.io/arch In A``
    AND ``kubernetes.io/os In O`` admits every pair of A and O combined. So one term is exact for a
    group of OSes that support the same architectures, and never for OSes that differ.

    - A pod without required terms gets one new term per such group (for the usual
      linux-only set that is the one term ``arch In [archs]`` AND ``os In [linux]``):
      ``kubernetes.io/arch In [the group's archs]`` AND ``kubernetes.io/os In [the group]``.
      The pairs are those the pod's ``nodeSelector`` admits; when it admits none (its pin
      names no supported platform) there is one term, for the group chosen as below.
    - A pod with required terms keeps its terms [KEP-3838: a gated pod's node affinity may
      only be narrowed: expressions appended to existing terms, never a new term]. Each term
      gets the expressions of one group: of the supported pairs the term already admits (its
      own ``kubernetes.io/os``/``arch`` expressions, ``NotIn`` and the rest included, and the
      ``nodeSelector``), grouped as above, the group with Linux, else the group whose first
      OS sorts first. When the term admits no supported pair, the group is chosen the same
      way from all supported pairs. The pairs the term admitted outside that group are
      ``left_out`` (the caller warns). A term pinning ``kubernetes.io/os In [windows]``
      therefore keeps the windows pairs.
    - A key the user pinned (an ``In`` list in the term, or the ``nodeSelector``) gets
      nothing when its supported values already lie inside the group; otherwise the pin is
      narrowed by appending ``key In`` the pinned values inside the group plus the pinned
      values no image supports (those stay the user's explicit choice, as before). A pin
      whose values are all elsewhere is kept as written. A ``nodeSelector`` pin names one
      value, so nothing is ever written for its key.

    So every node the written terms admit runs a supported pair, unless a value of its
    os or arch is one the user's own pins name explicitly; and a supported pair the user's
    terms admitted is still admitted unless it is ``left_out`` of that term.

    Args:
        pod: the Pod dict (its required terms and ``nodeSelector`` are read).
        supported: the (os, architecture) pairs every image supports
            (:func:`rules.platforms.supported_platforms`); empty gives no terms.
        builds: per windows pair, the Windows builds every image supports
            (:attr:`rules.platforms.PlatformSet.builds`); a pair not in it runs on any
            build. A windows pair with builds never shares a term with another OS or with
            a windows architecture of other builds: a pod without terms gets one term per
            build list, ``arch In [archs]`` AND ``os In [windows]`` AND
            ``node.kubernetes.io/windows-build In [builds]``; an existing term whose chosen
            group holds such a pair keeps the group's other OSes if it has any, else the
            windows architectures of the first build list (the rest is ``left_out``).

    Returns:
        the :class:`PlatformRequirement`. Pure; never raises for odd specs.
    """
    pairs = tuple(sorted(set(supported)))
    build_map: BuildMap = {p: b for p, b in (builds or {}).items() if p in pairs and b}
    spec = _spec(pod)
    raw_selector = spec.get("nodeSelector")
    selector: Mapping[str, Any] = raw_selector if isinstance(raw_selector, Mapping) else {}
    selected = tuple(p for p in pairs if _admits({}, selector, p))
    if not pairs:
        return PlatformRequirement(pairs, (), selected)
    fallback = _chosen(_os_groups(pairs))
    terms = required_terms(pod)
    out: list[TermPlatforms] = []
    if not terms:
        for group in _os_groups(selected) or [fallback]:
            for exprs, term_builds in _group_terms({}, selector, group, selected or pairs,
                                                   pairs, build_map):
                after = tuple(p for p in pairs
                              if _admits({"matchExpressions": exprs}, selector, p))
                out.append(TermPlatforms(None, tuple(exprs), after, (), term_builds))
        return PlatformRequirement(pairs, tuple(out), selected)
    compatible = False
    outside: dict[str, set[str]] = {ARCH_LABEL: set(), OS_LABEL: set()}
    known = {ARCH_LABEL: {a for _, a in pairs}, OS_LABEL: {o for o, _ in pairs}}
    mixed = [(o, a) for o in sorted(known[OS_LABEL]) for a in sorted(known[ARCH_LABEL])
             if (o, a) not in pairs]
    outside_pairs: set[Pair] = set()
    for index, term in enumerate(terms):
        before = [p for p in pairs if _admits(term, selector, p)]
        groups = _os_groups(before)
        exprs, term_builds = _group_terms(term, selector,
                                          _chosen(groups) if groups else fallback,
                                          before or pairs, pairs, build_map)[0]
        narrowed = {"matchExpressions": [*(term.get("matchExpressions") or []), *exprs]}
        after = tuple(p for p in before if _admits(narrowed, selector, p))
        outside_pairs.update(p for p in mixed if _admits(narrowed, selector, p))
        out.append(TermPlatforms(index, tuple(exprs), after,
                                 tuple(p for p in before if p not in after), term_builds))
        os_pin, arch_pin = _pins(term, selector, OS_LABEL), _pins(term, selector, ARCH_LABEL)
        compatible = compatible or any(
            (os_pin is None or o in os_pin) and (arch_pin is None or a in arch_pin)
            for o, a in pairs)
        for key in (ARCH_LABEL, OS_LABEL):
            allowed = allowed_values(term, key)
            if allowed is not None and key not in selector:
                outside[key] |= allowed - known[key]
    return PlatformRequirement(pairs, tuple(out), selected, compatible,
                               tuple(sorted(outside[ARCH_LABEL])),
                               tuple(sorted(outside[OS_LABEL])), tuple(sorted(outside_pairs)))


@dataclass(frozen=True, slots=True)
class TermRestriction:
    """The expressions ANDed into one required NodeSelectorTerm.

    Attributes:
        index: the index of the pod's existing term in ``nodeSelectorTerms``; None for a
            new term (a pod without terms gets new terms; KEP-3838 forbids them otherwise).
        expressions: the NodeSelectorRequirements appended after the term's own, in order
            (for a new term, all of its expressions).
    """

    index: int | None
    expressions: tuple[dict[str, Any], ...]


class AffinityPlan:
    """Accumulates required expressions and preferred terms for one pod: what to AND into
    each required term (:meth:`restrictions`) and which preferred terms to append
    (:meth:`preferred_terms`), obeying KEP-3838 (appends only). :meth:`ops` renders them
    as JSON-patch ops (:func:`restriction_ops`).

    ``require(expr, unless_key=K)`` ANDs ``expr`` into every existing required term that
    does not restrict ``K`` with an ``In`` expression (default: ``expr``'s own key; ``""``:
    every term); with no terms it goes into the new term(s). An identical expression already
    in a term is not added twice. :meth:`require_platforms` applies
    :func:`platform_requirement` (exact (os, architecture) pairs; for a pod without terms,
    one new term per OS group).
    """

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self._pod = pod
        self._terms = required_terms(pod)
        # additions per existing term index; for a pod without terms, one list per new term
        self._added: list[list[dict[str, Any]]] = [[] for _ in self._terms] or [[]]
        self._new_term = not self._terms
        self._preferred: list[dict[str, Any]] = []

    def require(self, expr: Mapping[str, Any], *, unless_key: str | None = None) -> int:
        """AND ``expr`` into every required term that does not restrict ``unless_key`` with
        ``In`` (a term with ``NotIn``/``Exists``/``DoesNotExist`` on it still gets ``expr``).

        Returns the number of terms it was added to (0: every term already restricts the
        key with ``In``; the user's pins are kept).
        """
        skip = unless_key if unless_key is not None else str(expr.get("key"))
        count = 0
        for i, added in enumerate(self._added):
            term = self._terms[i] if not self._new_term else {}
            if skip and (
                allowed_values(term, skip) is not None
                or any(a.get("key") == skip and a.get("operator") == "In" for a in added)
            ):
                continue
            if any(e == expr for e in [*(term.get("matchExpressions") or []), *added]):
                continue
            added.append(copy.deepcopy(dict(expr)))
            count += 1
        return count

    def require_platforms(self, supported: Iterable[Pair],
                          builds: BuildMap | None = None) -> PlatformRequirement:
        """Narrow the required terms to the (os, architecture) pairs ``supported`` (every
        image's platforms), as :func:`platform_requirement` computes it (see
        :meth:`apply_platforms`).

        Returns:
            the :class:`PlatformRequirement` that was applied.

        Raises:
            ValueError: called on a plan that already created several new terms.
        """
        requirement = platform_requirement(self._pod, supported, builds)
        self.apply_platforms(requirement)
        return requirement

    def apply_platforms(self, requirement: PlatformRequirement) -> None:
        """Apply ``requirement`` (:func:`platform_requirement` of this plan's pod): its
        expressions are appended to the existing terms, or its new terms are created for a
        pod without terms. Call it once per plan, before other requirements (they are then
        ANDed into every new term as well).

        Raises:
            ValueError: called on a plan that already created several new terms.
        """
        if self._new_term:
            if len(self._added) != 1:
                raise ValueError("the platform requirement is applied once per plan")
            prior = self._added[0]
            self._added = [[*copy.deepcopy(prior), *(dict(e) for e in t.expressions)]
                           for t in requirement.terms] or [prior]
            return
        for t in requirement.terms:
            assert t.index is not None
            term, added = self._terms[t.index], self._added[t.index]
            for expr in t.expressions:
                if not any(e == expr for e in [*(term.get("matchExpressions") or []), *added]):
                    added.append(dict(expr))

    def prefer(self, weight: int, exprs: Sequence[Mapping[str, Any]]) -> None:
        """Append a PreferredSchedulingTerm (``weight`` clamped to 1..100, the API range)."""
        self._preferred.append(
            {
                "weight": max(1, min(100, int(weight))),
                "preference": {"matchExpressions": [dict(e) for e in exprs]},
            }
        )

    def restrictions(self) -> tuple[TermRestriction, ...]:
        """What to AND into each existing required term (one entry per term, in order,
        possibly without expressions), or the new terms of a pod without terms (only those
        with expressions: a term without expressions would match no node)."""
        if self._new_term:
            return tuple(TermRestriction(None, tuple(a)) for a in self._added if a)
        return tuple(TermRestriction(i, tuple(a)) for i, a in enumerate(self._added))

    def preferred_terms(self) -> tuple[dict[str, Any], ...]:
        """The PreferredSchedulingTerms to append, in order."""
        return tuple(self._preferred)

    def result_terms(self) -> list[dict[str, Any]]:
        """The required terms as they will be after the patch (for explain/tests)."""
        if self._new_term:
            return [{"matchExpressions": list(a)} for a in self._added if a]
        out = []
        for term, added in zip(self._terms, self._added, strict=True):
            t = copy.deepcopy(dict(term))
            if added:
                t["matchExpressions"] = list(t.get("matchExpressions") or []) + added
            out.append(t)
        return out

    def ops(self) -> list[Op]:
        """The JSON-patch ops (``add`` only) that apply the plan (:func:`restriction_ops`)."""
        return restriction_ops(self._pod, self.restrictions(), self.preferred_terms())


def restriction_ops(pod: Mapping[str, Any], required: Sequence[TermRestriction],
                    preferred: Sequence[Mapping[str, Any]]) -> list[Op]:
    """The JSON-patch ops (``add`` only, KEP-3838) that AND ``required`` into ``pod``'s
    required terms (or create its new terms) and append ``preferred``.

    The biggest absent container is created in one op (``/spec/affinity``, then
    ``nodeAffinity``, ``requiredDuring...``, ``nodeSelectorTerms``); expressions of an
    existing term are appended with ``/-`` (a term with only ``matchFields`` gets its
    ``matchExpressions`` list). The same ops apply to the gated pod (the controller's PATCH)
    and to the object being created (the webhook's admission patch): gates do not change
    the affinity's shape.

    Args:
        pod: the Pod dict whose shape the paths follow.
        required: :meth:`AffinityPlan.restrictions` of ``pod`` (new terms: index None).
        preferred: PreferredSchedulingTerms to append.
    """
    spec = _spec(pod)
    affinity = spec.get("affinity")
    has_affinity = isinstance(affinity, Mapping)
    na = node_affinity(pod)
    has_node_affinity = has_affinity and isinstance((affinity or {}).get("nodeAffinity"),
                                                    Mapping)
    new_terms = [{"matchExpressions": list(t.expressions)}
                 for t in required if t.index is None and t.expressions]
    preferred_list = [dict(p) for p in preferred]
    if not has_node_affinity and (new_terms or preferred_list):
        value: dict[str, Any] = {}
        if new_terms:
            value["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": new_terms}
        if preferred_list:
            value["preferredDuringSchedulingIgnoredDuringExecution"] = preferred_list
        if has_affinity:
            return [{"op": "add", "path": _NA, "value": value}]
        return [{"op": "add", "path": _AFF, "value": {"nodeAffinity": value}}]
    ops = _required_ops(pod, na, required, new_terms)
    if preferred_list:
        if isinstance(na.get("preferredDuringSchedulingIgnoredDuringExecution"), list):
            ops.extend({"op": "add", "path": f"{_PREF}/-", "value": p} for p in preferred_list)
        else:
            ops.append({"op": "add", "path": _PREF, "value": preferred_list})
    return ops


def _required_ops(pod: Mapping[str, Any], na: Mapping[str, Any],
                  required: Sequence[TermRestriction],
                  new_terms: list[dict[str, Any]]) -> list[Op]:
    """The required part of :func:`restriction_ops` for a pod that has ``nodeAffinity``."""
    if new_terms:
        if not isinstance(na.get("requiredDuringSchedulingIgnoredDuringExecution"), Mapping):
            return [{"op": "add", "path": _REQ, "value": {"nodeSelectorTerms": new_terms}}]
        # required exists with no (or an empty) terms list: set the list whole
        return [{"op": "add", "path": _TERMS, "value": new_terms}]
    terms = required_terms(pod)
    ops: list[Op] = []
    for t in required:
        if t.index is None or not t.expressions:
            continue
        if isinstance(terms[t.index].get("matchExpressions"), list):
            ops.extend({"op": "add", "path": f"{_TERMS}/{t.index}/matchExpressions/-",
                        "value": expr} for expr in t.expressions)
        else:
            # a term with only matchFields: create its matchExpressions
            ops.append({"op": "add", "path": f"{_TERMS}/{t.index}/matchExpressions",
                        "value": list(t.expressions)})
    return ops


def require_architectures(pod: Mapping[str, Any], archs: Iterable[str]) -> list[Op]:
    """Ops ANDing ``kubernetes.io/arch In [sorted archs]`` into every required term that does
    not pin ``kubernetes.io/arch`` with ``In`` (KEP-3838 appends)."""
    plan = AffinityPlan(pod)
    plan.require(expression(ARCH_LABEL, "In", sorted(set(archs))))
    return plan.ops()


def require_oses(pod: Mapping[str, Any], oses: Iterable[str]) -> list[Op]:
    """Ops ANDing ``kubernetes.io/os In [sorted oses]`` into every required term that does
    not pin ``kubernetes.io/os`` with ``In``."""
    plan = AffinityPlan(pod)
    plan.require(expression(OS_LABEL, "In", sorted(set(oses))))
    return plan.ops()


def unsatisfiable_marker() -> dict[str, Any]:
    """``podplacement.io/no-supported-platform Exists``: no node has this label, so the
    scheduler reports the pod as unschedulable with a clear reason."""
    return expression(NO_SUPPORTED_PLATFORM_KEY, "Exists")


def arch_preferences(
    pod: Mapping[str, Any], archs: Sequence[str], weights: Mapping[str, int]
) -> list[dict[str, Any]]:
    """PreferredSchedulingTerms: one per architecture in ``archs`` with a configured
    weight, or ``[]`` when the pod already has an architecture preference (the user's
    choice wins; ``spec.plugins.nodeAffinityScoring``)."""
    if has_preference_on(pod, ARCH_LABEL):
        return []
    return [arch_preference(a, weights[a]) for a in archs if a in weights]


def arch_preference(arch: str, weight: int) -> dict[str, Any]:
    """The PreferredSchedulingTerm ``kubernetes.io/arch In [arch]`` with ``weight``."""
    return {"weight": weight,
            "preference": {"matchExpressions": [expression(ARCH_LABEL, "In", [arch])]}}


def hostname_requirement(hostnames: Sequence[str]) -> dict[str, Any]:
    """``kubernetes.io/hostname In [...]``: several nodes cannot be named with
    ``matchFields metadata.name`` (one value only), so their hostname labels are used."""
    return expression(HOSTNAME_LABEL, "In", list(hostnames))
