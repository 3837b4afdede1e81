"""One PodPlacementPolicy can't stop the catalog (docs/guide/policies.md, "Limits"), on the
real control plane v1.36.2 with podplacement installed from deploy/.

The params object ``ImagePlatformCatalog/cluster`` carries every namespace's accepted
policies (``spec.policies``) beside the images; its CRD bounds them. A user ``mallory``
with the built-in ClusterRole ``edit`` in one namespace (which aggregates
``podplacement-policies-edit``) writes policies:

- over each limit of the catalog (65 ``matchLabels``, a 400-character key, a key or value
  that is not label syntax, too many expressions, values, requirements or
  ``allowedArchitectures``): the API server refuses each, naming the limit, so the policy
  never reaches the params writer;
- stored before the limits (the policy CRD's ``podSelector`` schema is loosened while it is
  written, as a CRD of an earlier release was, then the shipped CRD is applied again: an
  in-place upgrade; the object stays as stored): the controller skips it from the params
  object, its status says so (``Accepted=False``, reason ``NotPublished``), and the params
  writes go on: another namespace's policy is published and its new image enters the
  catalog;
- within every count the schema holds but too large to publish (``POLICY_MAX_BYTES``, which
  no schema can say): accepted by the API server, not applied, status ``NotPublished``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import POLICY_PLURAL
from podplacement.rules.policy import (
    MAX_MATCH_EXPRESSIONS,
    MAX_MATCH_LABELS,
    MAX_REQUIREMENTS,
    MAX_VALUES,
    POLICY_MAX_BYTES,
    REASON_NOT_PUBLISHED,
)
from podplacement.sandbox.product import NAMESPACE, Product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import bind_edit, installed_cluster, running_product, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

PARAMS = params_path(NAMESPACE)
GROUP_PATH = "/apis/podplacement.io/v1beta1"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/podplacementpolicies.podplacement.io"
MALLORY = {"Impersonate-User": "mallory"}
MALLORY_NS = "mallory"


def _policies(ns: str, name: str = "") -> str:
    return f"{GROUP_PATH}/namespaces/{ns}/{POLICY_PLURAL}" + (f"/{name}" if name else "")


def _policy(name: str, selector: dict[str, Any] | None = None, priority: int = 1,
            **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"priority": priority, **spec}
    if selector is not None:
        body["podSelector"] = selector
    return {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
            "metadata": {"name": name}, "spec": body}


def _labels(n: int, key: str = "k") -> dict[str, str]:
    return {f"{key}{i}": "v" for i in range(n)}


def _exprs(n: int, values: int = 1) -> list[dict[str, Any]]:
    return [{"key": f"e{i}", "operator": "In", "values": [f"v{j}" for j in range(values)]}
            for i in range(n)]


#: The attack of the issue first: one policy that made every params write fail with 422.
STORED_BAD = _policy("sixty-five", {"matchLabels": {**_labels(MAX_MATCH_LABELS + 1),
                                                    "x" * 400: "v"}},
                     priority=100, allowedArchitectures=["amd64"])
#: (case, policy, a fragment of the API server's refusal)
OVER_LIMITS = [
    ("65 matchLabels", _policy("a", {"matchLabels": _labels(MAX_MATCH_LABELS + 1)}),
     "must have at most 64"),
    ("a 400-character matchLabels key", _policy("b", {"matchLabels": {"x" * 400: "v"}}),
     "must be a label key"),
    ("a 400-character expression key", _policy("c", {"matchExpressions": [
        {"key": "x" * 400, "operator": "Exists"}]}), "Too long"),
    ("a key that is not label syntax", _policy("d", {"matchLabels": {"bad key!": "v"}}),
     "must be a label key"),
    ("a key prefix of 254 characters", _policy("e", {"matchExpressions": [
        {"key": "p" * 254 + "/n", "operator": "Exists"}]}), "at most 253 characters"),
    ("a value that is not label syntax", _policy("f", {"matchLabels": {"app": "bad value!"}}),
     "should match"),
    ("a 64-character value", _policy("g", {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["v" * 64]}]}), "Too long"),
    ("17 matchExpressions", _policy("h", {"matchExpressions": _exprs(MAX_MATCH_EXPRESSIONS + 1)}),
     "must have at most 16"),
    ("65 values", _policy("i", {"matchExpressions": _exprs(1, MAX_VALUES + 1)}),
     "must have at most 64"),
    ("65 requirements in all", _policy("j", {
        "matchLabels": _labels(MAX_REQUIREMENTS + 1 - MAX_MATCH_EXPRESSIONS),
        "matchExpressions": _exprs(MAX_MATCH_EXPRESSIONS)}), "at most 64 requirements"),
    ("5 allowedArchitectures", _policy("k", allowedArchitectures=[
        "amd64", "arm64", "ppc64le", "s390x", "riscv64"]), "must have at most 4"),
    ("an unknown architecture", _policy("l", allowedArchitectures=["riscv64"]),
     "Unsupported value"),
    ("5 weights", _policy("m", nodeAffinityScoring={"platforms": [
        {"architecture": a, "weight": 1}
        for a in ("amd64", "arm64", "ppc64le", "s390x", "riscv64")]}), "must have at most 4"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "policylimits")


@pytest.fixture(scope="module")
def image(registry: Registry, make_pusher: Any) -> str:
    make_pusher(registry).multiarch("limits/multi", "v1", ["linux/amd64", "linux/arm64"])
    return f"{registry.host}/limits/multi:v1"


def _as_mallory(cluster: KubeEnv, obj: dict[str, Any], dry_run: bool = False) -> Any:
    query = "?dryRun=All" if dry_run else ""
    return cluster.request("POST", _policies(MALLORY_NS) + query, json=obj, headers=MALLORY)


def _wait_crd_schema(cluster: KubeEnv, loose: bool) -> None:
    """Wait until the API server validates with the CRD just written (it takes a moment):
    a dry run keeps an unknown field of ``podSelector`` (``loose``) or prunes it."""
    probe = _policy("probe", {"unknownField": "x"})

    def seen() -> bool:
        r = _as_mallory(cluster, probe, dry_run=True)
        kept = "unknownField" in (r.json().get("spec") or {}).get("podSelector", {})
        return r.status_code == 201 and kept == loose

    wait_for(seen, 30, every=0.2)


@pytest.fixture(scope="module")
def mallory(cluster: KubeEnv) -> str:
    """mallory's namespace, where she has ``edit``; a policy of 0.2's CRD stored there
    before the limits (module docstring), with the shipped CRD applied again."""
    cluster.ensure_namespace(MALLORY_NS)
    bind_edit(cluster, MALLORY_NS)
    ok = _policy("probe")
    wait_for(lambda: _as_mallory(cluster, ok, dry_run=True).status_code == 201, 20, every=0.5)

    shipped = cluster.get(CRD)
    loose = copy.deepcopy(shipped)
    spec_schema = (loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                   ["properties"]["spec"])
    # the podSelector as an earlier CRD let it be: any content
    spec_schema["properties"]["podSelector"] = {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    loose = cluster.request("PUT", CRD, json=loose)
    assert loose.status_code == 200, loose.text
    _wait_crd_schema(cluster, loose=True)
    r = _as_mallory(cluster, STORED_BAD)
    assert r.status_code == 201, r.text
    restored = cluster.get(CRD)
    restored["spec"]["versions"] = shipped["spec"]["versions"]
    r = cluster.request("PUT", CRD, json=restored)
    assert r.status_code == 200, r.text
    _wait_crd_schema(cluster, loose=False)
    return MALLORY_NS


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry, mallory: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    # the controller's path fills the catalog (no inspection at admission by the webhook)
    cluster.patch(f"{GROUP_PATH}/podplacementconfigs/cluster",
                  {"spec": {"admission": {"inspectionBudget": "0s"}}})
    yield from running_product(cluster, registry, tmp_path_factory)


def _spec(cluster: KubeEnv) -> dict[str, Any]:
    r = cluster.request("GET", PARAMS)
    return dict(r.json().get("spec") or {}) if r.is_success else {}


def _accepted(cluster: KubeEnv, ns: str, name: str) -> dict[str, Any] | None:
    """The policy's ``Accepted`` condition once the controller wrote one."""
    status = cluster.get(_policies(ns, name)).get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Accepted":
            return dict(cond)
    return None


@pytest.mark.parametrize(("case", "obj", "says"), OVER_LIMITS, ids=[c[0] for c in OVER_LIMITS])
def test_a_policy_over_a_limit_is_refused_by_the_api_server(
        cluster: KubeEnv, mallory: str, case: str, obj: dict[str, Any], says: str) -> None:
    r = _as_mallory(cluster, obj)
    if r.status_code == 201:  # (the previous CRD) kept out of the other tests' way
        cluster.delete(_policies(mallory, obj["metadata"]["name"]))
    assert r.status_code == 422, f"{case}: {r.status_code} {r.text[:300]}"
    assert r.json()["reason"] == "Invalid"
    assert says in r.json()["message"], r.json()["message"]


def test_a_policy_at_the_limits_is_accepted(cluster: KubeEnv, mallory: str) -> None:
    at = _policy("at-the-limits", {
        "matchLabels": {**_labels(MAX_REQUIREMENTS - MAX_MATCH_EXPRESSIONS - 1),
                        "p" * 253 + "/" + "n" * 63: "v" * 63},
        "matchExpressions": [
            *_exprs(MAX_MATCH_EXPRESSIONS - 1, 2),
            {"key": "example.com/tier", "operator": "In", "values": ["", "a.b-c_D"]}]},
        priority=200, allowedArchitectures=["amd64", "arm64", "ppc64le", "s390x"])
    r = _as_mallory(cluster, at, dry_run=True)
    assert r.status_code == 201, r.text


def test_a_stored_policy_over_the_limits_is_skipped_and_the_catalog_goes_on(
        cluster: KubeEnv, mallory: str, product: Product, image: str) -> None:
    # another tenant's policy, written after the bad one: published
    cluster.ensure_namespace("team")
    cluster.create(_policies("team"), _policy("team-arm", {"matchLabels": {"app": "web"}},
                                              allowedArchitectures=["arm64"]))
    cond = wait_for(lambda: _accepted(cluster, mallory, "sixty-five"), 30)
    assert (cond["status"], cond["reason"]) == ("False", REASON_NOT_PUBLISHED), cond
    assert "matchLabels" in cond["message"] and "at most 64" in cond["message"], cond
    wait_for(lambda: "team" in (_spec(cluster).get("policies") or {}), 30)
    assert mallory not in _spec(cluster)["policies"]
    ok = wait_for(lambda: _accepted(cluster, "team", "team-arm"), 30)
    assert ok["status"] == "True", ok

    # a new image of another namespace enters the catalog: the params writes succeed
    cluster.ensure_namespace("warm")
    cluster.create("/api/v1/namespaces/warm/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "new-image"},
        "spec": {"containers": [{"name": "c", "image": image}],
                 "terminationGracePeriodSeconds": 0}})
    wait_for(lambda: image in flat_catalog(_spec(cluster))[0], 30)
    failed = [line for proc in product.controllers for line in proc.log().splitlines()
              if "params object cluster: write failed" in line]
    assert failed == []


def test_a_policy_too_large_to_publish_is_not_applied_and_says_so(
        cluster: KubeEnv, mallory: str, product: Product) -> None:
    """Within every count of the schema, but its published entry is over
    ``POLICY_MAX_BYTES``: the API server takes it (no schema can bound bytes), the
    controller does not apply it, and mallory's small policy still is."""
    values = [f"value-{j:02d}-" + "x" * 40 for j in range(MAX_VALUES)]
    big = _policy("too-large", {"matchExpressions": [
        {"key": f"k{i}", "operator": "NotIn", "values": values}
        for i in range(MAX_MATCH_EXPRESSIONS)]}, priority=7)
    r = _as_mallory(cluster, big)
    assert r.status_code == 201, r.text
    small = _policy("small", {"matchLabels": {"app": "db"}}, priority=3,
                    allowedArchitectures=["amd64"])
    assert _as_mallory(cluster, small).status_code == 201
    cond = wait_for(lambda: _accepted(cluster, mallory, "too-large"), 30)
    assert (cond["status"], cond["reason"]) == ("False", REASON_NOT_PUBLISHED), cond
    assert str(POLICY_MAX_BYTES) in cond["message"], cond
    published = wait_for(lambda: (_spec(cluster).get("policies") or {}).get(mallory), 30)
    assert [p["name"] for p in published] == ["small"]
