"""The resource types localkube serves: the built-in ones and those defined by CRDs.

A :class:`ResourceType` carries what the REST layer needs to route a request, build discovery
documents and validate objects: group, served versions, plural/singular/kind names, scope,
subresources, patch strategy and (for CRDs) the OpenAPI v3 schema and printer columns per
version. Pure data; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Field-selector labels every resource accepts (apimachinery's ``DefaultClusterScopedAttr``).
_COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})

_POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    }
)
_CORE_EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
_EVENTS_V1_FIELDS = frozenset(
    {
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    }
)

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
#: The verb order the real server lists for custom resources (crd-podplacementconfig.json).
CR_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]


@dataclass
class ResourceType:
    """One REST resource (``group``/``plural``) and how to serve it.

    Attributes:
        group: API group, ``""`` for core.
        versions: served versions, preferred (storage) first.
        plural, singular, kind, list_kind: the names (``pods``, ``pod``, ``Pod``, ``PodList``).
        namespaced: True for namespaced resources.
        subresources: ``status`` / ``binding`` names served under ``/<name>/<sub>``.
        strategic: True when strategic-merge patches are accepted (built-in types only).
        short_names, categories: discovery extras (``kubectl get ppc``).
        field_labels: extra field-selector labels (``spec.nodeName``...).
        schemas: CRD only: version -> ``openAPIV3Schema``.
        printer_columns: CRD only: version -> ``additionalPrinterColumns``.
        crd_name: CRD only: ``<plural>.<group>``.
        storage: the ``(group, plural)`` the objects are stored under (events.k8s.io events share
            core events' storage).
    """

    group: str
    versions: list[str]
    plural: str
    singular: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    strategic: bool = False
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    field_labels: frozenset[str] = frozenset()
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    printer_columns: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    crd_name: str | None = None
    storage: tuple[str, str] | None = None

    @property
    def list_kind(self) -> str:
        """``<Kind>List``."""
        return self.kind + "List"

    @property
    def key(self) -> tuple[str, str]:
        """``(group, plural)``: the identity of the resource."""
        return (self.group, self.plural)

    @property
    def storage_key(self) -> tuple[str, str]:
        """Where objects live in the store."""
        return self.storage or self.key

    @property
    def is_crd(self) -> bool:
        """True for custom resources."""
        return self.crd_name is not None

    @property
    def qualified(self) -> str:
        """``pods`` or ``podplacementconfigs.podplacement.io`` (as in error messages)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str) -> str:
        """``v1`` or ``<group>/<version>``."""
        return f"{self.group}/{version}" if self.group else version

    def supports_field(self, label: str) -> bool:
        """Whether ``label`` may appear in a field selector for this resource."""
        return label in _COMMON_FIELDS or label in self.field_labels


def builtin_resources() -> list[ResourceType]:
    """The built-in resource types localkube serves, in discovery order.

    Services, Deployments and RBAC objects are stored and served (so manifests apply) but no
    controller acts on them.
    """
    return [
        ResourceType("", ["v1"], "namespaces", "namespace", "Namespace", False,
                     frozenset({"status"}), True, ["ns"],
                     field_labels=frozenset({"status.phase"})),
        ResourceType("", ["v1"], "pods", "pod", "Pod", True,
                     frozenset({"status", "binding"}), True, ["po"], ["all"], _POD_FIELDS),
        ResourceType("", ["v1"], "nodes", "node", "Node", False, frozenset({"status"}), True,
                     ["no"], field_labels=frozenset({"spec.unschedulable"})),
        ResourceType("", ["v1"], "secrets", "secret", "Secret", True, strategic=True,
                     field_labels=frozenset({"type"})),
        ResourceType("", ["v1"], "serviceaccounts", "serviceaccount", "ServiceAccount", True,
                     strategic=True, short_names=["sa"]),
        ResourceType("", ["v1"], "configmaps", "configmap", "ConfigMap", True, strategic=True,
                     short_names=["cm"]),
        ResourceType("", ["v1"], "services", "service", "Service", True,
                     frozenset({"status"}), True, ["svc"], ["all"]),
        ResourceType("", ["v1"], "events", "event", "Event", True, strategic=True,
                     short_names=["ev"], field_labels=_CORE_EVENT_FIELDS),
        ResourceType("events.k8s.io", ["v1"], "events", "event", "Event", True,
                     strategic=True, short_names=["ev"], field_labels=_EVENTS_V1_FIELDS,
                     storage=("", "events")),
        ResourceType("coordination.k8s.io", ["v1"], "leases", "lease", "Lease", True,
                     strategic=True),
        ResourceType("admissionregistration.k8s.io", ["v1"], "mutatingwebhookconfigurations",
                     "mutatingwebhookconfiguration", "MutatingWebhookConfiguration", False,
                     strategic=True),
        ResourceType("apps", ["v1"], "deployments", "deployment", "Deployment", True,
                     frozenset({"status"}), True, ["deploy"], ["all"]),
        ResourceType("policy", ["v1"], "poddisruptionbudgets", "poddisruptionbudget",
                     "PodDisruptionBudget", True, frozenset({"status"}), True, ["pdb"]),
        ResourceType("rbac.authorization.k8s.io", ["v1"], "clusterroles", "clusterrole",
                     "ClusterRole", False, strategic=True),
        ResourceType("rbac.authorization.k8s.io", ["v1"], "clusterrolebindings",
                     "clusterrolebinding", "ClusterRoleBinding", False, strategic=True),
        ResourceType("rbac.authorization.k8s.io", ["v1"], "roles", "role", "Role", True,
                     strategic=True),
        ResourceType("rbac.authorization.k8s.io", ["v1"], "rolebindings", "rolebinding",
                     "RoleBinding", True, strategic=True),
        ResourceType("apiextensions.k8s.io", ["v1"], "customresourcedefinitions",
                     "customresourcedefinition", "CustomResourceDefinition", False,
                     frozenset({"status"}), True, ["crd", "crds"], ["api-extensions"]),
    ]


def resource_from_crd(crd: dict[str, Any]) -> ResourceType:
    """Build the :class:`ResourceType` a ``CustomResourceDefinition`` (v1 dict) defines.

    Only ``served`` versions are routed; the storage version is listed first so that
    discovery's preferred version is the storage one.
    """
    spec = crd["spec"]
    names = spec["names"]
    served = [v for v in spec.get("versions", []) if v.get("served", True)]
    served.sort(key=lambda v: 0 if v.get("storage") else 1)
    schemas: dict[str, dict[str, Any]] = {}
    columns: dict[str, list[dict[str, Any]]] = {}
    subs: set[str] = set()
    for v in served:
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if schema is not None:
            schemas[v["name"]] = schema
        columns[v["name"]] = v.get("additionalPrinterColumns") or []
        if "status" in (v.get("subresources") or {}):
            subs.add("status")
    return ResourceType(
        group=spec["group"],
        versions=[v["name"] for v in served],
        plural=names["plural"],
        singular=names.get("singular") or names["kind"].lower(),
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        subresources=frozenset(subs),
        strategic=False,
        short_names=list(names.get("shortNames") or []),
        categories=list(names.get("categories") or []),
        schemas=schemas,
        printer_columns=columns,
        crd_name=crd["metadata"]["name"],
    )
