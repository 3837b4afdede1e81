"""Pushing real images to a registry over the OCI distribution API (sync ``httpx``), for the
demo and the tests: blobs (distribution-spec "monolithic upload": ``POST
/v2/<name>/blobs/uploads/`` then ``PUT <Location>&digest=<digest>``), image manifests (Docker
image manifest v2 schema 2 or OCI image manifest), indexes (OCI image index or Docker manifest
list) with BuildKit-style attestation entries, and raw manifest bodies (``PUT
/v2/<name>/manifests/<reference>``). Handles the ``Basic`` and ``Bearer`` (Docker registry token
authentication) challenges of the ``basic``/``token`` variants of
:mod:`podplacement.sandbox.registry`.

Media types, descriptors (``mediaType``, ``digest``, ``size``, ``platform``, ``annotations``)
and digests (``sha256:<64 lower-case hex>``) follow the OCI image-spec (``descriptor.md``,
``manifest.md``, ``image-index.md``, ``config.md``) and Docker image manifest v2 schema 2;
attestation entries follow BuildKit's attestation-storage layout."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Generator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

from podplacement.sandbox.registry import Registry

__all__ = [
    "ATTESTATION_REF_DIGEST",
    "ATTESTATION_REF_TYPE",
    "DOCKER_CONFIG",
    "DOCKER_LAYER_GZIP",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "IN_TOTO",
    "MANIFEST_ACCEPT",
    "OCI_CONFIG",
    "OCI_INDEX",
    "OCI_LAYER_GZIP",
    "OCI_LAYER_ZSTD",
    "OCI_MANIFEST",
    "WINDOWS_OS_VERSION",
    "PushError",
    "Pushed",
    "Pusher",
    "RegistryAuth",
    "layer_tar",
    "parse_challenge",
    "parse_platform",
    "sha256_digest",
]

# media types: OCI image-spec (media-types.md) and Docker image manifest v2 schema 2
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
IN_TOTO = "application/vnd.in-toto+json"
# distribution 2.8 needs every one of these, or it answers 400/404 or silently the amd64 child
MANIFEST_ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
# BuildKit attestation-storage annotations on an index's attestation entry
ATTESTATION_REF_TYPE = "vnd.docker.reference.type"
ATTESTATION_REF_DIGEST = "vnd.docker.reference.digest"
#: ``platform.os.version`` given to windows entries (Windows Server 2022 build).
WINDOWS_OS_VERSION = "10.0.20348.2227"

_NAME_IN_PATH = re.compile(r"^/v2/(.+?)/(?:blobs|manifests|tags)/")


@dataclass(frozen=True)
class Pushed:
    """Descriptor of something pushed (OCI image-spec ``descriptor.md``).

    Attributes:
        digest: ``sha256:<64 hex>`` of the exact bytes stored.
        media_type: its media type (for manifests, the Content-Type it was pushed with).
        size: length in bytes.
        body: the exact bytes pushed (not part of equality).
    """

    digest: str
    media_type: str
    size: int
    body: bytes = field(default=b"", repr=False, compare=False)

    def descriptor(self) -> dict[str, Any]:
        """The OCI descriptor ``{"mediaType": str, "digest": str, "size": int}`` (a new dict
        each call, so callers may add ``platform`` / ``annotations``)."""
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def sha256_digest(data: bytes) -> str:
    """``sha256:<64 lower-case hex>`` of ``data`` (OCI image-spec ``descriptor.md`` digest
    form)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def parse_platform(text: str) -> dict[str, str]:
    """``"os/arch[/variant][@os.version]"`` → an OCI index platform ``{"os": str,
    "architecture": str, "variant"?: str, "os.version"?: str}`` (OCI image-spec
    ``image-index.md``); ``windows`` without ``@`` gets ``"os.version": WINDOWS_OS_VERSION``,
    ``windows/amd64@`` (an empty version) none. No check that the values are known
    GOOS/GOARCH.

    Raises:
        ValueError: fewer than two or more than three parts, or an empty part.
    """
    base, at, version = text.partition("@")
    parts = base.split("/")
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise ValueError(f"platform {text!r} is not os/arch[/variant][@os.version]")
    platform = {"os": parts[0], "architecture": parts[1]}
    if len(parts) == 3:
        platform["variant"] = parts[2]
    if at:
        if version:
            platform["os.version"] = version
    elif parts[0] == "windows":
        platform["os.version"] = WINDOWS_OS_VERSION
    return platform


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def layer_tar(files: dict[str, bytes]) -> bytes:
    """A deterministic gzip'd PAX tar holding ``files`` (member name → content bytes; mode
    0644, mtime 0, sorted by name; gzip mtime 0), usable as an
    ``application/vnd.oci.image.layer.v1.tar+gzip`` layer: equal inputs give equal bytes, hence
    equal digests."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mtime = 0
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    return _gzip(buf.getvalue())


def _diff_id(layer: bytes) -> str:
    if layer.startswith(b"\x28\xb5\x2f\xfd"):  # zstd frame (RFC 8878)
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(layer, read_across_frames=True)
        return sha256_digest(reader.read())
    try:
        return sha256_digest(gzip.decompress(layer))
    except (OSError, EOFError):
        return sha256_digest(layer)


def _dumps(doc: dict[str, Any]) -> bytes:
    # indented on purpose: clients must hash the bytes served, never a re-serialisation
    return json.dumps(doc, indent=3).encode()


class RegistryAuth(httpx.Auth):
    """``httpx`` auth flow answering a registry's 401 challenge: ``Basic`` (RFC 7617) → resend
    with the credentials; ``Bearer realm=..,service=..,scope=..`` (Docker registry token
    authentication) → ``GET realm?service=..&scope=repository:<name>:pull,push`` (with Basic
    credentials when known), read ``token`` or else ``access_token`` from the JSON answer and
    resend. Tokens are cached per repository name and sent up front afterwards; Basic is sent
    up front once the registry has asked for it. Never raises: without credentials for a
    ``Basic`` challenge the 401 is the answer; when the token fetch is refused (non-200) or
    its JSON holds no token, the token endpoint's response is the answer.

    Attributes:
        token_fetches: how many token requests were made (for tests).
    """

    requires_response_body = True

    def __init__(self, username: str | None, password: str | None) -> None:
        self._username = username
        self._password = password
        self._basic_known = False
        self._tokens: dict[str, str] = {}
        self.token_fetches = 0

    def _basic_header(self) -> str | None:
        if self._username is None:
            return None
        raw = f"{self._username}:{self._password or ''}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Send ``request``; on 401 authenticate once and resend (``httpx.Auth`` protocol:
        yields requests, receives their responses)."""
        match = _NAME_IN_PATH.match(request.url.path)
        name = match.group(1) if match else ""
        basic = self._basic_header()
        if self._basic_known and basic:
            request.headers["Authorization"] = basic
        elif name in self._tokens:
            request.headers["Authorization"] = f"Bearer {self._tokens[name]}"
        response = yield request
        if response.status_code != 401:
            return
        scheme, params = parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if scheme == "basic" and basic:
            self._basic_known = True
            request.headers["Authorization"] = basic
            yield request
        elif scheme == "bearer" and "realm" in params:
            scope = f"repository:{name}:pull,push" if name else params.get("scope", "")
            query = {"service": params.get("service", "")}
            if scope:
                query["scope"] = scope
            token_request = httpx.Request("GET", params["realm"], params=query)
            if basic:
                token_request.headers["Authorization"] = basic
            token_response = yield token_request
            self.token_fetches += 1
            if token_response.status_code != 200:
                return
            body = token_response.json()
            token = body.get("token") or body.get("access_token")
            if not token:
                return
            if name:
                self._tokens[name] = token
            request.headers["Authorization"] = f"Bearer {token}"
            yield request


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """Split ``WWW-Authenticate`` into (lower-case scheme, params), e.g.
    ``Bearer realm="r",service="s",scope="repository:a:pull"`` →
    ``("bearer", {"realm": "r", "service": "s", "scope": "repository:a:pull"})`` (RFC 7235
    auth-params: names lower-cased, quoted values keep their backslash escapes). An empty
    header gives ``("", {})``."""
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
        for m in re.finditer(r'([A-Za-z_][\w-]*)=(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))', rest)
    }
    return scheme.lower(), params


class PushError(RuntimeError):
    """The registry refused a push step (or served a digest different from the one computed).

    Attributes:
        method: HTTP method of the refused request.
        url: its URL.
        status: the HTTP status answered.
        body: the answer's body (distribution-spec error JSON, usually); the message holds
            its first 500 characters.
    """

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        super().__init__(f"{method} {url} -> {status}: {body[:500]}")
        self.method = method
        self.url = url
        self.status = status
        self.body = body


class Pusher:
    """Pushes blobs, image manifests and indexes to one
    :class:`~podplacement.sandbox.registry.Registry` (sync HTTP, 30 s timeout per request,
    trusting the registry's CA, authenticating with its credentials via :class:`RegistryAuth`).

    Use as a context manager or call :meth:`close`. Every push method raises
    :class:`PushError` when the registry answers an unexpected status, and ``httpx``'s
    ``TransportError`` when it cannot be reached.

    Attributes:
        registry: the target registry.
        auth: the auth flow (its ``token_fetches`` counts token requests).
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.auth = RegistryAuth(registry.username, registry.password)
        self._client = httpx.Client(
            base_url=registry.url, verify=registry.verify(), auth=self.auth, timeout=30.0
        )

    def close(self) -> None:
        """Close the HTTP client (idempotent)."""
        self._client.close()

    def __enter__(self) -> Pusher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check(self, resp: httpx.Response, *ok: int) -> httpx.Response:
        if resp.status_code not in ok:
            raise PushError(resp.request.method, str(resp.url), resp.status_code, resp.text)
        return resp

    def blob(self, repo: str, data: bytes, media_type: str = "application/octet-stream") -> Pushed:
        """Upload ``data`` as a blob of ``repo`` (distribution-spec monolithic upload: ``POST
        /v2/<repo>/blobs/uploads/`` → 202 with ``Location``, then ``PUT <Location>&digest=``
        → 201; skipped when ``HEAD /v2/<repo>/blobs/<digest>`` answers 200). ``media_type``
        only labels the returned descriptor.

        Returns:
            the blob's :class:`Pushed` descriptor (``body`` = ``data``).

        Raises:
            PushError: the POST did not answer 202 or the PUT not 201.
        """
        digest = sha256_digest(data)
        pushed = Pushed(digest, media_type, len(data), data)
        if self._client.head(f"/v2/{repo}/blobs/{digest}").status_code == 200:
            return pushed
        start = self._check(self._client.post(f"/v2/{repo}/blobs/uploads/"), 202)
        location = httpx.URL(self.registry.url).join(start.headers["Location"])
        target = location.copy_merge_params({"digest": digest})
        self._check(
            self._client.put(
                target, content=data, headers={"Content-Type": "application/octet-stream"}
            ),
            201,
        )
        return pushed

    def raw_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> Pushed:
        """``PUT /v2/<repo>/manifests/<ref>`` with ``body`` verbatim and ``media_type`` as
        Content-Type (``ref``: a tag, or the ``sha256:`` digest of ``body``).

        Returns:
            its :class:`Pushed` descriptor (digest of ``body``).

        Raises:
            PushError: the PUT did not answer 201, or the ``Docker-Content-Digest`` it served
                differs from the digest of ``body``.
        """
        resp = self._check(
            self._client.put(
                f"/v2/{repo}/manifests/{ref}", content=body, headers={"Content-Type": media_type}
            ),
            201,
        )
        digest = sha256_digest(body)
        served = resp.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise PushError("PUT", str(resp.url), resp.status_code, f"digest {served} != {digest}")
        return Pushed(digest, media_type, len(body), body)

    def image(
        self,
        repo: str,
        ref: str | None,
        *,
        os: str = "linux",
        architecture: str = "amd64",
        variant: str | None = None,
        fmt: str = "docker",
        layers: list[bytes] | None = None,
        os_version: str | None = None,
        process: dict[str, Any] | None = None,
        layer_media_type: str | None = None,
    ) -> Pushed:
        """Push a single-platform image: config blob (OCI image-spec ``config.md`` fields
        ``os``/``architecture``/``variant``/``os.version``, ``rootfs.diff_ids`` = sha256 of
        each decompressed layer), layer blob(s) and the manifest (``schemaVersion`` 2),
        tagged ``ref`` or pushed by digest when ``ref`` is None.

        Args:
            repo: repository name, e.g. ``"demo/busybox"``.
            os, architecture, variant, os_version: the platform written in the config.
            fmt: ``"docker"`` (Docker image manifest v2 schema 2) or ``"oci"`` (OCI image
                manifest); sets the manifest, config and layer media types.
            layers: layer bytes, oldest first (gzip'd tars expected; default: one tiny tar
                naming the platform, so each platform has its own layer).
            process: fields merged into the config's ``config`` object (``Entrypoint``,
                ``Cmd``, ``Env``, ``WorkingDir``; the default ``Env`` is
                ``PATH=/usr/local/bin:/usr/bin:/bin``).
            layer_media_type: the layers' media type (default: gzip'd tar of ``fmt``; e.g.
                :data:`OCI_LAYER_ZSTD` for zstd-compressed layers).

        Returns:
            the manifest's :class:`Pushed` descriptor.

        Raises:
            ValueError: unknown ``fmt``.
            PushError: the registry refused a blob or the manifest.
        """
        if fmt not in ("docker", "oci"):
            raise ValueError(f"fmt must be 'docker' or 'oci', not {fmt!r}")
        platform_text = "/".join(p for p in (os, architecture, variant) if p)
        if layers is None:
            layers = [layer_tar({"platform.txt": platform_text.encode()})]
        config: dict[str, Any] = {"architecture": architecture, "os": os}
        if variant:
            config["variant"] = variant
        if os_version:
            config["os.version"] = os_version
        config["config"] = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], **(process or {})}
        config["rootfs"] = {"type": "layers", "diff_ids": [_diff_id(x) for x in layers]}
        config["created"] = "2024-01-01T00:00:00Z"
        oci = fmt == "oci"
        config_blob = self.blob(repo, _dumps(config), OCI_CONFIG if oci else DOCKER_CONFIG)
        layer_type = layer_media_type or (OCI_LAYER_GZIP if oci else DOCKER_LAYER_GZIP)
        layer_blobs = [self.blob(repo, data, layer_type) for data in layers]
        media_type = OCI_MANIFEST if oci else DOCKER_MANIFEST
        manifest = {
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": config_blob.descriptor(),
            "layers": [b.descriptor() for b in layer_blobs],
        }
        body = _dumps(manifest)
        return self.raw_manifest(repo, ref or sha256_digest(body), body, media_type)

    def index(
        self,
        repo: str,
        ref: str,
        children: list[tuple[Pushed, dict[str, Any]]],
        *,
        fmt: str = "oci",
        annotations: dict[str, str] | None = None,
    ) -> Pushed:
        """Push an index tagged ``ref`` over already-pushed ``children`` of the same repo,
        in the given order (OCI image-spec ``image-index.md``; Docker manifest list v2).

        Each child's dict is either a platform (``{"os", "architecture", "variant"?,
        "os.version"?}``, as from :func:`parse_platform`) or descriptor extras
        ``{"platform": {...}?, "annotations": {...}?}`` as returned by :meth:`attestation`.

        Args:
            fmt: ``"oci"`` (OCI image index) or ``"docker"`` (manifest list v2).
            annotations: index-level annotations.

        Returns:
            the index's :class:`Pushed` descriptor.

        Raises:
            ValueError: unknown ``fmt``.
            PushError: the registry refused the index (e.g. a child it does not hold).
        """
        if fmt not in ("docker", "oci"):
            raise ValueError(f"fmt must be 'docker' or 'oci', not {fmt!r}")
        media_type = OCI_INDEX if fmt == "oci" else DOCKER_LIST
        manifests = []
        for child, extra in children:
            entry = child.descriptor()
            if "platform" in extra or "annotations" in extra:
                entry.update(extra)
            else:
                entry["platform"] = dict(extra)
            manifests.append(entry)
        doc: dict[str, Any] = {"schemaVersion": 2, "mediaType": media_type, "manifests": manifests}
        if annotations:
            doc["annotations"] = dict(annotations)
        return self.raw_manifest(repo, ref, _dumps(doc), media_type)

    def attestation(self, repo: str, subject: Pushed) -> tuple[Pushed, dict[str, Any]]:
        """Push a BuildKit-style attestation manifest for ``subject``, by digest: an OCI image
        manifest whose one layer is an in-toto statement (``application/vnd.in-toto+json``,
        SLSA provenance v0.2 predicate) naming ``subject``'s digest, and whose config has
        platform ``unknown/unknown``.

        Raises:
            PushError: the registry refused a blob or the manifest.

        Returns:
            (descriptor, extras) where extras = ``{"platform": {"os": "unknown",
            "architecture": "unknown"}, "annotations": {"vnd.docker.reference.type":
            "attestation-manifest", "vnd.docker.reference.digest": subject.digest}}``, ready
            for :meth:`index`.
        """
        statement = {
            "_type": "https://in-toto.io/Statement/v0.1",
            "predicateType": "https://slsa.dev/provenance/v0.2",
            "subject": [{"name": repo, "digest": {"sha256": subject.digest.split(":", 1)[1]}}],
            "predicate": {"builder": {"id": "podplacement-tests"}},
        }
        layer = self.blob(repo, _dumps(statement), IN_TOTO)
        config = {
            "architecture": "unknown",
            "os": "unknown",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        }
        config_blob = self.blob(repo, _dumps(config), OCI_CONFIG)
        layer_desc = layer.descriptor()
        layer_desc["annotations"] = {"in-toto.io/predicate-type": statement["predicateType"]}
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config_blob.descriptor(),
            "layers": [layer_desc],
        }
        body = _dumps(manifest)
        pushed = self.raw_manifest(repo, sha256_digest(body), body, OCI_MANIFEST)
        extras = {
            "platform": {"os": "unknown", "architecture": "unknown"},
            "annotations": {
                ATTESTATION_REF_TYPE: "attestation-manifest",
                ATTESTATION_REF_DIGEST: subject.digest,
            },
        }
        return pushed, extras

    def multiarch(
        self,
        repo: str,
        tag: str,
        platforms: list[str],
        *,
        fmt: str = "oci",
        attestations: bool = True,
    ) -> Pushed:
        """Push one image per platform (``"os/arch[/variant]"``, see :func:`parse_platform`;
        windows entries get ``os.version``) and an index tagged ``tag`` over them. With
        ``fmt="oci"`` and ``attestations``, the images are followed by their attestation
        entries (as BuildKit lays them out); Docker manifest lists get no attestations.

        Returns:
            the index's :class:`Pushed` descriptor.

        Raises:
            ValueError: a malformed platform or unknown ``fmt``.
            PushError: the registry refused a push.
        """
        children: list[tuple[Pushed, dict[str, Any]]] = []
        attestation_entries: list[tuple[Pushed, dict[str, Any]]] = []
        for text in platforms:
            platform = parse_platform(text)
            image = self.image(
                repo,
                None,
                os=platform["os"],
                architecture=platform["architecture"],
                variant=platform.get("variant"),
                fmt=fmt,
                os_version=platform.get("os.version"),
            )
            children.append((image, platform))
            if attestations and fmt == "oci":
                attestation_entries.append(self.attestation(repo, image))
        return self.index(repo, tag, children + attestation_entries, fmt=fmt)

    def get_manifest(self, repo: str, ref: str, accept: str = MANIFEST_ACCEPT) -> httpx.Response:
        """``GET /v2/<repo>/manifests/<ref>`` with all four manifest media types accepted (for
        reading back); returns the response whatever its status (no :class:`PushError`).

        Raises:
            httpx.TransportError: the registry cannot be reached.
        """
        return self._client.get(f"/v2/{repo}/manifests/{ref}", headers={"Accept": accept})
