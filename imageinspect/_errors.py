"""The one exception hierarchy of :mod:`imageinspect`, rooted at :class:`RegistryError`.

Every error carries the facts a user needs to act on it: the registry host that answered (or
failed to), the image reference being inspected and the HTTP status when there was one. The
message never contains credentials or tokens, nor any text of the remote side (an error
body, a token server's answer, a realm or redirect URL, a status line): only our own words,
the HTTP status and the registry host as the image reference (or registries.conf) names it,
since these messages reach pod annotations and Events that the pod's creator reads.
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base class of every failure raised by :mod:`imageinspect`.

    Attributes:
        message: the human explanation, without registry/reference/status (they are appended
            by ``str()``).
        registry: the registry host (``host[:port]``) involved, or ``None``.
        reference: the normalised image reference, or ``None``.
        status: the HTTP status code that caused the error, or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        registry: str | None = None,
        reference: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.registry = registry
        self.reference = reference
        self.status = status

    def __str__(self) -> str:
        facts = []
        if self.reference:
            facts.append(f"image {self.reference}")
        if self.registry:
            facts.append(f"registry {self.registry}")
        if self.status is not None:
            facts.append(f"HTTP {self.status}")
        return f"{self.message} ({', '.join(facts)})" if facts else self.message

    def with_context(
        self, *, registry: str | None = None, reference: str | None = None
    ) -> RegistryError:
        """Fill in ``registry``/``reference`` when they are still unknown; returns ``self``."""
        if self.registry is None and registry is not None:
            self.registry = registry
        if self.reference is None and reference is not None:
            self.reference = reference
        return self


class InvalidReference(RegistryError):
    """The image reference does not follow the distribution reference grammar.

    Attributes:
        part: which part is wrong: ``"domain"``, ``"port"``, ``"path"``, ``"tag"``,
            ``"digest"`` or ``"reference"`` (the whole string, e.g. empty or too long).
    """

    def __init__(self, message: str, *, part: str, reference: str | None = None) -> None:
        super().__init__(message, reference=reference)
        self.part = part


class CredentialError(RegistryError, ValueError):
    """A pull secret or docker config cannot be decoded (names the entry, never the secret)."""


class RegistriesConfigError(RegistryError, ValueError):
    """A registries.conf document is not valid TOML or has fields of the wrong shape."""


class NotFound(RegistryError):
    """The registry answered 404: the repository, tag or digest does not exist there."""


class Unauthorized(RegistryError):
    """The registry (or its token server) answered 401: no or wrong credentials."""


class Denied(RegistryError):
    """The registry answered 403: the credentials are valid but may not pull this repository."""


class RateLimited(RegistryError):
    """The registry kept answering 429 after the allowed retries.

    Attributes:
        retry_after: the last ``Retry-After`` value in seconds, if the registry sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        registry: str | None = None,
        reference: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message, registry=registry, reference=reference, status=status)
        self.retry_after = retry_after


class ServerError(RegistryError):
    """The registry kept answering 5xx (or another unexpected status) after the retries."""


class Timeout(RegistryError):
    """Connecting to or reading from the registry took longer than the configured timeout."""


class ConnectionFailed(RegistryError):
    """The registry could not be reached (DNS, refused connection, TLS handshake failure)."""


class InvalidManifest(RegistryError):
    """The manifest or config is not valid JSON or not a manifest type we understand."""


class DigestMismatch(InvalidManifest):
    """The bytes received do not hash to the digest the reference (or registry) promised."""


class TooLarge(RegistryError):
    """A manifest (limit 1 MiB), image index (1 MiB, 512 entries) or image config (limit
    8 MiB) exceeds its size limit (:mod:`imageinspect._manifest`)."""


class Blocked(RegistryError):
    """The registry is marked ``blocked`` in registries.conf."""


class UnsafeAddress(Blocked):
    """The registry host, a token realm or a redirect target is (or resolves to) an address in
    a refused network: link-local, the clouds' metadata addresses, or what the configuration
    adds (SSRF guard)."""


class RefusedTarget(Blocked):
    """A token realm or redirect the registry sent points where it may not send us: not an
    http(s) URL, userinfo in it, a query string in a realm, plain HTTP while neither the
    registry nor the target host is marked insecure, or a host registries.conf blocks."""
