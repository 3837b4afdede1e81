"""A raw-JSON Kubernetes client shared by the controller, the webhook and the tools.

:class:`KubeAPI` talks to the API server with aiohttp and plain dicts; its credentials come
from the one kubeconfig / in-cluster loader (:mod:`kubeclient.credentials`) and refresh
themselves (exec plugins, token files, a retry after 401). :class:`Informer` is the one
list+watch loop (with or without a cache). Errors form one family rooted in
:class:`ApiError` (:mod:`kubeclient.errors`). Every API path is built by
:mod:`kubeclient.paths` from checked segments (:func:`resource_path`), and :class:`KubeAPI`
sends no path that fails :func:`check_path`. This package imports nothing else of ours.
"""

from podplacement.kubeclient._kubeconfig import kubeconfig_contexts
from podplacement.kubeclient.client import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    UNAVAILABLE_RETRY_SECONDS,
    KubeAPI,
    KubeRequester,
    next_backoff,
    object_key,
    request_resource,
    request_verb,
    retry_delay,
)
from podplacement.kubeclient.credentials import (
    ConfigCredentials,
    Credentials,
    StaticCredentials,
    default_kubeconfig,
    load_configuration,
)
from podplacement.kubeclient.errors import (
    ApiError,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    Unavailable,
    api_error,
    unavailable,
)
from podplacement.kubeclient.informer import EventHandler, Informer
from podplacement.kubeclient.paths import (
    InvalidPathSegment,
    check_object_name,
    check_path,
    check_segment,
    group_path,
    namespace_path,
    pod_path,
    resource_path,
    secret_path,
)

__all__ = [
    "APPLY_PATCH",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "UNAVAILABLE_RETRY_SECONDS",
    "ApiError",
    "ConfigCredentials",
    "Conflict",
    "Credentials",
    "EventHandler",
    "Gone",
    "Informer",
    "Invalid",
    "InvalidPathSegment",
    "KubeAPI",
    "KubeRequester",
    "NotFound",
    "StaticCredentials",
    "Unavailable",
    "api_error",
    "check_object_name",
    "check_path",
    "check_segment",
    "default_kubeconfig",
    "group_path",
    "kubeconfig_contexts",
    "load_configuration",
    "namespace_path",
    "next_backoff",
    "object_key",
    "pod_path",
    "request_resource",
    "request_verb",
    "resource_path",
    "retry_delay",
    "secret_path",
    "unavailable",
]
