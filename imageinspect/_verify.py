"""``verify``: does each platform of an image hold a program its architecture can run?

For each platform of an image (each runnable entry of its index, or the one platform of a
single manifest): read the image config (``Entrypoint``, ``Cmd``, ``Env``, ``WorkingDir``),
then stream the layers newest first, decompressing as the bytes arrive, until the container's
program is resolved (``PATH``, symlinks, hard links and whiteouts across the layers:
:mod:`imageinspect._rootfs`) to a file whose first bytes say what it is
(:mod:`imageinspect._elf`). A ``#!`` script leads on to its interpreter. Reading stops as
soon as the answer is known, and in any case once ``max_bytes`` have been read for that
platform (manifest, config and compressed layer bytes), which the report says.

The registry exchanges go through :class:`imageinspect.Inspector` (its mirrors, credentials,
authentication, transport and address guard); the tar work runs in a worker thread fed a
chunk at a time (:mod:`imageinspect._layers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from podplacement.imageinspect._credentials import Credential, match_credentials
from podplacement.imageinspect._errors import InvalidManifest, RegistryError
from podplacement.imageinspect._inspector import Inspector, _raise_for_status
from podplacement.imageinspect._layers import Cancelled, ChunkReader, LayerError, scan_layer
from podplacement.imageinspect._manifest import (
    INDEX_TYPES,
    MANIFEST_ACCEPT,
    MANIFEST_TYPES,
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    Descriptor,
    Platform,
    compute_digest,
    config_process,
    image_parts,
    index_children,
    parse_manifest,
    verify_digest,
)
from podplacement.imageinspect._reference import parse_reference
from podplacement.imageinspect._registries import PullSource
from podplacement.imageinspect._rootfs import (
    MISMATCH,
    FileVerdict,
    ProgramCheck,
    RootFS,
    env_path,
    program_of,
)

#: Default bytes read per platform before giving up: manifests, config and compressed layers.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Chunks handed to the tar thread ahead of its reading (x 64 KiB).
_AHEAD = 4

SKIPPED = "skipped"
INCOMPLETE = "incomplete"
ERROR = "error"


@dataclass(frozen=True, slots=True)
class PlatformReport:
    """The check of one platform.

    Attributes:
        platform: ``os/arch[/variant]`` as the index (or config) names it.
        manifest: digest of that platform's image manifest.
        status: ``ok``, ``mismatch`` (the program, or its interpreter, is an ELF file of
            another architecture, or neither ELF nor ``#!``), ``not-found``,
            ``no-entrypoint``, ``incomplete`` (the byte cap was hit first), ``skipped`` (not
            Linux) or ``error``.
        reason: one sentence on the status.
        program: ``argv[0]`` of the container (None without one).
        files: the program, then each interpreter, as examined.
        bytes_read: bytes received for this platform (manifest, config, layers; compressed).
        layers_read: layers read, wholly or in part, newest first.
        layers: layers the image has.
        seconds: wall time of this platform's check.
        cap_hit: reading stopped at ``max_bytes``.
    """

    platform: str
    manifest: str
    status: str
    reason: str
    program: str | None = None
    files: tuple[FileVerdict, ...] = ()
    bytes_read: int = 0
    layers_read: int = 0
    layers: int = 0
    seconds: float = 0.0
    cap_hit: bool = False

    @property
    def architecture(self) -> str:
        """The platform's architecture."""
        return self.platform.split("/")[1] if "/" in self.platform else self.platform

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "platform": self.platform, "manifest": self.manifest, "status": self.status,
            "reason": self.reason, "program": self.program,
            "files": [{"name": f.name, "path": f.path, "kind": f.kind, "layer": f.layer,
                       "detail": f.detail, "architecture": f.architecture,
                       "machine": f.machine, "via": list(f.via)} for f in self.files],
            "bytesRead": self.bytes_read, "layersRead": self.layers_read,
            "layers": self.layers, "seconds": round(self.seconds, 3), "capHit": self.cap_hit,
        }


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The verification of one image.

    Attributes:
        reference: the normalised reference.
        digest: digest of the top-level manifest.
        media_type: its media type.
        max_bytes: the per-platform byte cap in force.
        platforms: one :class:`PlatformReport` per platform checked.
    """

    reference: str
    digest: str
    media_type: str
    max_bytes: int
    platforms: tuple[PlatformReport, ...] = field(default_factory=tuple)

    @property
    def mismatched(self) -> tuple[str, ...]:
        """The platforms whose program cannot run on their architecture."""
        return tuple(p.platform for p in self.platforms if p.status == MISMATCH)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"reference": self.reference, "digest": self.digest,
                "mediaType": self.media_type, "maxBytes": self.max_bytes,
                "mismatched": list(self.mismatched),
                "platforms": [p.to_dict() for p in self.platforms]}


class _Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def spend(self, n: int) -> bool:
        """Count ``n`` bytes; False once the limit is passed."""
        self.used += n
        return self.used <= self.limit


@dataclass
class _Source:
    inspector: Inspector
    src: PullSource
    cred: Credential | None
    reference: str

    async def get(self, subpath: str, accept: str, max_body: int, what: str) -> tuple[
            bytes, str | None]:
        resp = await self.inspector._request(
            self.src, self.cred, "GET", subpath, accept=accept, max_body=max_body, what=what,
            reference=self.reference, follow_redirects=subpath.startswith("/blobs/"))
        _raise_for_status(resp, what, self.src.reference.domain, self.reference, self.cred)
        return resp.body, resp.headers.get("content-type")


async def verify_image(
    inspector: Inspector,
    image: str,
    credentials: Sequence[Credential] = (),
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    command: Sequence[str] | None = None,
    args: Sequence[str] | None = None,
    platforms: Collection[str] | None = None,
    concurrency: int = 2,
) -> VerifyReport:
    """Check, platform by platform, the ELF machine of the program ``image`` runs.

    Args:
        inspector: the registry client (its rules, credentials matching and transport).
        image: an image reference as written in a pod spec.
        credentials: the pull credentials to try (matched as for :meth:`Inspector.inspect`).
        max_bytes: bytes read per platform at most (manifest, config and compressed layers);
            reaching it ends that platform's check with status ``incomplete``.
        command, args: a pod container's ``command``/``args`` (they replace ``Entrypoint``
            and ``Cmd``: :func:`imageinspect._rootfs.program_of`).
        platforms: only these ``os/arch[/variant]`` (or ``arch``) entries; default all.
        concurrency: platforms checked at the same time.

    Returns:
        :class:`VerifyReport`; a platform that could not be checked has status ``error``
        (registry or layer failure) rather than raising.

    Raises:
        RegistryError: the reference is invalid, or the top-level manifest cannot be read.
    """
    ref = parse_reference(image)
    sources = inspector._registries.pull_sources(ref)
    plan = [(src, match_credentials(src.reference.name, credentials)) for src in sources]

    async def top(src: PullSource, cred: Credential | None) -> tuple[_Source, bytes, str | None]:
        source = _Source(inspector, src, cred, str(ref))
        what = f"manifest {src.reference.path}:{src.reference.manifest_ref}"
        body, ctype = await source.get(f"/manifests/{src.reference.manifest_ref}",
                                       MANIFEST_ACCEPT, MAX_MANIFEST_BYTES, what)
        return source, body, ctype

    source, body, ctype = await inspector._over_sources(ref, plan, top)
    if ref.digest is not None:
        verify_digest(body, ref.digest)
    digest = ref.digest or compute_digest(body)
    parsed = parse_manifest(body, ctype)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(platform: Platform | None, desc: Descriptor | None,
                  manifest_body: bytes | None) -> PlatformReport:
        async with sem:
            return await _verify_platform(source, platform, desc, manifest_body,
                                          max_bytes=max_bytes, command=command, args=args)

    if parsed.media_type in INDEX_TYPES:
        children = [(p, d) for p, d in index_children(body) if _wanted(p, platforms)]
        reports = await asyncio.gather(*(one(p, d, None) for p, d in children))
    elif parsed.media_type in MANIFEST_TYPES:
        single = await one(None, Descriptor(parsed.media_type, digest, len(body)), body)
        reports = [single] if platforms is None or _wanted(_parsed(single.platform),
                                                           platforms) else []
    else:
        raise InvalidManifest(f"{parsed.media_type} manifests carry no layers to verify",
                              reference=str(ref))
    return VerifyReport(str(ref), digest, parsed.media_type, max_bytes, tuple(reports))


def _parsed(text: str) -> Platform | None:
    try:
        return Platform.parse(text)
    except ValueError:
        return None


def _wanted(platform: Platform | None, wanted: Collection[str] | None) -> bool:
    if wanted is None:
        return True
    if platform is None:
        return False
    return str(platform) in wanted or platform.architecture in wanted or (
        f"{platform.os}/{platform.architecture}" in wanted)


async def _verify_platform(
    source: _Source,
    platform: Platform | None,
    desc: Descriptor | None,
    manifest_body: bytes | None,
    *,
    max_bytes: int,
    command: Sequence[str] | None,
    args: Sequence[str] | None,
) -> PlatformReport:
    started = time.monotonic()
    budget = _Budget(max_bytes)
    name = str(platform) if platform is not None else "unknown"
    manifest = desc.digest if desc is not None else ""
    layers_read = 0
    layers: tuple[Descriptor, ...] = ()
    check: ProgramCheck | None = None

    def report(status: str, reason: str, cap_hit: bool = False) -> PlatformReport:
        return PlatformReport(
            name, manifest, status, reason, check.program if check else None,
            tuple(check.files) if check else (), budget.used, layers_read, len(layers),
            time.monotonic() - started, cap_hit)

    try:
        body = manifest_body
        if body is None:
            assert desc is not None
            body, _ = await source.get(f"/manifests/{desc.digest}", MANIFEST_ACCEPT,
                                       MAX_MANIFEST_BYTES, f"manifest {desc.digest}")
            verify_digest(body, desc.digest)
        budget.spend(len(body))
        config_desc, layers = image_parts(body)
        cfg, _ = await source.get(f"/blobs/{config_desc.digest}", "*/*", MAX_CONFIG_BYTES,
                                  f"config blob {config_desc.digest}")
        verify_digest(cfg, config_desc.digest, "image config")
        budget.spend(len(cfg))
        found, process = config_process(cfg)
        if platform is None:
            platform = found[0] if found else None
            name = str(platform) if platform is not None else "unknown"
        if platform is None or platform.os != "linux":
            return report(SKIPPED, "only Linux programs (ELF) are checked")
        check = ProgramCheck(
            RootFS(len(layers)), program_of(process, command, args), platform.architecture,
            env_path(process.get("Env")), str(process.get("WorkingDir") or "/"))
        if check.step():
            return report(str(check.status), check.reason)
        for layer_desc in reversed(layers):
            layers_read += 1
            within = await _read_layer(source, layer_desc, check, budget)
            if not within:
                return report(INCOMPLETE, f"stopped at the cap of {max_bytes} bytes after "
                              f"{budget.used} bytes, in layer {layers_read} of {len(layers)} "
                              "(newest first)", cap_hit=True)
            if check.status is not None or check.step():
                return report(str(check.status), check.reason)
        return report(INCOMPLETE, "every layer was read without an answer")
    except (RegistryError, LayerError) as exc:
        return report(ERROR, f"{type(exc).__name__}: {exc}")


async def _read_layer(source: _Source, desc: Descriptor, check: ProgramCheck,
                      budget: _Budget) -> bool:
    """Read one layer (newest first) into ``check.rootfs`` until ``check`` is done or the
    layer ends. Returns False when the byte budget ran out first.

    Raises:
        RegistryError: the blob cannot be fetched; LayerError: it cannot be read.
    """
    loop = asyncio.get_running_loop()
    credits = asyncio.Semaphore(_AHEAD)

    def taken() -> None:
        loop.call_soon_threadsafe(credits.release)

    reader = ChunkReader(on_taken=taken)
    layer = check.rootfs.start_layer()

    def on_entry(path: str) -> bool:
        return check.concerns(path) and check.step()

    job = loop.run_in_executor(None, scan_layer, reader, desc.media_type, layer, on_entry)
    within = True
    try:
        async with source.inspector._open_blob(source.src, source.cred, desc.digest,
                                               source.reference) as resp:
            async for chunk in resp.chunks:
                if not budget.spend(len(chunk)):
                    within = False
                    break
                if not await _credit(credits, job):
                    break
                reader.put(chunk)
            else:
                reader.close()
    finally:
        # A reader given the whole layer finishes by itself; any other must stop now.
        if not job.done() and not reader.closed:
            reader.cancel()
        with contextlib.suppress(Cancelled):
            await job
    return within


async def _credit(credits: asyncio.Semaphore, job: asyncio.Future[Any]) -> bool:
    """Wait until the tar thread has room for another chunk; False when it finished."""
    if job.done():
        return False
    acquire = asyncio.ensure_future(credits.acquire())
    done, _ = await asyncio.wait({acquire, job}, return_when=asyncio.FIRST_COMPLETED)
    if acquire in done:
        return True
    acquire.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await acquire
    return False
