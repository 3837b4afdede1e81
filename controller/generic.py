"""One generic controller: a work queue of keys, its workers, the loop that feeds it (its
watch, or the loop that turns its watch on and off) and a reconcile function, with start,
stop and health for the runnables manager (:mod:`controller.runnables`).

After controller-runtime's ``Controller`` (``sigs.k8s.io/controller-runtime/pkg/internal/
controller``): one object owns the queue, the workers and the sources; the reconciler, a
function ``K -> float | None`` (requeue after that many seconds; raise to retry with
backoff), is the only part that differs. Here ``K`` is the controller's key type, mapped to
the queue's string keys by a :class:`KeyCodec` (:data:`STR_KEYS` for plain string keys,
:data:`POD_KEYS` for a pod's ``namespace/name/uid``). The queue is
:class:`controller.queue.WorkQueue` (deduplication, per-key backoff, token bucket); a new one
is built on every :meth:`Controller.start`, so a stopped controller (a lost lease) keeps no
keys, timers or failure counts into its next run.

Users: the leader's placement queue (:class:`controller.term.LeadershipTerm`, key type
``str``: pods and the lifecycle's, params writer's, Always tags' and relabel keys, routed by
:meth:`controller.app.Controller.reconcile`), the exec-format-error monitor
(:mod:`controller.execformatmonitor`) and the escape monitor (:mod:`controller.escapemonitor`),
both with key type :data:`PodKey`.

Errors: none raised by :meth:`Controller.start` / :meth:`Controller.stop`; the reconcile's
exceptions are the queue's to retry (module docstring of :mod:`controller.queue`); a feeding
loop that raises ends (logged) and :meth:`Controller.healthy` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, NewType, TypeVar

from podplacement.controller.queue import WorkQueue
from podplacement.kubeclient import Conflict

log = logging.getLogger(__name__)

K = TypeVar("K")

#: A pod's work-queue key, ``namespace/name/uid`` (:func:`controller.reconciler.pod_key`).
PodKey = NewType("PodKey", str)

#: The reconcile function of a controller with key type ``K``: None (done) or seconds until
#: the key runs again; an exception is retried with the queue's backoff.
Reconcile = Callable[[K], Awaitable[float | None]]


@dataclass(frozen=True)
class QueueSettings:
    """How a controller's work queue is built: ``workers`` (default count), ``rate``
    (keys/s) and ``burst`` of its token bucket, and its retry backoff
    ``base_delay``..``max_delay`` (seconds); a :class:`kubeclient.Conflict` is retried at
    once (a stale write: read again)."""

    workers: int
    rate: float
    burst: int
    base_delay: float
    max_delay: float

    def new(self, workers: int | None = None) -> WorkQueue:
        """A new (not started) queue with ``workers`` workers (default: :attr:`workers`)."""
        return WorkQueue(workers=workers or self.workers, rate=self.rate, burst=self.burst,
                         retry_now=(Conflict,), base_delay=self.base_delay,
                         max_delay=self.max_delay)


@dataclass(frozen=True)
class KeyCodec(Generic[K]):
    """Maps a controller's keys to the queue's strings and back (both total on what they are
    given: a string the controller did not encode never reaches ``decode``)."""

    encode: Callable[[K], str]
    decode: Callable[[str], K]


def _same(key: str) -> str:
    return key


def _pod_key(key: str) -> PodKey:
    return PodKey(key)


#: Plain string keys.
STR_KEYS: KeyCodec[str] = KeyCodec(_same, _same)
#: Pod keys (``namespace/name/uid``).
POD_KEYS: KeyCodec[PodKey] = KeyCodec(_same, _pod_key)


class Controller(Generic[K]):
    """A queue of ``K`` keys served by ``reconcile`` on the queue's workers, plus an
    optional feeding loop, started and stopped together (module docstring).

    Args:
        name: for logs, task names and health reports.
        reconcile: ``K -> float | None`` (see :data:`Reconcile`).
        settings: how the queue is built (:class:`QueueSettings`).
        codec: keys to queue strings and back.
        loop: a coroutine run while the controller runs (its watch, or the loop that
            starts and stops its watch); cancelled by :meth:`stop`.
        workers: the worker count (default: ``settings.workers``).
    """

    def __init__(self, name: str, reconcile: Reconcile[K], settings: QueueSettings, *,
                 codec: KeyCodec[K], loop: Callable[[], Coroutine[Any, Any, None]] | None = None,
                 workers: int | None = None) -> None:
        self.name = name
        self._reconcile = reconcile
        self.settings = settings
        self.codec = codec
        self._loop = loop
        self._workers = workers
        self.queue = settings.new(workers)
        self._task: asyncio.Task[None] | None = None
        self.running = False

    # --- start / stop ----------------------------------------------------------------
    def start(self) -> None:
        """Start a new queue's workers and the feeding loop (no-op while running)."""
        if self.running:
            return
        self.running = True
        self.queue = self.settings.new(self._workers)
        self.queue.start(self._handle)
        if self._loop is not None:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        """Stop the feeding loop and the queue (work in flight is cancelled). Never
        raises."""
        self.running = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self.queue.shutdown()

    async def run(self, stop: asyncio.Event) -> None:
        """As a runnable (:class:`controller.runnables.Runnable`): start, wait for
        ``stop``, stop."""
        self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    def healthy(self) -> str | None:
        """None when well; else why not (its feeding loop ended while running)."""
        task = self._task
        if not self.running or task is None or not task.done():
            return None
        if task.cancelled():
            return f"{self.name}: its loop was cancelled"
        exc = task.exception()
        return f"{self.name}: its loop ended" + (f": {exc!r}" if exc else "")

    async def _handle(self, key: str) -> float | None:
        return await self._reconcile(self.codec.decode(key))

    # --- the queue, by key -------------------------------------------------------------
    def add(self, key: K) -> None:
        """Queue ``key`` now (:meth:`controller.queue.WorkQueue.add`)."""
        self.queue.add(self.codec.encode(key))

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds."""
        self.queue.add_after(self.codec.encode(key), delay)

    def discard(self, key: K) -> None:
        """Drop ``key``: its timers, queued entry and failure count."""
        self.queue.discard(self.codec.encode(key))

    def is_pending(self, key: K) -> bool:
        """True when ``key`` is queued, waiting on a timer, or being processed."""
        return self.queue.is_pending(self.codec.encode(key))

    def failures(self, key: K) -> int:
        """Consecutive failures counted for ``key``."""
        return self.queue.failures(self.codec.encode(key))

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def pending(self) -> int:
        """Keys queued, waiting on a timer, or being processed."""
        return self.queue.pending

    async def wait_idle(self) -> None:
        """Wait until nothing is queued, delayed or processing."""
        await self.queue.wait_idle()
