"""The coordinator of the PodPlacementConfig lifecycle: :class:`Lifecycle` builds the job
objects of :mod:`controller.lifecycle` and, for each work-queue key, decides which of them
run (converge, ordered uninstall or stand-down). The rules are in the package's docstring."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from podplacement.controller.lifecycle.admissionobjects import AdmissionObjects
from podplacement.controller.lifecycle.cabundle import CaBundleSource
from podplacement.controller.lifecycle.converge import Convergence
from podplacement.controller.lifecycle.guards import UninstallGuards
from podplacement.controller.lifecycle.passes import Observed, ReconcileResult
from podplacement.controller.lifecycle.retirement import PreviousReleases
from podplacement.controller.lifecycle.status import ConfigStatus
from podplacement.controller.lifecycle.withdrawal import UngateRemaining, Withdrawal
from podplacement.kubeclient import KubeRequester
from podplacement.rules import ownership
from podplacement.rules.admit.webhookconfig import ServiceRef

log = logging.getLogger(__name__)

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
#: Failed attempts of :data:`FINISH_KEY` or :data:`LAST_STOP_KEY` after which the key is given
#: up (the process is ending; e.g. its ServiceAccount token is no longer valid).
FINAL_ATTEMPTS = 3
#: Seconds :attr:`Lifecycle.final_seconds` allows beyond the settle time and the release
#: deadline, for the requests around them and the queue's retries.
FINAL_MARGIN_SECONDS = 15.0


class Lifecycle:
    """Reconciler of the PodPlacementConfig ``cluster`` (the package's docstring): the
    handler of :data:`KEYS` on the controller's work queue (:meth:`handle`). It reads the
    config, the product's namespace and the controller's ServiceAccount once per pass
    (:class:`Observed`) and hands them to the job that runs: :class:`Convergence` (the
    config's finalizer and status, the guards, the admission objects, the leftovers of
    earlier releases) or :class:`Withdrawal` (ordered uninstall, stand-down).

    API: its own reads are the three ``GET`` of :meth:`_observe` (and a SelfSubjectReview
    once, through :class:`UninstallGuards`); every write is a job's. Errors: each pass
    raises what its job raised (the queue retries), except as :meth:`handle` says.

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
        self.cert_manager_certificate = cert_manager_certificate
        self.ungate_remaining = ungate_remaining
        self.before_params_delete = before_params_delete
        self.resync_seconds = resync_seconds
        self.timeout_seconds = timeout_seconds
        self._failures: Callable[[str], int] = failures or (lambda _key: 0)
        self.last_result: ReconcileResult | None = None
        self.status = ConfigStatus(api)
        self.guards = UninstallGuards(api, namespace=namespace, service_account=service_account)
        self.admission = AdmissionObjects(
            api, namespace=namespace, service=self.service, url=url, ca_bundle=ca_bundle,
            cert_manager_certificate=cert_manager_certificate, timeout_seconds=timeout_seconds,
            before_params_delete=before_params_delete)
        self.previous_releases = PreviousReleases(api, namespace=namespace)
        self.convergence = Convergence(
            namespace=namespace, config=self.status, guards=self.guards,
            admission=self.admission, previous_releases=self.previous_releases)
        self.withdrawal = Withdrawal(
            admission=self.admission, config=self.status, guards=self.guards,
            ungate_remaining=ungate_remaining, failures=self._failures,
            uninstall_deadline_seconds=uninstall_deadline_seconds,
            admission_settle_seconds=admission_settle_seconds)
        self.params_path = self.admission.params_path
        self.params_collection_path = self.admission.params_collection_path

    # --- public API ---------------------------------------------------------------------
    @property
    def uninstalling(self) -> bool:
        """True while an ordered uninstall started by this process has not finished (a pass
        cut short by a lost lease or a stop leaves it true: :meth:`finish` completes it)."""
        return self.withdrawal.uninstalling

    @property
    def gone(self) -> bool:
        """True once the ordered uninstall released the controller's ServiceAccount: the
        product is gone, and this process has nothing left to do (its token dies with it)."""
        return self.withdrawal.gone

    @property
    def guard_problem(self) -> str:
        """The last problem with the uninstall guards ("" when in place or not applicable)."""
        return self.guards.problem

    @property
    def uninstall_deadline_seconds(self) -> float:
        """The release deadline of the uninstall and the stand-down (settable)."""
        return self.withdrawal.uninstall_deadline_seconds

    @uninstall_deadline_seconds.setter
    def uninstall_deadline_seconds(self, value: float) -> None:
        self.withdrawal.uninstall_deadline_seconds = value

    @property
    def admission_settle_seconds(self) -> float:
        """The time between the last deletion and the release (settable)."""
        return self.withdrawal.admission_settle_seconds

    @admission_settle_seconds.setter
    def admission_settle_seconds(self, value: float) -> None:
        self.withdrawal.admission_settle_seconds = value

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
        namespace_obj = await self.guards.get_namespace()
        return ownership.product_removed(namespace_obj, await self.guards.get_service_account())

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
                its :data:`controller.lifecycle.withdrawal.RELEASE_ATTEMPTS`-th failure.
        """
        seen = await self._observe()
        reason = self._uninstall_reason(seen)
        if reason:
            result = await self.withdrawal.uninstall(seen, reason, LIFECYCLE_KEY)
        else:
            self.withdrawal.reset()
            result = await self.convergence.converge(seen)
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
        return await self.withdrawal.uninstall(seen, reason, FINISH_KEY)

    async def last_stop(self) -> ReconcileResult:
        """One pass of :data:`LAST_STOP_KEY`, served by the last controller to stop
        gracefully (no other took the lease) after its pod workers stopped: the ordered
        uninstall when the config, the namespace or the ServiceAccount is being deleted,
        else the **stand-down** (:meth:`Withdrawal.stand_down`: the params object goes, so
        the API server skips the policy; every gated pod is released through
        :attr:`ungate_remaining`; the status says ``NoController``; the finalizers no
        controller is left to honour go). The policy, its binding and the webhook
        configuration stay, harmless without the params object; the next leader restores
        everything.

        Returns:
            The result; ``requeue_after`` None once finished, else the settle time still
            to wait.

        Raises:
            ApiError: a read or write failed.
        """
        seen = await self._observe()
        reason = self._uninstall_reason(seen)
        if reason:
            return await self.withdrawal.uninstall(seen, reason, LAST_STOP_KEY)
        return await self.withdrawal.stand_down(seen, LAST_STOP_KEY)

    # --- normal path -------------------------------------------------------------------
    async def _observe(self) -> Observed:
        namespace_obj = await self.guards.get_namespace()
        service_account = await self.guards.get_service_account()
        return Observed(await self.status.get(), namespace_obj, service_account)

    def _uninstall_reason(self, seen: Observed) -> str:
        return ownership.uninstall_reason(seen.config, seen.namespace, seen.service_account,
                                          namespace=self.namespace)
