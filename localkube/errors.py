"""``metav1.Status`` failures as the real kube-apiserver sends them.

Every failing request in localkube raises :class:`StatusError`; the HTTP layer turns it into
the JSON ``Status`` body with the same ``code``, ``reason``, ``message`` and ``details`` that
kube-apiserver v1.36 returns (see ``shared/reference/errors.json``).
"""

from __future__ import annotations

from typing import Any


class StatusError(Exception):
    """A request failure carrying a ``metav1.Status`` body.

    Args:
        code: HTTP status code (e.g. 404, 409, 422).
        reason: the Status ``reason`` (``NotFound``, ``AlreadyExists``, ``Conflict``,
            ``Invalid``, ``BadRequest``, ``UnsupportedMediaType``, ``Gone``, ...).
        message: the Status ``message``, worded as the real server words it.
        details: the Status ``details`` (``name``, ``group``, ``kind``, ``causes``), or None.
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        #: ListMeta of the Status (e.g. a fresh ``continue`` token on 410 Expired).
        self.metadata = metadata or {}
        #: Extra response headers (e.g. ``Retry-After`` on 504).
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The ``Status`` object to send as the response body."""
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.metadata),
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            out["reason"] = self.reason
        if self.details is not None:
            out["details"] = self.details
        out["code"] = self.code
        return out


def not_found(group: str, plural: str, name: str) -> StatusError:
    """404 ``NotFound``: ``pods "x" not found`` (``group`` may be empty for core)."""
    resource = f"{plural}.{group}" if group else plural
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return StatusError(404, "NotFound", f'{resource} "{name}" not found', details)


def already_exists(group: str, plural: str, name: str) -> StatusError:
    """409 ``AlreadyExists``: ``pods "x" already exists``."""
    resource = f"{plural}.{group}" if group else plural
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return StatusError(409, "AlreadyExists", f'{resource} "{name}" already exists', details)


def conflict(group: str, plural: str, name: str) -> StatusError:
    """409 ``Conflict`` for a stale resourceVersion, worded as the real server words it."""
    resource = f"{plural}.{group}" if group else plural
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified;'
        " please apply your changes to the latest version and try again",
        details,
    )


def invalid(
    kind: str, name: str, causes: list[dict[str, str]], group: str = ""
) -> StatusError:
    """422 ``Invalid`` with field causes (``{"reason", "message", "field"}`` each).

    The message is ``<Kind> "<name>" is invalid: <field>: <msg>`` for one cause, and the
    bracketed list ``[a, b]`` for several, as apimachinery's ``NewInvalid`` formats it.
    """
    parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {"name": name, "kind": kind, "causes": causes}
    if group:
        details["group"] = group
    return StatusError(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> StatusError:
    """400 ``BadRequest`` with the given message."""
    return StatusError(400, "BadRequest", message)


def patch_apply_failed() -> StatusError:
    """422 for a JSON patch that does not apply (failed ``test``, bad path, unknown op).

    The real server answers with a generic message and empty details, never 409
    (``shared/reference/optimistic-concurrency.json``).
    """
    return StatusError(
        422, "Invalid", "the server rejected our request due to an error in our request", {}
    )


def method_not_allowed() -> StatusError:
    """405 ``MethodNotAllowed`` (PUT/PATCH on a collection, POST on an item)."""
    return StatusError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def resource_not_found() -> StatusError:
    """404 for a resource the group/version does not serve (``errors.json``)."""
    return StatusError(404, "NotFound", "the server could not find the requested resource", {})


def expired(message: str, metadata: dict[str, Any] | None = None) -> StatusError:
    """410 ``Expired`` (too old resourceVersion / continue token)."""
    return StatusError(410, "Expired", message, metadata=metadata)


def internal(message: str, reason: str = "") -> StatusError:
    """500 with the given message (no reason unless given), e.g. a non-numeric RV."""
    return StatusError(500, reason, message)
