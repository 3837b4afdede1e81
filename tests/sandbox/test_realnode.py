"""The real node of the sandbox (kubelet v1.36.2, containerd, runc, our CNI plugin and pause
image) on the real control plane: a pod bound to it runs a real amd64 busybox from the local
registry, its log is read through the API server, and once the node stops the host is as
before (sysctls, cgroups, mounts from ``/proc/self/mountinfo``, no shim of ours, no host
directory left)."""

from __future__ import annotations

import os
import subprocess
import sys
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

REPO = Path(__file__).resolve().parents[2]


def _pod(name: str, image: str, script: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 0, "nodeName": NODE_NAME,
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "app", "image": image, "command": ["/bin/sh", "-c", script],
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}}


@pytest.mark.realcluster
@pytest.mark.realnode
def test_a_pod_runs_on_the_real_node_and_stopping_leaves_the_host_as_before(
        tmp_path: Path, registry: Registry) -> None:
    why = missing_real_node()
    if why is not None:
        pytest.skip(why)
    layer = busybox_layer("amd64")
    before = hostfx.snapshot()
    beside = hostfx.holders()  # another node running now keeps the shared effects
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
            # nothing but loopback: the API server reaches the kubelet there
            assert {a["address"] for a in ready["status"]["addresses"]} == {"127.0.0.1"}
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
            mounts = [p for p, _, _ in hostfx.mounts() if p.startswith(str(node.rundir))]
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
    assert not [p for p, _, _ in hostfx.mounts() if p.startswith(str(node.rundir))]
    assert not node.rundir.exists()
    assert "Started" in (tmp_path / "node" / "kubelet.log").read_text()  # the logs stay
    assert not any((h / node.footprint.cgroup_root.strip("/")).exists()
                   for h in hostfx.cgroup_hierarchies())
    # another real node (another test process) leaves its own effects, not ours
    assert hostfx.own_differences(before, after, [*beside, *hostfx.holders()]) == []


def test_under_ci_a_machine_without_the_kubelet_refuses_to_run_with_one_line(
        tmp_path: Path) -> None:
    """The control plane is there (``KUBEBUILDER_ASSETS``), the kubelet is not: CI stops at
    once, with one line naming the real node."""
    from podplacement.sandbox.controlplane import locate_assets

    try:
        assets = locate_assets()
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    plane_only = tmp_path / "assets"
    plane_only.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        binary = assets.binary(name)
        if binary is not None:
            (plane_only / name).symlink_to(binary)
    (tmp_path / "no-k8s-bin").mkdir()
    env = {**os.environ, "CI": "true", "KUBEBUILDER_ASSETS": str(plane_only),
           "PODPLACEMENT_K8S_BIN": str(tmp_path / "no-k8s-bin"),
           "PODPLACEMENT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/sandbox/test_nodeparts.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "CI=true" in line]
    assert len(lines) == 1, done.stdout + done.stderr
    assert "the real node" in lines[0] and "realnode tests would be skipped" in lines[0]
    assert "no kubelet" in lines[0]
