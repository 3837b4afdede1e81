"""The :class:`ApiError` family: what a failed Kubernetes API request raises.

One base class, small subclasses per status, as kopf's ``errors`` module has; chosen from the
HTTP answer by :func:`api_error`. :func:`unavailable` says whether an error means the API
server is down or overloaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """A non-2xx answer from the API server, or a transport failure (``status`` 0).

    The base of a small family, as kopf's ``errors`` module has: :func:`api_error` picks
    :class:`NotFound`, :class:`Conflict`, :class:`Invalid`, :class:`Gone` or
    :class:`Unavailable` from the status (and, for 422, the body), so callers may write
    ``except NotFound:``. Statuses outside those (400, 401, 403, 405, ...) stay a plain
    ``ApiError``. The :attr:`not_found`, :attr:`conflict` and :attr:`gone` properties keep
    working on every instance and agree with the subclasses.

    Attributes:
        status: the HTTP status code (0 when no response arrived).
        reason: the Status ``reason`` (``NotFound``, ``Conflict``, ``Invalid``, ...) or the
            HTTP reason phrase when the body is not a Status.
        message: the Status ``message`` (or the raw text body).
        body: the decoded JSON body, ``None`` when the body was not JSON.
    """

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @property
    def not_found(self) -> bool:
        """True for 404."""
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """True for a write that lost a race: 409, or the 422 a failed JSON-patch ``test``
        gets (the real server answers a failed ``test`` with 422 and a generic message,
        ``reference/optimistic-concurrency.json``)."""
        if self.status == 409:
            return True
        return self.status == 422 and not _causes(self.body)

    @property
    def gone(self) -> bool:
        """True for 410 (resourceVersion too old)."""
        return self.status == 410


class NotFound(ApiError):
    """404: the object (or the resource) does not exist.

    Kubernetes API conventions, Status reason ``NotFound``; RFC 9110 section 15.5.5.
    """


class Conflict(ApiError):
    """A write that lost a race: 409, or the 422 without ``details.causes`` that a failed
    JSON-patch ``test`` operation gets (exactly :attr:`ApiError.conflict`).

    Kubernetes API conventions, Status reason ``Conflict`` (an update with a stale
    ``resourceVersion``); RFC 9110 section 15.5.10 (409); RFC 6902 section 5 (a failed
    ``test`` is an error; the API server answers it with 422 and no causes).
    """


class Invalid(ApiError):
    """422 with ``details.causes``: the object failed validation (a field error list).

    Kubernetes API conventions, Status reason ``Invalid``; RFC 9110 section 15.5.21 (422).
    """


class Gone(ApiError):
    """410: the requested ``resourceVersion`` is too old (a list or watch must relist).

    Kubernetes API conventions, Status reason ``Gone`` (``Expired`` for a continue token);
    RFC 9110 section 15.5.11.
    """


class Unavailable(ApiError):
    """The API server is down or overloaded: a transport failure (``status`` 0, no answer),
    429 Too Many Requests or a 5xx (500, 502, 503, 504) — what :func:`unavailable` tests.

    RFC 9110 section 15.6 (5xx), RFC 6585 section 4 (429); Kubernetes API conventions,
    Status reasons ``TooManyRequests``, ``InternalError``, ``ServiceUnavailable``,
    ``Timeout``.
    """


def _causes(body: Mapping[str, Any] | None) -> bool:
    return bool(((body or {}).get("details") or {}).get("causes"))


def api_error(
    status: int, reason: str, message: str, body: dict[str, Any] | None = None
) -> ApiError:
    """The :class:`ApiError` subclass for an HTTP answer (or a transport failure, ``status``
    0): 404 :class:`NotFound`, 409 :class:`Conflict`, 422 :class:`Invalid` when the Status
    lists ``details.causes`` else :class:`Conflict` (a failed JSON-patch ``test``), 410
    :class:`Gone`, 0/429/500/502/503/504 :class:`Unavailable`; any other status the base
    :class:`ApiError`. Rules: Kubernetes API conventions (Status reasons) and RFC 9110."""
    cls: type[ApiError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 422:
        cls = Invalid if _causes(body) else Conflict
    elif status == 410:
        cls = Gone
    elif status in _UNAVAILABLE:
        cls = Unavailable
    else:
        cls = ApiError
    return cls(status, reason, message, body)


_UNAVAILABLE = frozenset({0, 429, 500, 502, 503, 504})


def unavailable(exc: BaseException | None) -> bool:
    """True when ``exc`` says the API server is down or overloaded: a transport failure
    (``ApiError`` status 0), 429 or 502/503/504/500."""
    return isinstance(exc, ApiError) and exc.status in _UNAVAILABLE
