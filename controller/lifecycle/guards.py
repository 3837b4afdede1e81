"""The uninstall guards: what lets an ordered uninstall outlive ``deploy/``'s RBAC when
``kubectl delete -k deploy/`` deletes the config, the product's namespace and the
controller's ServiceAccount at once (:mod:`rules.ownership`'s rules): the
finalizer on the controller's own ServiceAccount and the ClusterRole and binding
``podplacement-controller-uninstall``. Also reads the two objects whose deletion means the
product itself is being removed: the product's namespace and that ServiceAccount."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from podplacement.controller.lifecycle.objects import (
    apply_object,
    get_or_none,
    patch_finalizer,
    replacement,
)
from podplacement.controller.lifecycle.paths import (
    SELF_SUBJECT_REVIEW_PATH,
    UNINSTALL_BINDING_COLLECTION_PATH,
    UNINSTALL_BINDING_PATH,
    UNINSTALL_ROLE_COLLECTION_PATH,
    UNINSTALL_ROLE_PATH,
    service_account_path,
)
from podplacement.kubeclient import ApiError, KubeRequester, namespace_path
from podplacement.rules import ownership

log = logging.getLogger(__name__)


class UninstallGuards:
    """The controller's identity and the guards of the ordered uninstall: :meth:`ensure`
    puts them in place, :meth:`release_service_account` removes the ServiceAccount's
    finalizer; :meth:`get_namespace` and :meth:`get_service_account` read the two objects
    the lifecycle watches for the product's removal.

    API: ``POST`` a SelfSubjectReview (once, when the ServiceAccount was not given);
    ``GET`` the product's Namespace; ``GET`` and ``PATCH`` (finalizer) the controller's
    ServiceAccount; ``GET``, ``POST``, ``PUT`` the uninstall ClusterRole and binding.
    Errors: :class:`ApiError` from the reads (403 reads as absent) and
    :meth:`release_service_account`; :meth:`ensure` never raises, it reports in
    :attr:`problem`.

    Args:
        api: a :class:`kubeclient.KubeAPI` (or anything with its ``request``).
        namespace: the product's namespace.
        service_account: ``(namespace, name)`` of the controller's own ServiceAccount; None:
            found with a SelfSubjectReview (no guards when the controller does not run as a
            ServiceAccount, e.g. with an admin kubeconfig).
    """

    def __init__(self, api: KubeRequester, *, namespace: str,
                 service_account: tuple[str, str] | None) -> None:
        self.api = api
        self.namespace = namespace
        self._service_account = service_account
        self._identity_known = service_account is not None
        #: the last problem with the guards ("" when they are in place or not applicable)
        self.problem = ""

    async def identity(self) -> tuple[str, str] | None:
        """``(namespace, name)`` of the ServiceAccount this controller runs as (a
        SelfSubjectReview, asked once), or None when it runs as another user or the API
        server cannot tell."""
        if self._identity_known:
            return self._service_account
        try:
            review = await self.api.request(
                "POST", SELF_SUBJECT_REVIEW_PATH,
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        except ApiError as exc:
            if exc.status in (403, 404, 405):
                self._identity_known = True
                return None
            raise
        user = str(((review or {}).get("status") or {}).get("userInfo", {}).get("username")
                   or "")
        self._service_account = ownership.service_account_of(user)
        self._identity_known = True
        if self._service_account is None:
            log.info("running as %r, not a ServiceAccount: no uninstall guards", user)
        return self._service_account

    async def get_service_account(self) -> dict[str, Any] | None:
        """The controller's ServiceAccount; None when absent, not readable (403) or the
        controller runs as no ServiceAccount."""
        ref = await self.identity()
        if ref is None:
            return None
        try:
            return await get_or_none(self.api, service_account_path(*ref))
        except ApiError as exc:
            if exc.status == 403:
                return None
            raise

    async def get_namespace(self) -> dict[str, Any] | None:
        """The product's Namespace; None when absent or not readable (403)."""
        try:
            return await get_or_none(self.api, namespace_path(self.namespace))
        except ApiError as exc:
            if exc.status == 403:
                return None
            raise

    async def ensure(self, namespace_obj: Mapping[str, Any] | None,
                     service_account: dict[str, Any] | None) -> None:
        """While a config is in force and this controller leads: the finalizer on its
        ServiceAccount (``service_account``, as last read) and the uninstall ClusterRole and
        binding, owned by the product's Namespace ``namespace_obj``
        (:mod:`rules.ownership`). Failures are reported in :attr:`problem` (the
        status's Degraded condition), never raised: gating works without them, only an
        uninstall by ``kubectl delete -k`` would then lose its rights half-way. A 403 while
        the ServiceAccount is being deleted is no failure: the removal has begun, the guards
        stand (they were applied by an earlier pass), and the next pass uninstalls."""
        ref = self._service_account
        if service_account is None or ref is None:
            self.problem = ""
            return
        owner = ownership.namespace_owner(namespace_obj)
        try:
            await apply_object(self.api, UNINSTALL_ROLE_COLLECTION_PATH, UNINSTALL_ROLE_PATH,
                               ownership.uninstall_role(ref[1], owner),
                               drifted=ownership.rbac_drifted, update_body=replacement)
            await apply_object(self.api, UNINSTALL_BINDING_COLLECTION_PATH,
                               UNINSTALL_BINDING_PATH,
                               ownership.uninstall_binding(ref[0], ref[1], owner),
                               drifted=ownership.rbac_drifted, update_body=replacement)
            await patch_finalizer(
                self.api, service_account_path(*ref),
                service_account, add=True)
        except ApiError as exc:
            if exc.status == 403 and await self._removal_under_way():
                # deploy/'s RBAC went while this pass was in flight (``kubectl delete -k``
                # deletes the ServiceAccount before the ClusterRoleBindings). The guards
                # stand: the ServiceAccount can only be "being deleted" while it holds our
                # finalizer, which an earlier pass added after the role and the binding.
                # The next pass runs the ordered uninstall under them.
                log.info("uninstall guards not re-applied: the controller's ServiceAccount "
                         "is being deleted, the ordered uninstall follows")
                self.problem = ""
                return
            self.problem = f"uninstall guards: {exc}"
            log.warning("%s", self.problem)
            return
        self.problem = ""

    async def _removal_under_way(self) -> bool:
        """True when the controller's ServiceAccount, read again now (the uninstall
        ClusterRole grants that read), is being deleted."""
        try:
            return ownership.deleting(await self.get_service_account())
        except ApiError:
            return False

    async def release_service_account(self) -> None:
        """Remove our finalizer from the controller's ServiceAccount (when it has it)."""
        ref = self._service_account
        if ref is None:
            return
        path = service_account_path(*ref)
        live = await get_or_none(self.api, path)
        if live is not None and await patch_finalizer(self.api, path, live,
                                                      add=False) is not live:
            log.info("released the finalizer of ServiceAccount %s/%s", *ref)
