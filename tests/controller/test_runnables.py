"""The runnables manager: start and stop order, lease gating, a runnable that dies is reported
and harms nothing else, and stopping is bounded."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from podplacement.controller.runnables import Loop, Manager, Service


@dataclass
class Fake:
    """A runnable that records its start and stop in a shared journal."""

    name: str
    needs_lease: bool
    journal: list[str]
    fail: Exception | None = None
    deaf: bool = False  # ignores stop (and, when stubborn, cancellation too)
    stubborn: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, stop: asyncio.Event) -> None:
        self.journal.append(f"start {self.name}")
        self.started.set()
        if self.fail is not None:
            await asyncio.sleep(0)
            raise self.fail
        try:
            if self.deaf:
                await asyncio.Event().wait()
            await stop.wait()
        except asyncio.CancelledError:
            self.journal.append(f"cancelled {self.name}")
            if self.stubborn:
                await asyncio.sleep(0.3)
            raise
        self.journal.append(f"stop {self.name}")


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_start_in_order_lease_runnables_only_when_leading_stop_in_reverse() -> None:
    journal: list[str] = []
    manager = Manager([Fake("cache", False, journal), Fake("status", True, journal),
                       Fake("refresh", False, journal), Fake("monitor", True, journal)])
    manager.start()
    await settle()
    assert journal == ["start cache", "start refresh"]
    manager.start_leading()
    await settle()
    assert journal[2:] == ["start status", "start monitor"]
    assert manager.running() == ("cache", "status", "refresh", "monitor")
    await manager.stop()
    assert journal[4:] == ["stop monitor", "stop status", "stop refresh", "stop cache"]
    assert manager.running() == ()


async def test_lost_lease_stops_only_lease_runnables_and_a_new_term_starts_them_again() -> None:
    journal: list[str] = []
    manager = Manager([Fake("cache", False, journal), Fake("status", True, journal),
                       Fake("monitor", True, journal)])
    manager.start()
    manager.start_leading()
    await settle()
    await manager.stop_leading()
    assert journal == ["start cache", "start status", "start monitor",
                       "stop monitor", "stop status"]
    assert manager.running() == ("cache",)
    manager.start_leading()
    await settle()
    assert manager.running() == ("cache", "status", "monitor")
    await manager.stop()
    assert journal[-3:] == ["stop monitor", "stop status", "stop cache"]


async def test_added_after_start_runs_when_its_group_runs() -> None:
    journal: list[str] = []
    manager = Manager([Fake("cache", False, journal)])
    manager.start()
    manager.add(Fake("late cache", False, journal))
    manager.add(Fake("late status", True, journal))
    await settle()
    assert manager.running() == ("cache", "late cache")
    manager.start_leading()
    await settle()
    assert manager.running() == ("cache", "late cache", "late status")
    await manager.stop()


def test_names_are_unique() -> None:
    with pytest.raises(ValueError, match="added twice"):
        Manager([Fake("a", False, []), Fake("a", True, [])])


async def test_a_runnable_that_raises_is_unhealthy_and_the_others_go_on() -> None:
    journal: list[str] = []
    manager = Manager([Fake("cache", False, journal),
                       Fake("broken", False, journal, fail=RuntimeError("boom")),
                       Fake("status", True, journal)])
    assert manager.unhealthy() == {}
    manager.start()
    await settle()
    assert manager.unhealthy() == {"broken": "died: RuntimeError: boom"}
    assert manager.running() == ("cache",)
    manager.start_leading()
    await settle()
    assert manager.running() == ("cache", "status")
    await manager.stop()
    assert "stop cache" in journal and "stop status" in journal


async def test_a_runnable_that_returns_early_is_unhealthy() -> None:
    async def body(stop: asyncio.Event) -> None:
        return None

    manager = Manager([Loop("short", False, body)])
    manager.start()
    await settle()
    assert manager.unhealthy() == {"short": "returned before it was stopped"}
    await manager.stop()


async def test_stop_cancels_a_runnable_that_ignores_it_and_leaves_one_that_ignores_both(
) -> None:
    journal: list[str] = []
    deaf = Fake("deaf", False, journal, deaf=True)
    stubborn = Fake("stubborn", False, journal, deaf=True, stubborn=True)
    manager = Manager([deaf, stubborn, Fake("ok", False, journal)], grace_seconds=0.05)
    manager.start()
    await settle()
    await asyncio.wait_for(manager.stop(), 1.0)
    # reverse order; the deaf one is cancelled after the grace, the stubborn one left
    assert journal[3:] == ["stop ok", "cancelled stubborn", "cancelled deaf"]
    assert manager.running() == ()


async def test_loop_is_cancelled_on_stop_and_its_error_is_the_runnables() -> None:
    cancelled = asyncio.Event()

    async def forever(stop: asyncio.Event) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def broken(stop: asyncio.Event) -> None:
        raise KeyError("k")

    manager = Manager([Loop("forever", False, forever), Loop("broken", True, broken)],
                      grace_seconds=10.0)
    manager.start()
    manager.start_leading()
    await settle()
    assert manager.unhealthy() == {"broken": "died: KeyError: 'k'"}
    await asyncio.wait_for(manager.stop(), 1.0)  # no grace spent: cancelled at once
    assert cancelled.is_set()


async def test_service_starts_and_stops_a_start_stop_component_and_reports_its_health(
) -> None:
    calls: list[str] = []
    health: list[str | None] = [None]

    async def stop() -> None:
        calls.append("stop")

    service = Service("svc", True, start=lambda: calls.append("start"), stop=stop,
                      health=lambda: health[0])
    manager = Manager([service])
    manager.start()
    await settle()
    assert calls == []  # needs the lease
    manager.start_leading()
    await settle()
    assert calls == ["start"]
    health[0] = "watch down"
    assert manager.unhealthy() == {"svc": "watch down"}
    await manager.stop_leading()
    assert calls == ["start", "stop"]
    assert manager.unhealthy() == {}
