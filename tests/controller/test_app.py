"""Controller wiring without a cluster: config parsing fallbacks and option defaults."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from podplacement.controller.app import Controller, ControllerOptions
from podplacement.controller.lifecycle import Lifecycle
from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import CONFIG_NAME, PlacementConfig


async def test_unreadable_config_falls_back_to_defaults_with_the_error() -> None:
    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl = Controller(api, ControllerOptions(leader_election=False, metrics_port=None))
    try:
        assert ctl.config_source() == (PlacementConfig(), None)  # no config: defaults
        ctl.configs.cache[CONFIG_NAME] = {
            "metadata": {"name": CONFIG_NAME, "resourceVersion": "1"},
            "spec": {"imageInspection": {"cacheTTL": "forever"}},
        }
        config, error = ctl.config_source()
        assert config == PlacementConfig()
        assert error is not None and "cacheTTL" in error
        ctl.configs.cache[CONFIG_NAME] = {
            "metadata": {"name": CONFIG_NAME, "resourceVersion": "2", "generation": 3},
            "spec": {"fallbackArchitecture": "arm64"},
        }
        config, error = ctl.config_source()
        assert error is None and config.fallback_architecture == "arm64"
        assert config.generation == 3
    finally:
        await api.close()


def test_default_options_match_the_issue() -> None:
    opts = ControllerOptions()
    assert opts.workers == 32 and opts.events and opts.leader_election


async def test_deleted_node_or_nrt_leaves_the_numa_cache() -> None:
    from podplacement.rules.numa._decide import _CACHE

    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl = Controller(api, ControllerOptions(leader_election=False, metrics_port=None))
    try:
        marker: Any = object()
        for name in ("gone-node", "kept-node"):
            _CACHE.parsed_nodes[name] = ("1", marker)
            _CACHE.parsed_nrts[name] = ("1", marker)
        ctl.gated.on_nrt("MODIFIED", {"metadata": {"name": "kept-node"}}, None)
        ctl.gated.on_node("DELETED", {"metadata": {"name": "gone-node"}}, None)
        assert "gone-node" not in _CACHE.parsed_nodes and "gone-node" not in _CACHE.parsed_nrts
        assert "kept-node" in _CACHE.parsed_nodes
        ctl.gated.on_nrt("DELETED", {"metadata": {"name": "kept-node"}}, None)
        assert "kept-node" not in _CACHE.parsed_nrts
    finally:
        for name in ("gone-node", "kept-node"):
            _CACHE.forget(name)
        await api.close()


def test_log_verbosity_from_the_config_sets_and_restores_logger_levels() -> None:
    import logging

    from podplacement.controller.app import apply_log_verbosity

    try:
        assert "podplacement.controller" in apply_log_verbosity("Debug")
        assert logging.getLogger("podplacement.controller").level == logging.DEBUG
        assert logging.getLogger("aiohttp.client").level == logging.NOTSET
        assert "aiohttp.client" in apply_log_verbosity("Trace")
        assert logging.getLogger("aiohttp.client").level == logging.DEBUG
    finally:
        assert apply_log_verbosity("Normal") == ()
    assert logging.getLogger("podplacement.controller").level == logging.NOTSET
    assert logging.getLogger("aiohttp.client").level == logging.NOTSET


async def test_the_params_store_takes_the_configured_cache_ttl_at_once() -> None:
    """The TTL of the params object's entries is the config's cacheTTL from the first config
    event (not the 6 h default until some pod is published), and follows every change."""
    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl = Controller(api, ControllerOptions(leader_election=False, metrics_port=None))
    try:
        assert ctl.params.ttl_seconds == PlacementConfig().image_inspection.cache_ttl_seconds
        obj = {"metadata": {"name": CONFIG_NAME, "resourceVersion": "1"},
               "spec": {"imageInspection": {"cacheTTL": "20s"}}}
        ctl.configs.cache[CONFIG_NAME] = obj
        ctl.gated.on_config("ADDED", obj, None)
        assert ctl.params.ttl_seconds == 20.0
        changed = {"metadata": {"name": CONFIG_NAME, "resourceVersion": "2"},
                   "spec": {"imageInspection": {"cacheTTL": "5s"}}}
        ctl.configs.cache[CONFIG_NAME] = changed
        ctl.gated.on_config("MODIFIED", changed, obj)
        assert ctl.params.ttl_seconds == 5.0
    finally:
        await api.close()


async def test_publishing_a_cached_inspection_result_keeps_the_entrys_age() -> None:
    """The reconciler publishes every anonymous lookup, also those the inspector answered
    from its cache: the entry's learned time is the result's fetched_at (when the registry
    answered), so it is not renewed by pods."""
    import time

    from podplacement.imageinspect import ImageInfo, Platform

    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl = Controller(api, ControllerOptions(leader_election=False, metrics_port=None))
    try:
        ctl.lifecycle = object()  # type: ignore[assignment]  # owns the policy
        fetched = time.time() - 15
        info = ImageInfo("reg.example/app:v1", "sha256:" + "0" * 64,
                         "application/vnd.oci.image.index.v1+json",
                         (Platform("linux", "amd64"), Platform("linux", "arm64")),
                         fetched_at=fetched)
        ctl.publisher.publish("reg.example/app:v1", info)
        ctl.publisher.publish("reg.example/app:v1", info)  # a second pod, the cached copy
        assert ctl.params.learned_at("reg.example/app:v1") == fetched
        assert ctl.params.learned() == {"reg.example/app:v1": int(fetched)}
    finally:
        ctl.lifecycle = None
        await api.close()


def _leading_lifecycle(api: KubeAPI, tmp_path: Path) -> tuple[Controller, Lifecycle]:
    """A controller (no election, no metrics server) whose lifecycle keys are served by
    its own Lifecycle, as a leader's term serves them."""
    from podplacement.controller import lifecycle

    ctl = Controller(api, ControllerOptions(
        leader_election=False, metrics_port=None, webhook_url="https://127.0.0.1:9443/mutate",
        cert_dir=str(tmp_path), retry_base_delay=0.05))
    lc = ctl._make_lifecycle()
    assert lc is not None
    ctl.lifecycle = lc
    ctl._handlers = dict.fromkeys(lifecycle.KEYS, lc.handle)
    return ctl, lc


async def test_the_last_work_is_served_to_its_end_within_its_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the pod workers stopped, a lifecycle key is served alone on a queue of its
    own: pass after pass until one says done, and never longer than the lifecycle's
    final_seconds (the pass in flight is then cancelled)."""
    import asyncio

    from podplacement.controller.lifecycle import LAST_STOP_KEY, ReconcileResult, coordinator

    # Lifecycle.final_seconds reads the margin where Lifecycle is defined
    monkeypatch.setattr(coordinator, "FINAL_MARGIN_SECONDS", 0.5)
    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl, lc = _leading_lifecycle(api, tmp_path)
    try:
        lc.admission_settle_seconds = lc.uninstall_deadline_seconds = 0.0
        passes: list[str] = []

        async def settling() -> ReconcileResult:
            passes.append("pass")
            if len(passes) < 3:
                return ReconcileResult("standing-down", "unchanged", requeue_after=0.05)
            return ReconcileResult("stood-down", "unchanged")

        lc.last_stop = settling  # type: ignore[method-assign]
        await asyncio.wait_for(ctl.term.serve_to_end(LAST_STOP_KEY), 5)
        assert passes == ["pass"] * 3

        async def hanging() -> ReconcileResult:
            await asyncio.sleep(60)
            raise AssertionError("not cancelled")

        lc.last_stop = hanging  # type: ignore[method-assign]
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(ctl.term.serve_to_end(LAST_STOP_KEY), 5)
        assert 0.4 <= asyncio.get_running_loop().time() - started < 2.0
        assert ctl.term.final_queue is None
    finally:
        await api.close()


def _runnables_table() -> list[tuple[str, bool]]:
    """(name, needs the lease) of each row of docs/design.md's "Runnables" table."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = text.split("\n## Runnables\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| runnable | needs the lease? |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|") for line in table.splitlines()[2:]]
    return [(cells[1].strip(), {"yes": True, "no": False}[cells[2].strip()]) for cells in rows]


async def test_the_runnables_are_those_of_the_design_table_in_its_order() -> None:
    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl = Controller(api, ControllerOptions(leader_election=False, metrics_port=None))
    try:
        wired = [(r.name, r.needs_lease) for r in ctl.runtime.runnables]
        assert wired == _runnables_table()
        # the caches first, the leader's watch of placed pods (feeding two others) last
        assert wired[0] == ("events", False) and wired[-1] == ("placed pods", True)
    finally:
        await api.close()


async def test_a_runnable_that_dies_is_named_by_healthz_and_the_rest_stop_cleanly(
) -> None:
    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl = Controller(api, ControllerOptions(leader_election=False, metrics_port=None,
                                            registries_refresh_seconds=0.05))

    async def broken() -> None:
        raise RuntimeError("boom")

    ctl.registry_rules.run = broken  # type: ignore[method-assign]
    ctl.runtime = type(ctl.runtime)(ctl._runnables())
    ctl.runtime.start()
    try:
        for _ in range(20):
            await asyncio.sleep(0)
            if ctl.runtime.unhealthy():
                break
        assert ctl.runtime.unhealthy() == {"registries configmap": "died: RuntimeError: boom"}
        assert "informer gated pods" in ctl.runtime.running()
    finally:
        await asyncio.wait_for(ctl.runtime.stop(), 10)
        await api.close()
    assert ctl.runtime.running() == ()


async def test_a_failing_last_pass_gives_up_after_its_final_attempts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lifecycle key served to its end whose pass keeps failing is given up after
    FINAL_ATTEMPTS passes (the final queue's failure count), well before final_seconds:
    the count is read from the queue serving the key, even while that queue is empty."""
    import asyncio

    from podplacement.controller.lifecycle import LAST_STOP_KEY, ReconcileResult, coordinator

    monkeypatch.setattr(coordinator, "FINAL_MARGIN_SECONDS", 30.0)
    api = KubeAPI.from_url("http://127.0.0.1:9")
    ctl, lc = _leading_lifecycle(api, tmp_path)
    try:
        passes: list[str] = []

        async def failing() -> ReconcileResult:
            passes.append("pass")
            raise RuntimeError("the API server is gone")

        lc.last_stop = failing  # type: ignore[method-assign]
        await asyncio.wait_for(ctl.term.serve_to_end(LAST_STOP_KEY), 10)
        assert len(passes) == coordinator.FINAL_ATTEMPTS
    finally:
        await api.close()
