"""A pod's registry credentials, from its pull Secrets (I/O: Secret reads, briefly cached).

The rule is the kubelet's: the pod's ``imagePullSecrets`` read from its own namespace (the
ServiceAccount admission plugin already merged the service account's), then the global pull
secret of the PodPlacementConfig. Shared by the reconciler and ``podplacement explain``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from controller.config import PlacementConfig
from kubeclient import ApiError, KubeRequester

log = logging.getLogger(__name__)


class PullSecrets:
    """Reads pull Secrets for pods; each read is cached ``ttl`` seconds per namespace/name
    (at most 10,000 entries).

    Args:
        api: the Kubernetes client (``request("GET", path)``).
        ttl: seconds a Secret read (or its absence) stays cached.
    """

    def __init__(self, api: KubeRequester, *, ttl: float = 5.0) -> None:
        self.api = api
        self.ttl = ttl
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    async def _secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        now = time.monotonic()
        cached = self._secrets.get((namespace, name))
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        try:
            secret: dict[str, Any] | None = await self.api.request(
                "GET", f"/api/v1/namespaces/{namespace}/secrets/{name}"
            )
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            log.info("pull secret %s/%s unavailable: %s", namespace, name, exc.reason)
            secret = None
        self._secrets[(namespace, name)] = (now, secret)
        if len(self._secrets) > 10_000:
            self._secrets.clear()
        return secret

    async def credentials(
        self,
        pod: Mapping[str, Any],
        config: PlacementConfig,
        *,
        on_invalid: Callable[[str, str, Exception], None] | None = None,
    ) -> list[Any]:
        """Credentials for ``pod``: its ``imagePullSecrets`` read from its own namespace
        (the ServiceAccount admission plugin already merged the service account's), then
        the global pull secret of the config, in that order. Missing secrets are skipped
        (anonymous). A secret whose payload cannot be decoded
        (``imageinspect.CredentialError``) is skipped too, the others still count:
        ``on_invalid(namespace, name, error)`` is called for it (the reconciler turns that
        into a Warning event).

        Raises:
            ApiError: reading a secret failed other than 403/404.
        """
        from imageinspect import CredentialError, credentials_from_pull_secrets

        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        names = [
            str(ref.get("name"))
            for ref in (pod.get("spec") or {}).get("imagePullSecrets") or []
            if isinstance(ref, Mapping) and ref.get("name")
        ]
        refs = [(ns, name) for name in dict.fromkeys(names)]
        ref = config.image_inspection.global_pull_secret
        if ref is not None and (ref.namespace, ref.name) not in refs:
            refs.append((ref.namespace, ref.name))
        out: list[Any] = []
        for secret_ns, name in refs:
            s = await self._secret(secret_ns, name)
            if s is None:
                continue
            try:
                out.extend(credentials_from_pull_secrets([s]))
            except (CredentialError, ValueError, TypeError, AttributeError) as exc:
                # A malformed secret must neither keep the pod gated nor hide the others.
                log.warning("pod %s/%s: pull secret %s/%s skipped: %s", ns, meta.get("name"),
                            secret_ns, name, exc)
                if on_invalid is not None:
                    on_invalid(secret_ns, name, exc)
        return out

