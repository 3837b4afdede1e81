"""The controller's one pod deleter: a pod is deleted so that the ReplicaSet, StatefulSet or
Job controlling it creates a new one, which is then placed. Used by the exec-format-error
remedy (``spec.plugins.execFormatErrorMonitor.deleteFailedPods``,
:mod:`controller.execformatmonitor`) and the escape repair
(``spec.plugins.placementEscapes.deleteUnfitPods``, :mod:`controller.escapemonitor`); which
pod, whose owner (:func:`rules.learn.remedy_owner`) and how often are their own
pure rules.

The DELETE carries the pod's UID as a precondition (``DeleteOptions.preconditions.uid``,
Kubernetes API conventions): a pod of the same name created since (a StatefulSet's
replacement) is never deleted by mistake. The pod's own ``terminationGracePeriodSeconds``
applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from podplacement.kubeclient import ApiError, Conflict, KubeAPI, NotFound, pod_path

#: ``(method, path template)`` of the request sent here (in :data:`controller.app.API_REQUESTS`).
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}"),
)

#: :attr:`DeleteResult.status` values.
DELETED = "deleted"
GONE = "gone"
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """What became of one delete: ``status`` :data:`DELETED`; :data:`GONE` (no pod of that
    name, or one with another UID: nothing to do); :data:`REFUSED` (403: the grant was
    taken away; ``message`` holds the server's words)."""

    status: str
    message: str = ""


async def delete_pod(api: KubeAPI, namespace: str, name: str, uid: str) -> DeleteResult:
    """Delete the pod ``namespace/name`` if its UID is still ``uid``.

    Returns:
        A :class:`DeleteResult`.

    Raises:
        ApiError: any other failure (the caller's queue retries after its backoff).
    """
    try:
        await api.request(
            "DELETE", pod_path(namespace, name),
            body={"apiVersion": "v1", "kind": "DeleteOptions",
                  "preconditions": {"uid": uid}})
    except NotFound:
        return DeleteResult(GONE)
    except Conflict:
        # 409: the UID in the precondition does not match: a new pod of that name
        return DeleteResult(GONE, "another pod of that name exists now")
    except ApiError as exc:
        if exc.status != 403:
            raise
        return DeleteResult(REFUSED, str(exc)[:200])
    return DeleteResult(DELETED)
