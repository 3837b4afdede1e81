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
- **Narrow, never widen**: the policy only applies to pods of its own namespace; its
  weights replace the cluster's (``nodeAffinityScoring`` absent: the cluster's apply; present
  with ``enabled: false`` or no platforms: no weights); ``allowedArchitectures`` is ANDed
  into the supported set (:func:`narrow`), so a pod can only lose platforms; its
  ``fallbackArchitecture`` replaces the cluster's, and with ``allowedArchitectures`` the
  fallback stays inside them (:func:`fallback_architectures`).

:func:`params_policies` is the form the controller publishes in the admission policy's params
object (``spec.policies``: namespace → accepted policies, highest priority first), which the
policy's CEL reads (:mod:`rules.admissionpolicy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import ConfigError, PlacementConfig, PlatformWeight

__all__ = [
    "CONDITION_ACCEPTED",
    "OPERATORS",
    "REASON_ACCEPTED",
    "REASON_INVALID",
    "REASON_PRIORITY_CONFLICT",
    "PlacementPolicy",
    "PolicyError",
    "Ranking",
    "Requirement",
    "desired_status",
    "fallback_architectures",
    "narrow",
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
#: ``priority`` bounds (also in the CRD's schema).
MIN_PRIORITY, MAX_PRIORITY = 0, 255


class PolicyError(ConfigError):
    """A PodPlacementPolicy field has a value the rules cannot use (``path``: the field)."""


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
    return Requirement(key, str(operator), tuple(values))


def selector_requirements(selector: Any, path: str = "spec.podSelector"
                          ) -> tuple[Requirement, ...]:
    """A metav1.LabelSelector dict as requirements, ANDed: ``matchLabels`` first (key
    order, each ``In [value]``), then ``matchExpressions`` in order.

    Raises:
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
    out = [Requirement(str(k), "In", (str(v),)) for k, v in labels.items()]
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


def _architectures(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise PolicyError(path, "must be a list of architecture names")
    return tuple(sorted(set(value)))


def _weights(scoring: Any) -> tuple[PlatformWeight, ...]:
    path = "spec.nodeAffinityScoring"
    if not isinstance(scoring, Mapping):
        raise PolicyError(path, "must be an object")
    if scoring.get("enabled", True) is False:
        return ()
    out: list[PlatformWeight] = []
    for i, item in enumerate(scoring.get("platforms") or []):
        where = f"{path}.platforms[{i}]"
        arch = item.get("architecture") if isinstance(item, Mapping) else None
        weight = item.get("weight") if isinstance(item, Mapping) else None
        if not isinstance(arch, str) or not arch or any(w.architecture == arch for w in out):
            raise PolicyError(where, f"invalid or duplicate architecture {arch!r}")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise PolicyError(where, f"weight must be an integer 1..100, got {weight!r}")
        out.append(PlatformWeight(arch, weight))
    return tuple(out)


def parse_policy(obj: Mapping[str, Any]) -> PlacementPolicy:
    """A PodPlacementPolicy dict (as the API gives it) as a :class:`PlacementPolicy`.

    Raises:
        PolicyError: a field has a value the rules cannot use (the CRD's schema refuses
            most of these at write time; this is the same check for objects from
            elsewhere, e.g. ``explain --policy-file``).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        raise PolicyError("spec", "must be an object")
    priority = spec.get("priority", 0)
    if (not isinstance(priority, int) or isinstance(priority, bool)
            or not MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise PolicyError("spec.priority", f"must be an integer {MIN_PRIORITY}..{MAX_PRIORITY}")
    scoring = spec.get("nodeAffinityScoring")
    allowed = spec.get("allowedArchitectures")
    fallback = spec.get("fallbackArchitecture") or None
    if fallback is not None and not isinstance(fallback, str):
        raise PolicyError("spec.fallbackArchitecture", "must be a string")
    allowed_archs = (None if allowed is None
                     else _architectures(allowed, "spec.allowedArchitectures"))
    if allowed_archs is not None and fallback is not None and fallback not in allowed_archs:
        raise PolicyError("spec.fallbackArchitecture", "must be one of allowedArchitectures")
    return PlacementPolicy(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
        priority=priority, selector=selector_requirements(spec.get("podSelector")),
        weights=None if scoring is None else _weights(scoring),
        allowed_architectures=allowed_archs, fallback_architecture=fallback,
        generation=int(meta.get("generation") or 0),
        created=str(meta.get("creationTimestamp") or ""), uid=str(meta.get("uid") or ""))


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
    priority, highest first; of two with the same priority the older (creationTimestamp,
    then name) is accepted and the other rejected (``PriorityConflict``); one that does not
    parse is rejected (``Invalid``)."""
    by_ns: dict[str, dict[int, PlacementPolicy]] = {}
    rejected: dict[str, tuple[str, str]] = {}
    parsed: list[PlacementPolicy] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            parsed.append(parse_policy(obj))
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
    accepted = {ns: tuple(slot[p] for p in sorted(slot, reverse=True))
                for ns, slot in sorted(by_ns.items())}
    return Ranking(accepted, rejected)


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
    :func:`rules.fallback.fallback_requirement`)."""
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
