"""The :class:`Inspector`: image reference + credentials → :class:`ImageInfo` (platforms).

Flow for one lookup: parse and normalise the reference; ask registries.conf where to pull from
(mirrors in order, then the source; blocked registries refused); match the caller's credentials
to each source with the kubelet's rules; then, through the cache (key: reference + credential
identities, single-flight), fetch the manifest with all manifest Accept types. An index/list
gives the platforms directly (one request); a single manifest needs its config blob (two, one
when another tag already led to the same config: its platform is kept by digest, content
that cannot change).
Authentication is learned per (registry host, repository) from the registry's 401 challenge
(Basic, or Bearer with a token cached per (registry, realm, service, scope, credential identity)
until it expires); a new repository first tries the challenge that last worked on its host, and
a remembered challenge that fails is replaced by one fresh challenge and one retry. Requests go
through a per-registry semaphore. Only connection failures and 429/503 (the registry says
"later", with ``Retry-After`` honoured) are retried here, a few times with exponential
backoff and jitter; every other answer (502/504 included) is the caller's to retry: the
controller's work queue owns that backoff.

Where a registry may send us (Docker registry token authentication, "How to authenticate";
distribution-spec "Pulling blobs", which allows a redirect to another location): a token
realm and every redirect pass the checks of the registry itself: the address guard on the
addresses connected to (the refused networks), registries.conf's ``blocked``, and plain HTTP
only when the registry that sent us there or the target host is marked insecure. A realm may
name another host than the registry (Docker Hub's realm is ``auth.docker.io`` for
``registry-1.docker.io``), but it must be an ``http(s)`` URL without userinfo, query string
or fragment: the token protocol adds the query itself (``service``, ``scope``), so nothing of
the registry's choosing beyond the host and path reaches the token server. No remote text
(error bodies, realms, redirect targets) is copied into the errors raised; it is logged at
debug level, bounded and sanitized.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

from podplacement.imageinspect._auth import (
    TOKEN_EXPIRY_MARGIN,
    Challenge,
    basic_header,
    parse_challenges,
    parse_token_response,
    pull_scope,
    token_request,
)
from podplacement.imageinspect._cache import AsyncCache
from podplacement.imageinspect._credentials import Credential, match_credentials
from podplacement.imageinspect._errors import (
    ConnectionFailed,
    Denied,
    DigestMismatch,
    InvalidManifest,
    NotFound,
    RateLimited,
    RefusedTarget,
    RegistryError,
    ServerError,
    Timeout,
    TooLarge,
    Unauthorized,
    UnsafeAddress,
)
from podplacement.imageinspect._manifest import (
    DIGEST_RE,
    MANIFEST_ACCEPT,
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    SCHEMA1_TYPES,
    ImageInfo,
    Platform,
    compute_digest,
    estimated_bytes,
    parse_config,
    parse_manifest,
    verify_digest,
)
from podplacement.imageinspect._reference import Reference, parse_reference
from podplacement.imageinspect._registries import PullSource, RegistriesConfig
from podplacement.imageinspect._transport import (
    DEFAULT_NETWORKS,
    AiohttpTransport,
    IPNetwork,
    Response,
    StreamResponse,
    Transport,
    sanitize,
)

log = logging.getLogger("podplacement.imageinspect")
T = TypeVar("T")

RETRY_STATUSES = frozenset({429, 503})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 5
#: Longest token realm or redirect URL followed (characters).
MAX_TARGET_URL = 2048
#: Backoff: base * 2**attempt seconds, capped, times a jitter factor in [0.5, 1].
_BACKOFF_BASE = 0.1
_BACKOFF_CAP = 5.0
#: Longest Retry-After we sleep for; a longer one ends the retries with RateLimited at once.
MAX_RETRY_AFTER = 10.0
#: Default bound on the estimated bytes of the result cache (:func:`imageinspect._manifest.
#: estimated_bytes`): 32 MiB. A real image's result is 1-3 kB, so the entry bound (10,000)
#: is reached first; an index at the :data:`~imageinspect._manifest.MAX_INDEX_ENTRIES`
#: bound is ~60 kB, and 10,000 of those would otherwise hold 600 MB (the webhook's memory
#: limit is 256 MiB).
DEFAULT_CACHE_BYTES = 32 * 1024 * 1024


@dataclass(slots=True)
class InspectorStats:
    """Counters for metrics and benchmarks.

    Attributes:
        requests: HTTP exchanges sent (registry and token server, retries included).
        token_requests: the subset sent to token servers.
        retries: requests repeated after 429/5xx/connection errors.
        cache_hits: lookups answered from the cache (positive entries).
        negative_hits: lookups answered with a cached failure.
        cache_misses: lookups that started a fetch.
        inflight_joins: lookups that waited for another caller's fetch of the same key.
        revalidations: ``pull_always`` HEAD checks that confirmed the cached digest.
        config_hits: config blobs not fetched: their platform was known by digest.
    """

    requests: int = 0
    token_requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    negative_hits: int = 0
    cache_misses: int = 0
    inflight_joins: int = 0
    revalidations: int = 0
    config_hits: int = 0


def _error_detail(resp: Response) -> str:
    """The registry's error code/message (distribution-spec error body), if any, sanitized
    and bounded: for the debug log only, never for an error's message (remote text)."""
    try:
        import json

        doc = json.loads(resp.body or b"{}")
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            code = errors[0].get("code", "")
            message = errors[0].get("message", "")
            return sanitize(f"{code} {message}".strip())
    except (ValueError, AttributeError, TypeError):
        pass
    return ""


def _log_answer(resp: Response, what: str, registry: str) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: %s answered HTTP %d: %s", what, registry, resp.status,
                  _error_detail(resp) or "(no error body)")


def _retry_after(resp: Response) -> float | None:
    value = resp.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _raise_for_status(
    resp: Response, what: str, registry: str, reference: str, cred: Credential | None = None
) -> None:
    status = resp.status
    if 200 <= status < 300:
        return
    _log_answer(resp, what, registry)
    kw: dict[str, Any] = {"registry": registry, "reference": reference, "status": status}
    if status == 401:
        if cred is None:
            why = "authentication required and no pull secret matched this registry"
        else:
            why = f"credentials for {cred.pattern} (identity {cred.identity}) rejected"
        raise Unauthorized(f"{what}: {why}", **kw)
    if status == 403:
        raise Denied(f"{what}: access denied", **kw)
    if status == 404:
        raise NotFound(f"{what}: not found", **kw)
    if status == 429:
        raise RateLimited(
            f"{what}: rate limited by the registry", retry_after=_retry_after(resp), **kw
        )
    if status >= 500:
        raise ServerError(f"{what}: registry server error", **kw)
    raise RegistryError(f"{what}: unexpected HTTP status", **kw)


def _same_challenge(a: Challenge, b: Challenge) -> bool:
    """Same scheme, realm and service (``scope``/``error`` vary per request)."""
    return (a.scheme, a.realm, a.service) == (b.scheme, b.realm, b.service)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


class Inspector:
    """Reports the platforms of container images, with caching, auth and safety rules.

    Args:
        registries: registries.conf rules (mirrors, blocked, insecure); default: none.
        cache_ttl: seconds a tag's result is cached (default 6 h); digest references never expire.
        negative_ttl: seconds a failure is cached (default 30 s).
        max_entries: LRU bound of the result cache (entries).
        max_bytes: LRU bound of the result cache (estimated bytes, :data:`DEFAULT_CACHE_BYTES`).
        timeout: seconds for connecting, each read, and each whole request.
        per_registry_concurrency: concurrent requests per registry host.
        retries: extra attempts after 429/502/503/504/connection errors.
        allow_link_local: no address guard at all (tests only).
        refused_networks: the networks no registry, token realm or redirect may be reached
            in (``spec.imageInspection.refusedNetworks``), or a callable returning them, read
            at every connection; default :data:`~imageinspect._transport.DEFAULT_NETWORKS`.
            Ignored with ``transport``.
        ca_bundles: ``{"host[:port]": PEM bytes}`` extra CAs trusted for that registry.
        transport: an alternative :class:`~imageinspect._transport.Transport` (benchmarks).
        clock: monotonic clock for the cache and token expiry (tests).
        wall_clock: wall clock in unix seconds for :attr:`ImageInfo.fetched_at` (tests).

    Use ``async with Inspector() as insp`` or call :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        registries: RegistriesConfig | None = None,
        cache_ttl: float = 6 * 3600,
        negative_ttl: float = 30.0,
        max_entries: int = 10_000,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        timeout: float = 10.0,
        per_registry_concurrency: int = 16,
        retries: int = 3,
        allow_link_local: bool = False,
        refused_networks: Sequence[IPNetwork] | Callable[[], Sequence[IPNetwork]] | None = None,
        ca_bundles: dict[str, bytes] | None = None,
        transport: Transport | None = None,
        clock: Any = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._registries = registries or RegistriesConfig()
        self._cache_ttl = cache_ttl
        self._retries = max(0, retries)
        self._concurrency = max(1, per_registry_concurrency)
        networks: Callable[[], Sequence[IPNetwork]]
        if refused_networks is None:
            networks = lambda: DEFAULT_NETWORKS  # noqa: E731
        elif callable(refused_networks):
            networks = refused_networks
        else:
            fixed = tuple(refused_networks)
            networks = lambda: fixed  # noqa: E731
        self._transport: Transport = transport or AiohttpTransport(
            timeout=timeout,
            limit_per_host=self._concurrency,
            allow_link_local=allow_link_local,
            refused_networks=networks,
        )
        self._clock = clock
        self._wall_clock = wall_clock
        self._cache: AsyncCache[ImageInfo] = AsyncCache(
            max_entries=max_entries,
            max_bytes=max_bytes,
            size=estimated_bytes,
            negative_ttl=negative_ttl,
            cache_errors=(RegistryError,),
            clock=clock,
        )
        self._ca_bundles = dict(ca_bundles or {})
        self._ssl: dict[tuple[str, bool], ssl.SSLContext] = {}
        self._schemes: dict[str, str] = {}
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        #: Challenges per (registry host, repository scope), the registry's latest word, LRU.
        self._challenges: dict[tuple[str, str], Challenge] = {}
        self._max_challenges = max(1, max_entries)
        #: Per host, the last challenge that got a non-401 answer: the first guess for a
        #: repository not challenged yet (a wrong guess costs one re-challenge).
        self._host_challenges: dict[str, Challenge] = {}
        self._tokens: dict[tuple[str, str, str, str, str], tuple[str, float]] = {}
        #: Platform of each config blob seen, by its digest, LRU: content-addressed, so it
        #: holds for every tag that names it. A caller only reaches it through a manifest
        #: it was allowed to read, in a repository that holds the blob (a registry refuses a
        #: manifest whose blobs the repository lacks), so it learns nothing it could not
        #: have fetched.
        self._config_platforms: OrderedDict[str, tuple[Platform, ...]] = OrderedDict()
        self._max_configs = max(1, max_entries)
        self._stats = InspectorStats()
        #: The backoff sleep (tests replace it to observe delays without waiting).
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    # -- public -------------------------------------------------------------------------

    @property
    def stats(self) -> InspectorStats:
        """A snapshot of the counters (cache counters included)."""
        c = self._cache.stats
        return replace(
            self._stats,
            cache_hits=c.hits,
            negative_hits=c.negative_hits,
            cache_misses=c.misses,
            inflight_joins=c.joins,
        )

    async def __aenter__(self) -> Inspector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel in-flight fetches and close the HTTP client."""
        await self._cache.aclose()
        await self._transport.aclose()

    async def inspect(
        self,
        image: str,
        credentials: Sequence[Credential] = (),
        *,
        pull_always: bool = False,
        max_age: float | None = None,
    ) -> ImageInfo:
        """Return the platforms of ``image``.

        Args:
            image: an image reference as written in a pod spec (``nginx``, ``host:5000/a/b:t``,
                ``...@sha256:...``).
            credentials: the credentials this pod may use (its pull secrets, the node's config);
                matched per the kubelet's rules and tried in order, anonymous last.
            pull_always: the pod has ``imagePullPolicy: Always``: a cached tag result is
                revalidated with one ``HEAD`` digest check instead of being trusted (a
                confirmed result is returned with ``fetched_at`` set to the check's time).
            max_age: seconds; a cached tag result fetched this long ago or longer (by
                :attr:`ImageInfo.fetched_at`) is fetched again. For a caller whose own
                cache has a shorter TTL than this inspector's (the webhook's place cache
                ages its entries by ``fetched_at``). None: the cache TTL alone decides.

        Returns:
            :class:`ImageInfo` whose ``reference`` is the normalised reference and whose
            ``fetched_at`` is when a registry answered for it: for a result served from the
            cache, the time of the fetch it copies (not the time of this call).

        Raises:
            InvalidReference, Blocked, UnsafeAddress, NotFound, Unauthorized, Denied,
            RateLimited, ServerError, Timeout, ConnectionFailed, InvalidManifest (DigestMismatch),
            TooLarge: all subclasses of :class:`RegistryError`, carrying registry, reference
            and HTTP status.
        """
        ref = parse_reference(image)
        sources = self._registries.pull_sources(ref)
        plan = [(src, match_credentials(src.reference.name, credentials)) for src in sources]
        identities = tuple(sorted({c.identity for _, creds in plan for c in creds}))
        key = (str(ref), identities)
        ttl = None if ref.pinned else self._cache_ttl

        async def fetch() -> tuple[ImageInfo, float | None]:
            fetched_at = self._wall_clock()
            return replace(await self._fetch(ref, plan), fetched_at=fetched_at), ttl

        if pull_always and not ref.pinned:
            cached = self._cache.peek(key)
            if cached is not None:
                checked_at = self._wall_clock()
                digest = await self._head_digest(ref, plan)
                if digest == cached.digest:
                    self._stats.revalidations += 1
                    return replace(cached, fetched_at=checked_at)
                self._cache.invalidate(key)
            return await self._cache.get_or_fetch(key, fetch, use_cached=False)
        if max_age is not None and not ref.pinned:
            cached = self._cache.peek(key)
            if cached is not None and (cached.fetched_at is None
                                       or self._wall_clock() - cached.fetched_at >= max_age):
                return await self._cache.get_or_fetch(key, fetch, use_cached=False)
        return await self._cache.get_or_fetch(key, fetch)

    # -- fetching -----------------------------------------------------------------------

    async def _fetch(
        self, ref: Reference, plan: list[tuple[PullSource, list[Credential]]]
    ) -> ImageInfo:
        async def one(src: PullSource, cred: Credential | None) -> ImageInfo:
            return await self._fetch_with(src, cred, ref)

        return await self._over_sources(ref, plan, one)

    async def _head_digest(
        self, ref: Reference, plan: list[tuple[PullSource, list[Credential]]]
    ) -> str | None:
        async def one(src: PullSource, cred: Credential | None) -> str | None:
            return await self._head_with(src, cred, ref)

        return await self._over_sources(ref, plan, one)

    async def _over_sources(
        self,
        ref: Reference,
        plan: list[tuple[PullSource, list[Credential]]],
        op: Callable[[PullSource, Credential | None], Awaitable[T]],
    ) -> T:
        """Run ``op`` on each pull source in order (mirrors, then the source) until one works;
        within a source, each matching credential in order, then anonymous (kubelet order).
        Only 401/403/404 move on to the next credential; any error moves on to the next source.
        The last source's error is raised."""
        errors: list[RegistryError] = []
        rank = {NotFound: 0, Denied: 1, Unauthorized: 2}
        for src, creds in plan:
            attempts: list[Credential | None] = [*creds, None]
            auth_errors: list[RegistryError] = []
            try:
                for cred in attempts:
                    try:
                        return await op(src, cred)
                    except (Unauthorized, Denied, NotFound) as exc:
                        auth_errors.append(exc)
                raise min(auth_errors, key=lambda e: rank.get(type(e), 3))
            except RegistryError as exc:
                exc.with_context(registry=src.reference.domain, reference=str(ref))
                if src.mirror:
                    log.info("mirror %s failed for %s: %s", src.reference.domain, ref, exc)
                errors.append(exc)
        raise errors[-1]

    async def _fetch_with(
        self, src: PullSource, cred: Credential | None, ref: Reference
    ) -> ImageInfo:
        sref = src.reference
        what = (
            f"manifest {sref.path}:{sref.manifest_ref}"
            if not sref.pinned
            else (f"manifest {sref.path}@{sref.digest}")
        )
        resp = await self._request(
            src,
            cred,
            "GET",
            f"/manifests/{sref.manifest_ref}",
            accept=MANIFEST_ACCEPT,
            max_body=MAX_MANIFEST_BYTES,
            what=what,
            reference=str(ref),
        )
        _raise_for_status(resp, what, sref.domain, str(ref), cred)
        body = resp.body
        parsed = parse_manifest(body, resp.headers.get("content-type"))
        header_digest = resp.headers.get("docker-content-digest", "").strip()
        if sref.digest is not None:
            verify_digest(body, sref.digest)
            digest = sref.digest
        elif parsed.media_type in SCHEMA1_TYPES:
            # Signed schema 1 digests cover the payload without signatures: trust the header.
            # Only a well-formed one: it is shown in the decision annotation.
            digest = header_digest if DIGEST_RE.fullmatch(header_digest) else compute_digest(body)
        else:
            digest = compute_digest(body)
            if header_digest and header_digest.startswith("sha256:") and header_digest != digest:
                raise DigestMismatch(
                    f"manifest hashes to {digest}, not the digest the registry's header names"
                )
        platforms = parsed.platforms
        if parsed.needs_config:
            assert parsed.config_digest is not None
            if parsed.config_size is not None and parsed.config_size > MAX_CONFIG_BYTES:
                raise TooLarge(
                    f"image config {parsed.config_digest} is larger than the "
                    f"{MAX_CONFIG_BYTES // (1024 * 1024)} MiB limit ({parsed.config_size} bytes)"
                )
            known = self._config_platforms.get(parsed.config_digest)
            if known is not None:
                self._config_platforms.move_to_end(parsed.config_digest)
                self._stats.config_hits += 1
                return ImageInfo(str(ref), digest, parsed.media_type, known)
            cwhat = f"config blob {parsed.config_digest}"
            cresp = await self._request(
                src,
                cred,
                "GET",
                f"/blobs/{parsed.config_digest}",
                accept="*/*",
                max_body=MAX_CONFIG_BYTES,
                what=cwhat,
                reference=str(ref),
                follow_redirects=True,
            )
            _raise_for_status(cresp, cwhat, sref.domain, str(ref), cred)
            verify_digest(cresp.body, parsed.config_digest, "image config")
            platforms = parse_config(cresp.body)
            self._config_platforms[parsed.config_digest] = platforms
            while len(self._config_platforms) > self._max_configs:
                self._config_platforms.popitem(last=False)
        return ImageInfo(str(ref), digest, parsed.media_type, platforms)

    async def _head_with(
        self, src: PullSource, cred: Credential | None, ref: Reference
    ) -> str | None:
        sref = src.reference
        what = f"manifest {sref.path}:{sref.manifest_ref}"
        resp = await self._request(
            src,
            cred,
            "HEAD",
            f"/manifests/{sref.manifest_ref}",
            accept=MANIFEST_ACCEPT,
            max_body=0,
            what=what,
            reference=str(ref),
        )
        _raise_for_status(resp, what, sref.domain, str(ref), cred)
        return resp.headers.get("docker-content-digest") or None

    @contextlib.asynccontextmanager
    async def _open_blob(
        self, src: PullSource, cred: Credential | None, digest: str, reference: str
    ) -> AsyncIterator[StreamResponse]:
        """Stream a blob of ``src``'s repository: a ``HEAD`` through the usual
        authentication (it learns the challenge and fetches the token), then a streaming
        ``GET`` with the same ``Authorization``, following redirects (credentials only to
        the registry's own origin).

        Raises:
            NotFound, Unauthorized, Denied, ServerError, RegistryError: the registry's answer;
            Timeout, ConnectionFailed, UnsafeAddress: the transport's; InvalidManifest: bad or
            too many redirects.
        """
        sref = src.reference
        host = sref.api_host
        what = f"blob {digest}"
        base = await self._base_url(host, src.insecure)
        url = f"{base}/v2/{sref.path}/blobs/{digest}"
        head, headers = await self._authorized(
            src, cred, "HEAD", url, "*/*", pull_scope(sref.path), 0, what, reference
        )
        if head.status not in _REDIRECT_STATUSES:
            _raise_for_status(head, what, sref.domain, reference, cred)
        target, send = url, dict(headers)
        for _ in range(_MAX_REDIRECTS + 1):
            target_host = urlsplit(target).netloc
            insecure = (src.insecure and target_host == host) or self._registries.is_insecure(
                target_host)
            ssl_ctx: ssl.SSLContext | bool = (
                self._ssl_context(target_host, insecure) if target.startswith("https://")
                else False)
            self._stats.requests += 1
            async with self._stream_in_context(target, send, ssl_ctx, host) as resp:
                if resp.status in _REDIRECT_STATUSES:
                    location = resp.headers.get("location")
                    if not location:
                        raise InvalidManifest(f"{what}: redirect without a Location",
                                              status=resp.status)
                    nxt = self._check_target(urljoin(target, location), src,
                                             f"{what}: redirect")
                    send = {"Accept": headers.get("Accept", "*/*")}
                    if _origin(nxt) == _origin(url) and "Authorization" in headers:
                        send["Authorization"] = headers["Authorization"]
                    target = nxt
                    continue
                if not 200 <= resp.status < 300:
                    _raise_for_status(Response(resp.status, resp.headers, resp.www_authenticate,
                                               b"", target), what, sref.domain, reference, cred)
                yield resp
                return
        raise InvalidManifest(f"{what}: too many redirects")

    @contextlib.asynccontextmanager
    async def _stream_in_context(self, url: str, headers: Mapping[str, str],
                                 ssl_ctx: ssl.SSLContext | bool, registry: str
                                 ) -> AsyncIterator[StreamResponse]:
        """:meth:`Transport.stream` whose errors name ``registry`` (the source's), not the
        host of a redirect target."""
        try:
            async with self._transport.stream("GET", url, headers=headers,
                                              ssl_context=ssl_ctx) as resp:
                yield resp
        except RegistryError as exc:
            raise exc.with_context(registry=registry) from None

    # -- HTTP with auth -----------------------------------------------------------------

    async def _request(
        self,
        src: PullSource,
        cred: Credential | None,
        method: str,
        subpath: str,
        *,
        accept: str,
        max_body: int,
        what: str,
        reference: str,
        follow_redirects: bool = False,
    ) -> Response:
        sref = src.reference
        host = sref.api_host
        base = await self._base_url(host, src.insecure)
        url = f"{base}/v2/{sref.path}{subpath}"
        scope = pull_scope(sref.path)
        try:
            resp, headers = await self._authorized(
                src, cred, method, url, accept, scope, max_body, what, reference
            )
            if follow_redirects:
                resp = await self._follow_redirects(src, resp, url, headers, max_body, what)
            return resp
        except TooLarge as exc:
            raise TooLarge(
                f"{what} is larger than the {max_body // (1024 * 1024)} MiB limit ({exc.message})",
                registry=exc.registry or sref.domain,
                reference=reference,
                status=exc.status,
            ) from None

    async def _authorized(
        self,
        src: PullSource,
        cred: Credential | None,
        method: str,
        url: str,
        accept: str,
        scope: str,
        max_body: int,
        what: str,
        reference: str,
    ) -> tuple[Response, dict[str, str]]:
        """Send one registry request with the ``Authorization`` its challenge calls for.

        Challenges are remembered per (registry host, repository scope). The first attempt uses
        the challenge this repository last gave, else the last one that worked for another
        repository on the host (real registries use one realm per host, so a new repository
        usually needs no extra 401 round trip), else none. When a remembered challenge fails
        (the token server refuses or cannot be reached, or the registry still answers 401),
        the registry is challenged afresh once (the 401 it just sent, or the same request sent
        without ``Authorization``) and the request retried once with that challenge. A failure
        with a challenge the registry gave during this call is final, as is a Basic challenge
        that rejects the credentials or a fresh challenge identical to the failed one.

        Returns:
            ``(response, headers sent)``; a final 401 is returned for the caller to report.

        Raises:
            Unauthorized, Denied, UnsafeAddress, ConnectionFailed, Timeout, ...: the token
            request failed with a challenge that is not stale.
        """
        host = src.reference.api_host
        key = (host, scope)
        plain = {"Accept": accept}
        challenge = self._challenges.get(key) or self._host_challenges.get(host)
        fresh = False  # True once `challenge` came from the registry during this call
        while True:
            headers = dict(plain)
            auth: str | None = None
            if challenge is not None:
                failure: RegistryError | None = None
                try:
                    auth = await self._authorization(
                        src, challenge, scope, cred, what, reference
                    )
                except RegistryError as exc:
                    if fresh:
                        raise
                    failure = exc
                if failure is not None:
                    # The remembered challenge may be stale: ask the registry again, once.
                    fresh = True
                    probe = await self._send(host, method, url, plain, max_body, src.insecure)
                    if probe.status != 401:
                        return probe, plain
                    new = self._learn(key, probe)
                    if new is None or _same_challenge(new, challenge):
                        raise failure
                    log.info(
                        "registry %s changed its %s challenge for %s; retrying", host, new.scheme,
                        scope,
                    )
                    challenge = new
                    continue
            if auth:
                headers["Authorization"] = auth
            resp = await self._send(host, method, url, headers, max_body, src.insecure)
            if resp.status != 401:
                if auth and challenge is not None:
                    self._remember(key, challenge)
                    self._host_challenges[host] = challenge
                return resp, headers
            if auth and challenge is not None and challenge.scheme == "bearer":
                self._drop_token(host, challenge, scope, cred)
            new = self._learn(key, resp)
            if fresh or new is None:
                return resp, headers
            if new.scheme == "basic" and (
                cred is None or (auth and challenge is not None and _same_challenge(new, challenge))
            ):
                return resp, headers  # nothing to send, or our Basic credentials were rejected
            challenge, fresh = new, True

    def _learn(self, key: tuple[str, str], resp: Response) -> Challenge | None:
        """Remember and return the first usable (Bearer, then Basic) challenge of a 401."""
        if resp.status != 401:
            return None
        for challenge in parse_challenges(resp.www_authenticate):
            if challenge.scheme in ("bearer", "basic"):
                self._remember(key, challenge)
                return challenge
        return None

    def _remember(self, key: tuple[str, str], challenge: Challenge) -> None:
        self._challenges.pop(key, None)
        self._challenges[key] = challenge
        while len(self._challenges) > self._max_challenges:
            self._challenges.pop(next(iter(self._challenges)))

    async def _follow_redirects(
        self, src: PullSource, resp: Response, url: str, headers: dict[str, str],
        max_body: int, what: str
    ) -> Response:
        """Follow up to :data:`_MAX_REDIRECTS` redirects, each target checked by
        :meth:`_check_target` first; errors name the source's registry, never the target."""
        hops = 0
        while resp.status in _REDIRECT_STATUSES:
            location = resp.headers.get("location")
            hops += 1
            if not location or hops > _MAX_REDIRECTS:
                raise InvalidManifest(f"{what}: bad or too many redirects", status=resp.status)
            target = self._check_target(urljoin(resp.url, location), src, f"{what}: redirect")
            rheaders = {"Accept": headers["Accept"]}
            # Registry credentials only ever go to the registry's own origin.
            if _origin(target) == _origin(url) and "Authorization" in headers:
                rheaders["Authorization"] = headers["Authorization"]
            target_host = urlsplit(target).netloc
            resp = await self._send(target_host, "GET", target, rheaders, max_body, False,
                                    context=src.reference.api_host)
        return resp

    def _check_target(self, url: str, src: PullSource, what: str, *, realm: bool = False
                      ) -> str:
        """Check a token realm or redirect target that the registry of ``src`` sent, as the
        registry itself is checked (the address guard follows when connecting).

        Refused, checked in this order: longer than :data:`MAX_TARGET_URL`, not an
        ``http``/``https`` URL with a host, userinfo (``user@host``), spaces or control
        characters, a host registries.conf ``blocked`` covers, plain HTTP unless the
        registry or the target host is marked ``insecure``, and for a realm a query string or
        fragment (the token protocol adds ``service`` and ``scope`` itself: Docker registry
        token authentication, "Requesting a Token").

        Returns:
            ``url`` unchanged.

        Raises:
            RefusedTarget: in our words (the URL is logged at debug level, sanitized);
            ``registry`` is the source's registry host.
        """
        registry = src.reference.api_host

        def refuse(why: str) -> RefusedTarget:
            log.debug("%s from %s refused (%s): %s", what, registry, why, sanitize(url))
            return RefusedTarget(f"{what} refused: {why}", registry=registry)

        if len(url) > MAX_TARGET_URL:
            raise refuse("the URL is too long")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise refuse("not a valid URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise refuse("not an http(s) URL")
        if "@" in parts.netloc:
            raise refuse("the URL carries userinfo")
        if any(c <= " " or c == "\x7f" for c in url):
            raise refuse("the URL has spaces or control characters")
        netloc = parts.netloc.lower()
        if self._registries.blocks_host(netloc):
            raise refuse("its host is blocked by registries.conf")
        if parts.scheme == "http" and not (
            src.insecure or self._registries.is_insecure(registry)
            or self._registries.is_insecure(netloc)
        ):
            raise refuse("plain HTTP, and neither the registry nor that host is marked insecure")
        if realm and (parts.query or parts.fragment or "?" in url or "#" in url):
            raise refuse("the realm has a query string or fragment")
        return url

    def _token_key(
        self, host: str, challenge: Challenge, scope: str, cred: Credential | None
    ) -> tuple[str, str, str, str, str]:
        return (host, challenge.realm, challenge.service, scope, cred.identity if cred else "")

    def _drop_token(
        self, host: str, challenge: Challenge, scope: str, cred: Credential | None
    ) -> None:
        self._tokens.pop(self._token_key(host, challenge, scope, cred), None)

    async def _authorization(
        self,
        src: PullSource,
        challenge: Challenge,
        scope: str,
        cred: Credential | None,
        what: str,
        reference: str,
    ) -> str | None:
        """The ``Authorization`` value answering ``challenge`` (None: send none).

        Basic: the credential's username/password. Bearer: a token for ``scope`` from the
        challenge's realm, cached per (host, realm, service, scope, credential identity) until
        ``expires_in`` minus a margin. The realm passes :meth:`_check_target` first. No text
        of the realm or of the token server's answer is in the errors (debug log only).

        Raises:
            Unauthorized: no realm, the token server answered 401 or a bad body.
            Denied: the token server answered 403.
            RefusedTarget: the realm may not be used (:meth:`_check_target`).
            UnsafeAddress, ConnectionFailed, Timeout: the realm cannot be reached safely
                (``registry`` is the registry that sent it).
        """
        host = src.reference.api_host
        insecure = src.insecure
        if challenge.scheme == "basic":
            return basic_header(cred) if cred is not None else None
        key = self._token_key(host, challenge, scope, cred)
        cached = self._tokens.get(key)
        now = self._clock()
        if cached is not None and cached[1] > now:
            return f"Bearer {cached[0]}"
        if not challenge.realm:
            raise Unauthorized(
                f"{what}: bearer challenge without a realm", registry=host, reference=reference
            )
        self._check_target(challenge.realm, src, f"{what}: token realm", realm=True)
        realm = urlsplit(challenge.realm)
        treq = token_request(challenge, scope, cred)
        realm_host = realm.netloc
        self._stats.token_requests += 1
        try:
            resp = await self._send(
                realm_host,
                treq.method,
                treq.url,
                treq.headers,
                1024 * 1024,
                insecure and realm_host == host,
                body=treq.body,
                context=host,
            )
        except (UnsafeAddress, ConnectionFailed, Timeout) as exc:
            raise type(exc)(
                f"{what}: token server named by the registry's challenge: {exc.message}",
                registry=host,
                reference=reference,
                status=exc.status,
            ) from None
        if resp.status in (401, 403):
            _log_answer(resp, f"{what}: token server {sanitize(realm_host, 100)}", host)
            who = "anonymous access" if cred is None else "the credentials"
            err = Unauthorized if resp.status == 401 else Denied
            raise err(
                f"{what}: the token server named by the registry's challenge refused {who}",
                registry=host,
                reference=reference,
                status=resp.status,
            )
        _raise_for_status(resp, f"{what}: token request", host, reference)
        try:
            token, lifetime = parse_token_response(resp.body)
        except ValueError as exc:
            log.debug("%s: bad token response from %s: %s", what, sanitize(realm_host, 100),
                      sanitize(str(exc)))
            raise Unauthorized(
                f"{what}: the token server's answer holds no usable token",
                registry=host,
                reference=reference,
                status=resp.status,
            ) from None
        self._tokens[key] = (token, now + max(0.0, lifetime - TOKEN_EXPIRY_MARGIN))
        return f"Bearer {token}"

    # -- transport with retries -------------------------------------------------------

    def _ssl_context(self, host: str, insecure: bool) -> ssl.SSLContext:
        key = (host, insecure)
        ctx = self._ssl.get(key)
        if ctx is None:
            if insecure:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                ctx = ssl.create_default_context()
                pem = self._ca_bundles.get(host)
                if pem:
                    ctx.load_verify_locations(cadata=pem.decode())
            self._ssl[key] = ctx
        return ctx

    async def _base_url(self, host: str, insecure: bool) -> str:
        insecure = insecure or self._registries.is_insecure(host)
        if not insecure:
            return f"https://{host}"
        scheme = self._schemes.get(host)
        if scheme is None:
            # containers/image behaviour: try TLS (unverified) first, fall back to plain HTTP.
            try:
                await self._send(host, "GET", f"https://{host}/v2/", {}, 64 * 1024, True, retries=0)
                scheme = "https"
            except ConnectionFailed:
                scheme = "http"
            self._schemes[host] = scheme
        return f"{scheme}://{host}"

    async def _send(
        self,
        host: str,
        method: str,
        url: str,
        headers: Mapping[str, str],
        max_body: int,
        insecure: bool,
        *,
        body: bytes | None = None,
        retries: int | None = None,
        context: str | None = None,
    ) -> Response:
        """One request through ``host``'s semaphore, with the retries of 429/503 and
        connection failures; ``context`` is the registry host errors name (default ``host``:
        a token server or redirect target is named by the registry that sent us there)."""
        sem = self._semaphores.get(host)
        if sem is None:
            sem = self._semaphores[host] = asyncio.Semaphore(self._concurrency)
        insecure = insecure or self._registries.is_insecure(host)
        ssl_ctx: ssl.SSLContext | bool = (
            self._ssl_context(host, insecure) if url.startswith("https://") else False
        )
        limit = self._retries if retries is None else retries
        attempt = 0
        while True:
            try:
                async with sem:
                    self._stats.requests += 1
                    resp = await self._transport.request(
                        method,
                        url,
                        headers=headers,
                        max_body=max_body,
                        ssl_context=ssl_ctx,
                        data=body,
                    )
            except ConnectionFailed as exc:
                exc.with_context(registry=context or host)
                if attempt >= limit:
                    raise
                delay = self._backoff(attempt)
                log.debug(
                    "retrying %s %s after %s in %.2fs", method, url, type(exc).__name__, delay
                )
            except RegistryError as exc:
                raise exc.with_context(registry=context or host) from None
            else:
                if resp.status not in RETRY_STATUSES or attempt >= limit:
                    return resp
                after = _retry_after(resp)
                if after is not None and after > MAX_RETRY_AFTER:
                    return resp
                delay = after if after is not None else self._backoff(attempt)
                log.debug("retrying %s %s after HTTP %d in %.2fs", method, url, resp.status, delay)
            attempt += 1
            self._stats.retries += 1
            await self._sleep(delay)

    @staticmethod
    def _backoff(attempt: int) -> float:
        return min(_BACKOFF_CAP, _BACKOFF_BASE * 2.0**attempt) * random.uniform(0.5, 1.0)
