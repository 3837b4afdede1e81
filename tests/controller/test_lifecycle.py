"""controller.lifecycle on localkube: finalizer, the owned MutatingWebhookConfiguration, status
conditions, drift reverted, ordered uninstall, graceful shutdown, and the bundle of the built-in
certificate Secrets (certs.secretflow) published in the webhook configuration."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from podplacement.controller.lifecycle import (
    CONFIG_PATH,
    LIFECYCLE_KEY,
    WEBHOOK_PATH,
    Lifecycle,
    ServingCertSecret,
)
from podplacement.controller.queue import WorkQueue
from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.admit.webhookconfig import (
    ServiceRef,
    desired_webhook_configuration,
    webhook_drifted,
)
from podplacement.rules.config import (
    CONFIG_FINALIZER,
    GATE_LABEL,
    GATE_LABEL_GATED,
    GATE_LABEL_REMOVED,
    SCHEDULING_GATE,
)
from tests.harness.aioserver import serving
from tests.harness.kube import KubeEnv

NS = "podplacement-system"
URL = "https://127.0.0.1:9443/mutate"
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SAMPLE = Path(__file__).resolve().parents[2] / "deploy/samples/podplacementconfig.yaml"
CONFIGS = "/apis/podplacement.io/v1beta1/podplacementconfigs"


@pytest.fixture
def api(fresh_api: KubeAPI) -> KubeAPI:
    return fresh_api


def _create_config(env: KubeEnv, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = yaml.safe_load(SAMPLE.read_text())
    if spec is not None:
        obj["spec"] = spec
    return env.create(CONFIGS, obj)


def _conditions(env: KubeEnv) -> dict[str, dict[str, Any]]:
    cfg = env.get(CONFIG_PATH)
    return {c["type"]: c for c in (cfg.get("status") or {}).get("conditions") or []}


def _lifecycle(api: KubeAPI, **kw: Any) -> Lifecycle:
    kw.setdefault("url", URL)
    kw.setdefault("ca_bundle", CA)
    return Lifecycle(api, namespace=NS, **kw)


@contextlib.asynccontextmanager
async def _serving(lc: Lifecycle) -> AsyncIterator[WorkQueue]:
    """``lc`` served on a work queue as the controller's leader serves it: its key queued
    once, then every pass's requeue-after."""
    queue = WorkQueue(workers=1, base_delay=0.1, max_delay=1.0)
    queue.start(lc.handle)
    queue.add(LIFECYCLE_KEY)
    try:
        yield queue
    finally:
        await queue.shutdown()


async def test_config_gets_finalizer_webhook_and_available_status(
    fresh_localkube: KubeEnv, api: KubeAPI
) -> None:
    env = fresh_localkube
    _create_config(env)
    lc = _lifecycle(api)
    result = await lc.reconcile()
    assert (result.state, result.webhook, result.status_written) == ("available", "created", True)

    cfg = env.get(CONFIG_PATH)
    assert cfg["metadata"]["finalizers"] == [CONFIG_FINALIZER]
    mwc = env.get(WEBHOOK_PATH)
    desired = desired_webhook_configuration(cfg, ca_bundle=CA, url=URL, own_namespace=NS)
    assert not webhook_drifted(mwc, desired)
    assert base64.b64decode(mwc["webhooks"][0]["clientConfig"]["caBundle"]) == CA
    conds = _conditions(env)
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["status"] == "False"
    assert conds["Degraded"]["status"] == "False"
    assert conds["Deprovisioning"]["status"] == "False"
    assert cfg["status"]["observedGeneration"] == cfg["metadata"]["generation"]
    assert {c["observedGeneration"] for c in conds.values()} == {cfg["metadata"]["generation"]}

    # idempotent: a second pass writes nothing
    assert env.server is not None
    env.server.clear_requests()
    again = await lc.reconcile()
    assert (again.webhook, again.status_written) == ("unchanged", False)
    assert {r.verb for r in env.server.requests} <= {"get", "list", "watch"}
    assert env.get(CONFIG_PATH)["metadata"]["resourceVersion"] == cfg["metadata"]["resourceVersion"]


async def test_finalizer_survives_an_injected_conflict(fresh_localkube: KubeEnv,
                                                       api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env)
    assert env.server is not None
    env.server.inject_fault(409, 1, method="PATCH", plural="podplacementconfigs", name="cluster")
    await _lifecycle(api).reconcile()
    assert env.get(CONFIG_PATH)["metadata"]["finalizers"] == [CONFIG_FINALIZER]


async def test_drift_is_reverted_by_the_resync_loop(fresh_localkube: KubeEnv,
                                                    api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env)
    lc = _lifecycle(api, resync_seconds=0.2)
    async with _serving(lc):
        await _until(lambda: env.request("GET", WEBHOOK_PATH).status_code == 200)
        original = env.get(WEBHOOK_PATH)
        # someone edits the webhook: failurePolicy Fail, no namespace exclusions
        env.patch(WEBHOOK_PATH, [
            {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"},
            {"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": {}},
        ], "json")
        await _until(lambda: env.get(WEBHOOK_PATH)["webhooks"][0]["failurePolicy"] == "Ignore")
        assert env.get(WEBHOOK_PATH)["webhooks"][0]["namespaceSelector"] == (
            original["webhooks"][0]["namespaceSelector"])
        # someone deletes it
        assert env.delete(WEBHOOK_PATH).status_code == 200
        await _until(lambda: env.request("GET", WEBHOOK_PATH).status_code == 200)
        # a foreign label is kept when drift is reverted
        env.patch(WEBHOOK_PATH, {"metadata": {"labels": {"team": "x"}},
                                 "webhooks": []}, "merge")
        await _until(lambda: len(env.get(WEBHOOK_PATH)["webhooks"]) == 1)
        assert env.get(WEBHOOK_PATH)["metadata"]["labels"]["team"] == "x"
    last = lc.last_result
    await asyncio.sleep(0.5)  # over two resync periods: no pass once the queue stopped
    assert lc.last_result is last
    assert env.request("GET", WEBHOOK_PATH).status_code == 200


async def test_spec_change_is_applied_on_notify(fresh_localkube: KubeEnv, api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env, {})
    lc = _lifecycle(api, resync_seconds=30)
    async with _serving(lc) as queue:
        await _until(lambda: _conditions(env).get("Available", {}).get("status") == "True")
        env.patch(CONFIG_PATH, {"spec": {"namespaceSelector": {"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["batch"]}]}}})
        queue.add(LIFECYCLE_KEY)  # what the controller does on the config's watch event

        def applied() -> bool:
            exprs = env.get(WEBHOOK_PATH)["webhooks"][0]["namespaceSelector"]["matchExpressions"]
            return {"key": "tier", "operator": "NotIn", "values": ["batch"]} in exprs

        await _until(applied)
        await _until(lambda: env.get(CONFIG_PATH)["status"]["observedGeneration"] == 2)


async def test_inexpressible_selector_and_invalid_config_degrade(fresh_localkube: KubeEnv,
                                                                 api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env, {"namespaceSelector": {"matchLabels": {"a": "1", "b": "2"}}})
    result = await _lifecycle(api).reconcile()
    assert result.degraded == "NamespaceSelectorNotExpressible"
    conds = _conditions(env)
    assert conds["Degraded"]["status"] == "True"
    assert "requirements" in conds["Degraded"]["message"]
    assert conds["Available"]["status"] == "True"  # the webhook is in place, only broader


async def test_ca_bundle_failure_is_reported_and_raised(fresh_localkube: KubeEnv,
                                                        api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env)

    def broken() -> bytes:
        raise OSError("no ca.crt in /nowhere")

    with pytest.raises(OSError):
        await _lifecycle(api, ca_bundle=broken).reconcile()
    conds = _conditions(env)
    assert (conds["Available"]["status"], conds["Available"]["reason"]) == (
        "False", "CABundleUnavailable")
    assert conds["Degraded"]["status"] == "True"
    assert env.request("GET", WEBHOOK_PATH).status_code == 404


def _gated_pod(name: str, extra_gate: str | None = None) -> dict[str, Any]:
    gates = [{"name": SCHEDULING_GATE}]
    if extra_gate:
        gates.append({"name": extra_gate})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {GATE_LABEL: GATE_LABEL_GATED}},
        "spec": {"schedulingGates": gates,
                 "containers": [{"name": "c", "image": "busybox:1.36"}]},
    }


async def test_ordered_uninstall(fresh_localkube: KubeEnv, api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env)
    env.ensure_namespace("apps")
    seen: dict[str, Any] = {}

    async def ungate_remaining(deadline: float) -> int:
        # what the reconciler's callback would do: release every pod still gated
        seen["deadline"] = deadline
        seen["webhook_status"] = env.request("GET", WEBHOOK_PATH).status_code
        cfg = env.get(CONFIG_PATH)
        seen["config_deleting"] = bool(cfg["metadata"].get("deletionTimestamp"))
        seen["deprovisioning"] = {c["type"]: c["status"]
                                  for c in cfg["status"]["conditions"]}["Deprovisioning"]
        pods = env.get(f"/api/v1/pods?labelSelector={GATE_LABEL}%3D{GATE_LABEL_GATED}")["items"]
        for pod in pods:
            gates = [g["name"] for g in pod["spec"]["schedulingGates"]]
            env.patch(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/"
                      f"{pod['metadata']['name']}", [
                {"op": "test", "path": "/metadata/resourceVersion",
                 "value": pod["metadata"]["resourceVersion"]},
                {"op": "remove", "path": f"/spec/schedulingGates/{gates.index(SCHEDULING_GATE)}"},
                {"op": "replace", "path": "/metadata/labels/podplacement.io~1scheduling-gate",
                 "value": GATE_LABEL_REMOVED},
            ], "json")
        return len(pods)

    lc = _lifecycle(api, ungate_remaining=ungate_remaining, uninstall_deadline_seconds=7)
    await lc.reconcile()
    for i in range(3):
        env.create("/api/v1/namespaces/apps/pods", _gated_pod(f"p{i}"))
    env.create("/api/v1/namespaces/apps/pods", _gated_pod("other", extra_gate="example.com/hold"))

    resp = env.delete(CONFIG_PATH)
    assert resp.status_code == 200
    assert env.get(CONFIG_PATH)["metadata"]["deletionTimestamp"]  # held by our finalizer

    # the first pass removes what gates new pods, then asks to come back once the API
    # server's admission chain has followed (the settle time), releasing nothing yet
    first = await lc.reconcile()
    assert (first.state, first.webhook, first.ungated) == ("uninstalling", "deleted", 0)
    assert first.requeue_after is not None and 0 < first.requeue_after <= 2.0
    assert seen == {}
    assert env.request("GET", WEBHOOK_PATH).status_code == 404
    await asyncio.sleep(first.requeue_after)
    result = await lc.reconcile()
    assert (result.state, result.ungated) == ("uninstalled", 4)
    # order: webhook configuration gone before the pods were released, config still present
    assert seen == {"deadline": 7, "webhook_status": 404, "config_deleting": True,
                    "deprovisioning": "True"}
    assert env.request("GET", CONFIG_PATH).status_code == 404
    assert env.request("GET", WEBHOOK_PATH).status_code == 404
    for i in range(3):
        pod = env.get(f"/api/v1/namespaces/apps/pods/p{i}")
        assert not pod["spec"].get("schedulingGates")
    other = env.get("/api/v1/namespaces/apps/pods/other")
    assert [g["name"] for g in other["spec"]["schedulingGates"]] == ["example.com/hold"]
    # nothing left to do
    assert (await lc.reconcile()).state == "absent"


async def test_no_config_means_no_webhook(fresh_localkube: KubeEnv, api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env)
    lc = _lifecycle(api)
    await lc.reconcile()
    # the finalizer is stripped by hand and the config deleted: our webhook must go too
    env.patch(CONFIG_PATH, {"metadata": {"finalizers": None}})
    env.delete(CONFIG_PATH)
    assert env.request("GET", CONFIG_PATH).status_code == 404
    result = await lc.reconcile()
    assert (result.state, result.webhook) == ("absent", "deleted")
    assert env.request("GET", WEBHOOK_PATH).status_code == 404


async def test_stop_keeps_the_webhook_configuration_for_the_next_leader(
    fresh_localkube: KubeEnv, api: KubeAPI
) -> None:
    env = fresh_localkube
    _create_config(env)
    lc = _lifecycle(api)
    async with _serving(lc):
        await _until(lambda: env.request("GET", WEBHOOK_PATH).status_code == 200)
        uid = env.get(WEBHOOK_PATH)["metadata"]["uid"]
    lc2 = _lifecycle(api)
    async with _serving(lc2):
        await asyncio.sleep(0)
    # Neither stop removed it (issue 13: a rolling update must not open a gap), and it is
    # the same object, never deleted and re-created.
    assert env.get(WEBHOOK_PATH)["metadata"]["uid"] == uid
    # the config itself is untouched by a shutdown
    assert env.get(CONFIG_PATH)["metadata"]["finalizers"] == [CONFIG_FINALIZER]


async def test_cert_manager_mode_never_writes_the_ca_bundle(fresh_localkube: KubeEnv,
                                                            api: KubeAPI) -> None:
    env = fresh_localkube
    _create_config(env)
    lc = _lifecycle(api, ca_bundle=None, cert_manager_certificate=f"{NS}/podplacement-webhook",
                    service=ServiceRef(NS, "podplacement-webhook"), url=None)
    await lc.reconcile()
    mwc = env.get(WEBHOOK_PATH)
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NS}/podplacement-webhook")
    # cert-manager's CA injector fills it in; then someone changes the timeout (drift)
    injected = base64.b64encode(CA).decode()
    env.patch(WEBHOOK_PATH, [
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": injected},
        {"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 29},
    ], "json")
    assert (await lc.reconcile()).webhook == "updated"
    hook = env.get(WEBHOOK_PATH)["webhooks"][0]
    assert hook["timeoutSeconds"] == 5
    assert hook["clientConfig"]["caBundle"] == injected


async def test_lifecycle_publishes_the_bundle_of_the_serving_cert_secret(
    fresh_localkube: KubeEnv, api: KubeAPI
) -> None:
    """The built-in flow (certs.secretflow, tested there) as the lifecycle's CA bundle source:
    exactly the bundle it stores in the Secrets goes into the webhook configuration."""
    env = fresh_localkube
    env.ensure_namespace(NS)
    source = ServingCertSecret(api, NS)
    _create_config(env)
    await _lifecycle(api, ca_bundle=source, service=ServiceRef(NS, "podplacement-webhook"),
                     url=None).reconcile()
    tls = env.get(f"/api/v1/namespaces/{NS}/secrets/podplacement-webhook-tls")
    bundle = base64.b64decode(tls["data"]["ca.crt"])
    assert x509.load_pem_x509_certificates(bundle)
    mwc = env.get(WEBHOOK_PATH)
    assert base64.b64decode(mwc["webhooks"][0]["clientConfig"]["caBundle"]) == bundle
    assert source.webhook_configuration_path == WEBHOOK_PATH


async def _until(predicate: Any, attempts: int = 100, interval: float = 0.1) -> None:
    """Poll ``predicate`` (sync) up to ``attempts`` times; fail when it never holds."""
    for _ in range(attempts):
        if predicate():
            return
        await asyncio.sleep(interval)
    raise AssertionError("condition not reached")


async def test_webhook_configuration_selects_the_right_namespaces_on_admission(
    fresh_localkube: KubeEnv, api: KubeAPI
) -> None:
    """The configuration the lifecycle writes, used by the API server's admission: a
    recording HTTPS webhook (real TLS, trusted through the caBundle) is called for pods in
    ordinary namespaces only, not in opted-out, system, own or config-excluded ones."""
    from aiohttp import web

    from podplacement import certs

    env = fresh_localkube
    ca = certs.generate_ca()
    cert = certs.issue_serving_cert(ca, [], ["127.0.0.1"])
    (Path(env.kubeconfig).parent / "wh.crt").write_bytes(cert.cert_pem)
    (Path(env.kubeconfig).parent / "wh.key").write_bytes(cert.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(Path(env.kubeconfig).parent / "wh.crt",
                        Path(env.kubeconfig).parent / "wh.key")
    called: list[str] = []

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        called.append(review["request"]["namespace"])
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": review["request"]["uid"],
                                               "allowed": True}})

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    async with serving(app, ssl_context=ctx) as url:
        _create_config(env, {"namespaceSelector": {"matchLabels": {"team": "legacy"}}})
        lc = _lifecycle(api, url=f"{url}/mutate", ca_bundle=ca.cert_pem)
        await lc.reconcile()
        namespaces = {
            "plain": None,
            "opted-out": {"podplacement.io/exclude-pod-placement": "yes"},
            "legacy": {"team": "legacy"},
            "other-team": {"team": "web"},
            "kube-system": None,
            NS: None,
        }
        for name, labels in namespaces.items():
            await asyncio.to_thread(env.ensure_namespace, name, labels)
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}
            resp = await asyncio.to_thread(env.request, "POST",
                                           f"/api/v1/namespaces/{name}/pods", pod)
            assert resp.status_code == 201, resp.text
    assert sorted(called) == ["other-team", "plain"]


async def test_rotated_ca_bundle_in_the_cert_dir_reaches_the_webhook(
    fresh_localkube: KubeEnv, api: KubeAPI, tmp_path: Path
) -> None:
    from podplacement import certs
    from podplacement.controller.lifecycle import ca_bundle_from_dir

    env = fresh_localkube
    old_ca, new_ca = certs.generate_ca(), certs.generate_ca()
    (tmp_path / "ca.crt").write_bytes(old_ca.cert_pem)
    _create_config(env)
    lc = _lifecycle(api, ca_bundle=ca_bundle_from_dir(str(tmp_path)))
    await lc.reconcile()

    def bundle() -> bytes:
        return base64.b64decode(env.get(WEBHOOK_PATH)["webhooks"][0]["clientConfig"]["caBundle"])

    assert bundle() == old_ca.cert_pem
    # rotation overlap: the directory now trusts the new and the old CA
    (tmp_path / "ca.crt").write_bytes(new_ca.cert_pem + old_ca.cert_pem)
    assert (await lc.reconcile()).webhook == "updated"
    assert bundle() == new_ca.cert_pem + old_ca.cert_pem


# --- the ordered uninstall and the stand-down as passes of work-queue keys ----------------
def _release_all(env: KubeEnv) -> int:
    """Release every gated pod as the controller's callback would (plain ungate)."""
    pods = env.get(f"/api/v1/pods?labelSelector={GATE_LABEL}%3D{GATE_LABEL_GATED}")["items"]
    for pod in pods:
        gates = [g["name"] for g in pod["spec"]["schedulingGates"]]
        env.patch(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/"
                  f"{pod['metadata']['name']}", [
            {"op": "remove", "path": f"/spec/schedulingGates/{gates.index(SCHEDULING_GATE)}"},
            {"op": "replace", "path": "/metadata/labels/podplacement.io~1scheduling-gate",
             "value": GATE_LABEL_REMOVED},
        ], "json")
    return len(pods)


async def test_release_failures_are_the_queues_count_then_the_uninstall_goes_on(
    fresh_localkube: KubeEnv, api: KubeAPI
) -> None:
    """A release that keeps failing is retried after the queue's backoff (the pass raises);
    at the third failure in a row, counted by the queue, the uninstall goes on without it:
    the config's finalizer is not held forever."""
    env = fresh_localkube
    _create_config(env)
    calls: list[float] = []

    async def failing(deadline: float) -> int:
        calls.append(deadline)
        raise OSError("the API server is unreachable")

    queue = WorkQueue(workers=1, base_delay=0.05, max_delay=0.2)
    lc = _lifecycle(api, ungate_remaining=failing, admission_settle_seconds=0.1,
                    failures=queue.failures)
    await lc.reconcile()
    env.delete(CONFIG_PATH)
    queue.start(lc.handle)
    try:
        queue.add(LIFECYCLE_KEY)
        await _until(lambda: env.request("GET", CONFIG_PATH).status_code == 404)
    finally:
        await queue.shutdown()
    assert len(calls) == 3
    assert lc.last_result is not None and lc.last_result.state == "uninstalled"
    assert not lc.uninstalling


async def test_a_pass_cut_short_resumes_with_the_rest_of_the_release_deadline(
    fresh_localkube: KubeEnv, api: KubeAPI
) -> None:
    """A lost lease or a stop cancels the pass in flight; the next pass (here: the
    process's last work, FINISH_KEY) neither deletes anything again nor restarts the
    release deadline: it is counted from the first release attempt."""
    env = fresh_localkube
    _create_config(env)
    env.ensure_namespace("apps")
    env.create("/api/v1/namespaces/apps/pods", _gated_pod("p0"))
    deadlines: list[float] = []
    started = asyncio.Event()

    async def ungate_remaining(deadline: float) -> int:
        deadlines.append(deadline)
        if len(deadlines) == 1:
            started.set()
            await asyncio.sleep(30)  # cancelled by the stop below
        return _release_all(env)

    lc = _lifecycle(api, ungate_remaining=ungate_remaining, uninstall_deadline_seconds=5,
                    admission_settle_seconds=0.1)
    await lc.reconcile()
    env.delete(CONFIG_PATH)
    async with _serving(lc) as queue:
        queue.add(LIFECYCLE_KEY)
        await asyncio.wait_for(started.wait(), 10)
    assert lc.uninstalling  # the queue stopped in the middle of the release
    await asyncio.sleep(0.3)
    result = await lc.finish()
    assert (result.state, result.ungated, result.requeue_after) == ("uninstalled", 1, None)
    assert deadlines[0] == 5 and 0 < deadlines[1] <= 5 - 0.3
    assert env.request("GET", CONFIG_PATH).status_code == 404
    assert not env.get("/api/v1/namespaces/apps/pods/p0")["spec"].get("schedulingGates")
    assert (await lc.finish()).state == "idle"  # nothing left to finish


async def test_last_stop_stands_down_in_passes(fresh_localkube: KubeEnv, api: KubeAPI) -> None:
    """The stand-down: the params writer is stopped before the params object is deleted,
    the pass asks to come back after the settle time, then releases the gated pods, says
    why in the status and removes the finalizer; the webhook configuration stays."""
    from podplacement.controller.paramswriter import params_collection_path, params_path

    env = fresh_localkube
    _create_config(env)
    env.ensure_namespace(NS)
    env.ensure_namespace("apps")
    env.create(params_collection_path(NS), {
        "apiVersion": "podplacement.io/v1beta1", "kind": "ImagePlatformCatalog",
        "metadata": {"name": "cluster"}, "spec": {"images": {}}, "status": {"entries": 0}})
    env.create("/api/v1/namespaces/apps/pods", _gated_pod("p0"))
    order: list[str] = []

    async def stop_writer() -> None:
        order.append(f"writer stopped, params {env.request('GET', params_path(NS)).status_code}")

    async def ungate_remaining(deadline: float) -> int:
        order.append(f"released, params {env.request('GET', params_path(NS)).status_code}")
        return _release_all(env)

    lc = _lifecycle(api, ungate_remaining=ungate_remaining, before_params_delete=stop_writer,
                    admission_settle_seconds=0.2)
    await lc.reconcile()
    first = await lc.last_stop()
    assert first.state == "standing-down" and first.requeue_after is not None
    assert order == ["writer stopped, params 200"]
    await asyncio.sleep(first.requeue_after)
    done = await lc.last_stop()
    assert (done.state, done.ungated, done.requeue_after) == ("stood-down", 1, None)
    assert order[-1] == "released, params 404"
    conds = _conditions(env)
    assert (conds["Available"]["status"], conds["Available"]["reason"]) == (
        "False", "NoController")
    assert not env.get(CONFIG_PATH)["metadata"].get("finalizers")
    assert env.request("GET", WEBHOOK_PATH).status_code == 200


async def test_the_last_work_is_given_up_after_its_attempts(api: KubeAPI) -> None:
    """A failing pass of the process's last work raises to the queue until the queue has
    counted FINAL_ATTEMPTS - 1 failures, then the key is done; the normal key always
    raises (the queue keeps retrying it)."""
    from podplacement.controller.lifecycle import FINAL_ATTEMPTS, FINISH_KEY, LAST_STOP_KEY

    unreachable = KubeAPI.from_url("http://127.0.0.1:9", request_timeout=1)
    counted = {"n": 0}
    lc = Lifecycle(unreachable, namespace=NS, url=URL, ca_bundle=CA,
                   failures=lambda _key: counted["n"])
    try:
        for key in (FINISH_KEY, LAST_STOP_KEY, LIFECYCLE_KEY):
            counted["n"] = 0
            with pytest.raises(ApiError):
                await lc.handle(key)
            counted["n"] = FINAL_ATTEMPTS - 1
            if key == LIFECYCLE_KEY:
                with pytest.raises(ApiError):
                    await lc.handle(key)
            else:
                assert await lc.handle(key) is None
        with pytest.raises(ValueError):
            await lc.handle("default/pod/uid")
    finally:
        await unreachable.close()
