"""The Helm chart on the real control plane (kube-apiserver, kube-scheduler,
kube-controller-manager v1.36.2) with helm v4.1.4, as the chart's README says:
``helm install|upgrade podplacement charts/podplacement --namespace podplacement-system``.

The processes run locally with the tokens of the chart's ServiceAccounts
(:mod:`podplacement.sandbox.product`), so the real authorizer enforces the chart's RBAC; the
chart's Deployments are at 0 replicas (``webhook.replicas=0``, ``controller.replicas=0``: no
kubelet here could run their image).

1. ``helm upgrade`` from the previous release's chart with pods flowing. Release 0.1.0 had no
   chart: it gets the one it would have had (:func:`tests.harness.helm.release_chart`: its
   ``deploy/`` laid out as this chart, its sample config created by a post-install hook),
   installed with ``helm install``, its processes from its own tree. Then ``helm upgrade``
   to this chart and the new processes in a rolling update's order, a pod created every
   0.4 s: none on a node its image can't run, none escaped, none left gated, nothing of 0.1.0
   left, the operator's config unchanged; a second ``helm upgrade`` with other config values
   leaves it unchanged too; the chart's README's command to apply the values on purpose does
   (refused on the operator's fields until ``--force-conflicts``).
2. ``helm uninstall`` with pods gated: every pod released, the admission objects, the
   namespace and the uninstall RBAC gone (the ordered uninstall of a deleted namespace), a pod
   created afterwards untouched; left on purpose: the CRDs and with them the config (the
   chart's README, "Uninstall"), which ``kubectl delete crd`` then removes.
3. ``helm install`` on a cluster without any of it: the CRDs from crds/, the config created
   from the values, a pod gated and placed.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.controller.lifecycle import CONFIG_PATH
from podplacement.controller.paramswriter import params_path
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    CONFIG_FINALIZER,
    SCHEDULING_GATE,
    WEBHOOK_CONFIGURATION_NAME,
)
from podplacement.rules.ownership import UNINSTALL_RBAC_NAME
from podplacement.sandbox.product import NAMESPACE, Product, kubectl, start_product
from podplacement.version import source_version
from tests.harness.helm import CHART, helm_or_skip, release_chart, run_helm
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import NO_STAND_DOWN, REPO, real_cluster, wait_for
from tests.harness.registry import Registry
from tests.harness.upgrade import (
    PodFlow,
    get_or_none,
    leftovers,
    outcome,
    pod,
    previous_release,
    previous_release_tree,
    products_to_stop,
    roll,
)

pytestmark = pytest.mark.realcluster

RELEASE = "podplacement"
#: Where the README installs the release (its objects are in NAMESPACE whatever this is).
HELM_NS = ("--namespace", NAMESPACE)
#: No kubelet here could run the image: the tests run the processes themselves.
NO_PODS = ("--set", "webhook.replicas=0", "--set", "controller.replicas=0")
PLATFORMS = {("linux", "amd64"), ("linux", "arm64")}
FLOW_INTERVAL = 0.4
FLOW_LIMIT = 60
#: The new pods' start while the old release runs on under the new objects (shorter than
#: tests/test_upgrade_realcluster.py's, which shows 0.1.0 reconciling under them).
ROLLOUT_DELAY = 2.0
_ADM = "/apis/admissionregistration.k8s.io/v1"
_RBAC = "/apis/rbac.authorization.k8s.io/v1"
_CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
CRDS = {name: _CRD + name for name in ("podplacementconfigs.podplacement.io",
                                       "imageplatformcatalogs.podplacement.io",
                                       "podplacementpolicies.podplacement.io")}
#: What must not outlive ``helm uninstall``.
GONE = {
    "policy": f"{_ADM}/mutatingadmissionpolicies/{ADMISSION_POLICY_NAME}",
    "binding": f"{_ADM}/mutatingadmissionpolicybindings/{ADMISSION_POLICY_NAME}",
    "webhook configuration": f"{_ADM}/mutatingwebhookconfigurations/{WEBHOOK_CONFIGURATION_NAME}",
    "params": params_path(NAMESPACE),
    "uninstall role": f"{_RBAC}/clusterroles/{UNINSTALL_RBAC_NAME}",
    "uninstall binding": f"{_RBAC}/clusterrolebindings/{UNINSTALL_RBAC_NAME}",
    "controller role": f"{_RBAC}/clusterroles/podplacement-controller",
    "namespace": f"/api/v1/namespaces/{NAMESPACE}",
}


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm_or_skip()
    return previous_release_tree(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, old_tree: Path) -> Iterator[KubeEnv]:
    # no CRDs: the charts bring them
    yield from real_cluster(tmp_path_factory, "helm", crds=False)


@pytest.fixture(scope="module")
def state() -> Iterator[dict[str, Any]]:
    """What one test leaves for the next; every product in it is stopped at the end."""
    yield from products_to_stop()


def _helm(cluster: KubeEnv, *args: str, check: bool = True) -> Any:
    assert cluster.plane is not None
    return run_helm(*args, kubeconfig=cluster.plane.kubeconfig, check=check)


def _bound(cluster: KubeEnv, ns: str, name: str) -> dict[str, Any] | None:
    p = cluster.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return p if p["spec"].get("nodeName") else None


def _gated(p: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in p["spec"].get("schedulingGates") or [])


def _present(cluster: KubeEnv, paths: dict[str, str]) -> list[str]:
    return [name for name, path in paths.items()
            if cluster.request("GET", path).status_code != 404]


def _covers(live: Any, want: Any) -> bool:
    """Every field of ``want`` is in ``live`` with the same value (``live`` may hold more)."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(_covers(live.get(k), v) for k, v in want.items())
    return bool(live == want)


def _force_delete_product_pods(cluster: KubeEnv) -> None:
    """What a kubelet does for the product's pods being deleted (made before a scale-down,
    bound to a fake node): confirm the deletion, so that the namespace can go."""
    r = cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    if r.status_code == 200:
        for p in r.json()["items"]:
            cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/"
                            f"{p['metadata']['name']}", params={"gracePeriodSeconds": "0"})


def test_helm_upgrade_from_the_previous_releases_chart_with_pods_flowing(
        cluster: KubeEnv, old_tree: Path, registry: Registry, make_pusher: Any,
        tmp_path: Path, state: dict[str, Any]) -> None:
    plane = cluster.plane
    assert plane is not None
    make_pusher(registry).multiarch("helm/multi", "v1", ["linux/amd64", "linux/arm64"])
    image = f"{registry.host}/helm/multi:v1"
    options = ["--insecure-registry", registry.host]
    version = previous_release()["version"]

    # --- the previous release, installed with (the equivalent of) its chart ---
    old_chart = release_chart(old_tree, version, tmp_path / "chart")
    _helm(cluster, "install", RELEASE, str(old_chart), *HELM_NS, "--create-namespace")
    old = start_product(plane, tmp_path / "old", controller_options=options,
                        env={"PYTHONPATH": str(old_tree)}, cwd=old_tree)
    state["products"].append(old)
    cluster.patch(CONFIG_PATH, {"spec": {"plugins": {"nodeAffinityScoring": {
        "enabled": False}}, "imageInspection": {"maxRetries": 7}}})
    operator = cluster.get(CONFIG_PATH)
    ns = f"helm-{int(time.time()) % 100000}"
    cluster.ensure_namespace(ns)
    cluster.create(f"/api/v1/namespaces/{ns}/pods", pod("warm", image))
    wait_for(lambda: _bound(cluster, ns, "warm"), 60)

    # --- helm upgrade to this chart, the new processes in a rolling update's order ---
    def helm_upgrade() -> None:
        _helm(cluster, "upgrade", RELEASE, str(CHART), *HELM_NS, *NO_PODS)
        kubectl(plane, "wait", "--for", "condition=Established", "--timeout=60s",
                *[f"crd/{name}" for name in CRDS])

    flow = PodFlow(plane, ns, image, FLOW_INTERVAL, FLOW_LIMIT).start()
    time.sleep(2)  # some pods before the upgrade
    try:
        new, timing = roll(plane, old, None, tmp_path / "new",
                           controller_options=[*options, *NO_STAND_DOWN],
                           webhook_options=options, missing=lambda: leftovers(plane),
                           rollout_delay=ROLLOUT_DELAY, identity="helm-new-0",
                           apply=helm_upgrade)
        state["products"].append(new)
        time.sleep(2)  # and some after it
    finally:
        flow.stop()
    result = outcome(plane, ns, PLATFORMS)
    phases = [t - timing.started for t in flow.times]
    during = sum(1 for t in phases if 0 <= t <= timing.complete)
    summary = (f"helm upgrade {version} -> chart {CHART.name}: upgraded {timing.applied:.1f} s, "
               f"new controller leading {timing.new_leads:.1f} s, nothing of {version} left "
               f"{timing.complete:.1f} s; {len(flow.created)} pods created ({during} during), "
               f"{result.bound} bound, paths {dict(result.paths)}, wrong {len(result.wrong)}, "
               f"escaped {len(result.escaped)}, stranded {len(result.stranded)}")
    print(summary)
    assert flow.failures == [] and flow.violations == []
    assert during >= 10, summary
    assert result.wrong == [] and result.escaped == [] and result.stranded == [], summary
    assert result.bound == len(flow.created) + 1, summary
    assert leftovers(plane) == []
    assert new.forbidden() == [], "RBAC denials in the new processes' logs"
    config = cluster.get(CONFIG_PATH)
    assert config["metadata"]["generation"] == operator["metadata"]["generation"]
    assert _covers(config["spec"], operator["spec"]), (config["spec"], operator["spec"])
    history = json.loads(_helm(cluster, "history", RELEASE, *HELM_NS, "-o", "json").stdout)
    assert [h["chart"] for h in history] == [f"podplacement-{version}",
                                             f"podplacement-{source_version(REPO)}"]

    # --- another helm upgrade with other config values: the config stays the operator's ---
    _helm(cluster, "upgrade", RELEASE, str(CHART), *HELM_NS, *NO_PODS,
          "--set", "config.spec.imageInspection.maxRetries=2",
          "--set", "config.spec.logVerbosity=Debug")
    again = cluster.get(CONFIG_PATH)
    assert again["metadata"]["generation"] == operator["metadata"]["generation"]
    assert again["spec"] == config["spec"]

    # --- unless asked: the chart's README renders the config and applies it by hand ---
    rendered = tmp_path / "config.yaml"
    rendered.write_text(_helm(cluster, "template", RELEASE, str(CHART),
                              "--set", "config.spec.imageInspection.maxRetries=2",
                              "--show-only", "templates/podplacementconfig.yaml").stdout)
    refused = kubectl(plane, "apply", "--server-side", "-f", str(rendered), check=False)
    assert refused.returncode != 0 and "conflict" in refused.stderr, refused.stderr
    assert cluster.get(CONFIG_PATH)["spec"] == config["spec"]  # the operator's fields win
    kubectl(plane, "apply", "--server-side", "--force-conflicts", "-f", str(rendered))
    asked = cluster.get(CONFIG_PATH)["spec"]
    assert asked["imageInspection"]["maxRetries"] == 2
    assert asked["plugins"]["nodeAffinityScoring"]["enabled"] is True
    state.update(product=new)


def test_helm_uninstall_releases_every_pod_and_leaves_only_the_crds_and_config(
        cluster: KubeEnv, registry: Registry, state: dict[str, Any]) -> None:
    plane = cluster.plane
    assert plane is not None
    if "product" not in state:
        pytest.skip("the upgrade test did not complete")
    product: Product = state["product"]
    # pods gated when the operator acts: their image is not in the registry, so neither the
    # policy nor the webhook can place them, and the controller is stopped
    image = f"{registry.host}/helm/missing:v1"
    ns = f"helm-u-{int(time.time()) % 100000}"
    cluster.ensure_namespace(ns)
    product.controllers[0].popen.send_signal(signal.SIGSTOP)
    try:
        for i in range(15):
            created = cluster.create(f"/api/v1/namespaces/{ns}/pods", pod(f"g-{i}", image))
            assert _gated(created), created["spec"]
        started = time.monotonic()
        _helm(cluster, "uninstall", RELEASE, *HELM_NS)
    finally:
        product.controllers[0].popen.send_signal(signal.SIGCONT)
    for proc in [*product.controllers, product.webhook]:  # their pods are deleted: SIGTERM
        proc.popen.send_signal(signal.SIGTERM)

    def released() -> bool:
        return not any(_gated(p) for p in cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"])

    wait_for(released, 60, every=0.5)
    took = time.monotonic() - started

    def all_gone() -> bool:
        _force_delete_product_pods(cluster)
        return not _present(cluster, GONE)

    wait_for(all_gone, 60, every=0.5)
    gone = time.monotonic() - started
    # the CRDs stay (Helm never deletes crds/ nor a CRD hook), and so does the config, which
    # the ordered uninstall left without our finalizer
    assert _present(cluster, CRDS) == list(CRDS)
    config = cluster.get(CONFIG_PATH)
    assert CONFIG_FINALIZER not in (config["metadata"].get("finalizers") or [])
    assert _helm(cluster, "list", "--all-namespaces", "-q").stdout.strip() == ""
    # a pod created now is neither gated nor placed
    late = cluster.create(f"/api/v1/namespaces/{ns}/pods", pod("late", image))
    assert not _gated(late) and "affinity" not in late["spec"], late["spec"]
    # the chart's README: what removes the rest
    kubectl(plane, "delete", "crd", *CRDS)
    wait_for(lambda: not _present(cluster, {**CRDS, "config": CONFIG_PATH}), 30, every=0.5)
    print(f"helm uninstall: 15 gated pods released in {took:.1f} s, the namespace and the "
          f"admission objects gone after {gone:.1f} s")


def test_helm_install_creates_the_crds_and_the_config_from_values(
        cluster: KubeEnv, registry: Registry, make_pusher: Any, tmp_path: Path,
        state: dict[str, Any]) -> None:
    plane = cluster.plane
    assert plane is not None
    wait_for(lambda: not _present(cluster, {"namespace": GONE["namespace"],
                                            "config": CONFIG_PATH}), 60, every=0.5)
    assert get_or_none(plane, CRDS["podplacementconfigs.podplacement.io"]) is None
    _helm(cluster, "install", RELEASE, str(CHART), *HELM_NS, "--create-namespace", *NO_PODS,
          "--set", "config.spec.imageInspection.maxRetries=4")
    config = cluster.get(CONFIG_PATH)
    assert config["spec"]["imageInspection"]["maxRetries"] == 4
    assert config["spec"]["plugins"]["nodeAffinityScoring"]["platforms"] == [
        {"architecture": "amd64", "weight": 50}, {"architecture": "arm64", "weight": 25}]
    product = start_product(plane, tmp_path / "product",
                            controller_options=["--insecure-registry", registry.host,
                                                *NO_STAND_DOWN])
    state["products"].append(product)
    make_pusher(registry).multiarch("helm/fresh", "v1", ["linux/arm64", "linux/s390x"])
    ns = f"helm-i-{int(time.time()) % 100000}"
    cluster.ensure_namespace(ns)
    created = cluster.create(f"/api/v1/namespaces/{ns}/pods",
                             pod("one", f"{registry.host}/helm/fresh:v1"))
    assert _gated(created)
    bound = wait_for(lambda: _bound(cluster, ns, "one"), 60)
    node = cluster.get(f"/api/v1/nodes/{bound['spec']['nodeName']}")
    assert node["metadata"]["labels"]["kubernetes.io/arch"] in {"arm64", "s390x"}
    assert product.forbidden() == []
