"""The PodPlacementConfig ``cluster`` itself: its finalizer and its status.

:class:`ConfigStatus` reads the config, keeps or removes its finalizer and writes its
``status`` (conditions, ``observedGeneration``, ``status.admission``). The conditions it
writes come from the pure functions here, which hold every status text of the lifecycle in
one place (metav1.Condition semantics: ``lastTransitionTime`` changes only when a
condition's status changes, :func:`merge_conditions`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podplacement.controller.lifecycle.admissionobjects import (
    POLICY_ABSENT,
    POLICY_AS_LEFT,
    POLICY_IN_FORCE,
)
from podplacement.controller.lifecycle.objects import get_or_none, patch_finalizer
from podplacement.controller.lifecycle.paths import CONFIG_PATH
from podplacement.kubeclient import MERGE_PATCH, ApiError, KubeRequester
from podplacement.rules.admit.webhookconfig import WebhookNamespaceSelection
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    STATUS_ARCH_TAINTS,
    WEBHOOK_CONFIGURATION_NAME,
    PlacementConfig,
)
from podplacement.rules.tolerations import ArchTaint, taints_value

COND_AVAILABLE = "Available"
#: ``status.admission.mechanism``: what adds the gate (and places warm pods) at admission.
ADMISSION_MECHANISM_POLICY = "MutatingAdmissionPolicy"
ADMISSION_MECHANISM_WEBHOOK = "Webhook"
COND_PROGRESSING = "Progressing"
COND_DEGRADED = "Degraded"
COND_DEPROVISIONING = "Deprovisioning"
CONDITION_TYPES = (COND_AVAILABLE, COND_PROGRESSING, COND_DEGRADED, COND_DEPROVISIONING)


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """A wanted condition: ``status`` is ``"True"``, ``"False"`` or ``"Unknown"``."""

    type: str
    status: str
    reason: str
    message: str = ""


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


def degradations(guard_problem: str, parse_error: str | None,
                 selection: WebhookNamespaceSelection) -> list[ConditionSpec]:
    """The Degraded conditions known before any write, most important first: the uninstall
    guards' problem ("" when none), the config's parse error (None when none) and a
    namespaceSelector the webhook cannot express exactly."""
    degraded: list[ConditionSpec] = []
    if guard_problem:
        degraded.append(ConditionSpec(COND_DEGRADED, "True", "UninstallGuardsFailed",
                                      guard_problem[:1000]))
    if parse_error is not None:
        degraded.append(ConditionSpec(COND_DEGRADED, "True", "InvalidConfig", parse_error))
    if not selection.exact:
        degraded.append(ConditionSpec(COND_DEGRADED, "True",
                                      "NamespaceSelectorNotExpressible", selection.reason))
    return degraded


def available_conditions(policy: str, degraded: Sequence[ConditionSpec]) -> list[ConditionSpec]:
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


def admission_status(policy: str, placement: PlacementConfig) -> dict[str, str]:
    """``status.admission`` of a converged config: the mechanism that gates at admission
    (the webhook when ``policy`` is :data:`POLICY_ABSENT`, else the policy) and
    ``spec.admission.fastPaths`` of ``placement``."""
    return {
        "mechanism": (ADMISSION_MECHANISM_WEBHOOK if policy == POLICY_ABSENT
                      else ADMISSION_MECHANISM_POLICY),
        "fastPaths": placement.admission_fast_paths,
    }


def failed_conditions(exc: Exception) -> list[ConditionSpec]:
    """The conditions after the webhook configuration (an :class:`ApiError`) or the CA
    bundle (anything else) failed: not available, retrying, degraded."""
    reason = "WebhookConfigurationFailed" if isinstance(exc, ApiError) else (
        "CABundleUnavailable")
    return [
        ConditionSpec(COND_AVAILABLE, "False", reason, str(exc)[:1000]),
        ConditionSpec(COND_PROGRESSING, "True", "Retrying", str(exc)[:1000]),
        ConditionSpec(COND_DEGRADED, "True", reason, str(exc)[:1000]),
        ConditionSpec(COND_DEPROVISIONING, "False", "AsExpected"),
    ]


def deprovisioning_conditions(reason: str) -> list[ConditionSpec]:
    """The conditions while the ordered uninstall runs, for the uninstall's ``reason``."""
    return [
        ConditionSpec(COND_AVAILABLE, "False", "Deprovisioning", reason),
        ConditionSpec(COND_PROGRESSING, "True", "Deprovisioning",
                      "removing the admission objects, ungating pods"),
        ConditionSpec(COND_DEGRADED, "False", "AsExpected"),
        ConditionSpec(COND_DEPROVISIONING, "True", "Uninstalling", reason),
    ]


def stood_down_conditions(message: str) -> list[ConditionSpec]:
    """The conditions the last controller leaves when it stands down (``message``: what it
    did)."""
    return [
        ConditionSpec(COND_AVAILABLE, "False", "NoController", message),
        ConditionSpec(COND_PROGRESSING, "False", "NoController"),
        ConditionSpec(COND_DEGRADED, "True", "NoController", message),
        ConditionSpec(COND_DEPROVISIONING, "False", "AsExpected"),
    ]


class ConfigStatus:
    """The config object ``cluster``: reads it, adds and removes its finalizer and writes
    its status.

    API: ``GET`` and ``PATCH`` (JSON patch of ``metadata.finalizers``)
    :data:`controller.lifecycle.paths.CONFIG_PATH`, merge ``PATCH`` of its ``/status``.
    Errors: :class:`ApiError` from every method (a finalizer patch re-reads and retries a
    lost race at most three times first: :func:`controller.lifecycle.objects.patch_finalizer`).

    Args:
        api: a :class:`kubeclient.KubeAPI` (or anything with its ``request``).
    """

    def __init__(self, api: KubeRequester) -> None:
        self.api = api
        #: The architecture taints on the Nodes now (the controller's Node informer,
        #: :func:`rules.tolerations.node_arch_taints`), published with every status write in
        #: ``status.architectureTaints.observed`` for the webhook, which has no Node view;
        #: None: not published.
        self.arch_taints: Callable[[], Sequence[ArchTaint]] | None = None

    async def get(self) -> dict[str, Any] | None:
        """The config as the server has it; None when there is none."""
        return await get_or_none(self.api, CONFIG_PATH)

    async def ensure_finalizer(self, config: dict[str, Any]) -> dict[str, Any]:
        """Add the finalizer to ``config`` (as last read) unless it is there; the config as
        written (``config`` when nothing changed or it is gone)."""
        return await patch_finalizer(self.api, CONFIG_PATH, config, add=True) or config

    async def release_finalizer(self, config: dict[str, Any]) -> None:
        """Remove our finalizer from ``config`` (as last read) when it has it."""
        await patch_finalizer(self.api, CONFIG_PATH, config, add=False)

    async def write(
        self, config: Mapping[str, Any], wanted: Sequence[ConditionSpec], *,
        admission: Mapping[str, str] | None = None,
    ) -> bool:
        """Merge-patch ``status`` when the conditions, observedGeneration or ``admission``
        (which mechanism is in force: ``{"mechanism": "MutatingAdmissionPolicy" |
        "Webhook", "fastPaths": "Enabled" | "Disabled"}``) changed; whether it was
        written."""
        meta = config.get("metadata") or {}
        generation = int(meta.get("generation") or 0)
        status = config.get("status") or {}
        old_conditions = status.get("conditions") or []
        conditions = merge_conditions(old_conditions, wanted, generation=generation, now=_now())
        same_admission = admission is None or status.get("admission") == dict(admission)
        observed = taints_value(self.arch_taints()) if self.arch_taints is not None else None
        published = status.get(STATUS_ARCH_TAINTS)
        same_taints = observed is None or (
            isinstance(published, Mapping) and published.get("observed") == observed)
        if (conditions == old_conditions and status.get("observedGeneration") == generation
                and same_admission and same_taints):
            return False
        # A merge patch replaces the conditions list as a whole (reference:
        # crd-podplacementconfig.json), which is what we want: we own every condition.
        body: dict[str, Any] = {"observedGeneration": generation, "conditions": conditions}
        if admission is not None:
            body["admission"] = dict(admission)
        if observed is not None:
            body[STATUS_ARCH_TAINTS] = {"observed": observed}
        await self.api.request("PATCH", CONFIG_PATH + "/status", body={"status": body},
                               content_type=MERGE_PATCH)
        return True
