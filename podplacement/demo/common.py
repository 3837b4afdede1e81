"""What every act of ``podplacement demo`` (:mod:`podplacement.demo.run`) shares: its
options and error, the processes it starts, bounded waiting, and small API/HTTP helpers."""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import WEBHOOK_CONFIGURATION_NAME

log = logging.getLogger("podplacement.demo")

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The working directory of the processes the demo starts: the checkout when run from one,
#: else the current directory (an installed wheel has no checkout).
WORKDIR = REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else None
#: The CRDs the demo applies: package data of ``podplacement`` (``podplacement/crds/``,
#: links to deploy/'s files in a checkout, copies in a wheel).
CRD_FILES = tuple(
    Path(str(importlib.resources.files("podplacement") / "crds" / name))
    for name in ("podplacementconfig.yaml", "imageplatformcatalog.yaml", "podplacementpolicy.yaml",
                 "noderesourcetopology-crd.yaml")
)
MWC_PATH = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
    + WEBHOOK_CONFIGURATION_NAME
)


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and where its log is."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``podplacement demo`` was asked to do.

    Attributes:
        debs: directory with the four ``busybox-static_*_<arch>.deb`` files (those missing
            are downloaded there, see :func:`podplacement.demo.images.prepare_busybox`).
        download: whether missing packages are downloaded (else stand-ins are used).
        api_server: ``auto`` (the real control plane when found, else localkube), ``real``
            (fail without it) or ``localkube``; ignored with ``kubeconfig``.
        kubeconfig: use this existing cluster instead of starting an API server.
        keep: keep the work directory (logs, certificates, kubeconfig) and, on an existing
            cluster, the ``demo`` namespace.
        settle_timeout: seconds to wait for the pods to be decided.
        max_wait_seconds: ``spec.topology.maxWaitSeconds`` of the demo's config.
        out: where the table goes.
    """

    debs: Path
    download: bool = True
    api_server: str = "auto"
    kubeconfig: Path | None = None
    keep: bool = False
    settle_timeout: float = 60.0
    max_wait_seconds: int = 45
    out: TextIO = field(default_factory=lambda: sys.stdout)


# --- processes --------------------------------------------------------------------------


@dataclass
class Child:
    """A process the demo started: ``name`` for messages, its ``log`` file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _log_file: IO[bytes] | None = None
    _stopped: bool = False

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of its log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL and wait (idempotent). A process
        that had already exited is reported (it should have run until now)."""
        code = self.popen.poll()
        if code is not None and not self._stopped:
            log.warning("%s had exited on its own (exit code %s); last lines of %s:\n%s",
                        self.name, code, self.log, self.tail(10))
        self._stopped = True
        if code is None:
            began = time.monotonic()
            self.popen.terminate()
            try:
                code = self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s; killing it", self.name, timeout)
                self.popen.kill()
                code = self.popen.wait(timeout=10)
            log.info("stopped %s (pid %d, exit code %s, %.1f s)", self.name, self.popen.pid,
                     code, time.monotonic() - began)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def start_child(name: str, args: Sequence[str], log_dir: Path,
                env: dict[str, str] | None = None) -> Child:
    """Start ``args`` in its own session (so a terminal Ctrl-C reaches only the demo, which
    then stops its children in order), stdout+stderr to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{name}.log"
    handle = path.open("ab")
    try:
        popen = subprocess.Popen(
            list(args), stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            cwd=WORKDIR, env={**os.environ, **(env or {})}, start_new_session=True,
        )
    except BaseException:
        handle.close()
        raise
    log.info("started %s (pid %d), log %s", name, popen.pid, path)
    return Child(name, popen, path, handle)


def podplacement_args(*args: str) -> list[str]:
    """The command line of a ``podplacement`` subcommand run with this interpreter."""
    return [sys.executable, "-m", "podplacement", "--log-format", "text", *args]


# --- waiting ----------------------------------------------------------------------------


async def wait_for(what: str, check: Callable[[], Awaitable[bool]], limit: float,
                   interval: float = 0.2, alive: Sequence[Child] = ()) -> None:
    """Poll ``check`` until it returns True, at most ``limit`` seconds.

    Raises:
        DemoError: the time ran out, or one of ``alive`` exited (with its log tail).
    """
    deadline = time.monotonic() + limit
    while True:
        for child in alive:
            if not child.alive():
                raise DemoError(f"{child.name} exited while waiting for {what}:\n{child.tail()}")
        if await check():
            return
        if time.monotonic() >= deadline:
            raise DemoError(f"timed out after {limit:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


async def api_ok(api: KubeAPI, path: str) -> bool:
    """True when a GET of ``path`` succeeds (False on any :class:`ApiError`)."""
    try:
        await api.request("GET", path)
    except ApiError:
        return False
    return True


async def create(api: KubeAPI, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    """POST ``obj`` to the collection ``path``; an existing object (409) is left alone and
    returned as it is."""
    try:
        return await api.request("POST", path, body=obj)
    except ApiError as exc:
        if exc.status != 409:
            raise
        name = obj["metadata"]["name"]
        return await api.request("GET", f"{path}/{name}")


def http_text(url: str) -> str:
    """GET ``url`` and return the body as text ("" on any error)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bytes(resp.read()).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return ""


def https_ok(url: str, ctx: ssl.SSLContext) -> bool:
    """True when a GET of ``url`` (TLS with ``ctx``, 2 s timeout) answers 200; False on
    any error."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
