"""Is a controller running? The webhook's view of the controller's leader Lease.

With the gate added inside the API server (the MutatingAdmissionPolicy ``podplacement-gate``),
a controller that is down or crash-looping would hold every new pod of the cluster gated.
:class:`ControllerLease` watches the Lease ``podplacement-controller`` in podplacement's own
namespace (an informer on that one object, :class:`webhook.configsource.NamedObjectWatch`)
and notes, on the webhook's own monotonic clock, when its record last changed: a leader renews
it every few seconds. As in client-go's leader election, the Lease's own timestamps are not
compared with this clock (clocks of different hosts may disagree); only the time a change was
*observed* counts.

:meth:`ControllerLease.available` is False once no change was observed for longer than
``threshold`` seconds (default 60; before the first read, the time counts from the
webhook's start), and once the Lease has been seen released (no holder) or missing for
``released_grace`` seconds (:data:`rules.config.LEASE_RELEASED_GRACE_SECONDS`, 4): a
controller that stops gracefully releases it; a standby takes it within one retry period
(about 2 s), so a handover keeps gating; the last controller to stop waits longer than the
grace and then stands down (:meth:`controller.lifecycle.Lifecycle.last_stop`), releasing
what was gated meanwhile. The
webhook then stops holding new pods: it places them at admission itself, or releases them
with the controller's fallback (:mod:`webhook.outage`; docs/how-it-decides.md "No cluster-wide
stall when the controller is down"). Normal gating resumes as soon as the Lease is renewed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from podplacement.kubeclient import KubeAPI, resource_path
from podplacement.rules.config import LEASE_NAME, LEASE_RELEASED_GRACE_SECONDS
from podplacement.webhook.configsource import NamedObjectWatch

#: How long the Lease may go unrenewed before the webhook stops holding pods (seconds).
DEFAULT_UNAVAILABLE_AFTER = 60.0


def lease_list_path(namespace: str) -> str:
    """The Lease collection of ``namespace`` (coordination.k8s.io/v1), checked.

    Raises:
        InvalidPathSegment: ``namespace`` is not an acceptable path segment.
    """
    return resource_path("coordination.k8s.io", "v1", "leases", namespace=namespace)


class ControllerLease(NamedObjectWatch):
    """Watches the controller's leader Lease and tells whether a controller is running.

    Args:
        api: the API client (the webhook's ServiceAccount needs get/list/watch on ``leases``
            in ``namespace``); not closed by :meth:`stop`.
        namespace: podplacement's own namespace.
        threshold: seconds without an observed renewal after which :meth:`available` is
            False (> 0).
        name: the Lease's name.
        clock: monotonic seconds (tests pass a fake).
        watch_timeout: ``timeoutSeconds`` of each watch call.

        released_grace: seconds a released or missing Lease still counts as a running
            controller (a handover).

    Raises:
        ValueError: ``threshold`` is not positive.
    """

    def __init__(self, api: KubeAPI, namespace: str, *,
                 threshold: float = DEFAULT_UNAVAILABLE_AFTER, name: str = LEASE_NAME,
                 clock: Callable[[], float] = time.monotonic, watch_timeout: int = 300,
                 released_grace: float = LEASE_RELEASED_GRACE_SECONDS) -> None:
        if not threshold > 0:
            raise ValueError(f"threshold must be positive, got {threshold!r}")
        self.threshold = threshold
        self._clock = clock
        self._record: tuple[Any, ...] | None = None
        self._observed = clock()
        self.released_grace = released_grace
        #: when the Lease was first seen without a holder (None: it has one, or not read yet)
        self._released_at: float | None = None
        super().__init__(api, lease_list_path(namespace), name, backoff_max=5.0,
                         watch_timeout=watch_timeout)

    def _apply(self, obj: Mapping[str, Any] | None) -> None:
        record = lease_record(obj)
        if record is None:
            if self._released_at is None:
                self._released_at = self._clock()
        else:
            self._released_at = None
        if record != self._record:
            self._record = record
            if record is not None:
                self._observed = self._clock()

    def available(self) -> bool:
        """True while the Lease has a holder whose renewal was observed within
        ``threshold`` seconds (before the first read: less than ``threshold`` seconds since
        the webhook started); for a Lease seen released or missing, only during its first
        ``released_grace`` seconds."""
        now = self._clock()
        if self._released_at is not None:
            return now - self._released_at <= self.released_grace
        return now - self._observed <= self.threshold

    def seconds_since_renewal(self) -> float:
        """Seconds since the last observed change of the Lease record (or the start)."""
        return self._clock() - self._observed


def lease_record(obj: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """The fields of a Lease whose change means "renewed": ``(holderIdentity, renewTime,
    acquireTime, leaseTransitions)``; None for no Lease or a Lease without a holder (a
    released Lease is not a running controller)."""
    spec = (obj or {}).get("spec") or {}
    if not isinstance(spec, Mapping) or not spec.get("holderIdentity"):
        return None
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"),
            spec.get("leaseTransitions"))
