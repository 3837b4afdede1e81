"""Per-namespace placement policies: parsing, which policy applies to a pod, and what it
changes in the cluster's config (pure, no I/O).

A ``PodPlacementPolicy`` (``podplacement.io/v1beta1``, namespaced; ``deploy/crds/
podplacementpolicy.yaml``; docs/guide/policies.md) gives the pods of its
namespace that its ``podSelector`` matches their own architecture weights
(``nodeAffinityScoring``), a hard limit (``allowedArchitectures``) and a fallback
(``fallbackArchitecture``). The rules, used by every path (the controller, ``explain``, the
webhook and, rendered in CEL, the admission policy):

- **Which policy**: of the *accepted* policies of the pod's namespace whose selector matches
  the pod's labels, the one with the highest ``priority``; nothing merges across policies
  (:func:`policy_for`). An empty selector matches every pod.
- **Accepted**: ``priority`` is unique within a namespace. Two policies with the same
  priority: the older one (``creationTimestamp``, then name) is accepted, the other is
  not applied and says so in its status (condition ``Accepted=False``, reason
  ``PriorityConflict``), as Gateway API resolves conflicting routes (:func:`rank`). A
  policy that does not parse is not applied (reason ``Invalid``).
- **Published, or not applied at all**: an accepted policy is one the params object can
  carry, so that the admission policy's CEL applies exactly what the webhook and the
  controller apply. A policy over one of the limits below (stored before the CRD enforced
  it, or over :data:`POLICY_MAX_BYTES`, which no schema can say) is not applied (reason
  ``NotPublished``); the policies' share of the params object is bounded like the images'
  (:data:`NAMESPACE_MAX_BYTES` per namespace, :data:`POLICIES_MAX_BYTES` in all,
  :data:`MAX_NAMESPACES`): what does not fit is not applied (reason ``CatalogFull``),
  lowest priority first within a namespace and the namespaces whose oldest policy is the
  youngest first across them, so a new policy never takes another namespace's place.
- **Narrow, never widen**: the policy only applies to pods of its own namespace; its
  weights replace the cluster's (``nodeAffinityScoring`` absent: the cluster's apply; present
  with ``enabled: false`` or no platforms: no weights); ``allowedArchitectures`` is ANDed
  into the supported set (:func:`narrow`), so a pod can only lose platforms; its
  ``fallbackArchitecture`` replaces the cluster's, and with ``allowedArchitectures`` the
  fallback stays inside them (:func:`fallback_architectures`).

:func:`params_policies` is the form the controller publishes in the admission policy's params
object (``spec.policies``: namespace → accepted policies, highest priority first), which the
policy's CEL reads (:mod:`rules.admit.admissionpolicy`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from podplacement.rules.config import (
    ARCHITECTURES,
    INVALID_ARCHITECTURE,
    INVALID_WEIGHT,
    ConfigError,
    PlacementConfig,
    PlatformWeight,
)

__all__ = [
    "CONDITION_ACCEPTED",
    "LABEL_KEY_PATTERN",
    "LABEL_VALUE_PATTERN",
    "MAX_ARCHITECTURES",
    "MAX_KEY_LENGTH",
    "MAX_KEY_NAME_LENGTH",
    "MAX_KEY_PREFIX_LENGTH",
    "MAX_MATCH_EXPRESSIONS",
    "MAX_MATCH_LABELS",
    "MAX_NAMESPACES",
    "MAX_NAME_LENGTH",
    "MAX_POLICIES_PER_NAMESPACE",
    "MAX_REQUIREMENTS",
    "MAX_VALUES",
    "MAX_VALUE_LENGTH",
    "NAMESPACE_MAX_BYTES",
    "OPERATORS",
    "POLICIES_MAX_BYTES",
    "POLICY_MAX_BYTES",
    "REASON_ACCEPTED",
    "REASON_CATALOG_FULL",
    "REASON_INVALID",
    "REASON_NOT_PUBLISHED",
    "REASON_PRIORITY_CONFLICT",
    "PlacementPolicy",
    "PolicyError",
    "PolicyLimitError",
    "Ranking",
    "Requirement",
    "desired_status",
    "entry_size",
    "fallback_architectures",
    "narrow",
    "params_entry",
    "params_policies",
    "parse_policy",
    "policy_for",
    "rank",
    "selector_matches",
    "selector_requirements",
    "selector_text",
]

#: Label selector operators (metav1.LabelSelectorRequirement).
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: The status condition of a policy and its reasons.
CONDITION_ACCEPTED = "Accepted"
REASON_ACCEPTED = "Accepted"
REASON_PRIORITY_CONFLICT = "PriorityConflict"
REASON_INVALID = "Invalid"
#: Over a limit of this module (:class:`PolicyLimitError`): the params object cannot carry it.
REASON_NOT_PUBLISHED = "NotPublished"
#: Within every limit, but the policies' share of the params object is taken (:func:`rank`).
REASON_CATALOG_FULL = "CatalogFull"
#: ``priority`` bounds (also in the CRD's schema).
MIN_PRIORITY, MAX_PRIORITY = 0, 255

# --- limits on a policy's content --------------------------------------------------------
# The one place of every bound a policy keeps. The PodPlacementPolicy CRD refuses a policy
# over one when it is written (deploy/crds/podplacementpolicy.yaml: maxItems,
# maxProperties, maxLength, patterns, CEL); the ImagePlatformCatalog CRD refuses a params
# object whose spec.policies breaks one (deploy/crds/imageplatformcatalog.yaml), which is
# why a policy that breaks one (stored before its CRD enforced it) is never published
# (:func:`parse_policy` raises :class:`PolicyLimitError`). tests/deploy/test_policy_limits.py
# checks both CRDs against these numbers. Label syntax: Kubernetes' "Labels and Selectors"
# (apimachinery validation IsQualifiedName, IsValidLabelValue).

#: ``metadata.name``: a label value on the pods the policy places (``podplacement.io/policy``).
MAX_NAME_LENGTH = 63
#: ``podSelector``: ``matchLabels`` entries and ``matchExpressions`` together (the catalog's
#: ``selector`` ``maxItems``), each of them alone, and the values of one expression.
MAX_REQUIREMENTS = 64
MAX_MATCH_LABELS = 64
MAX_MATCH_EXPRESSIONS = 16
MAX_VALUES = 64
#: A label key: an optional DNS subdomain prefix (at most 253 characters) and ``/``, then a
#: name of at most 63 (alphanumerics, ``-``, ``_``, ``.``; alphanumeric at both ends).
MAX_KEY_PREFIX_LENGTH = 253
MAX_KEY_NAME_LENGTH = 63
MAX_KEY_LENGTH = MAX_KEY_PREFIX_LENGTH + 1 + MAX_KEY_NAME_LENGTH
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: A label value: at most 63 characters, empty or alphanumeric at both ends.
MAX_VALUE_LENGTH = 63
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: ``allowedArchitectures`` and ``nodeAffinityScoring.platforms``: each architecture once.
MAX_ARCHITECTURES = len(ARCHITECTURES)
#: Policies of one namespace the params object can carry (one per priority).
MAX_POLICIES_PER_NAMESPACE = MAX_PRIORITY - MIN_PRIORITY + 1
#: Namespaces the params object's ``spec.policies`` can carry (its ``maxProperties``).
MAX_NAMESPACES = 1000
#: Bytes of compact JSON: one policy's published entry (:func:`params_entry`: no schema can
#: bound it, a policy within every count above can take 85 KB); one namespace's share of
#: ``spec.policies``; and all of ``spec.policies``, which shares the params object with
#: the catalog (``rules.config.PARAMS_MAX_BYTES``, 1,000,000) and
#: ``spec.fresh`` under the API server's 1.5 MiB object limit (etcd's request size).
POLICY_MAX_BYTES = 16_384
NAMESPACE_MAX_BYTES = 32_768
POLICIES_MAX_BYTES = 262_144

_LABEL_KEY_RE = re.compile(LABEL_KEY_PATTERN)
_LABEL_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)


class PolicyError(ConfigError):
    """A PodPlacementPolicy field has a value the rules cannot use (``path``: the field)."""


class PolicyLimitError(PolicyError):
    """A PodPlacementPolicy is over one of this module's limits (a count, a length, label
    syntax, an architecture outside the enum, :data:`POLICY_MAX_BYTES`): the params object
    could not carry it (``path``: the field)."""


def _check_key(key: str, path: str) -> None:
    if len(key) > MAX_KEY_LENGTH or not _LABEL_KEY_RE.match(key) \
            or key.find("/") > MAX_KEY_PREFIX_LENGTH:
        raise PolicyLimitError(path, (
            f"{_shown(key)} is not a label key: an optional DNS subdomain prefix of at most "
            f"{MAX_KEY_PREFIX_LENGTH} characters and '/', then a name of at most "
            f"{MAX_KEY_NAME_LENGTH} (letters, digits, '-', '_', '.'; a letter or digit at "
            "both ends)"))


def _check_value(value: str, path: str) -> None:
    if len(value) > MAX_VALUE_LENGTH or not _LABEL_VALUE_RE.match(value):
        raise PolicyLimitError(path, (
            f"{_shown(value)} is not a label value: at most {MAX_VALUE_LENGTH} characters "
            "(letters, digits, '-', '_', '.'; a letter or digit at both ends), or empty"))


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut to 40 characters (it is the policy author's)."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label selector requirement: ``key``, ``operator`` (:data:`OPERATORS`), ``values``
    (empty for ``Exists``/``DoesNotExist``)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """A parsed PodPlacementPolicy.

    Attributes:
        namespace, name: the object's.
        priority: 0..255, unique within the namespace (the highest matching one wins).
        selector: the ``podSelector`` as requirements, ANDed (``matchLabels`` entries become
            ``In`` with one value); empty: every pod of the namespace.
        weights: the architecture weights replacing the cluster's, or None when the policy
            has no ``nodeAffinityScoring`` (the cluster's apply).
        allowed_architectures: the hard limit, sorted, or None (no limit).
        fallback_architecture: replaces the cluster's ``fallbackArchitecture``, or None.
        generation: ``metadata.generation``; created: ``metadata.creationTimestamp``
            (RFC 3339, "" when absent); uid: ``metadata.uid``.
    """

    namespace: str
    name: str
    priority: int
    selector: tuple[Requirement, ...] = ()
    weights: tuple[PlatformWeight, ...] | None = None
    allowed_architectures: tuple[str, ...] | None = None
    fallback_architecture: str | None = None
    generation: int = 0
    created: str = ""
    uid: str = ""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def applied_to(self, config: PlacementConfig) -> PlacementConfig:
        """``config`` with this policy's weights and fallback in place of the cluster's
        (each only when the policy sets it)."""
        changes: dict[str, Any] = {}
        if self.weights is not None:
            changes["preferred_platforms"] = self.weights
        if self.fallback_architecture:
            changes["fallback_architecture"] = self.fallback_architecture
        return dataclasses.replace(config, **changes) if changes else config


def _requirement(item: Any, path: str) -> Requirement:
    if not isinstance(item, Mapping):
        raise PolicyError(path, "must be an object")
    key, operator, values = item.get("key"), item.get("operator"), item.get("values") or []
    if not isinstance(key, str) or not key:
        raise PolicyError(f"{path}.key", "must be a non-empty string")
    if operator not in OPERATORS:
        raise PolicyError(f"{path}.operator", f"must be one of {', '.join(OPERATORS)}")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise PolicyError(f"{path}.values", "must be a list of strings")
    if operator in ("In", "NotIn") and not values:
        raise PolicyError(f"{path}.values", f"must be non-empty for {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise PolicyError(f"{path}.values", f"must be empty for {operator}")
    _check_key(key, f"{path}.key")
    if len(values) > MAX_VALUES:
        raise PolicyLimitError(f"{path}.values",
                               f"has {len(values)} values, at most {MAX_VALUES}")
    for i, value in enumerate(values):
        _check_value(value, f"{path}.values[{i}]")
    return Requirement(key, str(operator), tuple(values))


def selector_requirements(selector: Any, path: str = "spec.podSelector"
                          ) -> tuple[Requirement, ...]:
    """A metav1.LabelSelector dict as requirements, ANDed: ``matchLabels`` first (key
    order, each ``In [value]``), then ``matchExpressions`` in order.

    Raises:
        PolicyLimitError: over a limit of this module (:data:`MAX_MATCH_LABELS`,
            :data:`MAX_MATCH_EXPRESSIONS`, :data:`MAX_REQUIREMENTS`, :data:`MAX_VALUES`, a
            key or value that is not label syntax), checked before anything else is read.
        PolicyError: the selector is not a LabelSelector (unknown operator, values given for
            ``Exists``/``DoesNotExist`` or missing for ``In``/``NotIn``).
    """
    if selector is None:
        return ()
    if not isinstance(selector, Mapping):
        raise PolicyError(path, "must be a LabelSelector object")
    labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not isinstance(exprs, list):
        raise PolicyError(path, "matchLabels must be a map, matchExpressions a list")
    if len(labels) > MAX_MATCH_LABELS:
        raise PolicyLimitError(f"{path}.matchLabels",
                               f"has {len(labels)} entries, at most {MAX_MATCH_LABELS}")
    if len(exprs) > MAX_MATCH_EXPRESSIONS:
        raise PolicyLimitError(f"{path}.matchExpressions",
                               f"has {len(exprs)} items, at most {MAX_MATCH_EXPRESSIONS}")
    if len(labels) + len(exprs) > MAX_REQUIREMENTS:
        raise PolicyLimitError(path, (
            f"has {len(labels) + len(exprs)} requirements (matchLabels entries and "
            f"matchExpressions together), at most {MAX_REQUIREMENTS}"))
    out = []
    for k, v in labels.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise PolicyError(f"{path}.matchLabels", "keys and values must be strings")
        _check_key(k, f"{path}.matchLabels")
        _check_value(v, f"{path}.matchLabels[{k[:80]}]")
        out.append(Requirement(k, "In", (v,)))
    out += [_requirement(e, f"{path}.matchExpressions[{i}]") for i, e in enumerate(exprs)]
    return tuple(out)


def selector_matches(selector: Sequence[Requirement], labels: Mapping[str, Any]) -> bool:
    """True when ``labels`` satisfy every requirement (metav1.LabelSelector semantics:
    ``NotIn`` and ``DoesNotExist`` hold for an absent key; no requirement matches all)."""
    for req in selector:
        present = req.key in labels
        if req.operator == "In":
            ok = present and str(labels[req.key]) in req.values
        elif req.operator == "NotIn":
            ok = not (present and str(labels[req.key]) in req.values)
        elif req.operator == "Exists":
            ok = present
        else:
            ok = not present
        if not ok:
            return False
    return True


def _architecture(value: Any, path: str) -> str:
    if value not in ARCHITECTURES:
        shown = _shown(value) if isinstance(value, str) else type(value).__name__
        raise PolicyLimitError(path, f"{shown} is not one of {', '.join(ARCHITECTURES)}")
    return str(value)


def _architectures(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise PolicyError(path, "must be a list of architecture names")
    if len(value) > MAX_ARCHITECTURES:
        raise PolicyLimitError(path, f"has {len(value)} items, at most {MAX_ARCHITECTURES}")
    return tuple(sorted({_architecture(a, f"{path}[{i}]") for i, a in enumerate(value)}))


def _weights(scoring: Any) -> tuple[PlatformWeight, ...]:
    path = "spec.nodeAffinityScoring"
    if not isinstance(scoring, Mapping):
        raise PolicyError(path, "must be an object")
    if scoring.get("enabled", True) is False:
        return ()
    out: list[PlatformWeight] = []
    platforms = scoring.get("platforms") or []
    if not isinstance(platforms, list):
        raise PolicyError(f"{path}.platforms", "must be a list")
    if len(platforms) > MAX_ARCHITECTURES:
        raise PolicyLimitError(f"{path}.platforms",
                               f"has {len(platforms)} items, at most {MAX_ARCHITECTURES}")
    for i, item in enumerate(platforms):
        where = f"{path}.platforms[{i}]"
        arch = item.get("architecture") if isinstance(item, Mapping) else None
        weight = item.get("weight") if isinstance(item, Mapping) else None
        if not isinstance(arch, str) or not arch or any(w.architecture == arch for w in out):
            raise PolicyError(where, INVALID_ARCHITECTURE.format(arch))
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise PolicyError(where, INVALID_WEIGHT.format(weight))
        out.append(PlatformWeight(_architecture(arch, f"{where}.architecture"), weight))
    return tuple(out)


def parse_policy(obj: Mapping[str, Any]) -> PlacementPolicy:
    """A PodPlacementPolicy dict (as the API gives it) as a :class:`PlacementPolicy`.

    Raises:
        PolicyLimitError: the policy is over a limit of this module: the params object
            could not carry it (the CRD's schema refuses all but :data:`POLICY_MAX_BYTES`
            at write time; a policy stored before the schema did, or read from a file by
            ``explain --policy-file``, is checked here).
        PolicyError: a field has a value the rules cannot use (the CRD's schema refuses
            these at write time; this is the same check for objects from elsewhere).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        raise PolicyError("spec", "must be an object")
    name = str(meta.get("name") or "")
    if len(name) > MAX_NAME_LENGTH:
        raise PolicyLimitError("metadata.name", f"has {len(name)} characters, at most "
                               f"{MAX_NAME_LENGTH} (a label value on the pods it places)")
    priority = spec.get("priority", 0)
    if (not isinstance(priority, int) or isinstance(priority, bool)
            or not MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise PolicyError("spec.priority", f"must be an integer {MIN_PRIORITY}..{MAX_PRIORITY}")
    scoring = spec.get("nodeAffinityScoring")
    allowed = spec.get("allowedArchitectures")
    fallback = spec.get("fallbackArchitecture") or None
    if fallback is not None:
        fallback = _architecture(fallback, "spec.fallbackArchitecture")
    allowed_archs = (None if allowed is None
                     else _architectures(allowed, "spec.allowedArchitectures"))
    if allowed_archs is not None and fallback is not None and fallback not in allowed_archs:
        raise PolicyError("spec.fallbackArchitecture", "must be one of allowedArchitectures")
    policy = PlacementPolicy(
        namespace=str(meta.get("namespace") or ""), name=name,
        priority=priority, selector=selector_requirements(spec.get("podSelector")),
        weights=None if scoring is None else _weights(scoring),
        allowed_architectures=allowed_archs, fallback_architecture=fallback,
        generation=int(meta.get("generation") or 0),
        created=str(meta.get("creationTimestamp") or ""), uid=str(meta.get("uid") or ""))
    size = entry_size(policy)
    if size > POLICY_MAX_BYTES:
        raise PolicyLimitError("spec", (
            f"published, it takes {size} bytes of the admission policy's params object; a "
            f"policy may take at most {POLICY_MAX_BYTES} (fewer or shorter selector values)"))
    return policy


@dataclass(frozen=True, slots=True)
class Ranking:
    """The policies of the cluster after :func:`rank`.

    Attributes:
        accepted: namespace → its accepted policies, highest priority first (the order
            :func:`policy_for` and the admission policy's CEL search).
        rejected: ``namespace/name`` → (reason, message) of each policy not applied.
    """

    accepted: Mapping[str, tuple[PlacementPolicy, ...]]
    rejected: Mapping[str, tuple[str, str]]

    def of(self, namespace: str) -> tuple[PlacementPolicy, ...]:
        """The accepted policies of ``namespace``, highest priority first."""
        return self.accepted.get(namespace, ())

    def all(self) -> Iterable[PlacementPolicy]:
        """Every accepted policy."""
        for group in self.accepted.values():
            yield from group


EMPTY_RANKING = Ranking({}, {})


def rank(objects: Iterable[Mapping[str, Any]]) -> Ranking:
    """Parse and rank PodPlacementPolicy dicts: per namespace, the accepted policies by
    priority, highest first.

    Rejected, with the reason of their status (:func:`desired_status`): one that does not
    parse (``Invalid``), or is over a limit (``NotPublished``: :class:`PolicyLimitError`);
    of two with the same priority, the younger (creationTimestamp, then name:
    ``PriorityConflict``); and those the params object has no room for (``CatalogFull``):
    within a namespace, lowest priority first, once its policies would take more than
    :data:`NAMESPACE_MAX_BYTES`; across namespaces, those whose oldest policy is the
    youngest, once ``spec.policies`` would take more than :data:`POLICIES_MAX_BYTES` or hold
    more than :data:`MAX_NAMESPACES` namespaces. So what :func:`params_policies` publishes
    always fits the params object, and every path applies exactly what it publishes."""
    by_ns: dict[str, dict[int, PlacementPolicy]] = {}
    rejected: dict[str, tuple[str, str]] = {}
    parsed: list[PlacementPolicy] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            parsed.append(parse_policy(obj))
        except PolicyLimitError as exc:
            rejected[key] = (REASON_NOT_PUBLISHED, (
                f"not applied: {exc}; the admission policy's params object could not carry "
                "it (a policy stored before its CRD enforced this limit); edit it to fit"))
        except PolicyError as exc:
            rejected[key] = (REASON_INVALID, str(exc))
    for policy in sorted(parsed, key=lambda p: (p.created, p.name)):
        slot = by_ns.setdefault(policy.namespace, {})
        winner = slot.get(policy.priority)
        if winner is not None:
            rejected[policy.key] = (
                REASON_PRIORITY_CONFLICT,
                f"priority {policy.priority} is already taken by policy {winner.name} in "
                "this namespace; priorities must be unique within a namespace")
            continue
        slot[policy.priority] = policy
    accepted = _within_budget(
        {ns: [slot[p] for p in sorted(slot, reverse=True)] for ns, slot in by_ns.items()},
        rejected)
    return Ranking(accepted, rejected)


def entry_size(policy: PlacementPolicy) -> int:
    """Bytes of ``policy``'s published entry (:func:`params_entry`) as compact JSON."""
    return len(orjson.dumps(params_entry(policy)))


def _within_budget(groups: Mapping[str, list[PlacementPolicy]],
                   rejected: dict[str, tuple[str, str]]
                   ) -> dict[str, tuple[PlacementPolicy, ...]]:
    """The policies of ``groups`` (namespace -> accepted, highest priority first) that
    the params object has room for (:func:`rank`); the others go to ``rejected``."""
    def age(ns: str) -> tuple[str, str, str]:
        oldest = min(groups[ns], key=lambda p: (p.created, p.name))
        return oldest.created, ns, oldest.name

    full = (f"the policies' share of the admission policy's params object "
            f"({POLICIES_MAX_BYTES} bytes, {MAX_NAMESPACES} namespaces) is taken by the "
            "policies of namespaces with older policies")
    total = 2  # the braces of spec.policies
    out: dict[str, tuple[PlacementPolicy, ...]] = {}
    for ns in sorted((ns for ns in groups if groups[ns]), key=age):
        # "ns":[e1,e2], : the key, its colon, the brackets, a comma after each item
        used = len(orjson.dumps(ns)) + 4
        kept: list[PlacementPolicy] = []
        for policy in groups[ns]:
            size = entry_size(policy) + 1
            if used + size > NAMESPACE_MAX_BYTES:
                rejected[policy.key] = (REASON_CATALOG_FULL, (
                    f"not applied: this namespace's share of the admission policy's params "
                    f"object ({NAMESPACE_MAX_BYTES} bytes) is taken by its policies of "
                    f"higher priority; this one takes {size - 1}"))
            elif total + used + size > POLICIES_MAX_BYTES or (
                    not kept and len(out) >= MAX_NAMESPACES):
                rejected[policy.key] = (REASON_CATALOG_FULL, f"not applied: {full}")
            else:
                kept.append(policy)
                used += size
        if kept:
            out[ns] = tuple(kept)
            total += used
    return dict(sorted(out.items()))


def policy_for(pod: Mapping[str, Any],
               policies: Sequence[PlacementPolicy]) -> PlacementPolicy | None:
    """The policy that applies to ``pod``: the first of ``policies`` (the accepted policies
    of the pod's namespace, highest priority first: :meth:`Ranking.of`) whose selector
    matches the pod's labels; None when none does."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, Mapping):
        labels = {}
    for policy in policies:
        if selector_matches(policy.selector, labels):
            return policy
    return None


def narrow(pairs: Sequence[tuple[str, str]], policy: PlacementPolicy | None
           ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The (os, architecture) ``pairs`` the policy's ``allowedArchitectures`` keep, and
    those it removes (both in the given order); all kept without a policy or limit."""
    if policy is None or policy.allowed_architectures is None:
        return tuple(pairs), ()
    allowed = set(policy.allowed_architectures)
    return (tuple(p for p in pairs if p[1] in allowed),
            tuple(p for p in pairs if p[1] not in allowed))


def fallback_architectures(config: PlacementConfig,
                           policy: PlacementPolicy | None) -> tuple[str, ...]:
    """The architectures required when inspection is given up: the fallback (the policy's,
    else the cluster's), kept only inside the policy's ``allowedArchitectures``; with a
    limit and no fallback inside it, the allowed architectures themselves (a hard limit
    holds for pods whose images could not be inspected, too). Empty: no architecture
    requirement (the fallback operating systems still apply:
    :func:`rules.place.fallback.fallback_requirement`)."""
    arch = (policy.fallback_architecture if policy is not None else None) \
        or config.fallback_architecture
    allowed = policy.allowed_architectures if policy is not None else None
    if allowed is None:
        return (arch,) if arch else ()
    return (arch,) if arch in allowed else tuple(allowed)


def params_entry(policy: PlacementPolicy) -> dict[str, Any]:
    """One policy as the params object publishes it for the admission policy's CEL:
    ``name``, ``priority``, ``selector`` (requirements: ``key``, ``operator``, ``values``),
    and, when set, ``weights`` (architecture → weight) and ``allowed`` (architectures)."""
    entry: dict[str, Any] = {
        "name": policy.name, "priority": policy.priority,
        "selector": [{"key": r.key, "operator": r.operator, "values": list(r.values)}
                     for r in policy.selector],
    }
    if policy.weights is not None:
        entry["weights"] = {w.architecture: w.weight for w in policy.weights}
    if policy.allowed_architectures is not None:
        entry["allowed"] = list(policy.allowed_architectures)
    return entry


def params_policies(ranking: Ranking) -> dict[str, list[dict[str, Any]]]:
    """``spec.policies`` of the params object: namespace → its accepted policies,
    highest priority first (:func:`params_entry`)."""
    return {ns: [params_entry(p) for p in group] for ns, group in ranking.accepted.items()
            if group}


def selector_text(selector: Sequence[Requirement]) -> str:
    """The requirements in the label selector text form ``kubectl get -l`` takes
    (``app=web,tier in (db,web),!legacy``); "" selects every pod."""
    parts = []
    for r in selector:
        if r.operator == "In" and len(r.values) == 1:
            parts.append(f"{r.key}={r.values[0]}")
        elif r.operator in ("In", "NotIn"):
            parts.append(f"{r.key} {r.operator.lower()} ({','.join(r.values)})")
        elif r.operator == "Exists":
            parts.append(r.key)
        else:
            parts.append(f"!{r.key}")
    return ",".join(parts)


def desired_status(obj: Mapping[str, Any], ranking: Ranking, placed: int,
                   now: str) -> dict[str, Any]:
    """The ``status`` of one PodPlacementPolicy dict: ``observedGeneration``, ``selector``
    (:func:`selector_text`), ``placedPods`` (``placed``: its pods that exist, counted by the
    caller from the label ``podplacement.io/policy``) and the condition ``Accepted``
    (``True``/``Accepted``, or ``False`` with ``PriorityConflict`` or ``Invalid`` from
    ``ranking``). ``lastTransitionTime`` is kept from the live condition when its status
    did not change, else ``now`` (RFC 3339)."""
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    generation = int(meta.get("generation") or 0)
    rejected = ranking.rejected.get(key)
    status, reason, message = ("False", *rejected) if rejected else (
        "True", REASON_ACCEPTED, "the policy applies to the pods its podSelector matches")
    try:
        selector = selector_text(selector_requirements((obj.get("spec") or {})
                                                       .get("podSelector")))
    except PolicyError:
        selector = ""
    live = {c.get("type"): c for c in ((obj.get("status") or {}).get("conditions") or [])
            if isinstance(c, Mapping)}
    old = live.get(CONDITION_ACCEPTED) or {}
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return {
        "observedGeneration": generation,
        "selector": selector,
        "placedPods": placed,
        "conditions": [{"type": CONDITION_ACCEPTED, "status": status, "reason": reason,
                        "message": message[:1000], "observedGeneration": generation,
                        "lastTransitionTime": since or now}],
    }
