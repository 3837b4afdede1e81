"""The admission paths end to end, with podplacement installed from deploy/ on the real
control plane v1.36.2 (issue 14 item 6).

- With ``inspectionBudget: 0s`` (nothing inspected at admission): the first pod of a public
  image is gated by the MutatingAdmissionPolicy and placed by the controller; once the
  controller published the image in the params object ImagePlatformCatalog, its replicas are
  created placed by the policy: no gate, ``"path":"admission"``, and no PATCH from the
  controller. A private image (htpasswd registry, pull secret): every pod of it is gated and
  placed by the controller (the webhook reads no Secret and inspects anonymously only, so
  it never places a private image's pods: docs/security.md).
  With the webhook killed, a cold pod is still gated by the policy and a warm one placed:
  no pod escapes.
- With the default budget: pods of images never seen (a new tag each) and pods pulling
  with ``imagePullPolicy: Always`` are gated by the policy and placed by the webhook in the
  same admission (inspected, or the tag's digest checked with one HEAD; a moved tag gets
  the new platforms), with no PATCH from the controller.
- With the sample config (inspectionBudget 300ms): the first pod of each image is placed by
  the webhook; the controller, which watches the placed pods, inspects those images itself
  and publishes them, so the replicas created afterwards one at a time are placed by the
  policy (at least 95% of them), also with the exec-format-error monitor switched off.
- A Deployment pinned to arm64 by its nodeSelector, of an amd64-only image: each pod gets
  one Warning Event ``IncompatibleNodeSelector`` from the controller, placed by the webhook
  as placed by the controller, with the same text.
- The real scheduler binds every pod to a node of a supported architecture.
"""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.sandbox.product import NAMESPACE, Product, install_manifests, start_product
from tests.controller.conftest import check_bindings
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import (
    NO_STAND_DOWN,
    REPO,
    bind_edit,
    checked_namespace,
    real_cluster,
    wait_for,
)
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

PARAMS = params_path(NAMESPACE)
CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
CONTROLLER_USER = "system:serviceaccount:podplacement-system:podplacement-controller"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    plane = real_cluster(tmp_path_factory, "paths", audit=True)
    env = next(plane)
    try:
        assert env.plane is not None
        install_manifests(env.plane, REPO / "deploy")
        yield env
    finally:
        plane.close()


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    yield from checked_namespace(cluster, "p")


@pytest.fixture
def product(cluster: KubeEnv, registry: Registry, basic_registry: Registry,
            tmp_path: Path) -> Iterator[Product]:
    assert cluster.plane is not None and basic_registry.ca_pem is not None
    ca = tmp_path / "registry-ca.pem"
    ca.write_bytes(basic_registry.ca_pem)
    registry_options = ["--insecure-registry", registry.host,
                        "--ca-file", f"{basic_registry.host}={ca}"]
    prod = start_product(cluster.plane, tmp_path / "product",
                         controller_options=[*registry_options, *NO_STAND_DOWN],
                         webhook_options=registry_options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


def _set_budget(cluster: KubeEnv, budget: str) -> None:
    """Set ``spec.admission.inspectionBudget`` (the webhook's watch picks it up within
    moments: give it one second)."""
    cluster.request("PATCH", CONFIG, json={"spec": {"admission": {"inspectionBudget": budget}}},
                    content_type="application/merge-patch+json").raise_for_status()
    time.sleep(1.0)


def _pod(name: str, image: str, secret: str | None = None,
         pull: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": image}
    if pull:
        container["imagePullPolicy"] = pull
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if secret:
        spec["imagePullSecrets"] = [{"name": secret}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in pod["spec"].get("schedulingGates") or [])


def _path(pod: dict[str, Any]) -> str | None:
    raw = (pod["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
    return None if raw is None else str(json.loads(raw).get("path", "controller"))


def _archs(pod: dict[str, Any]) -> set[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {v for t in terms for e in t["matchExpressions"] if e["key"] == "kubernetes.io/arch"
            for v in e["values"]}


def _controller_patches(cluster: KubeEnv, ns: str, names: list[str]) -> int:
    """Pod PATCHes by the controller to ``names`` (audit log; batched, so read twice)."""
    assert cluster.plane is not None and cluster.plane.audit_log is not None
    time.sleep(2.5)
    count = 0
    for line in cluster.plane.audit_log.read_text().splitlines():
        ev = json.loads(line)
        ref = ev.get("objectRef") or {}
        if (ev.get("stage") == "ResponseComplete" and ev.get("verb") == "patch"
                and ev["user"]["username"] == CONTROLLER_USER
                and ref.get("resource") == "pods" and ref.get("namespace") == ns
                and ref.get("name") in names):
            count += 1
    return count


def _explain(cluster: KubeEnv, ns: str, pod: str) -> dict[str, Any]:
    """``podplacement explain POD -o json`` against the cluster (admin kubeconfig)."""
    proc = subprocess.run(
        [sys.executable, "-m", "podplacement", "explain", pod, "--kubeconfig",
         str(cluster.kubeconfig), "-n", ns, "--assume-platforms", "linux/amd64,linux/arm64",
         "-o", "json"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def _webhook_metric(product: Product, labels: str) -> float:
    """``podplacement_webhook_admissions_total{<labels>}`` read from the webhook's
    ``/metrics`` (HTTPS, the product's CA)."""
    ctx = ssl.create_default_context(cafile=str(product.cert_dir / "ca.crt"))
    text = httpx.get(f"https://127.0.0.1:{product.webhook_port}/metrics", verify=ctx).text
    for line in text.splitlines():
        if line.startswith("podplacement_webhook_admissions_total{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _webhook_reviews(product: Product) -> float:
    """Every AdmissionReview the webhook answered so far (``podplacement_webhook_requests_
    total``, all outcomes), read from its ``/metrics``."""
    ctx = ssl.create_default_context(cafile=str(product.cert_dir / "ca.crt"))
    text = httpx.get(f"https://127.0.0.1:{product.webhook_port}/metrics", verify=ctx).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("podplacement_webhook_requests_total"))


def _create_until(cluster: KubeEnv, ns: str, prefix: str, image: str, path: str,
                  limit: float = 30.0) -> list[dict[str, Any]]:
    """Create pods ``prefix-N`` until one comes back placed by ``path``; returns them all."""
    made: list[dict[str, Any]] = []

    def placed() -> bool:
        pod = cluster.create(f"/api/v1/namespaces/{ns}/pods",
                             _pod(f"{prefix}-{len(made)}", image))
        made.append(pod)
        return _path(pod) == path

    wait_for(placed, limit, every=0.5)
    return made


def test_first_pod_by_the_controller_replicas_by_the_policy_private_ones_by_the_controller(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        basic_registry: Registry, make_pusher: Any, tmp_path: Path) -> None:
    pusher = make_pusher(registry)
    pusher.multiarch("paths/public", "v1", ["linux/amd64", "linux/arm64"])
    public = f"{registry.host}/paths/public:v1"
    make_pusher(basic_registry).image("paths/private", "v1", architecture="arm64")
    private = f"{basic_registry.host}/paths/private:v1"

    # the config's status says which mechanism is in force
    wait_for(lambda: (cluster.get(CONFIG).get("status") or {}).get("admission") == {
        "mechanism": "MutatingAdmissionPolicy", "fastPaths": "Enabled"}, 30)
    # nothing inspected at admission: the paths through the controller and the background fill
    _set_budget(cluster, "0s")

    # public: the first pod is gated and placed by the controller, which publishes the image
    first = cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod("pub-first", public))
    assert _gated(first)
    wait_for(lambda: public in flat_catalog(cluster.get(PARAMS).get("spec") or {})[0],
             30)
    assert cluster.get(f"/api/v1/namespaces/{ns}/pods/pub-first")["metadata"][
        "annotations"][DECISION_ANNOTATION]
    _create_until(cluster, ns, "pub", public, "admission")
    reviews = _webhook_reviews(product)
    replicas = [cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"pub-r{i}", public))
                for i in range(5)]
    for pod in replicas:
        assert not _gated(pod) and _path(pod) == "admission", pod["metadata"]
        assert _archs(pod) == {"amd64", "arm64"}
    assert _controller_patches(cluster, ns, [p["metadata"]["name"] for p in replicas]) == 0
    # ... and the API server did not even call the webhook for them (its objectSelector)
    assert _webhook_reviews(product) == reviews
    # explain says which path a pod took, and which one a manifest would take (dry run)
    assert "MutatingAdmissionPolicy" in _explain(cluster, ns, "pod/pub-r0")["path"]
    assert "controller" in _explain(cluster, ns, "pod/pub-first")["path"]
    manifest = tmp_path / "would-be.json"
    manifest.write_text(json.dumps(_pod("would-be", public)))
    assert _explain(cluster, ns, str(manifest))["path"].startswith(
        "would be placed at admission by the MutatingAdmissionPolicy")

    # private: the params never hold it, nor does the webhook (it reads no Secret, so it
    # never learns what only this namespace's secret opens): every pod of it is gated and
    # placed by the controller, with this namespace's secret
    auth = base64.b64encode(f"{basic_registry.username}:{basic_registry.password}".encode())
    config = json.dumps({"auths": {basic_registry.host: {"auth": auth.decode()}}}).encode()
    cluster.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()}})
    names = [f"priv-{i}" for i in range(3)]
    for name in names:
        assert _gated(cluster.create(f"/api/v1/namespaces/{ns}/pods",
                                     _pod(name, private, "pull")))
        time.sleep(0.5)  # a background fill of the webhook would have had its chance

    def placed_by_the_controller() -> list[dict[str, Any]] | None:
        pods = [cluster.get(f"/api/v1/namespaces/{ns}/pods/{n}") for n in names]
        done = all(not _gated(p) and _path(p) is not None for p in pods)
        return pods if done else None

    for placed in wait_for(placed_by_the_controller, 30):
        assert _path(placed) == "controller" and _archs(placed) == {"arm64"}
    assert private not in flat_catalog(cluster.get(PARAMS).get("spec") or {})[0]

    # the webhook killed: the policy still gates a cold pod and places a warm one
    product.webhook.stop(signal.SIGKILL)
    pusher.image("paths/cold", "v1", architecture="amd64")
    cold = cluster.create(f"/api/v1/namespaces/{ns}/pods",
                          _pod("cold", f"{registry.host}/paths/cold:v1"))
    warm = cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod("warm", public))
    assert _gated(cold), "the policy gates a pod while the webhook is down"
    assert _path(warm) == "admission" and not _gated(warm)

    # every pod ends placed; the scheduler binds each to a node of a supported architecture
    def none_gated() -> bool:
        return not any(_gated(p) for p in
                       cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"])

    wait_for(none_gated, 60)
    assert check_bindings(cluster, ns, within=30) >= len(replicas) + 4


def test_new_images_and_always_pulled_pods_are_placed_at_admission_by_the_webhook(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        make_pusher: Any) -> None:
    # 2 s rather than the default 300 ms: this machine may be loaded; the bound is what
    # matters here, not the registry's speed (the benchmark measures that).
    _set_budget(cluster, "2s")
    pusher = make_pusher(registry)
    # images never seen: a new tag each, of one amd64-only manifest and of one index
    single = pusher.image("paths/new-single", "t0", architecture="amd64")
    index = pusher.multiarch("paths/new-index", "t0", ["linux/amd64", "linux/arm64"])
    refs: list[tuple[str, set[str]]] = []
    for i in range(1, 7):
        pusher.raw_manifest("paths/new-single", f"t{i}", single.body, single.media_type)
        pusher.raw_manifest("paths/new-index", f"t{i}", index.body, index.media_type)
        refs += [(f"{registry.host}/paths/new-single:t{i}", {"amd64"}),
                 (f"{registry.host}/paths/new-index:t{i}", {"amd64", "arm64"})]

    def create(i: int) -> dict[str, Any]:
        return cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"new-{i}", refs[i][0]))

    with ThreadPoolExecutor(4) as pool:
        created = list(pool.map(create, range(len(refs))))
    for pod, (_, archs) in zip(created, refs, strict=True):
        assert not _gated(pod) and _path(pod) == "webhook", pod["metadata"]
        assert _archs(pod) == archs
    assert _webhook_metric(product, 'path="webhook-inspected"') == len(refs)

    # imagePullPolicy Always: the policy gates, the webhook checks the tag's digest
    pusher.image("paths/always", "latest", architecture="arm64")
    always = f"{registry.host}/paths/always:latest"
    pods = [cluster.create(f"/api/v1/namespaces/{ns}/pods",
                           _pod(f"always-{i}", always, pull="Always")) for i in range(3)]
    for pod in pods:
        assert not _gated(pod) and _path(pod) == "webhook" and _archs(pod) == {"arm64"}
    assert _webhook_metric(product, 'path="webhook-revalidated"') == 2
    # the tag moves to an amd64 manifest: the next pod gets the new platforms
    pusher.image("paths/always", "latest", architecture="amd64")
    moved = cluster.create(f"/api/v1/namespaces/{ns}/pods",
                           _pod("always-moved", always, pull="Always"))
    assert not _gated(moved) and _archs(moved) == {"amd64"}
    assert _webhook_metric(product, 'path="webhook-inspected"') == len(refs) + 2

    names = [p["metadata"]["name"] for p in [*created, *pods, moved]]
    assert _controller_patches(cluster, ns, names) == 0
    # no wrong-architecture binding
    assert check_bindings(cluster, ns, within=60) == len(names)


def _config(cluster: KubeEnv, spec: dict[str, Any]) -> None:
    """Merge ``spec`` into the PodPlacementConfig (the webhook's and the controller's
    watches pick it up within moments: give them one second)."""
    cluster.request("PATCH", CONFIG, json={"spec": spec},
                    content_type="application/merge-patch+json").raise_for_status()
    time.sleep(1.0)


def _catalog(cluster: KubeEnv) -> dict[str, str]:
    images: dict[str, str] = flat_catalog(cluster.get(PARAMS).get("spec") or {})[0]
    return images


def test_what_the_webhook_learns_is_published_so_the_policy_places_the_next_pods(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        make_pusher: Any) -> None:
    """The sample config (inspectionBudget 300ms): the first pod of each image is placed by
    the webhook, the controller inspects that image itself and publishes it, and the
    replicas created one at a time afterwards are placed by the policy."""
    _config(cluster, {"admission": {"inspectionBudget": "300ms"}})
    pusher = make_pusher(registry)
    pusher.image("feed/amd", "v1", architecture="amd64")
    pusher.image("feed/arm", "v1", architecture="arm64")
    pusher.multiarch("feed/both", "v1", ["linux/amd64", "linux/arm64"])
    archs = {f"{registry.host}/feed/amd:v1": {"amd64"},
             f"{registry.host}/feed/arm:v1": {"arm64"},
             f"{registry.host}/feed/both:v1": {"amd64", "arm64"}}
    for i, image in enumerate(archs):
        first = cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"first-{i}", image))
        assert _path(first) == "webhook", first["metadata"]
    started = time.monotonic()
    wait_for(lambda: set(archs) <= set(_catalog(cluster)), 5)
    published = time.monotonic() - started
    assert {i: set(v.replace("linux/", "").split(",")) for i, v in _catalog(cluster).items()
            if i in archs} == archs
    paths = []
    for n in range(20):
        for i, image in enumerate(archs):
            pod = cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"r{i}-{n}", image))
            paths.append(_path(pod))
            assert _archs(pod) == archs[image]
    assert paths.count("admission") >= 0.95 * len(paths), paths
    print(f"catalog fed from the webhook's pods: published {published:.1f} s after the "
          f"third first pod; {paths.count('admission')} of {len(paths)} replicas placed by "
          "the policy")

    # with the exec-format-error monitor off, its watch's other reader still runs
    _config(cluster, {"plugins": {"execFormatErrorMonitor": {"enabled": False}}})
    try:
        pusher.image("feed/late", "v1", architecture="amd64")
        late = f"{registry.host}/feed/late:v1"
        assert _path(cluster.create(f"/api/v1/namespaces/{ns}/pods",
                                    _pod("late", late))) == "webhook"
        wait_for(lambda: late in _catalog(cluster), 5)
    finally:
        _config(cluster, {"plugins": {"execFormatErrorMonitor": {"enabled": True}}})


REPORT = f"/api/v1/namespaces/{NAMESPACE}/configmaps/podplacement-webhook-inspections"
MALLORY = {"Impersonate-User": "mallory"}


def _tag_requests(registry: Registry, repository: str, tag: str) -> int:
    """GET and HEAD requests of ``repository``'s manifest by ``tag`` in the registry's
    access log (a fetch of the image by its tag: the inspector asks for the tag once, then
    for the platform manifests by digest)."""
    needle = f"/v2/{repository}/manifests/{tag} HTTP"
    return sum(1 for line in registry.log_path.read_text(errors="replace").splitlines()
               if needle in line and ('"GET ' in line or '"HEAD ' in line))


def test_a_new_image_placed_by_the_webhook_is_fetched_once_and_published_from_its_report(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        make_pusher: Any) -> None:
    """Issue 39 item 4: the webhook places the pod of a new image after one registry fetch;
    the controller publishes that image from the webhook's inspection report (the ConfigMap
    podplacement-webhook-inspections) without fetching it again. A tenant (``edit`` in her
    namespace) can neither create nor patch that ConfigMap, and a report entry naming an
    image no placed pod uses does not enter the catalog."""
    _set_budget(cluster, "2s")
    # the leader created the ConfigMap and the webhook wrote its key (its first write)
    wait_for(lambda: cluster.request("GET", REPORT).status_code == 200
             and (cluster.get(REPORT).get("data") or {}), 20)
    pusher = make_pusher(registry)
    pusher.multiarch("once/app", "v1", ["linux/amd64", "linux/arm64"])
    image = f"{registry.host}/once/app:v1"
    pod = cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod("once", image))
    assert _path(pod) == "webhook" and _archs(pod) == {"amd64", "arm64"}, pod["metadata"]
    wait_for(lambda: image in _catalog(cluster), 15)
    assert _catalog(cluster)[image] == "linux/amd64,linux/arm64"
    time.sleep(1.0)  # a late second fetch would show in the log by now
    assert _tag_requests(registry, "once/app", "v1") == 1
    report = cluster.get(REPORT)
    assert any(image in text for text in (report.get("data") or {}).values()), report

    # mallory, edit in her own namespace, cannot write the report
    cluster.ensure_namespace("mallory-r")
    bind_edit(cluster, "mallory-r")
    wait_for(lambda: cluster.request(
        "GET", "/api/v1/namespaces/mallory-r/configmaps", headers=MALLORY).status_code == 200, 10)
    forged_image = f"{registry.host}/once/forged:v1"
    forged = json.dumps({"v": 1, "written": int(time.time()), "images": {
        forged_image: ["linux/s390x", "sha256:" + "a" * 64, int(time.time())]}})
    r = cluster.request("PATCH", REPORT, json={"data": {"mallory": forged}},
                        content_type="merge", headers=MALLORY)
    assert r.status_code == 403, r.text
    r = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", json={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "forged"},
        "data": {"x": forged}}, headers=MALLORY)
    assert r.status_code == 403, r.text

    # a report entry (written here by the cluster admin) that no placed pod names is never
    # published
    cluster.request("PATCH", REPORT, json={"data": {"admin-test": forged}},
                    content_type="merge").raise_for_status()
    time.sleep(3.0)
    assert forged_image not in _catalog(cluster)


def _pinned_deployment(name: str, image: str) -> dict[str, Any]:
    """Three replicas of ``image`` pinned to arm64 by the user's nodeSelector."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "nodeSelector": {"kubernetes.io/arch": "arm64"},
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": image}]}}}}


def _placed_pods(cluster: KubeEnv, ns: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get(
        f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")["items"]
    placed = [p for p in items if _path(p) is not None]
    return placed if len(placed) == 3 else []


def _warnings(cluster: KubeEnv, ns: str, reason: str) -> dict[str, list[str]]:
    """Pod UID → the notes of its ``reason`` Events by podplacement."""
    out: dict[str, list[str]] = {}
    for ev in cluster.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]:
        if ev.get("reason") == reason and ev.get("reportingController") == (
                "podplacement.io/controller"):
            out.setdefault(ev["regarding"]["uid"], []).append(ev["note"])
    return out


def test_an_incompatible_pin_is_told_by_an_event_on_the_webhook_path_as_on_the_controllers(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        make_pusher: Any) -> None:
    # 2 s rather than 300 ms: the replicas must take the webhook's path on a loaded machine
    _config(cluster, {"admission": {"inspectionBudget": "2s", "fastPaths": "Enabled"}})
    make_pusher(registry).image("events/amd", "v1", architecture="amd64")
    image = f"{registry.host}/events/amd:v1"
    notes: dict[str, list[str]] = {}
    try:
        for path, app in (("webhook", "by-webhook"), ("controller", "by-controller")):
            if path == "controller":  # the webhook then leaves every pod to the controller
                _config(cluster, {"admission": {"fastPaths": "Disabled"}})
            cluster.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                           _pinned_deployment(app, image))
            pods = wait_for(lambda app=app: _placed_pods(cluster, ns, app), 30)
            assert {_path(p) for p in pods} == {path}
            uids = {p["metadata"]["uid"] for p in pods}
            told = wait_for(lambda uids=uids: (lambda w: w if uids <= set(w) else None)(
                _warnings(cluster, ns, "IncompatibleNodeSelector")), 5)
            for uid in uids:
                assert len(told[uid]) == 1, told[uid]  # one per decision
                notes[path] = told[uid]
    finally:
        _config(cluster, {"admission": {"fastPaths": "Enabled"}})
    assert notes["webhook"] == notes["controller"] == [
        "nodeSelector kubernetes.io/arch=arm64 is not among the architectures supported by "
        "every image (amd64); the pod cannot run there"]
