"""Per-namespace placement policies: the rule (rules/policy.py) and how every path
applies it (docs/guide/policies.md).

Shown: parsing, the unique-priority ranking (the older policy wins, the other is reported),
label selector semantics, the highest matching priority wins with nothing merged, weights
and fallback replaced, ``allowedArchitectures`` narrowing with its Warning or the
unsatisfiable marker, the annotation and label naming the policy, the status. And a
property over generated pods and policies: the controller's PATCH of the gated pod, the
webhook's admission patch of the object being created, and the admission policy's CEL
variables give the same placement.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localkube.patch import apply_patch
from podplacement.rules.admit import admissionpolicy as ap
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
    NO_SUPPORTED_PLATFORM_KEY,
    POLICY_LABEL,
    PlacementConfig,
    PlatformWeight,
)
from podplacement.rules.place.admission import admission_placement
from podplacement.rules.place.placement import (
    ARCHITECTURES_NOT_ALLOWED,
    NO_SUPPORTED_PLATFORM_EVENT,
    Outcome,
    PlacementInputs,
    placement_facts,
)
from podplacement.rules.place.plan import plan
from podplacement.rules.policy import (
    MAX_MATCH_LABELS,
    MAX_NAMESPACES,
    MAX_REQUIREMENTS,
    NAMESPACE_MAX_BYTES,
    POLICIES_MAX_BYTES,
    POLICY_MAX_BYTES,
    REASON_CATALOG_FULL,
    REASON_INVALID,
    REASON_NOT_PUBLISHED,
    REASON_PRIORITY_CONFLICT,
    PolicyError,
    PolicyLimitError,
    Requirement,
    desired_status,
    fallback_architectures,
    params_policies,
    parse_policy,
    policy_for,
    rank,
    selector_matches,
    selector_text,
)
from tests.controller._pods import apply, gated_pod, img
from tests.controller.test_admissionpolicy_cel import evaluate, mismatches

CLUSTER = PlacementConfig(preferred_platforms=(PlatformWeight("amd64", 50),),
                          fallback_architecture="amd64")
MULTI = {"reg/app:1": img("reg/app:1", "linux/amd64", "linux/arm64", "linux/s390x")}
AMD64_ONLY = {"reg/app:1": img("reg/app:1", "linux/amd64")}


def obj(name: str, priority: int, selector: dict[str, Any] | None = None, *,
        ns: str = "ns", created: str = "2026-01-01T00:00:00Z", **spec: Any) -> dict[str, Any]:
    """A PodPlacementPolicy dict."""
    body: dict[str, Any] = {"priority": priority, **spec}
    if selector is not None:
        body["podSelector"] = selector
    return {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
            "metadata": {"namespace": ns, "name": name, "creationTimestamp": created,
                         "generation": 3},
            "spec": body}


def pod_with(labels: dict[str, str]) -> dict[str, Any]:
    return gated_pod(labels={GATE_LABEL: "gated", **labels})


def _required(p: dict[str, Any]) -> list[Any]:
    na = p["spec"]["affinity"]["nodeAffinity"]
    return list(na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])


def _preferred(p: dict[str, Any]) -> list[tuple[str, int]]:
    na = p["spec"]["affinity"]["nodeAffinity"]
    return [(t["preference"]["matchExpressions"][0]["values"][0], t["weight"])
            for t in na.get("preferredDuringSchedulingIgnoredDuringExecution") or []]


# --- the rule ------------------------------------------------------------------------------


def test_parse_folds_match_labels_into_requirements_and_checks_fields() -> None:
    p = parse_policy(obj("a", 7, {"matchLabels": {"app": "web"}, "matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["db"]}]},
        allowedArchitectures=["arm64", "amd64"], fallbackArchitecture="arm64",
        nodeAffinityScoring={"platforms": [{"architecture": "arm64", "weight": 9}]}))
    assert p.selector == (Requirement("app", "In", ("web",)),
                          Requirement("tier", "NotIn", ("db",)))
    assert p.allowed_architectures == ("amd64", "arm64")
    assert p.weights == (PlatformWeight("arm64", 9),)
    assert selector_text(p.selector) == "app=web,tier notin (db)"
    for bad in (obj("b", 256), obj("c", 1, {"matchExpressions": [
            {"key": "x", "operator": "Exists", "values": ["y"]}]}),
            obj("d", 1, allowedArchitectures=["arm64"], fallbackArchitecture="amd64")):
        with pytest.raises(PolicyError):
            parse_policy(bad)
    assert parse_policy(obj("e", 1, nodeAffinityScoring={"enabled": False, "platforms": [
        {"architecture": "arm64", "weight": 9}]})).weights == ()
    assert parse_policy(obj("f", 1)).weights is None


def test_label_selector_semantics() -> None:
    labels = {"app": "web"}
    assert selector_matches((), {})
    assert selector_matches((Requirement("app", "In", ("web", "db")),), labels)
    assert not selector_matches((Requirement("app", "NotIn", ("web",)),), labels)
    assert selector_matches((Requirement("tier", "NotIn", ("web",)),), labels)
    assert selector_matches((Requirement("app", "Exists"),), labels)
    assert selector_matches((Requirement("tier", "DoesNotExist"),), labels)
    assert not selector_matches((Requirement("app", "Exists"),
                                 Requirement("app", "In", ("db",))), labels)


def test_a_duplicate_priority_is_rejected_for_the_younger_policy() -> None:
    ranking = rank([obj("young", 5, created="2026-02-01T00:00:00Z"),
                    obj("old", 5, created="2026-01-01T00:00:00Z"),
                    obj("low", 1), obj("bad", 300), obj("other-ns", 5, ns="other")])
    assert [p.name for p in ranking.of("ns")] == ["old", "low"]
    assert [p.name for p in ranking.of("other")] == ["other-ns"]
    assert ranking.rejected["ns/young"][0] == REASON_PRIORITY_CONFLICT
    assert "old" in ranking.rejected["ns/young"][1]
    assert ranking.rejected["ns/bad"][0] == REASON_INVALID


def test_the_highest_matching_priority_wins_and_nothing_merges() -> None:
    ranking = rank([
        obj("web", 10, {"matchLabels": {"app": "web"}}, allowedArchitectures=["arm64"]),
        obj("all", 5, {}, nodeAffinityScoring={"platforms": [
            {"architecture": "s390x", "weight": 70}]}),
    ])
    web = policy_for(pod_with({"app": "web"}), ranking.of("ns"))
    assert web is not None and web.name == "web"
    facts = placement_facts(PlacementInputs(pod_with({"app": "web"}), MULTI, CLUSTER, policy=web))
    # web's limit, the cluster's weights (web sets none): nothing taken from "all"
    assert facts.architectures == ("arm64",)
    assert [t["weight"] for t in facts.preferred] == []
    other = policy_for(pod_with({"app": "db"}), ranking.of("ns"))
    assert other is not None and other.name == "all"
    facts = placement_facts(PlacementInputs(pod_with({"app": "db"}), MULTI, CLUSTER, policy=other))
    assert facts.architectures == ("amd64", "arm64", "s390x")
    assert [(t["preference"]["matchExpressions"][0]["values"], t["weight"])
            for t in facts.preferred] == [(["s390x"], 70)]
    assert policy_for(pod_with({}), rank([obj("web", 1, {"matchLabels": {"a": "b"}})])
                      .of("ns")) is None


def test_allowed_architectures_narrow_with_a_warning_naming_the_pairs_removed() -> None:
    policy = parse_policy(obj("no-s390x", 1, allowedArchitectures=["amd64", "arm64"]))
    facts = placement_facts(PlacementInputs(pod_with({}), MULTI, CLUSTER, policy=policy))
    assert facts.outcome == Outcome.SET
    assert facts.architectures == ("amd64", "arm64")
    (warning,) = facts.warnings
    assert warning.reason == ARCHITECTURES_NOT_ALLOWED and "linux/s390x" in warning.message
    assert facts.record["policy"] == "no-s390x"
    assert facts.record["notAllowed"] == ["linux/s390x"]
    assert facts.labels[POLICY_LABEL] == "no-s390x"


def test_nothing_allowed_gives_the_unsatisfiable_marker() -> None:
    policy = parse_policy(obj("arm-only", 1, allowedArchitectures=["arm64"]))
    decision = plan(
        PlacementInputs(pod_with({}), AMD64_ONLY, CLUSTER, policy=policy),
        nodes=None, nrts={}, now=0.0,
    )
    assert decision.outcome == Outcome.NO_SUPPORTED_PLATFORM
    assert decision.events[0].reason == NO_SUPPORTED_PLATFORM_EVENT
    assert "linux/amd64" in decision.events[0].message
    after = apply(pod_with({}), list(decision.patch))
    assert _required(after) == [{"matchExpressions": [
        {"key": NO_SUPPORTED_PLATFORM_KEY, "operator": "Exists"}]}]
    assert after["metadata"]["labels"][POLICY_LABEL] == "arm-only"
    assert json.loads(after["metadata"]["annotations"][DECISION_ANNOTATION])["policy"] \
        == "arm-only"


def test_the_fallback_stays_inside_the_allowed_architectures() -> None:
    failed = {"reg/app:1": LookupError("registry down")}
    limit = parse_policy(obj("limit", 1, allowedArchitectures=["arm64", "s390x"]))
    own = parse_policy(obj("own", 1, fallbackArchitecture="arm64"))
    assert fallback_architectures(CLUSTER, None) == ("amd64",)
    assert fallback_architectures(CLUSTER, own) == ("arm64",)
    assert fallback_architectures(CLUSTER, limit) == ("arm64", "s390x")
    facts = placement_facts(
        PlacementInputs(pod_with({}), failed, CLUSTER, policy=limit, give_up="now"),
    )
    assert facts.outcome == Outcome.FALLBACK
    assert facts.required[0].expressions[0] == {"key": ARCH_LABEL, "operator": "In",
                                                "values": ["arm64", "s390x"]}
    facts = placement_facts(
        PlacementInputs(pod_with({}), failed, CLUSTER, policy=own, give_up="now"),
    )
    assert facts.required[0].expressions[0]["values"] == ["arm64"]
    assert facts.record["fallback"] == "arm64"


def test_status_reports_acceptance_selector_and_placed_pods() -> None:
    young = obj("young", 5, {"matchLabels": {"app": "web"}}, created="2026-02-01T00:00:00Z")
    ranking = rank([young, obj("old", 5)])
    status = desired_status(young, ranking, 4, "2026-03-01T00:00:00Z")
    assert status["observedGeneration"] == 3 and status["placedPods"] == 4
    assert status["selector"] == "app=web"
    (cond,) = status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Accepted", "False",
                                                              REASON_PRIORITY_CONFLICT)
    young["status"] = status
    later = desired_status(young, ranking, 5, "2026-04-01T00:00:00Z")
    assert later["conditions"][0]["lastTransitionTime"] == "2026-03-01T00:00:00Z"
    accepted = desired_status(obj("old", 5), ranking, 0, "2026-03-01T00:00:00Z")
    assert accepted["conditions"][0]["status"] == "True"


# --- every path, one rule ----------------------------------------------------------------------

PLATFORMS = ("linux/amd64", "linux/arm64", "linux/s390x", "linux/ppc64le")
REFS = ("reg/a:1", "reg/b:1")
KEYS, VALUES = ("app", "tier"), ("web", "db")
ARCHS = ("amd64", "arm64", "s390x", "ppc64le")


@st.composite
def scenario(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str], list[dict[str, Any]]]:
    """A pod (labels, 1-2 images, no affinity: what every path can place), the images'
    platforms, and 0-3 policies of its namespace (plus one elsewhere)."""
    table = {r: ",".join(sorted(draw(st.sets(st.sampled_from(PLATFORMS), min_size=1))))
             for r in REFS}
    labels = draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2))
    images = tuple(draw(st.lists(st.sampled_from(REFS), min_size=1, max_size=2, unique=True)))
    pod = gated_pod(images=images, labels=labels)
    policies = []
    for i in range(draw(st.integers(0, 3))):
        spec: dict[str, Any] = {}
        if draw(st.booleans()):
            spec["allowedArchitectures"] = draw(st.lists(st.sampled_from(ARCHS), min_size=1,
                                                         max_size=3, unique=True))
        if draw(st.booleans()):
            spec["nodeAffinityScoring"] = {"platforms": [
                {"architecture": a, "weight": 10 + n} for n, a in enumerate(
                    draw(st.lists(st.sampled_from(ARCHS), max_size=2, unique=True)))]}
        selector = draw(st.sampled_from([{}, {"matchLabels": {"app": "web"}},
                                         {"matchExpressions": [{"key": "tier",
                                                                "operator": "Exists"}]}]))
        policies.append(obj(f"p{i}", draw(st.integers(0, 4)), selector,
                            created=f"2026-01-01T00:00:0{i}Z", **spec))
    policies.append(obj("elsewhere", 9, {}, ns="other", allowedArchitectures=["ppc64le"]))
    return pod, table, policies


def _object_of(gated: dict[str, Any]) -> dict[str, Any]:
    """The pod as it is created (before the policy's gate): no gate, no gate label."""
    out = copy.deepcopy(gated)
    out["metadata"]["labels"].pop(GATE_LABEL, None)
    out["metadata"].pop("resourceVersion")
    del out["spec"]["schedulingGates"]
    return out


def _placed(p: dict[str, Any]) -> tuple[Any, ...]:
    labels = {k: v for k, v in p["metadata"]["labels"].items() if k != GATE_LABEL}
    record = json.loads(p["metadata"]["annotations"][DECISION_ANNOTATION])
    record.pop("path", None)
    record.pop("images", None)
    return p["spec"]["affinity"], labels, record


def test_the_controller_the_webhook_and_the_policy_apply_a_policy_alike() -> None:
    """Generated pods and policies: the controller's PATCH of the gated pod and the
    webhook's admission patch of the created object give the same affinity, labels and
    decision; the admission policy's CEL variables agree with the same rule (and place the
    pod exactly when no architecture is removed)."""
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=scenario())
    def check(case: tuple[dict[str, Any], dict[str, str], list[dict[str, Any]]]) -> None:
        pod, table, policies = case
        ranking = rank(policies)
        policy = policy_for(pod, ranking.of("ns"))
        images = {r: img(r, *v.split(",")) for r, v in table.items()}
        decision = plan(
            PlacementInputs(pod, images, CLUSTER, policy=policy),
            nodes=None, nrts={}, now=0.0,
        )
        by_controller = apply(pod, list(decision.patch))
        created = _object_of(pod)
        answer = admission_placement(created, images, CLUSTER, policy=policy)
        assert answer is not None
        # an admission patch is no update: no pod update rules to check
        by_webhook = apply_patch("application/json-patch+json", created,
                                 json.dumps(list(answer.patch)).encode(), strategic=True)
        assert _placed(by_controller) == _placed(by_webhook)
        assert by_controller["metadata"]["labels"].get(POLICY_LABEL) == (
            policy.name if policy else None)
        assert mismatches(ap.place_variables(CLUSTER), created, table, CLUSTER, ranking) == {}
        cel = evaluate(ap.place_variables(CLUSTER), created, table, ranking)
        if cel["placed"]:
            seen.add("cel-placed-with-policy" if policy else "cel-placed")
            record = json.loads(cel["decision"])
            assert record.get("policy") == (policy.name if policy else None)
        else:
            seen.add("cel-gated")
            assert any(e.reason == ARCHITECTURES_NOT_ALLOWED for e in decision.warnings) or (
                decision.outcome == Outcome.NO_SUPPORTED_PLATFORM and policy is not None)
        seen.add(str(decision.outcome))

    check()
    assert {"cel-placed", "cel-placed-with-policy", "cel-gated", "set",
            "no-supported-platform"} <= seen, seen


def test_a_policy_never_reaches_another_namespace() -> None:
    ranking = rank([obj("strict", 200, {}, ns="team-a", allowedArchitectures=["s390x"])])
    for ns in ("team-b", "default"):
        assert policy_for(pod_with({}), ranking.of(ns)) is None
    created = _object_of(pod_with({}))
    created["metadata"]["namespace"] = "team-b"
    table = {"reg/app:1": "linux/amd64"}
    cel = evaluate(ap.place_variables(CLUSTER), created, table, ranking)
    assert cel["placed"] and not cel["hasPolicy"]


# --- limits: a policy the params object cannot carry is applied nowhere ------------------


def _labels(n: int) -> dict[str, str]:
    return {f"k{i}": "v" for i in range(n)}


@pytest.mark.parametrize(("selector", "spec", "says"), [
    ({"matchLabels": _labels(MAX_MATCH_LABELS + 1)}, {}, "65 entries, at most 64"),
    ({"matchLabels": {"x" * 400: "v"}}, {}, "is not a label key"),
    ({"matchLabels": {"p" * 254 + "/n": "v"}}, {}, "at most 253 characters"),
    ({"matchLabels": {"app": "bad value!"}}, {}, "is not a label value"),
    ({"matchExpressions": [{"key": "bad key", "operator": "Exists"}]}, {}, "not a label key"),
    ({"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"] * 65}]}, {},
     "65 values, at most 64"),
    ({"matchExpressions": [{"key": f"k{i}", "operator": "Exists"} for i in range(17)]}, {},
     "17 items, at most 16"),
    ({"matchLabels": _labels(49), "matchExpressions": [
        {"key": f"e{i}", "operator": "Exists"} for i in range(16)]}, {},
     "65 requirements"),
    (None, {"allowedArchitectures": ["amd64", "arm64", "ppc64le", "s390x", "riscv64"]},
     "5 items, at most 4"),
    (None, {"allowedArchitectures": ["riscv64"]}, "'riscv64' is not one of"),
    (None, {"fallbackArchitecture": "riscv64"}, "is not one of"),
    ({"matchExpressions": [{"key": f"k{i}", "operator": "NotIn",
                            "values": [f"v{j}-" + "x" * 40 for j in range(64)]}
                           for i in range(16)]}, {}, f"at most {POLICY_MAX_BYTES}"),
])
def test_a_policy_over_a_limit_is_not_published_nor_applied(
        selector: dict[str, Any] | None, spec: dict[str, Any], says: str) -> None:
    """A policy over a limit (one stored before its CRD enforced it, or over the bytes no
    schema can bound) is not applied by any path, and its status says why; the other
    policies of its namespace still are."""
    bad = obj("bad", 9, selector, **spec)
    with pytest.raises(PolicyLimitError, match=re.escape(says)):
        parse_policy(bad)
    ranking = rank([bad, obj("good", 1, {"matchLabels": {"app": "web"}})])
    assert [p.name for p in ranking.of("ns")] == ["good"]
    assert [p["name"] for p in params_policies(ranking)["ns"]] == ["good"]
    reason, message = ranking.rejected["ns/bad"]
    assert reason == REASON_NOT_PUBLISHED and says in message
    (cond,) = desired_status(bad, ranking, 0, "2026-03-01T00:00:00Z")["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", REASON_NOT_PUBLISHED)
    assert says in cond["message"] and len(cond["message"]) <= 1000


def test_a_stored_policy_over_a_limit_does_not_take_a_priority() -> None:
    """Not applied, so not in the way: a valid policy of the same priority is accepted."""
    stored = obj("stored", 5, {"matchLabels": _labels(65)}, created="2025-01-01T00:00:00Z")
    ranking = rank([stored, obj("new", 5)])
    assert [p.name for p in ranking.of("ns")] == ["new"]
    assert ranking.rejected["ns/stored"][0] == REASON_NOT_PUBLISHED


def test_the_policies_at_the_limits_are_published() -> None:
    p = parse_policy(obj("at", 1, {
        "matchLabels": {**_labels(47), "p" * 253 + "/" + "n" * 63: "v" * 63},
        "matchExpressions": [{"key": f"e{i}", "operator": "In", "values": ["", "a.b-c_D"]}
                             for i in range(16)]},
        allowedArchitectures=["amd64", "arm64", "ppc64le", "s390x"]))
    assert len(p.selector) == MAX_REQUIREMENTS


def _big(name: str, priority: int, *, ns: str = "ns", created: str = "2026-01-01T00:00:00Z",
         size: int = 10_000) -> dict[str, Any]:
    """A policy whose published entry takes about ``size`` bytes (within every limit)."""
    values = [f"v{j}-" + "x" * 50 for j in range(size // 60)]
    exprs = [{"key": f"k{i}", "operator": "NotIn", "values": values[i * 64:(i + 1) * 64]}
             for i in range((len(values) + 63) // 64)]
    return obj(name, priority, {"matchExpressions": exprs}, ns=ns, created=created)


def test_a_namespace_share_keeps_its_highest_priorities() -> None:
    """Within a namespace's share (NAMESPACE_MAX_BYTES), the lowest priorities are left
    out, and say so; a small one that still fits is kept."""
    ranking = rank([_big("top", 9, size=12_000), _big("mid", 5, size=12_000),
                    _big("low", 2, size=12_000), _big("lower", 1, size=10_000),
                    obj("tiny", 0)])
    assert [p.name for p in ranking.of("ns")] == ["top", "mid", "tiny"]
    assert ranking.rejected["ns/low"][0] == REASON_CATALOG_FULL
    assert ranking.rejected["ns/lower"][0] == REASON_CATALOG_FULL
    assert str(NAMESPACE_MAX_BYTES) in ranking.rejected["ns/low"][1]
    size = len(orjson.dumps(params_policies(ranking)["ns"])) + len('"ns":')
    assert size <= NAMESPACE_MAX_BYTES


def test_a_new_namespace_never_takes_an_older_ones_place() -> None:
    """When ``spec.policies`` is full (POLICIES_MAX_BYTES), the namespaces whose oldest
    policy is the youngest are left out: a tenant's new policies cannot push another
    namespace's out of the params object, however high their priority."""
    older = [_big(f"p{i}", i, ns=f"old-{n:02d}", created=f"2026-01-01T00:{n:02d}:0{i}Z")
             for n in range(14) for i in range(2)]
    base = rank(older)
    published = params_policies(base)
    assert sum(len(g) for g in published.values()) == len(older) - len(base.rejected) > 20
    assert len(orjson.dumps(published)) <= POLICIES_MAX_BYTES
    newcomer = [_big("mine", 255, ns="aaa-new", created="2026-06-01T00:00:00Z", size=2000),
                obj("tiny", 254, ns="aaa-new", created="2026-06-01T00:00:00Z")]
    after = rank([*older, *newcomer])
    assert {k: [p.name for p in v] for k, v in after.accepted.items()
            if k != "aaa-new"} == {k: [p.name for p in v] for k, v in base.accepted.items()}
    assert after.rejected["aaa-new/mine"][0] == REASON_CATALOG_FULL
    assert len(orjson.dumps(params_policies(after))) <= POLICIES_MAX_BYTES


def test_no_more_namespaces_than_the_catalog_holds() -> None:
    objects = [obj("p", 1, ns=f"ns-{n:04d}", created=f"2026-01-01T{n // 3600:02d}:"
                   f"{n // 60 % 60:02d}:{n % 60:02d}Z") for n in range(MAX_NAMESPACES + 2)]
    ranking = rank(objects)
    assert len(params_policies(ranking)) == MAX_NAMESPACES
    assert set(ranking.rejected) == {f"ns-{MAX_NAMESPACES:04d}/p",
                                     f"ns-{MAX_NAMESPACES + 1:04d}/p"}
    assert {r for r, _ in ranking.rejected.values()} == {REASON_CATALOG_FULL}
