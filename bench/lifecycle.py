"""The product at the edges of its own lifecycle, on the real control plane: figures.

Each scenario starts a fresh real control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager v1.36.2; fake Ready nodes of every architecture), a local registry,
and podplacement installed from deploy/ (``kubectl apply -k``, then the webhook and the
controller as processes with deploy/'s ServiceAccount tokens, see
:mod:`podplacement.sandbox.product`), then prints what an operator would want to know:

- ``uninstall``: ``--pods`` pods (default 200), each of an image tag never seen, are created
  while the controller is stopped (SIGSTOP), so they are all gated; then ``kubectl delete
  -k deploy/`` runs, the controller is let go and, as a kubelet would for pods being
  deleted, SIGTERM goes to both processes.
  Printed: seconds until no pod carries the gate, seconds until nothing of ours is left
  (policy, binding, webhook configuration, params object, uninstall ClusterRole and binding,
  namespace, CRDs), pods still gated after 60 s, pods released with a placement.
- ``outage``: the controller is stopped (SIGSTOP) for ``--outage`` seconds (default 120)
  while ``--pods`` pods (default 200), each naming an image reference never seen (distinct
  tags of an amd64-only and an arm64-only manifest), are created evenly over that time;
  then it runs again. Printed: how many pods the webhook placed at admission, how many the
  controller placed after it came back, and the wrong-arch bindings (a pod bound to a node
  whose (os, arch) its image lacks: there must be none).

Usage: ``python bench/lifecycle.py --scenario uninstall|outage [--pods 200] [--outage 120]
[--unavailable-after 60]``
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from podplacement.controller.paramswriter import params_path  # noqa: E402
from podplacement.rules.config import (  # noqa: E402
    ADMISSION_POLICY_NAME,
    DECISION_ANNOTATION,
    GATE_LABEL,
    SCHEDULING_GATE,
    WEBHOOK_CONFIGURATION_NAME,
)
from podplacement.rules.ownership import UNINSTALL_RBAC_NAME  # noqa: E402
from podplacement.sandbox.controlplane import (  # noqa: E402
    DEFAULT_NODES,
    ControlPlane,
    add_nodes,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.oci import Pusher  # noqa: E402
from podplacement.sandbox.product import (  # noqa: E402
    NAMESPACE,
    Product,
    install_manifests,
    kubectl,
    start_product,
)
from podplacement.sandbox.registry import Registry, start_registry  # noqa: E402

REPO = Path(_ROOT)
USER_NS = "bench-life"
_ADM = "/apis/admissionregistration.k8s.io/v1"
OURS = {
    "policy": f"{_ADM}/mutatingadmissionpolicies/{ADMISSION_POLICY_NAME}",
    "binding": f"{_ADM}/mutatingadmissionpolicybindings/{ADMISSION_POLICY_NAME}",
    "webhook configuration": f"{_ADM}/mutatingwebhookconfigurations/{WEBHOOK_CONFIGURATION_NAME}",
    "params": params_path(NAMESPACE),
    "uninstall role": f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{UNINSTALL_RBAC_NAME}",
    "uninstall binding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/"
                         + UNINSTALL_RBAC_NAME,
    "namespace": f"/api/v1/namespaces/{NAMESPACE}",
    "config CRD": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                  "podplacementconfigs.podplacement.io",
    "params CRD": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                  "imageplatformcatalogs.podplacement.io",
}


def _pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0}}


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _user_namespace(plane: ControlPlane, name: str) -> None:
    with plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": name}})
        deadline = time.monotonic() + 20
        while c.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"
                    ).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)


def _create(plane: ControlPlane, ns: str, pods: list[dict[str, Any]]) -> None:
    with plane.client() as c, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: c.post(f"/api/v1/namespaces/{ns}/pods",
                                       json=p).raise_for_status(), pods))


def _gated_anywhere(plane: ControlPlane) -> int:
    with plane.client() as c:
        r = c.get("/api/v1/pods", params={"labelSelector": f"{GATE_LABEL}=gated"})
        return sum(1 for p in r.json()["items"] if _gated(p))


def _force_delete_product_pods(plane: ControlPlane) -> None:
    """What a kubelet does for pods being deleted whose containers are gone."""
    with plane.client() as c:
        r = c.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
        if r.status_code != 200:
            return
        for pod in r.json()["items"]:
            c.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}",
                     params={"gracePeriodSeconds": "0"})


def _left(plane: ControlPlane) -> list[str]:
    with plane.client() as c:
        return [name for name, path in OURS.items() if c.get(path).status_code != 404]


def _nodes(plane: ControlPlane) -> dict[str, tuple[str, str]]:
    with plane.client() as c:
        items = c.get("/api/v1/nodes").json()["items"]
    return {n["metadata"]["name"]: (n["metadata"]["labels"]["kubernetes.io/os"],
                                    n["metadata"]["labels"]["kubernetes.io/arch"])
            for n in items}


def uninstall(plane: ControlPlane, product: Product, registry: Registry, pods: int) -> None:
    """The ``uninstall`` scenario (module docstring)."""
    p = Pusher(registry)
    try:
        # a tag per pod: none is known to the webhook's cache, so every pod stays gated
        for i in range(pods):
            p.multiarch("life/multi", f"u{i}", ["linux/amd64", "linux/arm64"])
    finally:
        p.close()
    _user_namespace(plane, USER_NS)
    # no inspection at admission (spec.admission.inspectionBudget 0s): the webhook would
    # place these pods itself, and the scenario is about releasing gated ones
    with plane.client() as c:
        c.patch("/apis/podplacement.io/v1beta1/podplacementconfigs/cluster",
                json={"spec": {"admission": {"inspectionBudget": "0s"}}},
                headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    time.sleep(1.0)  # the webhook's config watch
    product.controllers[0].popen.send_signal(signal.SIGSTOP)
    _create(plane, USER_NS, [_pod(f"u-{i}", f"{registry.host}/life/multi:u{i}")
                             for i in range(pods)])
    print(f"{_gated_anywhere(plane)} of {pods} pods gated; kubectl delete -k deploy/")
    started = time.monotonic()
    kubectl(plane, "delete", "-k", str(REPO / "deploy"), "--wait=false", check=False)
    for proc in [*product.controllers, product.webhook]:
        proc.popen.send_signal(signal.SIGCONT)
        proc.popen.send_signal(signal.SIGTERM)
    released = empty = None
    while time.monotonic() - started < 60 and (released is None or empty is None):
        _force_delete_product_pods(plane)
        if released is None and _gated_anywhere(plane) == 0:
            released = time.monotonic() - started
        if empty is None and not _left(plane):
            empty = time.monotonic() - started
        time.sleep(0.25)
    with plane.client() as c:
        items = c.get(f"/api/v1/namespaces/{USER_NS}/pods").json()["items"]
    placed = sum(1 for i in items if (i["spec"].get("affinity") or {}).get("nodeAffinity"))
    print(json.dumps({
        "scenario": "uninstall", "pods": pods,
        "seconds_to_no_gated_pod": None if released is None else round(released, 1),
        "seconds_to_nothing_left": None if empty is None else round(empty, 1),
        "gated_after_60s": _gated_anywhere(plane),
        "left_after_60s": _left(plane),
        "released_with_a_placement": placed,
    }, indent=2))


def outage(plane: ControlPlane, product: Product, registry: Registry, pods: int,
           seconds: float) -> None:
    """The ``outage`` scenario (module docstring)."""
    p = Pusher(registry)
    images: list[tuple[str, str]] = []
    try:
        for i in range(pods):
            arch = "amd64" if i % 2 == 0 else "arm64"
            p.image(f"life/{arch}", f"t{i}", architecture=arch)
            images.append((f"{registry.host}/life/{arch}:t{i}", arch))
    finally:
        p.close()
    _user_namespace(plane, USER_NS)
    controller = product.controllers[0]
    controller.popen.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    print(f"controller stopped for {seconds:.0f} s; {pods} pods of new images over that time")
    try:
        for i, (image, _arch) in enumerate(images):
            due = started + seconds * i / max(1, pods)
            time.sleep(max(0.0, due - time.monotonic()))
            _create(plane, USER_NS, [_pod(f"o-{i}", image)])
        time.sleep(max(0.0, started + seconds - time.monotonic()))
    finally:
        controller.popen.send_signal(signal.SIGCONT)
    print("controller running again")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with plane.client() as c:
            items = c.get(f"/api/v1/namespaces/{USER_NS}/pods").json()["items"]
        if all(i["spec"].get("nodeName") for i in items) and len(items) == pods:
            break
        time.sleep(1.0)
    nodes = _nodes(plane)
    arch_of = dict(images)
    paths: Counter[str] = Counter()
    wrong, unbound = [], 0
    for item in items:
        image = item["spec"]["containers"][0]["image"]
        decision = json.loads((item["metadata"].get("annotations") or {}).get(
            DECISION_ANNOTATION) or "{}")
        paths[f"{decision.get('path', 'controller')}/{decision.get('result', '?')}"] += 1
        node = item["spec"].get("nodeName")
        if not node:
            unbound += 1
        elif nodes[node] != ("linux", arch_of[image]):
            wrong.append(f"{item['metadata']['name']}: {image} on {node}")
    print(json.dumps({
        "scenario": "outage", "pods": pods, "outage_seconds": seconds,
        "decided_by_path_and_result": dict(paths), "unbound": unbound,
        "wrong_arch_bindings": len(wrong), "wrong": wrong[:10],
    }, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=["uninstall", "outage"], required=True)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--outage", type=float, default=120.0,
                        help="seconds the controller is stopped (outage)")
    parser.add_argument("--unavailable-after", type=float, default=60.0,
                        help="the webhook's --controller-unavailable-after (outage)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-life-") as tmp:
        work = Path(tmp)
        registry = start_registry(work / "registry")
        plane = start_control_plane(locate_assets(), work / "plane")
        product: Product | None = None
        try:
            add_nodes(plane, DEFAULT_NODES)
            install_manifests(plane, REPO / "deploy")
            product = start_product(
                plane, work / "product",
                controller_options=["--insecure-registry", registry.host],
                webhook_options=["--insecure-registry", registry.host,
                                 "--controller-unavailable-after",
                                 str(args.unavailable_after)])
            if args.scenario == "uninstall":
                uninstall(plane, product, registry, args.pods)
            else:
                outage(plane, product, registry, args.pods, args.outage)
        finally:
            if product is not None:
                for proc in [*product.controllers, product.webhook]:
                    if proc.alive():
                        proc.popen.send_signal(signal.SIGCONT)
                product.stop()
            plane.stop()
            registry.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
