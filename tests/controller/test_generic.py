"""The generic controller (controller/generic.py): its queue, workers, feeding loop, key type
and health; and the structure it replaces (one queue/runner implementation, no lambdas in
the controller's wiring)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import NamedTuple

import pytest

from podplacement.controller.generic import (
    POD_KEYS,
    STR_KEYS,
    Controller,
    KeyCodec,
    PodKey,
    QueueSettings,
)
from podplacement.controller.runnables import Manager, Service
from podplacement.kubeclient import Conflict

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"
FAST = QueueSettings(workers=2, rate=0, burst=1, base_delay=0.01, max_delay=0.05)


class Ref(NamedTuple):
    namespace: str
    name: str


REFS: KeyCodec[Ref] = KeyCodec(lambda r: f"{r.namespace}/{r.name}",
                               lambda s: Ref(*s.split("/", 1)))


async def test_keys_reach_the_reconcile_as_the_controllers_key_type() -> None:
    seen: list[Ref] = []

    async def reconcile(ref: Ref) -> float | None:
        seen.append(ref)
        return None

    ctl = Controller("refs", reconcile, FAST, codec=REFS)
    ctl.start()
    ctl.add(Ref("team", "a"))
    ctl.add(Ref("team", "a"))  # deduplicated while queued
    ctl.add(Ref("other", "b"))
    await asyncio.wait_for(ctl.wait_idle(), 5)
    await ctl.stop()
    assert sorted(seen) == [Ref("other", "b"), Ref("team", "a")]
    assert all(isinstance(r, Ref) for r in seen)


async def test_requeue_after_failures_and_a_conflict_retried_without_counting() -> None:
    runs: dict[str, int] = {}

    async def reconcile(key: str) -> float | None:
        runs[key] = runs.get(key, 0) + 1
        if key == "flaky" and runs[key] < 3:
            raise RuntimeError("boom")
        if key == "stale" and runs[key] < 2:
            raise Conflict(409, "Conflict", "stale")
        if key == "again" and runs[key] < 2:
            return 0.01
        return None

    ctl = Controller("strs", reconcile, FAST, codec=STR_KEYS)
    ctl.start()
    for key in ("flaky", "stale", "again"):
        ctl.add(key)
    await asyncio.wait_for(ctl.wait_idle(), 5)
    assert runs == {"flaky": 3, "stale": 2, "again": 2}
    assert ctl.queue.errors == 2  # the conflict is no counted failure
    await ctl.stop()


async def test_a_restart_builds_a_new_queue_and_the_loop_runs_while_started() -> None:
    loops = 0
    block = asyncio.Event()

    async def loop() -> None:
        nonlocal loops
        loops += 1
        await block.wait()

    async def reconcile(key: PodKey) -> float | None:
        raise RuntimeError("never done")

    ctl: Controller[PodKey] = Controller("pods", reconcile, FAST, codec=POD_KEYS, loop=loop)
    ctl.start()
    ctl.start()  # idempotent: one loop
    key = PodKey("ns/name/uid")
    ctl.add(key)
    await asyncio.sleep(0.1)
    assert ctl.failures(key) >= 1 and ctl.is_pending(key)
    first = ctl.queue
    await ctl.stop()
    assert not ctl.running and ctl.healthy() is None
    ctl.start()
    assert ctl.queue is not first and ctl.failures(key) == 0 and not ctl.is_pending(key)
    await asyncio.sleep(0.01)
    assert loops == 2
    await ctl.stop()


async def test_a_dead_feeding_loop_is_reported_by_the_manager() -> None:
    async def loop() -> None:
        raise RuntimeError("watch broke")

    async def reconcile(key: str) -> float | None:
        return None

    ctl = Controller("monitor", reconcile, FAST, codec=STR_KEYS, loop=loop)
    manager = Manager([Service("monitor", True, ctl.start, ctl.stop, health=ctl.healthy)])
    manager.start()
    manager.start_leading()
    for _ in range(50):
        if manager.unhealthy():
            break
        await asyncio.sleep(0.02)
    assert "watch broke" in manager.unhealthy()["monitor"]
    await manager.stop()
    assert manager.unhealthy() == {}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


@pytest.mark.parametrize("path", sorted(p for p in CONTROLLER.rglob("*.py")
                                        if p.name not in ("queue.py", "generic.py")),
                         ids=lambda p: p.name)
def test_only_the_generic_controller_builds_starts_and_stops_work_queues(path: Path) -> None:
    """The monitors and the leader's term use controller.generic.Controller; none builds a
    WorkQueue or runs its workers itself (issue #40: one queue/runner implementation)."""
    tree = ast.parse(path.read_text())
    own = [ast.unparse(c) for c in _calls(tree)
           if (isinstance(c.func, ast.Name) and c.func.id == "WorkQueue")
           or (isinstance(c.func, ast.Attribute) and c.func.attr in ("start", "shutdown")
               and "queue" in ast.unparse(c.func.value) and len(c.args) <= 1
               and (c.func.attr == "shutdown" or c.args))]
    assert own == []


def test_the_controllers_wiring_has_no_lambdas() -> None:
    """app.py hands its parts named methods (an import graph sees them), never lambdas."""
    tree = ast.parse((CONTROLLER / "app.py").read_text())
    lambdas = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
    assert lambdas == []
