"""The rule for tolerations of architecture taints (:mod:`rules.tolerations`) and how the
placement writes them (the decision, the controller's PATCH, the webhook's admission patch).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from podplacement.imageinspect import ImageInfo, Platform
from podplacement.rules.config import (
    DECISION_ANNOTATION,
    SCHEDULING_GATE,
    ConfigError,
    PlacementConfig,
)
from podplacement.rules.nodeview import node_view
from podplacement.rules.place.admission import admission_placement
from podplacement.rules.place.decision import decide, fallback_ungate
from podplacement.rules.place.placement import PlacementInputs
from podplacement.rules.place.plan import plan
from podplacement.rules.tolerations import (
    ArchitectureTaints,
    ArchTaint,
    arch_tolerations,
    node_arch_taints,
    tolerates,
)

INDEX = "application/vnd.oci.image.index.v1+json"
MULTI = ImageInfo("r.test/multi:1", "sha256:" + "a" * 64, INDEX,
                  (Platform("linux", "amd64"), Platform("linux", "arm64")))
AMD = ImageInfo("r.test/amd:1", "sha256:" + "b" * 64, INDEX, (Platform("linux", "amd64"),))
ARM = ImageInfo("r.test/arm:1", "sha256:" + "c" * 64, INDEX, (Platform("linux", "arm64"),))
ARM_TAINT = ArchTaint("arm64", "NoSchedule")
ARM_TOLERATION = {"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64",
                  "effect": "NoSchedule"}


def node(name: str, arch: str, *taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1",
                         "labels": {"kubernetes.io/arch": arch, "kubernetes.io/os": "linux"}},
            "spec": {"taints": list(taints)}}


def arch_taint(value: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": "kubernetes.io/arch", "value": value, "effect": effect}


NODES = [node("a1", "amd64"),
         node("r1", "arm64", arch_taint("arm64"),
              {"key": "dedicated", "value": "ci", "effect": "NoSchedule"}),
         node("z1", "s390x", arch_taint("s390x", "NoExecute"))]


def gated(image: str, tolerations: list[dict[str, Any]] | None = None,
          **spec: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": image}],
                 "schedulingGates": [{"name": SCHEDULING_GATE}], **spec}}
    if tolerations is not None:
        pod["spec"]["tolerations"] = tolerations
    return pod


# --- the matching rule (k8s.io/api core/v1 Toleration.ToleratesTaint) ---------------


@pytest.mark.parametrize(("toleration", "expected"), [
    (ARM_TOLERATION, True),
    ({"key": "kubernetes.io/arch", "value": "arm64"}, True),  # no effect: all effects
    ({"key": "kubernetes.io/arch", "operator": "Exists"}, True),  # any value
    ({"operator": "Exists"}, True),  # empty key + Exists: every taint
    ({"operator": "Exists", "effect": "NoExecute"}, False),  # another effect
    ({"key": "kubernetes.io/arch", "value": "amd64"}, False),  # another value
    ({"key": "dedicated", "operator": "Exists"}, False),  # another key
    ({"key": "kubernetes.io/arch", "operator": "Gt", "value": "arm64"}, False),  # unknown op
    ({"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64",
      "effect": "PreferNoSchedule"}, False),
])
def test_tolerates_follows_kubernetes(toleration: dict[str, Any], expected: bool) -> None:
    assert tolerates(toleration, ARM_TAINT) is expected


def test_tolerations_added_only_for_admitted_architectures_and_arch_taints() -> None:
    taints = node_arch_taints(NODES)
    assert taints == (ArchTaint("arm64", "NoSchedule"), ArchTaint("s390x", "NoExecute"))
    pod = gated(MULTI.reference)
    assert arch_tolerations(("amd64", "arm64"), pod, taints) == (ARM_TOLERATION,)
    assert arch_tolerations(("amd64",), pod, taints) == ()
    assert arch_tolerations((), pod, taints) == ()
    # the pod's own toleration (any form that tolerates the taint) means none is added
    for own in ([ARM_TOLERATION], [{"operator": "Exists"}],
                [{"key": "kubernetes.io/arch", "operator": "Exists"}]):
        assert arch_tolerations(("arm64",), gated(ARM.reference, own), taints) == ()
    # one for another effect still adds ours
    other = [{"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoExecute"}]
    assert arch_tolerations(("arm64",), gated(ARM.reference, other), taints) == \
        (ARM_TOLERATION,)


def test_node_view_keeps_only_arch_taints() -> None:
    view = node_view(NODES[1])
    assert view["spec"] == {"taints": [arch_taint("arm64")]}
    assert "spec" not in node_view(node("a2", "amd64", {"key": "x", "effect": "NoSchedule"}))
    assert node_arch_taints([node("odd", "arm64", {"key": "kubernetes.io/arch",
                                                   "value": "../x", "effect": "NoSchedule"},
                                  {"key": "kubernetes.io/arch", "value": "arm64",
                                   "effect": "Evict"})]) == ()


# --- the config ---------------------------------------------------------------------


def test_config_switch_and_configured_taints() -> None:
    assert PlacementConfig().architecture_taints == ArchitectureTaints()
    cfg = PlacementConfig.from_object({"spec": {"architectureTaints": {
        "taints": [{"value": "ppc64le", "effect": "NoSchedule"}]}},
        "status": {"architectureTaints": {"observed": [
            {"value": "arm64", "effect": "NoSchedule"}, {"value": "bad value"}]}}})
    taints = cfg.architecture_taints
    assert taints.tolerate
    assert taints.known() == (ArchTaint("arm64", "NoSchedule"),
                              ArchTaint("ppc64le", "NoSchedule"))
    # the controller's own view of the Nodes replaces the published one
    assert taints.known(()) == (ArchTaint("ppc64le", "NoSchedule"),)
    off = PlacementConfig.from_object({"spec": {"architectureTaints": {"tolerate": "Disabled",
        "taints": [{"value": "arm64", "effect": "NoSchedule"}]}}})
    assert off.architecture_taints.known(node_arch_taints(NODES)) == ()
    for bad in ({"tolerate": "yes"}, {"taints": [{"value": "arm64"}]},
                {"taints": "arm64"}, {"taints": [{"value": "a/b", "effect": "NoSchedule"}]}):
        with pytest.raises(ConfigError, match="architectureTaints"):
            PlacementConfig.from_object({"spec": {"architectureTaints": bad}})


# --- the placement and its renderings -------------------------------------------------


def _decide(pod: dict[str, Any], images: dict[str, Any],
            config: PlacementConfig | None = None) -> Any:
    return plan(
        PlacementInputs(pod, images, config or PlacementConfig()),
        nodes=NODES, nrts={}, now=0,
    )


def test_multi_arch_pod_gets_the_arm64_toleration_in_its_patch() -> None:
    pod = gated(MULTI.reference)
    d = _decide(pod, {MULTI.reference: MULTI})
    assert d.tolerations == (ARM_TOLERATION,)
    assert {"op": "add", "path": "/spec/tolerations", "value": [ARM_TOLERATION]} in d.patch
    record = json.loads(d.annotation)
    assert record["tolerations"] == ["kubernetes.io/arch=arm64:NoSchedule"]
    # appended after the pod's own entries, which are kept
    own = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
            "effect": "NoExecute", "tolerationSeconds": 300}]
    d = _decide(gated(MULTI.reference, own), {MULTI.reference: MULTI})
    ops = [op for op in d.patch if op["path"].startswith("/spec/tolerations")]
    assert ops == [{"op": "add", "path": "/spec/tolerations/-", "value": ARM_TOLERATION}]


def test_amd64_pod_fallback_and_switch_get_none() -> None:
    d = _decide(gated(AMD.reference), {AMD.reference: AMD})
    assert d.tolerations == ()
    assert "tolerations" not in json.loads(d.annotation)
    assert not any(op["path"].startswith("/spec/tolerations") for op in d.patch)
    # the fallback: images unknown, no toleration whatever the fallback architecture
    cfg = PlacementConfig(fallback_architecture="arm64")
    assert fallback_ungate(gated(ARM.reference), "gave up", cfg).tolerations == ()
    failed = _decide(gated(ARM.reference), {ARM.reference: LookupError("x")},
                     PlacementConfig.from_object({"spec": {
                         "fallbackArchitecture": "arm64",
                         "imageInspection": {"maxRetries": 0}}}))
    assert failed.outcome == "fallback" and failed.tolerations == ()
    off = PlacementConfig.from_object({"spec": {"architectureTaints": {"tolerate": "Disabled"}}})
    assert _decide(gated(MULTI.reference), {MULTI.reference: MULTI}, off).tolerations == ()


def test_nodeselector_pin_limits_the_tolerations() -> None:
    pod = gated(MULTI.reference, nodeSelector={"kubernetes.io/arch": "amd64"})
    assert _decide(pod, {MULTI.reference: MULTI}).tolerations == ()
    pod = gated(MULTI.reference, nodeSelector={"kubernetes.io/arch": "arm64"})
    assert _decide(pod, {MULTI.reference: MULTI}).tolerations == (ARM_TOLERATION,)


def test_configured_taint_for_a_pool_without_nodes() -> None:
    cfg = PlacementConfig.from_object({"spec": {"architectureTaints": {
        "taints": [{"value": "arm64", "effect": "NoSchedule"}]}}})
    d = plan(
        PlacementInputs(gated(ARM.reference), {ARM.reference: ARM}, cfg),
        nodes=[node("a1", "amd64")], nrts={}, now=0,
    )
    assert d.tolerations == (ARM_TOLERATION,)


def test_webhook_patch_adds_the_same_tolerations() -> None:
    """The webhook has no Node view: it reads the taints the controller published in the
    config's status; with the same taints it writes what the controller writes."""
    cfg = PlacementConfig.from_object({"status": {"architectureTaints": {"observed": [
        {"value": "arm64", "effect": "NoSchedule"}]}}})
    pod = gated(MULTI.reference)
    controller = decide(PlacementInputs(pod, {MULTI.reference: MULTI}, cfg))
    webhook = admission_placement(pod, {MULTI.reference: MULTI}, cfg)
    assert webhook is not None
    ops = [op for op in webhook.patch if op["path"].startswith("/spec/tolerations")]
    assert ops == [{"op": "add", "path": "/spec/tolerations", "value": [ARM_TOLERATION]}]
    assert controller.tolerations == (ARM_TOLERATION,)
    assert json.loads(webhook.annotation)["tolerations"] == \
        json.loads(controller.annotation)["tolerations"]
    assert DECISION_ANNOTATION


def test_explain_says_which_tolerations_are_added() -> None:
    from podplacement.rules.monitor.explain import explain, render_table

    report = explain(gated(MULTI.reference), NODES, {}, {MULTI.reference: MULTI},
                     PlacementConfig(), now=0)
    assert report["tolerations"] == ["kubernetes.io/arch=arm64:NoSchedule"]
    assert "Tolerations added: kubernetes.io/arch=arm64:NoSchedule" in render_table(report)
    report = explain(gated(AMD.reference), NODES, {}, {AMD.reference: AMD},
                     PlacementConfig(), now=0)
    assert report["tolerations"] == []
    assert "Tolerations added" not in render_table(report)


def test_a_decision_taken_at_admission_with_tolerations_is_reproduced() -> None:
    """The controller reproduces an admission decision (its Warning Events, the escape
    monitor's doubt) from the pod as stored: the tolerations the placement appended are
    taken off first, else the reproduced record (without them) would never match."""
    from podplacement.rules.monitor.admitted import _admission_placement
    from podplacement.rules.monitor.explain import apply_patch

    cfg = PlacementConfig.from_object({"spec": {"architectureTaints": {
        "taints": [{"value": "arm64", "effect": "NoSchedule"}]}}})
    own = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
            "effect": "NoExecute", "tolerationSeconds": 300}]
    pod = gated(MULTI.reference, own, nodeSelector={"disktype": "ssd"})
    del pod["spec"]["schedulingGates"]
    placed = admission_placement(pod, {MULTI.reference: MULTI}, cfg)
    assert placed is not None
    stored = apply_patch(pod, placed.patch)
    assert stored["spec"]["tolerations"] == [*own, ARM_TOLERATION]
    record = json.loads(stored["metadata"]["annotations"][DECISION_ANNOTATION])
    again = _admission_placement(stored, record, cfg, catalog=lambda _image: None)
    assert again is not None, "the decision was not reproduced"
    assert again.tolerations == (ARM_TOLERATION,)
