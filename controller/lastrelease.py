"""The last-resort release of every pod still gated (the ordered uninstall, the stand-down).

One job: no pod stays gated when the product goes. Every pod still gated gets a normal
decision when one completes within the deadline, else the fallback release
(:meth:`controller.reconciler.Reconciler.release`: what is known is kept, the fallback
architecture when one applies and the fallback operating systems; the Warning Event
``PlacementFallback`` says which). Reads the gated pods (a list, then one GET per pod); writes
through the reconciler (one PATCH per pod, and its Events). Queues no key: it is called by the
lifecycle (its ``ungate_remaining``), on a queue of its own or after the term ended, so the
reconciler may write while :attr:`LastResortRelease.releasing` is above 0. Errors: a pod whose
release PATCH fails is logged and not counted; a failed list or GET raises
:class:`kubeclient.ApiError` to the lifecycle's pass (its queue retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from podplacement.controller.bindingfeed import PODS_PATH
from podplacement.controller.reconciler import Reconciler, RetryLater, pod_key, split_key
from podplacement.kubeclient import ApiError, Informer, KubeAPI, object_key, pod_path
from podplacement.rules.config import GATE_LABEL, GATE_LABEL_GATED, PlacementConfig
from podplacement.rules.podspec import has_gate

log = logging.getLogger(__name__)


class LastResortRelease:
    """Release every pod still gated.

    Args:
        api: the Kubernetes client (the list and the GETs).
        pods: the gated-pod informer (a listed pod is put in its cache for the reconciler).
        reconciler: the pod reconciler (the normal decision, the fallback release, Events).
        placement_config: the config the fallback release places with.
        workers: how many pods are released at once.

    Attributes:
        releasing: > 0 while a release runs (the reconciler may then write although this
            process may no longer lead).
    """

    def __init__(self, api: KubeAPI, pods: Informer, reconciler: Reconciler, *,
                 placement_config: Callable[[], tuple[PlacementConfig, str | None]],
                 workers: int) -> None:
        self._api = api
        self._pods = pods
        self._reconciler = reconciler
        self._placement_config = placement_config
        self._workers = workers
        self.releasing = 0

    async def ungate_remaining(self, deadline_seconds: float) -> int:
        """Release every pod still gated (ordered uninstall, stand-down): a normal decision
        when it completes within ``deadline_seconds``, else the fallback release, which keeps
        what is known (:meth:`controller.reconciler.Reconciler.release`: the fallback
        architecture when one applies, the fallback operating systems; the Warning
        ``PlacementFallback`` says which). Returns how many of the pods gated when it started
        are released (deleted ones are not counted)."""
        items, _ = await self._api.list_all(
            PODS_PATH, params={"labelSelector": f"{GATE_LABEL}={GATE_LABEL_GATED}"}
        )
        pods = [p for p in items if has_gate(p)]
        deadline = time.monotonic() + max(0.0, deadline_seconds)
        sem = asyncio.Semaphore(max(1, self._workers))
        self.releasing += 1

        async def one(pod: dict[str, Any]) -> int:
            async with sem:
                key = pod_key(pod)
                ns, name, _ = split_key(key)
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    self._pods.cache.setdefault(object_key(pod), pod)
                    with contextlib.suppress(TimeoutError, ApiError, RetryLater):
                        async with asyncio.timeout(remaining):
                            await self._reconciler.reconcile(key)
                fresh = await self._get_pod(ns, name)
                if fresh is None:
                    return 0
                if not has_gate(fresh):
                    return 1  # decided (by this call, or by a worker it raced)
                config, _ = self._placement_config()
                try:
                    decision = await self._reconciler.release(
                        fresh, "podplacement is being uninstalled", config)
                except ApiError as exc:
                    log.warning("uninstall: ungating %s/%s failed: %s", ns, name, exc)
                    return 0
                self._reconciler.emit(fresh, decision)
                return 1 if decision.ungate else 0

        try:
            results = await asyncio.gather(*(one(p) for p in pods))
        finally:
            self.releasing -= 1
        return sum(results)

    async def _get_pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._api.request("GET", pod_path(ns, name))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
