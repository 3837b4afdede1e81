"""Replay recorded kube-apiserver v1.36 exchanges (``shared/reference``) against localkube and
against the real control plane.

Each reference file is replayed in order against two backends: a fresh localkube, and the
session's real control plane (``real_kube``: kube-apiserver v1.36.2 + etcd, marked
``realcluster``). The real replay keeps the recordings true: an exchange the live server no
longer reproduces fails ``test_replay[<file>-real]`` with the exchange's name.

Objects the recording shows but did not create (they were made by earlier recording steps) are
created first from the recorded response bodies. resourceVersions, UIDs and continue tokens in
later requests are mapped from the recorded values to the ones the server returned. The status
code must match for every exchange; for ``Status`` bodies the reason and the message too
(exactly, or by the pattern in ``MESSAGE_PATTERNS`` where the real message embeds run-specific
values); for objects the kind and name; for lists the kind and item names; for watches the event
types and object names. Exchanges a backend cannot reproduce are skipped by ``SKIP``
(localkube) or ``REAL_SKIP`` (real control plane), each with the reason.

On the real control plane, which the whole session shares:

- every recorded namespace is replayed in a fresh namespace (``<recorded>-<hex>``); paths and
  ``namespace`` fields of request bodies are mapped to it, and the fresh names in answers are
  mapped back before the comparison (messages quote namespaces); cluster-wide lists are
  compared on the items of the replay's own namespaces;
- cluster-scoped objects a file creates or deletes (``CLUSTER_OBJECTS``: the
  PodPlacementConfig ``cluster``, the node ``node-a``, the CRDs) are saved and removed before
  the replay and put back after it (the CRDs as ``deploy/`` has them);
- requests the recording made with other credentials (``CREDENTIALS``) are sent with them: a
  ServiceAccount token from the TokenRequest API, an invalid bearer token, or none.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest
import yaml

from localkube import LocalKube
from tests.harness.kube import CRD_FILES, KubeEnv
from tests.harness.reference import REFERENCE

FILES = [
    "errors.json",
    "deletes.json",
    "list-pagination.json",
    "list-field-selectors.json",
    "watch-pods.json",
    "watch-variants.json",
    "watch-too-old-resource-version.json",
    "node-create.json",
    "crd-podplacementconfig.json",
    "crd-noderesourcetopology.json",
    "events.json",
    "leases.json",
]

NO_AUTH = "localkube has no authentication or authorization (RBAC/401/403 not modelled)"
#: file -> {exchange name prefix: reason} (localkube)
SKIP: dict[str, dict[str, str]] = {
    "errors.json": {
        "unknown field in a pod, default fieldValidation": "built-in types carry no schema in "
        "localkube: unknown fields of pods are kept, not warned about",
        "unknown field with fieldValidation=Strict": "built-in types carry no schema in "
        "localkube: no strict decoding of pods",
        "SelfSubjectReview": NO_AUTH,
        "SelfSubjectAccessReview": NO_AUTH,
        "list pods with the SA token": NO_AUTH,
        "get a pod with the SA token": NO_AUTH,
        "patch a pod with the SA token": NO_AUTH,
        "cluster-wide pod list with the SA token": NO_AUTH,
        "cluster-wide pod watch with the SA token": NO_AUTH,
        "get the cluster-scoped custom resource with the SA token": NO_AUTH,
        "get a MISSING pod with the SA token": NO_AUTH,
        "invalid bearer token": NO_AUTH,
        "no credentials at all": NO_AUTH,
    },
    "deletes.json": {},
    "list-pagination.json": {
        "continue token used against a different path": "the recorded token's start key "
        "(page-1) ordered against the cluster-wide keys of the recording's other namespaces; "
        "the recorded items depend on objects that are not in this file",
    },
    "watch-variants.json": {
        "streaming list": "artefact of the recording's etcd 3.4 (RequestWatchProgress off); "
        "localkube serves streaming lists as etcd >= 3.5 would",
    },
    "watch-too-old-resource-version.json": {
        "etcd compaction": "not an apiserver call",
        "continue token from before the etcd compaction": "recorded token rv from another run",
        "list at resourceVersion=603": "needs the recorded revision numbering",
        "watch from resourceVersion=603": "needs the recorded revision numbering and churn "
        "writes that are not in the file",
        "list at a future resourceVersion": "covered in test_core (the real server waits ~3 s "
        "before the 504)",
        "following the inconsistent continue token": "items depend on churn writes that are "
        "not in the file",
        "list at resourceVersion=300 without resourceVersionMatch": "items depend on churn "
        "writes that are not in the file",
        "list at resourceVersion=300 (compacted, older than the watch cache) with": "the "
        "recording's revision 300 is in localkube's future; the Exact 410 is covered in "
        "test_core",
        "continue token whose rv (300)": "crafted token with the recording's revision numbers "
        "(rv 300 is in localkube's future); the 410 + fresh token is covered in test_core",
    },
    "crd-podplacementconfig.json": {
        "watch podplacementconfigs": "replayed by test_conformance_crd_watch (needs the "
        "writes made during the watch)",
        "GET as Table": "Table cells compared in test_core; Age differs by run",
    },
    "events.json": {},
    "leases.json": {},
}

#: file -> {exchange name prefix: reason} (real control plane). Everything else is replayed.
REAL_SKIP: dict[str, dict[str, str]] = {
    "list-pagination.json": {
        "continue token used against a different path": "the recorded token's start key "
        "'page-1\\0' is compared with the cluster-wide keys '<namespace>/<name>': the answer "
        "depends on the recording's namespace names and on objects that are not in this file",
    },
    "watch-too-old-resource-version.json": {
        "etcd compaction": "not an apiserver call (compacting the session's shared etcd "
        "would expire other tests' watches)",
        "watch from resourceVersion=1": "needs a watch cache that has evicted events (the "
        "recording's window started at rv 398 after churn writes): the session's pods watch "
        "cache has evicted nothing since its initial list, so v1.36 answers rv 1 with "
        "synthetic ADDED events instead of the 410 (checked against localkube's 5-event "
        "history)",
        "watch from resourceVersion=603": "replays 5 MODIFIED events of churn writes that "
        "are not in the file",
        "continue token whose rv (300)": "crafted with the recording's revision 300 and the "
        "recording's watch-cache window; on the session's server rv 300 may lie inside the "
        "window",
        "list at resourceVersion=300 (compacted, older than the watch cache) with": "needs "
        "the recording's revision numbering: rv 300 may lie inside this server's watch-cache "
        "window",
    },
    "crd-podplacementconfig.json": {
        "watch podplacementconfigs": "replayed by test_conformance_crd_watch[real] (needs the "
        "writes made during the watch)",
    },
}

#: file -> {exchange name prefix: reason}: recorded exchanges the live v1.36.2 server no longer
#: reproduces. They are still sent; a difference is tolerated, a match fails the test (remove
#: the entry then).
REAL_KNOWN: dict[str, dict[str, str]] = {}

#: (file, exchange name prefix) -> regex the message must match (run-specific parts).
MESSAGE_PATTERNS: dict[tuple[str, str], str] = {
    ("watch-too-old-resource-version.json", "watch from resourceVersion=1"):
        r"too old resource version: 1 \(\d+\)",
    ("watch-too-old-resource-version.json", "list at a future resourceVersion"):
        r"Timeout: Too large resource version: 99999999, current: \d+",
    ("errors.json", "malformed JSON body on create"): r"the object provided is unrecognized "
        r"\(must be of type Pod\): couldn't get version/kind; json parse error: .*",
}

SA_TOKEN, BAD_TOKEN, ANONYMOUS = "sa-token", "invalid-token", "anonymous"
#: file -> {exchange name prefix: credentials the recording used instead of the admin's}
CREDENTIALS: dict[str, dict[str, str]] = {
    "errors.json": {
        "SelfSubjectReview with the SA token": SA_TOKEN,
        "list pods with the SA token": SA_TOKEN,
        "get a pod with the SA token": SA_TOKEN,
        "patch a pod with the SA token": SA_TOKEN,
        "cluster-wide pod list with the SA token": SA_TOKEN,
        "cluster-wide pod watch with the SA token": SA_TOKEN,
        "get the cluster-scoped custom resource with the SA token": SA_TOKEN,
        "get a MISSING pod with the SA token": SA_TOKEN,
        "SelfSubjectAccessReview: may the SA patch pods?": SA_TOKEN,
        "invalid bearer token": BAD_TOKEN,
        "no credentials at all": ANONYMOUS,
    },
}

#: Objects some files use but never show in a response body (created before the replay).
EXTRA_SEEDS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "deletes.json": [(
        "/apis/podplacement.io/v1beta1/podplacementconfigs",
        {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
         "metadata": {"name": "cluster"},
         "spec": {"plugins": {"nodeAffinityScoring": {"enabled": True, "platforms": [
             {"architecture": "arm64", "weight": 50}]}}}},
    )],
    "watch-variants.json": [(
        "/api/v1/namespaces/watch/pods",
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "gated-bind", "labels": {"app": "watch", "set": "bind"}},
         "spec": {"schedulingGates": [{"name": "podplacement.io/scheduling-gate"}],
                  "containers": [{"name": "c", "image": "busybox:1.36"}]}},
    )],
}

#: Steps the recording made between two exchanges without recording them.
PRE_ACTIONS: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("crd-podplacementconfig.json", "unknown field spec.unknownField, default"): [
        ("DELETE", "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster")],
}

#: file -> (recorded namespace, a recorded resourceVersion sent as is that the recording's
#: server had passed). Real control plane: pod writes in that namespace are made first until
#: this server has passed it too.
REAL_RV_FLOOR: dict[str, tuple[str, int]] = {
    # "list at resourceVersion=300 without resourceVersionMatch -> 200 current data"
    "watch-too-old-resource-version.json": ("watch", 300),
}

_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_PPC = "/apis/podplacement.io/v1beta1/podplacementconfigs"
#: Cluster-scoped objects a file creates or deletes. On the shared real control plane they are
#: saved and removed before the replay and put back after it (a CRD with its custom resources;
#: the CRDs as ``deploy/`` has them).
CLUSTER_OBJECTS: dict[str, list[str]] = {
    "deletes.json": [f"{_PPC}/cluster"],
    "node-create.json": ["/api/v1/nodes/node-a"],
    "crd-podplacementconfig.json": [f"{_CRDS}/podplacementconfigs.podplacement.io"],
    "crd-noderesourcetopology.json": [f"{_CRDS}/noderesourcetopologies.topology.node.k8s.io"],
}

_SERVER_META = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation",
                "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")
_NS_SEGMENT = re.compile(r"/namespaces/([^/?]+)")


@dataclass
class Replay:
    """State of one file's replay: maps from recorded to this server's values.

    ``ns_map`` maps recorded namespace names to the replay's own (real control plane only;
    identity on a fresh localkube). ``sa_token`` is the ServiceAccount token the replay obtained
    for exchanges recorded with one.
    """

    env: KubeEnv
    file: str
    rv_map: dict[str, str] = field(default_factory=dict)
    uid_map: dict[str, str] = field(default_factory=dict)
    token_map: dict[str, str] = field(default_factory=dict)
    name_map: dict[str, str] = field(default_factory=dict)
    ns_map: dict[str, str] = field(default_factory=dict)
    sa_token: str | None = None
    _bare: httpx.Client | None = None

    @property
    def real(self) -> bool:
        """Whether this replay runs on the real control plane."""
        return self.env.kind == "real"

    def close(self) -> None:
        """Close the client without credentials, if one was made."""
        if self._bare is not None:
            self._bare.close()
            self._bare = None

    def bare_client(self) -> httpx.Client:
        """A client for the same server that sends no Authorization header of its own."""
        if self._bare is None:
            verify: Any = (ssl.create_default_context(cafile=str(self.env.ca_file))
                           if self.env.ca_file else True)
            self._bare = httpx.Client(base_url=self.env.url, verify=verify, timeout=30.0,
                                      headers={"Accept": "application/json"})
        return self._bare

    def client_for(self, credentials: str | None) -> tuple[httpx.Client, dict[str, str]]:
        """The client and extra headers for requests made with ``credentials``."""
        if credentials is None:
            return self.env.client, {}
        if credentials == SA_TOKEN:
            assert self.sa_token, "no ServiceAccount token was obtained before this exchange"
            return self.bare_client(), {"Authorization": f"Bearer {self.sa_token}"}
        if credentials == BAD_TOKEN:
            return self.bare_client(), {"Authorization": "Bearer not-a-valid-token"}
        return self.bare_client(), {}

    def map_namespace(self, name: str) -> str:
        """The replay's namespace for the recorded namespace ``name`` (made up on first use
        on the real control plane)."""
        if not self.real:
            return name
        if name not in self.ns_map:
            self.ns_map[name] = f"{name}-{uuid.uuid4().hex[:8]}"
        return self.ns_map[name]

    def unmap(self, value: Any) -> Any:
        """``value`` with the replay's namespace names replaced by the recorded ones."""
        if not self.ns_map:
            return value
        if isinstance(value, str):
            for recorded, ours in self.ns_map.items():
                value = value.replace(ours, recorded)
            return value
        if isinstance(value, dict):
            return {k: self.unmap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.unmap(v) for v in value]
        return value

    def learn(self, recorded: Any, ours: Any) -> None:
        """Record recorded->ours mappings of resourceVersion, uid and continue tokens."""
        if not isinstance(recorded, dict) or not isinstance(ours, dict):
            return
        rm, om = recorded.get("metadata") or {}, ours.get("metadata") or {}
        if isinstance(rm, dict) and isinstance(om, dict):
            if rm.get("resourceVersion") and om.get("resourceVersion"):
                self.rv_map[str(rm["resourceVersion"])] = str(om["resourceVersion"])
            if rm.get("uid") and om.get("uid"):
                self.uid_map[rm["uid"]] = om["uid"]
            if rm.get("generateName") and rm.get("name") and om.get("name"):
                self.name_map[rm["name"]] = om["name"]
            if rm.get("continue") and om.get("continue"):
                self.token_map[rm["continue"]] = om["continue"]
        ritems, oitems = recorded.get("items"), ours.get("items")
        if isinstance(ritems, list) and isinstance(oitems, list):
            by_name = {(self.unmap(i["metadata"].get("namespace")), i["metadata"]["name"]): i
                       for i in oitems}
            for item in ritems:
                key = (item["metadata"].get("namespace"), item["metadata"]["name"])
                if key in by_name:
                    self.learn(item, by_name[key])

    def map_body(self, body: Any) -> Any:
        """Rewrite recorded resourceVersions/uids/namespaces inside a request body."""
        if isinstance(body, dict):
            out = {}
            for k, v in body.items():
                if k == "resourceVersion" and isinstance(v, str) and v in self.rv_map:
                    out[k] = self.rv_map[v]
                elif k == "uid" and isinstance(v, str) and v in self.uid_map:
                    out[k] = self.uid_map[v]
                elif k == "namespace" and isinstance(v, str) and v in self.ns_map:
                    out[k] = self.ns_map[v]
                else:
                    out[k] = self.map_body(v)
            return out
        if isinstance(body, list):
            return [self.map_body(v) for v in body]
        return body

    def map_path(self, path: str) -> str:
        """Rewrite the recorded namespace and resourceVersion / continue query values."""
        parts = urlsplit(path)
        base = _NS_SEGMENT.sub(lambda m: "/namespaces/" + self.ns_map.get(m.group(1),
                                                                          m.group(1)),
                               parts.path)
        if not parts.query:
            return base
        query = []
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            if k == "resourceVersion" and v in self.rv_map:
                v = self.rv_map[v]
            if k == "continue" and v in self.token_map:
                v = self.token_map[v]
            query.append((k, v))
        return base + "?" + urlencode(query)


def _prefix_match(table: dict[str, dict[str, str]], file: str, name: str) -> str | None:
    return next((v for prefix, v in table.get(file, {}).items() if name.startswith(prefix)),
                None)


def _skip_reason(replay: Replay, name: str, exchange: dict[str, Any]) -> str | None:
    if "request" not in exchange or "path" not in (exchange.get("request") or {}):
        return "not an HTTP exchange with the apiserver"
    if replay.real:
        return _prefix_match(REAL_SKIP, replay.file, name)
    reason = _prefix_match(SKIP, replay.file, name)
    if reason:
        return reason
    if exchange["response"]["status"] in (401, 403):
        return NO_AUTH
    return None


def _collection_of(path: str, obj: dict[str, Any]) -> str:
    """The collection URL an object belongs to, from the request path that showed it."""
    base = urlsplit(path).path.rstrip("/")
    m = re.match(r"^(/api/v1|/apis/[^/]+/[^/]+)(?:/namespaces/[^/]+)?/([^/]+)", base)
    if m is None:
        raise ValueError(path)
    prefix, plural = m.group(1), m.group(2)
    path_ns = re.search(r"/namespaces/([^/]+)/", base)
    ns = obj["metadata"].get("namespace") or (path_ns.group(1) if path_ns else None)
    if ns and plural != "namespaces":
        return f"{prefix}/namespaces/{ns}/{plural}"
    return f"{prefix}/{plural}"


def _clean(obj: dict[str, Any], plural: str, unbind: bool = False) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = {k: v for k, v in obj["metadata"].items() if k not in _SERVER_META}
    out["metadata"] = meta
    if plural == "pods":
        spec = {k: v for k, v in (out.get("spec") or {}).items() if v is not None}
        spec.setdefault("containers", [{"name": "c", "image": "busybox:1.36"}])
        spec.pop("volumes", None)
        for key in ("containers", "initContainers"):
            if key in spec:
                spec[key] = [{k: v for k, v in c.items() if k != "volumeMounts"}
                             for c in spec[key]]
        if unbind:
            spec.pop("nodeName", None)
        out["spec"] = spec
    return out


def _object_key(coll: str, name: str) -> tuple[str, str, str]:
    """(namespace, plural, name): events.k8s.io and core events share one key."""
    m = re.search(r"/namespaces/([^/]+)/([^/]+)$", coll)
    if m:
        return (m.group(1), m.group(2), name)
    return ("", coll.rsplit("/", 1)[-1], name)


def _shown_objects(ex: dict[str, Any]) -> list[dict[str, Any]]:
    """Objects an exchange's response shows as existing before or after it."""
    resp = ex.get("response") or {}
    shown: list[dict[str, Any]] = []
    rbody = resp.get("body")
    if isinstance(rbody, dict) and rbody.get("kind") not in (None, "Status", "Table"):
        if isinstance(rbody.get("items"), list):
            shown.extend(rbody["items"])
        elif isinstance(rbody.get("metadata"), dict) and rbody["metadata"].get("name"):
            shown.append(rbody)
    query = dict(parse_qsl(urlsplit(ex["request"]["path"]).query))
    if query.get("resourceVersion", "0") == "0":
        # Only a watch without resourceVersion shows pre-existing objects (synthetic ADDED).
        for ev in resp.get("events") or []:
            if isinstance(ev, dict) and ev.get("type") == "ADDED":
                shown.append(ev["object"])
    return [o for o in shown if isinstance(o.get("metadata"), dict) and "name" in o["metadata"]]


def _seed(replay: Replay, exchanges: list[dict[str, Any]]) -> None:
    env = replay.env
    created: set[tuple[str, str, str]] = set()
    seeds: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
    namespaces: set[str] = set()
    bound: set[str] = set()
    for ex in exchanges:
        req = ex.get("request") or {}
        path = req.get("path")
        if not path:
            continue
        namespaces.update(_NS_SEGMENT.findall(path))
        base = urlsplit(path).path.rstrip("/")
        resp = ex.get("response") or {}
        rbody = resp.get("body")
        if req.get("method") == "POST" and base.endswith("/binding"):
            bound.add(base.rsplit("/", 2)[-2])
        if (req.get("method") == "POST" and resp.get("status") == 201
                and isinstance(rbody, dict) and not base.endswith("/binding")
                and isinstance(rbody.get("metadata"), dict)):
            created.add(_object_key(base, rbody["metadata"].get("name", "")))
        for obj in _shown_objects(ex):
            try:
                coll = _collection_of(path, obj)
            except ValueError:
                continue
            key = _object_key(coll, obj["metadata"]["name"])
            if key not in created and key not in seeds:
                seeds[key] = (coll, obj)
    for ns in sorted(namespaces):
        # on the real control plane "no-such-ns" is mapped to a fresh name that surely is free
        mapped = replay.map_namespace(ns)
        if ns != "no-such-ns":
            env.ensure_namespace(mapped)
    for coll, obj in EXTRA_SEEDS.get(replay.file, []):
        env.create(replay.map_path(coll), obj)
    for coll, obj in seeds.values():
        plural = coll.rsplit("/", 1)[-1]
        if plural == "namespaces":
            continue
        body = replay.map_body(_clean(obj, plural, unbind=obj["metadata"]["name"] in bound))
        r = env.request("POST", replay.map_path(coll), json=body)
        assert r.status_code in (201, 409), (coll, r.text)
        replay.learn(obj, r.json())


def _credentials(replay: Replay, name: str) -> str | None:
    return _prefix_match(CREDENTIALS, replay.file, name) if replay.real else None


def _send(replay: Replay, ex: dict[str, Any]) -> Any:
    req = ex["request"]
    path = replay.map_path(req["path"])
    client, headers = replay.client_for(_credentials(replay, ex["name"]))
    headers["Accept"] = req.get("headers", {}).get("Accept", "application/json")
    content: bytes | None = None
    ctype = req.get("content_type") or req.get("headers", {}).get("Content-Type")
    if "body_raw" in req:
        content = str(req["body_raw"]).encode()
    elif req.get("body") is not None:
        content = json.dumps(replay.map_body(req["body"])).encode()
    if ctype:
        headers["Content-Type"] = ctype
    if "events" in ex["response"]:
        return _watch(client, path, headers)
    return client.request(req["method"], path, content=content, headers=headers)


def _watch(client: httpx.Client, path: str, headers: dict[str, str],
           timeout_seconds: int = 1) -> tuple[int, list[Any]]:
    """A watch bounded by ``timeoutSeconds``: (HTTP status, stream lines or the error body)."""
    parts = urlsplit(path)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query["timeoutSeconds"] = str(timeout_seconds)
    with client.stream("GET", parts.path, params=query, headers=headers, timeout=30) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [r.json()]
        return 200, [json.loads(line) for line in r.iter_lines() if line.strip()]


def _watch_during(client: httpx.Client, path: str, action: Callable[[], None],
                  timeout_seconds: int) -> tuple[int, list[Any]]:
    """A bounded watch of ``path``; ``action`` runs once the server has answered it."""
    parts = urlsplit(path)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query["timeoutSeconds"] = str(timeout_seconds)
    answered = threading.Event()
    result: list[tuple[int, list[Any]]] = []

    def watch() -> None:
        try:
            with client.stream("GET", parts.path, params=query, timeout=30,
                               headers={"Accept": "application/json"}) as r:
                answered.set()
                if r.status_code != 200:
                    r.read()
                    result.append((r.status_code, [r.json()]))
                else:
                    result.append((200, [json.loads(line) for line in r.iter_lines()
                                         if line.strip()]))
        finally:
            answered.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        assert answered.wait(30), "the watch was not answered"
        action()
    finally:
        thread.join(timeout_seconds + 30)
    assert result, "the watch did not end"
    return result[0]


def _check_status_body(file: str, name: str, want: dict[str, Any], got: dict[str, Any],
                       unordered: bool = False) -> None:
    """Compare a Status. ``unordered``: the causes may come in any order (the message lists
    them in the order of ``got``'s causes)."""
    assert got.get("kind") == "Status", got
    assert got.get("reason", "") == want.get("reason", ""), (want, got)
    assert got.get("code") == want.get("code"), (want, got)
    wcauses = want.get("details", {}).get("causes")
    gcauses = (got.get("details") or {}).get("causes")
    pattern = next((p for (f, n), p in MESSAGE_PATTERNS.items()
                    if f == file and name.startswith(n)), None)
    if pattern:
        assert re.fullmatch(pattern, got.get("message", "")), (pattern, got)
    elif unordered and wcauses and len(wcauses) > 1 and gcauses:
        head = want["message"].split(": [", 1)[0]
        assert got.get("message") == head + ": [" + ", ".join(
            f"{c['field']}: {c['message']}" for c in gcauses) + "]", (want, got)
    else:
        assert got.get("message") == want.get("message"), (want, got)
    if wcauses:
        if unordered:
            key = json.dumps
            assert sorted(map(key, gcauses or [])) == sorted(map(key, wcauses)), (want, got)
        else:
            assert gcauses == wcauses, (want, got)


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


def _own_items(replay: Replay, path: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """On the real control plane, a cluster-wide list of namespaced objects keeps only the
    items of the replay's own namespaces (the session's other tests have objects too)."""
    if not replay.real or _NS_SEGMENT.search(urlsplit(path).path):
        return items
    ours = set(replay.ns_map.values())
    return [i for i in items
            if not i["metadata"].get("namespace") or i["metadata"]["namespace"] in ours]


def _check_review(replay: Replay, want: dict[str, Any], got: dict[str, Any]) -> None:
    """SelfSubjectReview / SelfSubjectAccessReview: who the server saw, and its verdict."""
    wstatus, gstatus = want.get("status") or {}, replay.unmap(got.get("status") or {})
    if "userInfo" in wstatus:
        wu, gu = wstatus["userInfo"], gstatus["userInfo"]
        assert (gu.get("username"), gu.get("groups")) == (wu.get("username"), wu.get("groups"))
        assert gu.get("uid") == replay.uid_map.get(wu.get("uid", ""), wu.get("uid")), gu
        assert set(gu.get("extra") or {}) == set(wu.get("extra") or {}), gu
    if "allowed" in wstatus:
        assert gstatus.get("allowed") == wstatus["allowed"], gstatus


def _check(replay: Replay, ex: dict[str, Any], got: Any) -> None:
    file, name = replay.file, ex["name"]
    want = ex["response"]
    if "events" in want:
        status, events = got
        events = replay.unmap(events)
        assert status == want["status"], events
        want_ev = [(e["type"], (e["object"].get("metadata") or {}).get("name"))
                   for e in want["events"] if isinstance(e, dict) and "type" in e
                   and e["type"] != "BOOKMARK"]
        got_ev = [(e["type"], (e["object"].get("metadata") or {}).get("name"))
                  for e in events if e.get("type") != "BOOKMARK"] if status == 200 else []
        assert got_ev == want_ev
        for w, g in zip([e for e in want["events"] if isinstance(e, dict) and "type" in e],
                        events, strict=False):
            if w["type"] == "ERROR":
                _check_status_body(file, name, w["object"], g["object"])
        if status != 200:
            _check_status_body(file, name, want["events"][0], events[0])
        return
    assert got.status_code == want["status"], got.text[:2000]
    wbody = want.get("body")
    if isinstance(wbody, str):
        assert got.text == wbody
        return
    if not isinstance(wbody, dict):
        return
    gbody = got.json()
    if wbody.get("kind") == "Status" and wbody.get("status") == "Failure":
        # kube-apiserver validates custom resources against the OpenAPI schema walking its
        # properties in Go map order: the causes of sibling fields come in any order.
        unordered = replay.real and file.startswith("crd-")
        _check_status_body(file, name, wbody, replay.unmap(gbody), unordered)
        if wbody.get("metadata", {}).get("continue"):
            assert gbody["metadata"].get("continue")
        return
    assert gbody.get("kind") == wbody.get("kind"), gbody
    if wbody.get("kind") == "Status":
        assert gbody.get("status") == wbody.get("status")
        return
    if wbody.get("kind") in ("SelfSubjectReview", "SelfSubjectAccessReview"):
        _check_review(replay, wbody, gbody)
    if isinstance(wbody.get("items"), list):
        gitems = _own_items(replay, ex["request"]["path"], gbody["items"])
        want_names = [replay.name_map.get(n, n) for n in _names(wbody["items"])]
        got_names = _names(gitems)
        if any(n in replay.name_map for n in _names(wbody["items"])):
            # generated names sort at random places: compare as sets of names
            want_names, got_names = sorted(want_names), sorted(got_names)
        assert got_names == want_names
        wmeta, gmeta = wbody.get("metadata", {}), gbody.get("metadata", {})
        assert bool(gmeta.get("continue")) == bool(wmeta.get("continue"))
        assert ("remainingItemCount" in gmeta) == ("remainingItemCount" in wmeta)
        if "remainingItemCount" in wmeta:
            assert gmeta["remainingItemCount"] == wmeta["remainingItemCount"]
    elif isinstance(wbody.get("metadata"), dict) and "name" in wbody["metadata"]:
        req_body = ex["request"].get("body")
        got_name = replay.unmap(gbody["metadata"]["name"])
        if isinstance(req_body, dict) and (req_body.get("metadata") or {}).get("generateName"):
            assert got_name.startswith(req_body["metadata"]["generateName"])
        else:
            assert got_name == wbody["metadata"]["name"]
        if "resourceVersion" not in wbody["metadata"]:
            assert "resourceVersion" not in gbody["metadata"]
        if file.startswith("crd-") and wbody.get("kind") != "CustomResourceDefinition":
            # custom resources carry no server-made fields outside metadata: all must match
            assert {k: v for k, v in gbody.items() if k != "metadata"} == {
                k: v for k, v in wbody.items() if k != "metadata"}
            assert gbody["metadata"].get("generation") == wbody["metadata"].get("generation")
    if "Warning" in want.get("headers", {}):
        assert got.headers.get("Warning") == want["headers"]["Warning"]
    replay.learn(wbody, gbody)


def _verify(replay: Replay, ex: dict[str, Any], send: Callable[[], Any]) -> None:
    """Send one exchange and compare the answer; a difference names the exchange."""
    name = ex["name"]
    known = _prefix_match(REAL_KNOWN, replay.file, name) if replay.real else None
    try:
        _check(replay, ex, send())
    except AssertionError as exc:
        if known:
            print(f"  known difference, {name!r}: {known}")
            return
        raise AssertionError(f"{replay.file} on {replay.env.kind}: the recorded exchange "
                             f"{name!r} is not reproduced: {exc}") from exc
    except Exception as exc:
        exc.add_note(f"while replaying {replay.file} exchange {name!r} on {replay.env.kind}")
        raise
    assert not known, (f"{replay.file}: {name!r} is reproduced now; remove it from "
                       f"REAL_KNOWN ({known})")


# --- the real control plane: credentials, cluster-scoped objects, CRDs ------------------------


def _obtain_sa_token(replay: Replay, ex: dict[str, Any]) -> bool:
    """A recorded ``kubectl -n NS create token SA`` step: get the token by TokenRequest.
    Returns whether ``ex`` was such a step."""
    m = re.search(r"kubectl -n (\S+) create token (\S+)", ex.get("name", ""))
    if m is None or not replay.real:
        return False
    ns, sa = replay.map_namespace(m.group(1)), m.group(2)
    r = replay.env.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                           json={"apiVersion": "authentication.k8s.io/v1",
                                 "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    assert r.status_code == 201, r.text
    replay.sa_token = r.json()["status"]["token"]
    return True


def _advance_past(env: KubeEnv, namespace: str, rv: int) -> None:
    """Write an unlabelled pod of ``namespace`` until the server's resourceVersion is past
    ``rv``. Pod writes, so that the pods watch cache is current too (etcd 3.4 sends no progress
    notifications: other writes would leave it behind the RV a list returns)."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    made = env.create(path, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rv-floor"},
                             "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}})
    n = 0
    while int(made["metadata"]["resourceVersion"]) <= rv:
        n += 1
        made = env.patch(f"{path}/rv-floor", {"metadata": {"annotations": {
            "replay.podplacement.io/write": str(n)}}})


def _wait(what: str, done: Callable[[], bool], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {limit} s")
        time.sleep(0.1)


def _served_paths(crd: dict[str, Any]) -> list[str]:
    spec = crd["spec"]
    return [f"/apis/{spec['group']}/{v['name']}/{spec['names']['plural']}"
            for v in spec["versions"] if v.get("served")]


def _wait_established(env: KubeEnv, crd_path: str) -> None:
    """Wait until the CRD at ``crd_path`` is Established and all its versions are served."""

    def established() -> bool:
        r = env.request("GET", crd_path)
        return r.status_code == 200 and any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (r.json().get("status") or {}).get("conditions") or [])

    _wait(f"{crd_path} Established", established)
    for p in _served_paths(env.get(crd_path)):
        _wait(f"{p} served", lambda p=p: env.request("GET", p).status_code == 200)


def _deployed_crd(name: str) -> dict[str, Any] | None:
    for path in CRD_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and (doc.get("metadata") or {}).get("name") == name:
                return doc
    return None


def _recorded_crd(file: str, name: str) -> dict[str, Any] | None:
    for ex in json.loads((REFERENCE / file).read_text())["exchanges"]:
        body = (ex.get("request") or {}).get("body")
        if (isinstance(body, dict) and body.get("kind") == "CustomResourceDefinition"
                and body["metadata"]["name"] == name and ex["response"]["status"] == 201):
            return body
    return None


def _delete_and_wait(env: KubeEnv, path: str) -> None:
    r = env.delete(path)
    assert r.status_code in (200, 202, 404), (path, r.text)
    _wait(f"{path} gone", lambda: env.request("GET", path).status_code == 404)


def _restore(env: KubeEnv, path: str, saved: dict[str, Any]) -> None:
    """Re-create the saved cluster-scoped object at ``path`` with its spec and status."""
    coll = path.rsplit("/", 1)[0]
    body = {k: v for k, v in saved.items() if k != "status"}
    body["metadata"] = {k: v for k, v in saved["metadata"].items()
                        if k not in (*_SERVER_META, "finalizers")}
    made = env.create(coll, body)
    if "spec" in saved and made.get("spec") != saved["spec"]:
        env.patch(path, [{"op": "replace", "path": "/spec", "value": saved["spec"]}], "json")
    if saved.get("status"):
        r = env.request("PATCH", f"{path}/status", json={"status": saved["status"]},
                        content_type="merge")
        assert r.status_code in (200, 404), r.text


@contextmanager
def _cluster_objects(env: KubeEnv, file: str) -> Iterator[None]:
    """Real control plane: take the cluster-scoped objects ``file`` creates or deletes out of
    the way for the replay (a CRD with its custom resources) and put them back after it."""
    saved: dict[str, dict[str, Any]] = {}
    replaced_crds: list[str] = []
    for path in CLUSTER_OBJECTS.get(file, []):
        r = env.request("GET", path)
        if r.status_code != 200:
            continue
        obj = r.json()
        if path.startswith(_CRDS + "/"):
            # its custom resources go with it: keep them (storage version path)
            cr_path = _served_paths(obj)[-1]
            for item in env.get(cr_path)["items"]:
                saved[f"{cr_path}/{item['metadata']['name']}"] = item
            replaced_crds.append(path)
        else:
            saved[path] = obj
        _delete_and_wait(env, path)
    try:
        yield
    finally:
        for path in CLUSTER_OBJECTS.get(file, []):
            if not path.startswith(_CRDS + "/"):
                env.delete(path)
                continue
            name = path.rsplit("/", 1)[1]
            deployed = _deployed_crd(name)
            recorded = _recorded_crd(file, name)
            same = (deployed is not None and recorded is not None
                    and deployed["spec"] == recorded["spec"])
            if env.request("GET", path).status_code == 200:
                if same:
                    # the replay's CRD is the deployed one: drop the replay's custom resources
                    crd = env.get(path)
                    for p in _served_paths(crd)[-1:]:
                        for item in env.get(p)["items"]:
                            env.delete(f"{p}/{item['metadata']['name']}")
                else:
                    _delete_and_wait(env, path)
        if replaced_crds:
            env.apply_crds()
            for path in replaced_crds:
                _wait_established(env, path)
        for path in saved:
            _delete_and_wait(env, path)
        for path, obj in saved.items():
            _restore(env, path, obj)


# --- the tests --------------------------------------------------------------------------------


def _cases() -> list[Any]:
    cases = []
    for f in FILES:
        cases.append(pytest.param((f, "localkube"), id=f"{f}-localkube"))
        cases.append(pytest.param((f, "real"), id=f"{f}-real",
                                  marks=pytest.mark.realcluster))
    return cases


@pytest.fixture
def replay_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KubeEnv]:
    """A fresh localkube for one file, or the session's real control plane (its cluster-scoped
    objects the file touches set aside for the replay)."""
    file, backend = request.param
    if backend == "real":
        env: KubeEnv = request.getfixturevalue("real_kube")
        with _cluster_objects(env, file):
            yield env
        return
    crds = [] if file.startswith("crd-") else CRD_FILES
    history = 5 if file.startswith("watch-too-old") else 10000
    server = LocalKube(crds, history_size=history, bookmark_interval=0.3).start()
    env = KubeEnv(url=server.url, kubeconfig=server.write_kubeconfig(tmp_path / "kc"),
                  kind="localkube", server=server)
    try:
        yield env
    finally:
        env.close()
        server.stop()


@pytest.mark.parametrize("replay_env", _cases(), indirect=True)
def test_replay(replay_env: KubeEnv, request: pytest.FixtureRequest) -> None:
    file = request.node.callspec.params["replay_env"][0]
    data = json.loads((REFERENCE / file).read_text())
    replay = Replay(replay_env, file)
    try:
        _replay_file(replay, data)
    finally:
        replay.close()
        for ns in replay.ns_map.values():
            replay_env.delete(f"/api/v1/namespaces/{ns}")


def _replay_file(replay: Replay, data: dict[str, Any]) -> None:
    env, file = replay.env, replay.file
    exchanges = data["exchanges"]
    _seed(replay, exchanges)
    if file.startswith("watch-too-old") and not replay.real:
        # Push the seeded objects' history out of the 5-event window so RV 1 is too old.
        for i in range(6):
            env.request("POST", "/api/v1/namespaces", json={
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"churn-{i}"}})
    if replay.real and file in REAL_RV_FLOOR:
        ns, rv = REAL_RV_FLOOR[file]
        _advance_past(env, replay.ns_map[ns], rv)
    if file == "watch-pods.json":
        _replay_watch_pods(replay, data)
        print(f"{file} on {env.kind}: 2 exchanges and "
              f"{len(data['writes_during_watch'])} writes checked")
        return
    checked = 0
    deferred: list[tuple[dict[str, Any], str]] = []
    skipped: list[tuple[str, str]] = []
    for ex in exchanges:
        name = ex.get("name", "")
        if _obtain_sa_token(replay, ex):
            continue
        reason = _skip_reason(replay, name, ex)
        if reason:
            skipped.append((name, reason))
            continue
        for (f, prefix), steps in PRE_ACTIONS.items():
            if f == file and name.startswith(prefix):
                for method, step_path in steps:
                    env.request(method, replay.map_path(step_path))
        if replay.real and name.startswith("GET the CRD once Established"):
            _wait_established(env, replay.map_path(ex["request"]["path"]))
        if _is_replay_watch(ex):
            # A watch from a resourceVersion sees the writes recorded after it: watch from the
            # RV the server has now, once those writes have been replayed.
            deferred.append((ex, env.get("/api/v1/namespaces")["metadata"]["resourceVersion"]))
            continue
        _verify(replay, ex, lambda ex=ex: _send(replay, ex))
        checked += 1
    for ex, rv in deferred:
        path = re.sub(r"resourceVersion=\d+", f"resourceVersion={rv}",
                      replay.map_path(ex["request"]["path"]))
        _verify(replay, ex, lambda path=path: _watch(env.client, path,
                                                      {"Accept": "application/json"}))
        checked += 1
    print(f"{file} on {env.kind}: {checked} exchanges checked, {len(skipped)} skipped")
    for name, reason in skipped:
        print(f"  skipped {name!r}: {reason}")
    assert checked > 0


def _is_replay_watch(ex: dict[str, Any]) -> bool:
    query = dict(parse_qsl(urlsplit(ex["request"]["path"]).query))
    if query.get("resourceVersion", "0") == "0":
        return False
    return any(isinstance(e, dict) and e.get("type") in ("ADDED", "MODIFIED", "DELETED")
               for e in ex["response"].get("events") or [])


def _replay_watch_pods(replay: Replay, data: dict[str, Any]) -> None:
    """watch-pods.json: list, make the recorded writes, then watch from the list RV."""
    env = replay.env
    first, watch = data["exchanges"][0], data["exchanges"][1]
    listed: list[httpx.Response] = []

    def send_list() -> Any:
        listed.append(_send(replay, first))
        return listed[0]

    _verify(replay, first, send_list)
    path = replay.map_path(watch["request"]["path"]).replace(
        "resourceVersion=554", "resourceVersion=" + listed[0].json()["metadata"][
            "resourceVersion"])

    def write() -> None:
        for w in data["writes_during_watch"]:
            got = _send(replay, w)
            assert got.status_code == w["response"]["status"], (w["name"], got.text)

    if replay.real:
        # As recorded: the writes are made while the watch is open. The real server sends
        # its pre-timeout BOOKMARK (about 2 s before timeoutSeconds ends) only to a watcher
        # that has had live events, not to one that only replayed history.
        status, events = _watch_during(env.client, path, write, timeout_seconds=4)
    else:
        write()
        status, events = _watch(env.client, path, {"Accept": "application/json"})
    want = [(e["type"], e["object"]["metadata"].get("name"))
            for e in watch["response"]["events"] if e["type"] != "BOOKMARK"]
    got = [(e["type"], e["object"]["metadata"].get("name")) for e in events
           if e["type"] != "BOOKMARK"]
    where = f"watch-pods.json on {env.kind}: the recorded exchange {watch['name']!r}"
    assert status == 200 and got == want, where
    assert any(e["type"] == "BOOKMARK" for e in events), where
    bookmark = next(e for e in events if e["type"] == "BOOKMARK")["object"]
    assert set(bookmark["metadata"]) == {"resourceVersion"}, (where, bookmark)


@pytest.fixture(params=["localkube", pytest.param("real", marks=pytest.mark.realcluster)])
def crd_watch_env(request: pytest.FixtureRequest) -> Iterator[KubeEnv]:
    """A fresh localkube, or the real control plane with no PodPlacementConfig ``cluster``
    (one that exists is set aside and put back afterwards)."""
    if request.param == "localkube":
        yield request.getfixturevalue("fresh_localkube")
        return
    env: KubeEnv = request.getfixturevalue("real_kube")
    with _cluster_objects(env, "deletes.json"):  # the same singleton: PPC "cluster"
        yield env


def test_conformance_crd_watch(crd_watch_env: KubeEnv) -> None:
    """crd-podplacementconfig.json's watch: status patch, spec patch, delete, re-create."""
    data = json.loads((REFERENCE / "crd-podplacementconfig.json").read_text())
    ex = next(e for e in data["exchanges"] if e["name"].startswith("watch podplacementconfigs"))
    want = [(e["type"], e["object"]["metadata"].get("name"))
            for e in ex["response"]["events"] if isinstance(e, dict)]
    k = crd_watch_env
    body = {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
            "metadata": {"name": "cluster"}, "spec": {"plugins": {"nodeAffinityScoring": {
                "enabled": False, "platforms": [{"architecture": "arm64", "weight": 50}]}}}}
    k.create(_PPC, body)
    rv = k.get(_PPC)["metadata"]["resourceVersion"]
    base = f"{_PPC}/cluster"
    k.patch(base + "/status", {"status": {"observedGeneration": 2}})
    k.patch(base, {"spec": {"plugins": {"nodeAffinityScoring": {"enabled": True}}}})
    k.delete(base)
    k.create(_PPC, body)
    status, events = _watch(k.client, f"{_PPC}?watch=1&allowWatchBookmarks=true"
                            f"&resourceVersion={rv}", {})
    got = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert status == 200
    assert [g for g in got if g[0] != "BOOKMARK"] == [w for w in want if w[0] != "BOOKMARK"], (
        f"crd-podplacementconfig.json on {k.kind}: {ex['name']!r}")
