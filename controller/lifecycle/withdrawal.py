"""The ordered uninstall and the last controller's stand-down: both withdraw what gates new
pods, wait for the API server's admission chain to follow, release every pod still gated and
remove the finalizers no live controller would honour (docs/guide/uninstall.md). Each pass
is idempotent and never sleeps: it asks to run again after the time still to wait."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from podplacement.controller.lifecycle.admissionobjects import AdmissionObjects
from podplacement.controller.lifecycle.guards import UninstallGuards
from podplacement.controller.lifecycle.passes import Observed, ReconcileResult
from podplacement.controller.lifecycle.status import (
    ConfigStatus,
    deprovisioning_conditions,
    stood_down_conditions,
)
from podplacement.kubeclient import ApiError
from podplacement.rules import ownership

log = logging.getLogger(__name__)

UngateRemaining = Callable[[float], Awaitable[int]]

#: Failed attempts at releasing the gated pods (``ungate_remaining``) after which the
#: uninstall or the stand-down goes on without them: it must not hold the finalizers forever.
RELEASE_ATTEMPTS = 3


@dataclass(slots=True)
class Progress:
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


def _remaining(until: float | None) -> float:
    """Seconds from now (``time.monotonic()``) to ``until``; 0 when past or None."""
    return 0.0 if until is None else max(0.0, until - time.monotonic())


class Withdrawal:
    """One pass at a time of the ordered uninstall (:meth:`uninstall`) or of the stand-down
    (:meth:`stand_down`), with their progress in this process.

    API: through the jobs it is given: ``DELETE`` of the admission policy, its binding, the
    params object and the webhook configuration (:class:`AdmissionObjects`); ``GET``, status
    ``PATCH`` and finalizer ``PATCH`` of the config (:class:`ConfigStatus`); ``GET``
    and finalizer ``PATCH`` of the controller's ServiceAccount (:class:`UninstallGuards`);
    the pods through ``ungate_remaining``.
    Errors: :class:`ApiError` of a deletion or a finalizer patch (status writes are best
    effort); whatever ``ungate_remaining`` raised before its :data:`RELEASE_ATTEMPTS`-th
    failure of the key in a row.

    Args:
        admission, config, guards: the jobs whose objects it removes.
        ungate_remaining: ``callback(deadline_seconds) -> pods ungated``; None: no pods.
        failures: the work queue's count of consecutive failures of a key.
        uninstall_deadline_seconds: the release deadline, counted from the first attempt.
        admission_settle_seconds: time between the last deletion and the release.
    """

    def __init__(
        self, *, admission: AdmissionObjects, config: ConfigStatus,
        guards: UninstallGuards, ungate_remaining: UngateRemaining | None,
        failures: Callable[[str], int], uninstall_deadline_seconds: float,
        admission_settle_seconds: float,
    ) -> None:
        self.admission = admission
        self.config = config
        self.guards = guards
        self.ungate_remaining = ungate_remaining
        self._failures = failures
        self.uninstall_deadline_seconds = uninstall_deadline_seconds
        self.admission_settle_seconds = admission_settle_seconds
        self._progress: Progress | None = None
        #: True once the ordered uninstall released the controller's ServiceAccount.
        self.gone = False

    @property
    def uninstalling(self) -> bool:
        """True while an ordered uninstall started here has not finished."""
        return self._progress is not None and self._progress.uninstall

    def reset(self) -> None:
        """Forget the progress (nothing is being withdrawn any more)."""
        self._progress = None

    def _withdrawing(self, *, uninstall: bool) -> Progress:
        """The withdrawal under way, or a new one."""
        if self._progress is None:
            self._progress = Progress(uninstall)
        elif uninstall:
            self._progress.uninstall = True
        return self._progress

    async def uninstall(self, seen: Observed, reason: str, key: str) -> ReconcileResult:
        """One pass of the ordered uninstall for the work-queue key ``key`` (``seen``: this
        pass's reads; ``reason``: why): nothing gates new pods; once that has settled, every
        gated pod is released and the config's finalizer goes; when the product itself is
        being removed (its namespace or ServiceAccount is being deleted), the
        ServiceAccount's finalizer goes last of all (its token dies with it: :attr:`gone`).

        Returns:
            ``uninstalling`` with the settle time still to wait, or ``uninstalled`` (done).
        """
        w = self._withdrawing(uninstall=True)
        if w.settle_until is None:
            log.info("ordered uninstall: %s", reason)
        if seen.config is not None and ownership.has_finalizer(seen.config):
            with contextlib.suppress(ApiError):
                await self.config.write(seen.config, deprovisioning_conditions(reason))
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
        fresh = await self.config.get()
        if fresh is not None:
            await self.config.release_finalizer(fresh)
        # 4. the controller itself is going: its ServiceAccount's finalizer, last of all
        if ownership.product_removed(seen.namespace, seen.service_account):
            await self.guards.release_service_account()
            self.gone = True
        self._progress = None
        return ReconcileResult("uninstalled", webhook, ungated=w.ungated)

    async def stand_down(self, seen: Observed, key: str) -> ReconcileResult:
        """One pass of the last controller's stand-down (the product is not being removed):
        the params object goes (the API server then skips the policy), then every gated pod
        is released, the status says so and the finalizers of the config and of the
        ServiceAccount go.

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
        config = await self.config.get()
        if config is not None:
            with contextlib.suppress(ApiError):
                await self.config.write(config, stood_down_conditions(message))
            config = await self.config.get()
            if config is not None:
                await self.config.release_finalizer(config)
        if seen.service_account is not None:
            await self.guards.release_service_account()
        self._progress = None
        return ReconcileResult("stood-down", "unchanged", ungated=w.ungated)

    async def _withdraw_admission(self, w: Progress, *, everything: bool) -> bool:
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
        policy_was_there = everything and self.admission.policy_may_exist
        if everything:
            await self.admission.delete_policy()
        params_deleted = await self.admission.delete_params()
        webhook_deleted = await self.admission.delete_webhook() if everything else False
        if policy_was_there or params_deleted or webhook_deleted:
            w.settle_until = time.monotonic() + self.admission_settle_seconds
        elif first:
            w.settle_until = time.monotonic()
        return webhook_deleted

    async def _release_gated(self, w: Progress, key: str) -> int:
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
