"""The real OCI registry for tests: :mod:`podplacement.sandbox.registry` (moved there so the
demo does not import ``tests``) re-exported, with :func:`start_registry` wrapped to supply the
bearer-token issuer of :mod:`tests.harness.tokenserver` for the ``token`` variant (the issuer
needs PyJWT, a test-only dependency, so it stays here)."""

from __future__ import annotations

import functools
from pathlib import Path

from podplacement.sandbox import registry as _sandbox
from podplacement.sandbox.registry import (
    AUTH_MODES,
    DEFAULT_PASSWORD,
    DEFAULT_USERNAME,
    READY_TIMEOUT_S,
    REGISTRY_BINARY,
    Registry,
    RegistryStartError,
    TokenIssuer,
    TokenIssuerFactory,
    free_port,
    ssl_context,
)
from tests.harness.tokenserver import start_token_server

__all__ = [
    "AUTH_MODES",
    "DEFAULT_PASSWORD",
    "DEFAULT_USERNAME",
    "READY_TIMEOUT_S",
    "REGISTRY_BINARY",
    "Registry",
    "RegistryStartError",
    "TokenIssuer",
    "TokenIssuerFactory",
    "free_port",
    "ssl_context",
    "start_registry",
]


def start_registry(
    tmp: Path,
    *,
    tls: bool = False,
    auth: str = "none",
    username: str = DEFAULT_USERNAME,
    password: str = DEFAULT_PASSWORD,
    token_expires_in: int = 300,
    token_field: str = "both",
    token_anonymous_pull: bool = False,
    token_server_tls: bool | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
) -> Registry:
    """:func:`podplacement.sandbox.registry.start_registry` with, for ``auth="token"``, a
    :class:`tests.harness.tokenserver.TokenServer` as issuer (``Registry.token_server``).

    Args:
        token_expires_in, token_field, token_anonymous_pull: passed to
            :func:`tests.harness.tokenserver.start_token_server` (``expires_in``,
            ``token_field``, ``anonymous_pull``).
        the others: as :func:`podplacement.sandbox.registry.start_registry`.

    Raises:
        ValueError: unknown ``auth`` or ``token_field``.
        RegistryStartError: the process died or never became ready.
    """
    issuer: TokenIssuerFactory | None = None
    if auth == "token":
        issuer = functools.partial(
            start_token_server,
            expires_in=token_expires_in,
            token_field=token_field,
            anonymous_pull=token_anonymous_pull,
        )
    return _sandbox.start_registry(
        tmp,
        tls=tls,
        auth=auth,
        username=username,
        password=password,
        token_issuer=issuer,
        token_server_tls=token_server_tls,
        ready_timeout=ready_timeout,
    )
