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

The skip rules are the webhook's (:func:`webhook.gating.should_gate`): the binding's
``matchResources.namespaceSelector`` is the webhook's namespace selection (system namespaces,
own namespace, the opt-out label and the config's selector), and ``matchConditions`` exclude a
pod with ``spec.nodeName`` set, one whose controlling owner is a DaemonSet, and one already
carrying our gate.

For each other pod the policy does one of two things (issue 14 item 1):

- **place**: every image (init and app) is a key of the params object (the ImagePlatforms
  ``cluster``: image reference → sorted "os/arch" pairs) and none is pulled with
  ``imagePullPolicy: Always`` (the controller revalidates those), the pod has no
  ``spec.affinity.nodeAffinity``, its ``nodeSelector`` pins neither ``kubernetes.io/arch``
  nor ``kubernetes.io/os``, and the intersection of the images' pairs is empty or linux only.
  A JSONPatch mutation then writes exactly what :func:`controller.decision.decide` would
  write once the pod were gated: one required term ``kubernetes.io/arch In [archs]`` AND
  ``kubernetes.io/os In [linux]`` (or the unsatisfiable marker), the preferred weights of
  ``nodeAffinityScoring``, the labels ``scheduling-gate=removed`` and ``node-affinity=set``
  and the decision annotation with ``"path":"admission"``. JSONPatch, because an
  ApplyConfiguration cannot write ``nodeAffinity`` (an atomic struct).
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
product's Namespace (:func:`controller.ownership.namespace_owner`), so the garbage
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
- with 5,000 entries of ~100-character references and pods of 10 to 200 images the policy
  is accepted and evaluates within the CEL cost limits (no fail-open).

``failurePolicy: Ignore``: a CEL error admits the pod unchanged (the product never denies a
pod). Escape hatch, one line: ``kubectl delete mutatingadmissionpolicybinding
podplacement-gate`` (the controller re-creates it within its resync unless the config says
``mechanism: Webhook``). Rule sources: issue 14, KEP-3962 (MutatingAdmissionPolicy), KEP-3838
(a gated pod's affinity may only be narrowed, which is why pods with terms are gated).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from controller.config import (
    ADMISSION_POLICY_NAME,
    AFFINITY_LABEL,
    AFFINITY_LABEL_SET,
    API_VERSION,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    FAST_PATHS_ENABLED,
    GATE_LABEL,
    GATE_LABEL_GATED,
    GATE_LABEL_REMOVED,
    LINUX,
    NO_SUPPORTED_PLATFORM_KEY,
    OS_LABEL,
    PARAMS_KIND,
    PARAMS_NAME,
    SCHEDULING_GATE,
    ConfigError,
    PlacementConfig,
)
from controller.decision import NO_SUPPORTED_PLATFORM, SET
from controller.webhookconfig import WebhookNamespaceSelection

GROUP_VERSION = "admissionregistration.k8s.io/v1"
POLICY_KIND = "MutatingAdmissionPolicy"
BINDING_KIND = "MutatingAdmissionPolicyBinding"
POLICY_RESOURCE = "mutatingadmissionpolicies"
BINDING_RESOURCE = "mutatingadmissionpolicybindings"

#: The ``path`` of the decision annotation written by the policy (the controller writes none).
ADMISSION_PATH = "admission"
#: The only OS the place branch handles: a non-linux pair in the intersection means gate.
PLACED_OS = LINUX

#: CEL match conditions: the pod-level skip rules of ``webhook.gating.should_gate``.
MATCH_CONDITIONS: tuple[dict[str, str], ...] = (
    {"name": "not-bound",
     "expression": "!has(object.spec.nodeName) || object.spec.nodeName == ''"},
    {"name": "not-daemonset",
     "expression": "!has(object.metadata.ownerReferences) || "
                   "!object.metadata.ownerReferences.exists(r, "
                   "has(r.controller) && r.controller && r.kind == 'DaemonSet')"},
    {"name": "not-gated",
     "expression": "!has(object.spec.schedulingGates) || "
                   f"!object.spec.schedulingGates.exists(g, g.name == '{SCHEDULING_GATE}')"},
)

#: The ApplyConfiguration adding our gate and label (other gates and labels are kept).
GATE_MUTATION = (
    f'Object{{metadata: Object.metadata{{labels: {{"{GATE_LABEL}": "{GATE_LABEL_GATED}"}}}}, '
    f'spec: Object.spec{{schedulingGates: [Object.spec.schedulingGates{{name: '
    f'"{SCHEDULING_GATE}"}}]}}}}'
)


# --- the place branch, in CEL (issue 14 item 1) ------------------------------------------
#
# The ``CEL_*`` constants are the policy's ``variables`` (``variables.<name>``), listed by
# :func:`place_variables` in order (a variable reads only the ones before it); the typed
# fragments further down are inlined into the JSONPatch. Variables are evaluated lazily and
# ``&&`` short-circuits on false, so the pieces that index the params are only evaluated for
# a pod whose images are all in the params.


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal: single-quoted when that needs no escape (JSON
    pieces stay readable), else JSON's double-quoted form (its escapes are valid CEL)."""
    if not any(ch in text for ch in "'\\\n") and text.isascii():
        return f"'{text}'"
    return json.dumps(text)


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(items) + "]"


# Typed object names of the pod schema (KEP-3962: ``Object.<field path>{...}`` constructs a
# typed value that the API server converts back to JSON for a JSONPatch ``value``).
_T_AFFINITY = "Object.spec.affinity"
_T_NODE_AFFINITY = _T_AFFINITY + ".nodeAffinity"
_T_REQUIRED = _T_NODE_AFFINITY + ".requiredDuringSchedulingIgnoredDuringExecution"
_T_TERM = _T_REQUIRED + ".nodeSelectorTerms"
_T_EXPRESSION = _T_TERM + ".matchExpressions"
_T_PREFERRED = _T_NODE_AFFINITY + ".preferredDuringSchedulingIgnoredDuringExecution"
_T_PREFERENCE = _T_PREFERRED + ".preference"
_T_PREF_EXPRESSION = _T_PREFERENCE + ".matchExpressions"
_T_GATE = "Object.spec.schedulingGates"


def _requirement(type_name: str, key: str, operator: str, values: str | None = None) -> str:
    """A NodeSelectorRequirement constructor; ``values`` is a CEL list expression."""
    fields = f"key: {cel_string(key)}, operator: {cel_string(operator)}"
    if values is not None:
        fields += f", values: {values}"
    return f"{type_name}{{{fields}}}"


#: ``images``: the pod's image references, initContainers then containers, as written (the
#: controller's ``decision.unique_images`` order; duplicates do not change an intersection).
#: ``.?``/``orValue``: a field a pod may lack never raises (an error would admit the pod
#: unchanged: failurePolicy Ignore).
CEL_IMAGES = (
    "object.spec.?initContainers.orValue([]).map(c, c.?image.orValue(''))"
    " + object.spec.?containers.orValue([]).map(c, c.?image.orValue(''))"
)

#: ``table``: ``spec.images`` of the ImagePlatforms params (image → "os/arch,..."). The
#: ``null`` guard is defensive: v1.36.2 skips the policy when the object is missing.
CEL_TABLE = "params == null ? {} : params.?spec.?images.orValue({})"

#: ``known``: every image of the pod is a key of the params (issue 14 item 1, "place"), and
#: no container pulls with ``imagePullPolicy: Always`` (the API server's default for
#: ``:latest`` and untagged references): the controller revalidates such an image with the
#: registry on every pod (``pull_always``), which a params entry cannot do.
CEL_KNOWN = (
    "size(variables.images) > 0 && variables.images.all(i, i in variables.table)"
    " && !(object.spec.?initContainers.orValue([]) + object.spec.?containers.orValue([]))"
    ".exists(c, c.?imagePullPolicy.orValue('') == 'Always')"
)

#: ``free``: no ``spec.affinity.nodeAffinity`` (existing terms take the gate branch: the
#: append-to-every-term rule of KEP-3838 is the controller's) and no ``nodeSelector`` pin on
#: ``kubernetes.io/arch`` or ``kubernetes.io/os`` (the controller then adds no requirement on
#: that key and warns; issue 13).
CEL_FREE = (
    "!object.spec.?affinity.?nodeAffinity.hasValue()"
    f" && !({cel_string(ARCH_LABEL)} in object.spec.?nodeSelector.orValue({{}}))"
    f" && !({cel_string(OS_LABEL)} in object.spec.?nodeSelector.orValue({{}}))"
)

#: ``lists``: the "os/arch" pairs of each image (only read once ``known`` holds).
CEL_LISTS = "variables.images.map(i, variables.table[i].split(','))"

#: ``pairs``: the intersection over images (``controller.platforms.supported_platforms``),
#: in the first image's order: the params values are sorted, so the result is sorted too.
CEL_PAIRS = "variables.lists[0].filter(p, variables.lists.all(l, p in l))"

#: ``placed``: take the place branch: all images known, no affinity/pin to merge with, and
#: the intersection empty (unsatisfiable marker) or linux only (the controller's
#: ``kubernetes.io/os In [linux]``; other OSes are left to the controller).
CEL_PLACED = (
    "variables.known && variables.free"
    f" && variables.pairs.all(p, p.startsWith({cel_string(PLACED_OS + '/')}))"
)

#: ``archs``: the supported architectures, sorted (the pairs are sorted and all linux).
CEL_ARCHS = "variables.pairs.map(p, p.split('/')[1])"

def _weights_literal(weights: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{cel_string(a)}: {int(w)}" for a, w in sorted(weights.items())) + "}"


def cel_preferred_archs(weights: Mapping[str, int]) -> str:
    """``preferredArchs``: the supported architectures with a configured weight, in
    ``archs`` order (``affinity.arch_preferences``; the pod has no node affinity here, so no
    preference of its own). The weights are CEL literals: the policy is regenerated from the
    config whenever it changes."""
    return f"variables.archs.filter(a, a in {_weights_literal(weights)})"


# The fragments below build typed pod objects, which the API server declares only in
# mutation expressions (a variable using ``Object.spec...`` fails to compile on v1.36.2), so
# they are inlined into :func:`place_patch_mutation` rather than being variables.

#: The required expressions of the one new NodeSelectorTerm ``decision.decide`` writes for a
#: pod without node affinity: ``kubernetes.io/arch In [archs]`` then ``kubernetes.io/os In
#: [linux]`` (``affinity.platform_requirement``: one OS group, arch first), or the
#: unsatisfiable marker (``affinity.unsatisfiable_marker``) when no platform is common to
#: all images. Several OSes need one term per OS group: such pods take the gate branch.
CEL_REQUIREMENTS = (
    "(size(variables.pairs) == 0 ? "
    + _cel_list([_requirement(_T_EXPRESSION, NO_SUPPORTED_PLATFORM_KEY, "Exists")])
    + " : "
    + _cel_list([
        _requirement(_T_EXPRESSION, ARCH_LABEL, "In", "variables.archs"),
        _requirement(_T_EXPRESSION, OS_LABEL, "In", _cel_list([cel_string(PLACED_OS)])),
    ])
    + ")"
)


def cel_preferred(weights: Mapping[str, int]) -> str:
    """One PreferredSchedulingTerm ``kubernetes.io/arch In [a]`` with its weight per
    ``variables.preferredArchs`` entry (``affinity.arch_preferences``)."""
    return (
        f"variables.preferredArchs.map(a, {_T_PREFERRED}{{weight: {_weights_literal(weights)}[a], "
        f"preference: {_T_PREFERENCE}{{matchExpressions: "
        + _cel_list([_requirement(_T_PREF_EXPRESSION, ARCH_LABEL, "In", "[a]")])
        + "}})"
    )


def cel_node_affinity(weights: Mapping[str, int]) -> str:
    """The NodeAffinity of a placed pod: the required term of :data:`CEL_REQUIREMENTS` and,
    when some supported architecture has a weight, the preferred terms (the field is
    omitted when there are none, as the controller does)."""
    fields = (
        f"requiredDuringSchedulingIgnoredDuringExecution: {_T_REQUIRED}{{nodeSelectorTerms: "
        f"[{_T_TERM}{{matchExpressions: {CEL_REQUIREMENTS}}}]}}"
    )
    if weights:
        fields += (
            ", ?preferredDuringSchedulingIgnoredDuringExecution: "
            "size(variables.preferredArchs) > 0 ? "
            f"optional.of({cel_preferred(weights)}) : optional.none()"
        )
    return f"{_T_NODE_AFFINITY}{{{fields}}}"


#: ``decision``: the compact JSON of the ``podplacement.io/decision`` annotation, with the
#: facts ``decision.decide`` records (``platforms``, ``oses``, ``archs``, ``result``,
#: ``reason``; the per-image digests are the controller's alone) and ``"path":"admission"``.
#: Concatenation is safe: pairs and arch names match ``[a-z0-9_.-]+`` (the CRD's pattern).
CEL_DECISION = " + ".join([
    cel_string('{"path":' + json.dumps(ADMISSION_PATH) + ',"platforms":['),
    "variables.pairs.map(p, '\"' + p + '\"').join(',')",
    cel_string("]"),
    "(size(variables.pairs) > 0 ? " + cel_string(',"oses":[' + json.dumps(PLACED_OS) + "]")
    + " : '')",
    cel_string(',"archs":['),
    "variables.archs.map(a, '\"' + a + '\"').join(',')",
    cel_string('],"result":"'),
    f"(size(variables.pairs) > 0 ? {cel_string(SET)} : {cel_string(NO_SUPPORTED_PLATFORM)})",
    cel_string('","reason":"'),
    "(size(variables.pairs) > 0 ? 'required architectures ' + variables.archs.join(', ')"
    " : 'no platform is supported by every image of the pod')",
    cel_string('"}'),
])

def _add(path: str, value: str) -> str:
    return f"JSONPatch{{op: 'add', path: {path}, value: {value}}}"


def _map_ops(field: str, values: Mapping[str, str]) -> str:
    """The ``add`` ops of ``metadata.<field>`` entries, or of the whole map when the pod has
    none (``podpatch.map_ops``); keys with '/' are escaped with ``jsonpatch.escapeKey``."""
    whole = "{" + ", ".join(f"{cel_string(k)}: {cel_string(v)}" for k, v in values.items()) + "}"
    each = [
        _add(f"{cel_string(f'/metadata/{field}/')} + jsonpatch.escapeKey({cel_string(k)})",
             cel_string(v))
        for k, v in values.items()
    ]
    return (f"(has(object.metadata.{field}) ? {_cel_list(each)} : "
            f"[{_add(cel_string(f'/metadata/{field}'), whole)}])")


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


def place_patch_mutation(weights: Mapping[str, int]) -> str:
    """The one JSONPatch expression of the place policy: for a placed pod the final
    placement (``nodeAffinity``, the two labels, the decision annotation), else the gate
    (:func:`gate_ops`). One JSONPatch and no ApplyConfiguration: an apply runs the
    structured merge on every pod, a cost the warm path cannot afford (bench/cluster.py).
    ``spec.affinity`` is created whole when absent, else only its ``nodeAffinity`` is added
    (a pod with e.g. podAntiAffinity keeps it), as ``AffinityPlan.ops`` does; label and
    annotation maps are created when absent."""
    node_affinity = cel_node_affinity(weights)
    return (
        f"!variables.placed ? {gate_ops()} : ["
        "has(object.spec.affinity) ? "
        + _add(cel_string("/spec/affinity/nodeAffinity"), node_affinity)
        + " : "
        + _add(cel_string("/spec/affinity"), f"{_T_AFFINITY}{{nodeAffinity: {node_affinity}}}")
        + "] + "
        + _map_ops("labels", {GATE_LABEL: GATE_LABEL_REMOVED, AFFINITY_LABEL: AFFINITY_LABEL_SET})
        + " + "
        + "(has(object.metadata.annotations) ? ["
        + _add(f"{cel_string('/metadata/annotations/')} + "
               f"jsonpatch.escapeKey({cel_string(DECISION_ANNOTATION)})", "variables.decision")
        + "] : ["
        + _add(cel_string("/metadata/annotations"),
               f"{{{cel_string(DECISION_ANNOTATION)}: variables.decision}}")
        + "])"
    )


def place_variables(config: PlacementConfig) -> list[dict[str, str]]:
    """The policy's ``variables`` for the place branch, in evaluation order."""
    weights = {p.architecture: p.weight for p in config.preferred_platforms}
    out = [
        ("images", CEL_IMAGES),
        ("table", CEL_TABLE),
        ("known", CEL_KNOWN),
        ("free", CEL_FREE),
        ("lists", CEL_LISTS),
        ("pairs", CEL_PAIRS),
        ("placed", CEL_PLACED),
        ("archs", CEL_ARCHS),
    ]
    if weights:
        out.append(("preferredArchs", cel_preferred_archs(weights)))
    out.append(("decision", CEL_DECISION))
    return [{"name": n, "expression": e} for n, e in out]


def places(config: PlacementConfig) -> bool:
    """True when the policy has a place branch: ``spec.admission.fastPaths`` is
    ``Enabled`` and NUMA placement is off (NUMA candidates need the controller's view of
    the nodes; issue 14 item 1)."""
    return config.admission_fast_paths == FAST_PATHS_ENABLED and not config.topology.enabled


def placement_config(config_obj: Mapping[str, Any] | None) -> PlacementConfig:
    """The parsed PodPlacementConfig, or the defaults when there is none or it does not
    parse (the controller decides with the defaults then, too)."""
    if not config_obj:
        return PlacementConfig()
    try:
        return PlacementConfig.from_object(config_obj)
    except ConfigError:
        return PlacementConfig()


def _metadata(owner: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Our name and label, and ``owner`` (:func:`controller.ownership.namespace_owner`)."""
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
        owner: its ``ownerReferences`` (:func:`controller.ownership.namespace_owner`: the
            product's Namespace).

    Returns:
        ``{"apiVersion": "admissionregistration.k8s.io/v1", "kind":
        "MutatingAdmissionPolicy", "metadata": ..., "spec": ...}``: pods, CREATE only,
        ``matchConditions`` :data:`MATCH_CONDITIONS`, ``reinvocationPolicy: Never``,
        ``failurePolicy: Ignore``, ``paramKind`` ImagePlatforms in every variant: the params
        object is the policy's dead-man switch (while it is missing the API server skips the
        policy, see the module docstring). With a place branch (:func:`places`):
        ``variables`` :func:`place_variables`, then the one JSONPatch
        :func:`place_patch_mutation` (place, else gate); without: the one ApplyConfiguration
        :data:`GATE_MUTATION`.
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
        "matchConditions": [dict(c) for c in MATCH_CONDITIONS],
    }
    if places(config):
        spec["variables"] = place_variables(config)
        spec["mutations"] = [
            {"patchType": "JSONPatch", "jsonPatch": {"expression": place_patch_mutation(
                {p.architecture: p.weight for p in config.preferred_platforms})}},
        ]
    else:
        spec["mutations"] = [{"patchType": "ApplyConfiguration",
                              "applyConfiguration": {"expression": GATE_MUTATION}}]
    return {"apiVersion": GROUP_VERSION, "kind": POLICY_KIND,
            "metadata": _metadata(owner), "spec": spec}


def desired_binding(selection: WebhookNamespaceSelection, *, params_namespace: str,
                    owner: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The MutatingAdmissionPolicyBinding ``podplacement-gate``: the policy applies in the
    namespaces the webhook is called for (``selection``, from
    :func:`controller.webhookconfig.webhook_namespace_selection`).

    ``paramRef`` names the ImagePlatforms ``cluster`` in ``params_namespace`` (the
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
    """An empty ImagePlatforms ``cluster`` in ``namespace`` (``spec.images: {}``), to create
    when absent before the policy is bound: while the object is missing, the API server
    skips the policy (``parameterNotFoundAction: Allow``) and admits pods with no gate at
    all. With it, every pod is gated until the controller publishes inspection results."""
    return {"apiVersion": API_VERSION, "kind": PARAMS_KIND,
            "metadata": {"name": PARAMS_NAME, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "podplacement"}},
            "spec": {"images": {}}}


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
