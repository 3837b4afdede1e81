"""The MutatingAdmissionPolicy that gates pods inside the API server, as pure data.

With a MutatingWebhookConfiguration alone, a webhook that is down or slow lets pods through
ungated (``failurePolicy: Ignore``): they are scheduled with no placement at all, possibly on a
node their images can't run. A MutatingAdmissionPolicy (``admissionregistration.k8s.io/v1``,
GA in Kubernetes 1.36, KEP-3962) is evaluated by the API server itself, before the mutating
webhooks, so the gate no longer depends on a reachable webhook. The webhook then sees the pod
already gated and leaves it to the controller.

:func:`desired_policy` and :func:`desired_binding` build the policy ``podplacement-gate`` and
its binding from the PodPlacementConfig; :func:`policy_drifted` tells whether a live object
differs in a field we own. No I/O here: :mod:`controller.lifecycle` reads and writes them,
and only while the API server serves ``mutatingadmissionpolicies`` in
``admissionregistration.k8s.io/v1`` and ``spec.admission.mechanism`` is ``Auto``.

The skip rules are the webhook's (:func:`webhook.gating.should_gate`; the pod-level ones,
the eligibility variables ``images`` to ``free`` and ``placed``, and their Python are the
table :data:`rules.admit.predicates.PREDICATES`): the binding's
``matchResources.namespaceSelector`` is the webhook's namespace selection (system namespaces,
own namespace, the opt-out label and the config's selector). A pod with ``spec.nodeName``
set, or one whose controlling owner is a DaemonSet, is left unchanged, and one already
carrying our gate only gets the gate label: the place policy writes these rules into its
JSONPatch (:func:`place_patch_mutation`, cheaper than ``matchConditions``), the gate-only
policy as ``matchConditions``.

For each other pod the policy does one of two things (docs/how-it-decides.md, "Placement
inside the API server"):

- **place**: every image (init, app and image volume: :func:`rules.place.placement.pod_images`) is
  in the params object's catalog (the ImagePlatformCatalog ``cluster``: image reference →
  sorted "os/arch" pairs, found by two map lookups: :mod:`rules.admit.imageparams`), each
  one pulled with ``imagePullPolicy: Always`` (an image volume's ``pullPolicy: Always``) is
  in its ``spec.fresh`` (its digest confirmed by the controller within
  ``spec.admission.pullAlwaysFreshness``), the pod has no
  ``spec.affinity.nodeAffinity``, its ``nodeSelector`` pins neither ``kubernetes.io/arch``
  nor ``kubernetes.io/os``, and the intersection of the images' pairs is empty or linux only
  (a pod whose images all have one platform set reads that set's pairs, architectures and
  decision texts from the params: :func:`rules.admit.imageparams.platform_set`).
  A JSONPatch mutation then writes exactly the facts :func:`rules.place.placement.
  placement_facts` decides for the pod once gated, rendered in CEL (every text imported
  from the Python rule): one required term ``kubernetes.io/arch In [archs]`` AND
  ``kubernetes.io/os In [linux]`` (or the unsatisfiable marker), the preferred weights of
  ``nodeAffinityScoring``, the tolerations of the architecture taints published in the
  params' ``spec.architectureTaints`` for the pod's architectures (:mod:`rules.tolerations`),
  the labels ``scheduling-gate=removed`` and ``node-affinity=set``
  and the decision annotation with ``"path":"admission"``. JSONPatch, because an
  ApplyConfiguration cannot write ``nodeAffinity`` (an atomic struct).
  A PodPlacementPolicy of the pod's namespace (published in the params as ``spec.policies``,
  :func:`rules.policy.params_policies`) is matched in CEL against the pod's labels: the
  highest-priority match's weights replace the config's, its name goes into the decision
  annotation and the label ``podplacement.io/policy``, and a pod whose supported
  architectures the policy's ``allowedArchitectures`` would narrow takes the gate branch (the
  webhook or the controller then place it with the Warning naming what was removed).
- **gate**: otherwise the same JSONPatch appends our gate to ``schedulingGates`` (other
  gates are kept) and sets the label ``podplacement.io/scheduling-gate=gated``.

One JSONPatch mutation does both: an ApplyConfiguration (even an empty ``Object{}``) runs
the structured merge on every pod (bench/cluster.py --scenario warm: 0.84x of bare speed
with it, 0.87x without). With ``spec.admission.fastPaths: Disabled`` or NUMA placement on,
the policy has no place branch, but it keeps its ``paramKind`` and the binding its
``paramRef``: the params object is the policy's dead-man switch in every variant.

Nothing here outlives the product: the params object lives in the product's namespace
(deleted with it, or with the CRD, or by the last controller to stop), and while it is
missing the API server skips the policy; the policy and the binding are owned by the
product's Namespace (:func:`rules.ownership.namespace_owner`), so the garbage
collector deletes them once the namespace is gone.

Facts of kube-apiserver v1.36.2 this module relies on (tests/controller/
test_admissionpolicy_place_realcluster.py):

- typed ``Object.spec...`` constructors compile only in mutation expressions, not in
  ``variables``; the node affinity is therefore built inline in the JSONPatch expression;
- the policy runs on ``?dryRun=All`` creates;
- ``parameterNotFoundAction: Allow`` does **not** evaluate the policy with ``params == null``:
  a missing params object (or an unknown ``paramKind``) skips the policy, and the pod is
  admitted with neither gate nor placement. The params object must therefore exist whenever
  the place policy is bound (:func:`params_object`, created before the binding);
- creating or updating a policy with ``paramKind`` needs ``get`` on all objects of that kind
  (422 otherwise; RBAC ``resourceNames`` do not satisfy it), and a binding's ``paramRef``
  needs ``get`` on the named object (on every resource when the policy has no
  ``paramKind``); a ``paramRef`` on a binding of a policy without ``paramKind`` is ignored;
- with a catalog at its byte bound (~100-character references) and pods of 10 to 200 images
  the policy is accepted and evaluates within the CEL cost limits (no fail-open);
- a list of strings read from the params (a platform set's ``archs``) converts as a value
  inside a typed ``Object{}`` of a JSONPatch (the required term's ``values``).

``failurePolicy: Ignore``: a CEL error admits the pod unchanged (the product never denies a
pod). Escape hatch, one line: ``kubectl delete mutatingadmissionpolicybinding
podplacement-gate`` (the controller re-creates it within its resync unless the config says
``mechanism: Webhook``). Rule sources: KEP-3962 (MutatingAdmissionPolicy), KEP-3838
(a gated pod's affinity may only be narrowed, which is why pods with terms are gated).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from podplacement.rules.admit.imageparams import SET_HEAD_FIELDS, SET_TAIL_FIELDS
from podplacement.rules.admit.predicates import (
    PLACED_OS,
    POLICY_MATCH_CONDITIONS,
    POLICY_VARIABLES,
    by_name,
    cel_string,
)
from podplacement.rules.admit.webhookconfig import WebhookNamespaceSelection
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    API_VERSION,
    DECISION_ANNOTATION,
    FAST_PATHS_ENABLED,
    GATE_LABEL,
    GATE_LABEL_GATED,
    PARAMS_KIND,
    PARAMS_NAME,
    POLICY_LABEL,
    RECORD_CATALOG,
    SCHEDULING_GATE,
    PlacementConfig,
    config_or_defaults,
)
from podplacement.rules.place.affinity import (
    AFFINITY_PATH,
    NODE_AFFINITY_PATH,
    arch_preference,
    group_expressions,
    unsatisfiable_marker,
)
from podplacement.rules.place.placement import (
    LIST_SEPARATOR,
    REASON_NO_SUPPORTED_PLATFORM,
    REASON_REQUIRED_ARCHITECTURES,
    RECORD_ARCHS,
    RECORD_FIELDS,
    RECORD_OSES,
    RECORD_PATH,
    RECORD_PLATFORMS,
    RECORD_POLICY,
    RECORD_REASON,
    RECORD_RESULT,
    RECORD_TOLERATIONS,
    Outcome,
    Placement,
    placed_labels,
)
from podplacement.rules.tolerations import ARCH_TAINT_KEY, ArchTaint, toleration_of

GROUP_VERSION = "admissionregistration.k8s.io/v1"
POLICY_KIND = "MutatingAdmissionPolicy"
BINDING_KIND = "MutatingAdmissionPolicyBinding"
POLICY_RESOURCE = "mutatingadmissionpolicies"
BINDING_RESOURCE = "mutatingadmissionpolicybindings"

#: The ``path`` of the decision annotation written by the policy (the controller writes none).
ADMISSION_PATH = "admission"

#: CEL match conditions of the gate-only policy: the pod-level skip rules of
#: ``webhook.gating.should_gate`` (:data:`rules.admit.predicates.POLICY_MATCH_CONDITIONS`).
#: The place policy has none: it writes the same rules into its JSONPatch
#: (:func:`place_patch_mutation`).
MATCH_CONDITIONS: tuple[dict[str, str], ...] = tuple(
    {"name": p.name, "expression": p.cel()} for p in POLICY_MATCH_CONDITIONS)

#: An empty list of JSONPatch: what the place policy writes into a pod the skip rules leave
#: alone (a bare ``[]`` is ``list(dyn)``; a ``filter`` keeps the element type).
NO_PATCH = "[JSONPatch{op: 'test', path: '/kind', value: 'Pod'}].filter(p, false)"

#: The ApplyConfiguration adding our gate and label (other gates and labels are kept).
GATE_MUTATION = (
    f'Object{{metadata: Object.metadata{{labels: {{"{GATE_LABEL}": "{GATE_LABEL_GATED}"}}}}, '
    f'spec: Object.spec{{schedulingGates: [Object.spec.schedulingGates{{name: '
    f'"{SCHEDULING_GATE}"}}]}}}}'
)


# --- the place branch, in CEL: the third renderer of the placement facts -----------------
#
# The policy's ``variables`` compute, in CEL, the facts :func:`rules.place.placement.
# placement_facts` computes for the pods the policy places (every image in the params, no
# node affinity, no os/arch pin, linux-only or no common platform); the JSONPatch writes
# them as :func:`rules.place.render.controller_patch` would. Every text (label keys and
# values, annotation fields, outcomes, reasons, expression keys and operators) comes from
# the Python rule, and the typed node affinity is rendered from the values the Python
# builders return (:func:`cel_typed` with :class:`Cel` holes). Variables are listed by
# :func:`place_variables` in order (a variable reads only the ones before it); they are
# evaluated lazily and ``&&`` short-circuits on false, so the pieces that index the params
# are only evaluated for a pod whose images are all in the params. The plain variables are
# checked offline against the Python rule (tests/controller/test_admissionpolicy_cel.py);
# the typed ``Object{}`` parts only by the API server
# (tests/controller/test_admissionpolicy_place_realcluster.py).


class Cel(str):
    """A CEL expression standing for a value in a Python structure that :func:`cel_typed`
    renders: written verbatim (a string, int or object of the right type in CEL)."""


class CelList(Cel):
    """A CEL expression standing for a whole list: ``[CelList(e)]`` renders as ``e``."""


def cel_typed(type_name: str, value: Any) -> str:
    """``value`` (JSON-like: dicts, lists, strings, ints, :class:`Cel` holes) as a CEL
    literal; dicts become typed objects ``<type_name>{field: ...}`` whose fields are typed
    ``<type_name>.<field>`` and list elements take the list field's type (KEP-3962:
    ``Object.<field path>{...}``, which the API server converts back to JSON for a
    JSONPatch ``value``). A key starting with ``?`` is an optional field (its value a CEL
    optional)."""
    if isinstance(value, Cel):
        return str(value)
    if isinstance(value, Mapping):
        fields = []
        for key, item in value.items():
            field_type = f"{type_name}.{str(key).removeprefix('?')}"
            fields.append(f"{key}: {cel_typed(field_type, item)}")
        return f"{type_name}{{{', '.join(fields)}}}"
    if isinstance(value, list | tuple):
        if len(value) == 1 and isinstance(value[0], CelList):
            return str(value[0])
        return "[" + ", ".join(cel_typed(type_name, v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return cel_string(value)
    raise TypeError(f"no CEL literal for {type(value).__name__}")


def _json_text(text: str) -> str:
    """``text`` as it stands inside a JSON string; the policy concatenates JSON, so a text
    that JSON would escape is refused (the reasons and names are plain ASCII)."""
    if json.dumps(text)[1:-1] != text:
        raise ValueError(f"{text!r} needs escaping inside JSON")
    return text


def cel_template(template: str, values: str) -> str:
    """A ``REASON_*`` template of :mod:`rules.place.placement` in CEL: its ``{}`` replaced
    by the CEL string expression ``values``."""
    before, _, after = template.partition("{}")
    parts = [cel_string(_json_text(before)) if before else "", values,
             cel_string(_json_text(after)) if after else ""]
    return "(" + " + ".join(p for p in parts if p) + ")"


#: The typed ``spec.affinity`` of the pod schema.
_T_AFFINITY = "Object.spec.affinity"
_T_NODE_AFFINITY = _T_AFFINITY + ".nodeAffinity"
_T_GATE = "Object.spec.schedulingGates"
_ANY_PAIRS = "size(variables.pairs) > 0"

# The per-set facts (``spec.platformSets``: :func:`rules.admit.imageparams.platform_set`):
# a pod whose images all have one platform set (``single``: a pod of one image, most pods)
# reads its pairs, architectures, linux flag and decision texts from the params instead of
# computing them; the other pods take the general path (split, intersect, join).

#: ``single``: every image has the same platform set (only read once ``known`` holds).
CEL_SINGLE = "variables.codes.all(c, c == variables.codes[0])"
#: ``first``: the first image's platform set (``{platforms, pairs, archs, linux[, head,
#: tail]}``).
CEL_FIRST = "variables.sets[variables.codes[0]]"
#: ``lists``: the "os/arch" pairs of each image (only read on the general path).
CEL_LISTS = "variables.codes.map(c, variables.sets[c].pairs)"

#: ``pairs``: the intersection over images (``rules.platforms.supported_platforms``),
#: in the first image's order: the params values are sorted, so the result is sorted too.
#: A pod of one platform set takes its pairs as they are, without the filter.
CEL_PAIRS = ("variables.single ? variables.first.pairs : "
             "variables.lists[0].filter(p, variables.lists.all(l, p in l))")

#: ``archs``: the supported architectures, sorted (when the pairs are all linux, which is
#: when the policy places).
CEL_ARCHS = ("variables.single ? variables.first.archs : "
             "variables.pairs.map(p, p.split('/')[1])")
#: ``linuxOnly``: the supported pairs are linux ones (or none).
CEL_LINUX_ONLY = ("variables.single ? variables.first.linux : "
                  f"variables.pairs.all(p, p.startsWith({cel_string(PLACED_OS + '/')}))")


def _weights_literal(weights: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{cel_string(a)}: {int(w)}" for a, w in sorted(weights.items())) + "}"


# --- the namespace's placement policy, in CEL (rules.policy) ------------------------
#
# The params object carries the accepted PodPlacementPolicies of each namespace, highest
# priority first (``spec.policies``: :func:`rules.policy.params_policies`); a policy's
# ``selector`` is a list of requirements (``matchLabels`` entries are ``In`` with one value).
# ``matched`` keeps the pod namespace's policies whose selector the pod's labels satisfy, in
# that order: its first entry is the one :func:`rules.policy.policy_for` picks.

#: ``policies``: the accepted policies of the pod's namespace (``request.namespace``: the
#: object of a create may not carry its namespace yet).
CEL_POLICIES = ("params == null ? [] : "
                "params.?spec.?policies.orValue({})[?request.namespace].orValue([])")
#: ``labels``: the pod's labels.
CEL_LABELS = "object.metadata.?labels.orValue({})"
_HAS = "r.key in variables.labels"
_IN = f"({_HAS} && variables.labels[r.key] in r.values)"
#: Per operator of :data:`rules.policy.OPERATORS`, the CEL of one requirement ``r``
#: holding for ``variables.labels`` (metav1.LabelSelector semantics, as
#: :func:`rules.policy.selector_matches`).
CEL_REQUIREMENT = {"In": _IN, "NotIn": f"!{_IN}", "Exists": _HAS, "DoesNotExist": f"!({_HAS})"}


def _cel_requirement() -> str:
    """One requirement ``r`` of a published selector, as a chain of conditionals over
    :data:`CEL_REQUIREMENT` (the last operator is the ``else``)."""
    ops = list(CEL_REQUIREMENT.items())
    text = ops[-1][1]
    for op, cond in reversed(ops[:-1]):
        text = f"(r.operator == {cel_string(op)} ? {cond} : {text})"
    return text


#: ``matched``: the namespace's policies whose selector matches the pod, highest priority
#: first (an empty selector matches every pod).
CEL_MATCHED = f"variables.policies.filter(p, p.?selector.orValue([]).all(r, {_cel_requirement()}))"
#: ``hasPolicy``: a policy applies to the pod (``matched[0]``).
CEL_HAS_POLICY = "size(variables.matched) > 0"
#: ``allowedOk``: the policy's ``allowedArchitectures`` remove none of the supported pairs.
#: When they do, the pod takes the gate branch: the webhook or the controller then places
#: it with the Warning that names the pairs removed (a policy cannot warn).
CEL_ALLOWED_OK = ("!variables.hasPolicy || !has(variables.matched[0].allowed) || "
                  "variables.archs.all(a, a in variables.matched[0].allowed)")


def cel_weights(weights: Mapping[str, int]) -> str:
    """``weights``: the matched policy's architecture weights when it sets them, else the
    cluster's (``weights``, CEL literals: the policy is regenerated from the config
    whenever it changes; :meth:`rules.policy.PlacementPolicy.applied_to`)."""
    return ("variables.hasPolicy && has(variables.matched[0].weights) ? "
            f"variables.matched[0].weights : {_weights_literal(weights)}")


#: ``preferredArchs``: the supported architectures with a weight, in ``archs`` order
#: (``affinity.arch_preferences``; the pod has no node affinity here, so no preference of
#: its own).
CEL_PREFERRED_ARCHS = "variables.archs.filter(a, a in variables.weights)"


def _json_strings(list_expr: str) -> str:
    """A CEL list of strings as the text of a JSON array (values match the CRD's
    ``[a-z0-9_.-/]`` pattern: nothing to escape)."""
    return f"(size({list_expr}) == 0 ? '[]' : '[\"' + {list_expr}.join('\",\"') + '\"]')"


def _json_string(string_expr: str) -> str:
    return f"'\"' + {string_expr} + '\"'"


# --- the tolerations of architecture taints, in CEL (rules.tolerations) -------------------
#
# The params carry the architecture taints to tolerate (``spec.architectureTaints``: the
# Nodes' and the configured ones, sorted, published by the controller; empty when the
# config's ``tolerate`` is Disabled). ``addTolerations`` keeps those whose value is one of the
# placed pod's ``archs`` and that none of the pod's own tolerations tolerates
# (:func:`rules.tolerations.tolerates`, Kubernetes' ``ToleratesTaint``), in the params'
# order: :func:`rules.tolerations.arch_tolerations`.

#: ``archTaints``: the published architecture taints (``{value, effect}`` items).
CEL_ARCH_TAINTS = ("params == null ? [] : "
                   "params.?spec.?architectureTaints.orValue([])")
#: ``ownTolerations``: the pod's own tolerations.
CEL_OWN_TOLERATIONS = "object.spec.?tolerations.orValue([])"
#: The pod's toleration ``o`` tolerates the taint ``kubernetes.io/arch=t.value:t.effect``.
CEL_TOLERATES = (
    "(o.?effect.orValue('') == '' || o.?effect.orValue('') == t.effect) && "
    f"(o.?key.orValue('') == '' || o.?key.orValue('') == {cel_string(ARCH_TAINT_KEY)}) && "
    "(o.?operator.orValue('') == 'Exists' || "
    "(o.?operator.orValue('') in ['', 'Equal'] && o.?value.orValue('') == t.value))")
#: ``addTolerations``: the taints whose tolerations the placed pod gets.
CEL_ADD_TOLERATIONS = ("variables.archTaints.filter(t, t.value in variables.archs && "
                       f"!variables.ownTolerations.exists(o, {CEL_TOLERATES}))")
#: The decision's ``tolerations`` entries (:func:`rules.place.placement.toleration_text`).
CEL_TOLERATION_TEXTS = (f"variables.addTolerations.map(t, {cel_string(ARCH_TAINT_KEY + '=')}"
                        " + t.value + ':' + t.effect)")
_ANY_TOLERATIONS = "size(variables.addTolerations) > 0"


def toleration_ops() -> str:
    """The JSONPatch ops appending the ``addTolerations`` (``podpatch.toleration_ops``):
    each as ``add /spec/tolerations/-``, after an ``add /spec/tolerations []`` when the pod
    has no list (an empty list first, then typed items appended: see :func:`gate_ops`)."""
    item = cel_typed("Object.spec.tolerations", {
        **toleration_of(ArchTaint("v", "e")), "value": Cel("t.value"), "effect": Cel("t.effect")})
    return (f"(!({_ANY_TOLERATIONS}) ? [] : "
            "(has(object.spec.tolerations) ? [] : ["
            + _add(cel_string("/spec/tolerations"), "[]") + "]) + "
            f"variables.addTolerations.map(t, {_add(cel_string('/spec/tolerations/-'), item)}))")


#: The params object's ``metadata.uid`` (the catalog's identity in the decision annotation,
#: :func:`rules.config.admission_mark`; the server sets it, a uid needs no escape).
CEL_CATALOG = "params.?metadata.?uid.orValue('')"

#: The annotation's fields the policy writes, as CEL giving each field's JSON text, and the
#: condition under which the field is written (None: always). The per-image entries
#: (digests) are the controller's alone.
_RECORD: dict[str, tuple[str, str | None]] = {
    RECORD_PATH: (cel_string(json.dumps(ADMISSION_PATH)), None),
    RECORD_CATALOG: (_json_string(CEL_CATALOG), None),
    RECORD_POLICY: (_json_string("variables.matched[0].name"), "variables.hasPolicy"),
    RECORD_PLATFORMS: (_json_strings("variables.pairs"), None),
    RECORD_OSES: (cel_string(json.dumps([PLACED_OS])), _ANY_PAIRS),
    RECORD_ARCHS: (_json_strings("variables.archs"), None),
    RECORD_TOLERATIONS: (_json_strings(CEL_TOLERATION_TEXTS), _ANY_TOLERATIONS),
    RECORD_RESULT: (_json_string(f"({_ANY_PAIRS} ? {cel_string(Outcome.SET)} : "
                                 f"{cel_string(Outcome.NO_SUPPORTED_PLATFORM)})"), None),
    RECORD_REASON: (_json_string(
        f"({_ANY_PAIRS} ? "
        + cel_template(REASON_REQUIRED_ARCHITECTURES,
                       f"variables.archs.join({cel_string(LIST_SEPARATOR)})")
        + f" : {cel_string(_json_text(REASON_NO_SUPPORTED_PLATFORM))})"), None),
}
#: The annotation's fields the policy writes, in the order of the controller's record.
POLICY_RECORD_FIELDS = tuple(f for f in RECORD_FIELDS if f in _RECORD)


def _cel_record_parts(fields: Sequence[str]) -> list[str]:
    """The CEL of each of ``fields`` (a run of :data:`POLICY_RECORD_FIELDS`) as JSON text,
    each but the record's first with its leading comma."""
    parts = []
    for name in fields:
        value, condition = _RECORD[name]
        first = name == POLICY_RECORD_FIELDS[0]
        if first and condition is not None:
            raise ValueError("the first field of the policy's decision must always be written")
        key = cel_string(("{" if first else ",") + json.dumps(name) + ":")
        parts.append(f"{key} + {value}" if condition is None
                     else f"({condition} ? {key} + {value} : '')")
    return parts


def _cel_record() -> str:
    """``decision``: the compact JSON of :data:`POLICY_RECORD_FIELDS`, in order (the first
    is always written, so every later one starts with its comma). A pod of one platform set
    (``single``) takes the set's fields from its precomputed ``head`` and ``tail``
    (:func:`rules.admit.imageparams.platform_set`: the same text, written once per set);
    the others build every field."""
    fields = list(POLICY_RECORD_FIELDS)
    general = " + ".join([*_cel_record_parts(fields), "'}'"])
    head, tail = fields.index(SET_HEAD_FIELDS[0]), fields.index(SET_TAIL_FIELDS[0])
    if (tuple(fields[head:head + len(SET_HEAD_FIELDS)]) != SET_HEAD_FIELDS
            or tuple(fields[tail:tail + len(SET_TAIL_FIELDS)]) != SET_TAIL_FIELDS
            or tail < head + len(SET_HEAD_FIELDS)):
        raise ValueError("the platform set's decision fields are not runs of the record's")
    single = " + ".join([
        *_cel_record_parts(fields[:head]), "variables.first.head",
        *_cel_record_parts(fields[head + len(SET_HEAD_FIELDS):tail]), "variables.first.tail",
        *_cel_record_parts(fields[tail + len(SET_TAIL_FIELDS):]), "'}'"])
    return _fold_literals(f"variables.single ? {single} : {general}")


_ADJACENT_LITERALS = re.compile(r"'([^'\\]*)' \+ '([^'\\]*)'")


def _fold_literals(cel: str) -> str:
    """``cel`` with each ``'a' + 'b'`` of plain single-quoted literals written ``'ab'`` (the
    API server concatenates them on every evaluation otherwise); concatenation is
    associative and binds tighter than any other operator the record uses, so the value
    is the same (the offline checks compare it byte for byte)."""
    while True:
        folded = _ADJACENT_LITERALS.sub(lambda m: f"'{m.group(1)}{m.group(2)}'", cel)
        if folded == cel:
            return cel
        cel = folded


#: ``decision``: the compact JSON of the ``podplacement.io/decision`` annotation with the
#: facts the controller records (:func:`admission_record`) and ``"path":"admission"``.
CEL_DECISION = _cel_record()


def admission_record(placement: Placement, catalog_uid: str = "") -> dict[str, Any]:
    """The decision annotation the policy writes for a pod it places, from the Python
    facts of the same pod (:func:`rules.place.placement.placement_facts`): ``"path":
    "admission"``, ``"catalog"``: the params object's uid ``catalog_uid``, and the facts'
    :data:`POLICY_RECORD_FIELDS`. What ``variables.decision`` must equal, byte for byte,
    once compact (:func:`rules.place.placement.compact_json`); it starts with
    :func:`rules.config.admission_mark` of ``catalog_uid``."""
    record = {RECORD_PATH: ADMISSION_PATH, RECORD_CATALOG: catalog_uid, **placement.record}
    return {k: record[k] for k in POLICY_RECORD_FIELDS if k in record}


def _requirements() -> Cel:
    """The required expressions of the one new term a placed pod gets
    (``affinity.group_expressions`` of its archs and linux), or the unsatisfiable marker
    (``affinity.unsatisfiable_marker``) when no platform is common to all images."""
    term_type = (_T_NODE_AFFINITY + ".requiredDuringSchedulingIgnoredDuringExecution"
                 ".nodeSelectorTerms.matchExpressions")
    marker = cel_typed(term_type, [unsatisfiable_marker()])
    group = cel_typed(term_type, group_expressions([CelList("variables.archs")], [PLACED_OS]))
    return Cel(f"(size(variables.pairs) == 0 ? {marker} : {group})")


def cel_preferred() -> str:
    """One PreferredSchedulingTerm ``kubernetes.io/arch In [a]`` with its weight per
    ``variables.preferredArchs`` entry (``affinity.arch_preference``)."""
    weight = cast(int, Cel("variables.weights[a]"))  # an int in CEL
    term = arch_preference(Cel("a"), weight)
    term_type = _T_NODE_AFFINITY + ".preferredDuringSchedulingIgnoredDuringExecution"
    return f"variables.preferredArchs.map(a, {cel_typed(term_type, term)})"


def _node_affinity_value() -> dict[str, Any]:
    """The NodeAffinity of a placed pod, with :class:`Cel` holes: the required term of
    :func:`_requirements` and, when some supported architecture has a weight (the cluster's
    or the matched policy's), the preferred terms (the field is omitted when there are
    none, as the controller does)."""
    return {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": _requirements()}]},
            "?preferredDuringSchedulingIgnoredDuringExecution": Cel(
                "size(variables.preferredArchs) > 0 ? "
                f"optional.of({cel_preferred()}) : optional.none()")}


def cel_node_affinity() -> str:
    """The typed NodeAffinity of a placed pod (:func:`_node_affinity_value`)."""
    return cel_typed(_T_NODE_AFFINITY, _node_affinity_value())


def _add(path: str, value: str) -> str:
    return f"JSONPatch{{op: 'add', path: {path}, value: {value}}}"


def _map_ops(field: str, values: Mapping[str, str]) -> str:
    """The ``add`` ops of ``metadata.<field>`` entries, or of the whole map when the pod has
    none (``podpatch.map_ops``); keys with '/' are escaped with ``jsonpatch.escapeKey``. A
    value may be a :class:`Cel` expression."""
    whole = "{" + ", ".join(f"{cel_string(k)}: {cel_typed('', v)}"
                            for k, v in values.items()) + "}"
    each = [
        _add(f"{cel_string(f'/metadata/{field}/')} + jsonpatch.escapeKey({cel_string(k)})",
             cel_typed("", v))
        for k, v in values.items()
    ]
    return (f"(has(object.metadata.{field}) ? {_cel_list(each)} : "
            f"[{_add(cel_string(f'/metadata/{field}'), whole)}])")


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(items) + "]"


def gate_ops() -> str:
    """The JSONPatch ops of the gate branch: our gate appended to ``schedulingGates`` (the
    list created when absent; other gates kept) and the label ``scheduling-gate=gated``
    (``webhook.patch.gate_patch`` does the same)."""
    gate = f"{_T_GATE}{{name: {cel_string(SCHEDULING_GATE)}}}"
    # Never a list of typed objects as a JSONPatch value: kube-apiserver v1.36.2 panics
    # converting it (cel-go ConvertToNative, structpb.Struct into structpb.Value) and the
    # create fails. An empty list first, then the gate appended, converts fine.
    return (
        "(has(object.spec.schedulingGates) ? [] : ["
        + _add(cel_string("/spec/schedulingGates"), "[]") + "]) + ["
        + _add(cel_string("/spec/schedulingGates/-"), gate) + "] + "
        + _map_ops("labels", {GATE_LABEL: GATE_LABEL_GATED})
    )


def _skip_rule(name: str) -> str:
    """The CEL of the skip rule ``name`` of :data:`rules.admit.predicates.
    POLICY_MATCH_CONDITIONS`, parenthesized.

    Raises:
        KeyError: no such predicate (:func:`rules.admit.predicates.by_name`).
    """
    return f"({by_name(name).cel()})"


def place_patch_mutation() -> str:
    """The one JSONPatch expression of the place policy: nothing for a pod the skip rules of
    :data:`rules.admit.predicates.POLICY_MATCH_CONDITIONS` leave alone (bound, or owned by a
    DaemonSet); the label ``scheduling-gate=gated`` alone for a pod created with our gate
    (as the webhook's ``label_tail``: a creator's ``removed`` never hides it from the
    controller); for a placed pod the final placement (``nodeAffinity``, the labels of
    ``placement.placed_labels``, the decision annotation), else the gate (:func:`gate_ops`).

    The skip rules are written here, not as ``matchConditions``: kube-apiserver v1.36.2
    evaluates ``matchConditions`` on an activation of their own, a second conversion of the
    pod to its unstructured form on every create (bench/policycost.py ``fold``: about
    0.3 ms of plugin time per pod). A pod they skip still costs the JSONPatch round trip
    (the pod encoded and decoded, the patch empty). One JSONPatch and no
    ApplyConfiguration: an apply runs the structured merge on every pod, a cost the warm
    path cannot afford (bench/cluster.py). ``spec.affinity`` is created whole when absent,
    else only its ``nodeAffinity`` is added (a pod with e.g. podAntiAffinity keeps it), as
    ``affinity.restriction_ops`` does; label and annotation maps are created when absent.
    A pod placed under a namespace's policy also gets the label ``podplacement.io/policy``
    with the policy's name (``placement.placed_labels``)."""
    node_affinity = _node_affinity_value()
    policy_label = _add(
        f"{cel_string('/metadata/labels/')} + jsonpatch.escapeKey({cel_string(POLICY_LABEL)})",
        "variables.matched[0].name")
    return (
        f"!({_skip_rule('not-bound')} && {_skip_rule('not-daemonset')}) ? {NO_PATCH} : "
        f"!({_skip_rule('not-gated')}) ? "
        + _map_ops("labels", {GATE_LABEL: GATE_LABEL_GATED})
        + f" : !variables.placed ? {gate_ops()} : ["
        "has(object.spec.affinity) ? "
        + _add(cel_string(NODE_AFFINITY_PATH), cel_typed(_T_NODE_AFFINITY, node_affinity))
        + " : "
        + _add(cel_string(AFFINITY_PATH),
               cel_typed(_T_AFFINITY, {"nodeAffinity": node_affinity}))
        + "] + " + toleration_ops() + " + "
        + _map_ops("labels", placed_labels(affinity_set=True))
        + f" + (variables.hasPolicy ? [{policy_label}] : []) + "
        + _map_ops("annotations", {DECISION_ANNOTATION: Cel("variables.decision")})
    )


def place_variables(config: PlacementConfig) -> list[dict[str, str]]:
    """The policy's ``variables`` for the place branch, in evaluation order."""
    weights = {p.architecture: p.weight for p in config.preferred_platforms}
    table = {p.name: p.cel() for p in POLICY_VARIABLES}
    out = [
        *((n, table.pop(n)) for n in ("images", "repos", "sets", "refs", "codes", "fresh",
                                      "known", "free")),
        ("policies", CEL_POLICIES),
        ("labels", CEL_LABELS),
        ("matched", CEL_MATCHED),
        ("hasPolicy", CEL_HAS_POLICY),
        ("single", CEL_SINGLE),
        ("first", CEL_FIRST),
        ("lists", CEL_LISTS),
        ("pairs", CEL_PAIRS),
        ("archs", CEL_ARCHS),
        ("linuxOnly", CEL_LINUX_ONLY),
        ("allowedOk", CEL_ALLOWED_OK),
        ("placed", table.pop("placed")),
        ("weights", cel_weights(weights)),
        ("preferredArchs", CEL_PREFERRED_ARCHS),
        ("archTaints", CEL_ARCH_TAINTS),
        ("ownTolerations", CEL_OWN_TOLERATIONS),
        ("addTolerations", CEL_ADD_TOLERATIONS),
        ("decision", CEL_DECISION),
    ]
    if table:
        raise ValueError(f"predicates without a place in the policy: {sorted(table)}")
    return [{"name": n, "expression": e} for n, e in out]


def places(config: PlacementConfig) -> bool:
    """True when the policy has a place branch: ``spec.admission.fastPaths`` is
    ``Enabled`` and NUMA placement is off (NUMA candidates need the controller's view of
    the nodes)."""
    return config.admission_fast_paths == FAST_PATHS_ENABLED and not config.topology.enabled


def placement_config(config_obj: Mapping[str, Any] | None) -> PlacementConfig:
    """The parsed PodPlacementConfig, or the defaults when there is none or it does not
    parse (the controller decides with the defaults then, too)."""
    return config_or_defaults(config_obj)[0]


def _metadata(owner: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Our name and label, and ``owner`` (:func:`rules.ownership.namespace_owner`)."""
    meta: dict[str, Any] = {"name": ADMISSION_POLICY_NAME,
                            "labels": {"app.kubernetes.io/name": "podplacement"}}
    if owner:
        meta["ownerReferences"] = [dict(o) for o in owner]
    return meta


def desired_policy(config: PlacementConfig,
                   owner: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The MutatingAdmissionPolicy ``podplacement-gate`` (a plain dict, ready to POST).

    Args:
        config: the parsed PodPlacementConfig (:func:`placement_config`).
        owner: its ``ownerReferences`` (:func:`rules.ownership.namespace_owner`: the
            product's Namespace).

    Returns:
        ``{"apiVersion": "admissionregistration.k8s.io/v1", "kind":
        "MutatingAdmissionPolicy", "metadata": ..., "spec": ...}``: pods, CREATE only,
        ``reinvocationPolicy: Never``, ``failurePolicy: Ignore``, ``paramKind``
        ImagePlatformCatalog in every variant: the params object is the policy's dead-man
        switch (while it is missing the API server skips the policy, see the module
        docstring). With a place branch (:func:`places`): ``variables``
        :func:`place_variables`, then the one JSONPatch :func:`place_patch_mutation` (skip
        rules, place, else gate) and no ``matchConditions``; without: ``matchConditions``
        :data:`MATCH_CONDITIONS` and the one ApplyConfiguration :data:`GATE_MUTATION`.
    """
    spec: dict[str, Any] = {
        "paramKind": {"apiVersion": API_VERSION, "kind": PARAMS_KIND},
        "failurePolicy": "Ignore",
        "reinvocationPolicy": "Never",
        "matchConstraints": {
            "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                               "operations": ["CREATE"], "resources": ["pods"]}],
            "matchPolicy": "Equivalent",
        },
    }
    if places(config):
        spec["variables"] = place_variables(config)
        spec["mutations"] = [
            {"patchType": "JSONPatch", "jsonPatch": {"expression": place_patch_mutation()}},
        ]
    else:
        spec["matchConditions"] = [dict(c) for c in MATCH_CONDITIONS]
        spec["mutations"] = [{"patchType": "ApplyConfiguration",
                              "applyConfiguration": {"expression": GATE_MUTATION}}]
    return {"apiVersion": GROUP_VERSION, "kind": POLICY_KIND,
            "metadata": _metadata(owner), "spec": spec}


def desired_binding(selection: WebhookNamespaceSelection, *, params_namespace: str,
                    owner: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The MutatingAdmissionPolicyBinding ``podplacement-gate``: the policy applies in the
    namespaces the webhook is called for (``selection``, from
    :func:`rules.admit.webhookconfig.webhook_namespace_selection`).

    ``paramRef`` names the ImagePlatformCatalog ``cluster`` in ``params_namespace`` (the
    product's namespace) with ``parameterNotFoundAction: Allow``: while that object is
    missing, the API server skips the policy and admits pods with neither gate nor
    placement (the module docstring). That makes the object a dead-man switch: the
    namespace controller deletes it as soon as the product's namespace is being deleted,
    the CRD's deletion deletes it, and the last controller to stop deletes it
    (:mod:`controller.lifecycle`), so no pod is gated once nothing would release it. The API
    server authorizes a binding's ``paramRef`` as ``get`` on that object: apply the policy
    (which declares the ``paramKind``) first."""
    spec: dict[str, Any] = {
        "policyName": ADMISSION_POLICY_NAME,
        "paramRef": {"name": PARAMS_NAME, "namespace": params_namespace,
                     "parameterNotFoundAction": "Allow"},
        "matchResources": {"namespaceSelector": dict(selection.selector),
                           "objectSelector": {}, "matchPolicy": "Equivalent"},
    }
    return {"apiVersion": GROUP_VERSION, "kind": BINDING_KIND,
            "metadata": _metadata(owner), "spec": spec}


def params_object(namespace: str) -> dict[str, Any]:
    """An empty ImagePlatformCatalog ``cluster`` in ``namespace``
    (``spec.repositories: {}``), to create when absent before the policy is bound: while
    the object is missing, the API server skips the policy (``parameterNotFoundAction:
    Allow``) and admits pods with no gate at all. With it, every pod is gated until the
    controller publishes inspection results."""
    return {"apiVersion": API_VERSION, "kind": PARAMS_KIND,
            "metadata": {"name": PARAMS_NAME, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "podplacement"}},
            "spec": {"repositories": {}}}


def never_drifted(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Drift check of :func:`params_object` for a create-if-absent: the controller's params
    writer owns the content, so an existing object is never reverted."""
    return False


def policy_drifted(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """True when ``live`` (policy or binding) differs from ``desired`` in a ``spec`` field
    we set (fields the API server defaults and we do not set are ignored)."""
    return not _covers(live.get("spec") or {}, desired.get("spec") or {})


def _covers(live: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        return isinstance(live, Mapping) and all(_covers(live.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        return (isinstance(live, list) and len(live) == len(want)
                and all(_covers(a, b) for a, b in zip(live, want, strict=True)))
    return bool(live == want)
