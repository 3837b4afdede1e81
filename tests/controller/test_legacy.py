"""rules.legacy: what release 0.1.0 left is recognised (its binding's paramRef, its
params CRD), and the status built from what is in force never says the policy is not in
force while a binding of it may be there (controller.lifecycle)."""

from __future__ import annotations

from typing import Any

from podplacement.controller.lifecycle import (
    POLICY_ABSENT,
    POLICY_AS_LEFT,
    POLICY_IN_FORCE,
    available_conditions,
    retired_crd_path,
    retired_object_path,
)
from podplacement.rules.admit import admissionpolicy
from podplacement.rules.admit.webhookconfig import webhook_namespace_selection
from podplacement.rules.config import PARAMS_NAME, PARAMS_PLURAL
from podplacement.rules.legacy import (
    IMAGE_PLATFORMS_0_1,
    RETIRED_CRDS,
    reads_other_params,
    retire_now,
    retirement_rights,
    rolling_upgrade_rights,
)

NS = "podplacement-system"


def _ours() -> dict[str, Any]:
    config = {"metadata": {"name": "cluster"}, "spec": {}}
    return admissionpolicy.desired_binding(webhook_namespace_selection(config, NS),
                                           params_namespace=NS)


def _binding(param_ref: dict[str, Any] | None) -> dict[str, Any]:
    binding = _ours()
    if param_ref is None:
        binding["spec"].pop("paramRef")
    else:
        binding["spec"]["paramRef"] = param_ref
    return binding


def test_release_0_1_bindings_read_other_params_and_ours_does_not() -> None:
    ours = _ours()
    assert not reads_other_params(ours, ours)
    # 0.1.0's place variant: the cluster-scoped ImagePlatforms "cluster", no namespace
    assert reads_other_params(_binding({"name": PARAMS_NAME,
                                        "parameterNotFoundAction": "Allow"}), ours)
    # 0.1.0's gate-only variant: no paramRef at all
    assert reads_other_params(_binding(None), ours)
    # another namespace or name
    assert reads_other_params(_binding({"name": PARAMS_NAME, "namespace": "elsewhere"}), ours)
    assert reads_other_params(_binding({"name": "other", "namespace": NS}), ours)
    # a selector edited by hand is drift, reverted in place, not a foreign paramRef
    edited = _ours()
    edited["spec"]["matchResources"]["namespaceSelector"] = {}
    assert not reads_other_params(edited, ours)


def test_the_retired_params_crd_is_0_1_s_and_replaced_by_ours() -> None:
    assert RETIRED_CRDS == (IMAGE_PLATFORMS_0_1,)
    assert IMAGE_PLATFORMS_0_1.name == "imageplatforms.podplacement.io"
    assert IMAGE_PLATFORMS_0_1.replaced_by == f"{PARAMS_PLURAL}.podplacement.io"
    assert IMAGE_PLATFORMS_0_1.replaced_by != IMAGE_PLATFORMS_0_1.name
    assert retired_crd_path(IMAGE_PLATFORMS_0_1) == (
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/imageplatforms.podplacement.io")
    # cluster-scoped: no namespace in the path, whatever the product's namespace
    assert retired_object_path(IMAGE_PLATFORMS_0_1, "cluster", NS) == (
        "/apis/podplacement.io/v1beta1/imageplatforms/cluster")
    assert retirement_rights(IMAGE_PLATFORMS_0_1) == [
        ("apiextensions.k8s.io", "customresourcedefinitions", "get",
         "imageplatforms.podplacement.io"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "get",
         "imageplatformcatalogs.podplacement.io"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "delete",
         "imageplatforms.podplacement.io"),
        ("podplacement.io", "imageplatforms", "delete", "cluster"),
    ]
    assert ("podplacement.io", "imageplatforms", "update", "cluster") in (
        rolling_upgrade_rights(IMAGE_PLATFORMS_0_1))


def test_the_status_says_the_policy_may_be_in_force_when_its_binding_may_be_there() -> None:
    def available(policy: str) -> str:
        (cond,) = [c for c in available_conditions(policy, []) if c.type == "Available"]
        return cond.message

    assert "not in force" in available(POLICY_ABSENT)
    assert "not in force" not in available(POLICY_IN_FORCE)
    left = available(POLICY_AS_LEFT)
    assert "not in force" not in left
    assert "may also gate or place them as it was last written" in left


def _crd(name: str, created: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}}


def test_a_retired_crd_goes_after_an_upgrade_and_stays_during_a_rollback() -> None:
    old = IMAGE_PLATFORMS_0_1.name
    ours = IMAGE_PLATFORMS_0_1.replaced_by
    # upgrade: 0.1.0's CRD from months ago, ours from today's kubectl apply
    assert retire_now(_crd(old, "2026-06-01T10:00:00Z"), _crd(ours, "2026-11-27T16:00:00Z")
                      ) == ""
    # rollback: 0.1.0's kubectl apply created it again after ours
    kept = retire_now(_crd(old, "2026-11-28T09:00:01Z"), _crd(ours, "2026-11-27T16:00:00Z"))
    assert kept.startswith(f"{old} kept") and "rollback" in kept
    assert f"kubectl delete crd {old}" in kept
    # same second, or no replacement at all: kept
    assert retire_now(_crd(old, "2026-11-27T16:00:00Z"), _crd(ours, "2026-11-27T16:00:00Z"))
    assert "not installed" in retire_now(_crd(old, "2026-06-01T10:00:00Z"), None)
