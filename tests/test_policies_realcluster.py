"""PodPlacementPolicies end to end, with podplacement installed from deploy/ on the real
control plane v1.36.2 (docs/guide/policies.md).

- Two policies in one namespace, different selectors and priorities, and pods matching one,
  both or neither: each pod gets exactly the weights and limits of the highest-priority
  match, or the cluster's; the decision annotation and the label name the policy, whichever
  path placed the pod (the admission policy for a pod whose policy removes nothing).
- ``allowedArchitectures: [arm64]`` with an amd64-only image: the unsatisfiable marker, a
  Warning, and the real scheduler does not bind the pod.
- Deleting a policy: the next pod falls back to the cluster's config, within 2 s.
- A duplicate priority is reported in the younger policy's status (``Accepted=False``); the
  status counts the pods placed; the printer columns show priority, selector and placed.
- RBAC: a user with the built-in ``edit`` role in one namespace manages that namespace's
  policies (aggregated ClusterRoles), is refused in another, and a policy of theirs changes
  nothing for the pods of another namespace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import (
    DECISION_ANNOTATION,
    NO_SUPPORTED_PLATFORM_KEY,
    POLICY_LABEL,
    SCHEDULING_GATE,
)
from podplacement.sandbox.product import NAMESPACE, Product, install_manifests, start_product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import (
    NO_STAND_DOWN,
    REPO,
    checked_namespace,
    real_cluster,
    wait_for,
)
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

PARAMS = params_path(NAMESPACE)
GROUP_PATH = "/apis/podplacement.io/v1beta1"
#: The sample PodPlacementConfig's weights (deploy/samples/podplacementconfig.yaml).
CLUSTER_WEIGHTS = {"amd64": 50, "arm64": 25}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    plane = real_cluster(tmp_path_factory, "policies")
    env = next(plane)
    try:
        assert env.plane is not None
        install_manifests(env.plane, REPO / "deploy")
        yield env
    finally:
        plane.close()


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    assert cluster.plane is not None
    # The controller's path fills the catalog the admission policy reads, which these tests
    # watch: no inspection at admission by the webhook (its own paths have their tests).
    cluster.patch("/apis/podplacement.io/v1beta1/podplacementconfigs/cluster",
                  {"spec": {"admission": {"inspectionBudget": "0s"}}})
    options = ["--insecure-registry", registry.host]
    prod = start_product(cluster.plane, tmp_path_factory.mktemp("product"),
                         controller_options=[*options, *NO_STAND_DOWN],
                         webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


@pytest.fixture(scope="module")
def images(registry: Registry, make_pusher: Any) -> dict[str, str]:
    pusher = make_pusher(registry)
    pusher.multiarch("policies/multi", "v1", ["linux/amd64", "linux/arm64", "linux/s390x"])
    pusher.image("policies/amd64", "v1", architecture="amd64")
    return {"multi": f"{registry.host}/policies/multi:v1",
            "amd64": f"{registry.host}/policies/amd64:v1"}


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    yield from checked_namespace(cluster, "pol")


def policy(name: str, priority: int, selector: dict[str, Any] | None = None,
           **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"priority": priority, **spec}
    if selector is not None:
        body["podSelector"] = selector
    return {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
            "metadata": {"name": name}, "spec": body}


def weights(scores: dict[str, int]) -> dict[str, Any]:
    return {"platforms": [{"architecture": a, "weight": w} for a, w in scores.items()]}


def _pod(name: str, image: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0}}


def _policies_path(ns: str, name: str = "") -> str:
    return f"{GROUP_PATH}/namespaces/{ns}/podplacementpolicies" + (f"/{name}" if name else "")


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in pod["spec"].get("schedulingGates") or [])


def _placed(cluster: KubeEnv, ns: str, name: str) -> dict[str, Any]:
    """The pod once ungated (by any path)."""
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    return dict(wait_for(lambda: (lambda p: None if _gated(p) else p)(cluster.get(path)), 30))


def _record(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    return out


def _required_archs(pod: dict[str, Any]) -> set[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {v for t in terms for e in t["matchExpressions"] if e["key"] == "kubernetes.io/arch"
            for v in e["values"]}


def _preferred(pod: dict[str, Any]) -> dict[str, int]:
    na = pod["spec"]["affinity"]["nodeAffinity"]
    return {t["preference"]["matchExpressions"][0]["values"][0]: t["weight"]
            for t in na.get("preferredDuringSchedulingIgnoredDuringExecution") or []}


def _published(cluster: KubeEnv, ns: str) -> list[str]:
    spec = cluster.get(PARAMS).get("spec") or {}
    return [p["name"] for p in (spec.get("policies") or {}).get(ns) or []]


def _warm(cluster: KubeEnv, ns: str, image: str) -> None:
    """A first pod of ``image``: gated, inspected and placed by the controller, which
    publishes the image in the params object; returns once the admission policy places a
    dry-run pod of it."""
    cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"warm-{abs(hash(image)) % 999}",
                                                          image, {"warm": "yes"}))
    wait_for(lambda: image in flat_catalog(cluster.get(PARAMS).get("spec") or {})[0],
             30)

    def policy_places() -> bool:
        # the API server reads the params object through its own informer: a moment after
        # the write, a pod may still be gated; a dry-run create shows what the policy sees
        r = cluster.request("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                            json=_pod("probe", image, {"warm": "probe"}))
        annotation = (r.json()["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
        return bool(annotation) and json.loads(annotation).get("path") == "admission"

    wait_for(policy_places, 30)


def test_the_highest_priority_match_applies_on_every_path(
        cluster: KubeEnv, product: Product, images: dict[str, str], ns: str) -> None:
    multi = images["multi"]
    web = cluster.create(_policies_path(ns), policy(
        "web", 10, {"matchLabels": {"app": "web"}}, nodeAffinityScoring=weights({"arm64": 80})))
    cluster.create(_policies_path(ns), policy(
        "batch", 20, {"matchExpressions": [{"key": "tier", "operator": "In",
                                            "values": ["batch"]}]},
        allowedArchitectures=["amd64", "arm64"], nodeAffinityScoring=weights({"amd64": 30})))
    wait_for(lambda: _published(cluster, ns) == ["batch", "web"], 10)
    _warm(cluster, ns, multi)

    cases = {  # pod labels -> (policy, required archs, weights, path)
        "web": ({"app": "web"}, "web", {"amd64", "arm64", "s390x"}, {"arm64": 80}),
        "batch": ({"tier": "batch"}, "batch", {"amd64", "arm64"}, {"amd64": 30}),
        "both": ({"app": "web", "tier": "batch"}, "batch", {"amd64", "arm64"}, {"amd64": 30}),
        "neither": ({"app": "db"}, None, {"amd64", "arm64", "s390x"}, CLUSTER_WEIGHTS),
    }
    for name, (labels, want, archs, scores) in cases.items():
        created = cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod(name, multi, labels))
        pod = _placed(cluster, ns, name)
        record = _record(pod)
        assert record.get("policy") == want, (name, record)
        assert pod["metadata"]["labels"].get(POLICY_LABEL) == want, name
        assert _required_archs(pod) == archs, name
        assert _preferred(pod) == scores, name
        if want == "batch":  # s390x removed: the Warning names it; never the policy's CEL
            assert record["notAllowed"] == ["linux/s390x"]
            assert record.get("path") != "admission"
        else:  # nothing removed: placed inside the API server
            assert not _gated(created) and record.get("path") == "admission", (name, record)

    # status: accepted, the selector text, the pods placed; the printer columns
    def status_of(name: str) -> dict[str, Any]:
        return dict(cluster.get(_policies_path(ns, name)).get("status") or {})

    wait_for(lambda: status_of("batch").get("placedPods") == 2, 10)
    status = status_of("web")
    assert status["observedGeneration"] == web["metadata"]["generation"]
    assert status["selector"] == "app=web" and status["placedPods"] == 1
    assert status["conditions"][0]["type"] == "Accepted"
    assert status["conditions"][0]["status"] == "True"
    table = cluster.request("GET", _policies_path(ns), headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns[:4] == ["Name", "Priority", "Selector", "Placed"]
    rows = {r["cells"][0]: r["cells"][1:4] for r in table["rows"]}
    assert rows["web"] == [10, "app=web", 1]

    # a second policy with priority 10: the younger one is not applied, and says why
    cluster.create(_policies_path(ns), policy("copy", 10, {"matchLabels": {"app": "other"}},
                                              allowedArchitectures=["s390x"]))
    wait_for(lambda: (status_of("copy").get("conditions") or [{}])[0].get("reason")
             == "PriorityConflict", 10)
    assert status_of("copy")["conditions"][0]["status"] == "False"
    assert _published(cluster, ns) == ["batch", "web"]

    # deleting a policy: the next pod falls back to the cluster's config within 2 s (the
    # copy, accepted once web is gone, selects other pods)
    cluster.delete(_policies_path(ns, "web"))
    deleted = time.monotonic()
    made = 0

    def back_to_cluster() -> bool:
        nonlocal made
        made += 1
        cluster.create(f"/api/v1/namespaces/{ns}/pods",
                       _pod(f"after-{made}", multi, {"app": "web"}))
        return "policy" not in _record(_placed(cluster, ns, f"after-{made}"))

    wait_for(back_to_cluster, 10, every=0.05)
    took = time.monotonic() - deleted
    print(f"the deleted policy stopped applying after {took:.2f} s")
    assert took <= 2.0, f"the deleted policy still applied {took:.2f}s later"
    last = _placed(cluster, ns, f"after-{made}")
    assert _preferred(last) == CLUSTER_WEIGHTS and POLICY_LABEL not in last["metadata"]["labels"]


def test_nothing_allowed_gives_the_marker_a_warning_and_no_binding(
        cluster: KubeEnv, product: Product, images: dict[str, str], ns: str) -> None:
    amd64 = images["amd64"]
    cluster.create(_policies_path(ns), policy("arm-only", 1, {},
                                              allowedArchitectures=["arm64"]))
    wait_for(lambda: _published(cluster, ns) == ["arm-only"], 10)
    r = cluster.request("POST", f"/api/v1/namespaces/{ns}/pods", json=_pod("stuck", amd64))
    assert r.status_code == 201, r.text
    pod = _placed(cluster, ns, "stuck")
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": NO_SUPPORTED_PLATFORM_KEY,
                                            "operator": "Exists"}]}]
    record = _record(pod)
    assert record["policy"] == "arm-only" and record["result"] == "no-supported-platform"
    assert record["notAllowed"] == ["linux/amd64"]

    # a Warning: an Event from the controller, or the webhook's answer to the create
    def warned() -> bool:
        events = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
        return any(e.get("type") == "Warning" and e.get("reason") == "NoSupportedPlatform"
                   and (e.get("regarding") or {}).get("name") == "stuck" for e in events)

    admission_warning = "arm-only" in r.headers.get("warning", "")
    assert admission_warning or wait_for(warned, 15)
    time.sleep(3)  # the scheduler had its chance
    assert not cluster.get(f"/api/v1/namespaces/{ns}/pods/stuck")["spec"].get("nodeName")
    cluster.delete(f"/api/v1/namespaces/{ns}/pods/stuck")


def test_an_edit_user_of_one_namespace_affects_no_other(
        cluster: KubeEnv, product: Product, images: dict[str, str], ns: str,
        tmp_path: Path) -> None:
    other = f"{ns}-b"
    cluster.ensure_namespace(other)
    try:
        cluster.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "alice-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "alice"}]})
        alice = {"Impersonate-User": "alice"}
        strict = policy("strict", 255, {}, allowedArchitectures=["s390x"],
                        fallbackArchitecture="s390x")

        def alice_creates() -> bool:  # the aggregation controller adds our rules to edit
            r = cluster.request("POST", _policies_path(ns), json=strict, headers=alice)
            return r.status_code == 201

        wait_for(alice_creates, 30, every=0.5)
        r = cluster.request("POST", _policies_path(other), json=strict, headers=alice)
        assert r.status_code == 403, r.text
        r = cluster.request("PATCH", _policies_path(ns, "strict") + "/status",
                            json={"status": {"placedPods": 99}}, content_type="merge",
                            headers=alice)
        assert r.status_code == 403, "the status is the controller's"
        wait_for(lambda: _published(cluster, ns) == ["strict"], 10)
        _warm(cluster, other, images["multi"])
        cluster.create(f"/api/v1/namespaces/{other}/pods", _pod("elsewhere", images["multi"]))
        pod = _placed(cluster, other, "elsewhere")
        assert "policy" not in _record(pod)
        assert _required_archs(pod) == {"amd64", "arm64", "s390x"}
        assert _preferred(pod) == CLUSTER_WEIGHTS
        # in alice's own namespace the policy applies
        cluster.create(f"/api/v1/namespaces/{ns}/pods", _pod("own", images["multi"]))
        assert _required_archs(_placed(cluster, ns, "own")) == {"s390x"}
    finally:
        cluster.delete(f"/api/v1/namespaces/{other}")


def test_the_crd_refuses_what_the_rule_cannot_use(cluster: KubeEnv, ns: str) -> None:
    """The schema and its CEL rules, on the API server: priority bounds, the fallback
    inside the allowed list, selector values per operator, distinct architectures, a name
    that fits a label value."""
    exists_with_values = {"matchExpressions": [{"key": "a", "operator": "Exists",
                                                "values": ["x"]}]}
    in_without_values = {"matchExpressions": [{"key": "a", "operator": "In"}]}
    bad = {
        "priority": policy("p", 256),
        "fallback": policy("p", 1, allowedArchitectures=["arm64"],
                           fallbackArchitecture="amd64"),
        "exists": policy("p", 1, exists_with_values),
        "in": policy("p", 1, in_without_values),
        "duplicate": policy("p", 1, allowedArchitectures=["arm64", "arm64"]),
        "arch": policy("p", 1, allowedArchitectures=["riscv64"]),
        "name": policy("p" * 64, 1),
    }
    for what, obj in bad.items():
        r = cluster.request("POST", _policies_path(ns), json=obj)
        assert r.status_code == 422, (what, r.status_code, r.text[:300])
    made = cluster.create(_policies_path(ns), policy(
        "ok", 0, allowedArchitectures=["arm64"], fallbackArchitecture="arm64",
        nodeAffinityScoring={"platforms": [{"architecture": "arm64", "weight": 1}]}))
    assert made["spec"]["nodeAffinityScoring"]["enabled"] is True
