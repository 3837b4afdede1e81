"""What earlier releases left in the API server and this one no longer uses
(:data:`rules.legacy.RETIRED_CRDS`: release 0.1.0's cluster-scoped params object
``ImagePlatforms cluster`` and its CRD), removed by every pass while it is there
(docs/guide/upgrade.md)."""

from __future__ import annotations

import contextlib
import logging

from podplacement.controller.lifecycle.objects import get_or_none
from podplacement.controller.lifecycle.paths import (
    CRD_COLLECTION_PATH,
    retired_crd_path,
    retired_object_path,
)
from podplacement.kubeclient import ApiError, KubeRequester, NotFound
from podplacement.rules import legacy

log = logging.getLogger(__name__)


class PreviousReleases:
    """Retires the CRDs of earlier releases and their objects (:meth:`retire`).

    API: ``GET`` of each retired CRD and of the CRD that replaced it, ``DELETE`` of the
    retired objects and CRD (:data:`controller.lifecycle.paths.RETIREMENT_REQUESTS`).
    Errors: none raised; a failure is returned as the problem of the pass.

    Args:
        api: a :class:`kubeclient.KubeAPI` (or anything with its ``request``).
        namespace: the product's namespace (where a retired namespaced object lived).
    """

    def __init__(self, api: KubeRequester, *, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    async def retire(self) -> str:
        """Remove what earlier releases left and this one no longer uses: for each retired
        CRD still there, not already being deleted and older than the CRD that replaced it
        (:func:`rules.legacy.retire_now`: a younger one belongs to a rollback
        under way), its objects, then the CRD. Deleting the objects first makes a binding of
        that release which could not be removed harmless (its params object is missing, so
        the API server skips its policy). One GET per CRD and pass when there is nothing to
        do.

        Returns:
            "" when done (or nothing was left), else the problem (the status's Degraded
            condition; the next pass tries again). Never raises an ApiError.
        """
        problems = []
        for retired in legacy.RETIRED_CRDS:
            try:
                crd = await get_or_none(self.api, retired_crd_path(retired))
                if crd is None or (crd.get("metadata") or {}).get("deletionTimestamp"):
                    continue
                replacement = await get_or_none(
                    self.api, "/".join((CRD_COLLECTION_PATH, retired.replaced_by)))
                kept = legacy.retire_now(crd, replacement)
                if kept:
                    problems.append(kept)
                    continue
                for name in retired.objects:
                    path = retired_object_path(retired, name, self.namespace)
                    with contextlib.suppress(NotFound):
                        await self.api.request("DELETE", path)
                        log.info("deleted %s %s of release %s", retired.kind, name,
                                 retired.last_release)
                with contextlib.suppress(NotFound):
                    await self.api.request("DELETE", retired_crd_path(retired))
                    log.info("deleted CustomResourceDefinition %s of release %s (replaced by "
                             "%s)", retired.name, retired.last_release, retired.replaced_by)
            except ApiError as exc:
                log.warning("removing %s of release %s: %s", retired.name,
                            retired.last_release, exc)
                problems.append(f"could not remove {retired.name} of release "
                                f"{retired.last_release}: {exc}")
        return "; ".join(problems)
