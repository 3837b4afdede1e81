"""Publish the :class:`~rules.admit.imageparams.ParamsStore` as the params object.

The admission policy's params object, the ``ImagePlatformCatalog`` named ``cluster`` in the
product's own namespace (``deploy/crds/imageplatformcatalog.yaml``; docs/how-it-decides.md,
"Placement inside the API server"), is written at most about once a second, batched, never once
per pod, and paced by its size: every write is a replace of the whole object, which costs the
API server CPU in proportion to it (about 100 ms for a full-size 650 KB map on kube-apiserver
v1.36.2), so after a write of N bytes the next one waits N /
:data:`DEFAULT_WRITE_BYTES_PER_SECOND` seconds (about 6 s at full size, 1 s up to 100 KB).
While a full catalog takes one new image after another (a tag per CI run), its writes then cost
the API server under 2% of a core instead of about 10%.

:class:`ParamsWriter` is a reconciler of the controller's work queue for the key
:data:`PARAMS_KEY`, with no loop of its own: each pass (a *tick*) expires old tag references
and, when the store changed, replaces the whole object (a map with removed keys needs a
replace, not a merge) with the live ``resourceVersion``; it creates the object when it does
not exist. Each tick asks to run again ``min_interval`` after its start (or the pacing after
a large write), whether or not anything was recorded, so an expired tag reference leaves the
object within one tick of its TTL with no pod to trigger it; a tick that comes early (the
key was queued again) writes nothing and asks for the rest of the interval. A lost race
(409) re-reads the object and writes on the next tick; any other failure is logged, counted
and raised, and the queue retries after its backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from podplacement.kubeclient import ApiError, Conflict, KubeRequester, NotFound, resource_path
from podplacement.rules.admit.imageparams import ParamsStore, flat_catalog
from podplacement.rules.config import (
    API_VERSION,
    DEFAULT_NAMESPACE,
    GROUP,
    PARAMS_KIND,
    PARAMS_NAME,
    PARAMS_PLURAL,
    VERSION,
)
from podplacement.rules.tolerations import ArchTaint

log = logging.getLogger(__name__)

#: Bytes of the catalog (:attr:`ParamsStore.json_size`) per second of pacing between two
#: writes (module docstring).
DEFAULT_WRITE_BYTES_PER_SECOND = 100_000.0

#: The collection and the object, templates of the namespace (the product's own: the
#: namespace controller deletes the object as soon as that namespace is being deleted, which
#: pauses the admission policy, see :mod:`rules.admit.admissionpolicy`).
PARAMS_COLLECTION_PATH = resource_path(GROUP, VERSION, PARAMS_PLURAL, namespace="{namespace}")
PARAMS_PATH = f"{PARAMS_COLLECTION_PATH}/{PARAMS_NAME}"


def params_collection_path(namespace: str) -> str:
    """The ImagePlatformCatalog collection of ``namespace`` (the product's namespace),
    checked (:func:`kubeclient.resource_path`; :data:`PARAMS_COLLECTION_PATH` is its
    template).

    Raises:
        InvalidPathSegment: ``namespace`` is not an acceptable path segment.
    """
    return resource_path(GROUP, VERSION, PARAMS_PLURAL, namespace=namespace)


def params_path(namespace: str) -> str:
    """The params object ``ImagePlatformCatalog/cluster`` in ``namespace``, checked.

    Raises:
        InvalidPathSegment: ``namespace`` is not an acceptable path segment.
    """
    return resource_path(GROUP, VERSION, PARAMS_PLURAL, namespace=namespace, name=PARAMS_NAME)


#: The work-queue key of the params writer (a pod's key is ``namespace/name/uid``).
PARAMS_KEY = "params:cluster"

#: Every request this module sends (method, path), for the RBAC check of
#: ``tests/deploy/test_manifests.py`` (``deploy/base/rbac/controller.yaml``).
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", PARAMS_PATH),
    ("POST", PARAMS_COLLECTION_PATH),
    ("PUT", PARAMS_PATH),
)

#: ``writes`` counter labels: the object was created / replaced; a write lost a race (409,
#: or the object vanished: 404) and the object is re-read; any other failure.
WRITE_CREATED = "created"
WRITE_UPDATED = "updated"
WRITE_CONFLICT = "conflict"
WRITE_ERROR = "error"
#: :meth:`ParamsWriter.flush` results besides the write labels: nothing to write.
WRITE_CLEAN = "clean"


class ParamsWriteError(Exception):
    """A tick could not read or write the params object (already logged and counted in
    the ``error`` write result); the work queue retries :data:`PARAMS_KEY` after its
    backoff."""


class GaugeLike(Protocol):
    """What the writer needs of a gauge (``prometheus_client.Gauge``)."""

    def set(self, value: float) -> None:
        """Set the gauge."""
        ...


class CounterChildLike(Protocol):
    """One labelled child of a counter (``prometheus_client.Counter(...).labels(...)``)."""

    def inc(self, amount: float = 1) -> None:
        """Add ``amount``."""
        ...


class CounterLike(Protocol):
    """What the writer needs of a counter with one label (``prometheus_client.Counter``)."""

    def labels(self, *labelvalues: str) -> CounterChildLike:
        """The child of these label values."""
        ...


class ParamsMetrics(Protocol):
    """The metrics :class:`ParamsWriter` updates (all optional as a whole).

    Attributes:
        entries: gauge, the number of entries in the last successfully written object.
        writes: counter by one label, the write result: ``created``, ``updated``,
            ``conflict`` (409, or 404 on replace: the object is re-read), ``error`` (the
            write, or the read that must precede it, failed otherwise: transport error,
            timeout, 5xx, 403, 422).
    """

    @property
    def entries(self) -> GaugeLike:
        """Entries in the published object."""
        ...

    @property
    def writes(self) -> CounterLike:
        """Writes of the params object by result."""
        ...


class ParamsWriter:
    """Writes a :class:`ParamsStore` to ``ImagePlatformCatalog/cluster``, batched.

    Args:
        api: the Kubernetes client (:class:`kubeclient.KubeAPI`, or any
            :class:`kubeclient.KubeRequester`).
        store: the entries to publish; the controller records into it (no lock: all in one
            event loop, and no store method awaits).
        min_interval: seconds between the starts of two ticks of :meth:`reconcile`, so at
            most one write per ``min_interval`` (a re-read after a lost race shares its
            tick).
        write_bytes_per_second: after a tick that wrote N bytes of catalog, the next
            tick starts ``max(min_interval, N / write_bytes_per_second)`` seconds after it.
        metrics: optional :class:`ParamsMetrics`.
        clock: the monotonic clock that paces the ticks (``time.monotonic``).
        wall_clock: the clock of the store's times, unix seconds (``time.time``): the
            learned times it publishes must mean the same after a restart.
        namespace: the product's namespace, where the object lives.

    Raises:
        ValueError: ``min_interval`` or ``write_bytes_per_second`` is not positive.
    """

    def __init__(
        self,
        api: KubeRequester,
        store: ParamsStore,
        *,
        min_interval: float = 1.0,
        write_bytes_per_second: float = DEFAULT_WRITE_BYTES_PER_SECOND,
        metrics: ParamsMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        if min_interval <= 0:
            raise ValueError(f"min_interval must be positive, not {min_interval}")
        if write_bytes_per_second <= 0:
            raise ValueError("write_bytes_per_second must be positive, not "
                             f"{write_bytes_per_second}")
        self.api = api
        self.store = store
        self.min_interval = min_interval
        self.write_bytes_per_second = write_bytes_per_second
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.namespace = namespace
        self.path = params_path(namespace)
        self.collection_path = params_collection_path(namespace)
        # The live object's metadata (with its resourceVersion) as last read or written;
        # None while it does not exist. Valid only while _known is true.
        self._meta: dict[str, Any] | None = None
        self._known = False
        self._adopted = False
        #: Set once the live object was read (its entries adopted) or found absent: from
        #: then on the store holds what the object holds.
        self.adopted = asyncio.Event()
        # reconcile() and flush() may overlap; one write at a time.
        self._lock = asyncio.Lock()
        self._stopped = False
        # self.clock() before which no tick starts (set by the last tick that did not fail)
        self._next_tick: float | None = None
        self._last_error = ""
        #: The architecture taints to publish in ``spec.architectureTaints``, read at every
        #: tick (:meth:`rules.tolerations.ArchitectureTaints.known` of the config and the
        #: Nodes); None: left as the store has them.
        self.taints_source: Callable[[], Sequence[ArchTaint]] | None = None

    # --- public -----------------------------------------------------------------------
    async def load(self) -> int:
        """Read the live object, if any, and adopt its entries into the store with their
        learned times (:meth:`ParamsStore.adopt`). Only the first successful read adopts:
        after that, the store is the source of truth and later reads only refresh the
        ``resourceVersion``. :meth:`reconcile` does this itself when it was not done.

        Returns:
            The number of entries adopted (0 when the object does not exist yet).

        Raises:
            ApiError: the GET failed (other than 404).
        """
        async with self._lock:
            return await self._read()

    async def flush(self) -> str:
        """Write now when the store changed (after expiring old tag references): one write,
        plus one re-read and one more write when the first lost a race (409).
        Never raises for API or connection errors (logged and counted).

        Returns:
            ``created``, ``updated``, ``clean`` (nothing to write), ``conflict`` (lost the
            race twice) or ``error``.
        """
        result = await self._tick()
        if result == WRITE_CONFLICT:
            result = await self._tick()
        return result

    def start(self) -> None:
        """Let :meth:`reconcile` write (a new writer may write from the start)."""
        self._stopped = False

    async def stop(self) -> None:
        """Stop writing: wait for a write in flight, after which every :meth:`reconcile`
        is done at once without a request until :meth:`start` (the ordered uninstall and
        the stand-down call this before they delete the object, which a tick would create
        again). :meth:`flush` still writes when called."""
        self._stopped = True
        async with self._lock:
            pass

    @property
    def stopped(self) -> bool:
        """True between :meth:`stop` and :meth:`start`."""
        return self._stopped

    async def reconcile(self, key: str = PARAMS_KEY) -> float | None:
        """One tick for the work-queue key :data:`PARAMS_KEY`: expire, and write when the
        store changed (a lost race re-reads the object for the next tick).

        Returns:
            Seconds until the next tick: ``min_interval`` after this one's start, or the
            pacing after a large write (the rest of the interval, with no request, when it
            comes early); None while stopped.

        Raises:
            ParamsWriteError: the read or the write failed otherwise (transport error,
                timeout, 5xx, 403, 422); the queue retries after its backoff.
        """
        if self._stopped:
            return None
        started = self.clock()
        if self._next_tick is not None and started < self._next_tick:
            return self._next_tick - started
        # After a failed tick the queue's backoff paces the retries (an early tick answered
        # with a delay would reset the queue's failure count).
        self._next_tick = None
        result = await self._tick()
        if result == WRITE_ERROR:
            raise ParamsWriteError(f"params object {PARAMS_NAME}: {self._last_error}")
        interval = self.min_interval
        if result in (WRITE_CREATED, WRITE_UPDATED):
            interval = max(interval, self.store.json_size / self.write_bytes_per_second)
        self._next_tick = started + interval
        return None if self._stopped else max(0.0, self._next_tick - self.clock())

    # --- one tick ---------------------------------------------------------------------
    async def _tick(self) -> str:
        async with self._lock:
            if not self._known:
                try:
                    await self._read()
                except ApiError as exc:
                    log.warning("params object %s: read failed (will retry): %s",
                                PARAMS_NAME, exc)
                    self._last_error = f"read failed: {exc}"
                    self._count(WRITE_ERROR)
                    return WRITE_ERROR
            self.store.expire(self.wall_clock())
            if self.taints_source is not None:
                self.store.set_arch_taints(self.taints_source())
            if not self.store.dirty:
                return WRITE_CLEAN
            return await self._write()

    async def _read(self) -> int:
        try:
            obj = await self.api.request("GET", self.path)
        except NotFound:
            self._meta, self._known = None, True
            self._adopted = True
            self.adopted.set()
            return 0
        self._meta, self._known = _metadata(obj), True
        if self._adopted:
            return 0
        self._adopted = True
        self.adopted.set()
        spec = obj.get("spec") or {}
        if not isinstance(spec, dict):
            spec = {}
        # The dense catalog, or the flat one of the release before (an in-place upgrade
        # keeps the catalog; the next write is in the dense layout).
        images, _learned = flat_catalog(spec)
        adopted = self.store.adopt_spec(spec, self.wall_clock())
        entries = (obj.get("status") or {}).get("entries")
        # spec.fresh is never adopted: its digests were confirmed by the writer's previous
        # owner, which no longer checks them (rules.freshness); a non-empty one is
        # written again (empty until this controller confirms its own).
        if (entries != len(images) or len(images) != adopted
                or (spec.get("policies") or {}) != self.store.policies()
                or (spec.get("fresh") or {}) != self.store.fresh()
                or (spec.get("architectureTaints") or []) != self.store.arch_taints()):
            self.store.mark_dirty()
        log.info("params object %s: adopted %d of %d entries", PARAMS_NAME, adopted,
                 len(images))
        return adopted

    async def _write(self) -> str:
        version = self.store.version
        catalog = self.store.catalog()
        body: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": PARAMS_KIND,
            "metadata": (dict(self._meta) if self._meta is not None
                         else {"name": PARAMS_NAME, "namespace": self.namespace}),
            "spec": {**catalog,
                     "fresh": self.store.fresh(), "policies": self.store.policies(),
                     "architectureTaints": self.store.arch_taints()},
            "status": {"entries": len(self.store)},
        }
        creating = self._meta is None
        try:
            if creating:
                obj = await self.api.request("POST", self.collection_path, body=body)
            else:
                obj = await self.api.request("PUT", self.path, body=body)
        except (Conflict, NotFound) as exc:
            # Someone else created, changed or deleted it: re-read on the next tick.
            log.info("params object %s: %s; re-reading", PARAMS_NAME, exc)
            self._known = False
            self._count(WRITE_CONFLICT)
            return WRITE_CONFLICT
        except ApiError as exc:
            log.warning("params object %s: write failed (will retry): %s", PARAMS_NAME, exc)
            self._last_error = f"write failed: {exc}"
            self._count(WRITE_ERROR)
            return WRITE_ERROR
        self._meta = _metadata(obj)
        self.store.mark_clean(version)
        result = WRITE_CREATED if creating else WRITE_UPDATED
        self._count(result)
        if self.metrics is not None:
            self.metrics.entries.set(len(self.store))
        return result

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.writes.labels(result).inc()


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The metadata to send back on replace: everything the server gave (name, uid,
    resourceVersion, labels, annotations, ...) except managedFields, which the server keeps
    when a request omits them."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    return meta
