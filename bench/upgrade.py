"""The upgrade in place from the previous release (releases.toml) to this checkout, on the
real control plane, with many pods created during it: figures.

A fresh real control plane (fake Ready nodes of every architecture) and a local registry;
the previous release runs from its own source tree (``git archive`` of its commit), installed
as its README said, its config set by the operator (scoring off, ``cacheTTL`` 20s), its
catalog warm. Then ``--pods`` pods (default 300, one every ``--interval`` s) are created
while the documented upgrade runs (``kubectl apply -k deploy/``, the new processes in a
rolling update's order: tests/harness/upgrade.py). Printed: the upgrade's timings, the pods
created before, during and after it, how they were placed, the wrong (on a node the image
can't run), escaped (bound with no placement) and stranded (still gated) pods, the status
violations (the policy said not in force while 0.1.0's binding was there), what is left of
the previous release, and whether the operator's config is unchanged. Then the tag is
re-pushed as arm64-only: after ``cacheTTL`` 10 new pods must all land on arm64 (with the
previous release's frozen catalog they stayed on amd64), and a namespace's new
PodPlacementPolicy allowing s390x only must apply to 6 new pods at once.

Usage: ``python bench/upgrade.py [--pods 300] [--interval 0.08]``
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from podplacement.controller.lifecycle import CONFIG_PATH  # noqa: E402
from podplacement.sandbox.controlplane import (  # noqa: E402
    DEFAULT_NODES,
    ControlPlane,
    add_nodes,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.oci import Pusher  # noqa: E402
from podplacement.sandbox.product import Product, start_product  # noqa: E402
from podplacement.sandbox.registry import start_registry  # noqa: E402
from tests.harness.upgrade import (  # noqa: E402
    OLD_PARAMS,
    PodFlow,
    get_or_none,
    install_as_documented,
    leftovers,
    outcome,
    pod,
    previous_release,
    release_tree,
    upgrade_in_place,
    wait_until,
)

NS = "bench-upgrade"
CACHE_TTL = 20


def _covers(live: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(live, dict) and all(_covers(live.get(k), v) for k, v in want.items())
    return bool(live == want)


def _namespace(plane: ControlPlane, name: str) -> None:
    with plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": name}})
        wait_until(lambda: c.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"
                                 ).status_code == 200, 20)


def _bound_archs(plane: ControlPlane, ns: str, names: list[str]) -> list[str]:
    with plane.client() as c:
        def all_bound() -> list[dict[str, Any]] | None:
            got = [c.get(f"/api/v1/namespaces/{ns}/pods/{n}").json() for n in names]
            return got if all(p["spec"].get("nodeName") for p in got) else None

        pods = wait_until(all_bound, 120, every=0.5)
        return [c.get(f"/api/v1/nodes/{p['spec']['nodeName']}").json()["metadata"]["labels"][
            "kubernetes.io/arch"] for p in pods]


def run(pods: int, interval: float, work: Path) -> dict[str, Any]:
    """The scenario (module docstring); returns the figures."""
    release = previous_release()
    old_tree = release_tree(release["commit"], work / "previous")
    registry = start_registry(work / "registry")
    plane = start_control_plane(locate_assets(), work / "plane")
    old: Product | None = None
    new: Product | None = None
    pusher = Pusher(registry)
    try:
        add_nodes(plane, DEFAULT_NODES)
        pusher.multiarch("upgrade/multi", "v1", ["linux/amd64", "linux/arm64"])
        image = f"{registry.host}/upgrade/multi:v1"
        options = ["--insecure-registry", registry.host]
        install_as_documented(plane, old_tree / "deploy")
        old = start_product(plane, work / "old", controller_options=options,
                            env={"PYTHONPATH": str(old_tree)}, cwd=old_tree)
        with plane.client() as c:
            c.patch(CONFIG_PATH, json={"spec": {
                "plugins": {"nodeAffinityScoring": {"enabled": False}},
                "imageInspection": {"cacheTTL": f"{CACHE_TTL}s"}}},
                headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
            operator = c.get(CONFIG_PATH).json()
        _namespace(plane, NS)
        with plane.client() as c:
            c.post(f"/api/v1/namespaces/{NS}/pods", json=pod("warm", image)).raise_for_status()
        wait_until(lambda: image in ((get_or_none(plane, OLD_PARAMS) or {}).get("spec") or {})
                   .get("images", {}), 60)
        flow = PodFlow(plane, NS, image, interval, pods).start()
        time.sleep(2.0)
        try:
            new, timing = upgrade_in_place(plane, old, work / "new",
                                           [*options, "--standby-wait", "-1"], options,
                                           rollout_delay=11.0)
            wait_until(lambda: len(flow.created) >= pods, 600, every=0.5)
        finally:
            flow.stop()
        result = outcome(plane, NS, {("linux", "amd64"), ("linux", "arm64")}, within=120)
        phases = [t - timing.started for t in flow.times]
        during = sum(1 for t in phases if 0 <= t <= timing.complete)
        after = sum(1 for t in phases if t > timing.complete)
        with plane.client() as c:
            config = c.get(CONFIG_PATH).json()
        figures: dict[str, Any] = {
            "previous_release": release["version"],
            "seconds_apply": round(timing.applied, 1),
            "seconds_new_controller_leading": round(timing.new_leads, 1),
            "seconds_nothing_of_previous_left": round(timing.complete, 1),
            "pods_created": len(flow.created),
            "pods_before_during_after": [len(phases) - during - after, during, after],
            "bound": result.bound, "placed_by_path": dict(result.paths),
            "wrong": len(result.wrong), "escaped": len(result.escaped),
            "stranded": len(result.stranded), "create_failures": len(flow.failures),
            "status_violations": len(flow.violations),
            "left_of_previous_release": leftovers(plane),
            "operator_config_unchanged": (
                config["metadata"]["generation"] == operator["metadata"]["generation"]
                and _covers(config["spec"], operator["spec"])),
        }
        # a re-pushed tag: after cacheTTL the new pods follow it
        pusher.image("upgrade/multi", "v1", architecture="arm64")
        time.sleep(CACHE_TTL + 3)
        with plane.client() as c:
            for i in range(10):
                c.post(f"/api/v1/namespaces/{NS}/pods",
                       json=pod(f"moved-{i}", image)).raise_for_status()
        archs = _bound_archs(plane, NS, [f"moved-{i}" for i in range(10)])
        figures["repushed_arm64_only_pods_on_arm64"] = f"{archs.count('arm64')} of 10"
        # a namespace's new policy (s390x only; the image is arm64-only now: the fallback)
        pusher.multiarch("upgrade/wide", "v1", ["linux/amd64", "linux/arm64", "linux/s390x"])
        wide = f"{registry.host}/upgrade/wide:v1"
        with plane.client() as c:
            c.post(f"/apis/podplacement.io/v1beta1/namespaces/{NS}/podplacementpolicies",
                   json={"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
                         "metadata": {"name": "s390x-only"},
                         "spec": {"priority": 10, "allowedArchitectures": ["s390x"]}}
                   ).raise_for_status()
            time.sleep(2.0)
            for i in range(6):
                c.post(f"/api/v1/namespaces/{NS}/pods",
                       json=pod(f"policy-{i}", wide)).raise_for_status()
        archs = _bound_archs(plane, NS, [f"policy-{i}" for i in range(6)])
        figures["new_policy_s390x_only_pods_on_s390x"] = f"{archs.count('s390x')} of 6"
        figures["rbac_denials_new"] = len(new.forbidden())
        return figures
    finally:
        pusher.close()
        for product in (old, new):
            if product is not None:
                product.stop()
        plane.stop()
        registry.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.08,
                        help="seconds between two pod creations")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-upgrade-") as tmp:
        print(json.dumps(run(args.pods, args.interval, Path(tmp)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
