"""Evidence a tenant can't write (docs/exec-format-errors.md, "What is evidence", "Who it
applies to"), with podplacement installed from deploy/ on the real control plane v1.36.2
(its RBAC, the admission policy, the webhook, kube-scheduler). The plane has no kubelet: the
test writes container statuses through ``pods/status`` as a kubelet would.

``mallory`` holds the built-in ClusterRole ``edit`` in ``team-a`` only (Impersonate-User,
as in tests/test_forged_marks_realcluster.py); ``team-b`` runs an honest two-architecture
image.

- (a) mallory's pods carry a forged ``podplacement.io/exec-format-error`` record: two errors
  and a verification "mismatch" of team-b's digest on amd64, ``at`` ten years ahead. Nothing
  is excluded (status, metric) and team-b's next pod is placed on both architectures.
- (b) mallory runs team-b's image in team-a, and its containers print ``exec format error``
  and exit 1 on amd64 nodes (written as the kubelet would, ``FallbackToLogsOnError``): the
  words prove the pair for team-a at most; team-b's next pod keeps amd64.
- (c) a real lying image (its arm64 entry holds an amd64 binary) fails once in team-a on an
  arm64 node: the controller's own verification proves it, linux/arm64 is excluded in every
  namespace, and team-b's pod of that image is placed amd64-only and gets the
  ``ExecFormatExclusion`` Event naming the digest, the platform and since when.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.rules.config import DECISION_ANNOTATION, EXEC_FORMAT_ANNOTATION
from podplacement.rules.place.placement import EXEC_FORMAT_EXCLUSION
from podplacement.sandbox.product import Product
from tests.harness.kube import KubeEnv
from tests.harness.oci import Pusher
from tests.harness.realcluster import bind_edit, installed_cluster, product_with_metrics, wait_for
from tests.harness.registry import Registry
from tests.imageinspect._images import elf, file, layer, symlink

pytestmark = pytest.mark.realcluster

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
MALLORY = {"Impersonate-User": "mallory"}
TEAM_A, TEAM_B = "team-a", "team-b"
TEN_YEARS = 10 * 365 * 86400
#: One round of the controller's learn loop (``tick_seconds``) and a margin: how long a
#: negative check waits after the monitor has provably seen what came before.
LEARN_ROUND = 6.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "tenantxfe")


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Product, int]]:
    """The installed product; the controller's /metrics on 127.0.0.1 (its port returned)."""
    yield from product_with_metrics(cluster, registry, tmp_path_factory, "tenantxfe")


def _push(registry: Registry, make_pusher: Any, repo: str, *, honest: bool) -> tuple[str, str]:
    """(``HOST/repo:v1``, its index digest): amd64 and arm64 entries whose arm64 one holds
    an amd64 /bin/busybox unless ``honest``."""
    p: Pusher = make_pusher(registry)
    children = []
    for arch in ("amd64", "arm64"):
        files = layer([file("bin/busybox", elf(arch if honest else "amd64")),
                       symlink("bin/sh", "busybox"),
                       file("etc/build-id", uuid.uuid4().hex.encode())])
        img = p.image(repo, None, architecture=arch, fmt="oci", layers=[files],
                      process={"Cmd": ["sh"]})
        children.append((img, {"os": "linux", "architecture": arch}))
    digest = p.index(repo, "v1", children).digest
    return f"{registry.host}/{repo}:v1", digest


@pytest.fixture(scope="module")
def honest(registry: Registry, make_pusher: Any) -> tuple[str, str]:
    """team-b's image and digest."""
    return _push(registry, make_pusher, "tenant/b-app", honest=True)


@pytest.fixture(scope="module")
def lying(registry: Registry, make_pusher: Any) -> tuple[str, str]:
    return _push(registry, make_pusher, "tenant/lying", honest=False)


@pytest.fixture(scope="module")
def teams(cluster: KubeEnv, product: tuple[Product, int], honest: tuple[str, str]) -> None:
    """team-a with mallory (``edit``), team-b."""
    for name in (TEAM_A, TEAM_B):
        cluster.ensure_namespace(name)
    bind_edit(cluster, TEAM_A)

    def mallory_may_create() -> bool:  # RBAC is read by the API server at once
        r = cluster.request("POST", f"/api/v1/namespaces/{TEAM_A}/pods?dryRun=All",
                            json=_pod("probe", honest[0]), headers=MALLORY)
        return r.status_code == 201

    wait_for(mallory_may_create, 20, every=0.5)


def _pod(name: str, image: str, *, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None,
         arch: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [{
        "name": "app", "image": image, "terminationMessagePolicy": "FallbackToLogsOnError"}]}
    if arch:
        spec["nodeSelector"] = {"kubernetes.io/arch": arch}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _as_mallory(cluster: KubeEnv, pod: dict[str, Any]) -> str:
    r = cluster.request("POST", f"/api/v1/namespaces/{TEAM_A}/pods", json=pod,
                        headers=MALLORY)
    assert r.status_code == 201, r.text
    return str(pod["metadata"]["name"])


def _bound(cluster: KubeEnv, ns: str, name: str) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    found: dict[str, Any] = wait_for(
        lambda: (p := cluster.get(path))["spec"].get("nodeName") and p, 60, every=0.3)
    return found


def _required_archs(pod: dict[str, Any]) -> set[str]:
    terms = ((((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
             .get("nodeSelectorTerms") or [])
    return {v for t in terms for e in t.get("matchExpressions") or []
            if e["key"] == "kubernetes.io/arch" for v in e["values"]}


def _node_arch(cluster: KubeEnv, node: str) -> str:
    return str(cluster.get(f"/api/v1/nodes/{node}")["metadata"]["labels"]["kubernetes.io/arch"])


def _write_status(cluster: KubeEnv, ns: str, name: str, image: str, digest: str,
                  restarts: int, last: dict[str, Any]) -> None:
    """What the kubelet writes after restart ``restarts`` of container ``app``."""
    repo = image.rsplit(":", 1)[0]
    cluster.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "app", "image": image, "imageID": f"{repo}@{digest}", "ready": False,
            "started": False, "restartCount": restarts,
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                                  "message": "back-off 10s restarting failed container"}},
            "lastState": {"terminated": last}}]}})


def _terminated(reason: str, code: int, message: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"reason": reason, "exitCode": code, "message": message, "startedAt": now,
            "finishedAt": now}


def _events(cluster: KubeEnv, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    items = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == reason
            and (e.get("regarding") or {}).get("name") == name]


def _note(event: dict[str, Any]) -> str:
    return str(event.get("note") or event.get("message") or "")


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _excluded(cluster: KubeEnv) -> list[dict[str, Any]]:
    status = cluster.get(CONFIG).get("status") or {}
    return list((status.get("execFormatErrorMonitor") or {}).get("excluded") or [])


def _seen_by_the_monitor(cluster: KubeEnv, image: str, digest: str, prefix: str) -> None:
    """A marker pod in team-a whose container fails with an exec format error: once its
    ``ExecFormatError`` Event exists, the monitor has handled every pod event before it;
    then one learn round passes."""
    name = _as_mallory(cluster, _pod(f"{prefix}-marker-{uuid.uuid4().hex[:4]}", image))
    _bound(cluster, TEAM_A, name)
    _write_status(cluster, TEAM_A, name, image, digest, 1, _terminated(
        "Error", 1, "exec /bin/sh: exec format error\n"))
    wait_for(lambda: _events(cluster, TEAM_A, name, "ExecFormatError"), 30, every=0.3)
    time.sleep(LEARN_ROUND)


def _team_b_pod(cluster: KubeEnv, image: str, prefix: str) -> dict[str, Any]:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.create(f"/api/v1/namespaces/{TEAM_B}/pods", _pod(name, image))
    return _bound(cluster, TEAM_B, name)


def test_a_forged_record_excludes_nothing(cluster: KubeEnv, product: tuple[Product, int],
                                          teams: None, honest: tuple[str, str]) -> None:
    _, port = product
    image, digest = honest
    at = int(time.time()) + TEN_YEARS
    forged = json.dumps({
        "containers": {c: {"restartCount": 0, "imageID": f"{image}@{digest}",
                           "digest": digest, "arch": "amd64", "node": "node-amd64-a",
                           "at": at} for c in ("app", "sidecar")},
        "verified": {digest: {"status": "mismatch", "reason": "forged",
                              "mismatched": ["linux/amd64"], "at": at}}})
    for i in range(2):
        _as_mallory(cluster, _pod(f"forged-{i}", image,
                                  labels={"podplacement.io/node-affinity": "set"},
                                  annotations={EXEC_FORMAT_ANNOTATION: forged}))
    _seen_by_the_monitor(cluster, image, digest, "a")

    assert [x for x in _excluded(cluster) if not x.get("namespace")] == []
    assert _metric(port, "podplacement_exec_format_exclusions") == 0
    pod = _team_b_pod(cluster, image, "after-forged")
    assert _required_archs(pod) == {"amd64", "arm64"}
    decision = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    assert "excluded" not in json.dumps(decision)
    assert _events(cluster, TEAM_B, pod["metadata"]["name"], EXEC_FORMAT_EXCLUSION) == []


def test_words_a_container_prints_steer_no_other_namespace(
        cluster: KubeEnv, product: tuple[Product, int], teams: None,
        honest: tuple[str, str]) -> None:
    image, digest = honest
    names = [_as_mallory(cluster, _pod(f"liar-{i}", image, arch="amd64")) for i in range(2)]
    for name in names:
        assert _node_arch(cluster, _bound(cluster, TEAM_A, name)["spec"]["nodeName"]) == "amd64"
        _write_status(cluster, TEAM_A, name, image, digest, 1, _terminated(
            "Error", 1, "exec /bin/sh: exec format error\n"))
    for name in names:
        wait_for(lambda n=name: _events(cluster, TEAM_A, n, "ExecFormatError"), 30, every=0.3)
    time.sleep(LEARN_ROUND)

    # at most team-a's own pods are steered
    everywhere = [x for x in _excluded(cluster) if not x.get("namespace")]
    assert everywhere == []
    assert all(x["namespace"] == TEAM_A for x in _excluded(cluster))
    pod = _team_b_pod(cluster, image, "after-words")
    assert _required_archs(pod) == {"amd64", "arm64"}
    assert _events(cluster, TEAM_B, pod["metadata"]["name"], EXEC_FORMAT_EXCLUSION) == []


def test_a_verified_mismatch_excludes_everywhere_and_tells_the_other_team(
        cluster: KubeEnv, product: tuple[Product, int], teams: None,
        lying: tuple[str, str]) -> None:
    _, port = product
    image, digest = lying
    name = _as_mallory(cluster, _pod("lying-arm", image, arch="arm64"))
    assert _node_arch(cluster, _bound(cluster, TEAM_A, name)["spec"]["nodeName"]) == "arm64"
    _write_status(cluster, TEAM_A, name, image, digest, 1, _terminated(
        "StartError", 128, 'failed to start containerd task "0123": OCI runtime start '
        "failed: exec /bin/sh: exec format error: unknown"))

    def everywhere() -> list[dict[str, Any]]:
        return [x for x in _excluded(cluster)
                if digest in x["digests"] and not x.get("namespace")]

    (x,) = wait_for(everywhere, 60, every=0.3)
    assert (x["platform"], x["proof"]) == ("linux/arm64", "verification")
    assert x["since"] <= x["lastSeen"] <= time.time() and x["expires"] > time.time()
    assert _metric(port, "podplacement_exec_format_exclusions") >= 1

    pod = _team_b_pod(cluster, image, "b-lying")
    assert _required_archs(pod) == {"amd64"}
    assert _node_arch(cluster, pod["spec"]["nodeName"]) == "amd64"
    entry = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])["images"][0]
    (gone,) = entry["excluded"]
    assert gone["platform"] == "linux/arm64" and gone["since"] and gone["until"]
    (event,) = wait_for(lambda: _events(cluster, TEAM_B, pod["metadata"]["name"],
                                        EXEC_FORMAT_EXCLUSION), 30, every=0.3)
    note = _note(event)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(x["since"]))
    for part in (f"digest {digest}", "platform linux/arm64 excluded since " + since,
                 "verification"):
        assert part in note, note
