"""What earlier releases left in the API server, recognised as pure data.

An upgrade is one ``kubectl apply -k deploy/`` (docs/guide/upgrade.md). Objects an
earlier release created and this one no longer uses are not in ``deploy/``, so the apply
leaves them; the leading controller retires them (:mod:`controller.lifecycle`). This module
says which they are and how to recognise them; ``tests/deploy/test_api_compat.py`` accepts
the disappearance of a previous release's CRD only when it is listed here with the CRD that
replaces it, and ``tests/deploy/test_manifests.py`` checks deploy/'s RBAC against
:func:`retirement_rights` and :func:`rolling_upgrade_rights`.

Release 0.1.0 left, besides that CRD and its object, a MutatingAdmissionPolicy and binding
``podplacement-gate`` of the same names as ours: the leader overwrites them anyway, but the
binding, whose ``paramRef`` names the cluster-scoped ``ImagePlatforms cluster`` (no
namespace), is deleted before our params object exists (:func:`reads_other_params`), so that
no moment pairs our policy with a binding that looks for its params elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import GROUP, PARAMS_NAME, PARAMS_PLURAL, VERSION


@dataclass(frozen=True, slots=True)
class RetiredCRD:
    """A CRD of an earlier release that this one replaced by a CRD of another name.

    Attributes:
        group, plural, kind, scope, version: as the earlier release defined it (``scope``:
            ``Cluster`` or ``Namespaced``; ``version``: its storage version).
        last_release: the last release that installed it (``releases.toml``).
        replaced_by: the ``metadata.name`` of the CRD of this release that took its job.
        objects: the names of the objects of it the product created (cluster-scoped ones,
            or in the product's namespace).
        writer_rights: ``(verb, resource name or "*")`` that the last release's controller
            used on its objects. deploy/'s ClusterRole keeps them while an upgrade from that
            release is supported: during a rolling update the previous leader keeps leading
            until the new one takes the Lease, and without them it could no longer write its
            params object and would report its policy as not in force while it still is.
    """

    group: str
    plural: str
    kind: str
    scope: str
    last_release: str
    replaced_by: str
    objects: tuple[str, ...] = ()
    version: str = VERSION
    writer_rights: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        """The CRD's ``metadata.name``: ``<plural>.<group>``."""
        return f"{self.plural}.{self.group}"


#: Release 0.1.0's params object of the admission policy ``podplacement-gate``: the
#: cluster-scoped ``ImagePlatforms`` ``cluster``. 0.2.0 keeps the same content in the
#: namespaced ``ImagePlatformCatalog`` ``cluster`` in the product's namespace (a CRD's scope
#: never changes in place, so it took a new name).
IMAGE_PLATFORMS_0_1 = RetiredCRD(
    group=GROUP, plural="imageplatforms", kind="ImagePlatforms", scope="Cluster",
    last_release="0.1.0", replaced_by=f"{PARAMS_PLURAL}.{GROUP}", objects=(PARAMS_NAME,),
    # 0.1.0's deploy/base/rbac/controller.yaml: created once, read (get of every object:
    # the API server's condition for a policy with that paramKind), replaced whole
    writer_rights=(("create", "*"), ("get", "*"), ("update", PARAMS_NAME)))

#: Every CRD an earlier release installed that this one no longer does.
RETIRED_CRDS: tuple[RetiredCRD, ...] = (IMAGE_PLATFORMS_0_1,)

#: API group and resource of CustomResourceDefinitions.
CRD_GROUP = "apiextensions.k8s.io"
CRD_RESOURCE = "customresourcedefinitions"


def reads_other_params(live_binding: Mapping[str, Any], desired_binding: Mapping[str, Any]
                       ) -> bool:
    """True when the live MutatingAdmissionPolicyBinding ``podplacement-gate`` takes its
    params from another object than ``desired_binding`` names: a different ``paramRef``
    name or namespace, or none. Release 0.1.0's binding names ``cluster`` with no namespace
    (the cluster-scoped ``ImagePlatforms``), or has no ``paramRef`` at all (its gate-only
    variant). Such a binding is deleted before our params object is created, then created
    anew (:mod:`controller.lifecycle`)."""
    def ref(binding: Mapping[str, Any]) -> tuple[Any, Any] | None:
        found = (binding.get("spec") or {}).get("paramRef")
        if not isinstance(found, Mapping):
            return None
        return found.get("name"), found.get("namespace")

    return ref(live_binding) != ref(desired_binding)


def retire_now(retired_crd: Mapping[str, Any], replacement_crd: Mapping[str, Any] | None
               ) -> str:
    """Whether the live CRD ``retired_crd`` of an earlier release may be deleted now: ""
    when yes, else why not (one line).

    Only when the CRD that replaced it exists and is younger (``creationTimestamp``): an
    upgrade's ``kubectl apply`` creates the replacement after the earlier release made its
    own. A retired CRD younger than its replacement was created again on purpose: a
    rollback to the earlier release is under way (its ``kubectl apply -k deploy/`` runs
    while this release's controller still leads), and deleting it would break that
    release's admission policy.
    """
    name = str((retired_crd.get("metadata") or {}).get("name"))
    if replacement_crd is None:
        return f"{name} kept: the CRD that replaces it is not installed"
    born = str((retired_crd.get("metadata") or {}).get("creationTimestamp") or "")
    replaced = str((replacement_crd.get("metadata") or {}).get("creationTimestamp") or "")
    if not born or not replaced or born >= replaced:  # RFC 3339, UTC: ordered as text
        other = (replacement_crd.get("metadata") or {}).get("name")
        return (f"{name} kept: created at {born or '?'}, not before {other} ({replaced or '?'})"
                ": a rollback to the release that uses it? Once it is abandoned: kubectl "
                f"delete crd {name}")
    return ""


def retirement_rights(retired: RetiredCRD) -> list[tuple[str, str, str, str]]:
    """``(group, resource, verb, resource name)`` of the requests that retire ``retired``:
    read and delete its CRD, read the CRD replacing it (:func:`retire_now`), delete each of
    its objects. Cluster-wide rights (the CRD is cluster-scoped; so were 0.1.0's objects)."""
    rights = [(CRD_GROUP, CRD_RESOURCE, "get", retired.name),
              (CRD_GROUP, CRD_RESOURCE, "get", retired.replaced_by),
              (CRD_GROUP, CRD_RESOURCE, "delete", retired.name)]
    rights += [(retired.group, retired.plural, "delete", name) for name in retired.objects]
    return rights


def rolling_upgrade_rights(retired: RetiredCRD) -> list[tuple[str, str, str, str]]:
    """``(group, resource, verb, resource name or "*")`` that the previous release's
    controller needs on ``retired``'s objects during a rolling upgrade
    (:attr:`RetiredCRD.writer_rights`)."""
    return [(retired.group, retired.plural, verb, name)
            for verb, name in retired.writer_rights]
