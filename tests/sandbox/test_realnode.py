"""The real node of the sandbox (kubelet v1.36.2, containerd, runc, our CNI plugin and pause
image) on the real control plane: a pod bound to it runs a real amd64 busybox from the local
registry, its log is read through the API server, and once the node stops the host is as
before (sysctls, cgroups, mounts from ``/proc/self/mountinfo``, no shim of ours, no host
directory left)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podplacement.sandbox import hostfx
from podplacement.sandbox.controlplane import AssetsNotFound
from podplacement.sandbox.oci import Pusher
from podplacement.sandbox.realnode import NODE_NAME, start_real_node
from tests.harness.kube import start_real
from tests.harness.realnode import FAKE_NODES, busybox_layer, missing_real_node, wait_for
from tests.harness.registry import Registry

pytestmark = [pytest.mark.realcluster, pytest.mark.realnode]


def _pod(name: str, image: str, script: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 0, "nodeName": NODE_NAME,
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "app", "image": image, "command": ["/bin/sh", "-c", script],
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}}


def test_a_pod_runs_on_the_real_node_and_stopping_leaves_the_host_as_before(
        tmp_path: Path, registry: Registry) -> None:
    why = missing_real_node()
    if why is not None:
        pytest.skip(why)
    layer = busybox_layer("amd64")
    before = hostfx.snapshot()
    alone = not hostfx.holders()  # another node running now keeps the shared effects
    try:
        kube = start_real(tmp_path / "plane", nodes=FAKE_NODES)
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    assert kube.plane is not None
    try:
        node = start_real_node(kube.plane, tmp_path / "node", registries=(registry,))
        try:
            ready = kube.get(f"/api/v1/nodes/{NODE_NAME}")
            assert ready["metadata"]["labels"]["kubernetes.io/arch"] == "amd64"
            assert ready["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.2"
            assert ready["status"]["nodeInfo"]["containerRuntimeVersion"].startswith(
                "containerd://")
            assert not any(t["key"] == "node.kubernetes.io/not-ready"
                           for t in ready["spec"].get("taints") or [])
            addresses = {a["type"]: a["address"] for a in ready["status"]["addresses"]}
            assert addresses["InternalIP"] == "127.0.0.1"
            with Pusher(registry) as p:
                p.image("realnode/busybox", "amd64", layers=[layer])
            image = f"{registry.host}/realnode/busybox:amd64"
            kube.ensure_namespace("realnode")
            kube.create("/api/v1/namespaces/realnode/pods", _pod(
                "hello", image, "echo hello from $(uname -m) > /scratch/x; cat /scratch/x; "
                "ls /sys/class/net; sleep 3600"))
            path = "/api/v1/namespaces/realnode/pods/hello"
            pod = wait_for(lambda: (p := kube.get(path))["status"].get("phase") == "Running"
                           and p, 60)
            (status,) = pod["status"]["containerStatuses"]
            assert status["state"]["running"] and status["ready"]
            assert status["imageID"].startswith(f"{registry.host}/realnode/busybox@sha256:")
            assert pod["status"]["podIP"] == "127.0.0.1"
            text = wait_for(lambda: kube.request("GET", f"{path}/log").text.count("\n") >= 2, 20)
            log = kube.request("GET", f"{path}/log").text
            assert text and log.splitlines() == ["hello from x86_64", "lo"], log
            mounts = [p for p, _, _ in hostfx.mounts() if p.startswith(str(tmp_path / "node"))]
            assert mounts, "the node mounted nothing under its directory"
            assert hostfx.shim_pids(node.socket)
            assert hostfx.cgroup_pids(node.footprint.cgroup_root)
        finally:
            left = node.stop()
    finally:
        kube.stop()
    assert left == []
    after = hostfx.snapshot()
    assert not hostfx.shim_pids(node.socket)
    assert not [p for p, _, _ in hostfx.mounts() if p.startswith(str(tmp_path))]
    assert not any((h / node.footprint.cgroup_root.strip("/")).exists()
                   for h in hostfx.cgroup_hierarchies())
    if alone and not hostfx.holders():
        assert hostfx.differences(before, after) == []
    else:  # another real node ran meanwhile: only what is ours is compared
        ours = [d for d in hostfx.differences(before, after)
                if not d.startswith(("sysctl ", "directory ", "shim process "))]
        assert ours == []
