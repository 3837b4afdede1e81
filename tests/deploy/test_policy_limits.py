"""A policy's limits are in one place (rules/policy.py) and both CRDs hold them: the
PodPlacementPolicy CRD refuses a policy over one when it is written, and the
ImagePlatformCatalog CRD takes whatever the controller publishes of the policies it accepts
(so one policy cannot make every write of the params object fail with 422).

Shown without a cluster: each number and pattern of deploy/crds/podplacementpolicy.yaml
equals its constant and is no looser than the catalog's; the CEL rules carry the same
numbers and the key pattern; and, over generated policies (within the policy CRD's counts,
many namespaces), everything :func:`rules.policy.rank` accepts is published as a
``spec.policies`` that the catalog CRD's schema validates and that keeps to the byte budget.
The real API server's answers are in tests/test_tenant_policylimits_realcluster.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import orjson
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podplacement.rules import policy as P
from podplacement.rules.config import ARCHITECTURES, PARAMS_MAX_BYTES

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"


def _spec_schema(name: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / name).read_text())
    (version,) = crd["spec"]["versions"]
    out: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return out


POLICY = _spec_schema("podplacementpolicy.yaml")
SPEC = POLICY["properties"]["spec"]["properties"]
SELECTOR = SPEC["podSelector"]
LABELS = SELECTOR["properties"]["matchLabels"]
EXPRS = SELECTOR["properties"]["matchExpressions"]
EXPR = EXPRS["items"]["properties"]
CATALOG_POLICIES = _spec_schema("imageplatformcatalog.yaml")["properties"]["spec"][
    "properties"]["policies"]
ENTRY = CATALOG_POLICIES["additionalProperties"]["items"]["properties"]
REQ = ENTRY["selector"]["items"]["properties"]


def _rules(schema: dict[str, Any]) -> list[str]:
    return [str(r["rule"]) for r in schema.get("x-kubernetes-validations") or []]


def test_the_policy_crd_holds_the_limits_of_rules_policy() -> None:
    assert LABELS["maxProperties"] == P.MAX_MATCH_LABELS
    assert LABELS["additionalProperties"]["maxLength"] == P.MAX_VALUE_LENGTH
    assert LABELS["additionalProperties"]["pattern"] == P.LABEL_VALUE_PATTERN
    assert EXPRS["maxItems"] == P.MAX_MATCH_EXPRESSIONS
    assert EXPR["key"]["maxLength"] == P.MAX_KEY_LENGTH
    assert EXPR["key"]["pattern"] == P.LABEL_KEY_PATTERN
    assert _rules(EXPR["key"]) == [f"self.indexOf('/') <= {P.MAX_KEY_PREFIX_LENGTH}"]
    assert EXPR["operator"]["enum"] == list(P.OPERATORS)
    assert EXPR["values"]["maxItems"] == P.MAX_VALUES
    assert EXPR["values"]["items"]["maxLength"] == P.MAX_VALUE_LENGTH
    assert EXPR["values"]["items"]["pattern"] == P.LABEL_VALUE_PATTERN
    (total,) = _rules(SELECTOR)
    assert total.endswith(f"<= {P.MAX_REQUIREMENTS}")
    (keys,) = _rules(LABELS)
    found = re.search(r"matches\('([^']*)'\)", keys)
    assert found is not None
    assert found.group(1).replace("\\\\", "\\") == P.LABEL_KEY_PATTERN
    assert f"k.size() <= {P.MAX_KEY_LENGTH}" in keys
    assert f"k.indexOf('/') <= {P.MAX_KEY_PREFIX_LENGTH}" in keys
    allowed = SPEC["allowedArchitectures"]
    assert allowed["maxItems"] == P.MAX_ARCHITECTURES
    assert allowed["items"]["enum"] == list(ARCHITECTURES)
    platforms = SPEC["nodeAffinityScoring"]["properties"]["platforms"]
    assert platforms["maxItems"] == P.MAX_ARCHITECTURES
    assert platforms["items"]["properties"]["architecture"]["enum"] == list(ARCHITECTURES)
    assert SPEC["fallbackArchitecture"]["enum"] == list(ARCHITECTURES)
    assert (SPEC["priority"]["minimum"], SPEC["priority"]["maximum"]) == (
        P.MIN_PRIORITY, P.MAX_PRIORITY)
    assert _rules(POLICY)[0] == f"self.metadata.name.size() <= {P.MAX_NAME_LENGTH}"


def test_the_catalog_crd_takes_every_policy_the_limits_allow() -> None:
    assert CATALOG_POLICIES["maxProperties"] == P.MAX_NAMESPACES
    assert CATALOG_POLICIES["additionalProperties"]["maxItems"] == P.MAX_POLICIES_PER_NAMESPACE
    assert ENTRY["name"]["maxLength"] == P.MAX_NAME_LENGTH
    assert ENTRY["selector"]["maxItems"] == P.MAX_REQUIREMENTS
    assert REQ["key"]["maxLength"] == P.MAX_KEY_LENGTH
    assert REQ["operator"]["maxLength"] >= max(len(o) for o in P.OPERATORS)
    assert REQ["values"]["maxItems"] == P.MAX_VALUES
    assert REQ["values"]["items"]["maxLength"] == P.MAX_VALUE_LENGTH
    assert ENTRY["weights"]["maxProperties"] >= P.MAX_ARCHITECTURES
    assert ENTRY["allowed"]["maxItems"] >= P.MAX_ARCHITECTURES
    assert ENTRY["allowed"]["items"]["maxLength"] >= max(len(a) for a in ARCHITECTURES)
    # the policies' share and the images' fit the API server's 1.5 MiB object with room
    # for spec.fresh and the metadata
    assert PARAMS_MAX_BYTES + P.POLICIES_MAX_BYTES <= 1_572_864 - 250_000
    assert P.POLICY_MAX_BYTES < P.NAMESPACE_MAX_BYTES - 70 < P.POLICIES_MAX_BYTES


def test_the_guide_states_the_limits_the_code_keeps() -> None:
    guide = (CRDS.parents[1] / "docs" / "guide" / "policies.md").read_text()
    for number in (P.POLICY_MAX_BYTES, P.POLICIES_MAX_BYTES, P.NAMESPACE_MAX_BYTES,
                   P.MAX_NAMESPACES, PARAMS_MAX_BYTES):
        assert f"{number:,}" in guide, number
    for phrase in (f"at most {P.MAX_REQUIREMENTS} requirements",
                   f"`matchLabels` entries (at most {P.MAX_MATCH_LABELS})",
                   f"`matchExpressions` (at most {P.MAX_MATCH_EXPRESSIONS})",
                   f"at most {P.MAX_VALUES} `values`",
                   f"prefix of at most {P.MAX_KEY_PREFIX_LENGTH} characters",
                   f"name of at most {P.MAX_KEY_NAME_LENGTH} characters",
                   f"`{P.REASON_NOT_PUBLISHED}`", f"`{P.REASON_CATALOG_FULL}`"):
        assert phrase in guide, phrase


def test_the_key_and_value_patterns_are_kubernetes_label_syntax() -> None:
    key, value = re.compile(P.LABEL_KEY_PATTERN), re.compile(P.LABEL_VALUE_PATTERN)
    for good in ("app", "app.kubernetes.io/name", "a", "A_b-c.d", "x" * 63,
                 "example.com/" + "n" * 63):
        assert key.match(good), good
    for bad in ("", "-a", "a-", "x" * 64, "a/b/c", "Example.com/a", "ex..com/a", "/a",
                "bad key", "a/"):
        assert not key.match(bad), bad
    for good in ("", "v", "a.b-c_D", "v" * 63):
        assert value.match(good), good
    for bad in ("-v", "v.", "bad value", "v/w"):
        assert not value.match(bad), bad


# --- what rank accepts, the catalog takes -------------------------------------------------

_PREFIXES = ("", "example.com/", "a.b-c.example/", "p" * 253 + "/")
_NAMES = ("k", "app", "a.b-c_D", "n" * 60)
_KEY = st.builds(lambda p, n, i: f"{p}{n}{i}", st.sampled_from(_PREFIXES),
                 st.sampled_from(_NAMES), st.integers(0, 99))
_VALUE = st.sampled_from(("", "a", "web", "a.b-c_D", "x" * 58))


def _values(base: str, n: int) -> list[str]:
    """``n`` label values from one drawn (drawing 64 each is too slow for a unit test)."""
    return [f"{base[:58]}v{j}" for j in range(n)]


@st.composite
def _policy(draw: st.DrawFn, ns: str, n: int) -> dict[str, Any]:
    labels = draw(st.dictionaries(_KEY, _VALUE, max_size=6))
    exprs = [{"key": draw(_KEY), "operator": op,
              "values": _values(draw(_VALUE), draw(st.integers(1, P.MAX_VALUES)))
              if op in ("In", "NotIn") else []}
             for op in draw(st.lists(st.sampled_from(P.OPERATORS),
                                     max_size=P.MAX_MATCH_EXPRESSIONS))]
    spec: dict[str, Any] = {"priority": draw(st.integers(P.MIN_PRIORITY, P.MAX_PRIORITY)),
                            "podSelector": {"matchLabels": labels, "matchExpressions": exprs}}
    if draw(st.booleans()):
        spec["allowedArchitectures"] = draw(st.lists(st.sampled_from(ARCHITECTURES),
                                                     min_size=1, unique=True))
    return {"metadata": {"namespace": ns, "name": f"p{n}-" + "n" * draw(st.integers(0, 58)),
                         "creationTimestamp": f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z"},
            "spec": spec}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(st.data())
def test_what_rank_accepts_is_a_spec_policies_the_catalog_takes(data: st.DataObject) -> None:
    objects = [data.draw(_policy(f"ns{i % 5}", i)) for i in range(data.draw(st.integers(1, 40)))]
    ranking = P.rank(objects)
    published = P.params_policies(ranking)
    jsonschema.validate(published, CATALOG_POLICIES)
    assert len(orjson.dumps(published)) <= P.POLICIES_MAX_BYTES
    for ns, group in published.items():
        assert len(orjson.dumps({ns: group})) - 2 <= P.NAMESPACE_MAX_BYTES
    accepted = {p.key for p in ranking.all()}
    assert accepted.isdisjoint(ranking.rejected)
    assert len(accepted) + len(ranking.rejected) == len({
        f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in objects})
