"""Who owns what the product leaves in the API server, as pure data.

Every object the product leaves behind either has a live owner or does no harm without one
(docs/design.md, "Rules that are easy to get wrong"). This module builds the pieces of that
rule; :mod:`controller.lifecycle` reads and writes them.

- **Garbage collection.** The cluster-scoped objects the controller creates (the
  MutatingAdmissionPolicy and its binding, the MutatingWebhookConfiguration and the uninstall
  ClusterRole and ClusterRoleBinding below) carry an ``ownerReference`` to the product's
  Namespace (:func:`namespace_owner`). A Namespace is cluster-scoped, so it may own
  cluster-scoped objects, and the garbage collector of kube-controller-manager deletes them
  once the namespace is gone, whether or not a controller was alive to do it.
- **The dead-man switch.** The admission policy's params object lives in the product's
  namespace (:mod:`controller.paramswriter`); while it is missing the API server skips the
  policy (:mod:`rules.admit.admissionpolicy`). The namespace controller deletes it as soon as
  the namespace is being deleted, and the last controller to stop deletes it.
- **The ordered uninstall survives ``kubectl delete -k deploy/``.** That one command deletes
  the controller's ClusterRole, ClusterRoleBinding and ServiceAccount in the same breath as
  everything else. Two facts of kube-apiserver v1.36.2 (tests/test_uninstall_realcluster.py):

  * a ServiceAccount token stays valid while its ServiceAccount exists and for one minute
    after the ServiceAccount's ``deletionTimestamp`` (``jwt.DefaultLeeway`` in
    ``pkg/serviceaccount/claims.go``); without a finalizer the ServiceAccount is gone at
    once, and every request of the controller fails with 401;
  * RBAC keeps authorizing through a ClusterRole and ClusterRoleBinding that carry a
    deletionTimestamp, but removing the finalizer of either ends the grant.

  So the leader puts :data:`GUARD_FINALIZER` on its own ServiceAccount, and keeps a copy of
  the rights the uninstall needs (:data:`UNINSTALL_RULES`) in a ClusterRole and
  ClusterRoleBinding of its own (:func:`uninstall_role`, :func:`uninstall_binding`) that
  ``kubectl delete -k`` does not know. Removing the ServiceAccount's finalizer is then the
  very last request of the uninstall; the copy goes with the Namespace (garbage collector).
  A finalizer on deploy/'s own ClusterRole or binding would not do: removing it ends the
  right to remove the next one.

A finalizer without a live owner strands its object, so ours exist only while a controller
leads: the leader adds them, and the last controller to stop gracefully, or the uninstall,
removes them (:mod:`controller.lifecycle`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    CONFIG_FINALIZER,
    CONFIG_NAME,
    CONFIG_PLURAL,
    GROUP,
    PARAMS_NAME,
    PARAMS_PLURAL,
    POLICY_PLURAL,
    WEBHOOK_CONFIGURATION_NAME,
)

#: The finalizer of the PodPlacementConfig and of the controller's own ServiceAccount.
GUARD_FINALIZER = CONFIG_FINALIZER
#: Name of the ClusterRole and ClusterRoleBinding the controller keeps for its uninstall.
UNINSTALL_RBAC_NAME = "podplacement-controller-uninstall"
#: Label of every object the controller creates (``app.kubernetes.io/name``).
APP_LABELS = {"app.kubernetes.io/name": "podplacement"}
#: The prefix of a ServiceAccount's user name (``system:serviceaccount:<ns>:<name>``).
SERVICE_ACCOUNT_USER_PREFIX = "system:serviceaccount:"

_ADMISSION = "admissionregistration.k8s.io"


def _rule(groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str],
          names: Sequence[str] = ()) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": list(groups), "resources": list(resources),
                            "verbs": list(verbs)}
    if names:
        rule["resourceNames"] = list(names)
    return rule


def uninstall_rules(service_account: str) -> list[dict[str, Any]]:
    """The rules the ordered uninstall needs once deploy/'s RBAC is gone: release the gated
    pods with a normal decision (pods, nodes, NRTs, pull secrets, registries ConfigMap,
    Events, the namespaces' placement policies), watch, then delete the admission objects
    and the params object, release the config's and the ServiceAccount's finalizers and
    write the config's status.

    Every rule is also in deploy/'s controller ClusterRole: RBAC lets a subject create a role
    only with rights it holds (escalation prevention), so the copy adds no right
    (tests/deploy/test_manifests.py checks the inclusion).

    Args:
        service_account: the controller's ServiceAccount name (its finalizer).

    Returns:
        ClusterRole ``rules``, in a fixed order.
    """
    return [
        _rule([""], ["pods"], ["get", "list", "watch", "patch"]),
        _rule([""], ["nodes"], ["list", "watch"]),
        _rule([""], ["secrets", "configmaps"], ["get"]),
        _rule([""], ["events"], ["create"]),
        _rule(["events.k8s.io"], ["events"], ["create"]),
        _rule(["topology.node.k8s.io"], ["noderesourcetopologies"], ["list", "watch"]),
        _rule([GROUP], [CONFIG_PLURAL], ["get", "list", "watch", "patch"]),
        _rule([GROUP], [f"{CONFIG_PLURAL}/status"], ["patch"]),
        _rule([GROUP], [POLICY_PLURAL], ["list", "watch"]),
        _rule([GROUP], [PARAMS_PLURAL], ["get", "delete"], [PARAMS_NAME]),
        # the watch of the params object's creations and deletions (controller.app)
        _rule([GROUP], [PARAMS_PLURAL], ["list", "watch"]),
        _rule([_ADMISSION], ["mutatingwebhookconfigurations"], ["get", "delete"],
              [WEBHOOK_CONFIGURATION_NAME]),
        _rule([_ADMISSION], ["mutatingadmissionpolicies", "mutatingadmissionpolicybindings"],
              ["get", "delete"], [ADMISSION_POLICY_NAME]),
        _rule([""], ["serviceaccounts"], ["get", "patch"], [service_account]),
    ]


def namespace_owner(namespace_obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The ``ownerReferences`` naming the product's Namespace as owner of a cluster-scoped
    object we create; empty when ``namespace_obj`` lacks a name or uid (then nothing is
    owned, as before: a later resync adds the owner).

    No ``blockOwnerDeletion``: the namespace's deletion never waits for its dependents.
    """
    meta = (namespace_obj or {}).get("metadata") or {}
    if not meta.get("uid") or not meta.get("name"):
        return []
    return [{"apiVersion": "v1", "kind": "Namespace", "name": str(meta["name"]),
             "uid": str(meta["uid"])}]


def uninstall_role(service_account: str,
                   owner: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ClusterRole :data:`UNINSTALL_RBAC_NAME` with :func:`uninstall_rules`, owned by
    ``owner`` (:func:`namespace_owner`)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": _meta(UNINSTALL_RBAC_NAME, owner),
            "rules": uninstall_rules(service_account)}


def uninstall_binding(namespace: str, service_account: str,
                      owner: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ClusterRoleBinding :data:`UNINSTALL_RBAC_NAME` of the ServiceAccount
    ``namespace/service_account`` to :func:`uninstall_role`, owned by ``owner``."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": _meta(UNINSTALL_RBAC_NAME, owner),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": UNINSTALL_RBAC_NAME},
            "subjects": [{"kind": "ServiceAccount", "name": service_account,
                          "namespace": namespace}]}


def rbac_drifted(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """True when a live uninstall ClusterRole / binding differs from ``desired`` in its
    rules, roleRef, subjects or owners (labels and other metadata are not compared)."""
    for field in ("rules", "roleRef", "subjects"):
        if field in desired and live.get(field) != desired[field]:
            return True
    want = {o.get("uid") for o in (desired.get("metadata") or {}).get("ownerReferences") or []}
    have = {o.get("uid") for o in (live.get("metadata") or {}).get("ownerReferences") or []}
    return not want <= have


def _meta(name: str, owner: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(APP_LABELS)}
    if owner:
        meta["ownerReferences"] = [dict(o) for o in owner]
    return meta


def service_account_of(username: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a ServiceAccount user name
    (``system:serviceaccount:<namespace>:<name>``, the API server's form), else None."""
    if not username.startswith(SERVICE_ACCOUNT_USER_PREFIX):
        return None
    namespace, sep, name = username[len(SERVICE_ACCOUNT_USER_PREFIX):].partition(":")
    if not sep or not namespace or not name or ":" in name:
        return None
    return namespace, name


def has_finalizer(obj: Mapping[str, Any] | None, finalizer: str = GUARD_FINALIZER) -> bool:
    """True when ``obj`` carries ``finalizer``."""
    return finalizer in (((obj or {}).get("metadata") or {}).get("finalizers") or [])


def deleting(obj: Mapping[str, Any] | None) -> bool:
    """True when ``obj`` exists and has a ``deletionTimestamp``."""
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def add_finalizer_ops(obj: Mapping[str, Any],
                      finalizer: str = GUARD_FINALIZER) -> list[dict[str, Any]] | None:
    """The JSON patch adding ``finalizer`` to ``obj`` (guarded by a ``test`` of its
    ``resourceVersion``, so a concurrent change answers 409/422 instead of being lost), or
    None when it is there already."""
    meta = obj.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if finalizer in finalizers:
        return None
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                  "value": meta.get("resourceVersion")}]
    if finalizers:
        ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
    else:
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})
    return ops


def remove_finalizer_ops(obj: Mapping[str, Any],
                         finalizer: str = GUARD_FINALIZER) -> list[dict[str, Any]] | None:
    """The JSON patch removing ``finalizer`` from ``obj`` (by index, guarded by a ``test``
    of its ``resourceVersion``), or None when it is not there."""
    meta = obj.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if finalizer not in finalizers:
        return None
    return [{"op": "test", "path": "/metadata/resourceVersion",
             "value": meta.get("resourceVersion")},
            {"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(finalizer)}"}]


def uninstall_reason(config: Mapping[str, Any] | None, namespace_obj: Mapping[str, Any] | None,
                     service_account: Mapping[str, Any] | None, *,
                     namespace: str) -> str:
    """Why the product is being removed, or "" when it is not.

    The ordered uninstall runs when the PodPlacementConfig ``cluster`` is being deleted
    (``kubectl delete ppc cluster``, or its CRD's deletion), when the product's namespace
    is being deleted, or when the controller's ServiceAccount is (``kubectl delete -k
    deploy/`` does all three at once). Only the last two mean the controller itself is
    going away (:func:`product_removed`).
    """
    if deleting(namespace_obj):
        return f"namespace {namespace} is being deleted"
    if deleting(service_account):
        name = ((service_account or {}).get("metadata") or {}).get("name")
        return f"ServiceAccount {namespace}/{name} is being deleted"
    if deleting(config):
        return f"PodPlacementConfig {CONFIG_NAME} is being deleted"
    return ""


def product_removed(namespace_obj: Mapping[str, Any] | None,
                    service_account: Mapping[str, Any] | None) -> bool:
    """True when the controller itself is being removed (its namespace or ServiceAccount
    is being deleted): the uninstall then also releases the ServiceAccount's finalizer, as
    its very last request."""
    return deleting(namespace_obj) or deleting(service_account)
