"""The MutatingWebhookConfiguration the controller owns, as pure data.

:func:`desired_webhook_configuration` turns the PodPlacementConfig ``cluster`` (a plain dict)
plus the webhook's address and CA bundle into the ``admissionregistration.k8s.io/v1``
MutatingWebhookConfiguration ``podplacement-webhook``; :func:`webhook_drifted` tells whether a
live object differs from it in a field we own. No I/O here: :mod:`controller.lifecycle` reads
and writes the object.

Namespace selection. ``spec.namespaceSelector`` of the config is an
*opt-out* selector (CRD description: "Namespaces matching this label selector are NOT
processed"). A webhook's ``namespaceSelector`` says which namespaces *are* sent to it, so the
config's selector has to be negated. A metav1.LabelSelector ANDs its requirements and cannot
express an OR, and ``not (A and B)`` is ``(not A) or (not B)``; so only a selector with exactly
one requirement can be negated exactly:

========================  ===========================
config requirement        webhook requirement
========================  ===========================
``matchLabels k: v``      ``k NotIn [v]``
``k In [v...]``           ``k NotIn [v...]``
``k NotIn [v...]``        ``k In [v...]``
``k Exists``              ``k DoesNotExist``
``k DoesNotExist``        ``k Exists``
========================  ===========================

(``NotIn`` also matches namespaces without the key, and ``In`` requires the key: both are the
exact complements, per the label-selector semantics of k8s.io/apimachinery ``labels``.)
A selector with several requirements (or an invalid one) is not translated: the webhook stays
broad for it and :attr:`WebhookNamespaceSelection.exact` is False so the caller can report it
(the lifecycle sets ``Degraded=True`` with reason ``NamespaceSelectorNotExpressible``). An empty
or absent selector excludes nothing (an empty opt-out selector matching every namespace would
switch the product off; that is what deleting the config is for).

To that the webhook always adds the opt-out label ``podplacement.io/exclude-pod-placement
DoesNotExist`` and ``kubernetes.io/metadata.name NotIn [kube-system, kube-public,
kube-node-lease, <own namespace>]`` (the label the API server sets on every namespace since
Kubernetes 1.21).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from podplacement.rules.config import (
    EXCLUDE_NAMESPACE_LABEL,
    GATE_LABEL,
    GATE_LABEL_REMOVED,
    SYSTEM_NAMESPACES,
    WEBHOOK_CONFIGURATION_NAME,
    WEBHOOK_NAME,
)
from podplacement.rules.policy import selector_matches, selector_requirements

#: Label the API server puts on every Namespace (value = the namespace name).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
#: cert-manager's CA injector fills ``caBundle`` of objects carrying this annotation
#: (value ``<namespace>/<Certificate name>``).
CERT_MANAGER_INJECT_ANNOTATION = "cert-manager.io/inject-ca-from"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY = "podplacement-controller"
APP_NAME = "podplacement"
#: Default webhook call timeout (seconds); the API server allows 1..30.
DEFAULT_TIMEOUT_SECONDS = 5
DEFAULT_WEBHOOK_PATH = "/mutate"

_INVERSE = {"In": "NotIn", "NotIn": "In", "Exists": "DoesNotExist", "DoesNotExist": "Exists"}


class ServiceRef(NamedTuple):
    """Where the API server reaches the webhook inside the cluster (``clientConfig.service``).

    ``port`` is the Service port (443 by default, mapped to the container's 9443).
    """

    namespace: str
    name: str
    port: int = 443
    path: str = DEFAULT_WEBHOOK_PATH


@dataclass(frozen=True, slots=True)
class WebhookNamespaceSelection:
    """The webhook's namespaceSelector and whether it expresses the config's opt-out exactly.

    Attributes:
        selector: a metav1.LabelSelector dict (``{"matchExpressions": [...]}``).
        exact: False when the config's selector could not be negated (see module docstring).
        reason: why not exact ("" when exact).
    """

    selector: dict[str, Any]
    exact: bool
    reason: str = ""


def negate_selector(selector: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], str]:
    """Negate an opt-out label selector into webhook requirements.

    Args:
        selector: a metav1.LabelSelector dict or None.

    Returns:
        ``(requirements, problem)``: the matchExpressions that select every namespace the
        selector does not match, and ``""``; or ``([], problem)`` when the selector cannot be
        negated as one selector (several requirements, or an invalid requirement).
    """
    if not selector:
        return [], ""
    requirements: list[tuple[str, str, list[str]]] = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        return [], "namespaceSelector.matchLabels is not an object"
    for key, value in labels.items():
        requirements.append((str(key), "In", [str(value)]))
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, Sequence) or isinstance(expressions, str | bytes):
        return [], "namespaceSelector.matchExpressions is not a list"
    for expr in expressions:
        if not isinstance(expr, Mapping):
            return [], "namespaceSelector.matchExpressions has a non-object entry"
        key, op = expr.get("key"), expr.get("operator")
        values = [str(v) for v in (expr.get("values") or [])]
        if not isinstance(key, str) or not key or op not in _INVERSE:
            return [], f"namespaceSelector has an invalid requirement {dict(expr)!r}"
        if (op in ("In", "NotIn")) != bool(values):
            return [], f"namespaceSelector requirement on {key!r}: {op} with values {values!r}"
        requirements.append((key, str(op), values))
    if not requirements:
        return [], ""
    if len(requirements) > 1:
        return [], (
            f"namespaceSelector has {len(requirements)} requirements; their negation is an OR "
            "that one label selector cannot express, so the webhook is not narrowed by it"
        )
    key, op, values = requirements[0]
    inverse: dict[str, Any] = {"key": key, "operator": _INVERSE[op]}
    if values:
        inverse["values"] = sorted(set(values))
    return [inverse], ""


def webhook_namespace_selection(
    config_obj: Mapping[str, Any] | None, own_namespace: str
) -> WebhookNamespaceSelection:
    """The webhook's namespaceSelector for a PodPlacementConfig object (see module docstring).

    Args:
        config_obj: the PodPlacementConfig dict (``spec.namespaceSelector`` is read) or None.
        own_namespace: the namespace podplacement runs in (never gated).
    """
    spec = (config_obj or {}).get("spec") or {}
    raw = spec.get("namespaceSelector") if isinstance(spec, Mapping) else None
    negated, problem = negate_selector(raw if isinstance(raw, Mapping) else None)
    if raw is not None and not isinstance(raw, Mapping):
        problem = "namespaceSelector is not an object"
    fixed: list[dict[str, Any]] = [
        {"key": EXCLUDE_NAMESPACE_LABEL, "operator": "DoesNotExist"},
        {
            "key": NAMESPACE_NAME_LABEL,
            "operator": "NotIn",
            "values": sorted(SYSTEM_NAMESPACES | {own_namespace}),
        },
    ]
    expressions = list(fixed)
    for req in negated:
        if req not in expressions:
            expressions.append(req)
    return WebhookNamespaceSelection(
        selector={"matchExpressions": expressions}, exact=not problem, reason=problem
    )


#: The webhook's ``objectSelector`` while a place policy is in force: the pods the policy did
#: not place (its label ``scheduling-gate`` is anything but ``removed``, or absent).
SKIP_PLACED_SELECTOR: dict[str, Any] = {"matchExpressions": [
    {"key": GATE_LABEL, "operator": "NotIn", "values": [GATE_LABEL_REMOVED]}]}


def object_selector(skip_placed: bool) -> dict[str, Any]:
    """The webhook's ``objectSelector``.

    Args:
        skip_placed: a policy with a place branch is in force with its params object
            (``mechanism: Auto``, the API served, fast paths on, the params object
            existing); False otherwise (``mechanism: Webhook``, a server without the policy
            API, fast paths off, the params object missing or not known yet).

    Returns:
        ``{}`` for False: the webhook is called for every pod. Else
        :data:`SKIP_PLACED_SELECTOR`: the API server does not call the webhook for a pod
        the policy placed (the policy runs first and writes the label
        ``scheduling-gate=removed`` on exactly the pods it places; on every other pod it
        evaluates it writes ``gated``, over whatever the pod's creator set: a pod created
        with our gate included, :func:`rules.admit.admissionpolicy.place_patch_mutation`).
        The warm pods of the fast path thus cost no round trip, and no CEL either: a label
        selector is matched on the labels alone, where a ``matchConditions`` entry costs
        the API server a conversion of the whole pod on every create (bench/policycost.py).
        Which pods skip it: :func:`webhook_called`.
    """
    return copy.deepcopy(SKIP_PLACED_SELECTOR) if skip_placed else {}


def webhook_called(pod: Mapping[str, Any], skip_placed: bool) -> bool:
    """The API server calls the webhook for ``pod`` (as the policy left it) in a namespace
    the webhook selects: :func:`object_selector` matched by the label-selector rules of
    :func:`rules.policy.selector_matches` (``NotIn`` matches a pod without the key); labels
    that are not a map count as none."""
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return selector_matches(selector_requirements(object_selector(skip_placed)),
                            labels if isinstance(labels, Mapping) else {})


def desired_webhook_configuration(
    config_obj: Mapping[str, Any] | None,
    *,
    ca_bundle: bytes | None,
    service: ServiceRef | tuple[str, str, int, str] | None = None,
    url: str | None = None,
    own_namespace: str,
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
    cert_manager_certificate: str | None = None,
    owner: Sequence[Mapping[str, Any]] = (),
    skip_placed: bool = False,
) -> dict[str, Any]:
    """Build the MutatingWebhookConfiguration ``podplacement-webhook``.

    One webhook ``pods.podplacement.io``: pods CREATE ``v1``, sideEffects None,
    admissionReviewVersions [v1], failurePolicy Ignore (the webhook must never block pod
    creation), matchPolicy Equivalent, reinvocationPolicy Never, no matchConditions, the
    objectSelector of :func:`object_selector` and the namespaceSelector of
    :func:`webhook_namespace_selection`.

    Args:
        config_obj: the PodPlacementConfig ``cluster`` dict (its namespace selection).
        ca_bundle: PEM CA certificate(s) the API server trusts for the webhook (base64-encoded
            into ``clientConfig.caBundle``); None leaves caBundle out (cert-manager mode).
        service: ``(namespace, name, port, path)`` of the webhook Service, or
        url: an ``https://`` URL (exactly one of the two).
        own_namespace: podplacement's namespace, excluded from gating.
        timeout_seconds: webhook call timeout, 1..30.
        cert_manager_certificate: ``<namespace>/<Certificate>``: add cert-manager's
            ``inject-ca-from`` annotation so its CA injector owns caBundle.
        owner: the ``ownerReferences`` (:func:`rules.ownership.namespace_owner`: the
            product's Namespace, so the garbage collector deletes the configuration once
            the namespace is gone, whether or not a controller ran the ordered uninstall).
        skip_placed: a place policy is in force with its params object
            (:func:`object_selector`).

    Raises:
        ValueError: neither or both of service/url, or timeout out of 1..30.
    """
    if (service is None) == (url is None):
        raise ValueError("give exactly one of service= or url=")
    if not 1 <= timeout_seconds <= 30:
        raise ValueError("timeout_seconds must be within 1..30 (admissionregistration/v1)")
    client_config: dict[str, Any]
    if service is not None:
        svc = ServiceRef(*service)
        client_config = {
            "service": {
                "namespace": svc.namespace,
                "name": svc.name,
                "path": svc.path,
                "port": int(svc.port),
            }
        }
    else:
        client_config = {"url": url}
    if ca_bundle is not None:
        client_config["caBundle"] = base64.b64encode(ca_bundle).decode("ascii")
    selection = webhook_namespace_selection(config_obj, own_namespace)
    metadata: dict[str, Any] = {
        "name": WEBHOOK_CONFIGURATION_NAME,
        "labels": {NAME_LABEL: APP_NAME, MANAGED_BY_LABEL: MANAGED_BY},
    }
    if cert_manager_certificate:
        metadata["annotations"] = {CERT_MANAGER_INJECT_ANNOTATION: cert_manager_certificate}
    if owner:
        metadata["ownerReferences"] = [dict(o) for o in owner]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "clientConfig": client_config,
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "namespaceSelector": selection.selector,
                "objectSelector": object_selector(skip_placed),
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "Never",
            }
        ],
    }


# Server-side defaults of admissionregistration.k8s.io/v1 (SetDefaults_MutatingWebhook and
# SetDefaults_Rule; the recording admission-webhook-configuration.json shows them added).
_WEBHOOK_DEFAULTS: dict[str, Any] = {
    "failurePolicy": "Fail",
    "matchPolicy": "Equivalent",
    "namespaceSelector": {},
    "objectSelector": {},
    "timeoutSeconds": 10,
    "reinvocationPolicy": "Never",
    "matchConditions": [],
}
_OWNED_WEBHOOK_FIELDS = (
    "name",
    "clientConfig",
    "rules",
    "failurePolicy",
    "matchPolicy",
    "namespaceSelector",
    "objectSelector",
    "sideEffects",
    "timeoutSeconds",
    "admissionReviewVersions",
    "reinvocationPolicy",
    "matchConditions",
)


def _normalized_webhook(webhook: Mapping[str, Any], *, with_ca: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _OWNED_WEBHOOK_FIELDS:
        value = webhook.get(key)
        if value is None:
            value = _WEBHOOK_DEFAULTS.get(key)
        out[key] = value
    client = dict(webhook.get("clientConfig") or {})
    if "service" in client and client["service"] is not None:
        svc = dict(client["service"])
        svc.setdefault("port", 443)
        client["service"] = svc
    if not with_ca:
        client.pop("caBundle", None)
    out["clientConfig"] = client
    rules = []
    for rule in webhook.get("rules") or []:
        r = dict(rule)
        r.setdefault("scope", "*")
        rules.append(r)
    out["rules"] = rules
    return out


def webhook_drifted(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the live MutatingWebhookConfiguration differs from ``desired`` where we own it.

    Compared: our labels and annotations (other keys may be added by anyone), the
    ownerReferences we set, and every field of every webhook entry (after filling in the
    server's defaults on both sides, so defaults are not drift); an extra or missing webhook
    entry is drift. When ``desired`` has the cert-manager annotation, caBundle is owned by
    cert-manager's CA injector and is not compared.

    Args:
        live: the object as read from the API server.
        desired: the result of :func:`desired_webhook_configuration`.
    """
    d_meta = desired.get("metadata") or {}
    l_meta = live.get("metadata") or {}
    for field in ("labels", "annotations"):
        wanted = d_meta.get(field) or {}
        have = l_meta.get(field) or {}
        if any(have.get(k) != v for k, v in wanted.items()):
            return True
    if d_meta.get("ownerReferences"):
        owners = {(o.get("uid"), o.get("controller")) for o in l_meta.get("ownerReferences") or []}
        if any((o["uid"], o.get("controller")) not in owners for o in d_meta["ownerReferences"]):
            return True
    with_ca = CERT_MANAGER_INJECT_ANNOTATION not in (d_meta.get("annotations") or {})
    d_hooks = [_normalized_webhook(w, with_ca=with_ca) for w in desired.get("webhooks") or []]
    l_hooks = [_normalized_webhook(w, with_ca=with_ca) for w in live.get("webhooks") or []]
    return d_hooks != l_hooks
