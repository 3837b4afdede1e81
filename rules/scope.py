"""Which pods podplacement leaves alone: the rules the webhook's gate
(:func:`webhook.gating.should_gate`) and the escape monitor (:mod:`rules.monitor.escape`)
share, so that a pod the product deliberately does not place is never reported as one that
escaped placement.

- the system namespaces (``kube-system``, ``kube-public``, ``kube-node-lease``) and the
  product's own namespace;
- pods a DaemonSet controls (the DaemonSet controller binds them per node);
- mirror pods of static pods (the kubelet creates them already bound; the webhook skips
  them because ``spec.nodeName`` is set);
- namespaces opted out: the label ``podplacement.io/exclude-pod-placement`` (any value) or
  the config's ``spec.namespaceSelector`` (an opt-out selector; docs/guide/configuration.md).
  The webhook gets these through its configuration's ``namespaceSelector``
  (:func:`rules.admit.webhookconfig.webhook_namespace_selection`, where the API server
  applies them); :func:`namespace_opted_out` applies them to a namespace's labels.

Fields with an unexpected type are treated as absent: nothing here raises on odd input.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podplacement.rules.config import (
    EXCLUDE_NAMESPACE_LABEL,
    MIRROR_POD_ANNOTATION,
    SYSTEM_NAMESPACES,
)
from podplacement.rules.policy import (
    PolicyError,
    selector_matches,
    selector_requirements,
)

__all__ = [
    "REASON_DAEMONSET",
    "REASON_MIRROR_POD",
    "REASON_NAMESPACE_OPTED_OUT",
    "REASON_OWN_NAMESPACE",
    "REASON_SYSTEM_NAMESPACE",
    "is_daemonset_pod",
    "is_mirror_pod",
    "namespace_opted_out",
    "namespace_skip_reason",
    "owned_by_daemonset",
    "pod_skip_reason",
]

#: Skip reasons (the webhook's metrics label values, docs/reference/labels-events-metrics.md
#: "Metrics").
REASON_SYSTEM_NAMESPACE = "system_namespace"
REASON_OWN_NAMESPACE = "own_namespace"
REASON_DAEMONSET = "daemonset"
REASON_MIRROR_POD = "mirror_pod"
REASON_NAMESPACE_OPTED_OUT = "namespace_opted_out"

_NO_MAP: Mapping[str, Any] = {}


def _map(value: Any) -> Mapping[str, Any]:
    # ``type(...) is dict`` first: parsed JSON is always a dict (the webhook runs this on
    # every admission).
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return _NO_MAP


def namespace_skip_reason(namespace: str, own_namespace: str) -> str | None:
    """:data:`REASON_SYSTEM_NAMESPACE` for ``kube-system``, ``kube-public`` and
    ``kube-node-lease``, :data:`REASON_OWN_NAMESPACE` for ``own_namespace`` (where the
    product runs), else None."""
    if namespace in SYSTEM_NAMESPACES:
        return REASON_SYSTEM_NAMESPACE
    if namespace == own_namespace:
        return REASON_OWN_NAMESPACE
    return None


def owned_by_daemonset(metadata: Mapping[str, Any]) -> bool:
    """True when an ownerReference of ``metadata`` with ``controller: true`` has kind
    ``DaemonSet``."""
    refs = metadata.get("ownerReferences")
    if not isinstance(refs, list):
        return False
    for ref in refs:
        ref = _map(ref)
        if ref.get("controller") is True and ref.get("kind") == "DaemonSet":
            return True
    return False


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    """True when a DaemonSet controls ``pod`` (:func:`owned_by_daemonset`)."""
    return owned_by_daemonset(_map(pod.get("metadata")))


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    """True for the mirror pod of a static pod: the kubelet's annotation
    ``kubernetes.io/config.mirror``, or a controlling ownerReference of kind ``Node`` (the
    kubelet sets both; Kubernetes "Static Pods")."""
    metadata = _map(pod.get("metadata"))
    if MIRROR_POD_ANNOTATION in _map(metadata.get("annotations")):
        return True
    refs = metadata.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        ref = _map(ref)
        if ref.get("controller") is True and ref.get("kind") == "Node":
            return True
    return False


def pod_skip_reason(pod: Mapping[str, Any], own_namespace: str) -> str | None:
    """Why podplacement does not place ``pod`` whatever its namespace's labels: its
    namespace (:func:`namespace_skip_reason`), a DaemonSet owner, or a mirror pod; None
    when none of these applies."""
    metadata = _map(pod.get("metadata"))
    reason = namespace_skip_reason(str(metadata.get("namespace") or ""), own_namespace)
    if reason is not None:
        return reason
    if owned_by_daemonset(metadata):
        return REASON_DAEMONSET
    if is_mirror_pod(pod):
        return REASON_MIRROR_POD
    return None


def namespace_opted_out(labels: Mapping[str, Any], namespace_selector: Any) -> bool:
    """Whether a namespace with ``labels`` is opted out: it carries
    ``podplacement.io/exclude-pod-placement`` (any value), or the config's
    ``spec.namespaceSelector`` (a metav1.LabelSelector dict, or None) has at least one
    requirement and matches it. An empty selector excludes nothing, and one that does not
    parse excludes nothing either: the webhook then stays broad too
    (:func:`rules.admit.webhookconfig.negate_selector`)."""
    labels = _map(labels)
    if EXCLUDE_NAMESPACE_LABEL in labels:
        return True
    try:
        requirements = selector_requirements(namespace_selector, "spec.namespaceSelector")
    except PolicyError:
        return False
    return bool(requirements) and selector_matches(requirements, labels)
