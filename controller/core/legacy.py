"""What earlier releases left in the API server, recognised as pure data.

An upgrade is one ``kubectl apply -k deploy/`` (README, "Releases and upgrades"). Objects an
earlier release created and this one no longer uses are not in ``deploy/``, so the apply
leaves them; the leading controller retires them (:mod:`controller.lifecycle`). This module
says which they are; ``tests/deploy/test_api_compat.py`` accepts the disappearance of a
previous release's CRD only when it is listed here with the CRD that replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from podplacement.controller.core.config import GROUP, PARAMS_NAME, PARAMS_PLURAL


@dataclass(frozen=True, slots=True)
class RetiredCRD:
    """A CRD of an earlier release that this one replaced by a CRD of another name.

    Attributes:
        group, plural, kind, scope: as the earlier release defined it (``scope``:
            ``Cluster`` or ``Namespaced``).
        last_release: the last release that installed it (``releases.toml``).
        replaced_by: the ``metadata.name`` of the CRD of this release that took its job.
        objects: the names of the objects of it the product created (cluster-scoped ones,
            or in the product's namespace).
    """

    group: str
    plural: str
    kind: str
    scope: str
    last_release: str
    replaced_by: str
    objects: tuple[str, ...] = ()

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
    last_release="0.1.0", replaced_by=f"{PARAMS_PLURAL}.{GROUP}", objects=(PARAMS_NAME,))

#: Every CRD an earlier release installed that this one no longer does.
RETIRED_CRDS: tuple[RetiredCRD, ...] = (IMAGE_PLATFORMS_0_1,)
