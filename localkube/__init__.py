"""localkube: a Kubernetes API server double for tests and demos (not for production).

It speaks the real REST/JSON protocol (CRUD, list/watch with resourceVersions, selectors,
pagination, patch types, optimistic concurrency, CRDs with schema validation, admission
webhooks) well enough for kubectl, the ``kubernetes`` Python client and podplacement's
controller. Behaviour follows recorded kube-apiserver v1.36 exchanges (``shared/reference``).

Public surface: :class:`LocalKube` (threaded runner), :class:`KubeServer` and
:class:`ServerOptions` (the server itself), :class:`StatusError`.
"""

from localkube.errors import StatusError
from localkube.runner import LocalKube
from localkube.server import Fault, KubeServer, RequestRecord, ServerOptions, build_app

__all__ = [
    "Fault",
    "KubeServer",
    "LocalKube",
    "RequestRecord",
    "ServerOptions",
    "StatusError",
    "build_app",
]
