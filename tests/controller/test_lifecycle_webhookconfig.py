"""rules.admit.webhookconfig (pure): the MutatingWebhookConfiguration the controller owns,
the opt-out namespaceSelector negation and drift detection; controller.lifecycle's condition
merge."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
from typing import Any

import pytest

from podplacement.controller.lifecycle import ConditionSpec, merge_conditions
from podplacement.rules.admit.webhookconfig import (
    CERT_MANAGER_INJECT_ANNOTATION,
    NAMESPACE_NAME_LABEL,
    ServiceRef,
    desired_webhook_configuration,
    negate_selector,
    webhook_drifted,
    webhook_namespace_selection,
)
from podplacement.rules.config import (
    EXCLUDE_NAMESPACE_LABEL,
    WEBHOOK_CONFIGURATION_NAME,
    WEBHOOK_NAME,
)
from podplacement.rules.ownership import namespace_owner
from tests.harness.reference import REFERENCE as _REFERENCE_DIR

REFERENCE = _REFERENCE_DIR / "admission-webhook-configuration.json"
OWN_NS = "podplacement-system"


def _config(selector: Any = None, uid: str | None = "u-1") -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if selector is not None:
        spec["namespaceSelector"] = selector
    meta: dict[str, Any] = {"name": "cluster"}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
            "metadata": meta, "spec": spec}


def _desired(selector: Any = None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("ca_bundle", b"-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n")
    if "url" not in kw:
        kw.setdefault("service", ServiceRef(OWN_NS, "podplacement-webhook"))
    kw.setdefault("owner", namespace_owner({"metadata": {"name": OWN_NS, "uid": "ns-1"}}))
    return desired_webhook_configuration(_config(selector), own_namespace=OWN_NS, **kw)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"matchLabels": {"team": "a"}}, {"key": "team", "operator": "NotIn", "values": ["a"]}),
        ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["b", "a", "b"]}]},
         {"key": "t", "operator": "NotIn", "values": ["a", "b"]}),
        ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["x"]}]},
         {"key": "t", "operator": "In", "values": ["x"]}),
        ({"matchExpressions": [{"key": "t", "operator": "Exists"}]},
         {"key": "t", "operator": "DoesNotExist"}),
        ({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]},
         {"key": "t", "operator": "Exists"}),
    ],
)
def test_single_requirement_is_negated_exactly(selector: dict[str, Any],
                                               expected: dict[str, Any]) -> None:
    negated, problem = negate_selector(selector)
    assert problem == ""
    assert negated == [expected]
    selection = webhook_namespace_selection(_config(selector), OWN_NS)
    assert selection.exact
    assert expected in selection.selector["matchExpressions"]


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {"a": "1", "b": "2"}},
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "t", "operator": "In"}]},
        {"matchExpressions": [{"key": "t", "operator": "Exists", "values": ["x"]}]},
        {"matchExpressions": [{"key": "t", "operator": "Like", "values": ["x"]}]},
        {"matchLabels": ["not", "a", "map"]},
    ],
)
def test_inexpressible_selector_keeps_the_webhook_broad_and_says_so(selector: Any) -> None:
    selection = webhook_namespace_selection(_config(selector), OWN_NS)
    assert not selection.exact and selection.reason
    keys = [e["key"] for e in selection.selector["matchExpressions"]]
    assert keys == [EXCLUDE_NAMESPACE_LABEL, NAMESPACE_NAME_LABEL]


@pytest.mark.parametrize("selector", [None, {}, {"matchLabels": {}, "matchExpressions": []}])
def test_empty_selector_excludes_nothing_beyond_the_fixed_rules(selector: Any) -> None:
    selection = webhook_namespace_selection(_config(selector), OWN_NS)
    assert selection.exact
    assert selection.selector == {"matchExpressions": [
        {"key": EXCLUDE_NAMESPACE_LABEL, "operator": "DoesNotExist"},
        {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn",
         "values": ["kube-node-lease", "kube-public", "kube-system", OWN_NS]},
    ]}


def test_recorded_opt_out_selector_is_not_duplicated() -> None:
    # the recording's sample: exclude namespaces that carry the opt-out label (= fixed rule)
    selector = {"matchExpressions": [{"key": EXCLUDE_NAMESPACE_LABEL, "operator": "Exists"}]}
    exprs = webhook_namespace_selection(_config(selector), OWN_NS).selector["matchExpressions"]
    assert exprs.count({"key": EXCLUDE_NAMESPACE_LABEL, "operator": "DoesNotExist"}) == 1
    assert len(exprs) == 2


def test_desired_configuration_shape() -> None:
    mwc = _desired({"matchLabels": {"team": "a"}})
    assert mwc["metadata"]["name"] == WEBHOOK_CONFIGURATION_NAME
    # owned by the product's Namespace: the garbage collector deletes it with the namespace
    assert mwc["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Namespace", "name": OWN_NS, "uid": "ns-1"}]
    (hook,) = mwc["webhooks"]
    assert hook["name"] == WEBHOOK_NAME
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["matchPolicy"] == "Equivalent" and hook["reinvocationPolicy"] == "Never"
    assert hook["objectSelector"] == {}
    (rule,) = hook["rules"]
    assert (rule["operations"], rule["apiGroups"], rule["apiVersions"], rule["resources"]) == (
        ["CREATE"], [""], ["v1"], ["pods"])
    assert hook["clientConfig"]["service"] == {
        "namespace": OWN_NS, "name": "podplacement-webhook", "path": "/mutate", "port": 443}
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN")
    assert {"key": "team", "operator": "NotIn", "values": ["a"]} in (
        hook["namespaceSelector"]["matchExpressions"])


def test_url_client_config_and_cert_manager_mode() -> None:
    mwc = _desired(url="https://127.0.0.1:9443/mutate", ca_bundle=None,
                   cert_manager_certificate=f"{OWN_NS}/podplacement-webhook")
    (hook,) = mwc["webhooks"]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate"}
    assert mwc["metadata"]["annotations"] == {
        CERT_MANAGER_INJECT_ANNOTATION: f"{OWN_NS}/podplacement-webhook"}


@pytest.mark.parametrize("kw", [{"url": "https://x", "service": ("a", "b", 443, "/m")},
                                {"timeout_seconds": 31}, {"timeout_seconds": 0}])
def test_bad_arguments_are_rejected(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        desired_webhook_configuration(_config(), ca_bundle=b"x", own_namespace=OWN_NS,
                                      **({"url": "https://x"} | kw))
    with pytest.raises(ValueError):
        desired_webhook_configuration(_config(), ca_bundle=b"x", own_namespace=OWN_NS)


def _as_server_returns(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server gives back: metadata filled in, defaults present (and where we
    sent a field equal to the default, it is kept), a foreign label/annotation added."""
    live = copy.deepcopy(desired)
    live["metadata"].update({"uid": "x", "resourceVersion": "7", "generation": 1,
                             "creationTimestamp": "2026-11-22T05:47:48Z",
                             "managedFields": [{"manager": "podplacement"}]})
    live["metadata"]["labels"]["someone.else/label"] = "x"
    live["metadata"].setdefault("annotations", {})["note"] = "y"
    for hook in live["webhooks"]:
        hook.pop("objectSelector")  # a default: the server would fill in {}
        hook.pop("matchPolicy")
    return live


def test_server_defaults_and_foreign_metadata_are_not_drift() -> None:
    desired = _desired({"matchLabels": {"team": "a"}})
    assert not webhook_drifted(_as_server_returns(desired), desired)


def test_recorded_server_defaults_are_not_drift() -> None:
    """The request sent to the real API server vs. the object it stored."""
    data = json.loads(REFERENCE.read_text())
    exchange = data["exchanges"][0]
    sent, stored = exchange["request"]["body"], exchange["response"]["body"]
    sent_hooks = {w["name"]: w for w in sent["webhooks"]}
    for hook in stored["webhooks"]:  # the recording elides repeated caBundles
        sent_hook = sent_hooks[hook["name"]]
        hook["clientConfig"]["caBundle"] = sent_hook["clientConfig"]["caBundle"]
    stored["webhooks"] = [w for w in stored["webhooks"] if w["name"] in sent_hooks]
    assert not webhook_drifted(stored, sent)
    stored["webhooks"][0]["failurePolicy"] = "Ignore"
    assert webhook_drifted(stored, sent)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda h, m: h.__setitem__("failurePolicy", "Fail"),
        lambda h, m: h.__setitem__("timeoutSeconds", 30),
        lambda h, m: h["clientConfig"].__setitem__("caBundle", "Zm9v"),
        lambda h, m: h["clientConfig"]["service"].__setitem__("port", 8443),
        lambda h, m: h["namespaceSelector"]["matchExpressions"].pop(),
        lambda h, m: h["rules"][0]["operations"].append("UPDATE"),
        lambda h, m: h.__setitem__("matchConditions", [{"name": "x", "expression": "true"}]),
        lambda h, m: m["labels"].pop("app.kubernetes.io/managed-by"),
        lambda h, m: m.pop("ownerReferences"),
    ],
)
def test_changes_to_owned_fields_are_drift(mutate: Any) -> None:
    desired = _desired()
    live = _as_server_returns(desired)
    mutate(live["webhooks"][0], live["metadata"])
    assert webhook_drifted(live, desired)


def test_extra_or_missing_webhook_entry_is_drift() -> None:
    desired = _desired()
    live = _as_server_returns(desired)
    live["webhooks"].append(dict(live["webhooks"][0], name="other.example.com"))
    assert webhook_drifted(live, desired)
    live["webhooks"] = []
    assert webhook_drifted(live, desired)


def test_cert_manager_owns_the_ca_bundle() -> None:
    desired = _desired(ca_bundle=None, cert_manager_certificate=f"{OWN_NS}/c")
    live = _as_server_returns(desired)
    live["webhooks"][0]["clientConfig"]["caBundle"] = "aW5qZWN0ZWQ="
    assert not webhook_drifted(live, desired)
    live["metadata"]["annotations"].pop(CERT_MANAGER_INJECT_ANNOTATION)
    assert webhook_drifted(live, desired)


# --- conditions -------------------------------------------------------------------------------
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(hours=1)


def test_condition_transition_time_moves_only_on_status_change() -> None:
    first = merge_conditions([], [ConditionSpec("Available", "True", "AsExpected"),
                                  ConditionSpec("Degraded", "False", "AsExpected")],
                             generation=1, now=T0)
    assert [c["type"] for c in first] == ["Available", "Degraded"]
    assert all(c["lastTransitionTime"] == "2026-01-01T00:00:00Z" for c in first)
    second = merge_conditions(first, [ConditionSpec("Available", "True", "Other", "m"),
                                      ConditionSpec("Degraded", "True", "InvalidConfig", "bad")],
                              generation=2, now=T1)
    by_type = {c["type"]: c for c in second}
    assert by_type["Available"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert by_type["Available"]["reason"] == "Other"
    assert by_type["Degraded"]["lastTransitionTime"] == "2026-01-01T01:00:00Z"
    assert {c["observedGeneration"] for c in second} == {2}


def test_unknown_condition_types_are_kept_after_ours() -> None:
    existing = [{"type": "Custom", "status": "True", "reason": "X", "message": "",
                 "lastTransitionTime": "2025-01-01T00:00:00Z"}]
    out = merge_conditions(existing, [ConditionSpec("Progressing", "False", "AsExpected")],
                           generation=1, now=T0)
    assert [c["type"] for c in out] == ["Progressing", "Custom"]
    assert out[1] == existing[0]
