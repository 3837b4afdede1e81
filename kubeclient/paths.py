"""The one place Kubernetes API paths are built: every variable segment is checked first.

A name pasted into a URL path is an attack when it is ``..``, holds a ``/`` or a ``%``
escape: the HTTP client resolves ``/api/v1/namespaces/a/secrets/../../b/secrets/x`` to
another namespace's Secret. client-go refuses such names before any request
(``k8s.io/apimachinery/pkg/api/validation/path``: ``IsValidPathSegmentName`` rejects ``.``,
``..`` and any name holding ``/`` or ``%``); :func:`check_segment` applies those rules and
also refuses ``?``, ``#``, ``\\``, whitespace and control characters, an empty segment and
one longer than :data:`MAX_SEGMENT_LENGTH`. :func:`resource_path` builds every path the
product sends from (group, version, resource, namespace, name, subresource);
:func:`check_path` re-checks a whole path and is what :class:`kubeclient.KubeAPI` runs
before it sends anything. :func:`check_object_name` is the stricter check the API server
applies to most object names (a DNS-1123 subdomain), for callers whose names come from
users (a pod's ``imagePullSecrets``): :func:`secret_path` uses it.

Errors are :class:`InvalidPathSegment`, both a :class:`kubeclient.ApiError` (status 400,
never sent: callers that handle API failures handle it) and a :class:`ValueError`.
"""

from __future__ import annotations

import re

from podplacement.kubeclient.errors import ApiError

#: Longest path segment accepted: the longest object name Kubernetes allows (a DNS-1123
#: subdomain, 253 characters; Kubernetes API conventions, "Names").
MAX_SEGMENT_LENGTH = 253

#: Longest object name :func:`check_object_name` accepts (DNS-1123 subdomain, RFC 1123).
MAX_NAME_LENGTH = 253

#: A DNS-1123 subdomain as ``k8s.io/apimachinery/pkg/util/validation.IsDNS1123Subdomain``
#: checks it: lowercase alphanumeric labels of ``-`` inside, joined by ``.``.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

#: Characters no path segment may hold: the path separator, the escape and the start of a
#: query or fragment (client-go refuses ``/`` and ``%``; the rest never occur in a name).
_FORBIDDEN = frozenset("/%?#\\")

#: Shown of a refused value at most (the value is hostile input; logs stay one line).
_SHOWN = 64


class InvalidPathSegment(ApiError, ValueError):
    """A path segment (a namespace, a name, ...) or an object name that must not reach a
    URL; raised before any request is sent.

    An :class:`ApiError` with ``status`` 400 and ``reason`` ``InvalidPathSegment`` (so code
    handling API failures handles it; it is never :func:`kubeclient.unavailable`) and a
    :class:`ValueError` (so pure callers may catch that).

    Attributes:
        what: the role of the value (``namespace``, ``name``, ``Secret name``, ``segment``).
        value: the refused value, as given.
        problem: why it was refused, one short phrase.
    """

    def __init__(self, what: str, value: str, problem: str) -> None:
        shown = repr(value[:_SHOWN] + ("..." if len(value) > _SHOWN else ""))
        message = f"{what} {shown} {problem}"
        ApiError.__init__(self, 400, "InvalidPathSegment", message)
        self.what = what
        self.value = value
        self.problem = problem

    def __str__(self) -> str:
        return self.message


def _segment_problem(value: object) -> str | None:
    """Why ``value`` may not be a path segment, or None when it may."""
    if not isinstance(value, str):
        return "is not a string"
    if not value:
        return "is empty"
    if value in (".", ".."):
        return "may not be '.' or '..'"
    if len(value) > MAX_SEGMENT_LENGTH:
        return f"is longer than {MAX_SEGMENT_LENGTH} characters"
    for ch in value:
        if ch in _FORBIDDEN:
            return f"may not contain {ch!r}"
        if ch.isspace() or not ch.isprintable():
            return "may not contain whitespace or control characters"
    return None


def check_segment(value: str, what: str = "segment") -> str:
    """``value`` when it may be one segment of an API path; the rules of client-go's
    ``IsValidPathSegmentName`` (not ``.`` or ``..``, no ``/``, no ``%``) and also no ``?``,
    ``#``, ``\\``, whitespace or control character, not empty, at most
    :data:`MAX_SEGMENT_LENGTH` characters.

    Args:
        value: the segment (a namespace, a name, a resource, ...).
        what: its role, for the error message.

    Raises:
        InvalidPathSegment: the value may not be a segment.
    """
    problem = _segment_problem(value)
    if problem is not None:
        raise InvalidPathSegment(what, str(value), problem)
    return value


def check_object_name(value: str, what: str = "name") -> str:
    """``value`` when it is a valid name for most Kubernetes objects (Secrets, ConfigMaps,
    pods, ...): a DNS-1123 subdomain, lowercase alphanumerics, ``-`` and ``.``, starting
    and ending alphanumeric, at most :data:`MAX_NAME_LENGTH` characters, as the API server
    checks it (``IsDNS1123Subdomain``, Kubernetes API conventions "Names"). Every such
    name is also a valid path segment (``.`` and ``..`` are not DNS-1123 subdomains).

    Args:
        value: the name.
        what: its role, for the error message (``Secret name``).

    Raises:
        InvalidPathSegment: the name is not a DNS-1123 subdomain.
    """
    check_segment(value, what)
    if len(value) > MAX_NAME_LENGTH or _DNS1123_SUBDOMAIN.fullmatch(value) is None:
        raise InvalidPathSegment(
            what, value, "is not a valid name (lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit)")
    return value


def resource_path(
    group: str,
    version: str,
    resource: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The API path of a collection or an object, every variable segment checked
    (:func:`check_segment`): ``/api/{version}`` for the core group (``group`` empty), else
    ``/apis/{group}/{version}``, then ``/namespaces/{namespace}`` when namespaced, then
    ``/{resource}``, ``/{name}`` and ``/{subresource}`` (Kubernetes API concepts,
    "Resource URIs"). A namespace object itself is ``resource_path("", "v1", "namespaces",
    name=ns)``.

    Args:
        group: the API group, empty for the core group (``""``, ``apps``,
            ``podplacement.io``).
        version: the group's version (``v1``, ``v1beta1``).
        resource: the plural resource name (``pods``, ``secrets``).
        namespace: the namespace of a namespaced resource; None for cluster-scoped ones
            and for lists across all namespaces.
        name: the object's name; None for the collection.
        subresource: ``status``, ``log``, ...; needs ``name``.

    Returns:
        The path, starting with ``/``, without a query string.

    Raises:
        InvalidPathSegment: a segment is not acceptable, or ``subresource`` without
            ``name``.
    """
    parts = ["apis", check_segment(group, "API group")] if group else ["api"]
    parts.append(check_segment(version, "API version"))
    if namespace is not None:
        parts += ["namespaces", check_segment(namespace, "namespace")]
    parts.append(check_segment(resource, "resource"))
    if name is not None:
        parts.append(check_segment(name, "name"))
    if subresource is not None:
        if name is None:
            raise InvalidPathSegment("subresource", subresource, "needs an object name")
        parts.append(check_segment(subresource, "subresource"))
    return "/" + "/".join(parts)


def group_path(group: str, version: str) -> str:
    """The discovery path of an API group version (``/apis/{group}/{version}``, or
    ``/api/{version}`` for the core group), segments checked.

    Raises:
        InvalidPathSegment: a segment is not acceptable.
    """
    if not group:
        return "/api/" + check_segment(version, "API version")
    return "/".join(("", "apis", check_segment(group, "API group"),
                     check_segment(version, "API version")))


def pod_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    """``/api/v1/namespaces/{namespace}/pods[/{name}[/{subresource}]]``, checked as
    :func:`resource_path` checks it.

    Raises:
        InvalidPathSegment: a segment is not acceptable.
    """
    return resource_path("", "v1", "pods", namespace=namespace, name=name,
                         subresource=subresource)


def namespace_path(namespace: str) -> str:
    """``/api/v1/namespaces/{namespace}`` (the Namespace object), checked.

    Raises:
        InvalidPathSegment: the namespace is not an acceptable segment.
    """
    return resource_path("", "v1", "namespaces", name=namespace)


def secret_path(namespace: str, name: str) -> str:
    """``/api/v1/namespaces/{namespace}/secrets/{name}`` for a Secret named by a user (a
    pod's ``imagePullSecrets``): the name must be a valid Secret name
    (:func:`check_object_name`, a DNS-1123 subdomain), the namespace a path segment. The
    path :class:`imageinspect.PullSecretReader` is given.

    Raises:
        InvalidPathSegment: the name is not a valid Secret name, or the namespace not an
            acceptable segment.
    """
    check_object_name(name, "Secret name")
    return resource_path("", "v1", "secrets", namespace=namespace, name=name)


def check_path(path: str) -> str:
    """``path`` when every segment of it is acceptable (:func:`check_segment`): it starts
    with ``/``, holds no query string or fragment, no empty, ``.`` or ``..`` segment and
    no ``%`` escape. :class:`kubeclient.KubeAPI` checks each path with this before sending
    it (query parameters travel apart, in ``params``), so a caller that pasted a name into
    a path without :func:`resource_path` sends nothing.

    Raises:
        InvalidPathSegment: the path is not acceptable; nothing was sent.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidPathSegment("path", str(path), "must start with '/'")
    if path == "/":
        return path
    for segment in path[1:].split("/"):
        check_segment(segment, "path segment")
    return path
