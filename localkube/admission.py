"""The MutatingAdmissionWebhook plugin of kube-apiserver, for localkube.

For a write, every webhook of every ``MutatingWebhookConfiguration`` (configurations ordered by
name, webhooks in their listed order) whose ``rules``, ``namespaceSelector`` and
``objectSelector`` match is called over HTTPS with an ``admission.k8s.io/v1`` AdmissionReview
shaped like the real one (``admission-review-raw-*.json``): ``POST <url>?timeout=<N>s``,
``User-Agent: kube-apiserver-admission``, the CA from ``caBundle`` as the only trust root. Its
JSONPatch is applied before the next webhook is called.

Failure handling follows ``admission-d-g-webhook-failures.json``: ``failurePolicy: Ignore``
covers *call* failures (transport error, timeout, non-200, invalid JSON, undecodable patch,
wrong uid); a patch that decodes but does not apply is a 500 even under Ignore; a denial
(``allowed: false``) is never ignored and answers with the webhook's code (400 without one).
Reinvocation (``reinvocationPolicy: IfNeeded``) and ``matchConditions`` are not implemented.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import ssl
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

import localkube._gojson as _gojson
from localkube.errors import StatusError
from localkube.patch import JSONPatchError, run_json_patch

ADMISSION_API_VERSION = "admission.k8s.io/v1"
USER_AGENT = "kube-apiserver-admission"
DEFAULT_TIMEOUT_SECONDS = 10


class WebhookCallError(Exception):
    """A failed call (the part after ``failed calling webhook "<name>": ``)."""


class WebhookPatchError(Exception):
    """A decodable patch that does not apply (never covered by failurePolicy Ignore)."""


def internal_error(message: str) -> StatusError:
    """500 ``InternalError`` as ``apierrors.NewInternalError`` words it."""
    return StatusError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


# --- matching -----------------------------------------------------------------------------


def label_selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Whether ``labels`` satisfy a ``metav1.LabelSelector``.

    None or ``{}`` matches everything. ``matchExpressions`` operators: In, NotIn, Exists,
    DoesNotExist (an unknown operator matches nothing, as an invalid selector would).
    """
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key = expr.get("key", "")
        operator = expr.get("operator")
        values = expr.get("values") or []
        if operator == "In":
            if key not in labels or labels[key] not in values:
                return False
        elif operator == "NotIn":
            if key in labels and labels[key] in values:
                return False
        elif operator == "Exists":
            if key not in labels:
                return False
        elif operator == "DoesNotExist":
            if key in labels:
                return False
        else:
            return False
    return True


def _matches_any(patterns: list[str] | None, value: str) -> bool:
    return any(p == "*" or p == value for p in patterns or [])


def _resource_matches(patterns: list[str] | None, plural: str, subresource: str) -> bool:
    """``resources`` entries: ``pods``, ``pods/status``, ``pods/*``, ``*``, ``*/*``..."""
    for pattern in patterns or []:
        res, _, sub = pattern.partition("/")
        if (res in ("*", plural)) and (sub == "*" or sub == subresource):
            return True
    return False


def rule_matches(
    rule: dict[str, Any],
    *,
    operation: str,
    group: str,
    version: str,
    plural: str,
    subresource: str,
    namespaced: bool,
) -> bool:
    """Whether one ``RuleWithOperations`` matches the request (``admissionregistration/v1``)."""
    if not _matches_any(rule.get("operations"), operation):
        return False
    if not _matches_any(rule.get("apiGroups"), group):
        return False
    if not _matches_any(rule.get("apiVersions"), version):
        return False
    if not _resource_matches(rule.get("resources"), plural, subresource):
        return False
    scope = rule.get("scope") or "*"
    if scope == "Cluster" and namespaced:
        return False
    return not (scope == "Namespaced" and not namespaced)


# --- the call -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    operation: str
    group: str
    version: str
    kind: str
    plural: str
    subresource: str
    namespace: str | None
    name: str | None
    dry_run: bool
    options: dict[str, Any]
    user_info: dict[str, Any]
    old: dict[str, Any] | None


def build_admission_review(req: _Request, obj: dict[str, Any], uid: str) -> dict[str, Any]:
    """The AdmissionReview v1 request body, keys in the order the real server writes them."""
    gvk = {"group": req.group, "version": req.version, "kind": req.kind}
    gvr = {"group": req.group, "version": req.version, "resource": req.plural}
    request: dict[str, Any] = {"uid": uid, "kind": gvk, "resource": gvr}
    if req.subresource:
        request["subResource"] = req.subresource
    request["requestKind"] = dict(gvk)
    request["requestResource"] = dict(gvr)
    if req.subresource:
        request["requestSubResource"] = req.subresource
    if req.name:
        request["name"] = req.name
    if req.namespace:
        request["namespace"] = req.namespace
    request["operation"] = req.operation
    request["userInfo"] = req.user_info
    request["object"] = obj if req.operation != "DELETE" else None
    request["oldObject"] = req.old
    request["dryRun"] = req.dry_run
    request["options"] = req.options
    return {"kind": "AdmissionReview", "apiVersion": ADMISSION_API_VERSION, "request": request}


_GO_HTML_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def go_json_bytes(value: Any) -> bytes:
    """JSON as Go's ``json.Encoder`` writes it: compact, HTML characters escaped, a final
    newline (the AdmissionReview bytes of ``admission-review-raw-*.json``)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return (text.translate(_GO_HTML_ESCAPES) + "\n").encode()


def _with_timeout_query(url: str, seconds: int) -> str:
    return f"{url}{'&' if '?' in url else '?'}timeout={seconds}s"


def _status_text_error(status: int, body: str) -> str:
    """client-go's wording for a non-2xx answer without a Status body."""
    if status == 404:
        return "the server could not find the requested resource"
    if status == 401:
        return "Unauthorized"
    if status == 403:
        return "forbidden"
    text = body.strip()
    if text:
        return (
            f"an error on the server ({json.dumps(text)}) has prevented the request from succeeding"
        )
    return "an error on the server has prevented the request from succeeding"


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _transport_reason(exc: httpx.HTTPError, url: str) -> str:
    """Go's net/http wording for the common transport failures (the rest as Python says it)."""
    chain = _causes(exc)
    text = " ".join(str(e) for e in chain)
    parts = httpx.URL(url)
    address = f"{parts.host}:{parts.port or 443}"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        if "mismatch" in text:
            return "tls: failed to verify certificate: x509: certificate is not valid for " + (
                parts.host
            )
        return "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "Errno 111" in text:
        return f"dial tcp {address}: connect: connection refused"
    return str(exc) or type(exc).__name__


class Admission:
    """Calls the mutating admission webhooks that match a request.

    Args:
        list_webhook_configurations: returns the current MutatingWebhookConfiguration objects.
        get_namespace: returns the Namespace object by name (None if absent), for
            ``namespaceSelector``.
    """

    def __init__(
        self,
        list_webhook_configurations: Callable[[], list[dict[str, Any]]],
        get_namespace: Callable[[str], dict[str, Any] | None],
    ) -> None:
        self._list = list_webhook_configurations
        self._get_namespace = get_namespace
        self._ssl_contexts: dict[str, ssl.SSLContext] = {}
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, httpx.AsyncClient]
        ] = weakref.WeakKeyDictionary()

    # -- selection --

    def matching_webhooks(
        self,
        *,
        operation: str,
        group: str,
        version: str,
        plural: str,
        subresource: str = "",
        namespace: str | None,
        obj: dict[str, Any] | None,
        old: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        """The webhooks to call, in calling order (configurations by name, then list order).

        Webhook configurations themselves (``admissionregistration.k8s.io``) and the review
        resources (``*reviews``) are never sent to webhooks, as in kube-apiserver, so a broken
        webhook cannot lock itself in.
        """
        if group == "admissionregistration.k8s.io" or plural.endswith("reviews"):
            return []
        configurations = sorted(
            self._list(), key=lambda c: (c.get("metadata") or {}).get("name", "")
        )
        namespaced = bool(namespace)
        selected = []
        ns_labels: dict[str, str] | None = None
        for configuration in configurations:
            for webhook in configuration.get("webhooks") or []:
                if not any(
                    rule_matches(
                        rule,
                        operation=operation,
                        group=group,
                        version=version,
                        plural=plural,
                        subresource=subresource,
                        namespaced=namespaced,
                    )
                    for rule in webhook.get("rules") or []
                ):
                    continue
                ns_selector = webhook.get("namespaceSelector")
                if group == "" and plural == "namespaces":
                    # A Namespace is matched by its own labels.
                    labels = ((obj or old or {}).get("metadata") or {}).get("labels") or {}
                    if not label_selector_matches(ns_selector, labels):
                        continue
                elif namespaced and ns_selector:
                    if ns_labels is None:
                        ns_obj = self._get_namespace(namespace or "") or {}
                        ns_labels = (ns_obj.get("metadata") or {}).get("labels") or {}
                    if not label_selector_matches(ns_selector, ns_labels):
                        continue
                obj_selector = webhook.get("objectSelector")
                if obj_selector:
                    candidates = [o for o in (obj, old) if o is not None]
                    if not any(
                        label_selector_matches(
                            obj_selector, (o.get("metadata") or {}).get("labels") or {}
                        )
                        for o in candidates
                    ):
                        continue
                selected.append(webhook)
        return selected

    # -- transport --

    def _ssl_context(self, ca_bundle: str) -> ssl.SSLContext:
        context = self._ssl_contexts.get(ca_bundle)
        if context is None:
            if ca_bundle:
                try:
                    pem = base64.b64decode(ca_bundle).decode()
                    context = ssl.create_default_context(cadata=pem)
                except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
                    raise WebhookCallError(
                        f"failed to call webhook: invalid caBundle: {exc}"
                    ) from exc
            else:
                context = ssl.create_default_context()
            self._ssl_contexts[ca_bundle] = context
        return context

    def _client(self, ca_bundle: str) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        per_loop = self._clients.setdefault(loop, {})
        client = per_loop.get(ca_bundle)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(verify=self._ssl_context(ca_bundle), trust_env=False)
            per_loop[ca_bundle] = client
        return client

    async def aclose(self) -> None:
        """Close the HTTP clients created on the running event loop."""
        loop = asyncio.get_running_loop()
        for client in (self._clients.pop(loop, None) or {}).values():
            await client.aclose()

    async def _post(self, webhook: dict[str, Any], review: dict[str, Any]) -> bytes:
        config = webhook.get("clientConfig") or {}
        timeout = int(webhook.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)
        url = config.get("url")
        if not url:
            service = config.get("service") or {}
            # localkube has no Service network: a service reference cannot be reached.
            host = f"{service.get('name', '')}.{service.get('namespace', '')}.svc"
            url = f"https://{host}:{service.get('port', 443)}{service.get('path', '')}"
            raise WebhookCallError(
                f'failed to call webhook: Post "{_with_timeout_query(url, timeout)}": '
                f"dial tcp: lookup {host}: no such host"
            )
        target = _with_timeout_query(url, timeout)
        client = self._client(config.get("caBundle") or "")
        # Go's json.Encoder: compact, newline-terminated (admission-review-raw-*.json bytes).
        body = go_json_bytes(review)
        headers = {
            "User-Agent": USER_AGENT,
            "Accept": "application/json, */*",
            "Content-Type": "application/json",
        }
        try:
            async with asyncio.timeout(timeout):
                response = await client.post(target, content=body, headers=headers)
        except TimeoutError as exc:
            raise WebhookCallError(
                f'failed to call webhook: Post "{target}": context deadline exceeded'
            ) from exc
        except httpx.HTTPError as exc:
            raise WebhookCallError(
                f'failed to call webhook: Post "{target}": {_transport_reason(exc, target)}'
            ) from exc
        if response.status_code != 200:
            raise WebhookCallError(
                "failed to call webhook: " + _status_text_error(response.status_code, response.text)
            )
        return response.content

    # -- one webhook --

    async def _call(
        self, webhook: dict[str, Any], req: _Request, obj: dict[str, Any]
    ) -> dict[str, Any]:
        """Call one webhook; return the (patched) object.

        Raises:
            WebhookCallError: a call failure (subject to failurePolicy).
            WebhookPatchError: the patch decodes but does not apply.
            StatusError: the webhook denied the request.
        """
        uid = str(uuid.uuid4())
        raw = await self._post(webhook, build_admission_review(req, obj, uid))
        try:
            answer = _gojson.loads(raw)
        except _gojson.GoJSONError as exc:
            raise WebhookCallError(
                f"failed to call webhook: couldn't get version/kind; json parse error: {exc}"
            ) from exc
        if not isinstance(answer, dict):
            raise WebhookCallError(
                "failed to call webhook: couldn't get version/kind; json parse error: json: "
                f"cannot unmarshal {_gojson.go_type_name(answer)} into Go value of type struct "
                '{ APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string '
                '"json:\\"kind,omitempty\\"" }'
            )
        api_version, kind = answer.get("apiVersion", ""), answer.get("kind", "")
        if api_version != ADMISSION_API_VERSION or kind != "AdmissionReview":
            group, _, version = api_version.rpartition("/")
            raise WebhookCallError(
                "received invalid webhook response: expected webhook response of "
                f"admission.k8s.io/v1, Kind=AdmissionReview, got {group}/{version}, Kind={kind}"
            )
        response = answer.get("response")
        if not isinstance(response, dict):
            raise WebhookCallError("received invalid webhook response: response was absent")
        if response.get("uid") != uid:
            raise WebhookCallError(
                "received invalid webhook response: expected response.uid="
                f'"{uid}", got "{response.get("uid", "")}"'
            )
        name = webhook.get("name", "")
        if not response.get("allowed"):
            raise _denied(name, response.get("status") or {})
        patch_b64 = response.get("patch")
        patch_type = response.get("patchType")
        if not patch_b64:
            return obj
        if patch_type is None:
            raise WebhookCallError(
                "received invalid webhook response: webhook returned response.patch but not "
                "response.patchType"
            )
        if patch_type != "JSONPatch":
            raise WebhookCallError(
                "received invalid webhook response: webhook returned invalid response.patchType "
                f'of "{patch_type}"'
            )
        try:
            patch_bytes = base64.b64decode(patch_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise WebhookCallError(
                "failed to call webhook: couldn't get version/kind; json parse error: "
                f"illegal base64 data: {exc}"
            ) from exc
        try:
            operations = _gojson.loads(patch_bytes)
        except _gojson.GoJSONError as exc:
            raise WebhookCallError(
                f"received undecodable patch in webhook response: {exc}"
            ) from exc
        if operations is None:
            return obj
        if not isinstance(operations, list):
            raise WebhookCallError(
                "received undecodable patch in webhook response: json: cannot unmarshal "
                f"{_gojson.go_type_name(operations)} into Go value of type jsonpatch.Patch"
            )
        for op in operations:
            if not isinstance(op, dict):
                raise WebhookCallError(
                    "received undecodable patch in webhook response: json: cannot unmarshal "
                    f"{_gojson.go_type_name(op)} into Go value of type jsonpatch.Operation"
                )
        try:
            patched = run_json_patch(obj, operations)
        except JSONPatchError as exc:
            raise WebhookPatchError(str(exc)) from exc
        if not isinstance(patched, dict):
            raise WebhookPatchError("patched object is not a JSON object")
        return patched

    # -- the plugin --

    async def admit(
        self,
        *,
        operation: str,
        group: str,
        version: str,
        kind: str,
        plural: str,
        namespace: str | None,
        name: str | None,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        dry_run: bool,
        options: dict[str, Any],
        user_info: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        """Run the matching mutating webhooks over ``obj``.

        Args:
            operation: ``CREATE``, ``UPDATE``, ``DELETE`` or ``CONNECT``.
            group, version, kind, plural: the resource (``""``, ``v1``, ``Pod``, ``pods``).
            namespace: the namespace, or None for cluster-scoped resources.
            name: the object name, or None (e.g. generateName on create).
            obj: the object after defaulting (not modified).
            old: the stored object for UPDATE/DELETE, else None.
            dry_run: the request is a dry run (webhooks whose sideEffects are not None/NoneOnDryRun
                make it fail with 400).
            options: CreateOptions/UpdateOptions/... as a dict.
            user_info: ``{"username", "groups", ...}``.
            subresource: ``""`` for the main resource.

        Returns:
            the object after all patches (``obj`` itself when nothing matched or changed).

        Raises:
            StatusError: 500 InternalError for a failed call under ``failurePolicy: Fail`` or a
                patch that does not apply; the webhook's code (400 by default) for a denial;
                400 for a dry run through a webhook with side effects.
        """
        webhooks = self.matching_webhooks(
            operation=operation,
            group=group,
            version=version,
            plural=plural,
            subresource=subresource,
            namespace=namespace,
            obj=obj,
            old=old,
        )
        if not webhooks:
            return obj
        req = _Request(
            operation=operation,
            group=group,
            version=version,
            kind=kind,
            plural=plural,
            subresource=subresource,
            namespace=namespace,
            name=name,
            dry_run=dry_run,
            options=options,
            user_info=user_info,
            old=old,
        )
        current = obj
        for webhook in webhooks:
            webhook_name = webhook.get("name", "")
            if dry_run and webhook.get("sideEffects") not in ("None", "NoneOnDryRun"):
                raise StatusError(
                    400,
                    "BadRequest",
                    f'admission webhook "{webhook_name}" does not support dry run',
                )
            try:
                current = await self._call(webhook, req, current)
            except WebhookCallError as exc:
                if (webhook.get("failurePolicy") or "Fail") == "Ignore":
                    continue
                raise internal_error(f'failed calling webhook "{webhook_name}": {exc}') from exc
            except WebhookPatchError as exc:
                raise internal_error(str(exc)) from exc
        return current


def _denied(webhook_name: str, status: dict[str, Any]) -> StatusError:
    """``webhookerrors.ToStatusErr``: the webhook's code (400 when absent) and reason."""
    message = status.get("message") or ""
    if message:
        text = f'admission webhook "{webhook_name}" denied the request: {message}'
    else:
        text = f'admission webhook "{webhook_name}" denied the request without explanation'
    code = status.get("code") or 400
    return StatusError(int(code), status.get("reason") or "", text, status.get("details"))
