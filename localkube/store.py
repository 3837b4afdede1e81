"""In-memory object store with one global resourceVersion counter and a bounded event history.

Objects are plain dicts keyed by storage key (``(group, plural)``) and ``(namespace, name)``.
Stored dicts are never mutated after they are stored: every write stores a new dict, so
readers, watch history and in-flight responses can share them without copies. The history
(a bounded deque of :class:`WatchEvent`) serves watches from a resourceVersion and exact-RV
lists; when it is trimmed, older resourceVersions become "too old" (410 Gone), as with the real
server's watch cache. Single-threaded: every method runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

StorageKey = tuple[str, str]
ObjectKey = tuple[str, str]


@dataclass
class WatchEvent:
    """One change: ``type`` is ``ADDED``/``MODIFIED``/``DELETED``; ``prev`` is the object
    before the change (None for ADDED). ``cache`` memoises the serialised object per
    apiVersion."""

    rv: int
    skey: StorageKey
    type: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None
    cache: dict[str, bytes] = field(default_factory=dict)


class Watcher:
    """A live watch: receives every event for ``skey`` (the HTTP handler filters them)."""

    def __init__(self, skey: StorageKey) -> None:
        self.skey = skey
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()


class Store:
    """Objects, the resourceVersion counter, event history and live watchers.

    Args:
        history_size: how many events to keep for watch replay / exact-RV lists.
    """

    def __init__(self, history_size: int = 10000) -> None:
        self.rv = 1
        self.objects: dict[StorageKey, dict[ObjectKey, dict[str, Any]]] = {}
        self.history: deque[WatchEvent] = deque(maxlen=max(1, history_size))
        #: Every RV <= this has been trimmed from the history.
        self.oldest_rv = 1
        self.watchers: dict[StorageKey, set[Watcher]] = {}

    # --- reads ---------------------------------------------------------------------------
    def get(self, skey: StorageKey, ns: str, name: str) -> dict[str, Any] | None:
        """The stored object or None."""
        return self.objects.get(skey, {}).get((ns, name))

    def items(self, skey: StorageKey, ns: str | None = None) -> list[dict[str, Any]]:
        """Objects of a resource (all namespaces when ``ns`` is None), sorted by key."""
        bucket = self.objects.get(skey, {})
        if ns is None:
            keys = sorted(bucket)
        else:
            keys = sorted(k for k in bucket if k[0] == ns)
        return [bucket[k] for k in keys]

    def count(self, skey: StorageKey) -> int:
        """Number of stored objects of a resource."""
        return len(self.objects.get(skey, {}))

    # --- writes --------------------------------------------------------------------------
    def next_rv(self) -> int:
        """Allocate the next resourceVersion."""
        self.rv += 1
        return self.rv

    def put(self, skey: StorageKey, obj: dict[str, Any], rv: int) -> None:
        """Store ``obj`` (its metadata.resourceVersion already set to ``rv``) and emit
        ADDED or MODIFIED."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        bucket = self.objects.setdefault(skey, {})
        prev = bucket.get(key)
        bucket[key] = obj
        self._emit(WatchEvent(rv, skey, "MODIFIED" if prev is not None else "ADDED", obj, prev))

    def remove(self, skey: StorageKey, obj: dict[str, Any], rv: int) -> None:
        """Remove the object stored under ``obj``'s key and emit DELETED carrying ``obj``
        (whose resourceVersion the caller set to ``rv``)."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        prev = self.objects.get(skey, {}).pop(key, None)
        self._emit(WatchEvent(rv, skey, "DELETED", obj, prev))

    def drop_resource(self, skey: StorageKey) -> None:
        """Forget every object of a resource (its CRD was deleted) and end its watches."""
        self.objects.pop(skey, None)
        for w in self.watchers.pop(skey, set()):
            w.queue.put_nowait(None)

    def _emit(self, ev: WatchEvent) -> None:
        if len(self.history) == self.history.maxlen:
            self.oldest_rv = self.history[0].rv
        self.history.append(ev)
        for w in self.watchers.get(ev.skey, ()):
            w.queue.put_nowait(ev)

    # --- watch support -------------------------------------------------------------------
    def subscribe(self, skey: StorageKey) -> Watcher:
        """Register a watcher for live events."""
        w = Watcher(skey)
        self.watchers.setdefault(skey, set()).add(w)
        return w

    def unsubscribe(self, w: Watcher) -> None:
        """Remove a watcher."""
        self.watchers.get(w.skey, set()).discard(w)

    def close_all_watchers(self) -> None:
        """End every live watch (server shutdown)."""
        for ws in self.watchers.values():
            for w in ws:
                w.queue.put_nowait(None)

    def too_old(self, rv: int) -> bool:
        """True when events after ``rv`` are no longer all in the history."""
        return rv < self.oldest_rv

    def since(self, skey: StorageKey, rv: int) -> Iterator[WatchEvent]:
        """History events of ``skey`` with resourceVersion > ``rv``, oldest first."""
        for ev in self.history:
            if ev.rv > rv and ev.skey == skey:
                yield ev

    def snapshot(
        self, skey: StorageKey, rv: int, keep: Callable[[ObjectKey], bool]
    ) -> list[dict[str, Any]]:
        """The objects of ``skey`` as they were at resourceVersion ``rv`` (rv must not be
        too old), rebuilt by undoing newer history events; sorted by key."""
        state = {k: v for k, v in self.objects.get(skey, {}).items() if keep(k)}
        for ev in reversed(self.history):
            if ev.rv <= rv:
                break
            if ev.skey != skey:
                continue
            meta = ev.obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            if not keep(key):
                continue
            if ev.prev is None:
                state.pop(key, None)
            else:
                state[key] = ev.prev
        return [state[k] for k in sorted(state)]
