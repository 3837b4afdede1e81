"""Node-affinity JSON-patch builders for a gated pod (pure, no I/O).

While a pod is gated its required node affinity may only be narrowed [KEP-3838]: with
existing ``nodeSelectorTerms`` only new ``matchExpressions`` may be appended to terms;
expressions never change and terms are never added or removed. Merge and strategic-merge
patches replace ``nodeSelectorTerms`` whole, so this module emits JSON-patch ``add`` ops
that append with ``/-`` (``reference/gates-c-mutable-directives-gated.json``).

Required terms are ORed and the expressions inside a term are ANDed, so a requirement is
ANDed into **every** term (never added as a new ORed term, which would loosen the user's
constraints). When there are no terms, one new term is created. Preferred terms are fully
mutable; they are appended as well so the user's own preferences stay untouched.

Use :class:`AffinityPlan` to combine several requirements into one op list, or the
convenience functions (:func:`require_architectures`, ...) for one requirement.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.config import ARCH_LABEL, HOSTNAME_LABEL, NO_SUPPORTED_PLATFORM_KEY, OS_LABEL

_AFF = "/spec/affinity"
_NA = _AFF + "/nodeAffinity"
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


@dataclass(frozen=True, slots=True)
class Restriction:
    """What :meth:`AffinityPlan.restrict` did for one label ``key``.

    Attributes:
        key: the node label (``kubernetes.io/arch`` or ``kubernetes.io/os``).
        supported: the values the images run on, sorted.
        appended: how many terms got ``key In supported`` (a new term counts as one).
        outside: values the user's ``In`` pins admit that the images do not support, sorted.
        compatible: some required term can still admit a node with a supported value
            (False: the pod's own terms only admit values no image runs on).
    """

    key: str
    supported: tuple[str, ...]
    appended: int
    outside: tuple[str, ...]
    compatible: bool


class AffinityPlan:
    """Accumulates required expressions and preferred terms for one pod, then emits the
    JSON-patch ops that apply them while obeying KEP-3838 (appends only).

    ``require(expr, unless_key=K)`` ANDs ``expr`` into every existing required term that
    does not restrict ``K`` with an ``In`` expression (default: ``expr``'s own key; ``""``:
    every term); with no terms it goes into one new term. An identical expression already in
    a term is not added twice. :meth:`restrict` does the same for a supported value set and
    reports how the terms it left alone relate to that set.
    """

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self._pod = pod
        spec = _spec(pod)
        self._has_affinity = isinstance(spec.get("affinity"), Mapping)
        na = node_affinity(pod)
        self._has_node_affinity = self._has_affinity and isinstance(
            (spec.get("affinity") or {}).get("nodeAffinity"), Mapping
        )
        req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
        self._has_required = isinstance(req, Mapping)
        self._has_terms_field = self._has_required and isinstance(
            (req or {}).get("nodeSelectorTerms"), list
        )
        self._terms = required_terms(pod)
        # additions per existing term index; for a pod without terms, index 0 of a new term
        self._added: list[list[dict[str, Any]]] = [[] for _ in self._terms] or [[]]
        self._new_term = not self._terms
        self._has_preferred = isinstance(
            na.get("preferredDuringSchedulingIgnoredDuringExecution"), list
        )
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

    def restrict(self, key: str, supported: Iterable[str]) -> Restriction:
        """Make every required term admit only ``supported`` values of label ``key``, except
        the terms where the user pinned ``key`` with ``In`` (the user's explicit choice).

        A term without an ``In`` expression on ``key`` (none at all, or ``NotIn``,
        ``Exists``, ``DoesNotExist``) gets ``key In [sorted supported]`` appended (KEP-3838:
        a gated pod's terms may only be narrowed). A pinned term is left as written and
        classified against ``supported``: inside it, overlapping it in part, or disjoint.

        Returns: a :class:`Restriction` (what was appended, what the pins allow outside
        ``supported``, whether any term can still admit a supported value).
        """
        wanted = sorted(set(supported))
        appended = self.require(expression(key, "In", wanted))
        outside: set[str] = set()
        compatible = appended > 0
        for term in self._terms if not self._new_term else ():
            allowed = allowed_values(term, key)
            if allowed is None:
                continue
            if allowed & set(wanted):
                compatible = True
            outside |= allowed - set(wanted)
        return Restriction(key, tuple(wanted), appended, tuple(sorted(outside)), compatible)

    def prefer(self, weight: int, exprs: Sequence[Mapping[str, Any]]) -> None:
        """Append a PreferredSchedulingTerm (``weight`` clamped to 1..100, the API range)."""
        self._preferred.append(
            {
                "weight": max(1, min(100, int(weight))),
                "preference": {"matchExpressions": [dict(e) for e in exprs]},
            }
        )

    def result_terms(self) -> list[dict[str, Any]]:
        """The required terms as they will be after the patch (for explain/tests)."""
        if self._new_term:
            return [{"matchExpressions": list(self._added[0])}] if self._added[0] else []
        out = []
        for term, added in zip(self._terms, self._added, strict=True):
            t = copy.deepcopy(dict(term))
            if added:
                t["matchExpressions"] = list(t.get("matchExpressions") or []) + added
            out.append(t)
        return out

    def ops(self) -> list[Op]:
        """The JSON-patch ops (``add`` only) that apply the plan."""
        ops: list[Op] = []
        new_terms = self._new_term and bool(self._added[0])
        required_obj: dict[str, Any] | None = None
        if new_terms:
            required_obj = {"nodeSelectorTerms": [{"matchExpressions": list(self._added[0])}]}
        preferred = list(self._preferred)
        # Build the biggest absent container in one op.
        if not self._has_node_affinity and (required_obj or preferred):
            na: dict[str, Any] = {}
            if required_obj:
                na["requiredDuringSchedulingIgnoredDuringExecution"] = required_obj
            if preferred:
                na["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
            if self._has_affinity:
                ops.append({"op": "add", "path": _NA, "value": na})
            else:
                ops.append({"op": "add", "path": _AFF, "value": {"nodeAffinity": na}})
            return ops
        if required_obj:
            if not self._has_required:
                ops.append({"op": "add", "path": _REQ, "value": required_obj})
            else:
                # required exists with no (or an empty) terms list: set the list whole
                ops.append(
                    {"op": "add", "path": _TERMS, "value": required_obj["nodeSelectorTerms"]}
                )
        elif not self._new_term:
            for i, (term, added) in enumerate(zip(self._terms, self._added, strict=True)):
                if not added:
                    continue
                if isinstance(term.get("matchExpressions"), list):
                    for expr in added:
                        ops.append(
                            {"op": "add", "path": f"{_TERMS}/{i}/matchExpressions/-", "value": expr}
                        )
                else:
                    # a term with only matchFields: create its matchExpressions
                    ops.append(
                        {"op": "add", "path": f"{_TERMS}/{i}/matchExpressions", "value": added}
                    )
        if preferred:
            if self._has_preferred:
                ops.extend({"op": "add", "path": f"{_PREF}/-", "value": p} for p in preferred)
            else:
                ops.append({"op": "add", "path": _PREF, "value": preferred})
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
    return [
        {
            "weight": weights[a],
            "preference": {"matchExpressions": [expression(ARCH_LABEL, "In", [a])]},
        }
        for a in archs
        if a in weights
    ]


def hostname_requirement(hostnames: Sequence[str]) -> dict[str, Any]:
    """``kubernetes.io/hostname In [...]``: several nodes cannot be named with
    ``matchFields metadata.name`` (one value only), so their hostname labels are used."""
    return expression(HOSTNAME_LABEL, "In", list(hostnames))
