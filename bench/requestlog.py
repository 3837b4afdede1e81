"""The controller's request log of one fixed scenario on the real control plane: figures to
compare two checkouts (a restructuring must leave it the same).

Starts a fresh real control plane (v1.36.2, fake Ready nodes of every architecture) with the
API server's audit log on (:data:`podplacement.sandbox.controlplane.AUDIT_POLICY`, level
Metadata), a local registry, and podplacement installed from deploy/ (the webhook and one
controller as processes with deploy/'s ServiceAccount tokens). Then, with
``spec.admission.inspectionBudget: 0s`` (the controller places what the policy can't) and both
monitors on (``spec.plugins.execFormatErrorMonitor.enabled``,
``spec.plugins.placementEscapes.enabled``):

1. ``--pods`` pods (default 6), each of an image tag never seen (half amd64+arm64, half
   arm64 only): gated at admission, placed by the controller's leader queue;
2. one pod bound with ``spec.nodeName`` to ``node-s390x`` (an arm64-only image): an escape,
   recorded by the escape monitor (its queue);
3. one pod of a lying image (its arm64 entry holds an amd64 binary) pinned to arm64, whose
   container status then reports containerd's exec format error, as a kubelet would: the
   exec-format monitor records it after verifying the image (its queue).

It waits (bounded) for every pod to be ungated and for the ``PlacementEscaped`` and
``ExecFormatError`` Events, waits ``--settle`` seconds, stops the product, and prints the
controller's requests from the audit log (deploy/'s controller ServiceAccount) as
``{"verb resource[/subresource] code": count}`` JSON:
``writes`` (create, update, patch, delete: what the scenario itself causes; must be equal
between checkouts) and ``reads`` (get, list, watch: also paced by timers, relists and the
lease, so they vary a little with wall time).

Usage: ``python bench/requestlog.py [--pods 6] [--settle 5] [--out FILE]``
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
from collections import Counter  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from podplacement.rules.config import SCHEDULING_GATE  # noqa: E402
from podplacement.sandbox.controlplane import (  # noqa: E402
    DEFAULT_NODES,
    ControlPlane,
    add_nodes,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.oci import Pusher  # noqa: E402
from podplacement.sandbox.product import (  # noqa: E402
    CONTROLLER_SA,
    NAMESPACE,
    install_manifests,
    start_product,
)
from podplacement.sandbox.registry import start_registry  # noqa: E402

REPO = Path(_ROOT)
NS = "bench-log"
CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
CONTROLLER_USER = f"system:serviceaccount:{NAMESPACE}:{CONTROLLER_SA}"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
#: containerd's words for a binary of another architecture (tests/controller/test_execformat)
RUNC = ("runc create failed: unable to start container process: exec: \"sh\": "
        "exec format error")
CONTAINERD_START = ('failed to start containerd task "0123abcd": OCI runtime start failed: '
                    f"{RUNC}: unknown")


def _wait(check: Callable[[], Any], within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if (value := check()):
            return value
        time.sleep(0.2)
    return None


def _pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": image}],
                     "terminationGracePeriodSeconds": 0, **spec}}


def _events(plane: ControlPlane, reason: str) -> int:
    with plane.client() as c:
        items = c.get(f"/api/v1/namespaces/{NS}/events").json().get("items", [])
    return sum(1 for e in items if e.get("reason") == reason)


def _gated(plane: ControlPlane) -> int:
    with plane.client() as c:
        items = c.get(f"/api/v1/namespaces/{NS}/pods").json()["items"]
    return sum(1 for p in items if any(g.get("name") == SCHEDULING_GATE
                                       for g in p["spec"].get("schedulingGates") or []))


def _lying(p: Pusher) -> str:
    from tests.imageinspect._images import elf, file, layer, symlink

    bb = layer([file("bin/busybox", elf("amd64")), symlink("bin/sh", "busybox")])
    children = []
    for arch in ("amd64", "arm64"):
        img = p.image("log/lying", None, architecture=arch, fmt="oci", layers=[bb],
                      process={"Cmd": ["sh"]})
        children.append((img, {"os": "linux", "architecture": arch}))
    return f"{p.registry.host}/log/lying@{p.index('log/lying', 'v1', children).digest}"


def scenario(plane: ControlPlane, host: str, pusher: Pusher, pods: int) -> dict[str, Any]:
    """Steps 1-3 of the module docstring; returns what was seen (bounded waits)."""
    for i in range(pods):
        platforms = ["linux/amd64", "linux/arm64"] if i % 2 == 0 else ["linux/arm64"]
        pusher.multiarch("log/app", f"t{i}", platforms)
    lying = _lying(pusher)
    with plane.client() as c:
        c.patch(CONFIG, json={"spec": {
            "admission": {"inspectionBudget": "0s"},
            "plugins": {"execFormatErrorMonitor": {"enabled": True},
                        "placementEscapes": {"enabled": True}}}},
            headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
        c.post("/api/v1/namespaces", json={"metadata": {"name": NS}}).raise_for_status()
        _wait(lambda: c.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default"
                            ).status_code == 200, 20)
        time.sleep(2.0)  # the webhook's and the controller's config watches
        for i in range(pods):
            c.post(f"/api/v1/namespaces/{NS}/pods",
                   json=_pod(f"p{i}", f"{host}/log/app:t{i}")).raise_for_status()
        c.post(f"/api/v1/namespaces/{NS}/pods", json=_pod(
            "escaped", f"{host}/log/app:t1", nodeName="node-s390x")).raise_for_status()
        c.post(f"/api/v1/namespaces/{NS}/pods", json=_pod(
            "lying", lying, nodeSelector={"kubernetes.io/arch": "arm64"})).raise_for_status()
        ungated = _wait(lambda: _gated(plane) == 0, 60) is not None

        def bound() -> str | None:
            pod = c.get(f"/api/v1/namespaces/{NS}/pods/lying").json()
            return pod["spec"].get("nodeName")

        node = _wait(bound, 30)
        if node:
            c.patch(f"/api/v1/namespaces/{NS}/pods/lying/status", json={"status": {
                "phase": "Running", "containerStatuses": [{
                    "name": "app", "image": lying, "imageID": lying, "ready": False,
                    "started": False, "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    "lastState": {"terminated": {
                        "reason": "StartError", "exitCode": 128, "message": CONTAINERD_START,
                        "startedAt": "2026-01-01T00:00:00Z",
                        "finishedAt": "2026-01-01T00:00:00Z"}}}]}},
                headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    escaped = _wait(lambda: _events(plane, "PlacementEscaped"), 60)
    exec_format = _wait(lambda: _events(plane, "ExecFormatError"), 60)
    return {"ungated": ungated, "lying_bound_to": node, "PlacementEscaped": escaped,
            "ExecFormatError": exec_format}


def requests(audit_log: Path) -> tuple[Counter[str], Counter[str]]:
    """(writes, reads) of the controller's ServiceAccount in the audit log."""
    writes: Counter[str] = Counter()
    reads: Counter[str] = Counter()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        user = (event.get("user") or {}).get("username", "")
        if user != CONTROLLER_USER or event.get("stage") == "ResponseStarted":
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        code = (event.get("responseStatus") or {}).get("code", 0)
        key = f"{event.get('verb')} {resource} {code}"
        (writes if event.get("verb") in WRITES else reads)[key] += 1
    return writes, reads


def main(argv: list[str] | None = None) -> int:
    """Run the scenario once and print (or write to ``--out``) the request log."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=6)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-log-") as tmp:
        work = Path(tmp)
        registry = start_registry(work / "registry")
        plane = start_control_plane(locate_assets(), work / "plane", audit=True)
        product = None
        pusher = Pusher(registry)
        try:
            add_nodes(plane, DEFAULT_NODES)
            install_manifests(plane, REPO / "deploy")
            product = start_product(
                plane, work / "product",
                controller_options=["--insecure-registry", registry.host,
                                    "--standby-wait", "-1"],
                webhook_options=["--insecure-registry", registry.host])
            seen = scenario(plane, registry.host, pusher, args.pods)
            time.sleep(args.settle)
            product.stop()
            product = None
        finally:
            pusher.close()
            if product is not None:
                product.stop()
            plane.stop()  # flushes the audit log
            registry.stop()
        assert plane.audit_log is not None
        writes, reads = requests(plane.audit_log)
    out = {"seen": seen, "writes": dict(sorted(writes.items())),
           "reads": dict(sorted(reads.items()))}
    text = json.dumps(out, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
