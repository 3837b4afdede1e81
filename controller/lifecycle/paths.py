"""The API paths the PodPlacementConfig lifecycle reads and writes, and the declaration of
every request it sends (:data:`API_REQUESTS`, which ``tests/deploy`` checks against the RBAC
in ``deploy/`` both ways). Names only: no I/O here."""

from __future__ import annotations

from podplacement.certs import secretflow
from podplacement.controller.paramswriter import PARAMS_COLLECTION_PATH, PARAMS_PATH
from podplacement.rules import admissionpolicy, legacy, ownership
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    CONFIG_NAME,
    CONFIG_PLURAL,
    CONTROLLER_SERVICE_ACCOUNT,
    GROUP,
    VERSION,
    WEBHOOK_CONFIGURATION_NAME,
)

CONFIG_PATH = f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}/{CONFIG_NAME}"
WEBHOOK_COLLECTION_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
WEBHOOK_PATH = f"{WEBHOOK_COLLECTION_PATH}/{WEBHOOK_CONFIGURATION_NAME}"
ADMISSION_DISCOVERY_PATH = f"/apis/{admissionpolicy.GROUP_VERSION}"
POLICY_COLLECTION_PATH = f"{ADMISSION_DISCOVERY_PATH}/{admissionpolicy.POLICY_RESOURCE}"
POLICY_PATH = f"{POLICY_COLLECTION_PATH}/{ADMISSION_POLICY_NAME}"
BINDING_COLLECTION_PATH = f"{ADMISSION_DISCOVERY_PATH}/{admissionpolicy.BINDING_RESOURCE}"
BINDING_PATH = f"{BINDING_COLLECTION_PATH}/{ADMISSION_POLICY_NAME}"
NAMESPACE_PATH = "/api/v1/namespaces/{namespace}"
SERVICE_ACCOUNT_PATH = "/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
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
    """The API path of the CRD ``retired`` (:mod:`rules.legacy`)."""
    return "/".join((CRD_COLLECTION_PATH, retired.name))


def retired_object_path(retired: legacy.RetiredCRD, name: str, namespace: str) -> str:
    """The API path of the object ``name`` of ``retired`` (in ``namespace`` when the CRD was
    namespaced)."""
    scope = ("namespaces", namespace) if retired.scope == "Namespaced" else ()
    return "/".join(("", "apis", retired.group, retired.version, *scope, retired.plural, name))


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
