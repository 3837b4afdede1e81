"""localkube's mutating admission call-out against a real HTTPS webhook on 127.0.0.1.

The webhook server replays, per path, what the recorded webhooks answered
(``admission-d-g-webhook-failures.json``, ``admission-a-plain-pod.json``): the same status and
body, with the recorded request uid swapped for the uid of the request it actually got. The
Admission results are compared with the recorded kube-apiserver answers, and the
AdmissionReview requests it sends with the recorded ones (``admission-review-raw-*.json``).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from localkube import podrules
from localkube.admission import Admission, go_json_bytes, label_selector_matches, rule_matches
from localkube.errors import StatusError
from podplacement import certs
from tests.harness.aioserver import serving
from tests.harness.reference import REFERENCE

RECORDED_HOST = "https://127.0.0.1:17443"
# The recorded timeout case used timeoutSeconds=2 and a 5 s sleep; here 1 s and 2 s keep the
# test short while the webhook still answers only after the deadline.
TEST_TIMEOUT_SECONDS = 1
TEST_SLEEP_SECONDS = 2.0
ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
CREATE_OPTIONS = {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}


def _load(name: str) -> dict[str, Any]:
    path = REFERENCE / name
    if not path.is_file():
        pytest.skip(f"reference recording {name} not available")
    return json.loads(path.read_text())


# --- the webhook server -----------------------------------------------------------------


@dataclass
class Answer:
    """What the webhook answers on one path: status, body text, the uid to replace."""

    status: int
    text: str
    recorded_uid: str | None
    sleep: float = 0.0


@dataclass
class Webhook:
    """A running HTTPS webhook double; ``seen`` holds every request it got."""

    url: str
    ca_bundle: str
    answers: dict[str, Answer]
    seen: list[dict[str, Any]] = field(default_factory=list)


def _answer_from_recording(saw: dict[str, Any]) -> Answer:
    answer = saw["webhook_answer"]
    if "body_raw" in answer:
        text = answer["body_raw"]
    elif isinstance(answer.get("body"), str):
        text = answer["body"]
    else:
        text = json.dumps(answer["body"])
    recorded_uid = saw["body"]["request"]["uid"]
    return Answer(answer["status"], text, recorded_uid)


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Webhook]:
    ca = certs.generate_ca("localkube-admission-test-ca")
    cert = certs.issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    state = Webhook(url="", ca_bundle=base64.b64encode(ca.cert_pem).decode(), answers={})

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        state.seen.append(
            {
                "path": request.path_qs,
                "headers": dict(request.headers),
                "raw": await request.read(),
                "body": body,
            }
        )
        answer = state.answers[request.path]
        if answer.sleep:
            await asyncio.sleep(answer.sleep)
        text = answer.text
        if answer.recorded_uid:
            text = text.replace(answer.recorded_uid, body["request"]["uid"])
        content_type = "application/json" if text.startswith("{") else "text/plain"
        return web.Response(status=answer.status, text=text, content_type=content_type)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    async with serving(app, ssl_context=context, shutdown_timeout=0.5) as url:
        state.url = url
        yield state


def _configuration(name: str, webhooks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": webhooks,
    }


def _webhook_entry(
    hook: Webhook,
    name: str,
    path: str,
    *,
    failure_policy: str = "Fail",
    timeout: int = 5,
    namespace: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "clientConfig": {"url": f"{hook.url}{path}", "caBundle": hook.ca_bundle},
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "*",
            }
        ],
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "namespaceSelector": (
            {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
        ),
        "objectSelector": {},
        "sideEffects": "None",
        "timeoutSeconds": timeout,
        "admissionReviewVersions": ["v1"],
        "reinvocationPolicy": "Never",
    }
    entry.update(extra)
    return entry


def _namespaces(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
    }


def _admission(configurations: list[dict[str, Any]]) -> Admission:
    return Admission(lambda: configurations, _namespaces)


def _defaulted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as localkube hands it to admission (defaulted, empty status)."""
    obj = copy.deepcopy(pod)
    podrules.default_pod(obj)
    obj["status"] = {}
    return obj


async def _admit(
    admission: Admission, namespace: str, obj: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    return await admission.admit(
        operation="CREATE",
        group="",
        version="v1",
        kind="Pod",
        plural="pods",
        namespace=namespace,
        name=(obj.get("metadata") or {}).get("name"),
        obj=obj,
        old=None,
        dry_run=kw.pop("dry_run", False),
        options=kw.pop("options", CREATE_OPTIONS),
        user_info=kw.pop("user_info", ADMIN),
        **kw,
    )


# --- the recorded failure cases (1d-g) ----------------------------------------------------


def _failure_policies() -> dict[str, str]:
    configuration = _load("admission-webhook-configuration.json")["exchanges"][0]["response"][
        "body"
    ]
    return {w["name"]: w["failurePolicy"] for w in configuration["webhooks"]}


def _failure_cases() -> list[Any]:
    data = _load("admission-d-g-webhook-failures.json")
    params = []
    for case in data["cases"]:
        post = next(e for e in case["exchanges"] if e["request"]["method"] == "POST")
        params.append(pytest.param(case, post, id=case["namespace"]))
    return params


def _webhook_name(namespace: str) -> str:
    return f"{namespace.removeprefix('wh-')}.refcap.podplacement.io"


def _expected_body(
    recorded: dict[str, Any], saw: dict[str, Any], hook: Webhook, got_uid: str
) -> dict[str, Any]:
    text = json.dumps(recorded)
    text = text.replace(saw["body"]["request"]["uid"], got_uid)
    recorded_path = saw["path"]
    our_path = re.sub(r"timeout=\d+s", f"timeout={TEST_TIMEOUT_SECONDS}s", recorded_path)
    text = text.replace(f"{RECORDED_HOST}{recorded_path}", f"{hook.url}{our_path}")
    return json.loads(text)


@pytest.mark.parametrize(("case", "post"), _failure_cases())
async def test_recorded_webhook_failure_handling(
    webhook: Webhook, case: dict[str, Any], post: dict[str, Any]
) -> None:
    namespace = case["namespace"]
    name = _webhook_name(namespace)
    saw = case["webhook_saw_and_answered"][0]
    path = saw["path"].split("?", 1)[0]
    timeout = int(re.search(r"timeout=(\d+)s", saw["path"]).group(1))  # type: ignore[union-attr]
    answer = _answer_from_recording(saw)
    if path == "/sleep":
        timeout, answer.sleep = TEST_TIMEOUT_SECONDS, TEST_SLEEP_SECONDS
    webhook.answers[path] = answer
    policy = _failure_policies().get(name, "Ignore" if namespace.endswith("-ignore") else "Fail")
    entry = _webhook_entry(
        webhook, name, path, failure_policy=policy, timeout=timeout, namespace=namespace
    )
    admission = _admission([_configuration("refcap-podplacement", [entry])])
    obj = _defaulted(post["request"]["body"])
    expected = post["response"]

    try:
        result = await _admit(admission, namespace, obj)
        if expected["status"] == 422:
            podrules.prepare_pod_create(result)  # the apiserver validates the patched pod
    except StatusError as exc:
        assert webhook.seen, "the webhook was not called"
        got_uid = webhook.seen[-1]["body"]["request"]["uid"]
        assert exc.code == expected["status"]
        assert exc.body() == _expected_body(expected["body"], saw, webhook, got_uid)
    else:
        assert expected["status"] == 201, f"expected {expected['status']}, admission passed"
        assert result == obj  # failure ignored: the pod goes on unpatched
    finally:
        await admission.aclose()
    assert len(webhook.seen) == 1
    assert webhook.seen[0]["path"] == f"{path}?timeout={timeout}s"


# --- the request the webhook gets (1a, 1b, 1c) --------------------------------------------


def _structure(value: Any) -> Any:
    """Keys (in order) and types of a JSON value, without the values."""
    if isinstance(value, dict):
        return [(k, _structure(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_structure(v) for v in value[:1]]
    return type(value).__name__


@pytest.mark.parametrize(
    "raw_file",
    [
        "admission-review-raw-a-plain-pod.json",
        "admission-review-raw-a-no-labels.json",
        "admission-review-raw-b-deployment-pod.json",
        "admission-review-raw-c-dry-run-kubectl.json",
    ],
)
async def test_review_body_has_the_recorded_shape(webhook: Webhook, raw_file: str) -> None:
    recorded = _load(raw_file)
    request = recorded["request"]
    webhook.answers["/mutate"] = Answer(
        200,
        json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": "UID", "allowed": True},
            }
        ),
        "UID",
    )
    entry = _webhook_entry(webhook, "capture.refcap.podplacement.io", "/mutate")
    admission = _admission([_configuration("refcap-podplacement", [entry])])
    try:
        result = await admission.admit(
            operation=request["operation"],
            group=request["kind"]["group"],
            version=request["kind"]["version"],
            kind=request["kind"]["kind"],
            plural=request["resource"]["resource"],
            namespace=request.get("namespace"),
            name=request.get("name"),
            obj=request["object"],
            old=request["oldObject"],
            dry_run=request["dryRun"],
            options=request["options"],
            user_info=request["userInfo"],
        )
    finally:
        await admission.aclose()
    assert result == request["object"]
    (seen,) = webhook.seen
    sent = seen["body"]
    assert _structure(sent) == _structure({**recorded, "request": {**request, "uid": "x"}})
    assert {k: v for k, v in sent["request"].items() if k != "uid"} == {
        k: v for k, v in request.items() if k != "uid"
    }
    assert re.fullmatch(r"[0-9a-f-]{36}", sent["request"]["uid"])
    assert seen["path"] == "/mutate?timeout=5s"
    assert seen["headers"]["User-Agent"] == "kube-apiserver-admission"
    assert seen["headers"]["Accept"] == "application/json, */*"
    assert seen["headers"]["Content-Type"] == "application/json"
    # Byte for byte what kube-apiserver sent, once the uid is the recorded one.
    raw = (REFERENCE / raw_file).read_bytes()
    assert seen["raw"].replace(sent["request"]["uid"].encode(), request["uid"].encode()) == raw


async def test_capture_patch_is_applied_as_recorded(webhook: Webhook) -> None:
    data = _load("admission-a-plain-pod.json")
    saw = data["admission_reviews_received"][0]
    webhook.answers["/mutate"] = _answer_from_recording(saw)
    entry = _webhook_entry(webhook, "capture.refcap.podplacement.io", "/mutate")
    admission = _admission([_configuration("refcap-podplacement", [entry])])
    obj = copy.deepcopy(saw["body"]["request"]["object"])
    try:
        result = await _admit(admission, "wh-capture", obj)
    finally:
        await admission.aclose()
    stored = data["exchanges"][1]["response"]["body"]
    assert result["spec"]["schedulingGates"] == stored["spec"]["schedulingGates"]
    assert result["metadata"]["labels"] == stored["metadata"]["labels"]
    assert obj == saw["body"]["request"]["object"]  # the input is not modified
    podrules.prepare_pod_create(result)
    assert result["status"]["conditions"][0]["reason"] == "SchedulingGated"
    assert result["status"]["qosClass"] == stored["status"]["qosClass"]


# --- selection and chaining ---------------------------------------------------------------


def _patching_answer(label: str) -> Answer:
    patch = [{"op": "add", "path": f"/metadata/labels/{label}", "value": "yes"}]
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "UID",
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        },
    }
    return Answer(200, json.dumps(body), "UID")


def _pod(name: str = "p", labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels if labels is not None else {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    }
    return _defaulted(pod)


async def test_webhooks_are_called_in_name_order_and_patches_chain(webhook: Webhook) -> None:
    webhook.answers["/first"] = _patching_answer("first")
    webhook.answers["/second"] = _patching_answer("second")
    configurations = [
        _configuration("b-config", [_webhook_entry(webhook, "two.example.com", "/second")]),
        _configuration("a-config", [_webhook_entry(webhook, "one.example.com", "/first")]),
    ]
    admission = _admission(configurations)
    try:
        result = await _admit(admission, "ns", _pod())
    finally:
        await admission.aclose()
    assert [s["path"].split("?")[0] for s in webhook.seen] == ["/first", "/second"]
    # The second webhook sees the first one's patch.
    assert webhook.seen[1]["body"]["request"]["object"]["metadata"]["labels"]["first"] == "yes"
    assert result["metadata"]["labels"] == {"app": "x", "first": "yes", "second": "yes"}


async def test_selectors_and_rules_decide_which_webhooks_run(webhook: Webhook) -> None:
    for path in ("/ns", "/obj", "/update", "/nodes", "/other-ns"):
        webhook.answers[path] = _patching_answer(path.strip("/"))
    hooks = [
        _webhook_entry(webhook, "ns.example.com", "/ns", namespace="team-a"),
        _webhook_entry(webhook, "other-ns.example.com", "/other-ns", namespace="team-b"),
        _webhook_entry(
            webhook,
            "obj.example.com",
            "/obj",
            objectSelector={
                "matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]
            },
        ),
        _webhook_entry(
            webhook,
            "update.example.com",
            "/update",
            rules=[
                {
                    "operations": ["UPDATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "scope": "*",
                }
            ],
        ),
        _webhook_entry(
            webhook,
            "nodes.example.com",
            "/nodes",
            rules=[
                {
                    "operations": ["*"],
                    "apiGroups": ["*"],
                    "apiVersions": ["*"],
                    "resources": ["nodes"],
                    "scope": "Cluster",
                }
            ],
        ),
    ]
    admission = _admission([_configuration("c", hooks)])
    try:
        labelled = await _admit(admission, "team-a", _pod(labels={"app": "x"}))
        unlabelled = await _admit(admission, "team-a", _pod(labels={"app": "y"}))
    finally:
        await admission.aclose()
    assert set(labelled["metadata"]["labels"]) == {"app", "ns", "obj"}
    assert set(unlabelled["metadata"]["labels"]) == {"app", "ns"}


async def test_dry_run_is_sent_and_side_effect_webhooks_refuse_it(webhook: Webhook) -> None:
    webhook.answers["/mutate"] = _patching_answer("dry")
    safe = _webhook_entry(webhook, "safe.example.com", "/mutate")
    admission = _admission([_configuration("c", [safe])])
    try:
        result = await _admit(admission, "ns", _pod(), dry_run=True)
        assert webhook.seen[-1]["body"]["request"]["dryRun"] is True
        assert result["metadata"]["labels"]["dry"] == "yes"

        unsafe = _webhook_entry(webhook, "unsafe.example.com", "/mutate", sideEffects="Unknown")
        refusing = _admission([_configuration("c", [unsafe])])
        with pytest.raises(StatusError) as info:
            await _admit(refusing, "ns", _pod(), dry_run=True)
        await refusing.aclose()
    finally:
        await admission.aclose()
    assert info.value.code == 400
    assert 'admission webhook "unsafe.example.com" does not support dry run' in info.value.message
    assert len(webhook.seen) == 1


async def test_untrusted_certificate_is_a_call_failure(webhook: Webhook) -> None:
    webhook.answers["/mutate"] = _patching_answer("never")
    other_ca = certs.generate_ca("some-other-ca")
    entry = _webhook_entry(webhook, "tls.example.com", "/mutate")
    entry["clientConfig"]["caBundle"] = base64.b64encode(other_ca.cert_pem).decode()
    admission = _admission([_configuration("c", [entry])])
    try:
        with pytest.raises(StatusError) as info:
            await _admit(admission, "ns", _pod())
        entry["failurePolicy"] = "Ignore"
        obj = _pod()
        assert await _admit(admission, "ns", obj) == obj
    finally:
        await admission.aclose()
    assert info.value.code == 500
    assert info.value.message == (
        'Internal error occurred: failed calling webhook "tls.example.com": '
        f'failed to call webhook: Post "{webhook.url}/mutate?timeout=5s": '
        "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    )
    assert not webhook.seen


async def test_refused_connection_is_a_call_failure(webhook: Webhook) -> None:
    with socket.socket() as probe:  # a port with nothing listening (bound, not listening)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        entry = _webhook_entry(webhook, "gone.example.com", "/mutate")
        entry["clientConfig"]["url"] = f"https://127.0.0.1:{port}/mutate"
        admission = _admission([_configuration("c", [entry])])
        try:
            with pytest.raises(StatusError) as info:
                await _admit(admission, "ns", _pod())
            entry["failurePolicy"] = "Ignore"
            obj = _pod()
            assert await _admit(admission, "ns", obj) == obj
        finally:
            await admission.aclose()
    assert info.value.message.endswith(
        f'Post "https://127.0.0.1:{port}/mutate?timeout=5s": '
        f"dial tcp 127.0.0.1:{port}: connect: connection refused"
    )


async def test_service_reference_cannot_be_reached() -> None:
    entry = {
        "name": "svc.example.com",
        "clientConfig": {"service": {"name": "hook", "namespace": "sys", "path": "/mutate"}},
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
            }
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    }
    admission = _admission([_configuration("c", [entry])])
    with pytest.raises(StatusError) as info:
        await _admit(admission, "ns", _pod())
    assert info.value.code == 500
    assert "https://hook.sys.svc:443/mutate?timeout=10s" in info.value.message
    entry["failurePolicy"] = "Ignore"
    obj = _pod()
    assert await _admit(admission, "ns", obj) == obj


# --- pure matching ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (None, {}, True),
        ({}, {"a": "b"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "b", "c": "d"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "c"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]},
            {"a": "y"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]},
            {"a": "x"},
            False,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {"a": ""}, False),
    ],
)
def test_label_selector(selector: Any, labels: dict[str, str], matches: bool) -> None:
    assert label_selector_matches(selector, labels) is matches


@pytest.mark.parametrize(
    ("resources", "subresource", "matches"),
    [
        (["pods"], "", True),
        (["pods"], "status", False),
        (["pods/*"], "", True),
        (["pods/*"], "status", True),
        (["*"], "", True),
        (["*"], "status", False),
        (["*/status"], "status", True),
        (["*/*"], "binding", True),
        (["nodes"], "", False),
    ],
)
def test_rule_resources(resources: list[str], subresource: str, matches: bool) -> None:
    rule = {
        "operations": ["CREATE"],
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": resources,
    }
    got = rule_matches(
        rule,
        operation="CREATE",
        group="",
        version="v1",
        plural="pods",
        subresource=subresource,
        namespaced=True,
    )
    assert got is matches


def test_rule_operation_group_version_and_scope() -> None:
    rule = {
        "operations": ["CREATE", "UPDATE"],
        "apiGroups": ["apps"],
        "apiVersions": ["v1"],
        "resources": ["deployments"],
        "scope": "Namespaced",
    }
    kw = {"group": "apps", "version": "v1", "plural": "deployments", "subresource": ""}
    assert rule_matches(rule, operation="UPDATE", namespaced=True, **kw)
    assert not rule_matches(rule, operation="DELETE", namespaced=True, **kw)
    assert not rule_matches(rule, operation="CREATE", namespaced=False, **kw)
    assert not rule_matches(rule, operation="CREATE", namespaced=True, **{**kw, "group": ""})
    assert not rule_matches(
        rule, operation="CREATE", namespaced=True, **{**kw, "version": "v1beta1"}
    )


# --- through the API server (localkube, or a real one with PODPLACEMENT_TEST_CLUSTER=real) ---


async def test_pod_create_through_the_api_server_calls_the_webhook(
    webhook: Webhook, kube: Any, unique_namespace: str
) -> None:
    """1a end to end: the stored pod carries the webhook's gate and label and the
    SchedulingGated condition; the webhook got the recorded request shape."""
    data = _load("admission-a-plain-pod.json")
    saw = data["admission_reviews_received"][0]
    webhook.answers["/mutate"] = _answer_from_recording(saw)
    configuration = _configuration(
        f"test-{unique_namespace}",
        [
            _webhook_entry(
                webhook, "capture.refcap.podplacement.io", "/mutate", namespace=unique_namespace
            )
        ],
    )
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    created = await asyncio.to_thread(kube.request, "POST", path, json=configuration)
    assert created.status_code == 201, created.text
    try:
        body = copy.deepcopy(data["exchanges"][0]["request"]["body"])
        response = await asyncio.to_thread(
            kube.request,
            "POST",
            f"/api/v1/namespaces/{unique_namespace}/pods",
            json=body,
            params={"fieldManager": "refcap"},
        )
        assert response.status_code == 201, response.text
        stored = data["exchanges"][1]["response"]["body"]
        pod = response.json()
        assert pod["spec"]["schedulingGates"] == stored["spec"]["schedulingGates"]
        assert pod["metadata"]["labels"] == stored["metadata"]["labels"]
        assert [c["reason"] for c in pod["status"]["conditions"]] == ["SchedulingGated"]
        assert pod["status"]["qosClass"] == "Burstable"
        (seen,) = webhook.seen
        request = seen["body"]["request"]
        recorded = saw["body"]["request"]
        assert seen["path"] == "/mutate?timeout=5s"
        assert [k for k in request if k != "userInfo"] == [k for k in recorded if k != "userInfo"]
        assert request["namespace"] == unique_namespace
        assert request["options"] == recorded["options"]
        assert request["object"]["status"] == {}
        assert "uid" not in request["object"]["metadata"]
    finally:
        await asyncio.to_thread(kube.request, "DELETE", f"{path}/test-{unique_namespace}")


async def test_failing_webhook_through_the_api_server(
    webhook: Webhook, kube: Any, unique_namespace: str
) -> None:
    """1g under failurePolicy Fail: the API answers the recorded 500 and stores nothing."""
    webhook.answers["/http500"] = Answer(500, "boom", None)
    name = "http500-fail.refcap.podplacement.io"
    configuration = _configuration(
        f"test-{unique_namespace}",
        [_webhook_entry(webhook, name, "/http500", namespace=unique_namespace)],
    )
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    created = await asyncio.to_thread(kube.request, "POST", path, json=configuration)
    assert created.status_code == 201, created.text
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p1"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
        }
        response = await asyncio.to_thread(
            kube.request, "POST", f"/api/v1/namespaces/{unique_namespace}/pods", json=pod
        )
        message = (
            f'failed calling webhook "{name}": failed to call webhook: an error on the server '
            '("boom") has prevented the request from succeeding'
        )
        assert response.status_code == 500
        assert response.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"Internal error occurred: {message}",
            "reason": "InternalError",
            "details": {"causes": [{"message": message}]},
            "code": 500,
        }
        missing = await asyncio.to_thread(
            kube.request, "GET", f"/api/v1/namespaces/{unique_namespace}/pods/p1"
        )
        assert missing.status_code == 404
    finally:
        await asyncio.to_thread(kube.request, "DELETE", f"{path}/test-{unique_namespace}")


def test_review_bytes_are_encoded_like_go() -> None:
    """encoding/json escapes HTML characters and json.Encoder ends with a newline."""
    assert go_json_bytes({"a": "<b>&c", "n": [1, None], "u": "é"}) == (
        b'{"a":"\\u003cb\\u003e\\u0026c","n":[1,null],"u":"\xc3\xa9"}\n'
    )


def test_webhook_configurations_are_never_sent_to_webhooks() -> None:
    catch_all = {
        "name": "all.example.com",
        "clientConfig": {"url": "https://127.0.0.1:9/"},
        "rules": [
            {"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}
        ],
    }
    admission = _admission([_configuration("c", [catch_all])])
    kw: dict[str, Any] = {
        "operation": "CREATE",
        "version": "v1",
        "namespace": None,
        "obj": {},
        "old": None,
    }
    assert (
        admission.matching_webhooks(
            group="admissionregistration.k8s.io", plural="mutatingwebhookconfigurations", **kw
        )
        == []
    )
    assert (
        admission.matching_webhooks(
            group="authorization.k8s.io", plural="selfsubjectaccessreviews", **kw
        )
        == []
    )
    assert admission.matching_webhooks(group="", plural="nodes", **kw) == [catch_all]
