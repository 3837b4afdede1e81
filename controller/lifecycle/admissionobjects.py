"""The objects that gate pods at admission: the MutatingAdmissionPolicy and its binding
``podplacement-gate``, the binding's params object (the ImagePlatformCatalog ``cluster`` in
the product's namespace) and the MutatingWebhookConfiguration ``podplacement-webhook``.

:class:`AdmissionObjects` converges them to what the config asks for and deletes them; what
they should be is :mod:`rules.admit.admissionpolicy`'s and
:mod:`rules.admit.webhookconfig`'s (pure), the upgrade rule for a binding of an earlier
release is :func:`rules.legacy.reads_other_params`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from podplacement.controller.lifecycle.cabundle import CaBundleSource, read_ca_bundle
from podplacement.controller.lifecycle.objects import apply_object, get_or_none, replacement
from podplacement.controller.lifecycle.paths import (
    ADMISSION_DISCOVERY_PATH,
    BINDING_COLLECTION_PATH,
    BINDING_PATH,
    POLICY_COLLECTION_PATH,
    POLICY_PATH,
    WEBHOOK_COLLECTION_PATH,
    WEBHOOK_PATH,
)
from podplacement.controller.paramswriter import params_collection_path, params_path
from podplacement.kubeclient import ApiError, KubeRequester, NotFound
from podplacement.rules import legacy
from podplacement.rules.admit import admissionpolicy
from podplacement.rules.admit.webhookconfig import (
    CERT_MANAGER_INJECT_ANNOTATION,
    ServiceRef,
    WebhookNamespaceSelection,
    desired_webhook_configuration,
    webhook_drifted,
)
from podplacement.rules.config import (
    ADMISSION_AUTO,
    ADMISSION_POLICY_NAME,
    PARAMS_NAME,
    WEBHOOK_CONFIGURATION_NAME,
    PlacementConfig,
)

log = logging.getLogger(__name__)

#: What :meth:`AdmissionObjects.apply` leaves at admission: our policy in force, no policy,
#: or a policy and binding as another writer (an earlier release, or an earlier pass) left
#: them, which may still gate or place pods.
POLICY_IN_FORCE = "in-force"
POLICY_ABSENT = "absent"
POLICY_AS_LEFT = "as-left"


class AdmissionObjects:
    """The admission policy, its binding, its params object and the webhook configuration:
    :meth:`apply` converges them (policy first, then the webhook configuration, which skips
    the pods the policy placed), the ``delete_*`` methods remove them.

    API: discovery ``GET /apis/admissionregistration.k8s.io/v1`` (once it shows the policy
    API, remembered); ``GET``, ``POST``, ``PUT``, ``DELETE`` of the policy, the binding and
    the webhook configuration; ``GET``, ``POST``, ``DELETE`` of the params object.
    Errors: :class:`ApiError` from every method but :meth:`apply`'s policy part (reported as
    its problem); whatever the CA bundle source raises.

    Args:
        api: a :class:`kubeclient.KubeAPI` (or anything with its ``request``).
        namespace: the product's namespace (holds the params object; excluded from gating).
        service: the webhook Service, or ``url``: the webhook's URL (exactly one).
        ca_bundle: the CA bundle source (:mod:`controller.lifecycle.cabundle`); None only with
            ``cert_manager_certificate``.
        cert_manager_certificate: ``<namespace>/<Certificate>`` when cert-manager injects the CA.
        timeout_seconds: the webhook's call timeout.
        before_params_delete: awaited before the params object is deleted.
    """

    def __init__(
        self, api: KubeRequester, *, namespace: str, service: ServiceRef | None,
        url: str | None, ca_bundle: bytes | CaBundleSource | None,
        cert_manager_certificate: str | None, timeout_seconds: int,
        before_params_delete: Callable[[], Awaitable[None]] | None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.service = service
        self.url = url
        self._ca_source = ca_bundle
        self.cert_manager_certificate = cert_manager_certificate
        self.timeout_seconds = timeout_seconds
        self.before_params_delete = before_params_delete
        self.params_path = params_path(namespace)
        self.params_collection_path = params_collection_path(namespace)
        self._policy_api = False
        #: whether the policy may exist (None: not known yet): no DELETE per resync
        self._policy_present: bool | None = None

    @property
    def policy_may_exist(self) -> bool:
        """False only when this process knows the policy and its binding are absent."""
        return self._policy_present is not False

    async def apply(
        self, config: dict[str, Any], placement: PlacementConfig,
        selection: WebhookNamespaceSelection, owner: Sequence[Mapping[str, Any]],
    ) -> tuple[str, str, str]:
        """Converge the admission policy, then the webhook configuration of ``config``
        (parsed: ``placement``, its namespaces: ``selection``; owned by ``owner``), which
        skips the pods the policy placed while the policy and its params object are in force
        (:func:`rules.admit.webhookconfig.object_selector`).

        Returns:
            ``(the webhook's action, what is in force of the policy, the policy's problem)``:
            :data:`POLICY_IN_FORCE`, :data:`POLICY_ABSENT` or :data:`POLICY_AS_LEFT`, and ""
            when no problem.

        Raises:
            ApiError: the webhook configuration could not be written.
            Exception: whatever the CA bundle source raised.
        """
        # The policy first: the webhook configuration skips the pods it placed only while
        # the policy has a params object to run with (read or created in this pass).
        policy, problem, catalog_uid = await self._apply_policy(placement, selection, owner)
        skip_placed = bool(policy == POLICY_IN_FORCE and catalog_uid
                           and admissionpolicy.places(placement))
        desired = desired_webhook_configuration(
            config, ca_bundle=await self._ca_bundle(), service=self.service, url=self.url,
            own_namespace=self.namespace, timeout_seconds=self.timeout_seconds,
            cert_manager_certificate=self.cert_manager_certificate, owner=owner,
            skip_placed=skip_placed)
        applied = await apply_object(self.api, WEBHOOK_COLLECTION_PATH, WEBHOOK_PATH, desired,
                                     drifted=webhook_drifted, update_body=_webhook_update_body)
        return applied.action, policy, problem

    async def _ca_bundle(self) -> bytes | None:
        if self.cert_manager_certificate:
            return None
        return await read_ca_bundle(self._ca_source)

    async def _policy_served(self) -> bool:
        """True when the API server serves ``mutatingadmissionpolicies`` in
        ``admissionregistration.k8s.io/v1`` (discovery; once True, remembered)."""
        if self._policy_api:
            return True
        try:
            doc = await self.api.request("GET", ADMISSION_DISCOVERY_PATH)
        except ApiError as exc:
            if exc.status in (403, 404):
                return False
            raise
        names = {r.get("name") for r in (doc or {}).get("resources") or []
                 if isinstance(r, Mapping)}
        self._policy_api = {admissionpolicy.POLICY_RESOURCE,
                            admissionpolicy.BINDING_RESOURCE} <= names
        return self._policy_api

    async def _apply_policy(self, placement: PlacementConfig,
                            selection: WebhookNamespaceSelection,
                            owner: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
        """Converge the MutatingAdmissionPolicy, its params object and its binding: present
        when ``spec.admission.mechanism`` of the parsed config ``placement`` is ``Auto`` and
        the API server serves the API, absent otherwise.

        A live binding that takes its params from elsewhere (release 0.1.0's names the
        cluster-scoped ``ImagePlatforms``: :func:`rules.legacy.reads_other_params`)
        is deleted first, before the policy is rewritten and before our params object can
        exist, and created anew last: no moment pairs our policy with a binding that looks
        for its params elsewhere, and none lets the old binding read our params.

        Returns:
            ``(what is in force, problem, params uid)``: :data:`POLICY_IN_FORCE` or
            :data:`POLICY_ABSENT`, "" and the uid of the params object as read or created in
            this pass ("" when none); after
            an API error (reported as the problem, not raised: the webhook keeps gating),
            :data:`POLICY_AS_LEFT` when a binding ``podplacement-gate`` may still be there
            (found, or unknown), else :data:`POLICY_ABSENT`.
        """
        try:
            if not await self._policy_served():
                return POLICY_ABSENT, "", ""
            if placement.admission_mechanism != ADMISSION_AUTO:
                await self.delete_policy()
                return POLICY_ABSENT, "", ""
            binding = admissionpolicy.desired_binding(selection, params_namespace=self.namespace,
                                                      owner=owner)
            live = await get_or_none(self.api, BINDING_PATH)
            if live is not None and legacy.reads_other_params(live, binding):
                await self._delete_binding()
                log.info("deleted MutatingAdmissionPolicyBinding %s: its paramRef %s is not "
                         "ours (an earlier release's)", ADMISSION_POLICY_NAME,
                         (live.get("spec") or {}).get("paramRef"))
            await apply_object(self.api, POLICY_COLLECTION_PATH, POLICY_PATH,
                               admissionpolicy.desired_policy(placement, owner),
                               drifted=admissionpolicy.policy_drifted, update_body=replacement)
            self._policy_present = True
            # Before the binding: the API server skips the policy while its params object is
            # missing (pods pass unplaced and ungated; the webhook then gates them).
            params = await apply_object(self.api, self.params_collection_path, self.params_path,
                                        admissionpolicy.params_object(self.namespace),
                                        drifted=admissionpolicy.never_drifted,
                                        update_body=replacement)
            await apply_object(self.api, BINDING_COLLECTION_PATH, BINDING_PATH, binding,
                               drifted=admissionpolicy.policy_drifted, update_body=replacement)
        except ApiError as exc:
            log.warning("admission policy %s: %s", ADMISSION_POLICY_NAME, exc)
            left = POLICY_AS_LEFT if await self._binding_may_exist() else POLICY_ABSENT
            return left, f"MutatingAdmissionPolicy {ADMISSION_POLICY_NAME}: {exc}", ""
        uid = (params.obj.get("metadata") or {}).get("uid")
        return POLICY_IN_FORCE, "", uid if isinstance(uid, str) else ""

    async def _binding_may_exist(self) -> bool:
        """After a failure: whether a binding ``podplacement-gate`` may be in the API server
        (found, or not readable: never claim it is gone without knowing)."""
        try:
            return await get_or_none(self.api, BINDING_PATH) is not None
        except ApiError:
            return True

    async def _delete_binding(self) -> None:
        """Delete the binding ``podplacement-gate`` (absent is fine)."""
        try:
            await self.api.request("DELETE", BINDING_PATH)
        except NotFound:
            return

    async def delete_policy(self) -> None:
        """Delete the binding, then the policy, unless they are known to be absent (absent
        ones, or an API server without them, are fine)."""
        if self._policy_present is False:
            return
        for path in (BINDING_PATH, POLICY_PATH):
            try:
                await self.api.request("DELETE", path)
                log.info("deleted %s", path)
            except ApiError as exc:
                if exc.status not in (404, 405):
                    raise
        self._policy_present = False

    async def delete_params(self) -> bool:
        """Delete the params object (after ``before_params_delete``); True when it was
        there. 404 (absent, or its CRD gone) is fine."""
        if self.before_params_delete is not None:
            await self.before_params_delete()
        try:
            await self.api.request("DELETE", self.params_path)
        except ApiError as exc:
            if exc.status in (404, 405):
                return False
            raise
        log.info("deleted ImagePlatformCatalog %s/%s", self.namespace, PARAMS_NAME)
        return True

    async def delete_webhook(self) -> bool:
        """Delete the webhook configuration; True when it was there."""
        try:
            await self.api.request("DELETE", WEBHOOK_PATH)
        except NotFound:
            return False
        log.info("deleted MutatingWebhookConfiguration %s", WEBHOOK_CONFIGURATION_NAME)
        return True


def _webhook_update_body(live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The PUT body of the webhook configuration: the live object's metadata
    (resourceVersion precondition, foreign labels and annotations kept) with ours merged in,
    and our webhooks. In cert-manager mode the live caBundle (cert-manager's) is carried
    over."""
    meta = dict(live.get("metadata") or {})
    d_meta = desired.get("metadata") or {}
    for field in ("labels", "annotations"):
        merged = dict(meta.get(field) or {})
        merged.update(d_meta.get(field) or {})
        if merged:
            meta[field] = merged
    if d_meta.get("ownerReferences"):
        meta["ownerReferences"] = d_meta["ownerReferences"]
    meta.pop("managedFields", None)
    webhooks = [dict(w) for w in desired.get("webhooks") or []]
    if CERT_MANAGER_INJECT_ANNOTATION in (d_meta.get("annotations") or {}):
        live_ca = {
            w.get("name"): (w.get("clientConfig") or {}).get("caBundle")
            for w in live.get("webhooks") or []
        }
        for w in webhooks:
            ca = live_ca.get(w["name"])
            if ca:
                w["clientConfig"] = {**w["clientConfig"], "caBundle": ca}
    return {
        "apiVersion": desired["apiVersion"],
        "kind": desired["kind"],
        "metadata": meta,
        "webhooks": webhooks,
    }
