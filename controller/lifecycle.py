"""PodPlacementConfig lifecycle: finalizers, the owned admission objects, status conditions,
the ordered uninstall and the last controller's stand-down.

:class:`Lifecycle` reconciles the singleton ``PodPlacementConfig`` ``cluster`` like a
controller-runtime reconciler: read the config, compute what should exist, write only the
difference, and report through ``status.conditions``. It runs in the elected leader only
(:mod:`controller.leader`); the app calls :meth:`Lifecycle.notify` on every config watch event
and :meth:`Lifecycle.run` also resyncs periodically, which is how drift of the webhook
configuration (someone edits or deletes it) is reverted: at most ``resync_seconds`` later.

Rules (README, "Uninstall"; the ownership rules are :mod:`controller.ownership`'s):

* While the config exists (and nothing is being deleted) it carries the finalizer
  ``podplacement.io/finalizer``; the MutatingWebhookConfiguration ``podplacement-webhook``,
  the MutatingAdmissionPolicy and binding ``podplacement-gate`` (owned by the product's
  Namespace) and the params object (in the product's namespace) exist; the controller's own
  ServiceAccount carries the same finalizer and the uninstall ClusterRole and binding exist.
* No config: the webhook configuration and the policy are deleted.
* The config, the product's namespace or the controller's ServiceAccount being deleted
  (``kubectl delete -k deploy/`` does all three at once): the ordered uninstall. Status
  ``Deprovisioning=True``; the policy, the params object and the webhook configuration are
  deleted (no new pod gets gated), then ``ungate_remaining(deadline_seconds)`` (normal
  decisions within the deadline, plain ungate after it) releases every pod still gated, then
  the config's finalizer is removed, and when the controller itself is being removed, the
  ServiceAccount's finalizer last. It runs to its end even when the lease is lost (the
  namespace's deletion deletes the Lease) or the process is asked to stop.
* Shutdown of one controller (:meth:`Lifecycle.stop`, graceful or not) leaves everything in
  place: it belongs to the installed config, not to one process (deleting the webhook
  configuration on a rolling update let pods created during the handover escape the gate).
  The next leader re-processes every pod still gated. But the **last** controller to stop
  gracefully (no other took the lease: the Deployment scaled to 0, its pods evicted with
  replacements that cannot start) stands down (:meth:`Lifecycle.last_stop`): it deletes the
  params object, so the API server stops gating, releases every gated pod, says so in the
  status and removes the finalizers no live controller would honour.

Status conditions (metav1.Condition, ``observedGeneration`` on each and on ``status``):
``Available`` (webhook configuration in place), ``Progressing`` (a change or an uninstall is
under way, or the last attempt failed and will be retried), ``Degraded`` (invalid config, a
namespaceSelector that the webhook cannot express exactly, no CA bundle, API errors) and
``Deprovisioning`` (ordered uninstall running). ``lastTransitionTime`` changes only when a
condition's status changes; the status is written only when something changed.

CA bundle sources: bytes, a callable returning bytes (sync or async) such as
:func:`ca_bundle_from_dir` (``certs.load_bundle``) or :class:`ServingCertSecret` (the built-in
flow used by ``deploy/``, :mod:`certs.secretflow`: the leader keeps a CA in one Secret and the
webhook's serving certificate in another, which the webhook pods mount, and renews the CA in
two steps with an overlap window, see :mod:`certs.rotation`), or ``None`` with
``cert_manager_certificate`` set (cert-manager's CA injector owns ``caBundle``; we add its
``cert-manager.io/inject-ca-from`` annotation and never touch ``caBundle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import certs
from certs import secretflow

# The certificate Secrets' names, where the deploy tests and the rotation tests look for them.
from certs.secretflow import CA_SECRET_NAME as CA_SECRET_NAME
from certs.secretflow import TLS_SECRET_NAME as TLS_SECRET_NAME
from certs.secretflow import WEBHOOK_SERVICE_NAME as WEBHOOK_SERVICE_NAME
from controller import admissionpolicy, ownership
from controller.config import (
    ADMISSION_AUTO,
    ADMISSION_POLICY_NAME,
    CONFIG_NAME,
    CONFIG_PLURAL,
    CONTROLLER_SERVICE_ACCOUNT,
    GROUP,
    PARAMS_NAME,
    VERSION,
    WEBHOOK_CONFIGURATION_NAME,
    ConfigError,
    PlacementConfig,
)
from controller.paramswriter import PARAMS_COLLECTION_PATH, PARAMS_PATH, params_path
from controller.webhookconfig import (
    CERT_MANAGER_INJECT_ANNOTATION,
    ServiceRef,
    WebhookNamespaceSelection,
    desired_webhook_configuration,
    webhook_drifted,
    webhook_namespace_selection,
)
from kubeclient import JSON_PATCH, MERGE_PATCH, ApiError, KubeRequester, NotFound, api_error

log = logging.getLogger(__name__)

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

COND_AVAILABLE = "Available"
#: ``status.admission.mechanism``: what adds the gate (and places warm pods) at admission.
ADMISSION_MECHANISM_POLICY = "MutatingAdmissionPolicy"
ADMISSION_MECHANISM_WEBHOOK = "Webhook"
COND_PROGRESSING = "Progressing"
COND_DEGRADED = "Degraded"
COND_DEPROVISIONING = "Deprovisioning"
CONDITION_TYPES = (COND_AVAILABLE, COND_PROGRESSING, COND_DEGRADED, COND_DEPROVISIONING)

#: ``(method, path template)`` of every request this module (with the certificate Secrets of
#: :class:`ServingCertSecret`) and :mod:`controller.leader` send; ``tests/deploy`` checks the
#: RBAC in ``deploy/`` against it.
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
    *secretflow.API_REQUESTS,
)


CaBundleSource = Callable[[], bytes | Awaitable[bytes]]
UngateRemaining = Callable[[float], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """A wanted condition: ``status`` is ``"True"``, ``"False"`` or ``"Unknown"``."""

    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What one :meth:`Lifecycle.reconcile` pass found and did.

    Attributes:
        state: ``absent`` (no config), ``available``, ``uninstalled`` (finalizer released),
            ``deleting`` (being deleted without our finalizer).
        webhook: ``created``, ``updated``, ``unchanged``, ``deleted`` or ``absent``.
        status_written: the status subresource was patched.
        ungated: pods the uninstall callback released (uninstall only).
        degraded: the Degraded reason, "" when not degraded.
    """

    state: str
    webhook: str
    status_written: bool = False
    ungated: int = 0
    degraded: str = ""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    existing: Sequence[Mapping[str, Any]] | None,
    wanted: Sequence[ConditionSpec],
    *,
    generation: int,
    now: dt.datetime,
) -> list[dict[str, Any]]:
    """Return the new ``status.conditions`` list (metav1.Condition semantics).

    Conditions in ``wanted`` replace those of the same type; ``lastTransitionTime`` is kept
    when the status did not change, else set to ``now``. Conditions of other types are kept.
    Order: :data:`CONDITION_TYPES` first, then the others as they were.
    """
    old = {str(c.get("type")): dict(c) for c in existing or [] if isinstance(c, Mapping)}
    out: dict[str, dict[str, Any]] = {}
    for spec in wanted:
        prev = old.get(spec.type)
        ltt = prev.get("lastTransitionTime") if prev and prev.get("status") == spec.status else None
        out[spec.type] = {
            "type": spec.type,
            "status": spec.status,
            "reason": spec.reason,
            "message": spec.message,
            "lastTransitionTime": ltt or _rfc3339(now),
            "observedGeneration": generation,
        }
    for type_, cond in old.items():
        out.setdefault(type_, cond)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out.values(), key=lambda c: order.get(str(c["type"]), len(order)))


def ca_bundle_from_dir(cert_dir: str) -> CaBundleSource:
    """A CA bundle source reading ``certs.load_bundle(cert_dir)`` (every CA currently trusted,
    PEM) on each call, so a rotated bundle reaches the webhook configuration on the next
    resync. Raises on call whatever ``certs.load_bundle`` raises (e.g. OSError)."""

    def load() -> bytes:
        return certs.load_bundle(cert_dir)

    return load


class Lifecycle:
    """Reconciler of the PodPlacementConfig ``cluster`` (see the module docstring).

    Args:
        api: a :class:`kubeclient.KubeAPI` (or anything with its ``request``).
        namespace: podplacement's own namespace (excluded from gating; holds the params
            object; owner of the cluster-scoped objects we create).
        service: the webhook Service ``(namespace, name, port, path)``, or
        url: the webhook's ``https://`` URL (exactly one).
        ca_bundle: bytes or a (sync or async) callable returning the PEM CA bundle; None only
            with ``cert_manager_certificate``.
        cert_manager_certificate: ``<namespace>/<Certificate>`` when cert-manager injects the CA.
        ungate_remaining: ``callback(deadline_seconds) -> pods ungated``, run during uninstall
            and stand-down.
        before_params_delete: awaited before the params object is deleted (the app stops its
            params writer, which would otherwise create the object again).
        uninstall_deadline_seconds: passed to ``ungate_remaining`` by the ordered uninstall.
        admission_settle_seconds: wait after deleting the admission policy, the webhook
            configuration or the params object before releasing the gated pods (the API
            server's admission chain follows the deletion through informers, within about a
            second).
        resync_seconds: period of the drift check in :meth:`run`.
        timeout_seconds: the webhook's call timeout.
        service_account: ``(namespace, name)`` of the controller's own ServiceAccount; None:
            found with a SelfSubjectReview (no guards when the controller does not run as a
            ServiceAccount, e.g. with an admin kubeconfig).

    Raises:
        ValueError: inconsistent arguments.
    """

    def __init__(
        self,
        api: KubeRequester,
        *,
        namespace: str,
        service: ServiceRef | tuple[str, str, int, str] | None = None,
        url: str | None = None,
        ca_bundle: bytes | CaBundleSource | None = None,
        cert_manager_certificate: str | None = None,
        ungate_remaining: UngateRemaining | None = None,
        before_params_delete: Callable[[], Awaitable[None]] | None = None,
        uninstall_deadline_seconds: float = 60.0,
        admission_settle_seconds: float = 2.0,
        resync_seconds: float = 10.0,
        timeout_seconds: int = 5,
        max_backoff: float = 30.0,
        service_account: tuple[str, str] | None = None,
    ) -> None:
        if (service is None) == (url is None):
            raise ValueError("give exactly one of service= or url=")
        if ca_bundle is None and not cert_manager_certificate:
            raise ValueError("ca_bundle is required unless cert_manager_certificate is set")
        self.api = api
        self.namespace = namespace
        self.service = ServiceRef(*service) if service is not None else None
        self.url = url
        self._ca_source = ca_bundle
        self.cert_manager_certificate = cert_manager_certificate
        self.ungate_remaining = ungate_remaining
        self.before_params_delete = before_params_delete
        self.uninstall_deadline_seconds = uninstall_deadline_seconds
        self.admission_settle_seconds = admission_settle_seconds
        self.resync_seconds = resync_seconds
        self.timeout_seconds = timeout_seconds
        self.max_backoff = max_backoff
        self.last_result: ReconcileResult | None = None
        self.params_path = params_path(namespace)
        self.params_collection_path = PARAMS_COLLECTION_PATH.format(namespace=namespace)
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._uninstall_task: asyncio.Task[ReconcileResult] | None = None
        self._uninstall_failures = 0
        self._policy_api = False
        #: whether the policy may exist (None: not known yet): no DELETE per resync
        self._policy_present: bool | None = None
        self._service_account = service_account
        self._identity_known = service_account is not None
        #: the last problem with the guards ("" when they are in place or not applicable)
        self.guard_problem = ""

    # --- public API ---------------------------------------------------------------------
    def notify(self) -> None:
        """Ask :meth:`run` for a reconcile now (call it from the config watch handler)."""
        self._wake.set()

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a task (idempotent) and return it."""
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.create_task(self.run(), name="podplacement lifecycle")
        return self._task

    async def run(self) -> None:
        """Reconcile on every :meth:`notify` and every ``resync_seconds`` until :meth:`stop`.

        Errors are logged and retried with exponential backoff (jittered, capped at
        ``max_backoff``); this coroutine returns only when stopped or cancelled.
        """
        backoff = 0.5
        while not self._stopping:
            self._wake.clear()
            delay = self.resync_seconds
            try:
                self.last_result = await self.reconcile()
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("lifecycle reconcile failed: %s", exc)
                delay = min(delay, backoff * (0.5 + random.random()))
                backoff = min(self.max_backoff, backoff * 2)
            if self._stopping:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def stop(self) -> None:
        """Stop :meth:`run`. The webhook configuration stays: it exists while the config
        does, whichever controller process leads (only the ordered uninstall deletes it).
        An ordered uninstall under way is not cut short: it runs to its end (bounded by
        ``uninstall_deadline_seconds`` plus a margin), leader or not, because a namespace
        being deleted also deletes the leader-election Lease."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.wait_uninstall()

    async def wait_uninstall(self) -> ReconcileResult | None:
        """Wait for an ordered uninstall under way, if any (at most
        ``uninstall_deadline_seconds`` + 30 s); its result, or None (none, failed, or
        too slow)."""
        task = self._uninstall_task
        if task is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(task),
                                          self.uninstall_deadline_seconds + 30.0)
        except Exception as exc:  # TimeoutError, ApiError: logged, the caller goes on
            log.warning("ordered uninstall did not finish: %s", exc)
            return None

    async def reconcile(self) -> ReconcileResult:
        """One idempotent pass: read the config, the product's namespace and the
        controller's ServiceAccount; converge the webhook configuration, the admission
        policy, the finalizers, the guards and the status, or run the ordered uninstall.

        Raises:
            ApiError: a read or write failed (the caller retries with backoff).
            Exception: whatever the CA bundle source or ``ungate_remaining`` raised.
        """
        namespace_obj = await self._get_namespace()
        service_account = await self._get_service_account()
        config = await self._get_config()
        reason = ownership.uninstall_reason(config, namespace_obj, service_account,
                                            namespace=self.namespace)
        if reason:
            return await self._start_uninstall(reason, removed=ownership.product_removed(
                namespace_obj, service_account))
        self._uninstall_failures = 0
        if config is None:
            await self._delete_policy()
            deleted = await self._delete_webhook()
            return ReconcileResult("absent", "deleted" if deleted else "absent")
        config = await self._ensure_finalizer(config)
        await self._ensure_guards(namespace_obj, service_account)
        return await self._converge(config, ownership.namespace_owner(namespace_obj))

    async def finish_if_removed(self) -> bool:
        """After a lost lease: when the product itself is being removed (its namespace or
        ServiceAccount is being deleted, so no controller can take the Lease again), run
        the ordered uninstall to its end here. True when it ran.

        Raises:
            ApiError: a read or write failed.
        """
        namespace_obj = await self._get_namespace()
        service_account = await self._get_service_account()
        if not ownership.product_removed(namespace_obj, service_account):
            return False
        config = await self._get_config()
        reason = ownership.uninstall_reason(config, namespace_obj, service_account,
                                            namespace=self.namespace)
        await self._start_uninstall(reason, removed=True)
        return True

    async def last_stop(self) -> ReconcileResult:
        """Called by the last controller to stop gracefully (no other took the lease).

        When the product is being removed (the config, the namespace or the ServiceAccount
        is being deleted), this is the ordered uninstall. Otherwise it **stands down**: the
        params object is deleted (the API server then skips the admission policy: no new
        pod is gated), every gated pod is released (:attr:`ungate_remaining`, a normal
        decision when it completes in time), the status says why (``Available=False``,
        reason ``NoController``), and the finalizers of the config and of the
        ServiceAccount are removed, since no controller is left to honour them. The
        policy, its binding and the webhook configuration stay, harmless without the params
        object (and the webhook, if it still runs, places pods itself); the next leader
        restores everything.

        Raises:
            ApiError: a read or write failed (logged by the caller; the process is ending).
        """
        namespace_obj = await self._get_namespace()
        service_account = await self._get_service_account()
        config = await self._get_config()
        reason = ownership.uninstall_reason(config, namespace_obj, service_account,
                                            namespace=self.namespace)
        if reason:
            return await self._start_uninstall(reason, removed=ownership.product_removed(
                namespace_obj, service_account))
        return await self._stand_down(config, service_account)

    # --- normal path -------------------------------------------------------------------
    async def _converge(self, config: dict[str, Any],
                        owner: Sequence[Mapping[str, Any]]) -> ReconcileResult:
        degraded: list[ConditionSpec] = []
        if self.guard_problem:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "UninstallGuardsFailed",
                                          self.guard_problem[:1000]))
        try:
            PlacementConfig.from_object(config)
        except ConfigError as exc:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "InvalidConfig", str(exc)))
        selection = webhook_namespace_selection(config, self.namespace)
        if not selection.exact:
            degraded.append(
                ConditionSpec(
                    COND_DEGRADED, "True", "NamespaceSelectorNotExpressible", selection.reason
                )
            )
        try:
            ca = await self._ca_bundle()
            desired = desired_webhook_configuration(
                config,
                ca_bundle=ca,
                service=self.service,
                url=self.url,
                own_namespace=self.namespace,
                timeout_seconds=self.timeout_seconds,
                cert_manager_certificate=self.cert_manager_certificate,
                owner=owner,
            )
            action = await self._apply_webhook(desired)
            policy, policy_problem = await self._apply_policy(config, selection, owner)
        except Exception as exc:
            reason = "WebhookConfigurationFailed"
            if not isinstance(exc, ApiError):
                reason = "CABundleUnavailable"
            with contextlib.suppress(ApiError):
                await self._write_status(
                    config,
                    [
                        ConditionSpec(COND_AVAILABLE, "False", reason, str(exc)[:1000]),
                        ConditionSpec(COND_PROGRESSING, "True", "Retrying", str(exc)[:1000]),
                        ConditionSpec(COND_DEGRADED, "True", reason, str(exc)[:1000]),
                        ConditionSpec(COND_DEPROVISIONING, "False", "AsExpected"),
                    ],
                )
            raise
        if policy_problem:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "AdmissionPolicyFailed",
                                          policy_problem[:1000]))
        mechanism = (
            f"pods are gated by MutatingAdmissionPolicy {ADMISSION_POLICY_NAME} (in the API "
            f"server) and MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION_NAME}"
            if policy else
            f"pods are gated by MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION_NAME} "
            "(the admission policy is not in force)"
        )
        wanted = [
            ConditionSpec(COND_AVAILABLE, "True", "AsExpected", mechanism),
            ConditionSpec(COND_PROGRESSING, "False", "AsExpected"),
            degraded[0]
            if degraded
            else ConditionSpec(COND_DEGRADED, "False", "AsExpected"),
            ConditionSpec(COND_DEPROVISIONING, "False", "AsExpected"),
        ]
        if len(degraded) > 1:
            wanted[2] = ConditionSpec(
                COND_DEGRADED,
                "True",
                degraded[0].reason,
                "; ".join(d.message for d in degraded),
            )
        placement = admissionpolicy.placement_config(config)
        admission = {
            "mechanism": ADMISSION_MECHANISM_POLICY if policy else ADMISSION_MECHANISM_WEBHOOK,
            "fastPaths": placement.admission_fast_paths,
        }
        written = await self._write_status(config, wanted, admission=admission)
        return ReconcileResult(
            "available", action, status_written=written, degraded=wanted[2].reason
            if wanted[2].status == "True" else ""
        )

    async def _ca_bundle(self) -> bytes | None:
        if self.cert_manager_certificate:
            return None
        source = self._ca_source
        if source is None or isinstance(source, bytes):
            return source
        value = source()
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, bytes) or not value.strip():
            raise ValueError("the CA bundle source returned no certificate")
        return value

    async def _apply_webhook(self, desired: dict[str, Any]) -> str:
        """Create the webhook configuration, or update it when it drifted; return the action."""
        return await self._apply_object(WEBHOOK_COLLECTION_PATH, WEBHOOK_PATH, desired,
                                        drifted=webhook_drifted, update_body=self._update_body)

    def _update_body(self, live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
        """The PUT body: the live object's metadata (resourceVersion precondition, foreign
        labels and annotations kept) with ours merged in, and our webhooks. In cert-manager
        mode the live caBundle (cert-manager's) is carried over."""
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

    # --- finalizer and status ---------------------------------------------------------
    async def _ensure_finalizer(self, config: dict[str, Any]) -> dict[str, Any]:
        return await self._patch_finalizer(CONFIG_PATH, config, add=True) or config

    async def _patch_finalizer(self, path: str, obj: dict[str, Any], *,
                               add: bool) -> dict[str, Any] | None:
        """Add or remove :data:`controller.ownership.GUARD_FINALIZER` on the object at
        ``path`` (``obj``: as last read), re-reading after a lost race (409/422), at most 3
        times. Returns the object as written, ``obj`` when nothing was to change, or None
        when it is gone.

        Raises:
            ApiError: another failure, or 3 lost races in a row.
        """
        for _ in range(3):
            ops = (ownership.add_finalizer_ops(obj) if add
                   else ownership.remove_finalizer_ops(obj))
            if ops is None:
                return obj
            try:
                written: dict[str, Any] = await self.api.request(
                    "PATCH", path, body=ops, content_type=JSON_PATCH)
                return written
            except NotFound:
                return None
            except ApiError as exc:
                if exc.status not in (409, 422):
                    raise
                fresh = await self._get_or_none(path)
                if fresh is None:
                    return None
                obj = fresh
        raise api_error(409, "Conflict", f"{path}: finalizer not changed after 3 attempts")

    async def _write_status(
        self, config: Mapping[str, Any], wanted: Sequence[ConditionSpec], *,
        admission: Mapping[str, str] | None = None,
    ) -> bool:
        """Merge-patch ``status`` when the conditions, observedGeneration or ``admission``
        (which mechanism is in force: ``{"mechanism": "MutatingAdmissionPolicy" |
        "Webhook", "fastPaths": "Enabled" | "Disabled"}``) changed."""
        meta = config.get("metadata") or {}
        generation = int(meta.get("generation") or 0)
        status = config.get("status") or {}
        old_conditions = status.get("conditions") or []
        conditions = merge_conditions(old_conditions, wanted, generation=generation, now=_now())
        same_admission = admission is None or status.get("admission") == dict(admission)
        if (conditions == old_conditions and status.get("observedGeneration") == generation
                and same_admission):
            return False
        # A merge patch replaces the conditions list as a whole (reference:
        # crd-podplacementconfig.json), which is what we want: we own every condition.
        body: dict[str, Any] = {"observedGeneration": generation, "conditions": conditions}
        if admission is not None:
            body["admission"] = dict(admission)
        await self.api.request("PATCH", CONFIG_PATH + "/status", body={"status": body},
                               content_type=MERGE_PATCH)
        return True

    # --- uninstall -----------------------------------------------------------------------
    async def _start_uninstall(self, reason: str, *, removed: bool) -> ReconcileResult:
        """Run the ordered uninstall as a task of its own, so that neither a lost lease nor
        :meth:`stop` cuts it short, and return its result (or raise its error)."""
        if self._uninstall_task is None or self._uninstall_task.done():
            self._uninstall_task = asyncio.create_task(
                self._uninstall(reason, removed=removed), name="podplacement uninstall")
        return await asyncio.shield(self._uninstall_task)

    async def _uninstall(self, reason: str, *, removed: bool) -> ReconcileResult:
        """The ordered uninstall (module docstring): nothing gates new pods, every gated pod
        is released, the config's finalizer goes; when the product itself is ``removed``
        (its namespace or ServiceAccount is being deleted), the ServiceAccount's finalizer
        goes last of all (its token dies with it)."""
        log.info("ordered uninstall: %s", reason)
        config = await self._get_config()
        if config is not None and ownership.has_finalizer(config):
            with contextlib.suppress(ApiError):
                await self._write_status(config, [
                    ConditionSpec(COND_AVAILABLE, "False", "Deprovisioning", reason),
                    ConditionSpec(COND_PROGRESSING, "True", "Deprovisioning",
                                  "removing the admission objects, ungating pods"),
                    ConditionSpec(COND_DEGRADED, "False", "AsExpected"),
                    ConditionSpec(COND_DEPROVISIONING, "True", "Uninstalling", reason),
                ])
        # 1. no new pod gets gated from here on: the in-server policy, its params object and
        # the webhook configuration go
        policy_was_there = self._policy_present is not False
        await self._delete_policy()
        params_deleted = await self._delete_params()
        deleted = await self._delete_webhook()
        if deleted or policy_was_there or params_deleted:
            # The API server applies a deleted policy or webhook configuration for a moment
            # longer (its informers): let that pass, so the pods it still gates are released
            # below too.
            await asyncio.sleep(self.admission_settle_seconds)
        # 2. release every pod still gated
        ungated = await self._release_gated(self.uninstall_deadline_seconds)
        log.info("uninstall: admission objects removed, %d gated pods released", ungated)
        # 3. let the API server delete the config
        fresh = await self._get_config()
        if fresh is not None:
            await self._patch_finalizer(CONFIG_PATH, fresh, add=False)
        # 4. the controller itself is going: its ServiceAccount's finalizer, last of all
        if removed:
            await self._release_service_account()
        self._uninstall_failures = 0
        return ReconcileResult("uninstalled", "deleted" if deleted else "absent", ungated=ungated)

    async def _release_gated(self, deadline: float) -> int:
        """Run ``ungate_remaining``; after 3 failed attempts in a row, go on without it
        (the caller must not be held forever)."""
        if self.ungate_remaining is None:
            return 0
        try:
            return await self.ungate_remaining(deadline)
        except Exception:
            self._uninstall_failures += 1
            if self._uninstall_failures < 3:
                raise
            log.exception("ungating remaining pods failed 3 times; going on")
            return 0

    async def _stand_down(self, config: dict[str, Any] | None,
                          service_account: dict[str, Any] | None) -> ReconcileResult:
        """:meth:`last_stop` when the product is not being removed."""
        params_deleted = await self._delete_params()
        if params_deleted:
            await asyncio.sleep(self.admission_settle_seconds)
        ungated = await self._release_gated(self.uninstall_deadline_seconds)
        message = (f"no controller is running: the admission policy is paused (its params "
                   f"object is deleted) and {ungated} gated pods were released; the next "
                   "controller to lead restores it")
        log.info("standing down: %s", message)
        config = await self._get_config()
        if config is not None:
            with contextlib.suppress(ApiError):
                await self._write_status(config, [
                    ConditionSpec(COND_AVAILABLE, "False", "NoController", message),
                    ConditionSpec(COND_PROGRESSING, "False", "NoController"),
                    ConditionSpec(COND_DEGRADED, "True", "NoController", message),
                    ConditionSpec(COND_DEPROVISIONING, "False", "AsExpected"),
                ])
            config = await self._get_config()
            if config is not None:
                await self._patch_finalizer(CONFIG_PATH, config, add=False)
        if service_account is not None:
            await self._release_service_account()
        return ReconcileResult("stood-down", "unchanged", ungated=ungated)

    # --- guards: what lets the uninstall outlive deploy/'s RBAC ----------------------------
    async def _identity(self) -> tuple[str, str] | None:
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

    async def _get_service_account(self) -> dict[str, Any] | None:
        ref = await self._identity()
        if ref is None:
            return None
        try:
            return await self._get_or_none(SERVICE_ACCOUNT_PATH.format(namespace=ref[0],
                                                                        name=ref[1]))
        except ApiError as exc:
            if exc.status == 403:
                return None
            raise

    async def _get_namespace(self) -> dict[str, Any] | None:
        try:
            return await self._get_or_none(NAMESPACE_PATH.format(namespace=self.namespace))
        except ApiError as exc:
            if exc.status == 403:
                return None
            raise

    async def _ensure_guards(self, namespace_obj: Mapping[str, Any] | None,
                             service_account: dict[str, Any] | None) -> None:
        """While a config is in force and this controller leads: the finalizer on its
        ServiceAccount and the uninstall ClusterRole and binding
        (:mod:`controller.ownership`). Failures are reported in :attr:`guard_problem` (the
        status's Degraded condition), never raised: gating works without them, only an
        uninstall by ``kubectl delete -k`` would then lose its rights half-way."""
        ref = self._service_account
        if service_account is None or ref is None:
            self.guard_problem = ""
            return
        owner = ownership.namespace_owner(namespace_obj)
        try:
            await self._apply_object(UNINSTALL_ROLE_COLLECTION_PATH, UNINSTALL_ROLE_PATH,
                                     ownership.uninstall_role(ref[1], owner),
                                     drifted=ownership.rbac_drifted,
                                     update_body=self._replacement)
            await self._apply_object(UNINSTALL_BINDING_COLLECTION_PATH, UNINSTALL_BINDING_PATH,
                                     ownership.uninstall_binding(ref[0], ref[1], owner),
                                     drifted=ownership.rbac_drifted,
                                     update_body=self._replacement)
            await self._patch_finalizer(
                SERVICE_ACCOUNT_PATH.format(namespace=ref[0], name=ref[1]), service_account,
                add=True)
        except ApiError as exc:
            self.guard_problem = f"uninstall guards: {exc}"
            log.warning("%s", self.guard_problem)
            return
        self.guard_problem = ""

    async def _release_service_account(self) -> None:
        """Remove our finalizer from the controller's ServiceAccount (when it has it)."""
        ref = self._service_account
        if ref is None:
            return
        path = SERVICE_ACCOUNT_PATH.format(namespace=ref[0], name=ref[1])
        live = await self._get_or_none(path)
        if live is not None and await self._patch_finalizer(path, live, add=False) is not live:
            log.info("released the finalizer of ServiceAccount %s/%s", *ref)

    # --- small I/O helpers ------------------------------------------------------------------
    async def _get_config(self) -> dict[str, Any] | None:
        return await self._get_or_none(CONFIG_PATH)

    # --- the admission policy -------------------------------------------------------------
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

    async def _apply_policy(self, config: Mapping[str, Any],
                            selection: WebhookNamespaceSelection,
                            owner: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
        """Converge the MutatingAdmissionPolicy, its params object and its binding: present
        when ``spec.admission.mechanism`` is ``Auto`` and the API server serves the API,
        absent otherwise. Returns ``(in force, problem)``; an API error is reported as the
        problem (the webhook keeps gating) rather than raised."""
        mechanism = (((config.get("spec") or {}).get("admission") or {}).get("mechanism")
                     or ADMISSION_AUTO)
        try:
            if not await self._policy_served():
                return False, ""
            if mechanism != ADMISSION_AUTO:
                await self._delete_policy()
                return False, ""
            placement = admissionpolicy.placement_config(config)
            await self._apply_object(POLICY_COLLECTION_PATH, POLICY_PATH,
                                     admissionpolicy.desired_policy(placement, owner),
                                     drifted=admissionpolicy.policy_drifted,
                                     update_body=self._replacement)
            self._policy_present = True
            # Before the binding: the API server skips the policy while its params object is
            # missing (pods pass unplaced and ungated; the webhook then gates them).
            await self._apply_object(self.params_collection_path, self.params_path,
                                     admissionpolicy.params_object(self.namespace),
                                     drifted=admissionpolicy.never_drifted,
                                     update_body=self._replacement)
            await self._apply_object(BINDING_COLLECTION_PATH, BINDING_PATH,
                                     admissionpolicy.desired_binding(
                                         selection, params_namespace=self.namespace,
                                         owner=owner),
                                     drifted=admissionpolicy.policy_drifted,
                                     update_body=self._replacement)
        except ApiError as exc:
            log.warning("admission policy %s: %s", ADMISSION_POLICY_NAME, exc)
            return False, f"MutatingAdmissionPolicy {ADMISSION_POLICY_NAME}: {exc}"
        return True, ""

    async def _apply_object(
        self, collection: str, path: str, desired: dict[str, Any], *,
        drifted: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
        update_body: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]],
    ) -> str:
        """Create ``desired`` (a 409 means another writer was first: read it), or PUT
        ``update_body(live, desired)`` when ``drifted(live, desired)``; the action taken
        (``created``, ``unchanged``, ``updated``)."""
        name, kind = desired["metadata"]["name"], desired["kind"]
        live = await self._get_or_none(path)
        if live is None:
            try:
                await self.api.request("POST", collection, body=desired)
                log.info("created %s %s", kind, name)
                return "created"
            except ApiError as exc:
                if exc.status != 409:
                    raise
                live = await self._get_or_none(path)
                if live is None:
                    raise
        if not drifted(live, desired):
            return "unchanged"
        await self.api.request("PUT", path, body=update_body(live, desired))
        log.info("reverted drift of %s %s", kind, name)
        return "updated"

    @staticmethod
    def _replacement(live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
        """The PUT body of a policy or binding: ``desired`` with the live metadata
        (resourceVersion precondition, foreign fields) and ours merged in."""
        meta = dict(live.get("metadata") or {})
        meta.pop("managedFields", None)
        meta.update({k: v for k, v in desired["metadata"].items() if k != "name"})
        return {**desired, "metadata": meta}

    async def _get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.api.request("GET", path)
        except NotFound:
            return None

    async def _delete_policy(self) -> None:
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

    async def _delete_params(self) -> bool:
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
        log.info("deleted ImagePlatforms %s/%s", self.namespace, PARAMS_NAME)
        return True

    async def _delete_webhook(self) -> bool:
        try:
            await self.api.request("DELETE", WEBHOOK_PATH)
        except NotFound:
            return False
        log.info("deleted MutatingWebhookConfiguration %s", WEBHOOK_CONFIGURATION_NAME)
        return True


# --- built-in certificates ----------------------------------------------------------------
class ServingCertSecret(secretflow.ServingCertSecret):
    """:class:`certs.secretflow.ServingCertSecret` (the built-in certificate flow, same
    arguments) holding a serving-certificate reissue until the caBundle published in our
    MutatingWebhookConfiguration :data:`WEBHOOK_PATH` trusts the signing CA."""

    webhook_configuration_path = WEBHOOK_PATH
