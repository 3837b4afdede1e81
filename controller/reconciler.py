"""Per-pod reconcile: read the gated pod, inspect its images, decide, write once.

One key per pod (``namespace/name/uid``). The reconcile reads the latest pod from the
informer cache, skips pods that are gone or no longer carry our gate, reads the pod's pull
secrets from its own namespace (plus the optional global pull secret of the config),
inspects all images concurrently, decides with :func:`rules.place.plan.plan` (the pipeline
``explain`` shares) and sends its single guarded JSON patch.

Retries belong to the work queue, as in controller-runtime: a reconcile returns None
(done), a delay (a NUMA wait; the queue forgets the failure count first) or raises; the
queue counts the raises and backs off, and its count is the decision's ``failures``. A
stale pod (409, or the 422 a failed ``test`` gets) raises :class:`~kubeclient.Conflict`,
which the queue retries at once without counting (:class:`controller.queue.WorkQueue`
``retry_now``), decided again from the informer's newer copy; failed inspections raise
:class:`RetryLater` until ``imageInspection.maxRetries`` rounds, then the pod falls back.
Anything unexpected (odd spec, a patch the server rejects as invalid) ends in the
fallback release (:func:`rules.place.decision.fallback_ungate`: the fallback
architecture when one applies, the fallback operating systems), and in a plain ungate only
when the server refuses that too: no pod stays gated forever, none is released to any node
while its affinity can still be written (docs/how-it-decides.md, failures and fallback).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from podplacement.controller.credproviders import provider_credentials
from podplacement.controller.events import EventSink
from podplacement.controller.metrics import Metrics
from podplacement.imageinspect import ProviderRunner, PullSecretReader
from podplacement.kubeclient import (
    ApiError,
    Conflict,
    Informer,
    KubeAPI,
    NotFound,
    pod_path,
    secret_path,
)
from podplacement.rules.config import PlacementConfig
from podplacement.rules.numa import InFlight
from podplacement.rules.place.decision import (
    Decision,
    Outcome,
    fallback_ungate,
    invalid_pull_secret_event,
    plain_ungate,
    too_many_images,
    unique_images,
    unrecorded,
)
from podplacement.rules.place.placement import PlacementInputs
from podplacement.rules.place.plan import hold, parse_time, plan
from podplacement.rules.platforms import ImageLike
from podplacement.rules.podspec import has_gate, pull_secret_refs
from podplacement.rules.policy import PlacementPolicy, policy_for

log = logging.getLogger(__name__)

#: How many pods :meth:`Reconciler.released_here` remembers (about 40 bytes each).
RELEASED_MEMORY = 65536

#: The statuses of a PATCH the API server refuses for what it writes, not for when: 413
#: (Request Entity Too Large: the body, or the object it would make, is over the server's
#: limits) and 422 (Invalid: an affinity or annotation it does not accept). Retrying the same
#: decision cannot succeed, so the pod is released with the fallback instead.
REFUSED = {413: "too large", 422: "invalid"}


def refused_reason(status: int) -> str:
    """The reason of a release after the API server refused the placement PATCH with
    ``status`` (413 or 422), in our own words."""
    return (f"the API server refused the placement patch as {REFUSED.get(status, 'invalid')} "
            f"(HTTP {status})")

ConfigSource = Callable[[], tuple[PlacementConfig, str | None]]


def pod_key(pod: Mapping[str, Any]) -> str:
    """The queue key ``namespace/name/uid`` (deduplicates by UID: a re-created pod with the
    same name is a different key)."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}/{meta.get('uid')}"


def split_key(key: str) -> tuple[str, str, str]:
    """``namespace/name/uid`` → (namespace, name, uid)."""
    ns, name, uid = key.split("/", 2)
    return ns, name, uid


class ImageInspector(Protocol):
    """The seam to image inspection (``imageinspect.Inspector``): one lookup, raising the
    inspector's errors (``imageinspect.RegistryError`` and its family)."""

    async def inspect(self, image: str, credentials: Sequence[Any] = (), *,
                      pull_always: bool = False) -> ImageLike: ...


@dataclass
class _PodState:
    warned_secrets: set[tuple[str, str]] = field(default_factory=set)


class RetryLater(Exception):
    """A reconcile that must run again after the queue's backoff (the pod's images could
    not all be inspected, and ``imageInspection.maxRetries`` is not used up). The queue
    counts it as a failure; that count is the decision's ``failures`` next time."""


class Reconciler:
    """Reconciles gated pods (see the module docstring).

    Args:
        api: the Kubernetes client.
        pods: informer over gated pods (its cache is read, never written).
        inspector: an ``imageinspect.Inspector`` (``inspect(image, credentials,
            pull_always=)``).
        config_source: returns (PlacementConfig, error text or None).
        events: background event sink.
        metrics: metrics.
        nodes: informer over Nodes (node inventory, NUMA), optional.
        nrts: informer over NodeResourceTopologies, optional.
        inflight: ``rules.numa.InFlight`` for NUMA accounting, optional.
        failures: the queue's count of consecutive failed rounds of a key
            (:meth:`controller.queue.WorkQueue.failures`): inspection failures
            (:class:`RetryLater`) and API errors; conflicts are retried without counting;
            the queue owns the backoff.
        secret_ttl: seconds a pull secret read stays cached (per namespace/name).
        is_leader: only the leader writes; others return without doing anything.
        policies: namespace → its accepted placement policies, highest priority first
            (:meth:`controller.policywatch.PolicyWatch.of`); the one matching a pod
            (:func:`rules.policy.policy_for`) is applied.
        providers: the kubelet credential providers (:mod:`controller.credproviders`), or
            None.
    """

    def __init__(
        self,
        api: KubeAPI,
        pods: Informer,
        inspector: ImageInspector,
        config_source: ConfigSource,
        events: EventSink,
        metrics: Metrics,
        *,
        nodes: Informer | None = None,
        nrts: Informer | None = None,
        inflight: InFlight | None = None,
        failures: Callable[[str], int] = lambda key: 0,
        publish: Callable[[str, Any], None] | None = None,
        secret_ttl: float = 5.0,
        is_leader: Callable[[], bool] = lambda: True,
        policies: Callable[[str], Sequence[PlacementPolicy]] = lambda namespace: (),
        providers: ProviderRunner | None = None,
    ) -> None:
        self.api = api
        self.pods = pods
        self.inspector = inspector
        self.config_source = config_source
        self.events = events
        self.metrics = metrics
        self.nodes = nodes
        self.nrts = nrts
        self.inflight = inflight
        self.failures = failures
        self.publish = publish
        self.secrets = PullSecretReader(api, secret_path=secret_path, ttl=secret_ttl)
        self.is_leader = is_leader
        self.policies = policies
        self.providers = providers
        self._state: dict[str, _PodState] = {}
        self._released: OrderedDict[str, None] = OrderedDict()

    def forget(self, uid: str) -> None:
        """Drop per-pod state (the pod was deleted or left the gated set)."""
        self._state.pop(uid, None)

    # --- inputs ------------------------------------------------------------------------
    async def credentials(
        self,
        pod: Mapping[str, Any],
        config: PlacementConfig,
        *,
        on_invalid: Callable[[str, str, Exception], None] | None = None,
    ) -> list[Any]:
        """Credentials for ``pod``: the Secrets of :func:`rules.podspec.pull_secret_refs`
        read with :class:`imageinspect.PullSecretReader` (missing or undecodable ones
        skipped; ``on_invalid`` is called for the latter), then what the kubelet credential
        providers give for its images (:func:`controller.credproviders.provider_credentials`;
        the kubelet's keyring order: pull secrets first).

        Raises:
            ApiError: reading a secret failed other than 403/404.
        """
        creds: list[Any] = await self.secrets.credentials(pull_secret_refs(pod, config),
                                                          on_invalid=on_invalid)
        if self.providers is not None:
            creds += await provider_credentials(self.providers, pod)
        return creds

    async def inspect_images(
        self, pod: Mapping[str, Any], credentials: Sequence[Any]
    ) -> dict[str, Any]:
        """Inspect every distinct image of ``pod`` concurrently → result or exception; none
        when the pod names more than :data:`rules.place.decision.MAX_POD_IMAGES` (each gets
        :func:`rules.place.decision.too_many_images`' error: the pod takes the fallback)."""
        images = unique_images(pod)
        over = too_many_images(pod)
        if over is not None:
            return dict.fromkeys(images, over)

        async def one(image: str, pull_always: bool) -> Any:
            started = time.monotonic()
            try:
                return await self.inspector.inspect(image, credentials, pull_always=pull_always)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.inspect_errors.inc()
                return exc
            finally:
                self.metrics.inspect_seconds.observe(time.monotonic() - started)

        results = await asyncio.gather(*(one(i, pa) for i, pa in images.items()))
        return dict(zip(images, results, strict=True))

    # --- the reconcile -----------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        """Process one pod key; returns None (done) or seconds until it should run again
        (a NUMA wait). Retries belong to the queue: it counts each raise and backs off.

        Raises:
            RetryLater: image inspection failed and retries are left.
            Conflict: the pod changed since the informer's copy (stale write).
            ApiError: another transient API failure.
        """
        ns, name, uid = split_key(key)
        if not self.is_leader():
            return None
        pod = self.pods.get(f"{ns}/{name}")
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            self.forget(uid)
            return None
        if not has_gate(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
            self.forget(uid)
            return None
        config, config_error = self.config_source()
        state = self._state.setdefault(uid, _PodState())
        gated: dict[str, Any] = pod

        def invalid_secret(secret_ns: str, secret_name: str, exc: Exception) -> None:
            if (secret_ns, secret_name) in state.warned_secrets:
                return  # once per pod and secret, not on every retry round
            state.warned_secrets.add((secret_ns, secret_name))
            spec = invalid_pull_secret_event(secret_ns, secret_name, exc)
            self.metrics.events.labels(spec.type).inc()
            self.events.emit(gated, spec)

        try:
            creds = await self.credentials(pod, config, on_invalid=invalid_secret)
        except ApiError as exc:
            log.info("pod %s/%s: reading pull secrets failed: %s", ns, name, exc)
            creds = []
            if self.providers is not None:
                creds = await provider_credentials(self.providers, pod)
        images = await self.inspect_images(pod, creds)
        if not creds and self.publish is not None:
            # Learned anonymously: any pod of any namespace may be placed with it at
            # admission; a result behind a pull secret never is.
            for image, result in images.items():
                if not isinstance(result, BaseException):
                    self.publish(image, result)

        decision = self._decide(pod, images, config, config_error, self.failures(key))
        if decision.outcome == Outcome.SKIP:
            self.forget(uid)
            return None
        if decision.outcome == Outcome.RETRY:
            self.emit(pod, decision)
            self.metrics.processed.labels(Outcome.RETRY).inc()
            raise RetryLater(decision.reason)
        if not decision.patch:
            self._after(pod, decision, config)
            return self._requeue_after(decision, config)
        try:
            written = await self._patch(ns, name, list(decision.patch))
        except NotFound:
            self.forget(uid)
            return None
        except Conflict:
            # Stale informer copy: the queue retries after its backoff, by then the
            # informer holds the newer pod (controller-runtime's habit).
            self.metrics.conflicts.inc()
            raise
        except ApiError as exc:
            if exc.status not in REFUSED or not decision.ungate:
                raise
            # The server refused the write as too large or invalid (an odd spec, a huge
            # decision): never leave the pod gated; release it with the fallback, which
            # writes little, and say so in our own words (not the server's text, which
            # may quote the pod).
            reason = refused_reason(exc.status)
            log.warning("pod %s/%s: %s (%s); fallback release", ns, name, reason,
                        exc.message[:200])
            if decision.outcome == Outcome.FALLBACK:
                decision = await self._last_resort(pod, reason, config)
            else:
                decision = await self.release(pod, reason, config)
            written = None
        self._after(written or pod, decision, config)
        return self._requeue_after(decision, config)

    def _decide(self, pod: Mapping[str, Any], images: Mapping[str, Any],
                config: PlacementConfig, config_error: str | None, failures: int) -> Decision:
        def numa_failed(exc: Exception) -> None:
            log.warning("NUMA decision failed: %s", exc)

        try:
            inputs = PlacementInputs(pod, images, config, failures=failures,
                                     config_error=config_error, policy=self._policy(pod))
            return plan(
                inputs,
                nodes=list(self.nodes.cache.values()) if self.nodes is not None else None,
                nrts=dict(self.nrts.cache) if self.nrts is not None else {},
                now=time.time(), inflight=self.inflight, on_numa_error=numa_failed,
            )
        except Exception as exc:
            log.exception("decision failed; fallback release")
            return self.release_decision(pod, f"internal error while deciding: {exc}"[:200],
                                         config)

    def _policy(self, pod: Mapping[str, Any]) -> PlacementPolicy | None:
        return policy_for(pod, self.policies(
            str((pod.get("metadata") or {}).get("namespace") or "")))

    def release_decision(self, pod: Mapping[str, Any], reason: str,
                         config: PlacementConfig) -> Decision:
        """The fallback release of a pod that is not placed
        (:func:`rules.place.decision.fallback_ungate`, with the namespace's policy), or
        the plain ungate when even that cannot be computed. Never raises."""
        try:
            return fallback_ungate(pod, reason, config, self._policy(pod))
        except Exception:
            log.exception("fallback release failed; plain ungate")
            return plain_ungate(pod, reason)

    async def release(self, pod: Mapping[str, Any], reason: str,
                      config: PlacementConfig) -> Decision:
        """Write the fallback release of the gated ``pod`` (:meth:`release_decision`), or the
        plain ungate when the API server refuses its affinity as invalid (422), so the pod
        is never left gated. Emits nothing. Returns the decision written (``skip``: the pod
        no longer carries our gate, nothing written).

        Raises:
            ApiError: a write failed otherwise (a stale pod: :class:`~kubeclient.Conflict`).
        """
        released = self.release_decision(pod, reason, config)
        if not released.patch:
            return released
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        try:
            await self._patch(ns, name, list(released.patch))
            return released
        except ApiError as exc:
            if exc.status not in REFUSED or released.outcome != Outcome.FALLBACK:
                raise
            log.warning("pod %s/%s: fallback patch refused (HTTP %d: %s)", ns, name,
                        exc.status, exc.message[:200])
        return await self._last_resort(pod, reason, config)

    async def _last_resort(self, pod: Mapping[str, Any], reason: str,
                           config: PlacementConfig) -> Decision:
        """After the fallback's PATCH was refused (413/422): the fallback without the
        decision annotation (the pod's own annotations may leave no room for it), then the
        plain ungate. Returns the decision written.

        Raises:
            ApiError: the plain ungate failed too, or a write failed otherwise.
        """
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        bare = unrecorded(self.release_decision(pod, reason, config), pod)
        if bare.patch and bare.outcome == Outcome.FALLBACK:
            try:
                await self._patch(ns, name, list(bare.patch))
                return bare
            except ApiError as exc:
                if exc.status not in REFUSED:
                    raise
                log.warning("pod %s/%s: fallback patch without the annotation refused "
                            "(HTTP %d); plain ungate", ns, name, exc.status)
        plain = plain_ungate(pod, reason)
        await self._patch(ns, name, list(plain.patch))
        return plain

    async def _patch(self, ns: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        pod = await self.api.request(
            "PATCH", pod_path(ns, name), body=ops,
            content_type="application/json-patch+json",
        )
        if isinstance(pod, Mapping) and not has_gate(pod):
            self._released[str((pod.get("metadata") or {}).get("uid"))] = None
            while len(self._released) > RELEASED_MEMORY:
                self._released.popitem(last=False)
        return pod

    def released_here(self, uid: str) -> bool:
        """True (once) when this reconciler's own write removed the gate of the pod ``uid``:
        the pod left the watch of gated pods because it was placed, not because a user
        changed its label (:meth:`controller.gatedpods.GatedPodEvents.relabel`). Remembers
        the last :data:`RELEASED_MEMORY` pods."""
        return self._released.pop(uid, False) is None

    def emit(self, pod: Mapping[str, Any], decision: Decision) -> None:
        """Queue ``decision``'s Events about ``pod`` (counted in ``events_total``)."""
        for spec in decision.events:
            self.metrics.events.labels(spec.type).inc()
            self.events.emit(pod, spec)

    def _after(self, pod: Mapping[str, Any], decision: Decision, config: PlacementConfig
               ) -> None:
        uid = str((pod.get("metadata") or {}).get("uid"))
        self.emit(pod, decision)
        outcome = decision.outcome
        self.metrics.processed.labels(outcome).inc()
        if decision.ungate:
            self.forget(uid)
            created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
            if created is not None:
                self.metrics.ungate_seconds.observe(max(0.0, time.time() - created))
            self._record_inflight(pod, decision)
            meta = pod.get("metadata") or {}
            log.info("pod %s/%s: %s (%s)", meta.get("namespace"), meta.get("name"), outcome,
                     decision.reason)
        return None

    def _record_inflight(self, pod: Mapping[str, Any], decision: Decision) -> None:
        if self.inflight is None:
            return
        try:
            hold(self.inflight, pod, decision)
        except Exception:
            log.exception("in-flight accounting failed")

    def _requeue_after(self, decision: Decision, config: PlacementConfig) -> float | None:
        if decision.outcome == Outcome.WAIT_NUMA:
            # NRT changes requeue sooner; this bounds the wait when none arrive.
            return max(1.0, min(30.0, config.topology.max_wait_seconds / 4))
        return None
