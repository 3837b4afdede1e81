"""Image references: the distribution reference grammar and the kubelet's normalisation.

Grammar (distribution/reference ``reference.go``)::

    reference   := name [ ":" tag ] [ "@" digest ]
    name        := [ domain "/" ] path-component ( "/" path-component )*
    domain      := host [ ":" port ]       host: DNS name, IPv4 or "[" IPv6 "]"
    path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
    tag         := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest      := algorithm ":" hex     algorithm: [a-z0-9]+ ( [+._-] [a-z0-9]+ )*

Normalisation follows ``ParseNormalizedNamed`` as used by the kubelet and CRI runtimes: a first
component without ``.`` or ``:`` that is not ``localhost`` is a Docker Hub path, so ``nginx``
becomes ``docker.io/library/nginx:latest``; ``index.docker.io`` is spelled ``docker.io``; a
reference with neither tag nor digest gets ``latest``. With both a tag and a digest, the digest
decides what is fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from podplacement.imageinspect._errors import InvalidReference

DOCKER_HUB_DOMAIN = "docker.io"
#: Docker Hub's API endpoint for the ``docker.io`` domain.
DOCKER_HUB_API_HOST = "registry-1.docker.io"
DEFAULT_TAG = "latest"
NAME_MAX_LENGTH = 255

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[(?:[a-fA-F0-9:]+)\]"
_HOST_RE = re.compile(rf"(?:{_DOMAIN_NAME}|{_IPV6})")
_PORT_RE = re.compile(r"[0-9]+")
_PATH_COMPONENT_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*")
_TAG_RE = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST_RE = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+")
_HEX64_RE = re.compile(r"[a-f0-9]{64}")
_DIGEST_HEX = {"sha256": re.compile(r"[a-f0-9]{64}"), "sha512": re.compile(r"[a-f0-9]{128}")}


@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed, normalised image reference.

    Attributes:
        domain: registry domain as written in references (``docker.io``, ``127.0.0.1:5000``).
        path: repository path (``library/nginx``).
        tag: the tag, or ``None`` when only a digest was given.
        digest: ``algorithm:hex``, or ``None``.
    """

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """``domain/path``, the repository name credentials are matched against."""
        return f"{self.domain}/{self.path}"

    @property
    def api_host(self) -> str:
        """The ``host[:port]`` that serves the registry API for :attr:`domain`."""
        return DOCKER_HUB_API_HOST if self.domain == DOCKER_HUB_DOMAIN else self.domain

    @property
    def manifest_ref(self) -> str:
        """What follows ``/manifests/``: the digest when pinned (it decides), else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def pinned(self) -> bool:
        """True when the reference names a digest (the content is immutable)."""
        return self.digest is not None

    def with_domain(self, domain: str, path: str | None = None) -> Reference:
        """Return the same tag/digest in another repository (registries.conf rewrites)."""
        return Reference(domain, path if path is not None else self.path, self.tag, self.digest)

    def __str__(self) -> str:
        out = self.name
        if self.tag is not None:
            out += f":{self.tag}"
        if self.digest is not None:
            out += f"@{self.digest}"
        return out


def _split_domain(name: str) -> tuple[str, str]:
    """Split ``name`` into (domain, remainder) with Docker's rules, normalising Docker Hub."""
    i = name.find("/")
    first = name[:i] if i >= 0 else ""
    if i < 0 or (
        not any(c in first for c in ".:") and first != "localhost" and first.lower() == first
    ):
        domain, rest = DOCKER_HUB_DOMAIN, name
    else:
        domain, rest = first, name[i + 1 :]
    if domain == "index.docker.io":
        domain = DOCKER_HUB_DOMAIN
    if domain == DOCKER_HUB_DOMAIN and "/" not in rest:
        rest = f"library/{rest}"
    return domain, rest


def _check_domain(domain: str, original: str) -> None:
    host, port = domain, None
    if domain.startswith("["):
        end = domain.find("]")
        if end < 0:
            raise InvalidReference(
                f"invalid domain {domain!r}: unterminated IPv6 address",
                part="domain",
                reference=original,
            )
        host, rest = domain[: end + 1], domain[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise InvalidReference(
                    f"invalid domain {domain!r}", part="domain", reference=original
                )
            port = rest[1:]
    elif ":" in domain:
        host, port = domain.split(":", 1)
    if not _HOST_RE.fullmatch(host):
        raise InvalidReference(
            f"invalid registry host {host!r} in {original!r}", part="domain", reference=original
        )
    if port is not None and not _PORT_RE.fullmatch(port):
        raise InvalidReference(
            f"invalid registry port {port!r} in {original!r}", part="port", reference=original
        )


def _check_digest(digest: str, original: str) -> None:
    if not _DIGEST_RE.fullmatch(digest):
        raise InvalidReference(
            f"invalid digest {digest!r} in {original!r}", part="digest", reference=original
        )
    algorithm, hexpart = digest.split(":", 1)
    pattern = _DIGEST_HEX.get(algorithm)
    if pattern is None:
        raise InvalidReference(
            f"unsupported digest algorithm {algorithm!r} in {original!r} (sha256, sha512)",
            part="digest",
            reference=original,
        )
    if not pattern.fullmatch(hexpart):
        raise InvalidReference(
            f"invalid {algorithm} digest {digest!r} in {original!r}",
            part="digest",
            reference=original,
        )


def parse_reference(image: str) -> Reference:
    """Parse and normalise an image reference as the kubelet does.

    Args:
        image: e.g. ``nginx``, ``ghcr.io/org/app:v1``, ``127.0.0.1:5000/a/b@sha256:<64 hex>``.

    Returns:
        A :class:`Reference`; the tag defaults to ``latest`` only when there is no digest.

    Raises:
        InvalidReference: with ``part`` naming what is wrong (domain, port, path, tag, digest,
            reference) and the original string in the message.
    """
    original = image
    if not image:
        raise InvalidReference("empty image reference", part="reference", reference=original)
    if image != image.strip() or any(c.isspace() for c in image):
        raise InvalidReference(
            f"image reference {original!r} contains whitespace",
            part="reference",
            reference=original,
        )
    if _HEX64_RE.fullmatch(image):
        raise InvalidReference(
            f"invalid repository name {original!r}: a 64-character hex string is an image ID, "
            "not a reference",
            part="path",
            reference=original,
        )
    digest: str | None = None
    if "@" in image:
        image, digest = image.split("@", 1)
        _check_digest(digest, original)
    tag: str | None = None
    last = image.rfind("/")
    colon = image.rfind(":")
    if colon > last:
        image, tag = image[:colon], image[colon + 1 :]
        if not _TAG_RE.fullmatch(tag):
            raise InvalidReference(
                f"invalid tag {tag!r} in {original!r} (allowed: letters, digits, '_', '.', '-'; "
                "at most 128 characters, not starting with '.' or '-')",
                part="tag",
                reference=original,
            )
    if not image:
        raise InvalidReference(
            f"missing repository name in {original!r}", part="path", reference=original
        )
    domain, path = _split_domain(image)
    if domain != DOCKER_HUB_DOMAIN or "/" in image:
        _check_domain(domain, original)
    if not path:
        raise InvalidReference(
            f"missing repository path in {original!r}", part="path", reference=original
        )
    for component in path.split("/"):
        if not _PATH_COMPONENT_RE.fullmatch(component):
            hint = " (must be lowercase)" if component.lower() != component else ""
            raise InvalidReference(
                f"invalid repository path component {component!r} in {original!r}{hint}",
                part="path",
                reference=original,
            )
    if len(domain) + 1 + len(path) > NAME_MAX_LENGTH:
        raise InvalidReference(
            f"repository name in {original!r} is longer than {NAME_MAX_LENGTH} characters",
            part="reference",
            reference=original,
        )
    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return Reference(domain, path, tag, digest)
