"""/mutate, /healthz, /readyz and /metrics of webhook.app, in-process over ASGI."""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from podplacement.rules.config import SCHEDULING_GATE
from podplacement.webhook import metrics as metrics_module
from podplacement.webhook import pipeline as pipeline_module
from podplacement.webhook import review as review_module
from podplacement.webhook.app import INTERNAL_ERROR_WARNING, create_app
from podplacement.webhook.configsource import StaticConfigSource
from podplacement.webhook.patch import gate_patch
from tests.webhook.reference import RAW_CASES, raw_body, recorded_answer

BAREAPP = Path(__file__).resolve().parents[2] / "bench" / "bareapp.py"


def review(body: bytes | dict[str, Any]) -> dict[str, Any]:
    return body if isinstance(body, dict) else json.loads(body)


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


async def metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@pytest.mark.parametrize("case", sorted(RAW_CASES))
async def test_recorded_review_gets_the_recorded_patch(
    client: httpx.AsyncClient, case: str
) -> None:
    resp = await client.post("/mutate", content=raw_body(case),
                             headers={"Content-Type": "application/json"})
    assert resp.status_code == 200
    body = resp.json()
    answer = recorded_answer(case)["webhook_answer"]
    assert body["apiVersion"] == answer["body"]["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == answer["body"]["response"]["uid"]
    assert body["response"]["allowed"] is True
    assert decoded_patch(body["response"]) == answer["decoded_patch"]


async def test_dry_run_review_gets_the_same_patch(client: httpx.AsyncClient) -> None:
    body = review(raw_body("c-dry-run-kubectl"))
    assert body["request"]["dryRun"] is True
    resp = (await client.post("/mutate", content=json.dumps(body))).json()
    assert decoded_patch(resp["response"]) == decoded_patch(
        (await client.post("/mutate", content=raw_body("a-plain-pod"))).json()["response"])


async def test_v1beta1_is_answered_in_v1beta1(client: httpx.AsyncClient) -> None:
    body = review(raw_body("a-plain-pod"))
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    resp = (await client.post("/mutate", content=json.dumps(body))).json()
    assert resp["apiVersion"] == "admission.k8s.io/v1beta1"
    assert resp["response"]["uid"] == body["request"]["uid"]
    assert decoded_patch(resp["response"])[0]["value"] == [{"name": SCHEDULING_GATE}]


@pytest.mark.parametrize(
    "change",
    [
        {"operation": "UPDATE"},
        {"operation": "DELETE"},
        {"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}},
        {"kind": {"group": "", "version": "v1", "kind": "Binding"}, "subResource": "binding"},
        {"subResource": "ephemeralcontainers"},
    ],
)
async def test_other_operations_and_resources_are_allowed_unchanged(
    client: httpx.AsyncClient, change: dict[str, Any]
) -> None:
    body = review(raw_body("a-plain-pod"))
    body["request"].update(change)
    resp = await client.post("/mutate", content=json.dumps(body))
    assert resp.status_code == 200
    assert resp.json()["response"] == {"uid": body["request"]["uid"], "allowed": True}
    assert await metric(client, "podplacement_webhook_requests_total",
                        outcome="ignored", reason="not_pod_create") == 1


async def test_skipped_pod_is_allowed_without_patch_and_counted(
    client: httpx.AsyncClient
) -> None:
    body = review(raw_body("a-plain-pod"))
    body["request"]["namespace"] = "kube-system"
    resp = (await client.post("/mutate", content=json.dumps(body))).json()
    assert resp["response"] == {"uid": body["request"]["uid"], "allowed": True}
    assert await metric(client, "podplacement_webhook_requests_total",
                        outcome="skipped", reason="system_namespace") == 1
    assert await metric(client, "podplacement_webhook_gated_pods_total") == 0


async def test_own_namespace_comes_from_the_app(client: httpx.AsyncClient) -> None:
    body = review(raw_body("a-plain-pod"))
    body["request"]["namespace"] = "podplacement-system"
    resp = (await client.post("/mutate", content=json.dumps(body))).json()
    assert "patch" not in resp["response"]


async def test_without_config_nothing_is_gated(
    client: httpx.AsyncClient, source: StaticConfigSource
) -> None:
    source.set(None)
    resp = (await client.post("/mutate", content=raw_body("a-plain-pod"))).json()
    assert resp["response"]["allowed"] is True and "patch" not in resp["response"]
    assert await metric(client, "podplacement_webhook_requests_total",
                        outcome="skipped", reason="no_config") == 1


async def test_gated_pods_are_counted(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await client.post("/mutate", content=raw_body("a-no-labels"))
    assert await metric(client, "podplacement_webhook_gated_pods_total") == 3
    assert await metric(client, "podplacement_webhook_requests_total",
                        outcome="gated", reason="gated") == 3
    assert await metric(client, "podplacement_webhook_request_duration_seconds_count") == 3


def _decoded_patch(resp: dict[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(resp["response"]["patch"]))
    return patch


async def test_admissions_are_counted_by_path(client: httpx.AsyncClient) -> None:
    # a pod whose creator preset what the policy writes is gated like any other
    forged = review(raw_body("a-plain-pod"))
    meta = forged["request"]["object"]["metadata"]
    meta.setdefault("labels", {})["podplacement.io/scheduling-gate"] = "removed"
    meta["annotations"] = {"podplacement.io/decision": '{"path":"admission","result":"set"}'}
    resp = (await client.post("/mutate", content=json.dumps(forged))).json()
    assert {"op": "add", "path": "/metadata/labels/podplacement.io~1scheduling-gate",
            "value": "gated"} in _decoded_patch(resp)
    gated = review(raw_body("a-plain-pod"))
    gated["request"]["object"]["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    gated["request"]["object"]["metadata"].setdefault("labels", {})[
        "podplacement.io/scheduling-gate"] = "gated"
    resp = (await client.post("/mutate", content=json.dumps(gated))).json()
    assert "patch" not in resp["response"]  # gated by the policy: nothing to change
    await client.post("/mutate", content=raw_body("a-plain-pod"))
    skipped = review(raw_body("a-plain-pod"))
    skipped["request"]["namespace"] = "kube-system"
    await client.post("/mutate", content=json.dumps(skipped))
    name = "podplacement_webhook_admissions_total"
    assert await metric(client, name, path="gated") == 3  # forged, by the policy, by the webhook
    assert await metric(client, name, path="skipped") == 1
    assert await metric(client, name, path="webhook-placed") == 0


def without(path: str) -> bytes:
    body = review(raw_body("a-plain-pod"))
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[key]
    del node[last]
    return json.dumps(body).encode()


def replaced(path: str, value: Any) -> bytes:
    body = review(raw_body("a-plain-pod"))
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[key]
    node[last] = value
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not JSON"),
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (without("apiVersion"), "apiVersion"),
        (replaced("apiVersion", "admission.k8s.io/v2"), "apiVersion"),
        (replaced("kind", "Pod"), "AdmissionReview"),
        (without("request"), "request"),
        (replaced("request", []), "request"),
        (without("request.uid"), "uid"),
        (replaced("request.uid", 12), "uid"),
        (replaced("request.uid", ""), "uid"),
        (without("request.kind"), "request.kind"),
        (replaced("request.kind", "Pod"), "request.kind"),
        (without("request.operation"), "operation"),
        (without("request.object"), "request.object"),
        (replaced("request.object", "pod"), "request.object"),
    ],
)
async def test_malformed_reviews_get_400_with_a_message(
    client: httpx.AsyncClient, content: bytes, message: str
) -> None:
    resp = await client.post("/mutate", content=content)
    assert resp.status_code == 400
    assert message in resp.json()["error"]
    assert await metric(client, "podplacement_webhook_requests_total",
                        outcome="bad_request", reason="") == 1


async def test_namespace_falls_back_to_the_object(client: httpx.AsyncClient) -> None:
    resp = await client.post("/mutate", content=without("request.namespace"))
    assert resp.status_code == 200
    assert "patch" in resp.json()["response"]


async def test_internal_error_allows_with_warning_and_counts(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(pipeline_module, "should_gate", broken)
    resp = await client.post("/mutate", content=raw_body("a-plain-pod"))
    assert resp.status_code == 200
    response = resp.json()["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert response["warnings"] == [INTERNAL_ERROR_WARNING]
    assert await metric(client, "podplacement_webhook_errors_total") == 1
    assert await metric(client, "podplacement_webhook_requests_total",
                        outcome="error", reason="") == 1


async def test_healthz_and_readyz(source: StaticConfigSource) -> None:
    loaded = {"certs": False}
    app = create_app(source, certs_ready=lambda: loaded["certs"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://webhook") as c:
        assert (await c.get("/healthz")).status_code == 200
        not_ready = await c.get("/readyz")
        assert not_ready.status_code == 503
        assert "certificates" in not_ready.text
        loaded["certs"] = True
        assert (await c.get("/readyz")).status_code == 200


async def test_readyz_waits_for_the_config_to_be_read() -> None:
    class Unsynced(StaticConfigSource):
        @property
        def synced(self) -> bool:
            return False

    app = create_app(Unsynced(None))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://webhook") as c:
        resp = await c.get("/readyz")
    assert resp.status_code == 503
    assert "config" in resp.text


async def test_two_apps_have_separate_metrics(source: StaticConfigSource) -> None:
    first, second = create_app(source), create_app(source)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=first),
                                 base_url="http://a") as a:
        await a.post("/mutate", content=raw_body("a-plain-pod"))
        assert await metric(a, "podplacement_webhook_gated_pods_total") == 1
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=second),
                                 base_url="http://b") as b:
        assert await metric(b, "podplacement_webhook_gated_pods_total") == 0


@pytest.mark.parametrize("api_version", sorted(review_module.ADMISSION_VERSIONS))
@pytest.mark.parametrize("uid", ["a8670eff-7030-4252-bd91-4d52fb022dd3", 'q"u\\o\te', "ü-✓-\u2028",
                                 "\x00\x1f"])
@pytest.mark.parametrize("gated", [False, True])
def test_spliced_answer_is_the_bytes_of_the_answer_dict(
    api_version: str, uid: str, gated: bool
) -> None:
    pod: dict[str, Any] = {"metadata": {"labels": {"app": "x"}}, "spec": {}}
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    tail = b""
    if gated:
        patch = base64.b64encode(review_module.orjson.dumps(gate_patch(pod))).decode()
        response |= {"patchType": "JSONPatch", "patch": patch}
        tail = review_module.patch_tail(pod)
    expected = {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
    answer = review_module.allowed(api_version, uid, tail)
    assert answer.body == review_module.orjson.dumps(expected)
    assert json.loads(answer.body) == expected
    assert answer.headers["content-type"] == "application/json"


async def test_latency_histogram_buckets_are_cumulative(source: StaticConfigSource) -> None:
    metrics = metrics_module.WebhookMetrics()
    bounds = metrics_module._LATENCY_BUCKETS
    for seconds in (0.0, bounds[0], bounds[0] * 1.5, bounds[-1], bounds[-1] * 2):
        metrics.observe_latency(seconds)
    sample = metrics.registry.get_sample_value
    name = "podplacement_webhook_request_duration_seconds"
    # A value equal to a bound is in that bound's bucket ("le").
    assert sample(f"{name}_bucket", {"le": str(bounds[0])}) == 2
    assert sample(f"{name}_bucket", {"le": str(bounds[1])}) == 3
    assert sample(f"{name}_bucket", {"le": str(bounds[-1])}) == 4
    assert sample(f"{name}_bucket", {"le": "+Inf"}) == 5
    assert sample(f"{name}_count") == 5
    assert sample(f"{name}_sum") == pytest.approx(bounds[0] * 2.5 + bounds[-1] * 3)


async def test_bench_baselines_check_the_json_and_answer_the_constant(
    source: StaticConfigSource,
) -> None:
    spec = importlib.util.spec_from_file_location("bench_bareapp", BAREAPP)
    assert spec is not None and spec.loader is not None
    bareapp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bareapp)
    app = bareapp.add_baselines(create_app(source))
    assert "/bare" not in {getattr(r, "path", "") for r in create_app(source).routes}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="https://webhook") as client:
        good = await client.post("/bare-validate", content=raw_body("a-plain-pod"))
        bare = await client.post("/bare", content=raw_body("a-plain-pod"))
        assert good.status_code == 200
        assert good.content == bare.content
        bad = await client.post("/bare-validate", content=raw_body("a-plain-pod")[:100])
        assert bad.status_code == 400
        assert "not a JSON object" in bad.json()["error"]


@pytest.mark.parametrize("labels", [None, {}, {"podplacement.io/scheduling-gate": "removed"},
                                    {"app": "x"}])
async def test_a_pod_created_with_our_gate_gets_the_gated_label(
        client: httpx.AsyncClient, labels: dict[str, str] | None) -> None:
    """The controller watches ``scheduling-gate=gated``: a pod's creator who presets our gate
    with another label value (or none) must not strand the pod gated and unseen."""
    body = review(raw_body("a-plain-pod"))
    pod = body["request"]["object"]
    pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    pod["metadata"].pop("labels", None)
    if labels is not None:
        pod["metadata"]["labels"] = dict(labels)
    resp = (await client.post("/mutate", content=json.dumps(body))).json()
    from localkube.patch import apply_json_patch  # the test oracle's RFC 6902

    patched = apply_json_patch(pod, _decoded_patch(resp))
    assert patched["metadata"]["labels"]["podplacement.io/scheduling-gate"] == "gated"
    assert {k: v for k, v in patched["metadata"]["labels"].items()
            if k != "podplacement.io/scheduling-gate"} == {
        k: v for k, v in (labels or {}).items() if k != "podplacement.io/scheduling-gate"}
    assert patched["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
