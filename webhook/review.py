"""The AdmissionReview wire format of ``POST /mutate``: the request decoded, the answer encoded.

Decoding reads the raw body selectively (msgspec into the TypedDicts below when it can, else
orjson on the whole body; no pydantic model on the hot path) and checks the few fields the
webhook relies on, raising :class:`BadReview` with the message the client gets. Encoding splices
the answer ``{"apiVersion", "kind": "AdmissionReview", "response": {"uid", "allowed": true,
...}}`` from constant parts and the response members (:func:`patch_members`,
:func:`warnings_members`): the same bytes as ``orjson.dumps`` of that dict, without building
it per request. Pure: no I/O, no metrics (the stages of :mod:`webhook.pipeline` count).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

import msgspec
import orjson
from fastapi.responses import Response

from podplacement.rules.podspec import gate_label_ops
from podplacement.webhook.limits import BodyRefused
from podplacement.webhook.patch import gate_patch, patch_shape

ADMISSION_V1 = "admission.k8s.io/v1"
ADMISSION_V1BETA1 = "admission.k8s.io/v1beta1"
ADMISSION_VERSIONS = frozenset({ADMISSION_V1, ADMISSION_V1BETA1})

_JSON = "application/json"


class BadReview(ValueError):
    """The body is not a usable AdmissionReview (answered with HTTP 400)."""


# --- selective decoding ----------------------------------------------------------------------
# orjson builds Python objects for the whole 5 KB review (managedFields, volumes, userInfo, ...)
# although /mutate reads a handful of fields: that was ~80% of what /mutate cost over the bare
# endpoint (bench/webhook.py). msgspec decodes into the TypedDicts below: it
# checks the JSON syntax of the parts it skips without building objects for them and returns
# plain dicts holding only the listed keys (~6 us instead of ~16 us for the recorded review),
# so the pure gating code takes them unchanged. Every field webhook.gating and webhook.patch
# read must be listed here (tests/webhook/test_fast_review.py checks it with recording dicts).


# Every TypedDict keeps only the keys the rules read, and the subtrees below the rules' paths
# are typed as narrowly as they are read: msgspec then builds no object for the rest (a
# matchExpression's operator and values, an ownerReference's uid, the other labels, ...).
# Building and freeing those objects cost more than scanning the bytes once /mutate was
# served (bench/webhook.py): allocations on a cache-cold heap. A field of another JSON type
# than declared makes msgspec decline the body, and the orjson path answers it.
class _Gate(TypedDict, total=False):
    name: Any


class _OwnerRef(TypedDict, total=False):
    kind: Any
    controller: Any


# Only our own keys are kept: the gating rule reads them (a pod the admission policy placed),
# and the patch otherwise only asks whether ``metadata.labels``/``annotations`` is an object.
# (Literal keys for mypy: GATE_LABEL and DECISION_ANNOTATION; tests/webhook/test_fast_review.py
# fails when a key the rules read is missing here.)
_Labels = TypedDict("_Labels", {"podplacement.io/scheduling-gate": Any}, total=False)
_Annotations = TypedDict("_Annotations", {"podplacement.io/decision": Any}, total=False)


class _PodMeta(TypedDict, total=False):
    namespace: Any
    labels: _Labels | None
    annotations: _Annotations | None
    ownerReferences: list[_OwnerRef] | None


class _PodSpec(TypedDict, total=False):
    """The spec fields the gating rules read."""

    nodeName: Any
    schedulingGates: list[_Gate] | None


class _Pod(TypedDict, total=False):
    metadata: _PodMeta | None
    spec: _PodSpec | None


class _GroupVersionKind(TypedDict, total=False):
    group: Any
    kind: Any


class _Request(TypedDict, total=False):
    uid: Any
    kind: _GroupVersionKind | None
    operation: Any
    subResource: Any
    namespace: Any
    dryRun: Any
    object: _Pod | None


class _Review(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    request: _Request | None


#: The selective decoder (tests set it to None to compare with the whole-body path).
_REVIEW_DECODER: Any = msgspec.json.Decoder(_Review)
_DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.MsgspecError,)


def parse_review_fast(body: bytes) -> tuple[str, Mapping[str, Any]] | None:
    """``(apiVersion, request)`` decoded with msgspec into the subset of fields /mutate reads;
    None when msgspec declines the body (then orjson parses it whole).

    Same answer as the orjson path: a body msgspec cannot decode (bad JSON anywhere, or a
    structural field of the wrong type, e.g. ``request.object`` not an object) is declined
    and gets orjson's verdict and message; non-ASCII bodies are declined too, since msgspec
    does not check the UTF-8 of the strings it skips. Duplicate keys: the last wins in both.
    The remaining difference is in what orjson refuses although it is valid JSON text: a
    number out of double range (``1e999``) in a field /mutate does not read is skipped here
    instead of answered with 400, and an integer beyond 64 bits in a field it reads stays an
    int (orjson makes it a float).

    Raises:
        BadReview: decoded, but a required field is missing or mistyped.
    """
    if _REVIEW_DECODER is None or not body.isascii():
        return None
    try:
        review = _REVIEW_DECODER.decode(body)
    except _DECODE_ERRORS:
        return None
    return _checked_review(review)


def parse_review(body: bytes) -> tuple[str, Mapping[str, Any]]:
    """Return ``(apiVersion, request)`` of an AdmissionReview or raise :class:`BadReview`.

    Takes the selective decoder (:func:`parse_review_fast`) when it can, else parses the
    whole body with orjson; both give the same answer (see :func:`parse_review_fast`).
    """
    fast = parse_review_fast(body)
    if fast is not None:
        return fast
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
    return _checked_review(review)


def _checked_review(review: Any) -> tuple[str, Mapping[str, Any]]:
    """Check the AdmissionReview fields /mutate relies on; ``(apiVersion, request)`` or
    :class:`BadReview` with the message the client gets."""
    if not isinstance(review, dict):
        raise BadReview("body is not a JSON object")
    api_version = review.get("apiVersion")
    if not isinstance(api_version, str) or api_version not in ADMISSION_VERSIONS:
        raise BadReview(f"unsupported apiVersion {api_version!r} (want {ADMISSION_V1})")
    if review.get("kind") != "AdmissionReview":
        raise BadReview(f"kind must be AdmissionReview, got {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or not a string")
    kind = request.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise BadReview("request.kind is missing or not a GroupVersionKind")
    if not isinstance(request.get("operation"), str):
        raise BadReview("request.operation is missing or not a string")
    return api_version, request


def is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request["kind"]
    return (
        request["operation"] == "CREATE"
        and kind.get("kind") == "Pod"
        and kind.get("group", "") == ""
        and not request.get("subResource")
    )


def pod_and_namespace(request: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise BadReview("request.object is missing or not an object for a pod CREATE")
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        metadata = pod.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    if not isinstance(namespace, str) or not namespace:
        raise BadReview("request.namespace is missing for a pod CREATE")
    return pod, namespace



# --- the answer ------------------------------------------------------------------------------


def patch_members(ops: Iterable[Mapping[str, Any]]) -> bytes:
    """``,"patchType":"JSONPatch","patch":"<base64 of the JSON of ops>"``: the response members
    that apply the JSONPatch ``ops`` (a list of RFC 6902 operations as dicts), ready to splice
    into :func:`allowed`. Every patching answer's members are encoded here, once."""
    patch = base64.b64encode(orjson.dumps(list(ops))).decode()
    return b',"patchType":"JSONPatch","patch":' + orjson.dumps(patch)


def warnings_members(warnings: Iterable[str]) -> bytes:
    """``,"warnings":[...]``: the response member carrying ``warnings`` (shown to the pod's
    creator by kubectl), ready to splice into :func:`allowed`."""
    return b',"warnings":' + orjson.dumps(list(warnings))


_PATCH_TAILS: dict[tuple[bool, bool], bytes] = {}


def patch_tail(pod: Mapping[str, Any]) -> bytes:
    """The response members that gate ``pod`` (:func:`patch_members` of
    :func:`webhook.patch.gate_patch`).

    :func:`webhook.patch.gate_patch` depends only on whether ``spec.schedulingGates`` is a
    list and ``metadata.labels`` a map (:func:`webhook.patch.patch_shape`), so there are four
    distinct patches: each is built and encoded once, then looked up by that shape.
    """
    key = patch_shape(pod)
    tail = _PATCH_TAILS.get(key)
    if tail is None:
        tail = _PATCH_TAILS[key] = patch_members(gate_patch(pod))
    return tail


def label_tail(pod: Mapping[str, Any]) -> bytes:
    """The response members that set our gate label to ``gated`` on a pod created with our
    gate (:func:`patch_members` of :func:`rules.podspec.gate_label_ops`), or
    nothing (``b""``) when it says so already."""
    ops = gate_label_ops(pod)
    return patch_members(ops) if ops else b""


_ANSWER_HEADS = {
    version: b'{"apiVersion":' + orjson.dumps(version) + b',"kind":"AdmissionReview",'
    b'"response":{"uid":'
    for version in ADMISSION_VERSIONS
}


def allowed(api_version: str, uid: str, tail: bytes = b"") -> Response:
    """The answer ``{"apiVersion", "kind": "AdmissionReview", "response": {"uid", "allowed":
    true, <tail>}}`` (HTTP 200), spliced from constant parts: the same bytes as
    ``orjson.dumps`` of that dict (tests/webhook/test_app.py checks it) without building it
    per request. ``api_version`` must be one of :data:`ADMISSION_VERSIONS`; ``tail`` is
    empty or response members (:func:`patch_members`, :func:`warnings_members`, ...)."""
    body = _ANSWER_HEADS[api_version] + orjson.dumps(uid) + b',"allowed":true' + tail + b"}}"
    return Response(body, media_type=_JSON)


def bad_request(message: str) -> Response:
    """HTTP 400 ``{"error": message}``: a body that is not a usable AdmissionReview (the API
    server then applies the webhook's failurePolicy)."""
    return Response(orjson.dumps({"error": message}), status_code=400, media_type=_JSON)


def refused(exc: BodyRefused) -> Response:
    """The 413/408 answer ``{"error": str(exc)}`` with ``exc.status``; ``Connection: close``,
    since the rest of the body is not read."""
    return Response(orjson.dumps({"error": str(exc)}), status_code=exc.status,
                    media_type=_JSON, headers={"connection": "close"})
