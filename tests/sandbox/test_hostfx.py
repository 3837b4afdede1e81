"""The machine-wide ledger of real nodes: the first holder records the host, the last one
restores it, a holder whose process died is dropped (and what it left removed); and the
snapshot comparison names what changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podplacement.sandbox import hostfx


@pytest.fixture
def host_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Two stand-ins for the host directories (the real ones belong to real nodes)."""
    dirs = (str(tmp_path / "run-containerd"), str(tmp_path / "run-containerd" / "s"))
    monkeypatch.setattr(hostfx, "HOST_DIRS", dirs)
    return dirs


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_last_holder_removes_the_directories_that_were_absent(
        tmp_path: Path, host_dirs: tuple[str, str]) -> None:
    ledger = tmp_path / "ledger"
    first = hostfx.NodeFootprint(str(tmp_path / "podplacement-node-a"), "/podplacement-00000a",
                                 "/a.sock")
    second = hostfx.NodeFootprint(str(tmp_path / "podplacement-node-b"), "/podplacement-00000b",
                                  "/b.sock")
    hostfx.enter(first, ledger)
    os.makedirs(host_dirs[1])  # what containerd makes
    hostfx.enter(second, ledger)
    recorded = json.loads((ledger / hostfx.LEDGER_NAME).read_text())
    assert recorded["absent"] == list(host_dirs)
    assert recorded["sysctls"] == hostfx.read_sysctls()
    assert [n.workdir for n in hostfx.holders(ledger)] == [first.workdir, second.workdir]
    assert hostfx.leave(first, ledger) == []
    assert os.path.isdir(host_dirs[1])  # the second node still runs
    assert hostfx.leave(second, ledger) == []
    assert not os.path.exists(host_dirs[0])
    assert not (ledger / hostfx.LEDGER_NAME).exists()


def test_a_holder_whose_process_died_is_dropped(tmp_path: Path,
                                                host_dirs: tuple[str, str]) -> None:
    ledger = tmp_path / "ledger"
    dead_dir = tmp_path / "podplacement-node-dead"
    (dead_dir / "containerd").mkdir(parents=True)
    dead = hostfx.NodeFootprint(str(dead_dir), "/podplacement-0dead0", "/d.sock",
                                pid=_dead_pid())
    hostfx.enter(dead, ledger)
    os.makedirs(host_dirs[0])
    assert hostfx.holders(ledger) == []
    live = hostfx.NodeFootprint(str(tmp_path / "podplacement-node-live"), "/podplacement-00001e",
                                "/l.sock")
    hostfx.enter(live, ledger)  # the dead one's host is put back first, then recorded anew
    assert not os.path.exists(host_dirs[0])
    assert not dead_dir.exists()  # its own directory went with it
    doc = json.loads((ledger / hostfx.LEDGER_NAME).read_text())
    assert list(doc["holders"]) == [live.workdir]
    assert hostfx.leave(live, ledger) == []


@pytest.mark.parametrize("workdir, cgroup_root", [
    ("/", "/podplacement-00000a"), ("/tmp", "/podplacement-00000a"),
    ("relative/podplacement-node-x", "/podplacement-00000a"),
    ("/tmp/podplacement-node-x", "/"), ("/tmp/podplacement-node-x", "/kubepods"),
])
def test_nothing_but_a_node_s_own_directory_and_cgroup_root_is_ever_cleaned(
        workdir: str, cgroup_root: str) -> None:
    with pytest.raises(ValueError):
        hostfx.NodeFootprint(workdir, cgroup_root, "/x.sock")


def test_a_damaged_ledger_entry_is_dropped_not_cleaned(tmp_path: Path,
                                                       host_dirs: tuple[str, str]) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (ledger / hostfx.LEDGER_NAME).write_text(json.dumps({"holders": {"/": {
        "workdir": "/", "cgroup_root": "/", "socket": "/s", "pid": _dead_pid()}}}))
    node = hostfx.NodeFootprint(str(tmp_path / "podplacement-node-n"), "/podplacement-00000f",
                                "/n.sock")
    hostfx.enter(node, ledger)
    assert list(json.loads((ledger / hostfx.LEDGER_NAME).read_text())["holders"]) == [
        node.workdir]
    assert hostfx.leave(node, ledger) == []


def test_differences_name_what_a_node_left() -> None:
    before = hostfx.HostSnapshot({"kernel/panic": "1"}, {"/sys/fs/cgroup/cpu": frozenset()},
                                 frozenset({("/", "ext4", "/dev/vda")}), frozenset())
    after = hostfx.HostSnapshot({"kernel/panic": "10"},
                                {"/sys/fs/cgroup/cpu": frozenset({"podplacement-x"})},
                                frozenset({("/", "ext4", "/dev/vda"), ("/t/shm", "tmpfs", "shm")}),
                                frozenset(), frozenset({"/var/lib/cni"}))
    assert hostfx.differences(before, after) == [
        "sysctl kernel/panic: 1 -> 10", "cgroup /sys/fs/cgroup/cpu/podplacement-x",
        "mount /t/shm (tmpfs shm)", "directory /var/lib/cni"]
    assert hostfx.differences(after, before) == ["sysctl kernel/panic: 10 -> 1"]


def test_own_differences_leave_out_what_other_nodes_account_for() -> None:
    other = hostfx.NodeFootprint("/tmp/podplacement-node-other", "/podplacement-0000aa",
                                 "/tmp/podplacement-node-other/containerd.sock")
    before = hostfx.HostSnapshot({"net/ipv4/ip_forward": "0"},
                                 {"/sys/fs/cgroup/cpu": frozenset()}, frozenset(), frozenset())
    after = hostfx.HostSnapshot(
        {"net/ipv4/ip_forward": "1"},
        {"/sys/fs/cgroup/cpu": frozenset({"podplacement-0000aa", "podplacement-0000bb"})},
        frozenset({("/tmp/podplacement-node-other/shm", "tmpfs", "shm"),
                   ("/tmp/podplacement-node-mine/shm", "tmpfs", "shm")}),
        frozenset(), frozenset({"/var/lib/cni"}))
    # alone: every difference is ours
    assert len(hostfx.own_differences(before, after, [])) == 6
    # beside another node: its cgroup and mount, and the shared sysctl and directory, go
    assert hostfx.own_differences(before, after, [other]) == [
        "cgroup /sys/fs/cgroup/cpu/podplacement-0000bb",
        "mount /tmp/podplacement-node-mine/shm (tmpfs shm)"]
