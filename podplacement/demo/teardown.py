"""The last act of ``podplacement demo``: stop everything it started, clients before
servers, also on Ctrl-C and errors (signal handling while it runs and while it cleans up)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import shutil
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from podplacement.demo import workloads
from podplacement.demo.cluster import ApiServer
from podplacement.demo.common import Child, DemoOptions
from podplacement.demo.seed import DemoRegistryPair
from podplacement.kubeclient import KubeAPI

log = logging.getLogger("podplacement.demo")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM, and SIGINT even when the parent started us with it ignored (Python
    then keeps it ignored: e.g. under a pytest-xdist worker), into KeyboardInterrupt while
    the demo runs, so its cleanup runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM during cleanup: a second Ctrl-C must not leave processes."""
    try:
        previous = {sig: signal.signal(sig, signal.SIG_IGN)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def started_anyway(starting: concurrent.futures.Future[ApiServer]) -> ApiServer | None:
    """The API server a background start produced (waited for: it is bounded by its own
    readiness limit), to be stopped; None when the start failed (it stopped what it had
    started)."""
    try:
        return starting.result()
    except Exception as exc:
        log.error("the API server did not start: %s", exc)
        return None


def log_tails(children: Sequence[Child], server: ApiServer | None) -> None:
    """Show the end of every child's log (what failed is usually there)."""
    every = list(children) + ([server.child] if server is not None and server.child else [])
    for child in every:
        log.error("last lines of %s (%s):\n%s", child.name, child.log, child.tail(15))


def cleanup(options: DemoOptions, work: Path, children: list[Child], server: ApiServer | None,
             pair: DemoRegistryPair | None) -> None:
    """Stop what was started, clients before servers: the controller, then the API server
    (it calls the webhook and holds keep-alive connections to it, which would make the
    webhook wait out its graceful-shutdown timeout), then the webhook, then the registries.
    Nothing is left running even if one stop fails."""
    if server is not None and server.kind == "existing" and not options.keep:
        with contextlib.suppress(Exception):
            asyncio.run(_delete_namespace(server.kubeconfig))
    server_stopped = False

    def stop_server() -> None:
        nonlocal server_stopped
        if server is None or server.stop is None or server_stopped:
            return
        server_stopped = True
        try:
            server.stop()
        except Exception as exc:  # keep stopping the others
            log.error("stopping the API server failed: %s", exc)

    for child in reversed(children):
        if child.name == "webhook":
            stop_server()
        try:
            child.stop()
        except Exception as exc:  # keep stopping the others
            log.error("stopping %s failed: %s", child.name, exc)
    stop_server()
    if pair is not None:
        pair.stop()
    if options.keep:
        log.info("work directory kept: %s", work)
    else:
        shutil.rmtree(work, ignore_errors=True)


async def _delete_namespace(kubeconfig: Path) -> None:
    """Delete the demo namespace (and so its pods and secret) if the demo made it."""
    api = await KubeAPI.from_kubeconfig(str(kubeconfig))
    path = f"/api/v1/namespaces/{workloads.DEMO_NAMESPACE}"
    try:
        if workloads.made_by_demo(await api.request("GET", path)):
            await api.request("DELETE", path)
            log.info("namespace %s deleted", workloads.DEMO_NAMESPACE)
    finally:
        await api.close()
