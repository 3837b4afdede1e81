"""Registry credentials from Kubernetes pull Secrets read through the API (I/O).

:class:`PullSecretReader` reads the named ``kubernetes.io/dockerconfigjson`` (or
``dockercfg``) Secrets with any client that has ``request("GET", path)`` and turns them into
credentials (:func:`imageinspect.credentials_from_pull_secrets`), in the order given, as the
kubelet does. Which Secrets a pod uses is the caller's rule; this module imports nothing of
the product.

A Secret's name comes from the pod's creator and is hostile input: the reader never builds
an API path itself. Its caller hands it ``secret_path(namespace, name)``
(``kubeclient.secret_path``), which checks the name as the API server checks Secret names and
raises :class:`ValueError` for one that is not (``..``, ``a/b``, ``%2e%2e``, ...): such a
Secret is never read, and is skipped like an undecodable one (``on_invalid``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from podplacement.imageinspect._credentials import Credential, credentials_from_pull_secrets
from podplacement.imageinspect._errors import CredentialError

log = logging.getLogger("podplacement.imageinspect")

#: Cached Secret reads at the most; the cache is emptied when it grows past this.
MAX_CACHED_SECRETS = 10_000


class SecretRequester(Protocol):
    """A Kubernetes client: ``request("GET", path)`` returns the decoded object and raises
    on failure an exception whose int ``status`` attribute is the HTTP status (404: no
    such Secret, 403: not allowed to read it)."""

    async def request(self, method: str, path: str) -> Any: ...


#: ``secret_path(namespace, name)`` → the API path of that Secret; raises
#: :class:`ValueError` when ``name`` (or ``namespace``) may not be one (``kubeclient.secret_path``).
SecretPath = Callable[[str, str], str]


class PullSecretReader:
    """Reads pull Secrets; each read (or its absence) is cached ``ttl`` seconds per
    (namespace, name).

    Args:
        api: the client (:class:`SecretRequester`).
        secret_path: builds and checks each Secret's API path (:data:`SecretPath`,
            ``kubeclient.secret_path``); the reader pastes no name into a path itself.
        ttl: seconds a read stays cached (0: never cached).
        clock: monotonic seconds (tests).
    """

    def __init__(self, api: SecretRequester, *, secret_path: SecretPath, ttl: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self._path = secret_path
        self.ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}

    async def secret(self, namespace: str, name: str) -> Any:
        """The Secret ``namespace/name``, or None when it is missing or not readable
        (404/403: the images are then pulled without it).

        Raises:
            ValueError: ``secret_path`` refused the name or namespace; nothing was read.
            Exception: any other failure of ``api.request`` (the caller decides).
        """
        path = self._path(namespace, name)
        now = self._clock()
        cached = self._cache.get((namespace, name))
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        try:
            secret = await self.api.request("GET", path)
        except Exception as exc:
            if getattr(exc, "status", None) not in (403, 404):
                raise
            log.info("pull secret %s/%s unavailable (%s): skipped", namespace, name,
                     getattr(exc, "status", None))
            secret = None
        if len(self._cache) >= MAX_CACHED_SECRETS:
            self._cache.clear()
        self._cache[(namespace, name)] = (now, secret)
        return secret

    async def credentials(
        self,
        refs: Sequence[tuple[str, str]],
        *,
        on_invalid: Callable[[str, str, Exception], None] | None = None,
    ) -> list[Credential]:
        """The credentials of the Secrets ``refs`` ((namespace, name), in order). A missing or
        unreadable Secret is skipped; so is one whose payload cannot be decoded
        (:class:`CredentialError`) and one whose name may not be a Secret's (``secret_path``
        raised :class:`ValueError`; never read), after ``on_invalid(namespace, name,
        error)``: the others still count.

        Raises:
            Exception: reading a Secret failed other than 403/404.
        """
        out: list[Credential] = []
        for namespace, name in refs:
            try:
                secret = await self.secret(namespace, name)
            except ValueError as exc:
                # The name is the pod creator's text: shown only through the checker's
                # bounded, quoted rendering, never pasted raw into the log.
                log.warning("pull secret in namespace %r skipped, never read: %s",
                            namespace[:64], exc)
                if on_invalid is not None:
                    on_invalid(namespace, name, exc)
                continue
            if secret is None:
                continue
            try:
                out.extend(credentials_from_pull_secrets([secret]))
            except (CredentialError, ValueError, TypeError, AttributeError) as exc:
                log.warning("pull secret %s/%s skipped: %s", namespace, name, exc)
                if on_invalid is not None:
                    on_invalid(namespace, name, exc)
        return out
