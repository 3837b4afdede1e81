"""PodPlacementConfig lifecycle: finalizers, the owned admission objects, status conditions,
the ordered uninstall and the last controller's stand-down.

:class:`Lifecycle` reconciles the singleton ``PodPlacementConfig`` ``cluster`` like a
controller-runtime reconciler: read the config, compute what should exist, write only the
difference, and report through ``status.conditions``. It has no loop of its own: it is a
handler of the controller's one :class:`~controller.queue.WorkQueue` (:meth:`Lifecycle.handle`)
for the keys :data:`LIFECYCLE_KEY`, :data:`FINISH_KEY` and :data:`LAST_STOP_KEY` (a pod's key
is ``namespace/name/uid``; these hold no slash). Each pass returns "done" or "again after N
seconds" (:attr:`ReconcileResult.requeue_after`) or raises; the queue owns backoff and the
failure count, which the lifecycle reads where it needs one. It runs in the elected leader
only (:mod:`controller.leader`): the app queues :data:`LIFECYCLE_KEY` on every config watch
event, and each pass asks to run again after ``resync_seconds``, which is how drift of the
webhook configuration (someone edits or deletes it) is reverted: at most ``resync_seconds``
later (longer while the queue backs off after failures).

Rules (docs/guide/uninstall.md; the ownership rules are :mod:`controller.core.ownership`'s):

* While the config exists (and nothing is being deleted) it carries the finalizer
  ``podplacement.io/finalizer``; the MutatingWebhookConfiguration ``podplacement-webhook``,
  the MutatingAdmissionPolicy and binding ``podplacement-gate`` (owned by the product's
  Namespace) and the params object (in the product's namespace) exist; the controller's own
  ServiceAccount carries the same finalizer and the uninstall ClusterRole and binding exist.
* No config: the webhook configuration and the policy are deleted.
* Upgrades (docs/guide/upgrade.md): what an earlier release left and this one no
  longer uses (:mod:`controller.core.legacy`: release 0.1.0's cluster-scoped params object
  ``ImagePlatforms cluster`` and its CRD) is deleted by every pass while it is there; a
  binding ``podplacement-gate`` whose ``paramRef`` is not ours (0.1.0's) is deleted before
  our params object is written, then created anew. The status never says the policy is not
  in force while a binding of it may still be there (:data:`POLICY_AS_LEFT`).
* The config, the product's namespace or the controller's ServiceAccount being deleted
  (``kubectl delete -k deploy/`` does all three at once): the ordered uninstall. Status
  ``Deprovisioning=True``; the policy, the params object and the webhook configuration are
  deleted (no new pod gets gated); once ``admission_settle_seconds`` have passed since the
  last deletion (the pass asks to run again after the time still to wait, it never sleeps),
  ``ungate_remaining(deadline_seconds)`` (normal decisions within the deadline, counted from
  the first release attempt, plain ungate after it) releases every pod still gated; then the
  config's finalizer is removed, and when the controller itself is being removed, the
  ServiceAccount's finalizer last. Every step is idempotent, so a pass cut short (a lost
  lease or a stop cancels the queue's work in flight) is simply run again.
* The uninstall runs to its end even when the lease is lost (the namespace's deletion
  deletes the Lease) or the process is asked to stop: the app then serves
  :data:`FINISH_KEY` on a one-worker queue of its own, after the pod workers are gone, until
  the pass says done or :attr:`Lifecycle.final_seconds` pass (:meth:`Lifecycle.finish`).
* Shutdown of one controller (graceful or not) leaves everything in place: it belongs to
  the installed config, not to one process (deleting the webhook configuration on a rolling
  update let pods created during the handover escape the gate). The next leader
  re-processes every pod still gated. But the **last** controller to stop gracefully (no
  other took the lease: the Deployment scaled to 0, its pods evicted with replacements that
  cannot start) stands down (:data:`LAST_STOP_KEY`, :meth:`Lifecycle.last_stop`, served
  the same way once the pod workers have stopped): it deletes the params object, so the API
  server stops gating, releases every gated pod, says so in the status and removes the
  finalizers no live controller would honour.

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

import contextlib
import dataclasses
import datetime as dt
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from podplacement import certs
from podplacement.certs import secretflow

# The certificate Secrets' names, where the deploy tests and the rotation tests look for them.
from podplacement.certs.secretflow import CA_SECRET_NAME as CA_SECRET_NAME
from podplacement.certs.secretflow import TLS_SECRET_NAME as TLS_SECRET_NAME
from podplacement.certs.secretflow import WEBHOOK_SERVICE_NAME as WEBHOOK_SERVICE_NAME
from podplacement.controller.core import admissionpolicy, legacy, ownership
from podplacement.controller.core.config import (
    ADMISSION_AUTO,
    ADMISSION_POLICY_NAME,
    CONFIG_NAME,
    CONFIG_PLURAL,
    CONTROLLER_SERVICE_ACCOUNT,
    GROUP,
    PARAMS_NAME,
    VERSION,
    WEBHOOK_CONFIGURATION_NAME,
    PlacementConfig,
    admission_mark,
    config_or_defaults,
)
from podplacement.controller.core.webhookconfig import (
    CERT_MANAGER_INJECT_ANNOTATION,
    ServiceRef,
    WebhookNamespaceSelection,
    desired_webhook_configuration,
    webhook_drifted,
    webhook_namespace_selection,
)
from podplacement.controller.paramswriter import PARAMS_COLLECTION_PATH, PARAMS_PATH, params_path
from podplacement.kubeclient import (
    JSON_PATCH,
    MERGE_PATCH,
    ApiError,
    KubeRequester,
    NotFound,
    api_error,
)

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
CRD_COLLECTION_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


# The two paths below are built from the data of controller.core.legacy; the requests they
# make are declared concretely in RETIREMENT_REQUESTS (checked against deploy/'s RBAC).
def retired_crd_path(retired: legacy.RetiredCRD) -> str:
    """The API path of the CRD ``retired`` (:mod:`controller.core.legacy`)."""
    return "/".join((CRD_COLLECTION_PATH, retired.name))


def retired_object_path(retired: legacy.RetiredCRD, name: str, namespace: str) -> str:
    """The API path of the object ``name`` of ``retired`` (in ``namespace`` when the CRD was
    namespaced)."""
    scope = ("namespaces", namespace) if retired.scope == "Namespaced" else ()
    return "/".join(("", "apis", retired.group, retired.version, *scope, retired.plural, name))


#: What retiring the CRDs of earlier releases sends (:meth:`Lifecycle._retire_previous`).
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
    *RETIREMENT_REQUESTS,
    *secretflow.API_REQUESTS,
)


CaBundleSource = Callable[[], bytes | Awaitable[bytes]]
UngateRemaining = Callable[[float], Awaitable[int]]

#: Work-queue key of the normal pass (:meth:`Lifecycle.reconcile`): converge, or the ordered
#: uninstall when one is due; it runs again every ``resync_seconds``.
LIFECYCLE_KEY = "lifecycle:cluster"
#: Work-queue key of the pass that finishes an ordered uninstall when this process stops
#: leading (:meth:`Lifecycle.finish`); done once finished, or at once when none is due.
FINISH_KEY = "lifecycle:finish"
#: Work-queue key of the last controller's stop (:meth:`Lifecycle.last_stop`): the ordered
#: uninstall when one is due, else the stand-down; done once finished.
LAST_STOP_KEY = "lifecycle:last-stop"
#: Every key :meth:`Lifecycle.handle` serves.
KEYS = (LIFECYCLE_KEY, FINISH_KEY, LAST_STOP_KEY)
#: Failed attempts at releasing the gated pods (``ungate_remaining``) after which the
#: uninstall or the stand-down goes on without them: it must not hold the finalizers forever.
RELEASE_ATTEMPTS = 3
#: Failed attempts of :data:`FINISH_KEY` or :data:`LAST_STOP_KEY` after which the key is given
#: up (the process is ending; e.g. its ServiceAccount token is no longer valid).
FINAL_ATTEMPTS = 3
#: Seconds :attr:`Lifecycle.final_seconds` allows beyond the settle time and the release
#: deadline, for the requests around them and the queue's retries.
FINAL_MARGIN_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """A wanted condition: ``status`` is ``"True"``, ``"False"`` or ``"Unknown"``."""

    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What one pass of :class:`Lifecycle` found and did.

    Attributes:
        state: ``absent`` (no config), ``available``, ``uninstalling`` (the ordered uninstall
            waits for the admission chain to settle), ``uninstalled`` (finalizer released),
            ``standing-down`` / ``stood-down`` (the last controller's stand-down, waiting /
            done), ``idle`` (:meth:`Lifecycle.finish` with nothing to finish).
        webhook: ``created``, ``updated``, ``unchanged``, ``deleted`` or ``absent``.
        status_written: the status subresource was patched.
        ungated: pods released so far by this uninstall or stand-down.
        degraded: the Degraded reason, "" when not degraded.
        requeue_after: seconds until the key should be processed again; None: done.
    """

    state: str
    webhook: str
    status_written: bool = False
    ungated: int = 0
    degraded: str = ""
    requeue_after: float | None = None


@dataclass(slots=True)
class _Withdrawal:
    """Progress of an ordered uninstall or stand-down in this process (memory only: a new
    process starts over, which the idempotent steps allow).

    Attributes:
        uninstall: an ordered uninstall (False: a stand-down).
        settle_until: ``time.monotonic()`` at which the admission chain has followed the
            last deletion; None before the first deletion pass.
        release_by: ``time.monotonic()`` until which released pods get a normal decision;
            None before the first release attempt.
        ungated: pods released so far.
    """

    uninstall: bool
    settle_until: float | None = None
    release_by: float | None = None
    ungated: int = 0


@dataclass(frozen=True, slots=True)
class _Observed:
    """The objects one pass reads first: the config, the product's namespace and the
    controller's ServiceAccount (None: absent, or not readable)."""

    config: dict[str, Any] | None
    namespace: dict[str, Any] | None
    service_account: dict[str, Any] | None


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

#: What :meth:`Lifecycle._apply_policy` leaves at admission: our policy in force, no policy,
#: or a policy and binding as another writer (an earlier release, or an earlier pass) left
#: them, which may still gate or place pods.
POLICY_IN_FORCE = "in-force"
POLICY_ABSENT = "absent"
POLICY_AS_LEFT = "as-left"


def _available_conditions(policy: str, degraded: Sequence[ConditionSpec]) -> list[ConditionSpec]:
    """The four conditions of a converged config: ``Available`` with the mechanism in force
    (``policy``: :data:`POLICY_IN_FORCE`, :data:`POLICY_ABSENT` or :data:`POLICY_AS_LEFT`),
    and ``Degraded`` from ``degraded`` (the first one's reason, every message joined), else
    ``AsExpected``. The message never says the policy is not in force while a binding of it
    may still be there."""
    mechanism = {
        POLICY_IN_FORCE:
            f"pods are gated by MutatingAdmissionPolicy {ADMISSION_POLICY_NAME} (in the API "
            f"server) and MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION_NAME}",
        POLICY_AS_LEFT:
            f"pods are gated by MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION_NAME}; "
            f"MutatingAdmissionPolicy {ADMISSION_POLICY_NAME} may also gate or place them "
            "as it was last written (it could not be brought up to date, see Degraded)",
    }.get(policy,
          f"pods are gated by MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION_NAME} "
          "(the admission policy is not in force)")
    degraded_condition = ConditionSpec(COND_DEGRADED, "False", "AsExpected")
    if len(degraded) == 1:
        degraded_condition = degraded[0]
    elif degraded:
        degraded_condition = ConditionSpec(COND_DEGRADED, "True", degraded[0].reason,
                                           "; ".join(d.message for d in degraded))
    return [
        ConditionSpec(COND_AVAILABLE, "True", "AsExpected", mechanism),
        ConditionSpec(COND_PROGRESSING, "False", "AsExpected"),
        degraded_condition,
        ConditionSpec(COND_DEPROVISIONING, "False", "AsExpected"),
    ]


class _Applied(NamedTuple):
    """What :meth:`Lifecycle._apply_object` did (``created``, ``unchanged``, ``updated``) and
    the object as the server returned it."""

    action: str
    obj: dict[str, Any]


def _remaining(until: float | None) -> float:
    """Seconds from now (``time.monotonic()``) to ``until``; 0 when past or None."""
    return 0.0 if until is None else max(0.0, until - time.monotonic())



class Lifecycle:
    """Reconciler of the PodPlacementConfig ``cluster`` (see the module docstring): the
    handler of :data:`KEYS` on the controller's work queue (:meth:`handle`).

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
        uninstall_deadline_seconds: the deadline passed to ``ungate_remaining`` by the ordered
            uninstall and the stand-down, counted from their first release attempt.
        admission_settle_seconds: time between deleting the admission policy, the webhook
            configuration or the params object and releasing the gated pods (the API
            server's admission chain follows the deletion through informers, within about a
            second); a pass asks to run again after what is left of it.
        resync_seconds: the requeue-after of every :data:`LIFECYCLE_KEY` pass (the drift
            check).
        timeout_seconds: the webhook's call timeout.
        service_account: ``(namespace, name)`` of the controller's own ServiceAccount; None:
            found with a SelfSubjectReview (no guards when the controller does not run as a
            ServiceAccount, e.g. with an admin kubeconfig).
        failures: the count of consecutive failures of a key kept by the work queue serving
            it (:meth:`controller.queue.WorkQueue.failures`); None: passes run by hand see 0.

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
        service_account: tuple[str, str] | None = None,
        failures: Callable[[str], int] | None = None,
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
        self._failures: Callable[[str], int] = failures or (lambda _key: 0)
        self.last_result: ReconcileResult | None = None
        self.params_path = params_path(namespace)
        self.params_collection_path = PARAMS_COLLECTION_PATH.format(namespace=namespace)
        self._withdrawal: _Withdrawal | None = None
        #: True once the ordered uninstall released the controller's ServiceAccount: the
        #: product is gone, and this process has nothing left to do (its token dies with it).
        self.gone = False
        self._policy_api = False
        #: whether the policy may exist (None: not known yet): no DELETE per resync
        self._policy_present: bool | None = None
        self._service_account = service_account
        self._identity_known = service_account is not None
        #: the last problem with the guards ("" when they are in place or not applicable)
        self.guard_problem = ""

    # --- public API ---------------------------------------------------------------------
    @property
    def uninstalling(self) -> bool:
        """True while an ordered uninstall started by this process has not finished (a pass
        cut short by a lost lease or a stop leaves it true: :meth:`finish` completes it)."""
        return self._withdrawal is not None and self._withdrawal.uninstall

    @property
    def final_seconds(self) -> float:
        """The bound, in seconds, on serving :data:`FINISH_KEY` or :data:`LAST_STOP_KEY` to
        its end: the settle time, the release deadline and :data:`FINAL_MARGIN_SECONDS`."""
        return (self.admission_settle_seconds + self.uninstall_deadline_seconds
                + FINAL_MARGIN_SECONDS)

    async def removal_due(self) -> bool:
        """True when the product itself is being removed: its namespace or the controller's
        ServiceAccount is being deleted (so no controller can take the Lease again, and
        :meth:`finish` runs the ordered uninstall). One read of each, no retry.

        Raises:
            ApiError: a read failed (other than 403 and 404, which read as absent).
        """
        namespace_obj = await self._get_namespace()
        return ownership.product_removed(namespace_obj, await self._get_service_account())

    async def handle(self, key: str) -> float | None:
        """The work-queue handler of :data:`KEYS`: one pass of :meth:`reconcile`,
        :meth:`finish` or :meth:`last_stop`; its result is kept in :attr:`last_result`.

        Returns:
            The pass's ``requeue_after``: seconds until the key runs again, None when done.
            A failure of :data:`FINISH_KEY` or :data:`LAST_STOP_KEY` after
            ``FINAL_ATTEMPTS - 1`` failed attempts (the queue's count) is logged and the key
            is done: the process is ending.

        Raises:
            ValueError: ``key`` is not one of :data:`KEYS`.
            Exception: whatever the pass raised (the queue retries after its backoff).
        """
        passes = {LIFECYCLE_KEY: self.reconcile, FINISH_KEY: self.finish,
                  LAST_STOP_KEY: self.last_stop}
        step = passes.get(key)
        if step is None:
            raise ValueError(f"not a lifecycle key: {key!r}")
        try:
            result = await step()
        except Exception as exc:
            if key == LIFECYCLE_KEY or self._failures(key) + 1 < FINAL_ATTEMPTS:
                raise
            log.warning("%s: giving up after %d failed attempts: %s", key, FINAL_ATTEMPTS, exc)
            return None
        self.last_result = result
        return result.requeue_after

    async def reconcile(self) -> ReconcileResult:
        """One idempotent pass of :data:`LIFECYCLE_KEY`: read the config, the product's
        namespace and the controller's ServiceAccount; converge the webhook configuration,
        the admission policy, the finalizers, the guards and the status, or run one pass of
        the ordered uninstall.

        Returns:
            The result, ``requeue_after`` set: the settle time still to wait during an
            uninstall, else ``resync_seconds``.

        Raises:
            ApiError: a read or write failed (the queue retries with backoff).
            Exception: whatever the CA bundle source raised, or ``ungate_remaining`` before
                its :data:`RELEASE_ATTEMPTS`-th failure.
        """
        seen = await self._observe()
        reason = self._uninstall_reason(seen)
        if reason:
            result = await self._uninstall(seen, reason, LIFECYCLE_KEY)
        else:
            self._withdrawal = None
            result = await self._keep_installed(seen)
        if result.requeue_after is None:
            result = dataclasses.replace(result, requeue_after=self.resync_seconds)
        return result

    async def finish(self) -> ReconcileResult:
        """One pass of :data:`FINISH_KEY`, served when this process stops leading (lost
        lease or graceful stop), after its pod workers stopped: when an ordered uninstall is
        due and either under way here (:attr:`uninstalling`) or the product itself is being
        removed (its namespace or ServiceAccount is being deleted, so no controller can take
        the Lease again), one pass of it; otherwise nothing (state ``idle``).

        Returns:
            The result; ``requeue_after`` None once finished (or idle), else the settle
            time still to wait.

        Raises:
            ApiError: a read or write failed.
        """
        seen = await self._observe()
        reason = self._uninstall_reason(seen)
        removed = ownership.product_removed(seen.namespace, seen.service_account)
        if not reason or not (removed or self.uninstalling):
            return ReconcileResult("idle", "unchanged")
        return await self._uninstall(seen, reason, FINISH_KEY)

    async def last_stop(self) -> ReconcileResult:
        """One pass of :data:`LAST_STOP_KEY`, served by the last controller to stop
        gracefully (no other took the lease) after its pod workers stopped.

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

        Returns:
            The result; ``requeue_after`` None once finished, else the settle time still
            to wait.

        Raises:
            ApiError: a read or write failed.
        """
        seen = await self._observe()
        reason = self._uninstall_reason(seen)
        if reason:
            return await self._uninstall(seen, reason, LAST_STOP_KEY)
        return await self._stand_down(seen, LAST_STOP_KEY)

    # --- normal path -------------------------------------------------------------------
    async def _observe(self) -> _Observed:
        namespace_obj = await self._get_namespace()
        service_account = await self._get_service_account()
        return _Observed(await self._get_config(), namespace_obj, service_account)

    def _uninstall_reason(self, seen: _Observed) -> str:
        return ownership.uninstall_reason(seen.config, seen.namespace, seen.service_account,
                                          namespace=self.namespace)

    async def _keep_installed(self, seen: _Observed) -> ReconcileResult:
        """Nothing is being deleted: no config, no admission objects; else the finalizer,
        the guards, the admission objects and the status."""
        if seen.config is None:
            await self._delete_policy()
            deleted = await self._delete_webhook()
            await self._retire_previous()
            return ReconcileResult("absent", "deleted" if deleted else "absent")
        config = await self._ensure_finalizer(seen.config)
        await self._ensure_guards(seen.namespace, seen.service_account)
        return await self._converge(config, ownership.namespace_owner(seen.namespace))

    async def _converge(self, config: dict[str, Any],
                        owner: Sequence[Mapping[str, Any]]) -> ReconcileResult:
        """The webhook configuration and the admission policy of ``config`` (parsed once,
        here), and the status that says so."""
        placement, parse_error = config_or_defaults(config)
        selection = webhook_namespace_selection(config, self.namespace)
        degraded = self._degradations(parse_error, selection)
        action, policy, policy_problem = await self._apply_admission(config, placement,
                                                                     selection, owner)
        if policy_problem:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "AdmissionPolicyFailed",
                                          policy_problem[:1000]))
        retire_problem = await self._retire_previous()
        if retire_problem:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "PreviousReleaseLeftovers",
                                          retire_problem[:1000]))
        wanted = _available_conditions(policy, degraded)
        admission = {
            "mechanism": (ADMISSION_MECHANISM_WEBHOOK if policy == POLICY_ABSENT
                          else ADMISSION_MECHANISM_POLICY),
            "fastPaths": placement.admission_fast_paths,
        }
        written = await self._write_status(config, wanted, admission=admission)
        return ReconcileResult("available", action, status_written=written,
                               degraded=wanted[2].reason if wanted[2].status == "True" else "")

    def _degradations(self, parse_error: str | None,
                      selection: WebhookNamespaceSelection) -> list[ConditionSpec]:
        """The Degraded conditions known before any write, most important first."""
        degraded: list[ConditionSpec] = []
        if self.guard_problem:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "UninstallGuardsFailed",
                                          self.guard_problem[:1000]))
        if parse_error is not None:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "InvalidConfig", parse_error))
        if not selection.exact:
            degraded.append(ConditionSpec(COND_DEGRADED, "True",
                                          "NamespaceSelectorNotExpressible", selection.reason))
        return degraded

    async def _apply_admission(
        self, config: dict[str, Any], placement: PlacementConfig,
        selection: WebhookNamespaceSelection, owner: Sequence[Mapping[str, Any]],
    ) -> tuple[str, str, str]:
        """Converge the admission policy, then the webhook configuration (which skips the
        pods the policy placed from the params object that exists now:
        :func:`controller.core.webhookconfig.match_conditions`). Returns the webhook's
        action, what is in force of the policy (:data:`POLICY_IN_FORCE`,
        :data:`POLICY_ABSENT`, :data:`POLICY_AS_LEFT`) and the policy's problem ("" when
        none). A failure of the webhook configuration or the CA bundle is written to the
        status, then raised."""
        try:
            # The policy first: the webhook configuration skips the pods it placed only from
            # the params object that exists now (its uid in the mark), else none.
            policy, problem, catalog_uid = await self._apply_policy(placement, selection, owner)
            mark = (admission_mark(catalog_uid)
                    if policy == POLICY_IN_FORCE and catalog_uid
                    and admissionpolicy.places(placement) else None)
            desired = desired_webhook_configuration(
                config, ca_bundle=await self._ca_bundle(), service=self.service, url=self.url,
                own_namespace=self.namespace, timeout_seconds=self.timeout_seconds,
                cert_manager_certificate=self.cert_manager_certificate, owner=owner,
                placed_mark=mark)
            action = await self._apply_webhook(desired)
        except Exception as exc:
            reason = "WebhookConfigurationFailed" if isinstance(exc, ApiError) else (
                "CABundleUnavailable")
            with contextlib.suppress(ApiError):
                await self._write_status(config, [
                    ConditionSpec(COND_AVAILABLE, "False", reason, str(exc)[:1000]),
                    ConditionSpec(COND_PROGRESSING, "True", "Retrying", str(exc)[:1000]),
                    ConditionSpec(COND_DEGRADED, "True", reason, str(exc)[:1000]),
                    ConditionSpec(COND_DEPROVISIONING, "False", "AsExpected"),
                ])
            raise
        return action, policy, problem

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
        applied = await self._apply_object(WEBHOOK_COLLECTION_PATH, WEBHOOK_PATH, desired,
                                           drifted=webhook_drifted,
                                           update_body=self._update_body)
        return applied.action

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
        """Add or remove :data:`controller.core.ownership.GUARD_FINALIZER` on the object at
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

    # --- uninstall and stand-down ----------------------------------------------------------
    def _withdrawing(self, *, uninstall: bool) -> _Withdrawal:
        """The withdrawal under way, or a new one."""
        if self._withdrawal is None:
            self._withdrawal = _Withdrawal(uninstall)
        elif uninstall:
            self._withdrawal.uninstall = True
        return self._withdrawal

    async def _uninstall(self, seen: _Observed, reason: str, key: str) -> ReconcileResult:
        """One pass of the ordered uninstall (module docstring) for the work-queue key
        ``key``: nothing gates new pods; once that has settled, every gated pod is
        released and the config's finalizer goes; when the product itself is being removed
        (its namespace or ServiceAccount is being deleted), the ServiceAccount's finalizer
        goes last of all (its token dies with it: :attr:`gone`). Every step is idempotent.

        Returns:
            ``uninstalling`` with the settle time still to wait, or ``uninstalled`` (done).
        """
        w = self._withdrawing(uninstall=True)
        if w.settle_until is None:
            log.info("ordered uninstall: %s", reason)
        if seen.config is not None and ownership.has_finalizer(seen.config):
            with contextlib.suppress(ApiError):
                await self._write_status(seen.config, [
                    ConditionSpec(COND_AVAILABLE, "False", "Deprovisioning", reason),
                    ConditionSpec(COND_PROGRESSING, "True", "Deprovisioning",
                                  "removing the admission objects, ungating pods"),
                    ConditionSpec(COND_DEGRADED, "False", "AsExpected"),
                    ConditionSpec(COND_DEPROVISIONING, "True", "Uninstalling", reason),
                ])
        # 1. no new pod gets gated from here on: the in-server policy, its params object and
        # the webhook configuration go
        webhook = "deleted" if await self._withdraw_admission(w, everything=True) else "absent"
        wait = _remaining(w.settle_until)
        if wait > 0:
            return ReconcileResult("uninstalling", webhook, ungated=w.ungated,
                                   requeue_after=wait)
        # 2. release every pod still gated
        w.ungated += await self._release_gated(w, key)
        log.info("uninstall: admission objects removed, %d gated pods released", w.ungated)
        # 3. let the API server delete the config
        fresh = await self._get_config()
        if fresh is not None:
            await self._patch_finalizer(CONFIG_PATH, fresh, add=False)
        # 4. the controller itself is going: its ServiceAccount's finalizer, last of all
        if ownership.product_removed(seen.namespace, seen.service_account):
            await self._release_service_account()
            self.gone = True
        self._withdrawal = None
        return ReconcileResult("uninstalled", webhook, ungated=w.ungated)

    async def _withdraw_admission(self, w: _Withdrawal, *, everything: bool) -> bool:
        """Delete what gates new pods: the params object and, with ``everything``, the
        admission policy, its binding and the webhook configuration. Sets the settle time
        ``admission_settle_seconds`` ahead when something was (or may have been) deleted: the
        API server applies a deleted policy or webhook configuration for a moment longer (its
        informers), and the pods it still gates must be released too. A first pass cut short
        mid-way keeps the settle time it set at its start. Returns whether the webhook
        configuration was deleted."""
        first = w.settle_until is None
        if first:
            w.settle_until = time.monotonic() + self.admission_settle_seconds
        policy_was_there = everything and self._policy_present is not False
        if everything:
            await self._delete_policy()
        params_deleted = await self._delete_params()
        webhook_deleted = await self._delete_webhook() if everything else False
        if policy_was_there or params_deleted or webhook_deleted:
            w.settle_until = time.monotonic() + self.admission_settle_seconds
        elif first:
            w.settle_until = time.monotonic()
        return webhook_deleted

    async def _release_gated(self, w: _Withdrawal, key: str) -> int:
        """Run ``ungate_remaining`` with what is left of the release deadline (all of
        ``uninstall_deadline_seconds`` on the first attempt); the pods it released. After
        :data:`RELEASE_ATTEMPTS` failures of ``key`` in a row (the work queue's count), go on
        without it: the caller must not be held forever."""
        if self.ungate_remaining is None:
            return 0
        deadline = self.uninstall_deadline_seconds
        if w.release_by is None:
            w.release_by = time.monotonic() + deadline
        else:
            deadline = _remaining(w.release_by)
        try:
            return await self.ungate_remaining(deadline)
        except Exception:
            if self._failures(key) + 1 < RELEASE_ATTEMPTS:
                raise
            log.exception("releasing the gated pods failed %d times; going on",
                          RELEASE_ATTEMPTS)
            return 0

    async def _stand_down(self, seen: _Observed, key: str) -> ReconcileResult:
        """One pass of :meth:`last_stop` when the product is not being removed.

        Returns:
            ``standing-down`` with the settle time still to wait, or ``stood-down`` (done).
        """
        w = self._withdrawing(uninstall=False)
        await self._withdraw_admission(w, everything=False)
        wait = _remaining(w.settle_until)
        if wait > 0:
            return ReconcileResult("standing-down", "unchanged", ungated=w.ungated,
                                   requeue_after=wait)
        w.ungated += await self._release_gated(w, key)
        message = (f"no controller is running: the admission policy is paused (its params "
                   f"object is deleted) and {w.ungated} gated pods were released; the next "
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
        if seen.service_account is not None:
            await self._release_service_account()
        self._withdrawal = None
        return ReconcileResult("stood-down", "unchanged", ungated=w.ungated)

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
        (:mod:`controller.core.ownership`). Failures are reported in :attr:`guard_problem` (the
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

    async def _apply_policy(self, placement: PlacementConfig,
                            selection: WebhookNamespaceSelection,
                            owner: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
        """Converge the MutatingAdmissionPolicy, its params object and its binding: present
        when ``spec.admission.mechanism`` of the parsed config ``placement`` is ``Auto`` and
        the API server serves the API, absent otherwise.

        A live binding that takes its params from elsewhere (release 0.1.0's names the
        cluster-scoped ``ImagePlatforms``: :func:`controller.core.legacy.reads_other_params`)
        is deleted first, before the policy is rewritten and before our params object can
        exist, and created anew last: no moment pairs our policy with a binding that looks
        for its params elsewhere, and none lets the old binding read our params.

        Returns:
            ``(what is in force, problem, params uid)``: :data:`POLICY_IN_FORCE` or
            :data:`POLICY_ABSENT`, "" and the uid of the params object as read or created in
            this pass ("" when none: :func:`controller.core.config.admission_mark`); after
            an API error (reported as the problem, not raised: the webhook keeps gating),
            :data:`POLICY_AS_LEFT` when a binding ``podplacement-gate`` may still be there
            (found, or unknown), else
            :data:`POLICY_ABSENT`.
        """
        try:
            if not await self._policy_served():
                return POLICY_ABSENT, "", ""
            if placement.admission_mechanism != ADMISSION_AUTO:
                await self._delete_policy()
                return POLICY_ABSENT, "", ""
            binding = admissionpolicy.desired_binding(selection, params_namespace=self.namespace,
                                                      owner=owner)
            live = await self._get_or_none(BINDING_PATH)
            if live is not None and legacy.reads_other_params(live, binding):
                await self._delete_binding()
                log.info("deleted MutatingAdmissionPolicyBinding %s: its paramRef %s is not "
                         "ours (an earlier release's)", ADMISSION_POLICY_NAME,
                         (live.get("spec") or {}).get("paramRef"))
            await self._apply_object(POLICY_COLLECTION_PATH, POLICY_PATH,
                                     admissionpolicy.desired_policy(placement, owner),
                                     drifted=admissionpolicy.policy_drifted,
                                     update_body=self._replacement)
            self._policy_present = True
            # Before the binding: the API server skips the policy while its params object is
            # missing (pods pass unplaced and ungated; the webhook then gates them).
            params = await self._apply_object(self.params_collection_path, self.params_path,
                                     admissionpolicy.params_object(self.namespace),
                                     drifted=admissionpolicy.never_drifted,
                                     update_body=self._replacement)
            await self._apply_object(BINDING_COLLECTION_PATH, BINDING_PATH, binding,
                                     drifted=admissionpolicy.policy_drifted,
                                     update_body=self._replacement)
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
            return await self._get_or_none(BINDING_PATH) is not None
        except ApiError:
            return True

    async def _delete_binding(self) -> None:
        """Delete the binding ``podplacement-gate`` (absent is fine)."""
        try:
            await self.api.request("DELETE", BINDING_PATH)
        except NotFound:
            return

    async def _retire_previous(self) -> str:
        """Remove what earlier releases left and this one no longer uses
        (:data:`controller.core.legacy.RETIRED_CRDS`): for each such CRD still there, not
        already being deleted and older than the CRD that replaced it
        (:func:`controller.core.legacy.retire_now`: a younger one belongs to a rollback
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
                crd = await self._get_or_none(retired_crd_path(retired))
                if crd is None or (crd.get("metadata") or {}).get("deletionTimestamp"):
                    continue
                replacement = await self._get_or_none(
                    "/".join((CRD_COLLECTION_PATH, retired.replaced_by)))
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

    async def _apply_object(
        self, collection: str, path: str, desired: dict[str, Any], *,
        drifted: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
        update_body: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]],
    ) -> _Applied:
        """Create ``desired`` (a 409 means another writer was first: read it), or PUT
        ``update_body(live, desired)`` when ``drifted(live, desired)``; the action taken
        (``created``, ``unchanged``, ``updated``) and the object as the server returned it."""
        name, kind = desired["metadata"]["name"], desired["kind"]
        live = await self._get_or_none(path)
        if live is None:
            try:
                created = await self.api.request("POST", collection, body=desired)
                log.info("created %s %s", kind, name)
                return _Applied("created", created if isinstance(created, dict) else {})
            except ApiError as exc:
                if exc.status != 409:
                    raise
                live = await self._get_or_none(path)
                if live is None:
                    raise
        if not drifted(live, desired):
            return _Applied("unchanged", live)
        updated = await self.api.request("PUT", path, body=update_body(live, desired))
        log.info("reverted drift of %s %s", kind, name)
        return _Applied("updated", updated if isinstance(updated, dict) else {})

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
        log.info("deleted ImagePlatformCatalog %s/%s", self.namespace, PARAMS_NAME)
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
