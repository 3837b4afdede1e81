"""A label a pod's creator writes hides no escape (docs/escaped-pods.md, "Labels that hide
nothing"), on the real control plane v1.36.2 with podplacement installed from deploy/ as
shipped (its RBAC, kube-scheduler, the product's webhook and controller as processes with
deploy/'s ServiceAccount tokens).

A user ``mallory`` with the built-in ClusterRole ``edit`` in one namespace. One pod of an
amd64-only image is placed honestly and bound by kube-scheduler. Then, with
``spec.admission.mechanism: Webhook`` and the webhook killed (failurePolicy Ignore lets pods
in unplaced), mallory creates pods bound with ``spec.nodeName`` to ``node-windows``
(windows/amd64: the image can't run there) that carry the label
``podplacement.io/node-affinity=set``: alone, with the decision annotation copied from the
placed pod, and with its node affinity copied too; one with the label alone on an amd64 node;
and one without any label (the escape the monitor always found); and pods that carry the
escape record's own label and annotation ``podplacement.io/placement-escaped`` (``fit``) as
the monitor writes them, which mallory may write but not its condition (``pods/status``: 403;
in the pod as created, the API server drops it).
Each gets one ``PlacementEscaped`` Event, the record ``podplacement.io/placement-escaped``
(with its condition) and a count in ``podplacement_escaped_pods_total``; the honest pod gets
neither.
"""

from __future__ import annotations

import copy
import json
import signal
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.rules.config import (
    AFFINITY_LABEL,
    DECISION_ANNOTATION,
    ESCAPE_CONDITION,
    ESCAPE_LABEL,
)
from podplacement.sandbox.product import Product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import bind_edit, installed_cluster, product_with_metrics, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
POLICY = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/podplacement-gate"
MALLORY = {"Impersonate-User": "mallory"}
NS = "mallory"
ESCAPED_METRIC = "podplacement_escaped_pods_total"
#: An escape record as the monitor writes it on a pod that can run where it is.
FORGED_ESCAPE = ('{"node":"node-windows","nodePlatform":"windows/amd64",'
                 '"platforms":["windows/amd64"],"result":"fit","reason":"it can run there",'
                 '"at":1800000000}')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "tenant-escapes")


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Product, int]]:
    """The installed product; the controller's /metrics on 127.0.0.1 (its port returned)."""
    yield from product_with_metrics(cluster, registry, tmp_path_factory, "tenant-escapes")


@pytest.fixture(scope="module")
def image(registry: Registry, make_pusher: Any) -> str:
    make_pusher(registry).image("tenant/amd64-only", "v1", architecture="amd64")
    return f"{registry.host}/tenant/amd64-only:v1"


@pytest.fixture(scope="module")
def ns(cluster: KubeEnv, image: str) -> str:
    """mallory's namespace, where mallory has ``edit``."""
    cluster.ensure_namespace(NS)
    bind_edit(cluster, NS)

    def mallory_may_create() -> bool:  # RBAC is read by the API server at once
        r = cluster.request("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All",
                            json=_pod("probe", image), headers=MALLORY)
        return r.status_code == 201

    wait_for(mallory_may_create, 20, every=0.5)
    return NS


def _pod(name: str, image: str, *, node: str | None = None,
         labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}],
                            "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeName"] = node
    if affinity:
        spec["affinity"] = copy.deepcopy(affinity)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _create(cluster: KubeEnv, pod: dict[str, Any]) -> dict[str, Any]:
    r = cluster.request("POST", f"/api/v1/namespaces/{NS}/pods", json=pod, headers=MALLORY)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _escape_events(cluster: KubeEnv) -> dict[str, dict[str, Any]]:
    """The ``PlacementEscaped`` Events of mallory's namespace by the pod's UID."""
    items = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{NS}/events")["items"]
    return {e["regarding"]["uid"]: e for e in items if e.get("reason") == "PlacementEscaped"}


def _metric(port: int, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_placement_label_a_tenant_writes_hides_no_escape(
        cluster: KubeEnv, product: tuple[Product, int], ns: str, image: str) -> None:
    prod, port = product
    honest = _create(cluster, _pod("honest", image))
    path = f"/api/v1/namespaces/{ns}/pods"
    placed = wait_for(lambda: (lambda p: p if p["spec"].get("nodeName") and AFFINITY_LABEL in (
        p["metadata"].get("labels") or {}) else None)(cluster.get(f"{path}/honest")), 60)
    annotation = placed["metadata"]["annotations"][DECISION_ANNOTATION]
    affinity = placed["spec"]["affinity"]
    assert placed["spec"]["nodeName"].startswith("node-amd64"), placed["spec"]["nodeName"]

    cluster.patch(CONFIG, {"spec": {"admission": {"mechanism": "Webhook"}}})
    wait_for(lambda: cluster.request("GET", POLICY).status_code == 404, 30)
    prod.webhook.stop(signal.SIGKILL)
    try:
        label = {AFFINITY_LABEL: "set"}
        forged = {
            "label": _pod("label", image, node="node-windows", labels=label),
            "copied-decision": _pod("copied-decision", image, node="node-windows",
                                    labels=label,
                                    annotations={DECISION_ANNOTATION: annotation}),
            "copied-affinity": _pod("copied-affinity", image, node="node-windows",
                                    labels=label,
                                    annotations={DECISION_ANNOTATION: annotation},
                                    affinity=affinity),
            "unlabelled": _pod("unlabelled", image, node="node-windows"),
            # the escape record itself, as the monitor writes its label and annotation
            "escape-record": _pod("escape-record", image, node="node-windows",
                                  labels={ESCAPE_LABEL: "fit"},
                                  annotations={ESCAPE_LABEL: FORGED_ESCAPE}),
            "both-labels": _pod("both-labels", image, node="node-windows",
                                labels={**label, ESCAPE_LABEL: "fit"},
                                annotations={DECISION_ANNOTATION: annotation,
                                             ESCAPE_LABEL: FORGED_ESCAPE},
                                affinity=affinity),
        }
        # and its condition in the pod as created: the API server drops a new pod's status
        forged["escape-record"]["status"] = {"conditions": [
            {"type": ESCAPE_CONDITION, "status": "True", "reason": "Fit"}]}
        fit = _pod("label-fit", image, node="node-amd64-a", labels=label)
        uids = {name: _create(cluster, pod)["metadata"]["uid"] for name, pod in forged.items()}
        fit_uid = _create(cluster, fit)["metadata"]["uid"]
        for name in forged:  # admitted unplaced: the webhook is down
            pod = cluster.get(f"{path}/{name}")
            assert not pod["spec"].get("schedulingGates"), name
        # the part of the record mallory cannot write: the condition (pods/status)
        r = cluster.request("PATCH", f"{path}/escape-record/status", json={
            "status": {"conditions": [{"type": ESCAPE_CONDITION, "status": "True"}]}},
            content_type="merge", headers=MALLORY)
        assert r.status_code == 403, r.text

        def all_reported() -> dict[str, dict[str, Any]]:
            events = _escape_events(cluster)
            return events if set(uids.values()) | {fit_uid} <= set(events) else {}

        try:
            events = wait_for(all_reported, 45, every=0.5)
        except AssertionError:
            reported = set(_escape_events(cluster))
            missing = [n for n, u in uids.items() if u not in reported]
            raise AssertionError(f"no PlacementEscaped Event for {missing}") from None
        for name, uid in uids.items():
            assert (events[uid]["type"], events[uid]["action"]) == ("Warning", "Detect"), name
            pod = cluster.get(f"{path}/{name}")
            labels = pod["metadata"]["labels"]
            assert labels[ESCAPE_LABEL] == "unfit", (name, labels)
            record = json.loads(pod["metadata"]["annotations"][ESCAPE_LABEL])
            assert record["nodePlatform"] == "windows/amd64", record
            assert ("labelDoubted" in record) == (AFFINITY_LABEL in forged[name]["metadata"][
                "labels"]), record
            assert [(c["type"], c["reason"]) for c in pod["status"]["conditions"]
                    if c["type"] == ESCAPE_CONDITION] == [(ESCAPE_CONDITION, "Unfit")], name
        assert events[fit_uid]["type"] == "Normal"
        assert cluster.get(f"{path}/label-fit")["metadata"]["labels"][ESCAPE_LABEL] == "fit"
        assert _metric(port, ESCAPED_METRIC, 'outcome="unfit"') == len(uids)
        assert _metric(port, ESCAPED_METRIC, 'outcome="fit"') == 1
        # each reported once; the honest pod, seen by the same watch before them all: no
        # check, no record
        items = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{NS}/events")["items"]
        per_pod = Counter(e["regarding"]["uid"] for e in items
                          if e.get("reason") == "PlacementEscaped")
        assert set(per_pod.values()) == {1}, per_pod
        assert honest["metadata"]["uid"] not in _escape_events(cluster)
        assert ESCAPE_LABEL not in cluster.get(f"{path}/honest")["metadata"]["labels"]
        print("tenant escapes: label alone, copied decision, copied affinity with "
              "spec.nodeName, a preset escape record and the unlabelled pod each reported "
              "once, unfit on windows/amd64; the label alone on an amd64 node reported fit; "
              "the honest pod left alone")
    finally:
        prod.restart_webhook()
        cluster.patch(CONFIG, {"spec": {"admission": {"mechanism": None}}})
        wait_for(lambda: cluster.request("GET", POLICY).status_code == 200, 30)
