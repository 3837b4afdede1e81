"""A small raw-JSON Kubernetes client: :class:`KubeAPI` and the request helpers shared by its
users (the :class:`ApiError` family is :mod:`kubeclient.errors`; paths are built and checked
by :mod:`kubeclient.paths`, and every path is checked again here before it is sent).

The async clients' model deserialisation is the main cost on the hot path, so this module
talks to the API server with aiohttp and plain dicts (the JSON the API gives). Connection
settings (server URL, TLS, client certificates, bearer tokens) come from
``kubernetes.aio.config`` through :mod:`kubeclient.credentials`: a kubeconfig file or the
in-cluster service account, with tokens refreshed (exec plugins, token files) and one retry
after a ``401 Unauthorized``.
"""

from __future__ import annotations

import random
import ssl
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import aiohttp
import orjson

from podplacement.kubeclient.credentials import (
    ConfigCredentials,
    ConfigLoader,
    Credentials,
    StaticCredentials,
    default_kubeconfig,
    load_configuration,
)
from podplacement.kubeclient.errors import ApiError, api_error, unavailable
from podplacement.kubeclient.paths import check_path
from podplacement.kubeclient.readhold import hold_reading

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def request_verb(method: str, path: str, params: Mapping[str, str] | None = None) -> str:
    """The Kubernetes API verb of a request (``get``, ``list``, ``watch``, ``create``,
    ``update``, ``patch``, ``delete``, ``deletecollection``), as the apiserver's audit log
    names it. ``path`` may carry a query string."""
    method = method.upper()
    bare, _, query = path.partition("?")
    is_watch = bool(params and str(params.get("watch", "")).lower() in ("1", "true"))
    is_watch = is_watch or "watch=1" in query or "watch=true" in query
    collection = _is_collection(bare)
    if method == "GET":
        if is_watch:
            return "watch"
        return "list" if collection else "get"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "deletecollection" if collection else "delete"
    return method.lower()


def request_resource(path: str) -> str:
    """The resource (with subresource) a request path names: ``pods``, ``pods/status``,
    ``events``, ``namespaces``. Empty for discovery paths."""
    parts = _resource_parts(path.partition("?")[0])
    if not parts:
        return ""
    return parts[0] + (f"/{parts[2]}" if len(parts) > 2 else "")


def _resource_parts(bare: str) -> list[str]:
    segs = [s for s in bare.split("/") if s]
    if segs[:2] == ["api", "v1"]:
        segs = segs[2:]
    elif segs[:1] == ["apis"] and len(segs) >= 3:
        segs = segs[3:]
    else:
        return []
    if len(segs) >= 3 and segs[0] == "namespaces":
        segs = segs[2:]
    return segs


def _is_collection(bare: str) -> bool:
    return len(_resource_parts(bare)) == 1


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class KubeRequester(Protocol):
    """The request half of :class:`KubeAPI`: what pure-ish helpers (leader election,
    PodPlacementConfig lifecycle) need, so tests can hand them a fake."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one request, return the decoded JSON; raise :class:`ApiError`."""
        ...


class KubeAPI:
    """Raw-JSON client for the Kubernetes REST API (aiohttp, one connection pool).

    Build it with :meth:`from_kubeconfig` (a kubeconfig file, or the in-cluster service
    account when ``path`` is None and no default kubeconfig exists) or :meth:`from_url`.
    ``counters`` counts requests by ``(verb, status)`` and ``resource_counters`` by
    ``(verb, resource, status)`` (status 0 = transport error) for metrics and benchmarks.
    A request (or watch) answered ``401 Unauthorized`` is sent once more when
    ``credentials`` give a new header (:meth:`Credentials.refresh`); both answers are
    counted.
    """

    def __init__(
        self,
        base_url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
        configuration: Any = None,
        pool_size: int = 128,
        request_timeout: float = 30.0,
        user_agent: str = "podplacement-controller",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.configuration = configuration
        self.credentials = credentials
        self.counters: Counter[tuple[str, int]] = Counter()
        self.resource_counters: Counter[tuple[str, str, int]] = Counter()
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._pool_size = pool_size
        self._timeout = request_timeout
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None
        self.on_request: Callable[[str, str, int, float], None] | None = None

    # --- construction --------------------------------------------------------------
    @classmethod
    async def from_kubeconfig(
        cls, path: str | None = None, *, context: str | None = None, **kwargs: Any
    ) -> KubeAPI:
        """Connect with a kubeconfig file (``path``; ``None``: ``$KUBECONFIG`` or
        ``~/.kube/config`` when present, else the in-cluster service account), with
        credentials that refresh themselves (:class:`ConfigCredentials`). ``kwargs`` go to
        the constructor (``user_agent``, ``pool_size``, ``request_timeout``).

        Raises:
            kubernetes.config.ConfigException: no usable configuration.
        """
        if path is None:
            path = default_kubeconfig()
        resolved = path

        async def load() -> tuple[Any, Any]:
            return await load_configuration(resolved, context)

        cfg, loader = await load()
        return cls.from_configuration(cfg, loader=loader, load=load, **kwargs)

    @classmethod
    def from_configuration(
        cls, cfg: Any, *, loader: Any = None, load: ConfigLoader | None = None, **kwargs: Any
    ) -> KubeAPI:
        """Build from a filled ``kubernetes.aio.client.Configuration``; ``loader`` and
        ``load`` as :class:`ConfigCredentials` takes them (without ``load`` the credentials
        are not reloaded after a 401).

        Raises:
            OSError / ssl.SSLError: the CA or client certificate files are unusable.
        """
        ctx: ssl.SSLContext | None = None
        if str(cfg.host).startswith("https"):
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert, cadata=cfg.ca_cert_data)
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
            if not cfg.verify_ssl:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        credentials = ConfigCredentials(cfg, loader, load=load)
        return cls(str(cfg.host), ssl_context=ctx, credentials=credentials, configuration=cfg,
                   **kwargs)

    @classmethod
    def from_url(cls, url: str, *, token: str | None = None, **kwargs: Any) -> KubeAPI:
        """Connect to ``url`` (plain HTTP or HTTPS with system trust), optional bearer token."""
        return cls(url, credentials=StaticCredentials(f"Bearer {token}" if token else None),
                   **kwargs)

    # --- plumbing ------------------------------------------------------------------
    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl)
            self._session = aiohttp.ClientSession(
                connector=connector, json_serialize=lambda o: orjson.dumps(o).decode()
            )
        return self._session

    async def _headers(self, content_type: str | None, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": self._user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        if self.credentials is not None:
            token = await self.credentials.authorization()
            if token:
                headers["Authorization"] = token
        return headers

    async def _reauthorize(self, headers: dict[str, str]) -> bool:
        """After a 401: put the refreshed ``Authorization`` into ``headers``; True when there
        is a new one to retry with."""
        if self.credentials is None:
            return False
        fresh = await self.credentials.refresh(headers.get("Authorization"))
        if not fresh or fresh == headers.get("Authorization"):
            return False
        headers["Authorization"] = fresh
        return True

    def _count(self, method: str, path: str, params: Mapping[str, str] | None, status: int,
               started: float) -> None:
        verb = request_verb(method, path, params)
        self.counters[(verb, status)] += 1
        self.resource_counters[(verb, request_resource(path), status)] += 1
        if self.on_request is not None:
            self.on_request(verb, request_resource(path), status, time.monotonic() - started)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
        request_timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON answer.

        ``body`` is JSON-encoded unless it is ``bytes``/``str``. ``content_type`` defaults to
        ``application/json-patch+json`` for a PATCH whose body is a list, merge-patch for a
        PATCH with a dict, and ``application/json`` otherwise.

        A 401 is retried once when the credentials give a new header (a rotated token).

        ``path`` is checked first (:func:`kubeclient.paths.check_path`): a path with a
        ``..``, ``.``, empty or escaped segment, a query string or a control character is
        never sent.

        Raises:
            InvalidPathSegment: ``path`` failed the check; nothing was sent (an
                :class:`ApiError` with status 400).
            ApiError: any non-2xx answer (``status``/``reason``/``message`` from the Status
                body) or a transport error/timeout (``status`` 0, reason ``Transport``), as
                the subclass :func:`api_error` picks (:class:`NotFound`, :class:`Conflict`,
                :class:`Invalid`, :class:`Gone`, :class:`Unavailable`).
        """
        check_path(path)
        if content_type is None and body is not None:
            if method.upper() == "PATCH":
                content_type = JSON_PATCH if isinstance(body, list) else MERGE_PATCH
            else:
                content_type = "application/json"
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = orjson.dumps(body)
        headers = await self._headers(content_type, "application/json")
        for attempt in range(2):
            started = time.monotonic()
            status = 0
            try:
                async with self._get_session().request(
                    method,
                    self.base_url + path,
                    data=data,
                    params=dict(params) if params else None,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=request_timeout or self._timeout),
                ) as resp:
                    status = resp.status
                    raw = await resp.read()
                    reason = resp.reason or ""
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                self._count(method, path, params, 0, started)
                raise api_error(0, "Transport", f"{type(exc).__name__}: {exc}") from exc
            self._count(method, path, params, status, started)
            # A refused token may have been rotated (exec plugin, token file): once more.
            if status != 401 or attempt or not await self._reauthorize(headers):
                break
        decoded: Any = None
        if raw:
            try:
                decoded = orjson.loads(raw)
            except orjson.JSONDecodeError:
                decoded = None
        if status >= 400:
            raise _error(status, reason, raw, decoded)
        return decoded if isinstance(decoded, dict) else {}

    async def watch(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        resource_version: str | None = None,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
        coalesce: float = 0.0,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch a collection; yield each event ``{"type", "object"}`` (ADDED, MODIFIED,
        DELETED, BOOKMARK, ERROR) until the server closes the stream (``timeoutSeconds``).

        ``coalesce`` (seconds, 0: off): after each read, the connection is not read for that
        long (:func:`hold_reading`), so the events the API server sends meanwhile wait in
        the socket and are then read, decrypted and parsed in one wake-up. The API server
        writes each event apart; read one at a time, a 3 kB pod event costs this client
        about 3.5x the CPU of one read with others (``bench/watchread.py``). Each event then
        reaches the caller up to ``coalesce`` seconds later: for watches nobody waits on.
        A read of :data:`~kubeclient.readhold.FULL_READ` bytes or more is not followed by a
        hold (a burst: the reader is behind).

        An ``ERROR`` event (e.g. ``410 Gone`` as a Status object) is yielded, not raised. A
        watch refused with 401 is retried once when the credentials give a new header.

        Raises:
            InvalidPathSegment: ``path`` failed :func:`kubeclient.paths.check_path`; nothing
                was sent.
            ApiError: the watch request itself failed (non-200, transport error).
        """
        check_path(path)
        query: dict[str, str] = dict(params or {})
        query["watch"] = "true"
        query["timeoutSeconds"] = str(timeout_seconds)
        if bookmarks:
            query["allowWatchBookmarks"] = "true"
        if resource_version:
            query["resourceVersion"] = resource_version
        headers = await self._headers(None, "application/json")
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._timeout, sock_read=timeout_seconds + 60
        )
        try:
            for attempt in range(2):
                started = time.monotonic()
                async with self._get_session().get(
                    self.base_url + path, params=query, headers=headers, timeout=timeout
                ) as resp:
                    self._count("GET", path, query, resp.status, started)
                    if resp.status != 200:
                        raw = await resp.read()
                        try:
                            decoded = orjson.loads(raw) if raw else None
                        except orjson.JSONDecodeError:
                            decoded = None
                        error = _error(resp.status, resp.reason or "", raw, decoded)
                    else:
                        transport = resp.connection.transport if resp.connection else None
                        buf = b""
                        async for chunk in resp.content.iter_any():
                            # each event's line is decoded once, where it lies in the
                            # chunk; only a line the chunk ends inside is carried over
                            buf = buf + chunk if buf else chunk
                            start = 0
                            while (nl := buf.find(b"\n", start)) >= 0:
                                line, start = buf[start:nl], nl + 1
                                if line.strip():
                                    yield orjson.loads(line)
                            buf = buf[start:] if start else buf
                            if coalesce > 0 and transport is not None:
                                await hold_reading(transport, coalesce, len(chunk))
                        if buf.strip():
                            yield orjson.loads(buf)
                        return
                # A refused token may have been rotated (exec plugin, token file): once more.
                if error.status != 401 or attempt or not await self._reauthorize(headers):
                    raise error
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise api_error(0, "Transport", f"{type(exc).__name__}: {exc}") from exc

    async def list_pages(
        self, path: str, *, params: Mapping[str, str] | None = None, page_size: int = 500
    ) -> AsyncGenerator[tuple[list[dict[str, Any]], str], None]:
        """List a collection page by page, following ``continue`` tokens: yield each page's
        ``(items, resourceVersion)`` as it arrives (``limit=page_size`` objects at most; the
        last page's resourceVersion is the list's). The page is not kept once handed on,
        so a caller that drops it holds one page at a time.

        Raises:
            InvalidPathSegment: ``path`` failed :func:`kubeclient.paths.check_path`; nothing
                was sent.
            ApiError: a page failed (a 410 on an expired continue token included); the pages
                before it were already yielded.
        """
        check_path(path)
        query: dict[str, str] = dict(params or {})
        query["limit"] = str(page_size)
        rv = ""
        while True:
            page = await self.request("GET", path, params=query)
            items: list[dict[str, Any]] = page.get("items") or []
            meta = page.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or rv)
            token = meta.get("continue")
            del page, meta
            yield items, rv
            del items
            if not token:
                return
            query["continue"] = str(token)

    async def list_all(
        self, path: str, *, params: Mapping[str, str] | None = None, page_size: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        """List a collection, following ``continue`` tokens; return ``(items, resourceVersion)``
        (every page held: :meth:`list_pages` hands them on one by one).

        Raises:
            ApiError: any page failed (a 410 on an expired continue token included).
        """
        items: list[dict[str, Any]] = []
        rv = ""
        async for page, page_rv in self.list_pages(path, params=params, page_size=page_size):
            items.extend(page)
            rv = page_rv
        return items, rv

    async def close(self) -> None:
        """Close the connection pool (idempotent)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> KubeAPI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _error(status: int, reason: str, raw: bytes, decoded: Any) -> ApiError:
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        return api_error(
            status, str(decoded.get("reason") or reason), str(decoded.get("message") or ""), decoded
        )
    text = raw.decode("utf-8", "replace")[:2000]
    return api_error(status, reason, text, decoded if isinstance(decoded, dict) else None)
#: Longest wait between retries while the API server is unreachable or answers 429/5xx:
#: once it is back (``/readyz`` 200), watches resume within this (+ jitter).
UNAVAILABLE_RETRY_SECONDS = 1.0


def next_backoff(backoff: float, exc: BaseException | None, limit: float) -> float:
    """The backoff after a failure: doubled up to ``limit`` seconds, but no higher than
    :data:`UNAVAILABLE_RETRY_SECONDS` while the server is unavailable, so the first other
    error after an outage (a 403 while the restarted server's authorizer warms up) does not
    inherit a long wait."""
    grown = min(limit, backoff * 2)
    return min(grown, UNAVAILABLE_RETRY_SECONDS) if unavailable(exc) else grown


def retry_delay(backoff: float, exc: BaseException | None) -> float:
    """The jittered wait after a failure: ``backoff * [0.5, 1.5)`` seconds, at most
    :data:`UNAVAILABLE_RETRY_SECONDS` when ``exc`` says the API server is down or
    overloaded (a transport failure, 429 or 5xx), so a watch resumes quickly after an
    outage; other errors (403, 404, 422, ...) keep the full backoff."""
    delay = backoff * (0.5 + random.random())
    return min(delay, UNAVAILABLE_RETRY_SECONDS) if unavailable(exc) else delay


