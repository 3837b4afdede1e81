"""The normal pass of the lifecycle, while nothing is being deleted: with a config, its
finalizer, the uninstall guards, the admission objects, the leftovers of earlier releases
and the status that says what is in force; without one, no admission objects."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from podplacement.controller.lifecycle.admissionobjects import AdmissionObjects
from podplacement.controller.lifecycle.guards import UninstallGuards
from podplacement.controller.lifecycle.passes import Observed, ReconcileResult
from podplacement.controller.lifecycle.retirement import PreviousReleases
from podplacement.controller.lifecycle.status import (
    COND_DEGRADED,
    ConditionSpec,
    ConfigStatus,
    admission_status,
    available_conditions,
    degradations,
    failed_conditions,
)
from podplacement.kubeclient import ApiError
from podplacement.rules import ownership
from podplacement.rules.admit.webhookconfig import webhook_namespace_selection
from podplacement.rules.config import config_or_defaults


class Convergence:
    """One converging pass (:meth:`converge`): it orders the jobs it is given and turns what
    they report into the status.

    API: through the jobs it is given (:class:`ConfigStatus`, :class:`UninstallGuards`,
    :class:`AdmissionObjects`, :class:`PreviousReleases`), in this order: the config's
    finalizer, the guards, the policy and the webhook configuration, the leftovers, the
    status.
    Errors: :class:`ApiError` of a read or write (the queue retries with backoff); whatever
    the CA bundle source raised. A failure of the webhook configuration or the CA bundle is
    written to the status first.

    Args:
        namespace: the product's namespace (excluded from the webhook's namespaces).
        config, guards, admission, previous_releases: the jobs it runs.
    """

    def __init__(self, *, namespace: str, config: ConfigStatus, guards: UninstallGuards,
                 admission: AdmissionObjects, previous_releases: PreviousReleases) -> None:
        self.namespace = namespace
        self.config = config
        self.guards = guards
        self.admission = admission
        self.previous_releases = previous_releases

    async def converge(self, seen: Observed) -> ReconcileResult:
        """Nothing is being deleted (``seen``: this pass's reads): no config, no admission
        objects; else the finalizer, the guards, the admission objects and the status.

        Returns:
            ``absent`` (no config) or ``available``, ``requeue_after`` None.
        """
        if seen.config is None:
            await self.admission.delete_policy()
            deleted = await self.admission.delete_webhook()
            await self.previous_releases.retire()
            return ReconcileResult("absent", "deleted" if deleted else "absent")
        config = await self.config.ensure_finalizer(seen.config)
        await self.guards.ensure(seen.namespace, seen.service_account)
        return await self._apply(config, ownership.namespace_owner(seen.namespace))

    async def _apply(self, config: dict[str, Any],
                     owner: Sequence[Mapping[str, Any]]) -> ReconcileResult:
        """The webhook configuration and the admission policy of ``config`` (parsed once,
        here), and the status that says so."""
        placement, parse_error = config_or_defaults(config)
        selection = webhook_namespace_selection(config, self.namespace)
        degraded = degradations(self.guards.problem, parse_error, selection)
        try:
            action, policy, policy_problem = await self.admission.apply(
                config, placement, selection, owner)
        except Exception as exc:
            with contextlib.suppress(ApiError):
                await self.config.write(config, failed_conditions(exc))
            raise
        if policy_problem:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "AdmissionPolicyFailed",
                                          policy_problem[:1000]))
        retire_problem = await self.previous_releases.retire()
        if retire_problem:
            degraded.append(ConditionSpec(COND_DEGRADED, "True", "PreviousReleaseLeftovers",
                                          retire_problem[:1000]))
        wanted = available_conditions(policy, degraded)
        written = await self.config.write(config, wanted,
                                          admission=admission_status(policy, placement))
        return ReconcileResult("available", action, status_written=written,
                               degraded=wanted[2].reason if wanted[2].status == "True" else "")
