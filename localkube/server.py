"""The localkube HTTP server: Kubernetes REST/JSON semantics on top of :mod:`localkube.store`.

One ``aiohttp.web`` application with a catch-all handler that routes ``/api``, ``/apis``,
discovery, ``/version`` and ``/openapi``, and for each resource implements create, get,
list (label/field selectors, pagination, resourceVersion semantics), watch (replay from a
resourceVersion, synthetic ADDED, bookmarks, selector enter/leave, 410 for too-old RVs),
update (optimistic concurrency, status subresource), patch (via :mod:`localkube.patch`),
delete (preconditions, graceful pod deletion, finalizers) and delete-collection. Pods go
through :mod:`localkube.podrules`; every CREATE goes through :mod:`localkube.admission`.
Behaviour and error bodies follow the kube-apiserver v1.36 recordings in
``shared/reference/``. Not for production: no authentication, no authorization.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import datetime as dt
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import orjson
import yaml
from aiohttp import web

import localkube.builtin as builtin
import localkube.podrules as podrules
import localkube.schema as schema
from localkube.admission import Admission
from localkube.errors import (
    StatusError,
    already_exists,
    bad_request,
    conflict,
    expired,
    internal,
    invalid,
    method_not_allowed,
    not_found,
    resource_not_found,
)
from localkube.patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    apply_patch,
    unsupported_media_type,
)
from localkube.resources import CR_VERBS, ResourceType, builtin_resources, resource_from_crd
from localkube.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)
from localkube.store import Store, WatchEvent

log = logging.getLogger("localkube")

#: The user every request is attributed to (localkube has no authentication).
ADMIN_USER: dict[str, Any] = {
    "username": "kubernetes-admin",
    "groups": ["system:masters", "system:authenticated"],
}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
#: Types whose metadata.generation the server maintains.
_GENERATION_KINDS = frozenset({("", "pods"), ("admissionregistration.k8s.io",
                                             "mutatingwebhookconfigurations"),
                               ("apiextensions.k8s.io", "customresourcedefinitions"),
                               ("apps", "deployments")})
#: Built-in types whose DELETE returns the object rather than a Status.
_RETURN_DELETED = frozenset({("", "pods"), ("", "namespaces"),
                             ("apiextensions.k8s.io", "customresourcedefinitions")})
#: Built-in types that allow a PUT without resourceVersion (custom resources do not).
_VERSION_INFO = {
    "major": "1",
    "minor": "36",
    "emulationMajor": "1",
    "emulationMinor": "36",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "35",
    "gitVersion": "v1.36.2-localkube",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-11-22T00:00:00Z",
    "goVersion": "go1.26.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}


_PLAIN_APPLY = frozenset({("", "services")})
_PATCH_TYPES = frozenset({JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH})
_VERB_KEY = web.RequestKey("localkube_verb", str)


def now_rfc3339(offset: float = 0.0) -> str:
    """UTC time as ``2026-11-22T05:51:39Z`` (second precision, as metav1.Time)."""
    t = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def _clone(obj: Any) -> Any:
    """A deep copy of JSON data (orjson round trip: much faster than copy.deepcopy)."""
    return orjson.loads(orjson.dumps(obj))


@dataclass
class RequestRecord:
    """One served request (for benchmarks counting API calls per verb)."""

    method: str
    path: str
    content_type: str
    status: int
    verb: str


@dataclass
class Fault:
    """An injected failure: answer ``count`` matching requests with ``status``.

    Matching is on HTTP method (None = any; ``"PATCH|PUT"`` for several; ``"WRITE"`` for
    POST, PUT, PATCH and DELETE), resource plural, optional name and namespace.
    """

    status: int
    count: int
    method: str | None = None
    plural: str | None = None
    name: str | None = None
    namespace: str | None = None
    reason: str = "Conflict"
    message: str | None = None


@dataclass
class Route:
    """A parsed request path."""

    rt: ResourceType
    version: str
    namespace: str | None
    name: str | None
    sub: str | None


@dataclass
class ServerOptions:
    """Tunables: ``bookmark_interval`` (seconds between BOOKMARK events),
    ``history_size`` (events kept for watch replay), ``max_watch_seconds`` (cap for watches
    without timeoutSeconds), ``record_requests`` (keep a request log)."""

    bookmark_interval: float = 1.0
    history_size: int = 10000
    max_watch_seconds: float = 1800.0
    record_requests: bool = True
    default_namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public",
                                           "kube-node-lease")
    crd_files: list[str] = field(default_factory=list)


class KubeServer:
    """The API server state and the aiohttp request handler.

    Args:
        options: :class:`ServerOptions`.
    """

    def __init__(self, options: ServerOptions | None = None) -> None:
        self.options = options or ServerOptions()
        self.store = Store(self.options.history_size)
        self.resources: dict[tuple[str, str], ResourceType] = {}
        self._registry_generation = 0
        #: Server-side apply: the field paths each manager applied last, per object. Fields a
        #: manager stops applying are removed (a small stand-in for managedFields).
        self._applied: dict[tuple[Any, ...], set[tuple[str, ...]]] = {}
        self.by_gv: dict[tuple[str, str], dict[str, ResourceType]] = {}
        for rt in builtin_resources():
            self._register(rt)
        self.request_log: list[RequestRecord] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self.admission = Admission(self._list_webhook_configurations, self._get_namespace)
        self._closing = False
        for ns in self.options.default_namespaces:
            self._bootstrap_namespace(ns)

    # --- registry --------------------------------------------------------------------------
    def _register(self, rt: ResourceType) -> None:
        self._registry_generation += 1
        self.resources[rt.key] = rt
        for v in rt.versions:
            self.by_gv.setdefault((rt.group, v), {})[rt.plural] = rt

    def _unregister(self, key: tuple[str, str]) -> None:
        rt = self.resources.pop(key, None)
        if rt is None:
            return
        for v in rt.versions:
            self.by_gv.get((rt.group, v), {}).pop(rt.plural, None)
            if not self.by_gv.get((rt.group, v)):
                self.by_gv.pop((rt.group, v), None)
        self.store.drop_resource(rt.storage_key)

    def _list_webhook_configurations(self) -> list[dict[str, Any]]:
        return self.store.items(("admissionregistration.k8s.io", "mutatingwebhookconfigurations"))

    def _get_namespace(self, name: str) -> dict[str, Any] | None:
        return self.store.get(("", "namespaces"), "", name)

    def _bootstrap_namespace(self, name: str) -> None:
        obj: dict[str, Any] = {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}}
        builtin.prepare_namespace(obj)
        self._stamp_new(obj, ("", "namespaces"))
        rv = self.store.next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        self.store.put(("", "namespaces"), obj, rv)

    def load_crd(self, crd: dict[str, Any]) -> dict[str, Any]:
        """Create a CRD directly (no HTTP); returns the stored object.

        Raises:
            StatusError: as a POST of the CRD would (409 when it exists, 422 when invalid).
        """
        rt = self.resources[("apiextensions.k8s.io", "customresourcedefinitions")]
        obj = copy.deepcopy(crd)
        return self._create_sync(rt, "v1", None, obj, dry_run=False)

    # --- fault injection / request log ---------------------------------------------------------
    def inject_fault(self, fault: Fault) -> None:
        """Answer the next ``fault.count`` matching requests with ``fault.status``."""
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        """Drop all pending injected faults."""
        with self._lock:
            self._faults.clear()

    def _take_fault(self, method: str, route: Route) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.count <= 0:
                    continue
                if f.method and method not in _fault_methods(f.method):
                    continue
                if f.plural and f.plural != route.rt.plural:
                    continue
                if f.name and f.name != route.name:
                    continue
                if f.namespace and f.namespace != route.namespace:
                    continue
                f.count -= 1
                return f
            self._faults = [f for f in self._faults if f.count > 0]
        return None

    async def _admin(self, request: web.Request, parts: list[str]) -> web.Response:
        """Test hooks over HTTP (for a localkube in another process): ``/localkube/faults``
        (POST a :class:`Fault` as JSON, DELETE to clear) and ``/localkube/requests`` (GET the
        request log, DELETE to clear)."""
        m = request.method
        if parts == ["faults"] and m == "POST":
            data = orjson.loads(await request.read())
            self.inject_fault(Fault(**data))
            return self._json({"status": "ok"}, 201)
        if parts == ["faults"] and m == "DELETE":
            self.clear_faults()
            return self._json({"status": "ok"})
        if parts == ["requests"] and m == "GET":
            return self._json([r.__dict__ for r in self.request_log])
        if parts == ["requests"] and m == "DELETE":
            self.request_log.clear()
            return self._json({"status": "ok"})
        return _page_not_found()

    # --- HTTP entry ----------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        """aiohttp handler for every path."""
        verb = request.method.lower()
        status = 500
        try:
            resp = await self._dispatch(request)
            status = resp.status
            return resp
        except StatusError as exc:
            status = exc.code
            return self._status_response(exc)
        except web.HTTPException:
            raise
        except ConnectionResetError:
            # the client went away (e.g. a watch closed before its headers were written):
            # nobody to answer; aiohttp's attempt to send this fails quietly, where a raise
            # would be logged as an error with a traceback
            status = 499
            return web.Response(status=status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in localkube: answer 500 like the real server would
            log.exception("localkube internal error on %s %s", request.method, request.path_qs)
            status = 500
            return self._status_response(StatusError(500, "InternalError", f"localkube: {exc!r}"))
        finally:
            if self.options.record_requests and not request.path.startswith("/localkube/"):
                verb = request.get(_VERB_KEY, verb)
                self.request_log.append(RequestRecord(
                    request.method, request.path, request.headers.get("Content-Type", ""),
                    status, verb))

    def _status_response(self, exc: StatusError) -> web.Response:
        headers = {"Content-Type": "application/json", **exc.headers}
        return web.Response(status=exc.code, body=_dumps(exc.body()), headers=headers)

    @staticmethod
    def _json(obj: Any, status: int = 200, warnings: list[str] | None = None) -> web.Response:
        headers = {"Content-Type": "application/json"}
        resp = web.Response(status=status, body=_dumps(obj), headers=headers)
        for w in warnings or []:
            escaped = w.replace("\\", "\\\\").replace('"', '\\"')
            resp.headers.add("Warning", f'299 - "{escaped}"')
        return resp

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [unquote(p) for p in path.strip("/").split("/")] if path != "/" else []
        if not parts:
            return self._json({"paths": ["/api", "/api/v1", "/apis", "/version"]})
        head = parts[0]
        if head == "version":
            return self._json(_VERSION_INFO)
        if head in ("healthz", "readyz", "livez"):
            return web.Response(text="ok", content_type="text/plain")
        if head == "openapi":
            return self._openapi(parts)
        if head == "localkube":
            return await self._admin(request, parts[1:])
        if head == "api":
            if len(parts) == 1:
                return self._json({"kind": "APIVersions", "versions": ["v1"],
                                   "serverAddressByClientCIDRs": [{
                                       "clientCIDR": "0.0.0.0/0",
                                       "serverAddress": request.host}]})
            group, version, rest = "", parts[1], parts[2:]
        elif head == "apis":
            if len(parts) == 1:
                return self._json(self._group_list())
            group = parts[1]
            if len(parts) == 2:
                g = self._group_doc(group)
                if g is None:
                    return _page_not_found()
                return self._json(g)
            version, rest = parts[2], parts[3:]
        else:
            return _page_not_found()
        if (group, version) not in self.by_gv:
            return _page_not_found()
        if not rest:
            return self._json(self._resource_list(group, version))
        route = self._route(group, version, rest)
        if route is None:
            raise resource_not_found()
        fault = self._take_fault(request.method, route)
        if fault is not None:
            msg = fault.message or (
                conflict(route.rt.group, route.rt.plural, route.name or "").message
                if fault.status == 409 else f"injected fault {fault.status}")
            details = {"name": route.name or "", "kind": route.rt.plural}
            if route.rt.group:
                details["group"] = route.rt.group
            retry = {"Retry-After": "1"} if fault.status in (429, 503, 504) else None
            raise StatusError(fault.status, fault.reason, msg, details, headers=retry)
        return await self._serve(request, route)

    def _route(self, group: str, version: str, rest: list[str]) -> Route | None:
        table = self.by_gv[(group, version)]
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (
            len(rest) == 3 and rest[2] in ("status", "finalize")
        ):
            ns = rest[1]
            rest = rest[2:]
        rt = table.get(rest[0])
        if rt is None or len(rest) > 3:
            return None
        if rt.namespaced != (ns is not None) and not (rt.namespaced and ns is None
                                                      and len(rest) == 1):
            return None
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        if sub is not None and sub not in rt.subresources and not (
            rt.plural == "namespaces" and sub == "finalize"
        ):
            return None
        return Route(rt, version, ns, name, sub)

    async def _serve(self, request: web.Request, route: Route) -> web.StreamResponse:
        m = request.method
        q = request.query
        request[_VERB_KEY] = _verb(m, route, q)
        if route.name is None:
            if m == "GET":
                if q.get("watch") in ("1", "true"):
                    return await self._watch(request, route)
                return self._list(request, route)
            if m == "POST":
                body = await self._read_object(request, route)
                return await self._create(request, route, body)
            if m == "DELETE":
                return await self._delete_collection(request, route)
            raise method_not_allowed()
        if route.sub == "binding":
            if m != "POST":
                raise method_not_allowed()
            body = await self._read_object(request, route, kind="Binding")
            return self._bind(route, body, q)
        if m == "GET":
            return self._get(request, route)
        if m == "PUT":
            body = await self._read_object(request, route)
            return await self._update(request, route, body)
        if m == "PATCH":
            return await self._patch(request, route)
        if m == "DELETE":
            if route.sub is not None:
                raise method_not_allowed()
            return await self._delete(request, route)
        raise method_not_allowed()

    # --- request bodies ------------------------------------------------------------------------
    async def _read_object(
        self, request: web.Request, route: Route, kind: str | None = None
    ) -> dict[str, Any]:
        want = kind or route.rt.kind
        raw = await request.read()
        media = (request.headers.get("Content-Type") or "application/json").split(";", 1)[0]
        media = media.strip().lower()
        if media in ("application/json", "*/*", ""):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                snippet = "<empty>" if not raw else _snippet(raw)
                raise bad_request(
                    f"the object provided is unrecognized (must be of type {want}): couldn't get"
                    f" version/kind; json parse error: unexpected end of JSON input ({snippet})"
                ) from None
        elif media in ("application/yaml", "application/x-yaml", "text/yaml"):
            try:
                obj = yaml.safe_load(raw.decode() or "null")
            except yaml.YAMLError as exc:
                raise bad_request(f"the object provided is unrecognized: {exc}") from None
        else:
            raise StatusError(
                415, "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types"
                " include: application/json, application/yaml, application/vnd.kubernetes.protobuf",
            )
        if not isinstance(obj, dict):
            raise bad_request(
                f"the object provided is unrecognized (must be of type {want}): couldn't get"
                " version/kind; json parse error: cannot unmarshal into Go value"
            )
        got_kind = obj.get("kind")
        if kind is None and got_kind and got_kind != want and got_kind != "DeleteOptions":
            version = str(obj.get("apiVersion", route.version)).rsplit("/", 1)[-1]
            raise builtin.wrong_kind(got_kind, version, want)
        obj.setdefault("metadata", {})
        if not isinstance(obj["metadata"], dict):
            raise bad_request("metadata must be an object")
        return obj

    # --- helpers -------------------------------------------------------------------------------
    def _stamp_new(self, obj: dict[str, Any], skey: tuple[str, str]) -> None:
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta.pop("resourceVersion", None)
        meta.pop("deletionTimestamp", None)
        meta.pop("deletionGracePeriodSeconds", None)
        if skey in _GENERATION_KINDS or self._is_cr(skey):
            meta["generation"] = 1
        else:
            meta.pop("generation", None)

    def _is_cr(self, skey: tuple[str, str]) -> bool:
        rt = self.resources.get(skey)
        return rt is not None and rt.is_crd

    def _output(self, rt: ResourceType, version: str, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as the client sees it at ``version`` (kind/apiVersion set)."""
        if rt.group == "events.k8s.io":
            return builtin.event_to_v1(obj)
        av = rt.api_version(version)
        if obj.get("apiVersion") == av and obj.get("kind") == rt.kind:
            return obj
        out = {"kind": rt.kind, "apiVersion": av}
        out.update((k, v) for k, v in obj.items() if k not in ("kind", "apiVersion"))
        if rt.is_crd and len(rt.versions) > 1 and version in rt.schemas:
            # conversion strategy None: only apiVersion changes, then the version's schema
            # prunes what it does not know (crd-noderesourcetopology.json)
            out = _clone(out)
            schema.prune(out, rt.schemas[version])
        return out

    def _item_output(self, rt: ResourceType, version: str, obj: dict[str, Any]) -> dict[str, Any]:
        """An item inside a list: built-in lists omit kind/apiVersion on items."""
        if rt.is_crd:
            return self._output(rt, version, obj)
        if rt.group == "events.k8s.io":
            out = builtin.event_to_v1(obj)
        else:
            out = obj
        return {k: v for k, v in out.items() if k not in ("kind", "apiVersion")}

    def _check_namespace(self, route: Route) -> None:
        if route.rt.namespaced and route.namespace is not None and self._get_namespace(
            route.namespace
        ) is None:
            raise not_found("", "namespaces", route.namespace)

    def _validate_cr(
        self, rt: ResourceType, version: str, obj: dict[str, Any], strict: bool
    ) -> list[str]:
        """Prune, default and validate a custom resource in place; return warnings."""
        sch = rt.schemas.get(version) or rt.schemas.get(rt.versions[0])
        if not sch:
            return []
        dropped = schema.prune(obj, sch)
        if dropped and strict:
            fields = ", ".join(f'unknown field "{d}"' for d in dropped)
            raise bad_request(
                f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: strict'
                f" decoding error: {fields}"
            )
        schema.apply_defaults(obj, sch)
        causes = schema.validate(obj, sch)
        if causes:
            raise invalid(rt.kind, obj["metadata"].get("name", ""), causes, group=rt.group)
        return [f'unknown field "{d}"' for d in dropped]

    def _admission_options(self, q: Any, op: str) -> dict[str, Any]:
        opts: dict[str, Any] = {"kind": f"{op.capitalize()}Options",
                                "apiVersion": "meta.k8s.io/v1"}
        if q.get("dryRun"):
            opts["dryRun"] = [q.get("dryRun")]
        if q.get("fieldManager"):
            opts["fieldManager"] = q.get("fieldManager")
        if q.get("fieldValidation"):
            opts["fieldValidation"] = q.get("fieldValidation")
        return opts

    # --- create --------------------------------------------------------------------------------
    async def _create(
        self, request: web.Request, route: Route, obj: dict[str, Any]
    ) -> web.Response:
        q = request.query
        rt = route.rt
        dry_run = q.get("dryRun") == "All"
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != route.namespace:
                raise bad_request("the namespace of the provided object does not match the"
                                  " namespace sent on the request")
            if route.namespace is None:
                raise method_not_allowed()
            meta["namespace"] = route.namespace
        else:
            meta.pop("namespace", None)
        warnings = self._prepare_create(rt, route.version, obj, q)
        self._check_namespace(route)
        if rt.key == ("", "pods"):
            obj["status"] = {}
        obj = await self.admission.admit(
            operation="CREATE", group=rt.group, version=route.version, kind=rt.kind,
            plural=rt.plural, namespace=route.namespace, name=meta.get("name") or None,
            obj=obj, old=None, dry_run=dry_run,
            options=self._admission_options(q, "create"), user_info=ADMIN_USER)
        if rt.key == ("", "pods"):
            podrules.prepare_pod_create(obj)
        elif rt.is_crd:
            self._validate_cr(rt, route.version, obj, False)  # webhooks may have changed it
        stored = self._create_sync(rt, route.version, route.namespace, obj, dry_run=dry_run,
                                   prepared=True)
        return self._json(self._output(rt, route.version, stored), 201, warnings)

    def _prepare_create(
        self, rt: ResourceType, version: str, obj: dict[str, Any], q: Any
    ) -> list[str]:
        """Kind-specific defaulting/validation before admission; returns warnings."""
        warnings: list[str] = []
        obj["kind"] = rt.kind
        obj["apiVersion"] = rt.api_version(version)
        key = rt.key
        if rt.is_crd:
            warnings = self._validate_cr(rt, version, obj, q.get("fieldValidation") == "Strict")
            if "status" in rt.subresources:
                obj.pop("status", None)
        elif key == ("", "pods"):
            obj["status"] = {}
            podrules.prepare_pod_create(obj)
        elif key == ("", "namespaces"):
            builtin.prepare_namespace(obj)
        elif key == ("", "nodes"):
            builtin.prepare_node(obj)
        elif key == ("", "secrets"):
            obj.setdefault("type", "Opaque")
        elif key == ("", "events"):
            builtin.prepare_core_event(obj)
        elif key == ("events.k8s.io", "events"):
            builtin.validate_v1_event(obj)
        elif key == ("coordination.k8s.io", "leases"):
            builtin.validate_lease(obj)
        elif key == ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"):
            builtin.default_webhook_configuration(obj)
        elif key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            builtin.prepare_crd(obj, now_rfc3339())
        return warnings

    def _create_sync(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        obj: dict[str, Any],
        *,
        dry_run: bool,
        prepared: bool = False,
    ) -> dict[str, Any]:
        if not prepared:
            self._prepare_create(rt, version, obj, {})
        meta = obj["metadata"]
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(
                    random.choice(_NAME_CHARS) for _ in range(5))
            else:
                raise invalid(rt.kind, "", [{
                    "reason": "FieldValueRequired",
                    "message": "Required value: name or generateName is required",
                    "field": "metadata.name"}], group=rt.group)
        if rt.group == "events.k8s.io":
            obj = builtin.event_to_core(obj)
            if "count" in obj and not obj["count"]:
                del obj["count"]
            meta = obj["metadata"]
        skey = rt.storage_key
        ns = meta.get("namespace", "") if rt.namespaced else ""
        if self.store.get(skey, ns, meta["name"]) is not None:
            raise already_exists(rt.group, rt.plural, meta["name"])
        self._stamp_new(obj, skey)
        if dry_run:
            return obj
        rv = self.store.next_rv()
        meta["resourceVersion"] = str(rv)
        self.store.put(skey, obj, rv)
        if rt.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._register(resource_from_crd(obj))
        return obj

    # --- get -----------------------------------------------------------------------------------
    def _get_existing(self, route: Route) -> dict[str, Any]:
        rt = route.rt
        ns = route.namespace or ""
        obj = self.store.get(rt.storage_key, ns, route.name or "")
        if obj is None:
            raise not_found(rt.group, rt.plural, route.name or "")
        return obj

    def _get(self, request: web.Request, route: Route) -> web.Response:
        obj = self._get_existing(route)
        out = self._output(route.rt, route.version, obj)
        if "as=Table" in request.headers.get("Accept", ""):
            return self._json(self._table(route.rt, route.version, [out], obj["metadata"].get(
                "resourceVersion", "")))
        return self._json(out)

    # --- list ----------------------------------------------------------------------------------
    def _selectors(self, request: web.Request, rt: ResourceType) -> tuple[LabelSelector,
                                                                         FieldSelector]:
        q = request.query
        return (parse_label_selector(q.get("labelSelector")),
                parse_field_selector(q.get("fieldSelector"), rt.supports_field))

    def _matcher(
        self, route: Route, ls: LabelSelector, fs: FieldSelector
    ) -> Callable[[dict[str, Any]], bool]:
        rt = route.rt
        ns = route.namespace
        convert = rt.group == "events.k8s.io"

        def match(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            if ns is not None and meta.get("namespace") != ns:
                return False
            if not ls.empty and not ls.matches(meta.get("labels")):
                return False
            if not fs.empty:
                return fs.matches(builtin.event_to_v1(obj) if convert else obj)
            return True

        return match

    def _list(self, request: web.Request, route: Route) -> web.Response:
        q = request.query
        rt = route.rt
        ls, fs = self._selectors(request, rt)
        limit = _parse_int(q.get("limit"))
        rv_param = q.get("resourceVersion", "")
        match_param = q.get("resourceVersionMatch", "")
        if match_param and not rv_param:
            raise _list_options_invalid(
                "resourceVersionMatch", "resourceVersionMatch is forbidden unless"
                " resourceVersion is provided")
        cont = q.get("continue", "")
        skey = rt.storage_key
        match = self._matcher(route, ls, fs)
        start = ""
        list_rv = self.store.rv
        objs: list[dict[str, Any]]
        ns = route.namespace

        def keep_key(k: tuple[str, str]) -> bool:
            return ns is None or k[0] == ns

        if cont:
            token_rv, start = _decode_continue(cont)
            if token_rv != -1 and self.store.too_old(token_rv):
                fresh = _encode_continue(-1, start)
                raise expired(
                    "The provided continue parameter is too old to display a consistent list"
                    " result. You can start a new list without the continue parameter, or use the"
                    " continue token in this response to retrieve the remainder of the results."
                    " Continuing with the provided token results in an inconsistent list -"
                    " objects that were created, modified, or deleted between the time the first"
                    " chunk was returned and now may show up in the list.",
                    {"continue": fresh})
            if token_rv > 0:
                list_rv = token_rv
                objs = self.store.snapshot(skey, token_rv, keep_key)
            else:
                objs = self.store.items(skey, ns)
        elif rv_param and rv_param != "0":
            rv = _parse_rv(rv_param, list_call=True)
            if rv > self.store.rv:
                raise StatusError(
                    504, "Timeout",
                    f"Timeout: Too large resource version: {rv}, current: {self.store.rv}",
                    {"causes": [{"reason": "ResourceVersionTooLarge",
                                 "message": "Too large resource version"}],
                     "retryAfterSeconds": 1}, headers={"Retry-After": "1"})
            if match_param == "Exact":
                if self.store.too_old(rv):
                    raise expired("The resourceVersion for the provided list is too old.")
                list_rv = rv
                objs = self.store.snapshot(skey, rv, keep_key)
            else:
                objs = self.store.items(skey, ns)
        else:
            objs = self.store.items(skey, ns)
            if rv_param == "0":
                limit = 0
        key_of = _list_key(rt, ns)
        selected: list[dict[str, Any]] = []
        remaining = 0
        more = False
        for o in objs:
            if start and key_of(o) < start:
                continue
            if not match(o):
                continue
            if limit and len(selected) >= limit:
                more = True
                remaining += 1
                continue
            selected.append(o)
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if more:
            meta["continue"] = _encode_continue(list_rv, key_of(selected[-1]) + "\x00")
            if ls.empty and fs.empty:
                meta["remainingItemCount"] = remaining
        elif rt.is_crd:
            meta["continue"] = ""
        if "as=Table" in request.headers.get("Accept", ""):
            return self._json(self._table(
                rt, route.version, [self._output(rt, route.version, o) for o in selected],
                str(list_rv)))
        return self._list_response(rt, route.version, selected, meta)

    def _list_response(
        self, rt: ResourceType, version: str, items: list[dict[str, Any]], meta: dict[str, Any]
    ) -> web.Response:
        head = _dumps({"kind": rt.list_kind, "apiVersion": rt.api_version(version),
                       "metadata": meta})
        body = b"".join([head[:-1], b',"items":[',
                         b",".join(_dumps(self._item_output(rt, version, o)) for o in items),
                         b"]}"])
        return web.Response(status=200, body=body, headers={"Content-Type": "application/json"})

    # --- watch ---------------------------------------------------------------------------------
    async def _watch(self, request: web.Request, route: Route) -> web.StreamResponse:
        q = request.query
        rt = route.rt
        ls, fs = self._selectors(request, rt)
        rv_param = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents") in ("true", "1")
        if send_initial and q.get("resourceVersionMatch") != "NotOlderThan":
            raise _list_options_invalid(
                "resourceVersionMatch", "sendInitialEvents requires setting"
                " resourceVersionMatch to NotOlderThan")
        if q.get("resourceVersionMatch") and not send_initial:
            raise _list_options_invalid(
                "resourceVersionMatch", "resourceVersionMatch is forbidden for watch unless"
                " sendInitialEvents is provided")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = self.options.max_watch_seconds
        if q.get("timeoutSeconds"):
            timeout = min(float(_parse_int(q.get("timeoutSeconds"))), timeout)
        rv = _parse_rv(rv_param, list_call=False) if rv_param not in ("", "0") else 0
        match = self._matcher(route, ls, fs)
        skey = rt.storage_key
        version = route.version
        as_table = "as=Table" in request.headers.get("Accept", "")

        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Transfer-Encoding": "chunked"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        if rv and self.store.too_old(rv):
            st = expired(f"too old resource version: {rv} ({self.store.oldest_rv + 1})")
            await _write(resp, b'{"type":"ERROR","object":' + _dumps(st.body()) + b"}\n")
            return resp

        watcher = self.store.subscribe(skey)
        initial: list[bytes] = []
        if rv == 0:
            ns = route.namespace
            for o in self.store.items(skey, ns):
                if match(o):
                    initial.append(self._event_line("ADDED", rt, version, o, as_table))
            if send_initial and bookmarks:
                initial.append(self._bookmark_line(rt, version, initial_end=True))
        else:
            for past in self.store.since(skey, rv):
                line = self._filter_event(past, rt, version, match, as_table)
                if line is not None:
                    initial.append(line)
        deadline = time.monotonic() + timeout
        try:
            if initial:
                await _write(resp, b"".join(initial))
            next_bookmark = time.monotonic() + self.options.bookmark_interval
            while not self._closing:
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(0.0, next_bookmark - now))
                try:
                    ev: WatchEvent | None = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and time.monotonic() >= next_bookmark:
                        await _write(resp, self._bookmark_line(rt, version))
                        next_bookmark = time.monotonic() + self.options.bookmark_interval
                    continue
                if ev is None:
                    break
                chunks: list[bytes] = []
                line = self._filter_event(ev, rt, version, match, as_table)
                if line is not None:
                    chunks.append(line)
                while not watcher.queue.empty():
                    more = watcher.queue.get_nowait()
                    if more is None:
                        watcher.queue.put_nowait(None)
                        break
                    line = self._filter_event(more, rt, version, match, as_table)
                    if line is not None:
                        chunks.append(line)
                if chunks:
                    await _write(resp, b"".join(chunks))
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.store.unsubscribe(watcher)
        with contextlib.suppress(Exception):
            await resp.write_eof()
        return resp

    def _filter_event(
        self, ev: WatchEvent, rt: ResourceType, version: str,
        match: Callable[[dict[str, Any]], bool], as_table: bool = False,
    ) -> bytes | None:
        new_match = match(ev.obj)
        if ev.type == "ADDED":
            etype = "ADDED" if new_match else None
        elif ev.type == "DELETED":
            etype = "DELETED" if new_match else None
        else:
            old_match = ev.prev is not None and match(ev.prev)
            if old_match and new_match:
                etype = "MODIFIED"
            elif new_match:
                etype = "ADDED"
            elif old_match:
                etype = "DELETED"
            else:
                etype = None
        if etype is None:
            return None
        obj, cache_key = ev.obj, rt.api_version(version)
        if etype == "DELETED" and ev.type == "MODIFIED" and ev.prev is not None:
            # An object leaving the selector: the real cacher sends the previous content with
            # the event's resourceVersion (reference/watch-pods-events.jsonl).
            obj = {**ev.prev, "metadata": {**ev.prev.get("metadata", {}),
                                           "resourceVersion": ev.obj["metadata"].get(
                                               "resourceVersion")}}
            cache_key += "#left"
        if as_table:
            return self._event_line(etype, rt, version, obj, True)
        data = ev.cache.get(cache_key)
        if data is None:
            data = ev.cache[cache_key] = _dumps(self._output(rt, version, obj))
        return b'{"type":"' + etype.encode() + b'","object":' + data + b"}\n"

    def _event_line(
        self, etype: str, rt: ResourceType, version: str, obj: dict[str, Any],
        as_table: bool = False,
    ) -> bytes:
        out = self._output(rt, version, obj)
        if as_table:
            out = self._table(rt, version, [out], obj["metadata"].get("resourceVersion", ""))
        return b'{"type":"' + etype.encode() + b'","object":' + _dumps(out) + b"}\n"

    def _bookmark_line(self, rt: ResourceType, version: str, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj: dict[str, Any] = {"kind": rt.kind, "apiVersion": rt.api_version(version),
                               "metadata": meta}
        if rt.key == ("", "pods"):
            obj["spec"] = {"containers": None}
            obj["status"] = {}
        return b'{"type":"BOOKMARK","object":' + _dumps(obj) + b"}\n"

    # --- update --------------------------------------------------------------------------------
    async def _update(
        self, request: web.Request, route: Route, body: dict[str, Any]
    ) -> web.Response:
        q = request.query
        rt = route.rt
        old = self._get_existing(route)
        meta = body["metadata"]
        if meta.get("name") and meta["name"] != route.name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name"
                              f" on the URL ({route.name})")
        rv = meta.get("resourceVersion")
        if rv:
            _parse_rv(rv, list_call=True, plain=True)
            if rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt.group, rt.plural, route.name or "")
        elif rt.is_crd:
            raise invalid(rt.kind, route.name or "", [{
                "reason": "FieldValueInvalid",
                "message": "Invalid value: 0x0: must be specified for an update",
                "field": "metadata.resourceVersion"}], group=rt.group)
        body["kind"] = rt.kind
        body["apiVersion"] = rt.api_version(route.version)
        if rt.group == "events.k8s.io":
            builtin.validate_v1_event_update(builtin.event_to_v1(old), body)
            body = builtin.event_to_core(body)
        stored, warnings = self._commit_update(
            rt, route, old, body, q, dry_run=q.get("dryRun") == "All")
        return self._json(self._output(rt, route.version, stored), 200, warnings)

    def _commit_update(
        self, rt: ResourceType, route: Route, old: dict[str, Any], new: dict[str, Any],
        q: Any, *, dry_run: bool,
    ) -> tuple[dict[str, Any], list[str]]:
        """Apply update semantics to ``new`` (a fresh dict) and store it; returns it."""
        warnings: list[str] = []
        meta = dict(new.get("metadata") or {})
        new["metadata"] = meta
        old_meta = old["metadata"]
        if meta.get("name") and meta["name"] != old_meta["name"]:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name"
                              f" on the URL ({old_meta['name']})")
        for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generateName"):
            if k in old_meta:
                meta[k] = old_meta[k]
            else:
                meta.pop(k, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if route.sub == "status":
            status = new.get("status")
            new = _clone({k: v for k, v in old.items() if k != "status"})
            meta = new["metadata"]
            if status is not None:
                new["status"] = status
            if rt.is_crd:
                self._validate_cr(rt, route.version, new, False)
        else:
            if "status" in rt.subresources and rt.key != ("", "namespaces"):
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            if rt.is_crd:
                warnings = self._validate_cr(rt, route.version, new,
                                             q.get("fieldValidation") == "Strict")
            elif rt.key == ("", "pods"):
                podrules.validate_pod_update(old, new)
            elif rt.key == ("coordination.k8s.io", "leases"):
                builtin.validate_lease(new)
            elif rt.key == ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"):
                builtin.default_webhook_configuration(new)
            elif rt.key == ("", "namespaces"):
                new["status"] = old.get("status", {})
                labels = dict(meta.get("labels") or {})
                labels["kubernetes.io/metadata.name"] = old_meta["name"]
                meta["labels"] = labels
        if "generation" in old_meta:
            gen = old_meta["generation"]
            if _spec_of(new) != _spec_of(old):
                gen += 1
            meta["generation"] = gen
        if new == old:
            return old, warnings  # no-op: no new resourceVersion, no event
        if dry_run:
            return new, warnings
        rv = self.store.next_rv()
        meta["resourceVersion"] = str(rv)
        skey = rt.storage_key
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and (
            rt.key != ("", "pods") or not (new.get("spec") or {}).get("nodeName")
        ):
            self.store.put(skey, new, rv)
            self._finish_delete(rt, new)
            return new, warnings
        self.store.put(skey, new, rv)
        if rt.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._reregister_crd(old, new)
        return new, warnings

    def _reregister_crd(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        new_rt = resource_from_crd(new)
        old_rt = self.resources.get(new_rt.key)
        if old_rt is not None:
            for v in old_rt.versions:
                self.by_gv.get((old_rt.group, v), {}).pop(old_rt.plural, None)
        self._register(new_rt)

    # --- patch ---------------------------------------------------------------------------------
    async def _patch(self, request: web.Request, route: Route) -> web.Response:
        q = request.query
        rt = route.rt
        media = (request.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        body = await request.read()
        dry_run = q.get("dryRun") == "All"
        if media == APPLY_PATCH and not q.get("fieldManager"):
            raise StatusError(
                422, "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is'
                " required for apply patch",
                {"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{
                    "reason": "FieldValueRequired",
                    "message": "Required value: is required for apply patch",
                    "field": "fieldManager"}]})
        if media not in _PATCH_TYPES or (media == STRATEGIC_MERGE_PATCH and not rt.strategic):
            raise unsupported_media_type(rt.strategic)
        ns = route.namespace or ""
        old = self.store.get(rt.storage_key, ns, route.name or "")
        if old is None:
            if media == APPLY_PATCH and route.sub is None:
                obj = apply_patch(APPLY_PATCH, {}, body, strategic=False)
                obj.setdefault("metadata", {})
                obj["metadata"].setdefault("name", route.name)
                if obj["metadata"]["name"] != route.name:
                    raise bad_request(
                        f"the name of the object ({obj['metadata']['name']}) does not match the"
                        f" name on the URL ({route.name})")
                return await self._create(request, route, obj)
            raise not_found(rt.group, rt.plural, route.name or "")
        current = self._output(rt, route.version, old)
        if media == APPLY_PATCH and rt.is_crd:
            applied = apply_patch(APPLY_PATCH, {}, body, strategic=False)
            patched = schema.apply_merge(current, applied, rt.schemas.get(route.version))
        else:
            # Service ports merge on "port", not the pod's "containerPort": apply them as
            # plain merges (lists replaced) rather than with the pod-shaped strategy.
            strategic = rt.strategic and not (media == APPLY_PATCH and rt.key in _PLAIN_APPLY)
            patched = apply_patch(media, current, body, strategic=strategic)
        # Patch results may share unchanged subtrees with the stored object, which must never
        # be mutated: take the one copy per write here.
        patched = _clone(patched)
        if media == APPLY_PATCH:
            applied_cfg = apply_patch(APPLY_PATCH, {}, body, strategic=False)
            key = (rt.storage_key, ns, route.name or "", q.get("fieldManager", ""),
                   route.sub or "")
            now_paths = _leaf_paths(applied_cfg)
            for path in sorted(self._applied.get(key, set()) - now_paths, reverse=True):
                _remove_path(patched, path)
            if not dry_run:
                self._applied[key] = now_paths
        if not isinstance(patched, dict):
            raise bad_request("patch did not produce an object")
        pmeta = patched.setdefault("metadata", {})
        if pmeta.get("name") != old["metadata"]["name"]:
            raise bad_request(f"the name of the object ({pmeta.get('name')}) does not match the"
                              f" name on the URL ({route.name})")
        prv = pmeta.get("resourceVersion")
        if prv and prv != old["metadata"]["resourceVersion"]:
            _parse_rv(prv, list_call=True, plain=True)
            raise conflict(rt.group, rt.plural, route.name or "")
        patched["kind"] = rt.kind
        patched["apiVersion"] = rt.api_version(route.version)
        if rt.group == "events.k8s.io":
            builtin.validate_v1_event_update(current, patched)
            patched = builtin.event_to_core(patched)
        elif rt.key == ("", "events"):
            builtin.check_microtime("Event", patched.get("eventTime"))
        stored, warnings = self._commit_update(rt, route, old, patched, q, dry_run=dry_run)
        return self._json(self._output(rt, route.version, stored), 200, warnings)

    # --- binding -------------------------------------------------------------------------------
    def _bind(self, route: Route, body: dict[str, Any], q: Any) -> web.Response:
        pods = self.resources[("", "pods")]
        old = self._get_existing(Route(pods, "v1", route.namespace, route.name, None))
        name = route.name or ""
        if (old.get("spec") or {}).get("schedulingGates"):
            raise StatusError(409, "Conflict",
                              f'Operation cannot be fulfilled on pods/binding "{name}": pod'
                              f" {name} has non-empty .spec.schedulingGates",
                              {"name": name, "kind": "pods/binding"})
        node = (old.get("spec") or {}).get("nodeName")
        if node:
            raise StatusError(409, "Conflict",
                              f'Operation cannot be fulfilled on pods/binding "{name}": pod'
                              f' {name} is already assigned to node "{node}"',
                              {"name": name, "kind": "pods/binding"})
        target = (body.get("target") or {}).get("name")
        if not target:
            raise invalid("Binding", name, [{"reason": "FieldValueRequired",
                                              "message": "Required value",
                                              "field": "target.name"}])
        new = _clone(old)
        new["spec"]["nodeName"] = target
        status = new.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.insert(0, {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                         "lastTransitionTime": now_rfc3339()})
        status["conditions"] = conds
        if q.get("dryRun") != "All":
            rv = self.store.next_rv()
            new["metadata"]["resourceVersion"] = str(rv)
            self.store.put(pods.storage_key, new, rv)
        return self._json({"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Success", "code": 201}, 201)

    # --- delete --------------------------------------------------------------------------------
    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        opts: dict[str, Any] = {}
        if raw.strip():
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise bad_request("invalid DeleteOptions body") from None
            if isinstance(parsed, dict):
                opts = parsed
        q = request.query
        if q.get("gracePeriodSeconds") is not None:
            opts["gracePeriodSeconds"] = _parse_int(q.get("gracePeriodSeconds"))
        if q.get("dryRun"):
            opts["dryRun"] = [q.get("dryRun")]
        if q.get("propagationPolicy"):
            opts["propagationPolicy"] = q.get("propagationPolicy")
        return opts

    async def _delete(self, request: web.Request, route: Route) -> web.Response:
        opts = await self._delete_options(request)
        obj = self._get_existing(route)
        out = self._delete_one(route.rt, obj, opts)
        return self._delete_response(route, obj, out)

    def _delete_response(
        self, route: Route, before: dict[str, Any], after: dict[str, Any]
    ) -> web.Response:
        rt = route.rt
        current = self.store.get(rt.storage_key, after["metadata"].get("namespace", ""),
                                 after["metadata"]["name"])
        if rt.key in _RETURN_DELETED or (
            current is not None and current["metadata"].get("deletionTimestamp")
        ):
            return self._json(self._output(rt, route.version, after))
        details: dict[str, Any] = {"name": before["metadata"]["name"]}
        if rt.group:
            details["group"] = rt.group
        details["kind"] = rt.plural
        details["uid"] = before["metadata"].get("uid", "")
        return self._json({"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Success", "details": details})

    def _delete_one(
        self, rt: ResourceType, obj: dict[str, Any], opts: dict[str, Any]
    ) -> dict[str, Any]:
        """Delete (or start deleting) ``obj``; returns the object to report."""
        meta = obj["metadata"]
        name = meta["name"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise StatusError(409, "Conflict",
                              f'Operation cannot be fulfilled on {rt.kind} "{name}": Precondition'
                              f" failed: UID in precondition: {pre['uid']}, UID in object meta:"
                              f" {meta.get('uid')}", {"name": name, "kind": rt.kind})
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise StatusError(409, "Conflict",
                              f'Operation cannot be fulfilled on {rt.kind} "{name}": the'
                              f" ResourceVersion in the precondition ({pre['resourceVersion']})"
                              " does not match the ResourceVersion in record"
                              f" ({meta.get('resourceVersion')}). The object might have been"
                              " modified", {"name": name, "kind": rt.kind})
        dry_run = opts.get("dryRun") == ["All"]
        skey = rt.storage_key
        grace = opts.get("gracePeriodSeconds")
        if rt.key == ("", "pods"):
            bound = bool((obj.get("spec") or {}).get("nodeName"))
            if grace is None:
                grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            if not bound:
                grace = 0
            if grace and meta.get("deletionTimestamp") and (
                meta.get("deletionGracePeriodSeconds", 0) <= grace
            ):
                return obj  # already terminating with an equal or shorter grace period
        else:
            grace = 0
        new = dict(obj)
        new_meta = dict(meta)
        new["metadata"] = new_meta
        new_meta["deletionTimestamp"] = now_rfc3339(float(grace or 0))
        new_meta["deletionGracePeriodSeconds"] = int(grace or 0)
        if "generation" in meta and not meta.get("deletionTimestamp"):
            new_meta["generation"] = meta["generation"] + 1  # graceful deletion bumps it
        if rt.key == ("", "namespaces"):
            new["status"] = {"phase": "Terminating"}
        if dry_run:
            return new
        pending_finalizers = bool(meta.get("finalizers"))
        if pending_finalizers and meta.get("deletionTimestamp"):
            return obj
        if rt.key == ("", "pods") or pending_finalizers or rt.key == ("", "namespaces"):
            rv = self.store.next_rv()
            new_meta["resourceVersion"] = str(rv)
            self.store.put(skey, new, rv)
            if pending_finalizers or grace:
                return new
        self._finish_delete(rt, new)
        return new

    def _finish_delete(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Remove ``obj`` for good (DELETED event); cascades for namespaces and CRDs."""
        rv = self.store.next_rv()
        gone = dict(obj)
        gone["metadata"] = dict(obj["metadata"], resourceVersion=str(rv))
        self.store.remove(rt.storage_key, gone, rv)
        if rt.key == ("", "namespaces"):
            # localkube runs no namespace controller: the contents go at once.
            ns = obj["metadata"]["name"]
            for other in list(self.resources.values()):
                if not other.namespaced or other.storage is not None:
                    continue
                for item in self.store.items(other.storage_key, ns):
                    r2 = self.store.next_rv()
                    dead = dict(item)
                    dead["metadata"] = dict(item["metadata"], resourceVersion=str(r2))
                    self.store.remove(other.storage_key, dead, r2)
        elif rt.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            spec = obj.get("spec") or {}
            self._unregister((spec.get("group", ""), (spec.get("names") or {}).get("plural", "")))

    async def _delete_collection(self, request: web.Request, route: Route) -> web.Response:
        rt = route.rt
        opts = await self._delete_options(request)
        ls, fs = self._selectors(request, rt)
        match = self._matcher(route, ls, fs)
        deleted: list[dict[str, Any]] = []
        for obj in self.store.items(rt.storage_key, route.namespace):
            if match(obj):
                deleted.append(self._delete_one(rt, obj, opts))
        return self._list_response(rt, route.version, deleted,
                                   {"resourceVersion": str(self.store.rv)}
                                   if not rt.is_crd else
                                   {"continue": "", "resourceVersion": str(self.store.rv)})

    # --- tables --------------------------------------------------------------------------------
    def _table(
        self, rt: ResourceType, version: str, objs: list[dict[str, Any]], rv: str,
        *, with_columns: bool = True,
    ) -> dict[str, Any]:
        """A ``meta.k8s.io/v1`` Table: CRD printer columns, the pod columns kubectl shows
        (Name, Ready, Status, Restarts, Age, IP, Node), or Name and Age."""
        cols: list[dict[str, Any]] = [{
            "name": "Name", "type": "string", "format": "name",
            "description": "Name must be unique within a namespace.", "priority": 0}]
        extra: list[dict[str, Any]] = rt.printer_columns.get(version, []) if rt.is_crd else [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        if rt.key == ("", "pods"):
            extra = [{"name": "Ready", "type": "string", "value": _pod_ready},
                     {"name": "Status", "type": "string", "value": _pod_status},
                     {"name": "Restarts", "type": "string", "value": lambda o: "0"},
                     {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                     {"name": "IP", "type": "string", "jsonPath": ".status.podIP",
                      "priority": 1},
                     {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName",
                      "priority": 1}]
        for c in extra:
            cols.append({"name": c["name"], "type": c.get("type", "string"),
                         "format": c.get("format", ""),
                         "description": "Custom resource definition column (in JSONPath format):"
                         f" {c.get('jsonPath', '')}", "priority": c.get("priority", 0)})
        rows = []
        for o in objs:
            cells: list[Any] = [o["metadata"]["name"]]
            for c in extra:
                val = c["value"](o) if "value" in c else _json_path(o, c.get("jsonPath", ""))
                if c.get("type") == "date" and isinstance(val, str):
                    val = _age(val)
                cells.append(val if val is not None else "<none>")
            rows.append({"cells": cells, "object": {
                "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": o["metadata"]}})
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": rv},
                "columnDefinitions": cols if with_columns else [], "rows": rows}

    # --- discovery -----------------------------------------------------------------------------
    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        out = []
        for rt in self.by_gv[(group, version)].values():
            entry: dict[str, Any] = {
                "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                "kind": rt.kind, "verbs": CR_VERBS if rt.is_crd else
                ["create", "delete", "deletecollection", "get", "list", "patch", "update",
                 "watch"],
            }
            if rt.short_names:
                entry["shortNames"] = rt.short_names
            if rt.categories:
                entry["categories"] = rt.categories
            entry["storageVersionHash"] = base64.b64encode(
                (rt.group + rt.plural).encode()[:8].ljust(8, b"\0")).decode()
            out.append(entry)
            for sub in sorted(rt.subresources):
                out.append({"name": f"{rt.plural}/{sub}", "singularName": "",
                            "namespaced": rt.namespaced,
                            "kind": "Binding" if sub == "binding" else rt.kind,
                            "verbs": ["create"] if sub == "binding" else
                            ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": out}

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for rt in self.resources.values():
            if rt.group:
                vs = groups.setdefault(rt.group, [])
                for v in rt.versions:
                    if v not in vs:
                        vs.append(v)
        return groups

    def _group_doc(self, group: str) -> dict[str, Any] | None:
        vs = self._groups().get(group)
        if not vs:
            return None
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in vs]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions,
                "preferredVersion": versions[0]}

    def _group_list(self) -> dict[str, Any]:
        out = []
        for g in self._groups():
            doc = self._group_doc(g)
            if doc is not None:
                doc.pop("kind")
                doc.pop("apiVersion")
                out.append(doc)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}

    def _openapi(self, parts: list[str]) -> web.Response:
        """Minimal OpenAPI documents: enough for kubectl's server-side field validation check
        (a PATCH operation per kind with ``x-kubernetes-group-version-kind`` and a
        ``fieldValidation`` query parameter). Schemas are not published."""
        if parts == ["openapi", "v2"]:
            # No protobuf: kubectl asks for v2 as protobuf only as a fallback; a 404 makes it
            # go on without client-side schema validation.
            raise resource_not_found()
        tag = f"{len(self.resources):x}{self._registry_generation:x}"
        if parts == ["openapi", "v3"]:
            paths = {}
            for group, version in self.by_gv:
                key = f"apis/{group}/{version}" if group else f"api/{version}"
                paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={tag}"}
            return self._json({"paths": paths})
        if len(parts) >= 4 and parts[:2] == ["openapi", "v3"]:
            if parts[2] == "api" and len(parts) == 4:
                group, version = "", parts[3]
            elif parts[2] == "apis" and len(parts) == 5:
                group, version = parts[3], parts[4]
            else:
                return _page_not_found()
            table = self.by_gv.get((group, version))
            if table is None:
                return _page_not_found()
            doc_paths: dict[str, Any] = {}
            prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
            for rt in table.values():
                ns = "/namespaces/{namespace}" if rt.namespaced else ""
                gvk = {"group": rt.group, "version": version, "kind": rt.kind}
                doc_paths[f"{prefix}{ns}/{rt.plural}/{{name}}"] = {"patch": {
                    "operationId": f"patch{rt.kind}",
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [
                        {"name": "fieldValidation", "in": "query",
                         "schema": {"type": "string", "uniqueItems": True}},
                        {"name": "fieldManager", "in": "query",
                         "schema": {"type": "string", "uniqueItems": True}},
                        {"name": "dryRun", "in": "query",
                         "schema": {"type": "string", "uniqueItems": True}},
                    ],
                    "responses": {"200": {"description": "OK"}},
                }}
            return self._json({"openapi": "3.0.0",
                               "info": {"title": "Kubernetes", "version": "v1.36.2"},
                               "paths": doc_paths, "components": {"schemas": {}}})
        return _page_not_found()

    def close(self) -> None:
        """End every watch (called at shutdown)."""
        self._closing = True
        self.store.close_all_watchers()

    async def aclose(self) -> None:
        """End every watch and release the admission HTTP clients."""
        self.close()
        await self.admission.aclose()


# --- module helpers ------------------------------------------------------------------------


def _fault_methods(spec: str) -> set[str]:
    methods: set[str] = set()
    for m in spec.upper().split("|"):
        methods |= {"POST", "PUT", "PATCH", "DELETE"} if m == "WRITE" else {m}
    return methods


def _verb(method: str, route: Route, q: Any) -> str:
    """The Kubernetes verb of a request (``list``, ``watch``, ``deletecollection``...)."""
    if route.name is None:
        if method == "GET":
            return "watch" if q.get("watch") in ("1", "true") else "list"
        if method == "DELETE":
            return "deletecollection"
    return {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}.get(method, method.lower())


def _page_not_found() -> web.Response:
    return web.Response(status=404, text="404 page not found\n", content_type="text/plain")


def _snippet(raw: bytes) -> str:
    text = raw.decode(errors="replace")
    return text[:25] + " ..." if len(text) > 25 else text


async def _write(resp: web.StreamResponse, data: bytes) -> None:
    await resp.write(data)


def _parse_int(value: str | None) -> int:
    if value is None or value == "":
        return 0
    try:
        return int(value)
    except ValueError:
        raise bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from None


def _parse_rv(value: str, *, list_call: bool, plain: bool = False) -> int:
    try:
        n = int(value)
        if n < 0:
            raise ValueError(value)
        return n
    except ValueError:
        msg = f'strconv.ParseUint: parsing "{value}": invalid syntax'
        if plain:
            raise internal(msg) from None
        raise internal(f'resourceVersion: Invalid value: "{value}": {msg}') from None


def _list_options_invalid(fld: str, detail: str) -> StatusError:
    return StatusError(
        422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {fld}: Forbidden: {detail}',
        {"group": "meta.k8s.io", "kind": "ListOptions", "causes": [{
            "reason": "FieldValueForbidden", "message": f"Forbidden: {detail}", "field": fld}]})


def _encode_continue(rv: int, start: str) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _go_quote_char(c: int) -> str:
    if c == ord("'"):
        return "'\\''"
    if c == ord('"'):
        return "'\"'"
    if 0x20 <= c < 0x7F:
        return f"'{chr(c)}'"
    if c < 0x80:
        return f"'\\x{c:02x}'"
    return f"'\\u{c:04x}'"


def _decode_continue(token: str) -> tuple[int, str]:
    """Decode a continue token; raises the recorded 400 for a bad one."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"invalid continue token: {exc}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        first = raw.lstrip()[:1]
        char = _go_quote_char(first[0]) if first else "''"
        raise bad_request(
            "invalid continue token: continue key is not valid: invalid character"
            f" {char} looking for beginning of value") from None
    if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
        raise bad_request("invalid continue token: continue key is not valid: incorrect encoded"
                          " start resourceVersion (version meta.k8s.io/v1)")
    start = str(data.get("start", ""))
    if start.startswith("/"):
        start = start[1:]
    return int(data.get("rv", 0)), start


def _list_key(rt: ResourceType, ns: str | None) -> Callable[[dict[str, Any]], str]:
    if rt.namespaced and ns is None:
        return lambda o: f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
    return lambda o: str(o["metadata"]["name"])


_APPLY_IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}


def _leaf_paths(obj: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Paths (through maps only; lists are leaves) of an applied configuration."""
    if isinstance(obj, dict) and obj:
        out: set[tuple[str, ...]] = set()
        for k, v in obj.items():
            out |= _leaf_paths(v, (*prefix, k))
        return out - _APPLY_IDENTITY
    return {prefix} if prefix else set()


def _remove_path(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    cur: Any = obj
    for part in path[:-1]:
        cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is None:
            return
    if isinstance(cur, dict):
        cur.pop(path[-1], None)


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind",
                                                       "apiVersion")}


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for c in statuses if c.get('ready'))}/{total}"


def _pod_status(pod: dict[str, Any]) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    if (pod.get("spec") or {}).get("schedulingGates"):
        return "SchedulingGated"
    return str((pod.get("status") or {}).get("phase") or "Unknown")


def _json_path(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.strip(".").split("."):
        if not part:
            continue
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _age(ts: str) -> str:
    try:
        t = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return ts
    secs = int((dt.datetime.now(dt.UTC) - t).total_seconds())
    if secs < 120:
        return f"{max(secs, 0)}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def build_app(server: KubeServer) -> web.Application:
    """The aiohttp application serving ``server`` (one catch-all route)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", server.handle)
    return app
