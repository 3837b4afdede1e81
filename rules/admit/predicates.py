"""The admission predicates, each written once in Python and once in CEL, side by side.

Which pods get our gate, and which ones the admission policy places at once, is decided in
two places: the webhook (:func:`webhook.gating.should_gate`, in Python) and the
MutatingAdmissionPolicy (:mod:`rules.admit.admissionpolicy`: its skip rules and
``variables``, in CEL). :data:`PREDICATES` holds every predicate they share, with its
meaning, its Python function and its CEL text next to each other; both read it from here
(the webhook's skip rules are :func:`gate_skip_reason`, the policy's
:data:`POLICY_MATCH_CONDITIONS`), and tests/controller/test_admissionpolicy_cel.py
evaluates every entry's CEL against its Python on generated pods, offline
(docs/how-it-decides.md, "The predicates, side by side").

A predicate's Python takes the pod as the AdmissionReview carries it (a plain dict) and the
plain :class:`Inputs` of the admission (namespace, config, the params object's tables, the
policy that applies); fields of an unexpected type count as absent, so
nothing here raises on odd input. A predicate's CEL reads ``object`` (the pod), ``params``
(the ImagePlatformCatalog), ``request`` and the ``variables`` of the entries before it.

The namespace rules (the system namespaces, the product's own, the opt-out label and the
config's selector) are no CEL: the API server applies them as a label selector
(:func:`rules.admit.webhookconfig.webhook_namespace_selection`), and the webhook as
:func:`rules.scope.namespace_skip_reason`. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from podplacement.rules.admit.imageparams import (
    catalog_maps,
    cel_split_cut,
    split_reference,
    value_pairs,
)
from podplacement.rules.config import (
    ARCH_LABEL,
    LINUX,
    OS_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.rules.place.placement import (
    CONTAINER_LISTS,
    IMAGE_VOLUME,
    IMAGE_VOLUME_PULL_POLICY,
    IMAGE_VOLUME_REFERENCE,
    PULL_ALWAYS,
    VOLUMES,
    pod_images,
    unique_images,
)
from podplacement.rules.podspec import has_gate
from podplacement.rules.policy import PlacementPolicy, narrow
from podplacement.rules.scope import (
    REASON_DAEMONSET,
    namespace_skip_reason,
    owned_by_daemonset,
)

__all__ = [
    "CEL_CODES",
    "CEL_FREE",
    "CEL_FRESH",
    "CEL_IMAGES",
    "CEL_KNOWN",
    "CEL_PLACED",
    "CEL_REFS",
    "CEL_REPOS",
    "CEL_SETS",
    "PLACED_OS",
    "POLICY_MATCH_CONDITIONS",
    "PREDICATES",
    "REASON_ALREADY_GATED",
    "REASON_NODE_NAME_SET",
    "REASON_NO_CONFIG",
    "SKIP_RULE_USE",
    "Inputs",
    "Predicate",
    "by_name",
    "cel_string",
    "gate_skip_reason",
]

#: The webhook's skip reasons (metrics label values) that are not
#: :mod:`rules.scope`'s.
REASON_NO_CONFIG = "no_config"
REASON_NODE_NAME_SET = "node_name_set"
REASON_ALREADY_GATED = "already_gated"

#: The place branch writes only linux pairs (one term ``arch In [archs]`` AND ``os In
#: [linux]``): several OSes need one term per OS group, so such pods take the gate branch.
PLACED_OS = LINUX


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal: single-quoted when that needs no escape (JSON
    pieces stay readable), else JSON's double-quoted form (its escapes are valid CEL)."""
    if not any(ch in text for ch in "'\\\n") and text.isascii():
        return f"'{text}'"
    return json.dumps(text)


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a predicate reads besides the pod.

    Attributes:
        namespace: the pod's namespace (``request.namespace``).
        own_namespace: the namespace the product runs in.
        config: the parsed PodPlacementConfig ``cluster``, None when there is none.
        table: the catalog of the params object, flat (image reference →
            ``"os/arch,..."``); the policy reads it in its dense layout
            (:func:`rules.admit.imageparams.catalog_maps` of it).
        fresh: ``spec.fresh`` of the params object (image reference → digest).
        policy: the PodPlacementPolicy that applies to the pod
            (:func:`rules.policy.policy_for`), or None.
    """

    namespace: str = ""
    own_namespace: str = ""
    config: PlacementConfig | None = field(default_factory=PlacementConfig)
    table: Mapping[str, str] = field(default_factory=dict)
    fresh: Mapping[str, str] = field(default_factory=dict)
    policy: PlacementPolicy | None = None


#: The inputs of the predicates that read the pod alone.
_POD_ONLY = Inputs()

#: A predicate's Python: ``(pod, inputs) -> value`` (a bool for a condition).
PythonRule = Callable[[Mapping[str, Any], Inputs], Any]


@dataclass(frozen=True, slots=True)
class Predicate:
    """One predicate in both languages.

    Attributes:
        name: the skip rule's or the policy variable's name.
        meaning: what it says, in one sentence.
        python: its Python (:data:`PythonRule`).
        render: its CEL text for the given inputs (none is read today: the inputs are the
            API server's ``object``/``params``/``request``).
        used_in: where its CEL is written: :data:`SKIP_RULE_USE`,
            ``policy.variables``, ``webhook.should_gate``.
        skip_reason: the webhook's skip reason when the condition does not hold ("" when
            the webhook does not check it).
    """

    name: str
    meaning: str
    python: PythonRule
    render: Callable[[Inputs], str]
    used_in: str
    skip_reason: str = ""

    def cel(self, inputs: Inputs | None = None) -> str:
        """The CEL text."""
        return self.render(inputs if inputs is not None else Inputs())


def _text(cel: str) -> Callable[[Inputs], str]:
    return lambda _inputs: cel


_NO_MAP: Mapping[str, Any] = {}


def _map(value: Any) -> Mapping[str, Any]:
    # ``type(...) is dict`` first: parsed JSON is always a dict (this runs on every admission).
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return _NO_MAP


# --- the pod-level skip rules: the policy's matchConditions, the webhook's reasons ----------


def not_bound(pod: Mapping[str, Any], inputs: Inputs) -> bool:
    """``spec.nodeName`` is unset or empty (a bound pod bypasses the scheduler: a gate would
    be pointless)."""
    return not _map(pod.get("spec")).get("nodeName")


def not_daemonset(pod: Mapping[str, Any], inputs: Inputs) -> bool:
    """No controlling ownerReference of kind DaemonSet
    (:func:`rules.scope.owned_by_daemonset`)."""
    return not owned_by_daemonset(_map(pod.get("metadata")))


def not_gated(pod: Mapping[str, Any], inputs: Inputs) -> bool:
    """Our gate is not in ``spec.schedulingGates`` yet
    (:func:`rules.podspec.has_gate`)."""
    return not has_gate(pod)


CEL_NOT_BOUND = "!has(object.spec.nodeName) || object.spec.nodeName == ''"
CEL_NOT_DAEMONSET = ("!has(object.metadata.ownerReferences) || "
                     "!object.metadata.ownerReferences.exists(r, "
                     "has(r.controller) && r.controller && r.kind == 'DaemonSet')")
CEL_NOT_GATED = ("!has(object.spec.schedulingGates) || "
                 f"!object.spec.schedulingGates.exists(g, g.name == '{SCHEDULING_GATE}')")

#: Where the policy writes the skip rules: the place policy in its JSONPatch expression
#: (:func:`rules.admit.admissionpolicy.place_patch_mutation`), the gate-only policy as its
#: ``matchConditions``.
SKIP_RULE_USE = "policy.jsonPatch (place) or policy.matchConditions (gate only)"

#: The pod-level skip rules of :func:`webhook.gating.should_gate`, in its order, and the
#: policy's (:data:`SKIP_RULE_USE`).
POLICY_MATCH_CONDITIONS: tuple[Predicate, ...] = (
    Predicate("not-bound", "spec.nodeName is unset or empty", not_bound,
              _text(CEL_NOT_BOUND), SKIP_RULE_USE, REASON_NODE_NAME_SET),
    Predicate("not-daemonset", "no controlling ownerReference of kind DaemonSet",
              not_daemonset, _text(CEL_NOT_DAEMONSET), SKIP_RULE_USE,
              REASON_DAEMONSET),
    Predicate("not-gated", "our scheduling gate is not in spec.schedulingGates", not_gated,
              _text(CEL_NOT_GATED), SKIP_RULE_USE, REASON_ALREADY_GATED),
)

_SKIP_CHECKS = tuple((p.python, p.skip_reason) for p in POLICY_MATCH_CONDITIONS)


def gate_skip_reason(pod: Mapping[str, Any], *, namespace: str, own_namespace: str,
                     config: PlacementConfig | None) -> str | None:
    """Why the webhook does not gate ``pod``, first match wins: no config
    (:data:`REASON_NO_CONFIG`), its namespace
    (:func:`rules.scope.namespace_skip_reason`), then the first of
    :data:`POLICY_MATCH_CONDITIONS` that does not hold (its ``skip_reason``); None: gate it.
    (Plain arguments, not :class:`Inputs`: this runs on every admission.)"""
    if config is None:
        return REASON_NO_CONFIG
    reason = namespace_skip_reason(namespace, own_namespace)
    if reason is not None:
        return reason
    for holds, skip_reason in _SKIP_CHECKS:
        if not holds(pod, _POD_ONLY):
            return skip_reason
    return None


def should_gate(pod: Mapping[str, Any], inputs: Inputs) -> bool:
    """The webhook gates the pod (:func:`gate_skip_reason` is None)."""
    return gate_skip_reason(pod, namespace=inputs.namespace, own_namespace=inputs.own_namespace,
                            config=inputs.config) is None


# --- the policy's place branch: which pods it places at once --------------------------------


def images(pod: Mapping[str, Any], inputs: Inputs) -> list[str]:
    """The image references of initContainers, containers, then image volumes, as
    written (:func:`rules.place.placement.pod_images`)."""
    return [c.image for c in pod_images(pod)]


def repos(pod: Mapping[str, Any], inputs: Inputs) -> Mapping[str, Any]:
    """The params object's ``spec.repositories`` (repository → suffix → set code)."""
    return dict(catalog_maps(inputs.table)["repositories"])


def sets(pod: Mapping[str, Any], inputs: Inputs) -> Mapping[str, Any]:
    """The params object's ``spec.platformSets`` (set code → ``{"platforms": ...}``)."""
    return dict(catalog_maps(inputs.table)["platformSets"])


def refs(pod: Mapping[str, Any], inputs: Inputs) -> list[list[str]]:
    """Per image of :func:`images`, ``[image, suffix]``
    (:func:`rules.admit.imageparams.split_reference`: the repository is the rest)."""
    return [[i, split_reference(i)[1]] for i in images(pod, inputs)]


def codes(pod: Mapping[str, Any], inputs: Inputs) -> list[str]:
    """Per image of :func:`images`, its platform-set code in the params' catalog, ``""``
    when the catalog lacks it."""
    catalog = catalog_maps(inputs.table)["repositories"]
    out = []
    for image in images(pod, inputs):
        repo, suffix = split_reference(image)
        out.append(catalog.get(repo, {}).get(suffix, ""))
    return out


def fresh(pod: Mapping[str, Any], inputs: Inputs) -> Mapping[str, str]:
    """The params object's ``spec.fresh``."""
    return inputs.fresh


def known(pod: Mapping[str, Any], inputs: Inputs) -> bool:
    """The pod has an image, every image (its image volumes' too) is in ``table``, and
    every image a container pulls with ``imagePullPolicy: Always`` (an image volume with
    ``pullPolicy: Always``) is in ``fresh`` (:func:`rules.place.placement.unique_images`)."""
    wanted = unique_images(pod)
    return (bool(wanted) and all(i in inputs.table for i in wanted)
            and all(i in inputs.fresh for i, always in wanted.items() if always))


def free(pod: Mapping[str, Any], inputs: Inputs) -> bool:
    """No ``spec.affinity.nodeAffinity`` and no ``nodeSelector`` pin on
    ``kubernetes.io/arch`` or ``kubernetes.io/os``."""
    spec = _map(pod.get("spec"))
    return ("nodeAffinity" not in _map(spec.get("affinity"))
            and not {ARCH_LABEL, OS_LABEL} & set(_map(spec.get("nodeSelector"))))


def placed(pod: Mapping[str, Any], inputs: Inputs) -> bool:
    """The policy places the pod at once: :func:`known` and :func:`free`, the platforms
    common to its images (the ``table`` values) linux only or none, and none of them removed
    by the policy's ``allowedArchitectures`` (:func:`rules.policy.narrow`)."""
    if not known(pod, inputs) or not free(pod, inputs):
        return False
    common: set[tuple[str, str]] | None = None
    for image in unique_images(pod):
        pairs = set(value_pairs(inputs.table[image]) or ())
        common = pairs if common is None else common & pairs
    pairs_in_order = sorted(common or ())
    if any(os_name != PLACED_OS for os_name, _ in pairs_in_order):
        return False
    return not narrow(pairs_in_order, inputs.policy)[1]


#: ``.?``/``orValue``: a field a pod may lack never raises (an error would admit the pod
#: unchanged: failurePolicy Ignore).
#: Image volumes (KEP-4639) come after the containers, as in
#: :func:`rules.place.placement.pod_images`: a volume without ``image`` is no image volume.
_CEL_VOLUMES = f"object.spec.?{VOLUMES}.orValue([]).filter(v, v.?{IMAGE_VOLUME}.hasValue())"
CEL_IMAGES = " + ".join(
    [f"object.spec.?{kind}.orValue([]).map(c, c.?image.orValue(''))" for kind in CONTAINER_LISTS]
    + [f"{_CEL_VOLUMES}.map(v, v.{IMAGE_VOLUME}.?{IMAGE_VOLUME_REFERENCE}.orValue(''))"])
#: The ``null`` guard is defensive: v1.36.2 skips the policy when the object is missing.
CEL_REPOS = "params == null ? {} : params.?spec.?repositories.orValue({})"
CEL_SETS = "params == null ? {} : params.?spec.?platformSets.orValue({})"
#: ``refs``: per image ``[image, suffix]``, the cut of
#: :func:`rules.admit.imageparams.split_reference` computed once per image. (The suffix
#: by ``substring(start)`` and the repository below by ``substring(0, end)`` with ``end``
#: short of the string's end: the offline CEL runtime of the tests, cel-expr-python 0.1.3,
#: errs on ``s.substring(a, size(s))`` for ``a < size(s)``; kube-apiserver does not. The
#: ``dyn()``: kube-apiserver v1.36.2 types ``i`` as ``dyn`` and refuses a list literal of
#: ``dyn`` and ``string``.)
CEL_REFS = f"variables.images.map(i, [i, dyn(i.substring({cel_split_cut('i')}))])"
#: ``codes``: per image its set code, ``''`` when the catalog lacks it: two map lookups,
#: never an iteration over the catalog's entries.
CEL_CODES = ("variables.refs.map(r, variables.repos[?(size(r[1]) == 0 ? r[0] : "
             "r[0].substring(0, size(r[0]) - size(r[1])))][?r[1]].orValue(''))")
CEL_FRESH = "params == null ? {} : params.?spec.?fresh.orValue({})"
#: An Always tag's digest is checked by the webhook and the controller on every pod; the
#: policy takes the controller's check of the last few seconds (``fresh``) instead, or gates
#: the pod.
CEL_KNOWN = (
    "size(variables.codes) > 0 && variables.codes.all(c, c in variables.sets)"
    + "".join(f" && !object.spec.?{kind}.orValue([]).exists("
              f"c, c.?imagePullPolicy.orValue('') == {cel_string(PULL_ALWAYS)}"
              " && !(c.?image.orValue('') in variables.fresh))"
              for kind in CONTAINER_LISTS)
    + f" && !{_CEL_VOLUMES}.exists("
    f"v, v.{IMAGE_VOLUME}.?{IMAGE_VOLUME_PULL_POLICY}.orValue('') == {cel_string(PULL_ALWAYS)}"
    f" && !(v.{IMAGE_VOLUME}.?{IMAGE_VOLUME_REFERENCE}.orValue('') in variables.fresh))"
)
#: Existing terms take the gate branch (the append-to-every-term rule of KEP-3838 is the
#: controller's); so does an os/arch pin (the controller then adds no requirement on that
#: key and warns).
CEL_FREE = "!object.spec.?affinity.?nodeAffinity.hasValue()" + "".join(
    f" && !({cel_string(key)} in object.spec.?nodeSelector.orValue({{}}))"
    for key in (ARCH_LABEL, OS_LABEL))
#: ``linuxOnly`` and ``allowedOk`` are :mod:`rules.admit.admissionpolicy`'s variables (the
#: intersection's pairs all linux, and the policy's limit, checked offline against the
#: Python rule too).
CEL_PLACED = "variables.known && variables.free && variables.linuxOnly && variables.allowedOk"

#: The policy's variables of this table, by name (:func:`rules.admit.admissionpolicy.
#: place_variables` puts them in its evaluation order).
POLICY_VARIABLES: tuple[Predicate, ...] = (
    Predicate("images", "the image references of initContainers, containers, then image "
              "volumes",
              images, _text(CEL_IMAGES), "policy.variables"),
    Predicate("repos", "the params object's spec.repositories (repository → suffix → "
              "set code)", repos, _text(CEL_REPOS), "policy.variables"),
    Predicate("sets", "the params object's spec.platformSets (set code → platforms)",
              sets, _text(CEL_SETS), "policy.variables"),
    Predicate("refs", "per image [image, suffix]: the split of the reference",
              refs, _text(CEL_REFS), "policy.variables"),
    Predicate("codes", "per image its set code in the catalog, '' when absent",
              codes, _text(CEL_CODES), "policy.variables"),
    Predicate("fresh", "the params object's spec.fresh (Always tags with a fresh digest)",
              fresh, _text(CEL_FRESH), "policy.variables"),
    Predicate("known", "every image is in the table and every Always image is fresh",
              known, _text(CEL_KNOWN), "policy.variables"),
    Predicate("free", "no nodeAffinity and no kubernetes.io/arch or os nodeSelector pin",
              free, _text(CEL_FREE), "policy.variables"),
    Predicate("placed", "known, free, the common platforms linux only or none, and none "
              "removed by the policy's allowedArchitectures", placed, _text(CEL_PLACED),
              "policy.variables"),
)


def _cel_should_gate(inputs: Inputs) -> str:
    return " && ".join(f"({p.cel(inputs)})" for p in POLICY_MATCH_CONDITIONS)


#: Every predicate, the policy's first, then the webhook's verdict (its CEL is the
#: conjunction of the policy's skip rules: the
#: namespace rules are the binding's selector, see the module docstring).
PREDICATES: tuple[Predicate, ...] = (
    *POLICY_MATCH_CONDITIONS,
    *POLICY_VARIABLES,
    Predicate("should-gate", "the webhook gates the pod (a config, not a skipped namespace, "
              "and every skip rule of the policy holds)", should_gate, _cel_should_gate,
              "webhook.should_gate"),
)

_BY_NAME = {p.name: p for p in PREDICATES}


def by_name(name: str) -> Predicate:
    """The entry of :data:`PREDICATES` called ``name``.

    Raises:
        KeyError: no such entry.
    """
    return _BY_NAME[name]
