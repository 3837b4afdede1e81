"""localkube: a Kubernetes API server double for tests and demos (not for production).

It speaks the real REST/JSON protocol (CRUD, list/watch with resourceVersions, selectors,
pagination, patch types, optimistic concurrency, CRDs with schema validation, admission
webhooks) well enough for kubectl, the ``kubernetes`` Python client and podplacement's
controller. Behaviour follows recorded kube-apiserver v1.36 exchanges (``shared/reference``).

Public surface: :class:`LocalKube` (threaded or child-process runner), :class:`KubeServer`
and :class:`ServerOptions` (the server itself), :class:`StatusError`.

Not implemented (by design or not yet): authentication and authorization (no RBAC, 401/403);
protobuf and aggregated discovery (JSON only; kubectl falls back); schemas of built-in types
(unknown fields of pods are kept, never warned about or rejected); managedFields (server-side
apply is approximated: no conflicts, fields a manager stops applying are removed by path);
controllers (no scheduler, kubelet, garbage collector or namespace controller: pods stay
Pending, a bound pod's graceful delete waits for ``gracePeriodSeconds=0``, ownerReferences do
not cascade, a deleted namespace and its objects go at once); CEL beyond
``self.<path> == '<literal>'``; conversion webhooks; waiting for a future resourceVersion
(lists answer 504 at once).
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
