"""The real ``kubectl`` (on PATH) against localkube: create from YAML, get as JSON, patch,
server-side apply of a PodPlacementConfig, delete."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from podplacement.rules.config import API_VERSION, CONFIG_NAME
from tests.harness.kube import KubeEnv

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH")

POD_YAML = """\
apiVersion: v1
kind: Pod
metadata:
  name: kp
  labels:
    app: kubectl
spec:
  containers:
  - name: c
    image: busybox:1.36
"""

PPC_YAML = f"""\
apiVersion: {API_VERSION}
kind: PodPlacementConfig
metadata:
  name: {CONFIG_NAME}
spec:
  plugins:
    nodeAffinityScoring:
      enabled: true
      platforms:
      - architecture: arm64
        weight: 50
"""


def kubectl(env: KubeEnv, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run kubectl with the env's kubeconfig and a private HOME (discovery cache)."""
    environ = dict(os.environ, KUBECONFIG=str(env.kubeconfig), HOME=str(home))
    return subprocess.run(["kubectl", *args], env=environ, capture_output=True, text=True,
                          timeout=60, check=False)


def test_kubectl_pod_lifecycle(fresh_localkube: KubeEnv, tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(POD_YAML)
    r = kubectl(fresh_localkube, tmp_path, "create", "-f", str(tmp_path / "pod.yaml"))
    assert r.returncode == 0, r.stderr
    assert "pod/kp created" in r.stdout

    r = kubectl(fresh_localkube, tmp_path, "get", "pod", "kp", "-o", "json")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["metadata"]["labels"] == {"app": "kubectl"}
    assert obj["status"]["phase"] == "Pending"

    r = kubectl(fresh_localkube, tmp_path, "patch", "pod", "kp", "-p",
                '{"metadata":{"labels":{"patched":"smp"}}}')
    assert r.returncode == 0, r.stderr
    r = kubectl(fresh_localkube, tmp_path, "patch", "pod", "kp", "--type=json", "-p",
                '[{"op":"add","path":"/metadata/annotations","value":{"a":"b"}}]')
    assert r.returncode == 0, r.stderr
    stored = fresh_localkube.get("/api/v1/namespaces/default/pods/kp")
    assert stored["metadata"]["labels"]["patched"] == "smp"
    assert stored["metadata"]["annotations"] == {"a": "b"}

    r = kubectl(fresh_localkube, tmp_path, "get", "pods")
    assert r.returncode == 0, r.stderr
    assert "kp" in r.stdout

    r = kubectl(fresh_localkube, tmp_path, "delete", "pod", "kp")
    assert r.returncode == 0, r.stderr
    assert fresh_localkube.request("GET", "/api/v1/namespaces/default/pods/kp").status_code == 404


def test_kubectl_server_side_apply_podplacementconfig(
    fresh_localkube: KubeEnv, tmp_path: Path
) -> None:
    path = tmp_path / "ppc.yaml"
    path.write_text(PPC_YAML)
    r = kubectl(fresh_localkube, tmp_path, "apply", "--server-side", "-f", str(path))
    assert r.returncode == 0, r.stderr
    assert "serverside-applied" in r.stdout
    r = kubectl(fresh_localkube, tmp_path, "get", "ppc", CONFIG_NAME, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["spec"]["plugins"]["nodeAffinityScoring"]["platforms"] == [
        {"architecture": "arm64", "weight": 50}]

    path.write_text(PPC_YAML.replace("weight: 50", "weight: 70"))
    r = kubectl(fresh_localkube, tmp_path, "apply", "--server-side", "-f", str(path))
    assert r.returncode == 0, r.stderr
    got = fresh_localkube.get(f"/apis/{API_VERSION}/podplacementconfigs/{CONFIG_NAME}")
    assert got["spec"]["plugins"]["nodeAffinityScoring"]["platforms"][0]["weight"] == 70
    assert got["metadata"]["generation"] == 2

    path.write_text(PPC_YAML.replace("weight: 50", "weight: 0"))
    r = kubectl(fresh_localkube, tmp_path, "apply", "--server-side", "-f", str(path))
    assert r.returncode != 0
    assert "should be greater than or equal to 1" in r.stderr

    r = kubectl(fresh_localkube, tmp_path, "delete", "-f", str(path))
    assert r.returncode == 0, r.stderr
    r = kubectl(fresh_localkube, tmp_path, "get", "ppc")
    assert "No resources found" in r.stderr


def test_kubectl_get_pods_table_shows_gated_pods(fresh_localkube: KubeEnv, tmp_path: Path) -> None:
    gated = POD_YAML.replace("spec:\n", "spec:\n  schedulingGates:\n  - name: example.com/gate\n")
    (tmp_path / "pod.yaml").write_text(gated)
    r = kubectl(fresh_localkube, tmp_path, "create", "-f", str(tmp_path / "pod.yaml"))
    assert r.returncode == 0, r.stderr
    r = kubectl(fresh_localkube, tmp_path, "get", "pods")
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:4] == ["kp", "0/1", "SchedulingGated", "0"]
