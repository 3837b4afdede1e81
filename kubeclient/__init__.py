"""A raw-JSON Kubernetes client shared by the controller, the webhook and the tools.

:class:`KubeAPI` talks to the API server with aiohttp and plain dicts; its credentials come
from the one kubeconfig / in-cluster loader (:mod:`kubeclient.credentials`) and refresh
themselves (exec plugins, token files, a retry after 401). :class:`Informer` is the one
list+watch loop (with or without a cache). Errors form one family rooted in
:class:`ApiError`. This package imports nothing else of ours.
"""

from podplacement.kubeclient._kubeconfig import kubeconfig_contexts
from podplacement.kubeclient.client import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    UNAVAILABLE_RETRY_SECONDS,
    ApiError,
    Conflict,
    Gone,
    Invalid,
    KubeAPI,
    KubeRequester,
    NotFound,
    Unavailable,
    api_error,
    next_backoff,
    object_key,
    request_resource,
    request_verb,
    retry_delay,
    unavailable,
)
from podplacement.kubeclient.credentials import (
    ConfigCredentials,
    Credentials,
    StaticCredentials,
    default_kubeconfig,
    load_configuration,
)
from podplacement.kubeclient.informer import EventHandler, Informer

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
    "KubeAPI",
    "KubeRequester",
    "NotFound",
    "StaticCredentials",
    "Unavailable",
    "api_error",
    "default_kubeconfig",
    "kubeconfig_contexts",
    "load_configuration",
    "next_backoff",
    "object_key",
    "request_resource",
    "request_verb",
    "retry_delay",
    "unavailable",
]
