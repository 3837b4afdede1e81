"""The controller's runtime model: every long-running part is a :class:`Runnable` that a
:class:`Manager` starts, stops and watches, after controller-runtime's manager
(``sigs.k8s.io/controller-runtime/pkg/manager``: ``Runnable`` is ``Start(ctx) error``,
blocking until the context ends; ``LeaderElectionRunnable.NeedLeaderElection()`` says whether
it runs on every replica or only on the leader, started after the lease is won and stopped
when it is lost).

Here a runnable's ``run(stop)`` returns once ``stop`` is set (a :class:`asyncio.Event`, the
context's ``Done()``). The manager starts the runnables that need no lease at once
(:meth:`Manager.start`) and those that need it when leadership is won
(:meth:`Manager.start_leading`), each in the order they were added, and stops them in the
reverse order: those that need the lease when leadership is lost
(:meth:`Manager.stop_leading`), then the others (:meth:`Manager.stop`). Stopping is bounded:
``stop`` is set, then the task is cancelled after ``grace_seconds``, then left (and logged)
after as long again. A runnable that raises is logged and reported by :meth:`Manager.unhealthy`;
the manager and the other runnables go on (the controller never crashes). The leader elector
itself stays outside: it calls the controller's start/stop of a term, which has work of its
own around :meth:`Manager.start_leading` and :meth:`Manager.stop_leading` (docs/design.md,
"Runnables").

Two adapters fit the existing components without changing them: :class:`Loop` for a
coroutine that runs until cancelled, :class:`Service` for a ``start()``/``async stop()`` pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

log = logging.getLogger("podplacement.controller.runnables")

#: Seconds a runnable has to return after ``stop`` is set before it is cancelled (and as long
#: again after the cancellation before it is left).
GRACE_SECONDS = 5.0


class Runnable(Protocol):
    """A long-running part of the controller (controller-runtime's ``Runnable`` plus
    ``LeaderElectionRunnable``).

    Attributes:
        name: a short name for logs and :meth:`Manager.unhealthy` (unique per manager).
        needs_lease: True: runs only while this replica holds the Lease (it writes, or its
            work is the leader's); False: runs on every replica (caches, reads).
    """

    @property
    def name(self) -> str: ...

    @property
    def needs_lease(self) -> bool: ...

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then return (cancellation is the fallback)."""
        ...


@runtime_checkable
class HealthReporter(Protocol):
    """A runnable that can also say it is unwell while its task still runs."""

    def healthy(self) -> str | None:
        """None when well, else why not (one line)."""
        ...


@dataclass(frozen=True)
class Loop:
    """A coroutine that runs until cancelled, as a runnable: ``body(stop)`` runs as a task
    of its own and is cancelled as soon as ``stop`` is set (its exception, if it ends with
    one first, is the runnable's)."""

    name: str
    needs_lease: bool
    body: Callable[[asyncio.Event], Awaitable[None]]

    async def run(self, stop: asyncio.Event) -> None:
        """Run ``body`` until it ends or ``stop`` is set (then it is cancelled).

        Raises:
            Exception: whatever ``body`` raised before ``stop`` was set.
        """
        task = asyncio.ensure_future(self.body(stop))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not task.cancelled():
            task.result()


@dataclass(frozen=True)
class Service:
    """A component with ``start()`` (returns at once, starts its own tasks) and
    ``async stop()``, as a runnable: started when run, stopped when ``stop`` is set (or the
    run is cancelled). ``healthy`` reports on the component's own tasks, when it can."""

    name: str
    needs_lease: bool
    start: Callable[[], object]
    stop: Callable[[], Awaitable[object]]
    health: Callable[[], str | None] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """``start()``, wait for ``stop``, then ``stop()`` (also when cancelled).

        Raises:
            Exception: whatever ``start()`` raised.
        """
        self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    def healthy(self) -> str | None:
        """The component's own report (None: well, or it cannot tell)."""
        return self.health() if self.health is not None else None


@dataclass
class _Running:
    runnable: Runnable
    stop: asyncio.Event
    task: asyncio.Task[None]


class Manager:
    """Starts, stops and watches :class:`Runnable` s (module docstring).

    Args:
        runnables: in start order (stop order is the reverse); more with :meth:`add`.
        grace_seconds: how long a runnable has to return after ``stop`` is set before it is
            cancelled, and again after that before it is left running (logged).

    Raises:
        ValueError: two runnables share a name.
    """

    def __init__(self, runnables: Sequence[Runnable] = (), *,
                 grace_seconds: float = GRACE_SECONDS) -> None:
        self.grace_seconds = grace_seconds
        self._runnables: list[Runnable] = []
        self._running: dict[str, _Running] = {}
        #: name → why it is unhealthy, kept after its task ended
        self._died: dict[str, str] = {}
        self.started = False
        self.leading = False
        for runnable in runnables:
            self.add(runnable)

    @property
    def runnables(self) -> tuple[Runnable, ...]:
        """Every runnable added, in start order."""
        return tuple(self._runnables)

    def add(self, runnable: Runnable) -> None:
        """Add ``runnable`` last; started at once when its group already runs.

        Raises:
            ValueError: its name is taken.
        """
        if any(r.name == runnable.name for r in self._runnables):
            raise ValueError(f"runnable {runnable.name!r} added twice")
        self._runnables.append(runnable)
        if self.started and (self.leading or not runnable.needs_lease):
            self._start(runnable)

    def start(self) -> None:
        """Start the runnables that need no lease (returns at once; idempotent)."""
        if self.started:
            return
        self.started = True
        for runnable in self._runnables:
            if not runnable.needs_lease:
                self._start(runnable)

    def start_leading(self) -> None:
        """Leadership won: start the runnables that need the lease (returns at once;
        idempotent)."""
        if self.leading:
            return
        self.leading = True
        for runnable in self._runnables:
            if runnable.needs_lease:
                self._start(runnable)

    async def stop_leading(self) -> None:
        """Leadership lost (or the process stops): stop the runnables that need the lease,
        in reverse start order, each bounded (:meth:`_stop`). Never raises."""
        if not self.leading:
            return
        self.leading = False
        for runnable in reversed(self._runnables):
            if runnable.needs_lease:
                await self._stop(runnable.name)

    async def stop(self) -> None:
        """Stop everything: the lease runnables (:meth:`stop_leading`), then the others in
        reverse start order, each bounded. Never raises."""
        await self.stop_leading()
        self.started = False
        for runnable in reversed(self._runnables):
            await self._stop(runnable.name)

    def unhealthy(self) -> dict[str, str]:
        """The runnables that are not well, name → why: those whose task raised or returned
        while it should run, and those running whose ``healthy()`` says so. Empty: all
        well."""
        out = dict(self._died)
        for name, running in self._running.items():
            if running.task.done() or name in out:
                continue
            if isinstance(running.runnable, HealthReporter):
                try:
                    why = running.runnable.healthy()
                except Exception as exc:  # a report that fails is a report
                    why = f"health check failed: {exc!r}"
                if why:
                    out[name] = why
        return out

    def running(self) -> tuple[str, ...]:
        """The names of the runnables whose task runs now, in start order."""
        return tuple(r.name for r in self._runnables
                     if r.name in self._running and not self._running[r.name].task.done())

    # --- internals -----------------------------------------------------------------------
    def _start(self, runnable: Runnable) -> None:
        if runnable.name in self._running:
            return
        stop = asyncio.Event()
        task = asyncio.create_task(runnable.run(stop), name=runnable.name)
        self._died.pop(runnable.name, None)
        self._running[runnable.name] = running = _Running(runnable, stop, task)
        task.add_done_callback(lambda t: self._ended(running, t))

    def _ended(self, running: _Running, task: asyncio.Task[None]) -> None:
        name = running.runnable.name
        if task.cancelled() or running.stop.is_set():
            return
        exc = task.exception()
        if exc is None:
            why = "returned before it was stopped"
            log.error("runnable %s %s", name, why)
        else:
            why = f"died: {type(exc).__name__}: {exc}"
            log.error("runnable %s died", name, exc_info=exc)
        self._died[name] = why

    async def _stop(self, name: str) -> None:
        running = self._running.pop(name, None)
        if running is None:
            return
        task = running.task
        running.stop.set()
        if not task.done():
            await asyncio.wait({task}, timeout=self.grace_seconds)
        if not task.done():
            log.warning("runnable %s: not stopped within %.1f s; cancelled", name,
                        self.grace_seconds)
            task.cancel()
            await asyncio.wait({task}, timeout=self.grace_seconds)
        if not task.done():
            log.error("runnable %s: still running %.1f s after its cancellation; left",
                      name, self.grace_seconds)
            return
        if not task.cancelled() and task.exception() is not None:
            log.warning("runnable %s ended with %r while stopping", name, task.exception())
