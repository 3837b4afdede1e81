"""The leadership term: what this replica does when it wins the lease and when it loses it.

One job: start and end a term. A term starts (:meth:`LeadershipTerm.start_leading`) once the
gated-pod cache is synced (and, for at most 5 s each, the first read of the registry rules and
the placement policies): the placement controller (a :class:`controller.generic.Controller`
of string keys) started with a new work queue, every pod still gated on it, the lease runnables
(:meth:`controller.runnables.Manager.start_leading`) and, when this process runs the
lifecycle, the keys :data:`controller.lifecycle.LIFECYCLE_KEY`,
:data:`controller.paramswriter.PARAMS_KEY` and :data:`controller.alwaysfresh.FRESH_KEY`, after
the params writer started with the configured TTL. A term ends
(:meth:`LeadershipTerm.stop_leading`) with the queue shut down (work in flight cancelled), the
lease runnables and the params writer stopped; an ordered uninstall under way, or due because
the product is being removed, is then served to its end on a one-worker queue of its own
(:data:`controller.lifecycle.FINISH_KEY`, bounded). On the last graceful stop
(:meth:`LeadershipTerm.last_stop`) the stand-down (:data:`controller.lifecycle.
LAST_STOP_KEY`) is served the same way unless another controller takes the Lease.

Reads the gated-pod cache, the Lease (GET, :meth:`LeadershipTerm.successor`) and whether the
product is being removed (:meth:`controller.lifecycle.Lifecycle.removal_due`); writes the
``podplacement_leader`` gauge. The queue's keys are served by the handler given
(:meth:`controller.app.Controller.reconcile`). Errors: none raised; a failed read of the
removal or the Lease is logged or means no.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from podplacement.controller.alwaysfresh import FRESH_KEY
from podplacement.controller.generic import STR_KEYS, Controller, QueueSettings
from podplacement.controller.lifecycle import FINISH_KEY, LAST_STOP_KEY, LIFECYCLE_KEY
from podplacement.controller.paramswriter import PARAMS_KEY, ParamsWriter
from podplacement.controller.reconciler import pod_key
from podplacement.controller.runnables import Manager
from podplacement.kubeclient import ApiError, Informer, KubeAPI
from podplacement.rules.config import LEASE_NAME, LEASE_RELEASED_GRACE_SECONDS
from podplacement.rules.freshness import PullAlwaysFreshness
from podplacement.rules.podspec import has_gate

if TYPE_CHECKING:
    from podplacement.controller.lifecycle import Lifecycle, UngateRemaining

log = logging.getLogger(__name__)

#: The handler of a work-queue key: None (done) or seconds until it runs again.
Handler = Callable[[str], Awaitable[float | None]]


class Gauge(Protocol):
    """A gauge that can be set (``prometheus_client.Gauge``)."""

    def set(self, value: float) -> None: ...


class LeadershipTerm:
    """The start and end of this replica's leadership terms, and the queue of the current one.

    Args:
        api: the Kubernetes client (the Lease GET of :meth:`successor`).
        namespace: the product's namespace (the Lease's).
        queues: how the work queues are built.
        reconcile: the handler of every key of the queue.
        pods: the gated-pod informer (synced before a term starts; its pods queued).
        waits: the events a new term waits for, at most 5 s each, in order (the first read
            of the registry rules, the placement policies' sync).
        config_synced: the config informer's sync (awaited, 5 s at most, before the params
            writer starts).
        leader_gauge: ``podplacement_leader``.
        runtime: the manager of the runnables (its lease runnables start and stop here).
        params_writer: the params writer (started with a term that runs the lifecycle,
            stopped at its end).
        freshness: the Always tags in use (cleared at a term's end: a new term starts from
            the pods it sees).
        apply_params_ttl: gives the params store the configured TTL.
        standby_wait: see :class:`controller.app.ControllerOptions`.

    Attributes:
        leading: True during a term.
        queue: the placement controller (:class:`controller.generic.Controller` of string
            keys; a new work queue per term).
        final_queue: the one-worker controller serving a lifecycle key to its end after a term
            (:meth:`serve_to_end`); None otherwise.
        lifecycle: the PodPlacementConfig lifecycle when this process runs it (set by
            :meth:`controller.app.Controller.start`), else None.
    """

    def __init__(self, api: KubeAPI, *, namespace: str, queues: QueueSettings,
                 reconcile: Handler, pods: Informer, waits: tuple[asyncio.Event, ...],
                 config_synced: asyncio.Event, leader_gauge: Gauge, runtime: Manager,
                 params_writer: ParamsWriter, freshness: PullAlwaysFreshness,
                 apply_params_ttl: Callable[[], None], standby_wait: float) -> None:
        self._api = api
        self._namespace = namespace
        self.queues = queues
        self._reconcile = reconcile
        self._pods = pods
        self._waits = waits
        self._config_synced = config_synced
        self._gauge = leader_gauge
        self.runtime = runtime
        self._writer = params_writer
        self._freshness = freshness
        self._apply_params_ttl = apply_params_ttl
        self._standby_wait = standby_wait
        self.leading = False
        self.queue: Controller[str] = Controller("placement", reconcile, queues,
                                                 codec=STR_KEYS)
        self.final_queue: Controller[str] | None = None
        self.lifecycle: Lifecycle | None = None

    def failures(self, key: str) -> int:
        """The failure count of ``key`` in the queue serving it: the final queue while
        :meth:`serve_to_end` runs (tested against None: an idle queue has length 0 and
        is falsy), else the main queue."""
        queue = self.final_queue if self.final_queue is not None else self.queue
        return queue.failures(key)

    async def start_leading(self) -> None:
        """Start a term (the leader elector's ``on_started_leading``; no-op while leading)."""
        if self.leading:
            return
        await self._pods.synced.wait()
        # Give the first read of the registries ConfigMap a moment, so that pods queued now
        # are not looked up with the wrong registry rules; never wait on it for long. Nor
        # without the namespaces' placement policies (absent CRD: synced at once).
        for event in self._waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 5.0)
        self.leading = True
        self._gauge.set(1)
        self.queue.start()
        for pod in list(self._pods.cache.values()):
            if has_gate(pod):
                self.queue.add(pod_key(pod))
        self.runtime.start_leading()
        if self.lifecycle is not None:
            self.queue.add(LIFECYCLE_KEY)
            # The writer's first tick adopts and expires by the TTL: the configured one.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._config_synced.wait(), 5.0)
            self._apply_params_ttl()
            self._writer.start()
            self.queue.add(PARAMS_KEY)
            self.queue.add(FRESH_KEY)
        log.info("controller leading: %d gated pods queued", len(self._pods.cache))

    async def stop_leading(self) -> None:
        """End of a leadership term (lost lease, or the process stops): the queue is shut
        down, so no pod is placed here any more and the lifecycle's and the params writer's
        work in flight is cancelled; the webhook configuration and the rest stay for the next
        leader. An ordered uninstall under way here, or due because the product itself is
        being removed (its namespace's deletion deletes the Lease, and no replica can
        lead again), is then finished on a queue of its own before the term ends
        (:meth:`serve_to_end` of :data:`controller.lifecycle.FINISH_KEY`, bounded). Whether
        the product is being removed is read once: when that read fails (the API server is
        unreachable, the usual reason for a lost lease), the term ends at once, so this
        process can campaign again as soon as the server is back."""
        if not self.leading:
            return
        self.leading = False
        self._gauge.set(0)
        await self.queue.stop()
        self._freshness.clear()  # a new term starts from the pods it sees
        await self.runtime.stop_leading()
        await self._writer.stop()
        if self.lifecycle is not None and await finish_due(self.lifecycle):
            await self.serve_to_end(FINISH_KEY)

    async def serve_to_end(self, key: str) -> None:
        """Serve the lifecycle key ``key`` alone on a one-worker queue of its own (the same
        backoff and failure count as the main queue's) until its pass says done, or
        :attr:`controller.lifecycle.Lifecycle.final_seconds` have passed (then the pass in
        flight is cancelled). Never raises: the term or the process is ending."""
        assert self.lifecycle is not None
        queue = self.final_queue = Controller(key, self._reconcile, self.queues,
                                              codec=STR_KEYS, workers=1)
        queue.start()
        queue.add(key)
        try:
            async with asyncio.timeout(self.lifecycle.final_seconds):
                await queue.wait_idle()
        except TimeoutError:
            log.warning("%s: not done within %.0f s; left", key, self.lifecycle.final_seconds)
        finally:
            await queue.stop()
            self.final_queue = None

    async def last_stop(self, identity: str) -> None:
        """Stand down (or finish the uninstall) unless another controller takes the lease
        within ``standby_wait`` seconds: :data:`controller.lifecycle.LAST_STOP_KEY` served
        to its end (:meth:`serve_to_end`), after the queue stopped placing pods. Bounded
        by the wait plus :attr:`controller.lifecycle.Lifecycle.final_seconds`; never
        raises: the process is ending."""
        # Past the webhook's grace for a released Lease, so the pods it gated meanwhile
        # are released below too.
        wait = max(self._standby_wait, LEASE_RELEASED_GRACE_SECONDS + 1.0)
        if await self.successor(identity, wait):
            return
        await self.serve_to_end(LAST_STOP_KEY)

    async def successor(self, identity: str, within: float) -> bool:
        """True when a controller other than ``identity`` holds the Lease within ``within``
        seconds (polled every 0.2 s); False when none does, or the Lease cannot be read."""
        from podplacement.controller.leader import lease_path

        path = lease_path(self._namespace, LEASE_NAME)
        deadline = time.monotonic() + max(0.0, within)
        while True:
            try:
                lease = await self._api.request("GET", path)
            except ApiError:
                return False
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
            if holder and holder != identity:
                log.info("controller %s took over; not standing down", holder)
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)


async def finish_due(lifecycle: Lifecycle) -> bool:
    """True when an ordered uninstall is under way here or the product is being
    removed (:meth:`controller.lifecycle.Lifecycle.removal_due`, one attempt; a failed
    read is logged and means no)."""
    if lifecycle.uninstalling:
        return True
    try:
        return await lifecycle.removal_due()
    except Exception as exc:
        log.warning("cannot tell whether podplacement is being removed: %s", exc)
        return False


class LifecycleOptions(Protocol):
    """The settings :func:`make_lifecycle` reads (:class:`controller.app.ControllerOptions`)."""

    @property
    def namespace(self) -> str: ...

    @property
    def webhook_url(self) -> str | None: ...

    @property
    def webhook_service(self) -> str | None: ...

    @property
    def cert_dir(self) -> str | None: ...

    @property
    def cert_manager_certificate(self) -> str | None: ...

    @property
    def uninstall_deadline_seconds(self) -> float: ...


def make_lifecycle(api: KubeAPI, o: LifecycleOptions, *, ungate_remaining: UngateRemaining,
                   before_params_delete: Callable[[], Awaitable[None]],
                   failures: Callable[[str], int]) -> Lifecycle | None:
    """The PodPlacementConfig lifecycle this process runs, or None when it runs none (neither
    ``webhook_url`` nor ``webhook_service`` set). Its CA bundle: none with cert-manager (its
    CA injector owns ``caBundle``), else ``cert_dir``'s, else the built-in Secret flow's."""
    if not (o.webhook_url or o.webhook_service):
        return None
    from podplacement.controller import lifecycle as lc

    ca: Any
    if o.cert_manager_certificate:
        ca = None  # cert-manager's CA injector owns caBundle
    elif o.cert_dir:
        ca = lc.ca_bundle_from_dir(o.cert_dir)
    else:
        if o.webhook_service:
            ca = lc.ServingCertSecret(api, o.namespace, service_name=o.webhook_service)
        else:
            ca = lc.ServingCertSecret(api, o.namespace)
    service = (o.namespace, o.webhook_service, 443, "/mutate") if o.webhook_service else None
    return lc.Lifecycle(
        api, namespace=o.namespace, service=service,
        url=o.webhook_url if not o.webhook_service else None, ca_bundle=ca,
        cert_manager_certificate=o.cert_manager_certificate,
        ungate_remaining=ungate_remaining,
        before_params_delete=before_params_delete,
        uninstall_deadline_seconds=o.uninstall_deadline_seconds,
        failures=failures,
    )
