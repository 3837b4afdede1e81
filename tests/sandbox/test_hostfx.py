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
    first = hostfx.NodeFootprint(str(tmp_path / "a"), "/podplacement-test-a", "/a.sock")
    second = hostfx.NodeFootprint(str(tmp_path / "b"), "/podplacement-test-b", "/b.sock")
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
    dead = hostfx.NodeFootprint(str(tmp_path / "dead"), "/podplacement-test-dead", "/d.sock",
                                pid=_dead_pid())
    hostfx.enter(dead, ledger)
    os.makedirs(host_dirs[0])
    assert hostfx.holders(ledger) == []
    live = hostfx.NodeFootprint(str(tmp_path / "live"), "/podplacement-test-live", "/l.sock")
    hostfx.enter(live, ledger)  # the dead one's host is put back first, then recorded anew
    assert not os.path.exists(host_dirs[0])
    doc = json.loads((ledger / hostfx.LEDGER_NAME).read_text())
    assert list(doc["holders"]) == [live.workdir]
    assert hostfx.leave(live, ledger) == []


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
