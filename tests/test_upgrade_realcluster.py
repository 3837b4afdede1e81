"""The upgrade in place from the previous release (releases.toml: 0.1.0, commit 7089712) to
this checkout on the real control plane, with pods created all along (docs/guide/upgrade.md;
tests/harness/upgrade.py has the steps).

Release 0.1.0 runs from its own source tree (``git archive`` of its commit, its own
``PYTHONPATH``), installed as its README said, with its admission policy placing pods from its
cluster-scoped ``ImagePlatforms cluster``, and its config changed by the operator. Then the
documented upgrade: ``kubectl apply -k deploy/`` (it must succeed), the new processes in a
rolling update's order. Shown: no pod placed on a node its image can't run, none escaped,
none left gated; the config's status never said the policy was not in force while 0.1.0's
binding was there; nothing of 0.1.0 left (its params CRD and object, a policy or binding
reading them); the operator's config unchanged; no RBAC denial in the new processes' logs;
and a namespace's new PodPlacementPolicy applies at once.

Then the rollback to the previous release, as docs/guide/upgrade.md, "Roll back to 0.1.0" says: its
``deploy/`` without its sample config applied over this release, its processes in a rolling
update's order, pods created all along; then the clean-up of docs/guide/upgrade.md. Shown: no
wrong, escaped or stranded pod; its policy in force again with its own cluster-scoped catalog (this
release's controller, still leading under the previous release's RBAC, did not delete the
CRD that apply created again); the operator's config unchanged (the fields that release
knows); after the clean-up nothing of this release is left that would hold an uninstall.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from podplacement.controller.lifecycle import BINDING_PATH, CONFIG_PATH
from podplacement.controller.paramswriter import params_path
from podplacement.rules.config import ADMISSION_POLICY_NAME, DECISION_ANNOTATION
from podplacement.sandbox.product import NAMESPACE, kubectl, start_product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import NO_STAND_DOWN, real_cluster
from tests.harness.registry import Registry
from tests.harness.upgrade import (
    OLD_PARAMS,
    OLD_PARAMS_CRD,
    PodFlow,
    get_or_none,
    install_as_documented,
    leftovers,
    outcome,
    pod,
    previous_release,
    previous_release_in_force,
    previous_release_tree,
    products_to_stop,
    roll,
    rollback_manifests,
    upgrade_in_place,
    wait_until,
)

pytestmark = pytest.mark.realcluster

#: The image's platforms: the fake nodes also have ppc64le, s390x and windows/amd64.
PLATFORMS = {("linux", "amd64"), ("linux", "arm64")}
#: Pods created before, during and after the upgrade (one every FLOW_INTERVAL s).
FLOW_LIMIT = 80
FLOW_INTERVAL = 0.4
#: Seconds the old release runs on under the new manifests before the new processes start
#: (a rolling update's image pull): longer than 0.1.0's lifecycle resync (10 s), so its
#: controller reconciles once under 0.2.0's RBAC and writes its status.
ROLLOUT_DELAY = 11.0


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return previous_release_tree(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, old_tree: Path) -> Iterator[KubeEnv]:
    # no CRDs of this checkout: the cluster runs the previous release first
    yield from real_cluster(tmp_path_factory, "upgrade", crds=False)


@pytest.fixture(scope="module")
def state() -> Iterator[dict[str, Any]]:
    """What the upgrade test leaves for the rollback test; every product in it is stopped
    at the end of the module."""
    yield from products_to_stop()


def _platforms_of(cluster: KubeEnv, ns: str, name: str) -> Any:
    p = cluster.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return p if p["spec"].get("nodeName") else None


def test_upgrade_from_the_previous_release_with_pods_flowing(
        cluster: KubeEnv, old_tree: Path, registry: Registry, make_pusher: Any,
        tmp_path: Path, state: dict[str, Any]) -> None:
    plane = cluster.plane
    assert plane is not None
    make_pusher(registry).multiarch("upgrade/multi", "v1", ["linux/amd64", "linux/arm64"])
    image = f"{registry.host}/upgrade/multi:v1"
    options = ["--insecure-registry", registry.host]

    # --- release 0.1.0 as it ran: installed by its README, its processes from its tree ---
    version = subprocess.run([sys.executable, "-m", "podplacement", "--version"], cwd=old_tree,
                             env={**os.environ, "PYTHONPATH": str(old_tree)},
                             capture_output=True, text=True, timeout=60, check=False)
    assert version.stdout.strip() == f"podplacement {previous_release()['version']}", (
        version.stdout, version.stderr[-2000:])
    install_as_documented(plane, old_tree / "deploy")
    old = start_product(plane, tmp_path / "old", controller_options=options,
                        env={"PYTHONPATH": str(old_tree)}, cwd=old_tree)
    state["products"].append(old)
    # the operator's own settings
    cluster.patch(CONFIG_PATH, {"spec": {"plugins": {"nodeAffinityScoring": {
        "enabled": False}}, "imageInspection": {"maxRetries": 7}}})
    operator_spec = cluster.get(CONFIG_PATH)["spec"]
    generation = cluster.get(CONFIG_PATH)["metadata"]["generation"]
    ns = f"up-{int(time.time()) % 100000}"
    cluster.ensure_namespace(ns)
    # 0.1.0's catalog learns the image, so its policy places the next pods itself
    cluster.create(f"/api/v1/namespaces/{ns}/pods", pod("warm", image))
    wait_until(lambda: _platforms_of(cluster, ns, "warm"), 60)
    wait_until(lambda: image in ((get_or_none(plane, OLD_PARAMS) or {}).get("spec") or {})
               .get("images", {}), 30)
    binding = cluster.get(BINDING_PATH)
    assert not binding["spec"]["paramRef"].get("namespace"), binding["spec"]  # 0.1.0's

    # --- the upgrade, pods created all along ---
    flow = PodFlow(plane, ns, image, FLOW_INTERVAL, FLOW_LIMIT).start()
    time.sleep(2)  # some pods before the upgrade
    try:
        new, timing = upgrade_in_place(plane, old, tmp_path / "new",
                                       [*options, *NO_STAND_DOWN], options,
                                       rollout_delay=ROLLOUT_DELAY)
        state["products"].append(new)
        time.sleep(2)  # and some after it
    finally:
        flow.stop()
    result = outcome(plane, ns, PLATFORMS)
    phases = [t - timing.started for t in flow.times]
    during = sum(1 for t in phases if 0 <= t <= timing.complete)
    after = sum(1 for t in phases if t > timing.complete)
    summary = (f"upgrade: applied {timing.applied:.1f} s, new controller leading "
               f"{timing.new_leads:.1f} s, nothing of 0.1.0 left {timing.complete:.1f} s; "
               f"{len(flow.created)} pods created ({len(phases) - during - after} before, "
               f"{during} during, {after} after), {result.bound} bound, paths "
               f"{dict(result.paths)}, wrong {len(result.wrong)}, escaped "
               f"{len(result.escaped)}, stranded {len(result.stranded)}")
    print(summary)
    assert flow.failures == []
    assert during >= 20 and after >= 1, summary
    assert result.wrong == [], summary
    assert result.escaped == [], summary
    assert result.stranded == [], summary
    assert result.bound == len(flow.created) + 1, summary
    assert flow.violations == []
    assert leftovers(plane) == []
    assert get_or_none(plane, OLD_PARAMS_CRD) is None

    # the operator's config: every field they set as it was (0.2.0's CRD adds defaults)
    config = cluster.get(CONFIG_PATH)
    assert config["metadata"]["generation"] == generation
    assert _covers(config["spec"], operator_spec), (config["spec"], operator_spec)
    assert config["spec"]["plugins"]["nodeAffinityScoring"]["enabled"] is False
    conditions = {c["type"]: c for c in config["status"]["conditions"]}
    assert conditions["Available"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "False", conditions["Degraded"]
    assert config["status"]["admission"]["mechanism"] == "MutatingAdmissionPolicy"

    # a namespace's new placement policy applies at once (0.1.0's frozen catalog ignored
    # it): arm64 only, on every path
    cluster.create(f"/apis/podplacement.io/v1beta1/namespaces/{ns}/podplacementpolicies",
                   {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
                    "metadata": {"name": "arm-only"},
                    "spec": {"priority": 10, "allowedArchitectures": ["arm64"]}})
    wait_until(lambda: _accepted(cluster, ns, "arm-only"), 30)
    # in force in the API server once the params object holds it (written at once)
    wait_until(lambda: "arm-only" in json.dumps(
        ((cluster.get(params_path(NAMESPACE)).get("spec") or {}).get("policies") or {})
        .get(ns) or []), 10)
    for i in range(6):
        cluster.create(f"/api/v1/namespaces/{ns}/pods", pod(f"after-{i}", image))
    for i in range(6):
        bound = wait_until(partial(_platforms_of, cluster, ns, f"after-{i}"), 60)
        node = cluster.get(f"/api/v1/nodes/{bound['spec']['nodeName']}")
        assert node["metadata"]["labels"]["kubernetes.io/arch"] == "arm64", i
        assert DECISION_ANNOTATION in bound["metadata"]["annotations"]
    assert new.forbidden() == [], "RBAC denials in the new processes' logs"
    state.update(new=new, image=image, options=options, operator_spec=operator_spec)


def test_rollback_to_the_previous_release_with_pods_flowing(
        cluster: KubeEnv, old_tree: Path, tmp_path: Path, state: dict[str, Any]) -> None:
    """docs/guide/upgrade.md, "Roll back to 0.1.0", step by step, over the upgraded cluster."""
    plane = cluster.plane
    assert plane is not None
    if "new" not in state:
        pytest.skip("the upgrade test did not complete")
    image, options = state["image"], state["options"]
    generation = cluster.get(CONFIG_PATH)["metadata"]["generation"]
    ns = f"down-{int(time.time()) % 100000}"
    cluster.ensure_namespace(ns)
    # 1-2: the previous release's deploy/ without its sample config, applied; its processes
    deploy = rollback_manifests(old_tree, tmp_path / "manifests")
    flow = PodFlow(plane, ns, image, FLOW_INTERVAL, FLOW_LIMIT).start()
    time.sleep(2)
    try:
        old, timing = roll(plane, state["new"], deploy, tmp_path / "old",
                           controller_options=options, webhook_options=options,
                           missing=list, rollout_delay=ROLLOUT_DELAY,
                           env={"PYTHONPATH": str(old_tree)}, cwd=old_tree,
                           identity="rollback-old-0")
        state["products"].append(old)
        # 0.1.0 keeps this release's binding (its drift check ignores the paramRef's extra
        # namespace), with which the API server skips its policy: step 3 of docs/guide/upgrade.md
        assert previous_release_in_force(plane) == [
            f"binding {ADMISSION_POLICY_NAME} paramRef {{'name': 'cluster', 'namespace': "
            f"'{NAMESPACE}', 'parameterNotFoundAction': 'Allow'}}"]
        kubectl(plane, "delete", "mutatingadmissionpolicybinding", ADMISSION_POLICY_NAME)
        wait_until(lambda: not previous_release_in_force(plane), 30)
        in_force = time.monotonic() - timing.started
        time.sleep(2)
    finally:
        flow.stop()
    result = outcome(plane, ns, PLATFORMS)
    summary = (f"rollback: applied {timing.applied:.1f} s, 0.1.0 leading "
               f"{timing.new_leads:.1f} s, its policy in force {in_force:.1f} s; "
               f"{len(flow.created)} pods created, {result.bound} bound, paths "
               f"{dict(result.paths)}, wrong {len(result.wrong)}, escaped "
               f"{len(result.escaped)}, stranded {len(result.stranded)}")
    print(summary)
    assert flow.failures == []
    assert result.wrong == [] and result.escaped == [] and result.stranded == [], summary
    assert result.bound == len(flow.created), summary
    # the operator's config: not replaced by 0.1.0's sample, their fields as they set them
    config = cluster.get(CONFIG_PATH)
    assert config["metadata"]["generation"] == generation
    assert _covers(config["spec"], state["operator_spec"]), config["spec"]
    # 3: docs/guide/upgrade.md's clean-up of what 0.1.0 does not know
    for args in (
        ("patch", "serviceaccount", "podplacement-controller", "-n", NAMESPACE,
         "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]'),
        ("delete", "crd", "imageplatformcatalogs.podplacement.io"),
        ("delete", "clusterrolebinding,clusterrole", "podplacement-controller-uninstall"),
    ):
        kubectl(plane, *args)
    sa = cluster.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/podplacement-controller")
    assert not sa["metadata"].get("finalizers")
    wait_until(lambda: get_or_none(plane, "/apis/apiextensions.k8s.io/v1/"
                                   "customresourcedefinitions/"
                                   "imageplatformcatalogs.podplacement.io") is None, 30)
    assert previous_release_in_force(plane) == []
    # 0.1.0's policy still places new pods from its own catalog. Just after the clean-up (a
    # CRD deleted), the API server applied no policy to the first pod in 6 of 8 runs here (no
    # gate label; 0.1.0's webhook placed it); pods created 2 s later were all placed by the
    # policy. So: one pod a second, until one is placed at admission, each placed rightly.
    paths = []
    for i in range(10):
        cluster.create(f"/api/v1/namespaces/{ns}/pods", pod(f"after-{i}", image))
        bound = wait_until(partial(_platforms_of, cluster, ns, f"after-{i}"), 60)
        decision = json.loads(bound["metadata"]["annotations"][DECISION_ANNOTATION])
        assert set(decision.get("platforms") or []) == {f"{o}/{a}" for o, a in PLATFORMS}
        paths.append(decision.get("path"))
        if paths[-1] == "admission":
            break
        time.sleep(1)
    print(f"after the clean-up: {paths}")
    assert paths[-1] == "admission", paths
    assert old.forbidden() == [], "RBAC denials in 0.1.0's logs"


def _accepted(cluster: KubeEnv, ns: str, name: str) -> bool:
    obj = cluster.get(f"/apis/podplacement.io/v1beta1/namespaces/{ns}/podplacementpolicies/"
                      f"{name}")
    return any(c.get("type") == "Accepted" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _covers(live: Any, want: Any) -> bool:
    """Every field of ``want`` is in ``live`` with the same value (``live`` may hold more)."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(_covers(live.get(k), v) for k, v in want.items())
    return bool(live == want)


def test_the_namespace_of_the_product_is_the_one_the_releases_share() -> None:
    """Both releases install into podplacement-system (the upgrade relies on it)."""
    assert NAMESPACE == "podplacement-system"
