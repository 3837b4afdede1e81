"""A list+watch informer: client-go's Reflector and Store, trimmed.

:class:`Informer` lists a collection, then watches from the list's resourceVersion with
bookmarks, resumes from the last seen resourceVersion after a watch ends, relists on
``410 Gone``, backs off (bounded, exponential, jittered) on errors, and hands every change to
its handlers. By default it keeps a local cache keyed ``namespace/name`` (or ``name`` for
cluster-scoped objects); with ``keep_cache=False`` it keeps nothing per object (memory), at
the price of the deletions a relist cannot see (see :class:`Informer`). A ``transform``
(client-go's ``TransformFunc``) trims every object before it is cached or handed on, and a
(re)list reads its pages one at a time, so it never holds every untrimmed object at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from podplacement.kubeclient.client import KubeAPI, next_backoff, object_key, retry_delay
from podplacement.kubeclient.errors import ApiError

log = logging.getLogger(__name__)

#: ``handler(event_type, obj, old)``: ``event_type`` ADDED / MODIFIED / DELETED, ``obj`` the
#: object (for DELETED its last state), ``old`` the cached previous state (None without one).
EventHandler = Callable[[str, dict[str, Any], "dict[str, Any] | None"], None]

#: ``transform(obj) -> obj``: what the informer keeps and hands on instead of ``obj`` (a
#: listed item or a watch event's object, as the API server sent it). client-go's
#: ``cache.TransformFunc`` (k8s.io/client-go/tools/cache, ``SharedIndexInformer.SetTransform``).
Transform = Callable[[dict[str, Any]], dict[str, Any]]


class Informer:
    """List+watch reflector with a local cache (client-go's Reflector + Store, trimmed).

    ``path`` is a collection path (``/api/v1/pods``); ``params`` go to both list and watch
    (``labelSelector``, ``fieldSelector``, e.g. ``metadata.name=NAME`` for one object).
    Handlers are called synchronously as ``handler(event_type, obj, old)`` with
    ``event_type`` ADDED / MODIFIED / DELETED (a relist emits the differences); they must not
    block. ``cache`` maps :func:`~kubeclient.client.object_key` to the latest object.
    ``synced`` is set after the first successful list (or when the resource is absent and
    ``tolerate_absent`` is true: a missing CRD gives an empty cache and the informer keeps
    retrying with backoff until it appears). ``lists`` counts successful lists.

    With ``keep_cache=False`` nothing is kept per object: ``cache`` stays empty, :meth:`get`
    returns None, a watch event is handed on as the server typed it (``old`` None), and a
    (re)list emits ADDED for every object listed. A relist cannot emit DELETED for objects
    that vanished while the watch was down (there is no cache to compare with), and an
    object listed again is ADDED again, so handlers must be idempotent and tolerate missed
    deletions. :attr:`listing` is true while a (re)list hands its objects on, so a handler
    can tell an object listed (it may be old) from one the watch reports as it changes.

    A (re)list reads the collection ``page_size`` objects at a time (``limit`` and
    ``continue``). Without a cache each page's objects are handed on as the page arrives
    and dropped, so a relist holds one page, not the collection: :attr:`listing` is true
    from the first page to the end of the last, :attr:`resource_version` and ``synced`` are
    set after the last page (its resourceVersion is the list's), and a list that fails after
    some pages has handed those on (they are ADDED again by the next list). With a cache the
    cache is replaced, and the differences emitted, after the last page, as before.

    ``coalesce`` (seconds, 0: off) holds the watch's reads that long after each read
    (:meth:`KubeAPI.watch`): events come in batches, up to that much later, for less CPU
    per event. For watches whose handlers nobody waits on.

    ``transform`` (client-go's ``cache.TransformFunc``, set with
    ``SharedIndexInformer.SetTransform``) is applied to every object, listed items and the
    objects of ADDED / MODIFIED / DELETED watch events (not bookmarks), before it is
    cached or handed to the handlers; a relist transforms each page as it arrives, so only
    one page of untransformed objects is held at a time. It should keep
    ``metadata.name``, ``namespace`` and ``resourceVersion`` (the cache's key and its
    change detection), must be cheap and pure, and must not raise: an exception fails the
    list (retried with backoff) or is logged for a watch event, whose object is then
    handed on untransformed. Handlers and :meth:`get` see only the transformed objects.

    Backoff: ``min_backoff`` doubling up to ``max_backoff`` seconds, with jitter, reset
    after a successful list or a watch that delivered events or stayed open; while the API
    server is unreachable or answers 429/5xx the wait is at most
    :data:`UNAVAILABLE_RETRY_SECONDS` (:func:`retry_delay`).
    """

    def __init__(
        self,
        api: KubeAPI,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        watch_timeout: int = 300,
        min_backoff: float = 0.2,
        max_backoff: float = 30.0,
        tolerate_absent: bool = False,
        page_size: int = 500,
        keep_cache: bool = True,
        transform: Transform | None = None,
        coalesce: float = 0.0,
    ) -> None:
        self.api = api
        self.coalesce = coalesce
        self.path = path
        self.params: dict[str, str] = dict(params or {})
        self.name = name or path
        self.cache: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.lists = 0
        self.absent = False
        self.keep_cache = keep_cache
        self.transform = transform
        #: True while :meth:`relist` calls the handlers.
        self.listing = False
        self._handlers: list[EventHandler] = []
        self._watch_timeout = watch_timeout
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._tolerate_absent = tolerate_absent
        self._page_size = page_size
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def add_handler(self, handler: EventHandler) -> None:
        """Register ``handler(event_type, obj, old)``; called for every change after this."""
        self._handlers.append(handler)

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached object for ``namespace/name`` (or ``name``), or None."""
        return self.cache.get(key)

    def start(self) -> asyncio.Task[None]:
        """Start the list+watch loop as a task (idempotent)."""
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.create_task(self.run(), name=f"informer {self.name}")
        return self._task

    async def stop(self) -> None:
        """Stop the loop and wait for it."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _emit(self, event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        for handler in self._handlers:
            try:
                handler(event_type, obj, old)
            except Exception:
                log.exception("informer %s: handler failed on %s", self.name, event_type)

    async def relist(self) -> None:
        """List the collection, replace the cache and emit the differences (without a
        cache: emit ADDED for every object listed, page by page as the pages arrive).

        Raises:
            ApiError: the list failed (without a cache, the objects of the pages read
                before the failure were already handed on).
            Exception: whatever ``transform`` raised.
        """
        transform = self.transform
        rv = ""
        if self.keep_cache:
            items: list[dict[str, Any]] = []
            async with contextlib.aclosing(self._pages()) as pages:
                async for page, page_rv in pages:
                    items.extend(map(transform, page) if transform is not None else page)
                    rv = page_rv
                    del page
            self._list_done(rv)
            self.listing = True
            try:
                self._replace(items)
            finally:
                self.listing = False
        else:
            self.listing = True
            try:
                async with contextlib.aclosing(self._pages()) as pages:
                    async for page, page_rv in pages:
                        for obj in page:
                            self._emit("ADDED", obj if transform is None else transform(obj),
                                       None)
                        rv = page_rv
                        del page
            finally:
                self.listing = False
            self._list_done(rv)
        self.synced.set()

    def _pages(self) -> AsyncGenerator[tuple[list[dict[str, Any]], str], None]:
        return self.api.list_pages(self.path, params=self.params, page_size=self._page_size)

    def _list_done(self, rv: str) -> None:
        self.lists += 1
        self.absent = False
        self.resource_version = rv

    def _replace(self, items: list[dict[str, Any]]) -> None:
        """Replace the cache with a list's ``items`` and emit the differences."""
        fresh = {object_key(o): o for o in items}
        old_cache = self.cache
        self.cache = fresh
        for key, old in old_cache.items():
            if key not in fresh:
                self._emit("DELETED", old, old)
        for key, obj in fresh.items():
            prev = old_cache.get(key)
            if prev is None:
                self._emit("ADDED", obj, None)
            elif _rv(prev) != _rv(obj):
                self._emit("MODIFIED", obj, prev)

    def _apply(self, event: Mapping[str, Any]) -> None:
        etype = str(event.get("type"))
        obj = event.get("object") or {}
        rv = _rv(obj)
        if rv:
            self.resource_version = rv
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK (its resourceVersion taken above), or unknown
        if self.transform is not None:
            try:
                obj = self.transform(obj)
            except Exception:
                log.exception("informer %s: transform failed on %s; object kept whole",
                              self.name, etype)
        if not self.keep_cache:
            self._emit(etype, obj, None)
            return
        key = object_key(obj)
        old = self.cache.get(key)
        if etype == "DELETED":
            self.cache.pop(key, None)
            self._emit("DELETED", obj, old)
        else:
            self.cache[key] = obj
            self._emit("MODIFIED" if old is not None else "ADDED", obj, old)

    async def run(self) -> None:
        """The reflector loop; runs until :meth:`stop` (or cancellation)."""
        backoff = self._min_backoff
        # A restarted informer resumes from the last resourceVersion it saw (relisting on
        # 410 Gone); a new one lists first.
        need_list = not self.resource_version or not self.synced.is_set()
        while not self._stopping:
            listing = need_list
            gone = False
            failure: BaseException | None = None
            try:
                if need_list:
                    await self.relist()
                    need_list = listing = False
                    backoff = self._min_backoff
                got_events = False
                watch_started = time.monotonic()
                async for event in self.api.watch(
                    self.path,
                    params=self.params,
                    resource_version=self.resource_version,
                    timeout_seconds=self._watch_timeout,
                    coalesce=self.coalesce,
                ):
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        if status.get("code") == 410:
                            log.info("informer %s: resourceVersion too old, relisting", self.name)
                            gone = True
                        else:
                            log.warning("informer %s: watch error %s", self.name,
                                        status.get("message"))
                        need_list = True
                        break
                    got_events = True
                    self._apply(event)
                if got_events or time.monotonic() - watch_started >= 1.0:
                    backoff = self._min_backoff  # the watch worked: start over
                if got_events or gone or time.monotonic() - watch_started >= 1.0:
                    continue
                # A watch that ends at once without events: back off instead of spinning.
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.gone and not listing:
                    log.info("informer %s: resourceVersion too old, relisting", self.name)
                    need_list = True
                    continue
                if exc.not_found and self._tolerate_absent:
                    if not self.absent:
                        log.info("informer %s: resource absent; will retry", self.name)
                    self.absent = True
                    old_cache, self.cache = self.cache, {}
                    for obj in old_cache.values():
                        self._emit("DELETED", obj, obj)
                    self.resource_version = ""
                    self.synced.set()
                    need_list = True
                else:
                    # After a failed watch, resume from the last resourceVersion; after a
                    # failed list, list again.
                    log.warning("informer %s: %s", self.name, exc)
                    need_list = need_list or listing
                    failure = exc
            except Exception:
                log.exception("informer %s: unexpected error", self.name)
                need_list = True
            delay = retry_delay(backoff, failure)
            backoff = next_backoff(backoff, failure, self._max_backoff)
            await asyncio.sleep(delay)


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
