"""The controller's view of the PodPlacementPolicies, and their status (I/O).

:class:`PolicyWatch` keeps two informers: the PodPlacementPolicies of every namespace
(tolerated while the CRD is absent) and the pods carrying the label
``podplacement.io/policy`` (the pods placed under a policy, by any path: the admission
policy, the webhook or the controller). On every policy event it ranks them again
(:func:`rules.policy.rank`) and hands the ranking to ``on_change`` (the controller
publishes it in the admission policy's params: the ranking accepts only policies the params
object can carry, so no policy can make its writes fail). The leader runs
:meth:`PolicyWatch.run`: about once a second it patches the ``status`` of each policy whose
desired status (:func:`rules.policy.desired_status`: observedGeneration, selector text,
placed pods, condition ``Accepted``, with the reason a policy is not applied:
``PriorityConflict``, ``NotPublished``, ``CatalogFull``, ``Invalid``) differs from the live
one, and sets the gauge
``podplacement_policy_placed_pods{namespace,policy}``. Errors are logged and retried on the
next round; the loop never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from podplacement.controller.bindingfeed import PODS_PATH
from podplacement.kubeclient import ApiError, Informer, KubeAPI, NotFound, resource_path
from podplacement.rules.config import GROUP, POLICY_LABEL, POLICY_PLURAL, VERSION
from podplacement.rules.policy import (
    EMPTY_RANKING,
    PlacementPolicy,
    Ranking,
    desired_status,
    rank,
)

log = logging.getLogger(__name__)

POLICIES_PATH = resource_path(GROUP, VERSION, POLICY_PLURAL)
#: The status path's template, for :data:`API_REQUESTS` (requests are built by
#: :func:`policy_status_path`).
POLICY_STATUS_PATH = resource_path(GROUP, VERSION, POLICY_PLURAL, namespace="{namespace}",
                                   name="{name}", subresource="status")


def policy_status_path(namespace: str, name: str) -> str:
    """The status subresource of the PodPlacementPolicy ``namespace/name``, checked
    (:func:`kubeclient.resource_path`).

    Raises:
        InvalidPathSegment: a segment is not acceptable.
    """
    return resource_path(GROUP, VERSION, POLICY_PLURAL, namespace=namespace, name=name,
                         subresource="status")

#: Every request this module sends (method, path), for the RBAC check of
#: ``tests/deploy/test_manifests.py``: list+watch of the policies and of the pods placed
#: under one (``labelSelector=podplacement.io/policy``), and the status patch.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", POLICIES_PATH),
    ("GET", PODS_PATH),
    ("PATCH", POLICY_STATUS_PATH),
)


class GaugeFamily(Protocol):
    """What the watch needs of a labelled gauge (``prometheus_client.Gauge``)."""

    def labels(self, *labelvalues: str) -> Any:
        """The child of these label values (with ``set``)."""
        ...

    def remove(self, *labelvalues: str) -> None:
        """Drop the child of these label values."""
        ...


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _differs(live: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return any(live.get(k) != v for k, v in want.items())


class PolicyWatch:
    """The PodPlacementPolicies as the controller sees them.

    Args:
        api: the Kubernetes client.
        on_change: called with the new :class:`~rules.policy.Ranking` after every
            policy event (in the event loop; must not block).
        placed_gauge: ``podplacement_policy_placed_pods`` (labels namespace, policy), or None.
        watch_timeout: the informers' watch timeout, seconds.
        interval: seconds between two status rounds of :meth:`run`.
    """

    def __init__(self, api: KubeAPI, *, on_change: Callable[[Ranking], None] | None = None,
                 placed_gauge: GaugeFamily | None = None, watch_timeout: int = 300,
                 interval: float = 1.0) -> None:
        self.api = api
        self.on_change = on_change
        self.placed_gauge = placed_gauge
        self.interval = interval
        self.policies = Informer(api, POLICIES_PATH, name="podplacementpolicies",
                                 watch_timeout=watch_timeout, tolerate_absent=True,
                                 max_backoff=10.0)
        self.placed = Informer(api, PODS_PATH, {"labelSelector": POLICY_LABEL},
                               name="pods placed under a policy", watch_timeout=watch_timeout)
        self.ranking: Ranking = EMPTY_RANKING
        self._gauged: set[tuple[str, str]] = set()
        self._changed = asyncio.Event()
        self.policies.add_handler(self._on_policy)
        self.placed.add_handler(self._on_placed)

    def of(self, namespace: str) -> tuple[PlacementPolicy, ...]:
        """The accepted policies of ``namespace``, highest priority first."""
        return self.ranking.of(namespace)

    def start(self) -> None:
        """Start both informers (returns at once)."""
        self.policies.start()
        self.placed.start()

    async def stop(self) -> None:
        """Stop both informers."""
        await self.policies.stop()
        await self.placed.stop()

    def _on_policy(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.ranking = rank(list(self.policies.cache.values()))
        if self.on_change is not None:
            self.on_change(self.ranking)
        self._changed.set()

    def _on_placed(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self._changed.set()

    def placed_counts(self) -> Counter[tuple[str, str]]:
        """(namespace, policy name) → pods that exist and carry ``podplacement.io/policy``."""
        counts: Counter[tuple[str, str]] = Counter()
        for pod in self.placed.cache.values():
            meta = pod.get("metadata") or {}
            name = (meta.get("labels") or {}).get(POLICY_LABEL)
            if name:
                counts[(str(meta.get("namespace")), str(name))] += 1
        return counts

    async def sync_status(self) -> int:
        """One status round: patch each policy whose desired status differs from its live
        one; update the gauge. Returns the number of policies patched.

        Raises:
            nothing for API errors (logged; the next round retries).
        """
        counts = self.placed_counts()
        seen: set[tuple[str, str]] = set()
        patched = 0
        for obj in list(self.policies.cache.values()):
            meta = obj.get("metadata") or {}
            ns, name = str(meta.get("namespace")), str(meta.get("name"))
            seen.add((ns, name))
            if self.placed_gauge is not None:
                self.placed_gauge.labels(ns, name).set(counts.get((ns, name), 0))
            want = desired_status(obj, self.ranking, counts.get((ns, name), 0), _now())
            live = obj.get("status") or {}
            if not _differs(live, want):
                continue
            path = policy_status_path(ns, name)
            try:
                await self.api.request("PATCH", path, body={"status": want},
                                       content_type="application/merge-patch+json")
                patched += 1
            except NotFound:
                continue
            except ApiError as exc:
                log.warning("policy %s/%s: status patch failed (will retry): %s", ns, name, exc)
        if self.placed_gauge is not None:
            for gone in self._gauged - seen:
                with contextlib.suppress(KeyError):
                    self.placed_gauge.remove(*gone)
        self._gauged = seen
        return patched

    async def run(self, stop: asyncio.Event) -> None:
        """Status rounds until ``stop`` is set: one after each change (policy or placed
        pod), at most one per ``interval``. Never raises (cancellation aside)."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            started = loop.time()
            self._changed.clear()
            try:
                await self.sync_status()
            except Exception:
                log.exception("policy status round failed")
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))
            waiter = asyncio.ensure_future(self._changed.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiter, stopper}, timeout=60.0,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()
