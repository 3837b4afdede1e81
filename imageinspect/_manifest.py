"""Manifests to platforms: pure functions over the JSON documents a registry returns.

Sources: OCI image-spec (image index, image manifest, config ``os``/``architecture``/``variant``),
Docker image manifest v2 schema 2 and manifest list, Docker schema 1 (``architecture`` at the top
level), and BuildKit's attestation convention (index entries annotated with
``vnd.docker.reference.type`` and platform ``unknown/unknown`` are not runnable platforms).
No I/O here: callers pass bytes and the response ``Content-Type``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from podplacement.imageinspect._errors import DigestMismatch, InvalidManifest, TooLarge

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_SCHEMA1 = "application/vnd.docker.distribution.manifest.v1+json"
DOCKER_SCHEMA1_SIGNED = "application/vnd.docker.distribution.manifest.v1+prettyjws"

INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
SCHEMA1_TYPES = frozenset({DOCKER_SCHEMA1, DOCKER_SCHEMA1_SIGNED})
KNOWN_TYPES = INDEX_TYPES | MANIFEST_TYPES | SCHEMA1_TYPES

#: The Accept header for manifest requests: the four current types, schema 1 last (q=0.5).
MANIFEST_ACCEPT = ", ".join(
    [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST]
    + [f"{t};q=0.5" for t in (DOCKER_SCHEMA1_SIGNED, DOCKER_SCHEMA1)]
)

#: Largest manifest body read into memory, in bytes: 1 MiB (was 4 MiB, the most CNCF
#: distribution accepts in a PUT). Enough for every real manifest: an image manifest of
#: 127 layers (the most a Docker build makes) is about 30 kB, an index of
#: :data:`MAX_INDEX_ENTRIES` entries about 300 kB; and a 4 MiB body, read by up to 16
#: requests per registry at once, held 64 MiB (twice that while its chunks were joined)
#: before a byte was checked. The transport refuses a larger ``Content-Length`` before
#: reading, and stops reading a body without one at the limit.
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_CONFIG_BYTES = 8 * 1024 * 1024

# --- bounds on what one image index may make us hold (docs/security.md, "Bounded by design") --
#: Most entries of an image index (or Docker manifest list) we read. A real multi-platform
#: image lists well under 100 (the official images: at most ~10 platforms, each with one
#: BuildKit attestation entry); 512 leaves room for a build matrix 25 times wider while one
#: index's platforms stay a few tens of kB in every cache and in a pod's decision. An index
#: over the limit is an inspection error (:class:`~imageinspect._errors.TooLarge`): the image
#: is uninspectable and the pod takes the fallback.
MAX_INDEX_ENTRIES = 512
#: Largest index body parsed, in bytes: the manifest limit, 2 kB per entry at
#: :data:`MAX_INDEX_ENTRIES` (a real entry, descriptor + platform + a few annotations, is
#: 200-500 bytes). Checked again before the JSON is decoded when the response's Content-Type
#: says it is an index (:func:`check_index_size`, :func:`index_children`), for callers that
#: read with a larger limit.
MAX_INDEX_BYTES = MAX_MANIFEST_BYTES
#: Longest ``os``, ``architecture`` or ``variant`` we read: 63 characters, the limit of a
#: Kubernetes label value, which the os and architecture become in the node affinity (Go's
#: GOOS/GOARCH names are under 12).
MAX_PLATFORM_FIELD = 63
#: Longest ``os.version`` (Windows: ``10.0.20348.2340``) and each ``os.features`` entry.
MAX_OS_VERSION = 128
#: A Windows ``os.version`` we use: digits and dots, 1 to 4 parts of at most 10 digits each
#: (``10.0.20348.2340``: major.minor.build.revision, the form Windows images carry; OCI
#: image-spec ``image-index.md`` ``platform.os.version``). Anything else is not read.
OS_VERSION_RE = re.compile(r"[0-9]{1,10}(?:\.[0-9]{1,10}){0,3}")
#: Most ``os.features`` entries of one platform (the image-spec names one: ``win32k``).
MAX_OS_FEATURES = 16
#: Longest media type: RFC 6838 section 4.2 allows 127 characters each for type and subtype.
MAX_MEDIA_TYPE = 255
#: Longest digest: ``sha512:`` and 128 hex digits is 135 (image-spec ``descriptor.md``).
MAX_DIGEST = 160

#: Annotation BuildKit puts on index entries that are attestations, not images.
ATTESTATION_ANNOTATION = "vnd.docker.reference.type"
_GENERIC_CONTENT_TYPES = frozenset(
    {"", "application/json", "text/plain", "application/octet-stream"}
)


@dataclass(frozen=True, slots=True)
class Platform:
    """One platform an image can run on (OCI image-spec ``platform`` object).

    ``str()`` gives ``os/architecture[/variant]``, e.g. ``linux/arm64/v8`` (without the
    OS version: the form every cache, catalog and CLI used before it was read);
    :meth:`text` adds ``@os_version`` when there is one.

    ``os_version`` is the entry's ``os.version`` for a ``windows`` platform (e.g.
    ``10.0.17763.5458``; :data:`OS_VERSION_RE`), None otherwise: a process-isolated Windows
    container runs only on a host of the same build (kubernetes.io, "Windows containers in
    Kubernetes", version compatibility), so two windows/amd64 entries of different builds
    are different platforms.
    """

    os: str
    architecture: str
    variant: str | None = None
    os_version: str | None = None

    def __str__(self) -> str:
        base = f"{self.os}/{self.architecture}"
        return f"{base}/{self.variant}" if self.variant else base

    def text(self) -> str:
        """``os/architecture[/variant][@os_version]``, e.g. ``windows/amd64@10.0.17763.5458``
        (the decision annotation's per-image form; :meth:`parse` reads it back)."""
        return f"{self}@{self.os_version}" if self.os_version else str(self)

    @classmethod
    def parse(cls, text: str) -> Platform:
        """Parse ``os/architecture[/variant][@os_version]``; raises ValueError on another
        shape (an ``os_version`` must match :data:`OS_VERSION_RE`)."""
        base, at, version = text.partition("@")
        parts = base.split("/")
        if len(parts) not in (2, 3) or not all(parts) or (
                at and not OS_VERSION_RE.fullmatch(version)):
            raise ValueError(f"platform {text!r} is not os/architecture[/variant][@os.version]")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None,
                   version or None)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What :meth:`imageinspect.Inspector.inspect` answers.

    Attributes:
        reference: the normalised reference (``docker.io/library/nginx:latest``).
        digest: digest of the top-level manifest (``sha256:...``).
        media_type: media type of that manifest (index, list, manifest or schema 1).
        platforms: distinct platforms, in the registry's order.
        fetched_at: when a registry answered for this result, in wall-clock unix seconds
            (``time.time()``, taken just before the manifest was requested, or the digest
            revalidated with ``pull_always``); a result served from the inspector's cache
            keeps the time of the answer it copies, so its age is the age of the fact.
            None when the value was not built by the inspector. Not part of equality.
    """

    reference: str
    digest: str
    media_type: str
    platforms: tuple[Platform, ...]
    fetched_at: float | None = field(default=None, compare=False)


#: Estimated bytes of memory one cached :class:`ImageInfo` holds besides its strings and
#: platforms (the object, its tuple, the cache's entry and key), and each :class:`Platform`
#: besides its strings (the object and three str headers); measured with
#: ``tracemalloc`` on CPython 3.11, rounded up.
_INFO_OVERHEAD = 600
_PLATFORM_OVERHEAD = 250


def estimated_bytes(value: object) -> int:
    """About how many bytes of memory ``value`` holds in a cache: for an :class:`ImageInfo`
    its strings and platforms (overheads measured on CPython), for anything else (an
    exception, a small object) :data:`_INFO_OVERHEAD`. For the byte bounds of the caches
    (:class:`imageinspect._cache.AsyncCache`, the webhook's place cache); an estimate, not
    an exact figure."""
    if not isinstance(value, ImageInfo):
        return _INFO_OVERHEAD
    return (_INFO_OVERHEAD + len(value.reference) + len(value.digest) + len(value.media_type)
            + sum(_PLATFORM_OVERHEAD + len(p.os) + len(p.architecture) + len(p.variant or "")
                  + len(p.os_version or "") for p in value.platforms))


@dataclass(frozen=True, slots=True)
class ParsedManifest:
    """A decoded top-level manifest.

    Attributes:
        media_type: the resolved media type (one of :data:`KNOWN_TYPES`).
        platforms: for an index or schema 1, the platforms; empty for a single manifest.
        config_digest: for a single manifest, the config blob's digest (else ``None``).
        config_size: the config's declared size in bytes, or ``None``.
    """

    media_type: str
    platforms: tuple[Platform, ...] = ()
    config_digest: str | None = None
    config_size: int | None = None

    @property
    def is_index(self) -> bool:
        """True for an OCI index or Docker manifest list."""
        return self.media_type in INDEX_TYPES

    @property
    def needs_config(self) -> bool:
        """True when the platform lives in the config blob (a single v2/OCI manifest)."""
        return self.media_type in MANIFEST_TYPES


#: A digest the inspector fetches by (OCI image-spec descriptor.md, the registered algorithms).
DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}")


def compute_digest(data: bytes, algorithm: str = "sha256") -> str:
    """Return ``algorithm:hex`` of ``data`` (sha256 or sha512); ValueError for others."""
    if algorithm not in ("sha256", "sha512"):
        raise ValueError(f"unsupported digest algorithm {algorithm!r}")
    return f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"


def verify_digest(data: bytes, expected: str, what: str = "manifest") -> None:
    """Raise :class:`DigestMismatch` unless ``data`` hashes to ``expected`` (``alg:hex``)."""
    algorithm = expected.split(":", 1)[0]
    try:
        actual = compute_digest(data, algorithm)
    except ValueError as exc:
        raise DigestMismatch(f"cannot verify the {what} digest: not sha256 or sha512") from exc
    if actual != expected:
        # ``expected`` may come from the registry (a config digest): not quoted.
        raise DigestMismatch(f"{what} content hashes to {actual}, not the digest expected")


def _load_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidManifest(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidManifest(f"{what} is not a JSON object")
    return doc


def _clean_content_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def resolve_media_type(doc: Mapping[str, Any], content_type: str | None) -> str:
    """Decide a manifest's media type from the response ``Content-Type`` and the body.

    A known manifest Content-Type wins, but must agree with a ``mediaType`` in the body. A
    generic or missing Content-Type (``application/json``, ``text/plain``) falls back to the
    body's ``mediaType`` or, for ``schemaVersion`` 1, schema 1. Anything else is refused.

    Raises:
        InvalidManifest: unknown or contradictory media types.
    """
    header = _clean_content_type(content_type)
    body_type = doc.get("mediaType")
    if body_type is not None and not isinstance(body_type, str):
        raise InvalidManifest("manifest mediaType is not a string")
    if header in KNOWN_TYPES:
        if body_type and body_type != header and header not in SCHEMA1_TYPES:
            raise InvalidManifest(f"manifest Content-Type {header} contradicts its mediaType")
        return header
    if header not in _GENERIC_CONTENT_TYPES:
        raise InvalidManifest("the registry's Content-Type is not an image manifest's")
    if body_type in KNOWN_TYPES:
        return str(body_type)
    if doc.get("schemaVersion") == 1:
        return DOCKER_SCHEMA1_SIGNED if "signatures" in doc else DOCKER_SCHEMA1
    if doc.get("schemaVersion") == 2 and "manifests" in doc and "mediaType" not in doc:
        return OCI_INDEX
    if doc.get("schemaVersion") == 2 and "config" in doc and "mediaType" not in doc:
        return OCI_MANIFEST
    raise InvalidManifest("cannot tell the manifest type from its Content-Type and mediaType")


def _platform_of(obj: Mapping[str, Any], what: str) -> Platform | None:
    os_ = obj.get("os")
    arch = obj.get("architecture")
    variant = obj.get("variant")
    if not isinstance(os_, str) or not isinstance(arch, str):
        raise InvalidManifest(f"{what} lacks string os/architecture fields")
    if variant is not None and not isinstance(variant, str):
        raise InvalidManifest(f"{what} has a non-string variant")
    for name, value in (("os", os_), ("architecture", arch), ("variant", variant or "")):
        _bounded(value, MAX_PLATFORM_FIELD, f"{what} {name}")
    version = obj.get("os.version")
    if version is not None and (not isinstance(version, str) or len(version) > MAX_OS_VERSION):
        raise InvalidManifest(f"{what} has an os.version that is not a string of at most "
                              f"{MAX_OS_VERSION} characters")
    features = obj.get("os.features")
    if features is not None and (
            not isinstance(features, list) or len(features) > MAX_OS_FEATURES
            or not all(isinstance(f, str) and len(f) <= MAX_OS_VERSION for f in features)):
        raise InvalidManifest(f"{what} has os.features that are not a list of at most "
                              f"{MAX_OS_FEATURES} strings of at most {MAX_OS_VERSION} "
                              "characters")
    if not os_ or not arch or os_ == "unknown" or arch == "unknown":
        return None
    os_ = os_.lower()
    return Platform(os_, arch.lower(), variant or None, windows_version(os_, version))


def windows_version(os_: str, version: object) -> str | None:
    """The ``os.version`` kept for a platform: for ``windows`` a string matching
    :data:`OS_VERSION_RE` (digits and dots, at most 4 parts), else None. A malformed value
    is not read (the image keeps the rule of an image without ``os.version``: any build),
    and a non-Windows ``os.version`` is not used for placement."""
    if os_ != "windows" or not isinstance(version, str) or not OS_VERSION_RE.fullmatch(version):
        return None
    return version


def _bounded(value: str, limit: int, what: str) -> None:
    """Raise :class:`InvalidManifest` when ``value`` is longer than ``limit`` characters."""
    if len(value) > limit:
        raise InvalidManifest(f"{what} is {len(value)} characters long, more than the "
                              f"{limit} we read")


def index_entries(doc: Mapping[str, Any]) -> list[Any]:
    """The ``manifests`` list of an image index, within :data:`MAX_INDEX_ENTRIES`.

    Raises:
        InvalidManifest: ``manifests`` missing or not a list.
        TooLarge: more than :data:`MAX_INDEX_ENTRIES` entries (message: "image index lists
            N entries, more than the 512 we read").
    """
    entries = doc.get("manifests")
    if not isinstance(entries, list):
        raise InvalidManifest("image index has no 'manifests' list")
    if len(entries) > MAX_INDEX_ENTRIES:
        raise TooLarge(f"image index lists {len(entries)} entries, more than the "
                       f"{MAX_INDEX_ENTRIES} we read")
    return entries


def check_index_size(data: bytes, content_type: str | None) -> None:
    """Refuse, before decoding it, a body whose Content-Type says it is an image index and
    that is larger than :data:`MAX_INDEX_BYTES`.

    Raises:
        TooLarge: the index is over the limit.
    """
    if _clean_content_type(content_type) in INDEX_TYPES and len(data) > MAX_INDEX_BYTES:
        raise TooLarge(f"image index is {len(data)} bytes, more than the "
                       f"{MAX_INDEX_BYTES // 1024} KiB we read")


def _dedupe(platforms: list[Platform]) -> tuple[Platform, ...]:
    return tuple(dict.fromkeys(platforms))


def platforms_from_index(doc: Mapping[str, Any]) -> tuple[Platform, ...]:
    """Platforms listed by an OCI image index or Docker manifest list, without fetching children.

    Skips entries annotated ``vnd.docker.reference.type`` (BuildKit attestations), entries with
    an ``unknown`` os or architecture and entries with no ``platform``. Keeps ``os`` (a
    windows/amd64 entry stays windows). Duplicates are dropped, order kept.

    Raises:
        InvalidManifest: ``manifests`` missing or not a list of objects, bad platform fields
            or a field over its bound (:data:`MAX_PLATFORM_FIELD` ...).
        TooLarge: more than :data:`MAX_INDEX_ENTRIES` entries.
    """
    entries = index_entries(doc)
    found: list[Platform] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidManifest(f"image index entry {i} is not an object")
        annotations = entry.get("annotations") or {}
        if isinstance(annotations, dict) and ATTESTATION_ANNOTATION in annotations:
            continue
        platform = entry.get("platform")
        if platform is None:
            continue
        if not isinstance(platform, dict):
            raise InvalidManifest(f"image index entry {i} has a non-object platform")
        p = _platform_of(platform, f"image index entry {i} platform")
        if p is not None:
            found.append(p)
    return _dedupe(found)


def platform_from_config(doc: Mapping[str, Any]) -> tuple[Platform, ...]:
    """The platform of a single image from its config blob (``os``, ``architecture``,
    ``variant`` per the OCI image-spec config); empty when it is ``unknown``.

    Raises:
        InvalidManifest: the fields are missing or not strings.
    """
    p = _platform_of(doc, "image config")
    return (p,) if p is not None else ()


def platform_from_schema1(doc: Mapping[str, Any]) -> tuple[Platform, ...]:
    """The platform of a Docker schema 1 manifest: ``architecture`` at the top level; the OS
    from the first ``history[].v1Compatibility`` JSON when present, else ``linux``.

    Raises:
        InvalidManifest: ``architecture`` missing.
    """
    arch = doc.get("architecture")
    if not isinstance(arch, str) or not arch:
        raise InvalidManifest("schema 1 manifest has no architecture")
    os_ = "linux"
    history = doc.get("history")
    if isinstance(history, list) and history and isinstance(history[0], dict):
        compat = history[0].get("v1Compatibility")
        if isinstance(compat, str):
            try:
                v1 = json.loads(compat)
            except json.JSONDecodeError:
                v1 = None
            if isinstance(v1, dict) and isinstance(v1.get("os"), str) and v1["os"]:
                os_ = v1["os"]
    p = _platform_of({"os": os_, "architecture": arch}, "schema 1 manifest")
    return (p,) if p is not None else ()


def parse_manifest(data: bytes, content_type: str | None) -> ParsedManifest:
    """Decode a top-level manifest response body.

    Args:
        data: the body bytes (already size-limited by the caller).
        content_type: the response ``Content-Type`` header.

    Returns:
        :class:`ParsedManifest`: platforms for an index/list/schema 1, or the config descriptor
        for a single manifest.

    Raises:
        InvalidManifest: malformed JSON, unknown type, missing fields, a field over its bound.
        TooLarge: an index over :data:`MAX_INDEX_BYTES` or :data:`MAX_INDEX_ENTRIES`.
    """
    check_index_size(data, content_type)
    doc = _load_json(data, "manifest")
    media_type = resolve_media_type(doc, content_type)
    if media_type in INDEX_TYPES:
        return ParsedManifest(media_type, platforms_from_index(doc))
    if media_type in SCHEMA1_TYPES:
        return ParsedManifest(media_type, platform_from_schema1(doc))
    config = doc.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
        raise InvalidManifest("image manifest has no config descriptor with a digest")
    if not DIGEST_RE.fullmatch(config["digest"]):
        # It becomes a URL path segment (/v2/<name>/blobs/<digest>).
        raise InvalidManifest("image manifest's config digest is not sha256:<64 hex> or "
                              "sha512:<128 hex>")
    size = config.get("size")
    return ParsedManifest(
        media_type,
        config_digest=config["digest"],
        config_size=size if isinstance(size, int) and not isinstance(size, bool) else None,
    )


def parse_config(data: bytes) -> tuple[Platform, ...]:
    """Decode an image config blob and return its platform (see :func:`platform_from_config`).

    Raises:
        InvalidManifest: malformed JSON or missing fields.
    """
    return platform_from_config(_load_json(data, "image config"))


@dataclass(frozen=True, slots=True)
class Descriptor:
    """An OCI content descriptor (image-spec ``descriptor.md``): ``media_type``, ``digest``,
    ``size`` in bytes (None when absent)."""

    media_type: str
    digest: str
    size: int | None = None


def _descriptor(obj: Any, what: str) -> Descriptor:
    if not isinstance(obj, dict) or not isinstance(obj.get("digest"), str):
        raise InvalidManifest(f"{what} is not a descriptor with a digest")
    media_type = obj.get("mediaType")
    if media_type is not None and not isinstance(media_type, str):
        raise InvalidManifest(f"{what} has a non-string mediaType")
    _bounded(obj["digest"], MAX_DIGEST, f"{what} digest")
    _bounded(media_type or "", MAX_MEDIA_TYPE, f"{what} mediaType")
    size = obj.get("size")
    return Descriptor(str(obj.get("mediaType") or ""), obj["digest"],
                      size if isinstance(size, int) and not isinstance(size, bool) else None)


def index_children(data: bytes) -> tuple[tuple[Platform, Descriptor], ...]:
    """The runnable entries of an image index / manifest list: (platform, descriptor), in
    the index's order, with the same skipping rules as :func:`platforms_from_index`
    (attestations, ``unknown`` platforms and entries without a platform are left out).

    Raises:
        InvalidManifest: not an index, or malformed entries.
        TooLarge: more than :data:`MAX_INDEX_BYTES` or :data:`MAX_INDEX_ENTRIES`.
    """
    if len(data) > MAX_INDEX_BYTES:
        raise TooLarge(f"image index is {len(data)} bytes, more than the "
                       f"{MAX_INDEX_BYTES // 1024} KiB we read")
    doc = _load_json(data, "image index")
    entries = index_entries(doc)
    out: list[tuple[Platform, Descriptor]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidManifest(f"image index entry {i} is not an object")
        annotations = entry.get("annotations") or {}
        if isinstance(annotations, dict) and ATTESTATION_ANNOTATION in annotations:
            continue
        platform = entry.get("platform")
        if not isinstance(platform, dict):
            continue
        p = _platform_of(platform, f"image index entry {i} platform")
        if p is not None:
            out.append((p, _descriptor(entry, f"image index entry {i}")))
    return tuple(out)


def image_parts(data: bytes) -> tuple[Descriptor, tuple[Descriptor, ...]]:
    """The config descriptor and the layer descriptors (oldest first, as listed) of a
    single OCI image manifest or Docker v2 schema 2 manifest.

    Raises:
        InvalidManifest: malformed JSON or descriptors.
    """
    doc = _load_json(data, "image manifest")
    config = _descriptor(doc.get("config"), "image manifest config")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise InvalidManifest("image manifest has no 'layers' list")
    return config, tuple(_descriptor(x, f"image manifest layer {i}")
                         for i, x in enumerate(layers))


def config_process(data: bytes) -> tuple[tuple[Platform, ...], dict[str, Any]]:
    """An image config blob's platform and its ``config`` object (``Entrypoint``, ``Cmd``,
    ``Env``, ``WorkingDir``; OCI image-spec ``config.md``), empty when absent.

    Raises:
        InvalidManifest: malformed JSON or platform fields.
    """
    doc = _load_json(data, "image config")
    process = doc.get("config")
    return platform_from_config(doc), dict(process) if isinstance(process, dict) else {}
