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
carrying our gate. The mutation is an ApplyConfiguration that adds our gate (``schedulingGates``
is a list map keyed by ``name``, so other gates are kept) and the label
``podplacement.io/scheduling-gate=gated``, checked on kube-apiserver v1.36.2.

``failurePolicy: Ignore``: a CEL error admits the pod unchanged (the product never denies a
pod). Escape hatch, one line: ``kubectl delete mutatingadmissionpolicybinding
podplacement-gate`` (the controller re-creates it within its resync unless the config says
``mechanism: Webhook``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.config import (
    ADMISSION_POLICY_NAME,
    API_VERSION,
    CONFIG_KIND,
    GATE_LABEL,
    GATE_LABEL_GATED,
    SCHEDULING_GATE,
)
from controller.webhookconfig import WebhookNamespaceSelection

GROUP_VERSION = "admissionregistration.k8s.io/v1"
POLICY_KIND = "MutatingAdmissionPolicy"
BINDING_KIND = "MutatingAdmissionPolicyBinding"
POLICY_RESOURCE = "mutatingadmissionpolicies"
BINDING_RESOURCE = "mutatingadmissionpolicybindings"

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


def _metadata(config_obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """Our name and label, and the config as owner when it has a uid."""
    meta: dict[str, Any] = {"name": ADMISSION_POLICY_NAME,
                            "labels": {"app.kubernetes.io/name": "podplacement"}}
    owner = (config_obj or {}).get("metadata") or {}
    if owner.get("uid"):
        meta["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": CONFIG_KIND,
                                    "name": owner.get("name"), "uid": owner["uid"]}]
    return meta


def desired_policy(config_obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """The MutatingAdmissionPolicy ``podplacement-gate`` (a plain dict, ready to POST).

    Args:
        config_obj: the PodPlacementConfig ``cluster`` (its uid makes it the owner), or None.

    Returns:
        ``{"apiVersion": "admissionregistration.k8s.io/v1", "kind":
        "MutatingAdmissionPolicy", "metadata": ..., "spec": ...}``: pods, CREATE only,
        ``matchConditions`` :data:`MATCH_CONDITIONS`, one ApplyConfiguration mutation
        :data:`GATE_MUTATION`, ``reinvocationPolicy: Never``, ``failurePolicy: Ignore``.
    """
    return {
        "apiVersion": GROUP_VERSION,
        "kind": POLICY_KIND,
        "metadata": _metadata(config_obj),
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                   "operations": ["CREATE"], "resources": ["pods"]}],
                "matchPolicy": "Equivalent",
            },
            "matchConditions": [dict(c) for c in MATCH_CONDITIONS],
            "mutations": [{"patchType": "ApplyConfiguration",
                           "applyConfiguration": {"expression": GATE_MUTATION}}],
        },
    }


def desired_binding(config_obj: Mapping[str, Any] | None,
                    selection: WebhookNamespaceSelection) -> dict[str, Any]:
    """The MutatingAdmissionPolicyBinding ``podplacement-gate``: the policy applies in the
    namespaces the webhook is called for (``selection``, from
    :func:`controller.webhookconfig.webhook_namespace_selection`)."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": BINDING_KIND,
        "metadata": _metadata(config_obj),
        "spec": {
            "policyName": ADMISSION_POLICY_NAME,
            "matchResources": {"namespaceSelector": dict(selection.selector),
                               "objectSelector": {}, "matchPolicy": "Equivalent"},
        },
    }


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
