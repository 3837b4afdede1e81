"""The requests every job of the lifecycle makes the same way: a GET that reads 404 as
absent (:func:`get_or_none`), create-or-revert-drift of an object we own
(:func:`apply_object`), and the finalizer patch with its retry on a lost race
(:func:`patch_finalizer`, as client-go's ``retry.RetryOnConflict``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from podplacement.kubeclient import JSON_PATCH, ApiError, KubeRequester, NotFound, api_error
from podplacement.rules import ownership

log = logging.getLogger(__name__)

#: Attempts of :func:`patch_finalizer` (one read-modify-write each) before it gives up.
FINALIZER_ATTEMPTS = 3


class Applied(NamedTuple):
    """What :func:`apply_object` did (``created``, ``unchanged``, ``updated``) and the object
    as the server returned it."""

    action: str
    obj: dict[str, Any]


async def get_or_none(api: KubeRequester, path: str) -> dict[str, Any] | None:
    """GET ``path``; None when it is absent (404).

    Raises:
        ApiError: any other failure.
    """
    try:
        return await api.request("GET", path)
    except NotFound:
        return None


async def apply_object(
    api: KubeRequester, collection: str, path: str, desired: dict[str, Any], *,
    drifted: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
    update_body: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]],
) -> Applied:
    """Create ``desired`` at ``collection`` (a 409 means another writer was first: read it at
    ``path``), or PUT ``update_body(live, desired)`` when ``drifted(live, desired)``; the
    action taken (``created``, ``unchanged``, ``updated``) and the object as the server
    returned it.

    Raises:
        ApiError: a read or write failed.
    """
    name, kind = desired["metadata"]["name"], desired["kind"]
    live = await get_or_none(api, path)
    if live is None:
        try:
            created = await api.request("POST", collection, body=desired)
            log.info("created %s %s", kind, name)
            return Applied("created", created if isinstance(created, dict) else {})
        except ApiError as exc:
            if exc.status != 409:
                raise
            live = await get_or_none(api, path)
            if live is None:
                raise
    if not drifted(live, desired):
        return Applied("unchanged", live)
    updated = await api.request("PUT", path, body=update_body(live, desired))
    log.info("reverted drift of %s %s", kind, name)
    return Applied("updated", updated if isinstance(updated, dict) else {})


def replacement(live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The PUT body of a policy, binding, params object or uninstall RBAC object: ``desired``
    with the live metadata (resourceVersion precondition, foreign fields) and ours merged
    in."""
    meta = dict(live.get("metadata") or {})
    meta.pop("managedFields", None)
    meta.update({k: v for k, v in desired["metadata"].items() if k != "name"})
    return {**desired, "metadata": meta}


async def patch_finalizer(api: KubeRequester, path: str, obj: dict[str, Any], *,
                          add: bool) -> dict[str, Any] | None:
    """Add or remove :data:`rules.ownership.GUARD_FINALIZER` on the object at
    ``path`` (``obj``: as last read), re-reading after a lost race (409/422), at most
    :data:`FINALIZER_ATTEMPTS` times. Returns the object as written, ``obj`` when nothing was
    to change, or None when it is gone.

    Raises:
        ApiError: another failure, or :data:`FINALIZER_ATTEMPTS` lost races in a row.
    """
    for _ in range(FINALIZER_ATTEMPTS):
        ops = (ownership.add_finalizer_ops(obj) if add
               else ownership.remove_finalizer_ops(obj))
        if ops is None:
            return obj
        try:
            written: dict[str, Any] = await api.request(
                "PATCH", path, body=ops, content_type=JSON_PATCH)
            return written
        except NotFound:
            return None
        except ApiError as exc:
            if exc.status not in (409, 422):
                raise
            fresh = await get_or_none(api, path)
            if fresh is None:
                return None
            obj = fresh
    raise api_error(409, "Conflict",
                    f"{path}: finalizer not changed after {FINALIZER_ATTEMPTS} attempts")
