"""The API paths the PodPlacementConfig lifecycle reads and writes, and the declaration of
every request it sends (:data:`API_REQUESTS`, which ``tests/deploy`` checks against the RBAC
in ``deploy/`` both ways). Names only: no I/O here."""

from __future__ import annotations

from podplacement.certs import secretflow
from podplacement.controller.paramswriter import PARAMS_COLLECTION_PATH, PARAMS_PATH
from podplacement.kubeclient import group_path, resource_path
from podplacement.rules import legacy, ownership
from podplacement.rules.admit import admissionpolicy
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    CONFIG_NAME,
    CONFIG_PLURAL,
    CONTROLLER_SERVICE_ACCOUNT,
    GROUP,
    VERSION,
    WEBHOOK_CONFIGURATION_NAME,
)

#: admissionregistration.k8s.io and its version (the webhook configuration's and the policy's)
_AR, _AR_VERSION = admissionpolicy.GROUP_VERSION.split("/")
CONFIG_PATH = resource_path(GROUP, VERSION, CONFIG_PLURAL, name=CONFIG_NAME)
WEBHOOK_COLLECTION_PATH = resource_path(_AR, _AR_VERSION, "mutatingwebhookconfigurations")
WEBHOOK_PATH = resource_path(_AR, _AR_VERSION, "mutatingwebhookconfigurations",
                             name=WEBHOOK_CONFIGURATION_NAME)
ADMISSION_DISCOVERY_PATH = group_path(_AR, _AR_VERSION)
POLICY_COLLECTION_PATH = resource_path(_AR, _AR_VERSION, admissionpolicy.POLICY_RESOURCE)
POLICY_PATH = resource_path(_AR, _AR_VERSION, admissionpolicy.POLICY_RESOURCE,
                            name=ADMISSION_POLICY_NAME)
BINDING_COLLECTION_PATH = resource_path(_AR, _AR_VERSION, admissionpolicy.BINDING_RESOURCE)
BINDING_PATH = resource_path(_AR, _AR_VERSION, admissionpolicy.BINDING_RESOURCE,
                             name=ADMISSION_POLICY_NAME)
NAMESPACE_PATH = "/api/v1/namespaces/{namespace}"
SERVICE_ACCOUNT_PATH = "/api/v1/namespaces/{namespace}/serviceaccounts/{name}"


def service_account_path(namespace: str, name: str) -> str:
    """The ServiceAccount ``namespace/name`` (:data:`SERVICE_ACCOUNT_PATH` is its template),
    from checked segments (:func:`kubeclient.resource_path`).

    Raises:
        InvalidPathSegment: a segment is not acceptable.
    """
    return resource_path("", "v1", "serviceaccounts", namespace=namespace, name=name)


SELF_SUBJECT_REVIEW_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
_RBAC = "/apis/rbac.authorization.k8s.io/v1"
UNINSTALL_ROLE_COLLECTION_PATH = f"{_RBAC}/clusterroles"
UNINSTALL_ROLE_PATH = f"{UNINSTALL_ROLE_COLLECTION_PATH}/{ownership.UNINSTALL_RBAC_NAME}"
UNINSTALL_BINDING_COLLECTION_PATH = f"{_RBAC}/clusterrolebindings"
UNINSTALL_BINDING_PATH = f"{UNINSTALL_BINDING_COLLECTION_PATH}/{ownership.UNINSTALL_RBAC_NAME}"
_DEPLOY_SERVICE_ACCOUNT_PATH = SERVICE_ACCOUNT_PATH.replace("{name}", CONTROLLER_SERVICE_ACCOUNT)
CRD_COLLECTION_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


# The two paths below are built from the data of rules.legacy; the requests they
# make are declared concretely in RETIREMENT_REQUESTS (checked against deploy/'s RBAC).
def retired_crd_path(retired: legacy.RetiredCRD) -> str:
    """The API path of the CRD ``retired`` (:mod:`rules.legacy`), checked.

    Raises:
        InvalidPathSegment: the name is not an acceptable segment.
    """
    return resource_path("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                         name=retired.name)


def retired_object_path(retired: legacy.RetiredCRD, name: str, namespace: str) -> str:
    """The API path of the object ``name`` of ``retired`` (in ``namespace`` when the CRD was
    namespaced), from checked segments (:func:`kubeclient.resource_path`; ``"{namespace}"``
    gives the template :data:`RETIREMENT_REQUESTS` declares).

    Raises:
        InvalidPathSegment: a segment is not acceptable.
    """
    scoped = namespace if retired.scope == "Namespaced" else None
    return resource_path(retired.group, retired.version, retired.plural, namespace=scoped,
                         name=name)


#: What retiring the CRDs of earlier releases sends
#: (:meth:`controller.lifecycle.retirement.PreviousReleases.retire`).
RETIREMENT_REQUESTS: tuple[tuple[str, str], ...] = tuple(
    request
    for retired in legacy.RETIRED_CRDS
    for request in (
        ("GET", retired_crd_path(retired)),
        ("GET", "/".join((CRD_COLLECTION_PATH, retired.replaced_by))),
        *(("DELETE", retired_object_path(retired, name, "{namespace}"))
          for name in retired.objects),
        ("DELETE", retired_crd_path(retired)),
    )
)

#: ``(method, path template)`` of every request this package (with the certificate Secrets of
#: :class:`controller.lifecycle.cabundle.ServingCertSecret`) and :mod:`controller.leader`
#: send; ``tests/deploy`` checks the RBAC in ``deploy/`` against it.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", CONFIG_PATH),
    ("PATCH", CONFIG_PATH),
    ("PATCH", CONFIG_PATH + "/status"),
    ("GET", WEBHOOK_PATH),
    ("POST", WEBHOOK_COLLECTION_PATH),
    ("PUT", WEBHOOK_PATH),
    ("DELETE", WEBHOOK_PATH),
    ("GET", POLICY_PATH),
    ("POST", POLICY_COLLECTION_PATH),
    ("PUT", POLICY_PATH),
    ("DELETE", POLICY_PATH),
    ("GET", BINDING_PATH),
    ("POST", BINDING_COLLECTION_PATH),
    ("PUT", BINDING_PATH),
    ("DELETE", BINDING_PATH),
    ("POST", PARAMS_COLLECTION_PATH),
    ("GET", PARAMS_PATH),
    ("DELETE", PARAMS_PATH),
    ("GET", NAMESPACE_PATH),
    ("POST", SELF_SUBJECT_REVIEW_PATH),
    ("GET", _DEPLOY_SERVICE_ACCOUNT_PATH),
    ("PATCH", _DEPLOY_SERVICE_ACCOUNT_PATH),
    ("GET", UNINSTALL_ROLE_PATH),
    ("POST", UNINSTALL_ROLE_COLLECTION_PATH),
    ("PUT", UNINSTALL_ROLE_PATH),
    ("GET", UNINSTALL_BINDING_PATH),
    ("POST", UNINSTALL_BINDING_COLLECTION_PATH),
    ("PUT", UNINSTALL_BINDING_PATH),
    *RETIREMENT_REQUESTS,
    *secretflow.API_REQUESTS,
)
