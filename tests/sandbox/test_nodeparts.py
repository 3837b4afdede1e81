"""The parts of the real node, without a node: our pause program runs (and only SIGKILL ends
it, as containerd stops a sandbox), its image archive is a consistent OCI layout, our CNI
plugin renames the loopback result's interface, and containerd reads the configuration we
write."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

import pytest

from podplacement.sandbox import nodeparts


def test_the_pause_program_is_a_static_x86_64_elf_that_waits_until_killed(
        tmp_path: Path) -> None:
    binary = nodeparts.pause_binary()
    assert binary[:4] == b"\x7fELF" and int.from_bytes(binary[18:20], "little") == 62
    if os.uname().machine != "x86_64":
        pytest.skip("runs on x86-64 only")
    path = tmp_path / "pause"
    path.write_bytes(binary)
    path.chmod(0o755)
    proc = subprocess.Popen([str(path)])
    try:
        time.sleep(0.3)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(5) == -signal.SIGKILL


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def test_the_pause_image_archive_is_an_oci_layout_whose_digests_match() -> None:
    archive = nodeparts.pause_image_archive("example.local/pause:7")
    assert archive == nodeparts.pause_image_archive("example.local/pause:7")
    files = _members(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "example.local/pause:7"
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'][7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["config"]["Entrypoint"] == ["/pause"]
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"]
    assert _members(layer)["pause"] == nodeparts.pause_binary()


def _fake_loopback(tmp_path: Path, result: dict[str, object], code: int = 0) -> Path:
    path = tmp_path / "loopback"
    path.write_text(f"#!/bin/sh\ncat > {tmp_path}/stdin\necho '{json.dumps(result)}'\n"
                    f"echo warned >&2\nexit {code}\n")
    path.chmod(0o755)
    return path


def test_the_cni_plugin_renames_the_loopback_interface_on_add_only(tmp_path: Path) -> None:
    result = {"cniVersion": "1.0.0", "interfaces": [{"name": "lo", "sandbox": "/x"}],
              "ips": [{"interface": 0, "address": "127.0.0.1/8"}]}
    loopback = _fake_loopback(tmp_path, result)
    plugin = tmp_path / nodeparts.CNI_PLUGIN
    plugin.write_text(nodeparts.cni_plugin_script(sys.executable, str(loopback)))
    plugin.chmod(0o755)
    env = dict(os.environ, CNI_COMMAND="ADD", CNI_IFNAME="eth0")
    done = subprocess.run([str(plugin)], input=b'{"name": "n"}', capture_output=True,
                          env=env, check=False)
    assert done.returncode == 0 and done.stderr == b"warned\n"
    out = json.loads(done.stdout)
    assert out["interfaces"] == [{"name": "eth0", "sandbox": "/x"}]
    assert out["ips"] == result["ips"]
    assert (tmp_path / "stdin").read_bytes() == b'{"name": "n"}'
    done = subprocess.run([str(plugin)], capture_output=True, check=False,
                          env=dict(env, CNI_COMMAND="DEL"))
    assert json.loads(done.stdout)["interfaces"][0]["name"] == "lo"
    failing = _fake_loopback(tmp_path, {"code": 7, "msg": "no"}, code=7)
    plugin.write_text(nodeparts.cni_plugin_script(sys.executable, str(failing)))
    done = subprocess.run([str(plugin)], capture_output=True, env=env, check=False)
    assert done.returncode == 7 and json.loads(done.stdout)["code"] == 7


def test_containerd_reads_the_configuration_and_the_hosts_files(tmp_path: Path) -> None:
    text = nodeparts.containerd_config(
        root=str(tmp_path / "root"), state=str(tmp_path / "state"),
        socket=str(tmp_path / "c.sock"), runc_root=str(tmp_path / "runc"),
        opt=str(tmp_path / "opt"), cni_bin=str(tmp_path / "bin"),
        cni_conf=str(tmp_path / "conf"), hosts_dir=str(tmp_path / "hosts"))
    doc = tomllib.loads(text)
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True and cri["sandbox_image"] == nodeparts.PAUSE_IMAGE
    assert cri["registry"]["config_path"] == str(tmp_path / "hosts")
    hosts = tomllib.loads(nodeparts.hosts_toml("127.0.0.1:5000", tls=True, ca_file="/ca.crt"))
    assert hosts["server"] == "https://127.0.0.1:5000"
    assert hosts["host"]["https://127.0.0.1:5000"] == {"capabilities": ["pull", "resolve"],
                                                      "ca": "/ca.crt"}
    containerd = shutil.which("containerd")
    if containerd is None:
        pytest.skip("no containerd (hack/setup.sh installs Debian's)")
    (tmp_path / "config.toml").write_text(text)
    dumped = subprocess.run([containerd, "--config", str(tmp_path / "config.toml"), "config",
                             "dump"], capture_output=True, text=True, timeout=30, check=False)
    assert dumped.returncode == 0, dumped.stderr
    parsed = tomllib.loads(dumped.stdout)
    assert parsed["root"] == str(tmp_path / "root")
    runc = parsed["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
    assert runc["options"]["Root"] == str(tmp_path / "runc")
    assert not (tmp_path / "root").exists()  # dumping starts nothing
