"""The one kubeconfig loader, and the ``Authorization`` header it keeps fresh.

:func:`load_configuration` resolves a kubeconfig file (``path``; else ``$KUBECONFIG`` or
``~/.kube/config`` when present; else the in-cluster ServiceAccount) with
``kubernetes.aio.config`` into a ``kubernetes.aio.client.Configuration``: server URL, TLS
files, and a bearer token or basic-auth user. :class:`ConfigCredentials` serves the header
from it and refreshes it as client-go's transport does:

- the in-cluster ServiceAccount token (the kubelet rotates projected tokens in place) is
  re-read at most every minute, by the ``kubernetes`` package's own refresh hook;
- a kubeconfig ``tokenFile`` is re-read, and a token from an ``exec`` plugin is fetched again
  once less than :data:`EXPIRY_MARGIN_SECONDS` remain before its ``expirationTimestamp``
  (a token without one is kept until it is refused); both are checked at most every
  ``check_seconds``;
- after a ``401 Unauthorized`` the whole configuration is loaded again (an exec plugin runs
  again, token files are re-read) and :class:`~kubeclient.client.KubeAPI` retries the request
  once with the new header (:meth:`ConfigCredentials.refresh`).

Client certificates (from the kubeconfig or from an exec plugin) are read once: the TLS context
is built when the client is.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: An exec plugin's token is fetched again when fewer seconds than this remain before its
#: ``expirationTimestamp`` (the check runs every ``check_seconds``, 30 s by default).
EXPIRY_MARGIN_SECONDS = 60.0

#: Loads a fresh ``(Configuration, kubeconfig loader or None for in-cluster)``.
ConfigLoader = Callable[[], Awaitable[tuple[Any, Any]]]


class Credentials(Protocol):
    """Where :class:`~kubeclient.client.KubeAPI` gets its ``Authorization`` header."""

    async def authorization(self) -> str | None:
        """The header value (``Bearer ...``, ``Basic ...``), or None for no header."""
        ...

    async def refresh(self, rejected: str | None) -> str | None:
        """The header to retry with after the API server refused ``rejected`` (401); None
        when there is nothing new to retry with."""
        ...


class StaticCredentials:
    """A fixed header (or none): :meth:`~kubeclient.client.KubeAPI.from_url`."""

    def __init__(self, header: str | None) -> None:
        self._header = header

    async def authorization(self) -> str | None:
        """The fixed header."""
        return self._header

    async def refresh(self, rejected: str | None) -> str | None:
        """Always None: a fixed token cannot be renewed."""
        return None


class ConfigCredentials:
    """The header of a ``kubernetes.aio.client.Configuration``, kept fresh (module docstring).

    Args:
        cfg: the loaded configuration.
        loader: the ``KubeConfigLoader`` that filled it (its user section and exec-plugin
            expiry are read), or None (in-cluster, or a configuration built elsewhere).
        load: loads a fresh ``(cfg, loader)`` from the same source, for refreshes; None: the
            credentials cannot be reloaded (no retry after a 401).
        check_seconds: how often (seconds) the token source is looked at again.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        cfg: Any,
        loader: Any = None,
        *,
        load: ConfigLoader | None = None,
        check_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg
        self._loader = loader
        self._load = load
        self._check_seconds = check_seconds
        self._clock = clock
        self._header: str | None = None
        self._checked: float | None = None
        self._lock = asyncio.Lock()
        #: How many times the configuration was loaded again (observability and tests).
        self.reloads = 0

    async def authorization(self) -> str | None:
        """The current header; looks at the token source again every ``check_seconds``.

        A failed reload (exec plugin error, unreadable token file) is logged and the last
        header is kept, so the API server's 401 then says what is wrong.
        """
        if self._checked is not None and self._clock() - self._checked < self._check_seconds:
            return self._header
        async with self._lock:
            if self._checked is None or self._clock() - self._checked >= self._check_seconds:
                if self._checked is not None and self._reload_due():
                    await self._reload()
                else:
                    self._header = await header_of(self._cfg)
                self._checked = self._clock()
            return self._header

    async def refresh(self, rejected: str | None) -> str | None:
        """Load the configuration again after ``rejected`` got a 401; return the new header,
        or None when it cannot be reloaded, the reload failed, or the header is unchanged.
        Concurrent callers refused with the same header share one reload."""
        if self._load is None:
            return None
        async with self._lock:
            if self._header == rejected:
                await self._reload()
                self._checked = self._clock()
            return self._header if self._header != rejected else None

    def _reload_due(self) -> bool:
        user = getattr(self._loader, "_user", None)  # the kubeconfig's user section
        if self._load is None or user is None:
            return False
        if "exec" in user:
            expiry = getattr(self._loader, "exec_plugin_expiry", None)
            if not isinstance(expiry, datetime.datetime):
                return False  # no expirationTimestamp: used until refused (401)
            left = expiry - datetime.datetime.now(datetime.UTC)
            return left.total_seconds() < EXPIRY_MARGIN_SECONDS
        return "tokenFile" in user

    async def _reload(self) -> None:
        assert self._load is not None
        try:
            cfg, loader = await self._load()
            header = await header_of(cfg)
        except Exception as exc:  # the kubernetes loader raises ConfigException and others
            log.warning("reloading the Kubernetes credentials failed: %s", exc)
            return
        if header is None and self._header is not None:
            # The kubernetes loader logs and swallows exec-plugin failures, leaving no token.
            log.warning("reloading the Kubernetes credentials gave no token; keeping the last")
            return
        self._cfg, self._loader, self._header = cfg, loader, header
        self.reloads += 1


async def header_of(cfg: Any) -> str | None:
    """The ``Authorization`` header of a ``kubernetes.aio.client.Configuration``: its bearer
    token (after its refresh hook ran: in-cluster token re-read), else basic auth, else None."""
    token = await cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    if token is None and cfg.username:
        token = cfg.get_basic_auth_token()
    return str(token) if token else None


def default_kubeconfig(default_location: str | None = None) -> str | None:
    """The kubeconfig used when none is named: the first file of ``$KUBECONFIG``, else
    ``default_location`` (``~/.kube/config`` by default) when it exists, else None
    (in-cluster)."""
    if default_location is None:
        from kubernetes.aio import config as kconfig

        default_location = kconfig.KUBE_CONFIG_DEFAULT_LOCATION
    env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    default = os.path.expanduser(default_location)
    return env or (default if os.path.exists(default) else None)


async def load_configuration(path: str | None, context: str | None = None) -> tuple[Any, Any]:
    """Load ``(Configuration, KubeConfigLoader)`` from the kubeconfig file ``path`` (and
    ``context``, default the current one), or ``(Configuration, None)`` from the in-cluster
    ServiceAccount when ``path`` is None. Runs an exec plugin when the user has one.

    Raises:
        kubernetes.config.ConfigException: no usable configuration (unreadable file, unknown
            context, failing exec plugin, not in a pod).
    """
    from kubernetes.aio.client import Configuration

    from podplacement.kubeclient._kubeconfig import load_incluster, load_kubeconfig

    cfg = Configuration()
    if path is None:
        load_incluster(cfg)
        return cfg, None
    loader = await load_kubeconfig(path, context, cfg)
    return cfg, loader
