"""What one pass of the lifecycle reads first (:class:`Observed`) and what it reports
(:class:`ReconcileResult`): the plain data the jobs of :mod:`controller.lifecycle` pass
between them. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Observed:
    """The objects one pass reads first: the config, the product's namespace and the
    controller's ServiceAccount (None: absent, or not readable)."""

    config: dict[str, Any] | None
    namespace: dict[str, Any] | None
    service_account: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What one pass of :class:`controller.lifecycle.Lifecycle` found and did.

    Attributes:
        state: ``absent`` (no config), ``available``, ``uninstalling`` (the ordered uninstall
            waits for the admission chain to settle), ``uninstalled`` (finalizer released),
            ``standing-down`` / ``stood-down`` (the last controller's stand-down, waiting /
            done), ``idle`` (:meth:`controller.lifecycle.Lifecycle.finish` with nothing to
            finish).
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
