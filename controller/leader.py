"""Lease leader election for the controller.

Built on ``kubernetes.aio.leaderelection`` (the algorithm of client-go's leader election:
get the Lease, create it when absent, renew it by PUT with the read resourceVersion so that
a racing candidate gets 409; a follower takes over when the record has not changed for
``lease_duration`` seconds; a leader that cannot renew within ``renew_deadline`` steps down).
:class:`LeaderElector` adds what the library leaves out or gets wrong:

* The library's ``LeaseLock`` does not work with kubernetes 37 (see :class:`_RawLeaseLock`):
  its ``create`` raises a pydantic ValidationError before sending anything, and its times
  are re-serialised without the MicroTime fraction when the microseconds are 0. We plug a
  lock that speaks raw JSON through :class:`kubeclient.KubeAPI` into the library's
  ``LeaderElection`` loop.
* :meth:`LeaderElector.run` keeps campaigning: after losing the lease (or after an
  unexpected error, e.g. the API server unreachable, which the library lets escape) the
  process becomes a follower again instead of returning.
* :meth:`LeaderElector.stop` ends the campaign and, when leading, first runs
  ``on_stopped_leading`` and then *releases* the lease (holder cleared, duration 1 s, as
  client-go's ``ReleaseOnCancel``), so a standby takes over after one ``retry_period``
  instead of a whole ``lease_duration``.
* ``on_stopped_leading`` runs exactly once per leadership term, however it ended; the
  ``on_started_leading`` task is cancelled when the term ends (the library does that only on
  a clean loss). The callback can read :attr:`LeaderElector.shutting_down` to tell a
  graceful stop from a lost lease.

No double processing: a leader that cannot renew steps down after ``renew_deadline``, which
must be shorter than ``lease_duration`` (checked), before any follower may take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.leaderelection.electionconfig import Config
from kubernetes.aio.leaderelection.leaderelection import LeaderElection
from kubernetes.aio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.aio.leaderelection.resourcelock.baselock import BaseLock

from podplacement.kubeclient import ApiError, KubeRequester, resource_path
from podplacement.rules.config import LEASE_NAME

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = LEASE_NAME
LEASE_COLLECTION_PATH = resource_path("coordination.k8s.io", "v1", "leases",
                                      namespace="{namespace}")
LEASE_PATH = LEASE_COLLECTION_PATH + "/{name}"


def lease_path(namespace: str, name: str | None = None) -> str:
    """The Lease ``namespace/name`` (coordination.k8s.io/v1), or the namespace's Lease
    collection when ``name`` is None; checked (:func:`kubeclient.resource_path`).
    :data:`LEASE_PATH` and :data:`LEASE_COLLECTION_PATH` are their templates.

    Raises:
        InvalidPathSegment: a segment is not acceptable.
    """
    return resource_path("coordination.k8s.io", "v1", "leases", namespace=namespace, name=name)
#: Requests the election sends (for the RBAC check in tests/deploy): get, create, update.
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", LEASE_PATH),
    ("POST", LEASE_COLLECTION_PATH),
    ("PUT", LEASE_PATH),
)

Callback = Callable[[], Awaitable[None]]


def micro_time(t: dt.datetime) -> str:
    """Format a time as a Kubernetes ``MicroTime``: UTC, six fractional digits, ``Z``
    (Go layout ``2006-01-02T15:04:05.000000Z07:00``)."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """``<hostname>_<8 hex>``: unique per process, recognisable per pod."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class _RawLeaseLock(BaseLock):  # type: ignore[misc,unused-ignore]
    """The library's lock interface over raw JSON (:class:`kubeclient.KubeAPI`).

    Replaces ``kubernetes.aio``'s ``LeaseLock``, which cannot work with kubernetes 37: its
    ``create`` passes ``pretty=True`` where the validated API method wants a string (a
    pydantic ValidationError before any request is sent: the Lease is never created), and
    its times go through the model, which re-serialises them with ``isoformat()`` (no
    fraction when the microseconds are 0, which the API server rejects with 400,
    ``reference/leases.json``). Here the Lease is plain JSON: ``acquireTime``/``renewTime``
    are always :func:`micro_time`, ``acquireTime`` is kept across renewals and
    ``leaseTransitions`` counts takeovers. Updates are PUTs carrying the resourceVersion of
    the last read, so a racing candidate gets 409 and loses.
    """

    def __init__(self, api: KubeRequester, name: str, namespace: str, identity: str) -> None:
        super().__init__(name, namespace, identity)
        self.api = api
        self.path = lease_path(namespace, name)
        self.lease: dict[str, Any] | None = None

    async def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        """``(True, record)`` when the Lease exists; ``(False, ApiException)`` otherwise (the
        library creates the Lease only when that exception's body says code 404)."""
        try:
            lease = await self.api.request("GET", self.path)
        except ApiError as exc:
            error = ApiException(status=exc.status, reason=exc.reason)
            error.body = json.dumps(exc.body or {"code": exc.status, "message": exc.message})
            return False, error
        self.lease = lease
        spec = lease.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        return True, LeaderElectionRecord(
            spec.get("holderIdentity") or None,
            str(duration) if duration else None,
            spec.get("acquireTime") or None,
            spec.get("renewTime") or None,
        )

    def _spec(self, record: LeaderElectionRecord, current: Mapping[str, Any] | None
              ) -> dict[str, Any]:
        now = micro_time(dt.datetime.now(dt.UTC))
        current = current or {}
        holder = record.holder_identity
        renewal = bool(current) and current.get("holderIdentity") == holder
        transitions = int(current.get("leaseTransitions") or 0)
        if current and not renewal:
            transitions += 1
        return {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, int(float(record.lease_duration or 1))),
            "acquireTime": (current.get("acquireTime") if renewal else None) or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def create(self, name: str, namespace: str, election_record: LeaderElectionRecord
                     ) -> bool:
        """POST the Lease; False when it failed (e.g. 409: another candidate was first)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": self._spec(election_record, None),
        }
        try:
            self.lease = await self.api.request(
                "POST", lease_path(namespace), body=body
            )
        except ApiError as exc:
            log.info("could not create lease %s/%s: %s", namespace, name, exc)
            return False
        return True

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord
                     ) -> bool:
        """PUT the Lease with the last read resourceVersion; False on any error (409 when
        another candidate wrote it since)."""
        if self.lease is None:
            return False
        lease = dict(self.lease)
        meta = dict(lease.get("metadata") or {})
        meta.pop("managedFields", None)
        lease["metadata"] = meta
        lease["spec"] = self._spec(updated_record, self.lease.get("spec") or {})
        try:
            self.lease = await self.api.request("PUT", self.path, body=lease)
        except ApiError as exc:
            log.info("could not update lease %s/%s: %s", namespace, name, exc)
            return False
        return True

    async def release(self) -> bool:
        """Give the lease up if we hold it (holder cleared, duration 1 s). True on success."""
        try:
            lease = await self.api.request("GET", self.path)
        except ApiError:
            return False
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return False
        spec.pop("holderIdentity", None)
        spec["leaseDurationSeconds"] = 1
        spec["renewTime"] = micro_time(dt.datetime.now(dt.UTC))
        lease["spec"] = spec
        (lease.get("metadata") or {}).pop("managedFields", None)
        try:
            await self.api.request("PUT", self.path, body=lease)
        except ApiError as exc:
            log.info("lease release failed (%s); it expires by itself", exc)
            return False
        return True


class LeaderElector:
    """Campaign for the Lease ``namespace/name``; run callbacks while leading.

    Args:
        api: a :class:`kubeclient.KubeAPI` (or anything with its ``request``).
        namespace: the Lease's namespace (the controller's own).
        name: the Lease name.
        identity: this candidate's holder identity (default :func:`default_identity`).
        lease_duration: seconds a follower waits on an unchanged record before taking over.
        renew_deadline: seconds a leader keeps retrying to renew before it steps down.
        retry_period: seconds between attempts.
        on_started_leading: coroutine function run as a task when this process becomes the
            leader; cancelled when the term ends.
        on_stopped_leading: coroutine function run once at the end of each term.

    Raises:
        ValueError: the library's constraints (``lease_duration > renew_deadline >
            1.2 * retry_period``, each >= 1 second).
    """

    def __init__(
        self,
        api: KubeRequester,
        namespace: str,
        name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        lease_duration: int = 15,
        renew_deadline: float = 10,
        retry_period: float = 2,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration = int(lease_duration)
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.shutting_down = False
        self.terms = 0
        self._leading = asyncio.Event()
        self._lock = _RawLeaseLock(api, name, namespace, self.identity)
        self._lead_task: asyncio.Task[Any] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._in_term = False
        self._ending: asyncio.Future[None] | None = None
        # Validate now rather than on the first campaign.
        self._config()

    @property
    def is_leader(self) -> bool:
        """True while this process holds the lease (between start and end of a term)."""
        return self._leading.is_set()

    async def wait_leading(self) -> None:
        """Return once this process is the leader."""
        await self._leading.wait()

    def _config(self) -> Config:
        return Config(
            self._lock,
            self.lease_duration,
            self.renew_deadline,
            self.retry_period,
            self._started,
            self._library_stopped,
        )

    async def _started(self) -> None:
        if self.shutting_down:
            # stop() came between winning the lease and this task starting: do not lead
            return
        self._lead_task = asyncio.current_task()
        self._in_term = True
        self.terms += 1
        self._leading.set()
        log.info("%s became the leader of lease %s/%s", self.identity, self.namespace, self.name)
        if self.on_started_leading is not None:
            try:
                await self.on_started_leading()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("on_started_leading failed")

    async def _library_stopped(self) -> None:
        # The library calls this after a clean loss; _end_term (in run's finally) does the
        # work for every kind of ending, exactly once.
        return None

    def _end_term_once(self) -> asyncio.Future[None]:
        """The running end-of-term task, or a new one: stop() waits for the same
        ``on_stopped_leading`` that the campaign started (e.g. the webhook configuration is
        deleted) before it releases the lease."""
        if self._ending is None or self._ending.done():
            self._ending = asyncio.ensure_future(self._end_term())
        return self._ending

    async def _end_term(self) -> None:
        task, self._lead_task = self._lead_task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if not self._in_term:
            return
        self._in_term = False
        self._leading.clear()
        log.info("%s stopped leading (shutting down: %s)", self.identity, self.shutting_down)
        if self.on_stopped_leading is not None:
            try:
                await self.on_stopped_leading()
            except Exception:
                log.exception("on_stopped_leading failed")

    async def _campaign(self) -> None:
        while not self.shutting_down:
            try:
                await LeaderElection(self._config()).run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("leader election error: %s", exc)
            finally:
                await asyncio.shield(self._end_term_once())
            if not self.shutting_down:
                await asyncio.sleep(self.retry_period)

    async def run(self) -> None:
        """Campaign until :meth:`stop`; returns after stop (or raises CancelledError)."""
        self.shutting_down = False
        self._loop_task = asyncio.create_task(self._campaign(), name=f"leader {self.identity}")
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop_task

    async def stop(self, *, release: bool = True) -> None:
        """End the campaign. When leading: ``on_stopped_leading`` runs (with
        :attr:`shutting_down` true), then the lease is released (unless ``release`` is
        false, which simulates a crash: followers wait ``lease_duration``)."""
        self.shutting_down = True
        was_leader = self._in_term
        task = self._loop_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._end_term_once()
        if was_leader and release and await self._lock.release():
            log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)
