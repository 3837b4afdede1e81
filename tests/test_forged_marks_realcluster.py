"""No forged skip: what a pod's creator can set never makes an admission path skip placement
or the namespace's PodPlacementPolicy (docs/design.md, issue "what a default install really
does"), on the real control plane v1.36.2 with podplacement installed from deploy/.

A user ``mallory`` with the built-in ClusterRole ``edit`` in one namespace, whose
PodPlacementPolicy allows s390x only, creates pods with every combination of the product's
labels and annotations preset: the label ``scheduling-gate=removed``, the decision annotation
as the admission policy writes it (with the current params object's uid, copied from a
placed pod), our gate itself, the ``node-affinity`` and ``policy`` labels. In Auto mode
(where the webhook configuration skips the pods labelled ``removed``: the policy overwrites
that label on every pod it evaluates), right after the params object was deleted (once the
controller has re-created it), and in Webhook mode, each pod ends placed with
``kubernetes.io/arch In [s390x]``. A gated pod whose labels and annotation mallory rewrites
is placed under the policy too.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.admit.webhookconfig import SKIP_PLACED_SELECTOR
from podplacement.rules.config import (
    AFFINITY_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
    POLICY_LABEL,
    SCHEDULING_GATE,
    admission_mark,
)
from podplacement.sandbox.product import NAMESPACE, Product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import bind_edit, installed_cluster, running_product, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

PARAMS = params_path(NAMESPACE)
CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
WEBHOOK_CONFIG = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                  "podplacement-webhook")
POLICY = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/podplacement-gate"
MALLORY = {"Impersonate-User": "mallory"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "forged")


@pytest.fixture(scope="module")
def image(registry: Registry, make_pusher: Any) -> str:
    make_pusher(registry).multiarch("forged/multi", "v1",
                                    ["linux/amd64", "linux/arm64", "linux/s390x"])
    return f"{registry.host}/forged/multi:v1"


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    yield from running_product(cluster, registry, tmp_path_factory)


@pytest.fixture(scope="module")
def ns(cluster: KubeEnv, product: Product, image: str) -> str:
    """mallory's namespace (``edit``), with a policy that allows s390x only; the image is
    in the params object (placed once by the controller elsewhere)."""
    name = "mallory"
    cluster.ensure_namespace(name)
    bind_edit(cluster, name)
    cluster.create(f"/apis/podplacement.io/v1beta1/namespaces/{name}/podplacementpolicies", {
        "apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
        "metadata": {"name": "s390x-only"},
        "spec": {"priority": 1, "allowedArchitectures": ["s390x"],
                 "fallbackArchitecture": "s390x"}})
    cluster.ensure_namespace("warm")
    # the controller's path publishes the image (no inspection at admission for this one)
    cluster.patch(CONFIG, {"spec": {"admission": {"inspectionBudget": "0s"}}})
    cluster.create("/api/v1/namespaces/warm/pods", _pod("warm", image))
    wait_for(lambda: image in _catalog(cluster), 30)
    cluster.patch(CONFIG, {"spec": {"admission": {"inspectionBudget": "300ms"}}})

    def mallory_may_create() -> bool:  # RBAC is read by the API server at once
        r = cluster.request("POST", f"/api/v1/namespaces/{name}/pods?dryRun=All",
                            json=_pod("probe", image), headers=MALLORY)
        return r.status_code == 201

    wait_for(mallory_may_create, 20, every=0.5)
    return name


def _catalog(cluster: KubeEnv) -> dict[str, str]:
    r = cluster.request("GET", PARAMS)
    return dict(flat_catalog(r.json().get("spec") or {})[0]) if r.is_success else {}


def _pod(name: str, image: str, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, gated: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}],
                            "terminationGracePeriodSeconds": 0}
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _forged_record(uid: str) -> str:
    """A decision annotation as the admission policy writes it for an amd64 placement."""
    return ("{" + admission_mark(uid) + ',"platforms":["linux/amd64"],"oses":["linux"],'
            '"archs":["amd64"],"result":"set","reason":"required architectures amd64"}')


def _variants(uid: str) -> list[tuple[str, dict[str, str], dict[str, str], bool]]:
    """(name, labels, annotations, our gate preset): every combination of the marks."""
    label_sets = [{}, {GATE_LABEL: "removed"},
                  {GATE_LABEL: "removed", AFFINITY_LABEL: "set", POLICY_LABEL: "none"}]
    annotation_sets = [{}, {DECISION_ANNOTATION: _forged_record(uid)},
                       {DECISION_ANNOTATION: '{"path":"admission","result":"set"}'}]
    out = []
    for n, (labels, notes, gated) in enumerate(
            itertools.product(label_sets, annotation_sets, (False, True))):
        if labels or notes or gated:
            out.append((f"v{n}", labels, notes, gated))
    return out


def _required_archs(pod: dict[str, Any]) -> set[str]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms") or []
    return {v for t in terms for e in t.get("matchExpressions") or []
            if e["key"] == "kubernetes.io/arch" for v in e["values"]}


def _settled(cluster: KubeEnv, ns: str, name: str, within: float = 30) -> dict[str, Any]:
    """The pod once our gate is gone (by any path)."""
    path = f"/api/v1/namespaces/{ns}/pods/{name}"

    def ungated() -> dict[str, Any] | None:
        pod = cluster.get(path)
        gates = pod["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else pod

    try:
        return dict(wait_for(ungated, within))
    except AssertionError:
        pod = cluster.get(path)
        raise AssertionError(f"{name} still gated: {pod['metadata'].get('labels')} "
                             f"{pod['metadata'].get('annotations')}") from None


def _create_forged_pods(cluster: KubeEnv, ns: str, image: str, prefix: str,
                        uid: str) -> list[str]:
    names = []
    for name, labels, notes, gated in _variants(uid):
        r = cluster.request("POST", f"/api/v1/namespaces/{ns}/pods",
                            json=_pod(f"{prefix}-{name}", image, labels, notes, gated),
                            headers=MALLORY)
        assert r.status_code == 201, r.text
        names.append(f"{prefix}-{name}")
    return names


def _assert_placed_under_policy(cluster: KubeEnv, ns: str, names: list[str],
                                within: float = 30) -> None:
    wrong = {}
    for name in names:
        pod = _settled(cluster, ns, name, within)
        record = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
        if _required_archs(pod) != {"s390x"} or record.get("policy") != "s390x-only":
            wrong[name] = (_required_archs(pod), record)
    assert wrong == {}


def _uid(cluster: KubeEnv) -> str:
    return str(cluster.get(PARAMS)["metadata"]["uid"])


def _skips_placed(cluster: KubeEnv) -> bool:
    """The webhook configuration skips the pods labelled ``scheduling-gate=removed`` (its
    objectSelector, :func:`rules.admit.webhookconfig.object_selector`)."""
    hooks = cluster.get(WEBHOOK_CONFIG)["webhooks"]
    return any(h.get("objectSelector") == SKIP_PLACED_SELECTOR for h in hooks)


def test_forged_marks_on_create_in_auto_mode(cluster: KubeEnv, ns: str, image: str) -> None:
    uid = _uid(cluster)
    assert _skips_placed(cluster)  # the configuration skips what the policy labels removed
    names = _create_forged_pods(cluster, ns, image, "auto", uid)
    _assert_placed_under_policy(cluster, ns, names)


def test_forged_marks_after_the_params_object_is_deleted(
        cluster: KubeEnv, ns: str, image: str) -> None:
    old = _uid(cluster)
    deleted = time.monotonic()
    cluster.delete(PARAMS)

    def policy_runs_again() -> bool:  # a new params object, or the webhook for every pod
        r = cluster.request("GET", PARAMS)
        renewed = r.is_success and r.json()["metadata"]["uid"] != old
        return renewed or not _skips_placed(cluster)

    wait_for(policy_runs_again, 10, every=0.02)
    print(f"the policy had a params object again (or the webhook took every pod) "
          f"{(time.monotonic() - deleted) * 1000:.0f} ms after the params object was deleted")
    # mallory copies the label and the mark of a pod placed from the deleted object
    names = _create_forged_pods(cluster, ns, image, "deleted", old)
    _assert_placed_under_policy(cluster, ns, names)
    wait_for(lambda: _uid(cluster) != old and _skips_placed(cluster), 20)


def test_forged_marks_in_webhook_mode(cluster: KubeEnv, ns: str, image: str) -> None:
    uid = _uid(cluster)
    cluster.patch(CONFIG, {"spec": {"admission": {"mechanism": "Webhook"}}})
    try:
        wait_for(lambda: cluster.request("GET", POLICY).status_code == 404
                 and not _skips_placed(cluster), 20)
        names = _create_forged_pods(cluster, ns, image, "webhook", uid)
        _assert_placed_under_policy(cluster, ns, names)
    finally:
        cluster.patch(CONFIG, {"spec": {"admission": {"mechanism": "Auto"}}})
        wait_for(lambda: cluster.request("GET", POLICY).status_code == 200, 20)


def test_a_gated_pod_whose_marks_are_rewritten_is_still_placed(
        cluster: KubeEnv, registry: Registry, make_pusher: Any, ns: str) -> None:
    """A pod stays gated while its tag does not exist yet (the controller retries); mallory
    rewrites its labels and annotation as a placed pod's; once the tag exists the pod is
    placed under the namespace's policy."""
    late = f"{registry.host}/forged/late:v1"
    uid = _uid(cluster)
    path = f"/api/v1/namespaces/{ns}/pods"
    variants = {
        "removed": {"metadata": {"labels": {GATE_LABEL: "removed"},
                                 "annotations": {DECISION_ANNOTATION: _forged_record(uid)}}},
        "unlabelled": {"metadata": {"labels": {GATE_LABEL: None},
                                    "annotations": {DECISION_ANNOTATION: _forged_record(uid)}}},
        "marked": {"metadata": {"labels": {GATE_LABEL: "removed", AFFINITY_LABEL: "set"}}},
    }
    for name in variants:
        r = cluster.request("POST", path, json=_pod(f"upd-{name}", late), headers=MALLORY)
        assert r.status_code == 201, r.text
    for name, patch in variants.items():
        pod = cluster.get(f"{path}/upd-{name}")
        assert any(g["name"] == SCHEDULING_GATE for g in pod["spec"]["schedulingGates"])
        r = cluster.request("PATCH", f"{path}/upd-{name}", json=patch, content_type="merge",
                            headers=MALLORY)
        assert r.status_code == 200, r.text
    make_pusher(registry).multiarch("forged/late", "v1", ["linux/amd64", "linux/s390x"])
    # the controller's retries back off, then it falls back (the policy's s390x)
    _assert_placed_under_policy(cluster, ns, [f"upd-{name}" for name in variants], 120)
