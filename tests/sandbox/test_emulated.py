"""The emulated arm64 node's parts: the exec guard's decision, the ``binfmt_misc``
registration, the CRI relay's edit, the runc wrapper; then, for real, arm64 busybox in a
runc container inside the node's user namespace (``aarch64``), x86-64 busybox refused
there with runc's words while the host still refuses arm64 programs, and a whole arm64
node started and stopped leaving the host as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from podplacement.sandbox import binfmtns, criproxy, emulated, execguard, hostfx, nodeparts
from podplacement.sandbox.controlplane import AssetsNotFound
from podplacement.sandbox.realnode import ARM64_NODE_NAME, find_runtime, start_real_node
from tests.harness.kube import start_real
from tests.harness.realnode import (
    FAKE_NODES_BESIDE_ARM64,
    busybox,
    debs_dir,
    missing_arm64_node,
)

# --- pure parts -----------------------------------------------------------------------------


def _elf(machine: int, order: str = "<") -> bytes:
    import struct

    return b"\x7fELF" + bytes([2, 1 if order == "<" else 2, 1]) + bytes(9) + struct.pack(
        order + "HH", 2, machine)


def test_the_guard_refuses_x86_elves_only() -> None:
    assert execguard.refused_machine(_elf(62)) == "x86-64"
    assert execguard.refused_machine(_elf(3)) == "i386"
    assert execguard.refused_machine(_elf(183)) is None  # aarch64
    assert execguard.refused_machine(_elf(62, ">")[:19]) is None  # too short
    assert execguard.refused_machine(b"#!/bin/sh\n") is None
    assert execguard.refused_machine(nodeparts.pause_binary("amd64")) == "x86-64"
    assert execguard.refused_machine(nodeparts.pause_binary("arm64")) is None
    assert execguard.shebang_interpreter(b"#! /bin/amd64-tool -x\nrest") == "/bin/amd64-tool"
    assert execguard.shebang_interpreter(b"\x7fELF") is None


def test_the_arm64_pause_program_is_an_aarch64_elf() -> None:
    binary = nodeparts.pause_binary("arm64")
    assert binary[:4] == b"\x7fELF" and int.from_bytes(binary[18:20], "little") == 183
    assert binary[20 + 100:].endswith(bytes.fromhex("faffff17"))  # b -24: loops for ever
    with pytest.raises(ValueError):
        nodeparts.pause_binary("s390x")


def test_the_registration_line_is_qemus_aarch64_entry_with_flag_f() -> None:
    line = binfmtns.registration("/cache/qemu-aarch64-static")
    name, kind, offset, magic, mask, interpreter, flags = line.split(b":")[1:]
    assert (name, kind, offset, interpreter, flags) == (
        b"qemu-aarch64", b"M", b"", b"/cache/qemu-aarch64-static", b"F")
    assert bytes.fromhex(magic.decode().replace("\\x", "")) == binfmtns.AARCH64_MAGIC
    assert len(bytes.fromhex(mask.decode().replace("\\x", ""))) == 20
    for bad in ("relative/qemu", "/a:b", "/a\nb"):
        with pytest.raises(ValueError):
            binfmtns.registration(bad)
    # Debian's *-binfmt-P name of qemu keeps the program's own argv[0] (flag P)
    line = binfmtns.registration("/cache/usr/libexec/qemu-binfmt/aarch64-binfmt-P")
    assert line.rsplit(b":", 1)[1] == b"FP"


def test_kernel_releases() -> None:
    assert emulated.kernel_supports_binfmt_namespaces("6.18.44-fc-v1300")
    assert emulated.kernel_supports_binfmt_namespaces("6.7.0")
    assert not emulated.kernel_supports_binfmt_namespaces("6.6.30-generic")
    assert not emulated.kernel_supports_binfmt_namespaces("5.15.0")
    assert not emulated.kernel_supports_binfmt_namespaces("garbage")


def test_the_relay_makes_only_the_sandboxs_seccomp_field_unknown() -> None:
    # bytes as the kubelet v1.36.2 sent them (RunPodSandbox, captured through the relay)
    context = b"\x12\x0a\x0a\x06\x10\x01\x2a\x02\x08\x02\x4a\x00"
    request = b"\x00kubernetes.io/config.seen\x00" + context + b"\x22\x00"
    out = criproxy.rewrite(request)
    assert len(out) == len(request)
    assert out == request.replace(b"\x4a\x00\x22", b"\x7a\x00\x22")
    assert criproxy.rewrite(context) == context  # not a sandbox request
    other = b"kubernetes.io/config.seen" + b"\x12\x04\x0a\x00\x4a\x01"
    assert criproxy.rewrite(other) == other


def test_the_runc_wrapper_adds_the_guard_rule_and_runs_runc(tmp_path: Path) -> None:
    fake_runc = tmp_path / "runc"
    fake_runc.write_text(f"#!{sys.executable}\nimport sys, json\n"
                         "print(json.dumps(sys.argv[1:]))\n")
    fake_runc.chmod(0o755)
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(emulated.runc_wrapper_script(sys.executable, str(fake_runc),
                                                    "/run/guard.sock"))
    wrapper.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    profile: dict[str, Any] = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read", "execve"], "action": "SCMP_ACT_ALLOW"}]}
    for seccomp in (None, profile):
        spec: dict[str, Any] = {"linux": {"seccomp": seccomp} if seccomp else {}}
        (bundle / "config.json").write_text(json.dumps(spec))
        args = ["--root", "/r", "create", "--bundle", str(bundle), "--pid-file", "p", "id1"]
        done = subprocess.run([str(wrapper), *args], capture_output=True, text=True,
                              check=True)
        assert json.loads(done.stdout) == args
        got = json.loads((bundle / "config.json").read_text())["linux"]["seccomp"]
        assert got["listenerPath"] == "/run/guard.sock"
        assert got["syscalls"][0] == {"names": ["execve", "execveat"],
                                      "action": "SCMP_ACT_NOTIFY"}
        if seccomp is None:
            assert got["defaultAction"] == "SCMP_ACT_ALLOW" and len(got["syscalls"]) == 1
        else:
            assert got["defaultAction"] == "SCMP_ACT_ERRNO"
            assert got["syscalls"][1] == {"names": ["read"], "action": "SCMP_ACT_ALLOW"}
    (bundle / "config.json").write_text("{}")
    subprocess.run([str(wrapper), "state", "id1"], capture_output=True, check=True)
    assert (bundle / "config.json").read_text() == "{}"  # only create is edited


# --- real -----------------------------------------------------------------------------------


def _root() -> emulated.EmulatedRoot:
    why = missing_arm64_node()
    if why is not None:
        pytest.skip(why)
    debs = debs_dir()
    assert debs is not None
    return emulated.prepare_root(emulated.find_debs(debs), hostfx.ledger_dir())


@pytest.mark.realnode
def test_arm64_runs_in_the_namespace_and_x86_is_refused_with_runcs_words(
        tmp_path: Path) -> None:
    """Step 1 of issue #41, with the host's runc: a container joining the holder's user
    namespace runs arm64 busybox through that namespace's binfmt_misc; an x86-64
    entrypoint fails as runc on arm64 fails; on the host arm64 programs still fail."""
    root = _root()
    runc = str(find_runtime().runc)
    rootfs = tmp_path / "bundle" / "rootfs"
    for d in ("bin", "proc", "dev", "sys", "tmp"):
        (rootfs / d).mkdir(parents=True)
    (rootfs / "bin" / "busybox").write_bytes(busybox("arm64"))
    (rootfs / "bin" / "x86").write_bytes(busybox("amd64"))
    for f in ("busybox", "x86"):
        (rootfs / "bin" / f).chmod(0o755)
    (rootfs / "bin" / "sh").symlink_to("busybox")
    (rootfs / "bin" / "sleep").symlink_to("busybox")
    subprocess.run([runc, "spec", "-b", str(tmp_path / "bundle")], check=True)
    config = json.loads((tmp_path / "bundle" / "config.json").read_text())
    holder = binfmtns.start_holder(tmp_path / "binfmt", root.binfmt_interpreter,
                                   libroot=root.root)
    guard = subprocess.Popen([sys.executable, "-m", "podplacement.sandbox.execguard",
                              str(tmp_path / "guard.sock")], stdout=subprocess.PIPE, text=True)
    try:
        assert guard.stdout is not None and guard.stdout.readline().strip() == "ready"
        config["process"]["terminal"] = False
        config["linux"]["seccomp"] = {
            "defaultAction": "SCMP_ACT_ALLOW", "listenerPath": str(tmp_path / "guard.sock"),
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": ["execve", "execveat"], "action": "SCMP_ACT_NOTIFY"}]}
        results = {}
        for name, args in (("arm", ["/bin/sh", "-c", "echo on $(uname -m)"]),
                           # busybox's shell runs an applet as /proc/self/exe under the
                           # applet's name: the name must survive binfmt_misc (flag P)
                           ("applet", ["/bin/sh", "-c", "sleep 0 && echo slept"]),
                           ("x86", ["/bin/x86", "uname", "-m"])):
            config["process"]["args"] = args
            (tmp_path / "bundle" / "config.json").write_text(json.dumps(config))
            results[name] = subprocess.run(
                ["nsenter", f"--user=/proc/{holder.pid}/ns/user", "--", runc, "--root",
                 str(tmp_path / "runc"), "run", "--bundle", str(tmp_path / "bundle"),
                 f"t-{name}-{os.getpid()}"], capture_output=True, text=True,
                errors="replace", timeout=60, check=False)
        assert (results["arm"].returncode, results["arm"].stdout) == (0, "on aarch64\n")
        assert (results["applet"].returncode, results["applet"].stdout) == (0, "slept\n"), \
            results["applet"].stderr
        assert results["x86"].returncode == 1
        assert results["x86"].stderr.strip().endswith("exec /bin/x86: exec format error")
        with pytest.raises(OSError) as refused:
            subprocess.run([str(rootfs / "bin" / "busybox"), "true"], check=False)
        assert refused.value.errno == 8  # ENOEXEC: the host's binfmt_misc is untouched
        assert not any(t == "binfmt_misc" for _, t, _ in hostfx.mounts())
    finally:
        guard.terminate()
        holder.terminate()
        guard.wait(10)
        holder.wait(10)


@pytest.mark.realcluster
@pytest.mark.realnode
def test_the_arm64_node_starts_registers_as_arm64_and_stopping_leaves_the_host_as_before(
        tmp_path: Path) -> None:
    _root()
    before = hostfx.snapshot()
    beside = hostfx.holders()
    try:
        kube = start_real(tmp_path / "plane", nodes=FAKE_NODES_BESIDE_ARM64)
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    assert kube.plane is not None
    try:
        node = start_real_node(kube.plane, tmp_path / "node", arch="arm64", debs=debs_dir())
        try:
            got = kube.get(f"/api/v1/nodes/{ARM64_NODE_NAME}")
            assert got["metadata"]["labels"]["kubernetes.io/arch"] == "arm64"
            assert got["status"]["nodeInfo"]["containerRuntimeVersion"].startswith(
                "containerd://1.6")
            pids = [p.pid for p in node.helpers.values()]
        finally:
            assert node.stop() == []
        assert not any(os.path.exists(f"/proc/{pid}") and
                       open(f"/proc/{pid}/stat").read().split()[2] != "Z" for pid in pids)
        assert not Path(node.rundir).exists()
    finally:
        kube.stop()
    after = hostfx.snapshot()
    # another real node (another test process) leaves its own effects, not ours
    assert hostfx.own_differences(before, after, [*beside, *hostfx.holders()]) == []
    assert not any(t == "binfmt_misc" for _, t, _ in hostfx.mounts())
