"""The informers' events, mapped to keys of the leader's work queue.

One job: say which key an event of a watched object puts on the work queue (only while this
replica leads; every replica keeps its caches and in-memory accounting warm):

* a gated pod added or changed: its key ``namespace/name/uid``; a gated pod deleted, or gone
  from the label-selected watch because a user changed its gate label:
  ``relabel:<namespace/name/uid>`` (:data:`RELABEL_PREFIX`), served by :meth:`GatedPodEvents.
  relabel`, which puts the label back on a pod still gated;
* a NodeResourceTopology changed: the key of every gated pod waiting for NUMA room (label
  ``podplacement.io/numa=waiting``); it also feeds the in-flight NUMA accounting;
* the params object created or deleted, or the config changed, while this process runs the
  lifecycle: :data:`controller.lifecycle.LIFECYCLE_KEY` (the config also notifies its
  listeners: log verbosity, params TTL, registry rules, monitors);
* a Node or NRT deleted: its parsed copy leaves the NUMA decision cache (no key).

Reads the pod cache and the pod (one GET, relabel); writes the gate label (one JSON patch
guarded by the pod's uid, relabel). Errors: a failed relabel read or write is logged and left
(the pod is gone or changed meanwhile); the handlers never raise but for the accounting's
logged exception.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from podplacement.controller.generic import Controller
from podplacement.controller.lifecycle import LIFECYCLE_KEY
from podplacement.controller.reconciler import Reconciler, pod_key, split_key
from podplacement.kubeclient import (
    JSON_PATCH,
    ApiError,
    Conflict,
    Informer,
    KubeAPI,
    NotFound,
    pod_path,
)
from podplacement.rules.config import GATE_LABEL_GATED, NUMA_LABEL, NUMA_LABEL_WAITING
from podplacement.rules.numa import InFlight
from podplacement.rules.podspec import gate_label_ops, has_gate, lost_gate_label

log = logging.getLogger(__name__)

#: Work-queue keys ``relabel:<namespace/name/uid>``: a gated pod whose gate label was removed
#: (:meth:`GatedPodEvents.relabel`).
RELABEL_PREFIX = "relabel:"


class Term(Protocol):
    """The leadership term as read here: whether this replica leads, and its work queue."""

    @property
    def leading(self) -> bool: ...

    @property
    def queue(self) -> Controller[str]: ...


def forget_topology(obj: Mapping[str, Any]) -> None:
    """Drop the NUMA decision cache's parsed Node/NRT of a deleted object (memory only: the
    cache is keyed by name and would otherwise keep deleted nodes)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not name:
        return
    from podplacement.rules.numa._decide import _CACHE

    _CACHE.forget(name)


class GatedPodEvents:
    """The event handlers of the gated-pod, Node, NRT, params-object and config informers.

    Args:
        api: the Kubernetes client (relabel's GET and PATCH).
        pods: the gated-pod informer (its cache is read).
        term: the leadership term (``leading``, ``queue``).
        reconciler: the pod reconciler (``forget``, ``released_here``).
        inflight: the in-flight NUMA accounting fed with NRTs.
        runs_lifecycle: True while this process runs the lifecycle (the admission objects
            are its).
        config_listeners: called, in order, on every config event.
    """

    def __init__(self, api: KubeAPI, pods: Informer, term: Term, reconciler: Reconciler, *,
                 inflight: InFlight | None, runs_lifecycle: Callable[[], bool],
                 config_listeners: Sequence[Callable[[], object]]) -> None:
        self._api = api
        self._pods = pods
        self._term = term
        self._reconciler = reconciler
        self._inflight = inflight
        self._runs_lifecycle = runs_lifecycle
        self._config_listeners = tuple(config_listeners)

    def subscribe(self, pods: Informer, nrts: Informer, nodes: Informer, configs: Informer,
                  params_objects: Informer) -> None:
        """Add each handler to its informer."""
        pods.add_handler(self.on_pod)
        nrts.add_handler(self.on_nrt)
        nodes.add_handler(self.on_node)
        configs.add_handler(self.on_config)
        params_objects.add_handler(self.on_params)

    def on_pod(self, etype: str, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        """A gated pod's event: its key (leader), or ``relabel:`` for one that left."""
        key = pod_key(pod)
        if etype == "DELETED":
            self._term.queue.discard(key)
            self._reconciler.forget(str((pod.get("metadata") or {}).get("uid")))
            uid = str((pod.get("metadata") or {}).get("uid"))
            if self._term.leading and not self._reconciler.released_here(uid):
                # Deleted, or it left the watch because a user changed its gate label (a
                # label-selected watch reports that as DELETED with the old object): one GET
                # tells, and a pod still gated is labelled again.
                self._term.queue.add(RELABEL_PREFIX + key)
            return
        if self._term.leading and has_gate(pod):
            self._term.queue.add(key)

    async def relabel(self, key: str) -> None:
        """Put the label ``scheduling-gate=gated`` back on a pod that still carries our
        gate after its label was changed or removed
        (:func:`rules.podspec.lost_gate_label`), so that the pod watch sees it
        again and the pod is placed (a pod's creator can update the label of a gated pod;
        no label decides for the product). Guarded by the pod's uid; a pod gone or
        changed meanwhile is left as it is. ``key``: ``namespace/name/uid`` (without the
        prefix)."""
        namespace, name, uid = split_key(key)
        path = pod_path(namespace, name)
        try:
            pod = await self._api.request("GET", path)
        except NotFound:
            return  # deleted: nothing to do
        except ApiError as exc:
            log.info("pod %s/%s: not relabelled: %s", namespace, name, exc)
            return
        if (pod.get("metadata") or {}).get("uid") != uid or not lost_gate_label(pod):
            return
        try:
            ops = [{"op": "test", "path": "/metadata/uid", "value": uid}, *gate_label_ops(pod)]
            await self._api.request("PATCH", path, body=ops, content_type=JSON_PATCH)
        except (Conflict, NotFound) as exc:
            log.info("pod %s/%s: not relabelled: %s", namespace, name, exc)
            return
        log.info("pod %s/%s: our gate label was removed; set to %s again", namespace, name,
                 GATE_LABEL_GATED)

    def on_params(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """A params object created or deleted: converge at once (the params object is
        re-created, and the webhook configuration skips the placed pods only while one
        exists: :func:`rules.admit.webhookconfig.object_selector`)."""
        if etype in ("ADDED", "DELETED") and self._term.leading and self._runs_lifecycle():
            self._term.queue.add(LIFECYCLE_KEY)

    def on_node(self, etype: str, node: dict[str, Any], old: dict[str, Any] | None) -> None:
        """A Node deleted leaves the NUMA decision cache."""
        if etype == "DELETED":
            forget_topology(node)

    def on_nrt(self, etype: str, nrt: dict[str, Any], old: dict[str, Any] | None) -> None:
        """An NRT changed: the accounting sees it, and the pods waiting for NUMA room are
        queued (leader); one deleted leaves the NUMA decision cache."""
        if etype == "DELETED":
            forget_topology(nrt)
        if self._inflight is not None and etype != "DELETED":
            try:
                self._inflight.observe_nrt(nrt)
            except Exception:
                log.exception("in-flight NRT accounting failed")
        if not self._term.leading:
            return
        for pod in self._pods.cache.values():
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if labels.get(NUMA_LABEL) == NUMA_LABEL_WAITING:
                self._term.queue.add(pod_key(pod))

    def on_config(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """The config changed: its listeners are told, and the lifecycle runs (leader)."""
        for listener in self._config_listeners:
            listener()
        if self._runs_lifecycle() and self._term.leading:
            self._term.queue.add(LIFECYCLE_KEY)
