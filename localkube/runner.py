"""Run localkube for tests, demos and benchmarks: in a background thread (its own event loop)
or, with ``in_process=False``, as a ``python -m localkube`` child process.

:class:`LocalKube` starts the aiohttp server on 127.0.0.1 (port 0 = pick a free one), loads
CRDs from YAML files, writes a kubeconfig for kubectl and clients, and exposes the request
log and the fault-injection hook of :class:`~localkube.server.KubeServer` (over the
``/localkube/`` admin endpoints when the server runs in a child process). A child process
avoids sharing the GIL with a busy client in the test process (benchmarks).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import yaml
from aiohttp import web

from localkube.server import Fault, KubeServer, RequestRecord, ServerOptions, build_app

T = TypeVar("T")

_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
            410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


def load_yaml_documents(path: str | Path) -> list[dict[str, Any]]:
    """All non-empty YAML documents of a file (a CRD manifest may hold several)."""
    with open(path, encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if isinstance(d, dict)]


def _crd_loader(doc: dict[str, Any]) -> Callable[[KubeServer], dict[str, Any]]:
    def load(server: KubeServer) -> dict[str, Any]:
        return server.load_crd(doc)

    return load


class LocalKube:
    """A localkube server running in a daemon thread.

    Args:
        crd_files: CRD YAML files to load at start (each may hold several documents).
        port: TCP port on 127.0.0.1; 0 picks a free port.
        bookmark_interval: seconds between watch BOOKMARK events.
        history_size: watch-history length (older resourceVersions answer 410).
        record_requests: keep the request log (``requests``).
        in_process: True runs the server in a daemon thread of this process; False runs
            ``python -m localkube`` as a child process (no :meth:`call` then).

    Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        crd_files: Iterable[str | Path] = (),
        *,
        port: int = 0,
        bookmark_interval: float = 1.0,
        history_size: int = 10000,
        record_requests: bool = True,
        in_process: bool = True,
    ) -> None:
        self.in_process = in_process
        self._proc: subprocess.Popen[str] | None = None
        self.crd_files = [Path(p) for p in crd_files]
        self.port = port
        self.options = ServerOptions(bookmark_interval=bookmark_interval,
                                     history_size=history_size,
                                     record_requests=record_requests)
        self.server: KubeServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalKube:
        """Start the server thread and wait until it accepts connections.

        Raises:
            RuntimeError: the server failed to start (e.g. the port is taken, a CRD is invalid).
        """
        if self._thread is not None or self._proc is not None:
            return self
        if not self.in_process:
            return self._start_process()
        self._thread = threading.Thread(target=self._run, name="localkube", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("localkube did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"localkube failed to start: {self._error!r}") from self._error
        return self

    def _start_process(self) -> LocalKube:
        cmd = [sys.executable, "-m", "localkube", "--port", str(self.port),
               "--bookmark-interval", str(self.options.bookmark_interval),
               "--history-size", str(self.options.history_size)]
        if self.options.record_requests:
            cmd.append("--record-requests")
        for path in self.crd_files:
            cmd += ["--crd", str(path)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the child prints its URL once it listens
        if not line.startswith("localkube listening on "):
            proc.kill()
            proc.wait(10)
            proc.stdout.close()
            raise RuntimeError(f"localkube child failed to start: {line!r}")
        self.port = int(line.rsplit(":", 1)[-1])
        self._proc = proc
        return self

    def _admin(self, method: str, path: str, body: Any = None) -> Any:
        r = httpx.request(method, f"{self.url}/localkube/{path}", json=body, timeout=30)
        r.raise_for_status()
        return r.json()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._startup())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._cleanup())
            loop.close()

    async def _startup(self) -> None:
        self.server = KubeServer(self.options)
        for path in self.crd_files:
            for doc in load_yaml_documents(path):
                if doc.get("kind") == "CustomResourceDefinition":
                    self.server.load_crd(doc)
        app = build_app(self.server)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def _cleanup(self) -> None:
        if self.server is not None:
            await self.server.aclose()
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        """Stop the server, end all watches and join the thread or child (idempotent)."""
        if self._proc is not None:
            proc, self._proc = self._proc, None
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()
            return
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self.server is not None:
            server = self.server
            loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)
        self._thread = None
        self._loop = None

    def __enter__(self) -> LocalKube:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- helpers ---------------------------------------------------------------------------
    def call(self, fn: Callable[[KubeServer], T]) -> T:
        """Run ``fn(server)`` on the server's event loop thread and return its result."""
        loop, server = self._loop, self.server
        if loop is None or server is None:
            raise RuntimeError("localkube is not running")

        async def run() -> T:
            return fn(server)

        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(run(), loop)
        return fut.result(30)

    def load_crd_file(self, path: str | Path) -> None:
        """Create the CRDs of a YAML file (as if POSTed)."""
        docs = load_yaml_documents(path)
        for doc in docs:
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            if self._proc is not None:
                r = httpx.post(f"{self.url}/apis/apiextensions.k8s.io/v1/"
                               "customresourcedefinitions", json=doc, timeout=30)
                if r.status_code != 201:
                    raise RuntimeError(f"CRD {path}: {r.status_code} {r.text}")
            else:
                self.call(_crd_loader(doc))

    def inject_fault(
        self,
        status: int = 409,
        count: int = 1,
        *,
        method: str | None = None,
        plural: str | None = None,
        name: str | None = None,
        namespace: str | None = None,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with ``status`` (default 409 Conflict
        with the real stale-resourceVersion message). ``method`` is an HTTP method
        (``PATCH``, ``PATCH|PUT``, or ``WRITE`` for any write), ``plural`` a resource
        (``pods``); ``reason`` defaults from the status (409 Conflict, 429 TooManyRequests,
        500 InternalError, 503 ServiceUnavailable...)."""
        why = reason or _REASONS.get(status, "InternalError")
        fault = Fault(status, count, method, plural, name, namespace, why, message)
        if self._proc is not None:
            self._admin("POST", "faults", fault.__dict__)
            return
        if self.server is None:
            raise RuntimeError("localkube is not running")
        self.server.inject_fault(fault)

    def clear_faults(self) -> None:
        """Drop pending injected faults."""
        if self._proc is not None:
            self._admin("DELETE", "faults")
        elif self.server is not None:
            self.server.clear_faults()

    @property
    def requests(self) -> list[RequestRecord]:
        """A copy of the request log (method, path, content_type, status, verb)."""
        if self._proc is not None:
            return [RequestRecord(**r) for r in self._admin("GET", "requests")]
        if self.server is None:
            return []
        return list(self.server.request_log)

    def clear_requests(self) -> None:
        """Empty the request log."""
        if self._proc is not None:
            self._admin("DELETE", "requests")
        elif self.server is not None:
            self.server.request_log.clear()

    def request_counts(self) -> dict[str, int]:
        """Requests per verb (``get``, ``list``... as ``RequestRecord.verb``)."""
        counts: dict[str, int] = {}
        for r in self.requests:
            counts[r.verb] = counts.get(r.verb, 0) + 1
        return counts

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        """A kubeconfig dict pointing at this server (no credentials needed)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "localkube", "cluster": {"server": self.url}}],
            "users": [{"name": "localkube-admin", "user": {"token": "localkube"}}],
            "contexts": [{"name": "localkube", "context": {
                "cluster": "localkube", "user": "localkube-admin", "namespace": namespace}}],
            "current-context": "localkube",
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """Write :meth:`kubeconfig` as YAML to ``path``; returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(self.kubeconfig(namespace)), encoding="utf-8")
        return p
