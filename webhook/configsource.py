"""Where the webhook gets the PodPlacementConfig ``cluster`` from, without an API call per request.

:class:`WatchingConfigSource` lists the singleton with
``fieldSelector=metadata.name=cluster``, then watches from the list's resourceVersion (with
bookmarks, so the resume point stays fresh); a watch that ends is resumed from the last
resourceVersion seen, a ``410 Gone`` (as an HTTP status or as an ``ERROR`` event, see
``reference/watch-too-old-resource-version.json``) triggers a relist, and any other failure a
bounded exponential backoff. The parsed :class:`~controller.config.PlacementConfig` (None while
the object does not exist) is cached in memory and read by every admission request. It talks
to the API server with plain aiohttp using the kubeconfig's (or the in-cluster) server address,
CA, client certificate or bearer token, and keeps the raw JSON.
:class:`StaticConfigSource` serves a fixed config (``--config-file``) for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson
import yaml

from controller.config import (
    CONFIG_KIND,
    CONFIG_NAME,
    CONFIG_PLURAL,
    GROUP,
    VERSION,
    ConfigError,
    PlacementConfig,
)

log = logging.getLogger(__name__)

CONFIG_LIST_PATH = f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}"


class ConfigSource(Protocol):
    """What the admission handler needs: the cached config and whether it was read once."""

    @property
    def current(self) -> PlacementConfig | None:
        """The parsed config, or None when the PodPlacementConfig ``cluster`` does not exist."""
        ...

    @property
    def synced(self) -> bool:
        """True once the config was read (found or not) at least once."""
        ...

    async def start(self) -> None:
        """Begin keeping :attr:`current` up to date (returns at once)."""
        ...

    async def stop(self) -> None:
        """Stop background work started by :meth:`start`."""
        ...


def parse_config_object(obj: Any) -> PlacementConfig | None:
    """Turn a PodPlacementConfig dict (or None/absent) into a :class:`PlacementConfig`.

    Raises:
        ConfigError: the object is not a PodPlacementConfig or a field is unusable.
    """
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise ConfigError("<root>", "a PodPlacementConfig must be an object")
    kind = obj.get("kind", CONFIG_KIND)
    if kind != CONFIG_KIND:
        raise ConfigError("kind", f"expected {CONFIG_KIND}, got {kind!r}")
    return PlacementConfig.from_object(obj)


class StaticConfigSource:
    """A fixed config (or None), synced from the start. Used by ``--config-file``, tests and
    benchmarks."""

    def __init__(self, config: PlacementConfig | None) -> None:
        self._config = config

    @classmethod
    def from_file(cls, path: str | Path) -> StaticConfigSource:
        """Read a PodPlacementConfig object from a YAML or JSON file; an empty file (or
        ``null``) means "no config".

        Raises:
            OSError: the file cannot be read.
            yaml.YAMLError: the file is not YAML.
            ConfigError: the object is not a usable PodPlacementConfig.
        """
        data = yaml.safe_load(Path(path).read_text())
        return cls(parse_config_object(data))

    @property
    def current(self) -> PlacementConfig | None:
        """The fixed config."""
        return self._config

    @property
    def synced(self) -> bool:
        """Always True."""
        return True

    def set(self, config: PlacementConfig | None) -> None:
        """Replace the config (tests)."""
        self._config = config

    async def start(self) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class ApiConnection:
    """How to reach the API server: base URL (``https://host:port``), TLS context, fixed
    request headers, and optionally a token file re-read for every call (the kubelet rotates
    projected ServiceAccount tokens in place)."""

    server: str
    ssl_context: ssl.SSLContext | bool
    headers: Mapping[str, str]
    token_file: Path | None = None

    def request_headers(self) -> dict[str, str]:
        """Headers for one call: the fixed ones plus ``Authorization`` from ``token_file``.

        Raises:
            OSError: the token file cannot be read.
        """
        headers = dict(self.headers)
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        return headers

    @classmethod
    def in_cluster(cls, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiConnection:
        """The pod's own ServiceAccount: ``$KUBERNETES_SERVICE_HOST``/``_PORT``, the mounted
        ``ca.crt`` and ``token`` (re-read per call).

        Raises:
            KeyError: not running in a pod (service environment variables missing).
            OSError / ssl.SSLError: the CA file is missing or invalid.
        """
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ["KUBERNETES_SERVICE_PORT"]
        if ":" in host:
            host = f"[{host}]"
        ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        return cls(f"https://{host}:{port}", ctx, {"Accept": "application/json"},
                   token_file=sa_dir / "token")

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> ApiConnection:
        """Build from a kubeconfig file (default ``$KUBECONFIG`` / ``~/.kube/config``), or from
        the in-cluster ServiceAccount (:meth:`in_cluster`) when ``path`` is None and no
        kubeconfig exists.

        Uses the ``kubernetes`` package's loader only to resolve the file (it writes inline
        certificate data to temp files; tokens from exec plugins are read once). Raises:
            kubernetes.config.ConfigException: the kubeconfig is unusable.
            KeyError: no kubeconfig and not running in a pod.
        """
        from kubernetes import client, config  # the sync loader; reads files only

        cfg = client.Configuration()
        try:
            config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        except config.ConfigException:
            if path is not None:
                raise
            return cls.in_cluster()
        ctx: ssl.SSLContext | bool
        if cfg.verify_ssl is False:
            ctx = False
        else:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        headers: dict[str, str] = {"Accept": "application/json"}
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token:
            headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        return cls(cfg.host.rstrip("/"), ctx, headers)


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class NamedObjectWatch:
    """Lists and watches one named object (``fieldSelector=metadata.name=NAME`` on the
    collection ``list_path``) and hands every state to :meth:`_apply` (the object, or None
    while it does not exist). Subclasses keep what they need of it.

    Args:
        connection: API server address and credentials.
        list_path: the collection, e.g. ``/apis/podplacement.io/v1beta1/podplacementconfigs``
            or ``/apis/coordination.k8s.io/v1/namespaces/NS/leases``.
        name: the object's name.
        backoff_initial / backoff_max: seconds between retries after a failure (doubling,
            with jitter, capped).
        watch_timeout: ``timeoutSeconds`` asked of each watch call (the server closes it then
            and the watch resumes from the last resourceVersion).
    """

    def __init__(
        self,
        connection: ApiConnection,
        list_path: str,
        name: str,
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        watch_timeout: int = 300,
    ) -> None:
        self._conn = connection
        self._list_path = list_path
        self._name = name
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._watch_timeout = watch_timeout
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        #: Number of list calls made (observability and tests).
        self.lists = 0

    def _apply(self, obj: Mapping[str, Any] | None) -> None:
        """Take the object's new state (None: it does not exist)."""
        raise NotImplementedError

    @property
    def synced(self) -> bool:
        """True once one list succeeded."""
        return self._synced.is_set()

    async def wait_synced(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the first successful list; returns :attr:`synced`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._synced.wait(), seconds)
        return self.synced

    async def start(self) -> None:
        """Start the list/watch loop in a background task."""
        if self._task is None:
            self._session = aiohttp.ClientSession()
            self._task = asyncio.create_task(self._run(), name=f"watch {self._name}")

    async def stop(self) -> None:
        """Cancel the loop and close the HTTP session."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        delay = self._backoff_initial
        while True:
            try:
                rv = await self._list()
                delay = self._backoff_initial
                if rv is None:  # the CRD is not served: look again later
                    await asyncio.sleep(self._backoff_max)
                    continue
                await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except _Gone:
                log.info("%s watch expired (410); relisting", self._name)
            except Exception as exc:
                log.warning("%s list/watch failed: %r; retrying in %.1fs", self._name,
                            exc, delay)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, self._backoff_max)

    async def _list(self) -> str | None:
        assert self._session is not None
        selector = quote(f"metadata.name={self._name}", safe="")
        url = f"{self._conn.server}{self._list_path}?fieldSelector={selector}"
        self.lists += 1
        async with self._session.get(url, ssl=self._conn.ssl_context,
                                     headers=self._conn.request_headers()) as resp:
            if resp.status == 404:
                self._apply(None)
                self._synced.set()
                return None
            resp.raise_for_status()
            body = orjson.loads(await resp.read())
        items = body.get("items") or []
        self._apply(items[0] if items else None)
        self._synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, rv: str) -> None:
        """Watch from ``rv`` until cancelled; resumes after each normal end of stream.

        Raises:
            _Gone: the resourceVersion expired (relist needed).
            aiohttp.ClientError / OSError: transport failure (caller backs off).
        """
        assert self._session is not None
        selector = quote(f"metadata.name={self._name}", safe="")
        while True:
            url = (
                f"{self._conn.server}{self._list_path}?watch=true&allowWatchBookmarks=true"
                f"&fieldSelector={selector}&resourceVersion={quote(rv, safe='')}"
                f"&timeoutSeconds={self._watch_timeout}"
            )
            timeout = aiohttp.ClientTimeout(total=None, sock_read=self._watch_timeout + 30)
            started, events = asyncio.get_running_loop().time(), 0
            async with self._session.get(url, ssl=self._conn.ssl_context, timeout=timeout,
                                         headers=self._conn.request_headers()) as resp:
                if resp.status == 410:
                    raise _Gone()
                resp.raise_for_status()
                async for line in resp.content:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    events += 1
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone()
                        raise RuntimeError(f"watch error event: {obj.get('message')!r}")
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = str(new_rv)
                    if kind in ("ADDED", "MODIFIED"):
                        self._apply(obj)
                    elif kind == "DELETED":
                        self._apply(None)
            elapsed = asyncio.get_running_loop().time() - started
            if not events and elapsed < min(1.0, self._watch_timeout / 2):
                # A server that closes watches at once must not make this loop spin.
                raise RuntimeError("watch closed immediately")


class WatchingConfigSource(NamedObjectWatch):
    """Lists and watches the PodPlacementConfig ``cluster`` and caches the parsed config
    (:class:`NamedObjectWatch` with ``CONFIG_LIST_PATH`` and ``CONFIG_NAME``)."""

    def __init__(
        self,
        connection: ApiConnection,
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        watch_timeout: int = 300,
    ) -> None:
        super().__init__(connection, CONFIG_LIST_PATH, CONFIG_NAME,
                         backoff_initial=backoff_initial, backoff_max=backoff_max,
                         watch_timeout=watch_timeout)
        self._config: PlacementConfig | None = None

    @property
    def current(self) -> PlacementConfig | None:
        """The cached config (None while the object does not exist)."""
        return self._config

    def _apply(self, obj: Mapping[str, Any] | None) -> None:
        if obj is None:
            self._config = None
            return
        try:
            self._config = parse_config_object(obj)
        except ConfigError as exc:
            # Keep the last good config: CRD validation should make this unreachable.
            log.warning("ignoring unusable PodPlacementConfig: %s", exc)
