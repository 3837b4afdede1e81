"""The host effects of a real node of the sandbox, and how they are undone.

A kubelet and containerd change the machine beyond the directories we give them
(``../shared/k8s-bin/README.md``, "Host effects to undo on stop"): the kubelet sets kernel
sysctls at start (:data:`KUBELET_SYSCTLS`); the kubelet and the containers make cgroups
(under the node's own cgroup root here, in every hierarchy); mounts appear under the node's
directory (the kubelet's shared bind mount, overlay root file systems, network namespaces,
shm, projected volumes); ``containerd-shim-runc-v2`` processes outlive containerd; and a few
host directories appear whatever the configuration says (:data:`HOST_DIRS`).

Two nodes may run at once on one machine (the demo and a test run, two pytest workers), so
the machine-wide part (sysctls, host directories) is kept in a ledger shared by every node:
``realnode-host.json`` beside the binaries cache, under a lock file. The first node to
start records the values before any node ran; the last to stop restores them and removes
the directories that did not exist. A holder whose process died is dropped at the next
start or stop and its own leftovers (processes in its cgroups, shims, mounts, cgroups) are
removed then.

:func:`snapshot` and :func:`differences` let a test check that the host is as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("podplacement.sandbox")

#: The sysctls (``/proc/sys`` paths) the kubelet sets at start
#: (``pkg/kubelet/cm/container_manager_linux.go`` ``setupKernelTunables``).
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")
#: Host directories that appear whatever the configuration says: containerd's shim socket
#: directory (``runtime/v2/shim`` ``SocketAddress``), libcni's cache, the kubelet's device
#: plugin directory and container log links. Parents before children.
HOST_DIRS = ("/run/containerd", "/run/containerd/s", "/var/lib/cni",
             "/var/lib/kubelet", "/var/lib/kubelet/device-plugins", "/var/log/containers")
#: The mounted cgroup hierarchies' parent.
CGROUP_FS = Path("/sys/fs/cgroup")
#: The shim binary whose processes are ours when their ``-address`` is our socket.
SHIM = "containerd-shim-runc-v2"
#: Where the ledger lives (beside the binaries cache, :func:`ledger_dir`).
LEDGER_NAME = "realnode-host.json"
#: The names a node's directory and cgroup root start with; nothing else is ever cleaned
#: (a damaged ledger must not make :func:`clean_node` unmount, kill or remove anything else).
NODE_DIR_PREFIX = "podplacement-node-"
CGROUP_ROOT_PATTERN = re.compile(r"^/podplacement-[0-9a-f]{6,32}$")


def ledger_dir() -> Path:
    """The parent of the binaries cache (:func:`podplacement.sandbox.controlplane.
    default_cache_dir`): ``$PODPLACEMENT_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/
    podplacement``."""
    from podplacement.sandbox.controlplane import default_cache_dir

    return default_cache_dir().parent


# --- reading the host ---------------------------------------------------------------------


def read_sysctls() -> dict[str, str]:
    """``{path under /proc/sys: value}`` of :data:`KUBELET_SYSCTLS` (unreadable ones left
    out)."""
    out = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = (Path("/proc/sys") / name).read_text().strip()
    return out


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies: each directory of :data:`CGROUP_FS` that holds
    ``cgroup.procs`` (v1 hierarchies, the v2 ``unified`` one), or :data:`CGROUP_FS` itself
    when it is a v2 mount."""
    if (CGROUP_FS / "cgroup.procs").is_file():
        return [CGROUP_FS]
    try:
        found = [p for p in sorted(CGROUP_FS.iterdir())
                 if not p.is_symlink() and (p / "cgroup.procs").is_file()]
    except OSError:
        return []
    return found


def mounts() -> list[tuple[str, str, str]]:
    """``(mount point, file system type, source)`` of every line of
    ``/proc/self/mountinfo``, in its order (proc(5): octal escapes decoded)."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 2:
                point = fields[4].encode().decode("unicode_escape")
                out.append((point, rest[0], rest[1]))
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def shim_pids(address: str | None = None) -> set[int]:
    """Pids of the :data:`SHIM` processes, only those serving containerd at ``address``
    (its ``-address`` argument) when given."""
    out = set()
    for pid in _pids():
        args = _cmdline(pid)
        if not args or os.path.basename(args[0]) != SHIM:
            continue
        if address is None or any(a == "-address" and i + 1 < len(args)
                                  and args[i + 1] == address for i, a in enumerate(args)):
            out.add(pid)
    return out


@dataclass(frozen=True)
class HostSnapshot:
    """What a real node may change on the host.

    Attributes:
        sysctls: :func:`read_sysctls`.
        cgroups: per hierarchy, its top-level cgroup directories.
        mounts: :func:`mounts` as a set.
        shims: :func:`shim_pids` (every shim).
        host_dirs: those of :data:`HOST_DIRS` that exist.
    """

    sysctls: dict[str, str]
    cgroups: dict[str, frozenset[str]]
    mounts: frozenset[tuple[str, str, str]]
    shims: frozenset[int]
    host_dirs: frozenset[str] = field(default_factory=frozenset)


def snapshot() -> HostSnapshot:
    """The host as it is now (see :class:`HostSnapshot`)."""
    cgroups = {}
    for h in cgroup_hierarchies():
        with contextlib.suppress(OSError):
            cgroups[str(h)] = frozenset(p.name for p in h.iterdir() if p.is_dir())
    return HostSnapshot(read_sysctls(), cgroups, frozenset(mounts()), frozenset(shim_pids()),
                        frozenset(d for d in HOST_DIRS if os.path.lexists(d)))


def differences(before: HostSnapshot, after: HostSnapshot) -> list[str]:
    """What ``after`` has that ``before`` had not, or changed, one line each: sysctl
    values, new top-level cgroups, new mounts, new shim processes, new host directories.
    Mounts and cgroups that went away are not differences (others' business)."""
    out = [f"sysctl {k}: {before.sysctls.get(k)} -> {v}"
           for k, v in after.sysctls.items() if before.sysctls.get(k) != v]
    for h, names in after.cgroups.items():
        out += [f"cgroup {h}/{n}" for n in sorted(names - before.cgroups.get(h, frozenset()))]
    out += [f"mount {p} ({t} {s})" for p, t, s in sorted(after.mounts - before.mounts)]
    out += [f"shim process {pid}: {' '.join(_cmdline(pid))}"
            for pid in sorted(after.shims - before.shims)]
    out += [f"directory {d}" for d in sorted(after.host_dirs - before.host_dirs)]
    return out


def own_differences(before: HostSnapshot, after: HostSnapshot,
                    others: Sequence[NodeFootprint]) -> list[str]:
    """:func:`differences` less what other nodes account for: ``others`` are the nodes that
    ran beside this one (:func:`holders` when it started and when ``after`` was taken: a
    node may start or stop in between). Lines naming another node's directory or cgroup
    root are its own; with any other node, sysctl values and host directories are shared
    effects that the last node to :func:`leave` restores. With no other node, every
    difference counts."""
    if not others:
        return differences(before, after)
    return [d for d in differences(before, after)
            if not d.startswith(("sysctl ", "directory "))
            and not any(n.workdir in d or n.cgroup_root in d for n in others)]


# --- undoing one node's effects -------------------------------------------------------------


@dataclass(frozen=True)
class NodeFootprint:
    """Where one node acts: its own directory (every mount and process of the node names a
    path in it; removed once the node is cleaned; named ``NODE_DIR_PREFIX*``), its cgroup
    root (``/podplacement-<hex>``, the same in every hierarchy) and its containerd socket
    (the shims' ``-address``).

    Raises:
        ValueError: a directory or cgroup root not shaped so (nothing else is ever cleaned).

    Attributes:
        pid: the process that started the node (the ledger's holder).
    """

    workdir: str
    cgroup_root: str
    socket: str
    pid: int = field(default_factory=os.getpid)

    def __post_init__(self) -> None:
        path = Path(self.workdir)
        if not (path.is_absolute() and len(path.parts) >= 3
                and path.name.startswith(NODE_DIR_PREFIX) and ".." not in path.parts):
            raise ValueError(f"a node's directory must be /.../{NODE_DIR_PREFIX}*, "
                             f"not {self.workdir!r}")
        if not CGROUP_ROOT_PATTERN.match(self.cgroup_root):
            raise ValueError(f"a node's cgroup root must be /podplacement-<hex>, "
                             f"not {self.cgroup_root!r}")

    def key(self) -> str:
        """The ledger key (the directory: one node per directory)."""
        return self.workdir

    def as_json(self) -> dict[str, Any]:
        """The ledger entry."""
        return {"workdir": self.workdir, "cgroup_root": self.cgroup_root,
                "socket": self.socket, "pid": self.pid}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> NodeFootprint:
        """Back from :meth:`as_json`. Raises: KeyError, TypeError, ValueError on a bad
        entry."""
        return cls(str(doc["workdir"]), str(doc["cgroup_root"]), str(doc["socket"]),
                   int(doc["pid"]))


def create_cgroups(root: str) -> None:
    """Make the cgroup ``root`` (``/name``) in every hierarchy (the kubelet checks that its
    ``cgroupRoot`` exists in each); in cpuset, copy the parent's ``cpus`` and ``mems``
    (a new cpuset cgroup holds no task until they are set).

    Raises:
        OSError: a directory could not be made.
    """
    for h in cgroup_hierarchies():
        path = h / root.strip("/")
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (h / name).is_file() and not (path / name).read_text().strip():
                (path / name).write_text((h / name).read_text())


def _cgroup_dirs(root: str) -> list[Path]:
    """Every cgroup directory under ``root`` in every hierarchy, deepest first."""
    found: list[Path] = []
    for h in cgroup_hierarchies():
        top = h / root.strip("/")
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(root: str) -> set[int]:
    """Pids of the processes in any cgroup under ``root``, in any hierarchy."""
    out: set[int] = set()
    for d in _cgroup_dirs(root):
        with contextlib.suppress(OSError):
            out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
    return out


def kill_pids(pids: set[int], what: str, wait: float = 5.0) -> None:
    """SIGKILL each pid (logged with ``what``) and wait up to ``wait`` seconds for them to
    be gone (or zombies)."""
    for pid in sorted(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            log.info("killed %s (pid %d)", what, pid)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def unmount_under(directory: str) -> list[str]:
    """Unmount every mount at or below ``directory``, the newest first (``umount``, then a
    lazy one when busy). Returns the mount points that stay."""
    prefix = directory.rstrip("/") + "/"
    for _ in range(3):
        points = [p for p, _, _ in mounts() if p == directory or p.startswith(prefix)]
        if not points:
            return []
        for point in reversed(points):
            done = subprocess.run(["umount", point], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return [p for p, _, _ in mounts() if p == directory or p.startswith(prefix)]


def remove_cgroups(root: str, wait: float = 5.0) -> list[str]:
    """rmdir every cgroup under ``root`` in every hierarchy, deepest first, retrying while
    dying processes leave them (up to ``wait`` seconds). Returns those that stay."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for d in _cgroup_dirs(root):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(str(d))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def workdir_pids(workdir: str) -> set[int]:
    """Pids of the processes (this one excepted) whose command line names a path in
    ``workdir``: a node's kubelet (``--config=WORKDIR/...``) and containerd (``--config
    WORKDIR/...``) when the process that started them died without stopping them."""
    prefix = workdir.rstrip("/") + "/"
    own = os.getpid()
    out = set()
    for pid in _pids():
        if pid != own and any(prefix in arg for arg in _cmdline(pid)[1:]):
            out.add(pid)
    return out


def clean_node(node: NodeFootprint) -> list[str]:
    """Remove what one node left once its kubelet and containerd are stopped (or their
    starter died): SIGKILL, by pid, the processes that still run from its directory, the
    processes in its cgroups (containers) and its shims; unmount everything under its
    directory; remove its cgroups, then its directory when nothing is mounted there any
    more. Returns what could not be removed (one line each; empty when all went)."""
    kill_pids(workdir_pids(node.workdir), "node process")
    kill_pids(cgroup_pids(node.cgroup_root), "container process")
    kill_pids(shim_pids(node.socket), SHIM)
    mounted = unmount_under(node.workdir)
    left = [f"mount {p}" for p in mounted]
    left += [f"cgroup {c}" for c in remove_cgroups(node.cgroup_root)]
    if not mounted:
        shutil.rmtree(node.workdir, ignore_errors=True)
    return left


# --- the machine-wide ledger ----------------------------------------------------------------


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / (LEDGER_NAME + ".lock"), "wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield directory / LEDGER_NAME


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _pid_alive(pid: int) -> bool:
    return pid > 0 and _alive(pid)


def _drop_dead(doc: dict[str, Any]) -> None:
    holders = doc.setdefault("holders", {})
    for key, entry in list(holders.items()):
        try:
            node = NodeFootprint.from_json(entry)
        except (KeyError, TypeError, ValueError):
            holders.pop(key)
            continue
        if not _pid_alive(node.pid):
            log.warning("a real node whose process %d ended without stopping it: removing "
                        "what it left in %s", node.pid, node.workdir)
            clean_node(node)
            holders.pop(key)


def _restore(doc: Mapping[str, Any]) -> list[str]:
    """Put back the recorded sysctls and remove the host directories that were absent."""
    left = []
    for name, value in (doc.get("sysctls") or {}).items():
        if name not in KUBELET_SYSCTLS:
            continue
        path = Path("/proc/sys") / name
        try:
            if path.read_text().strip() != value:
                path.write_text(value)
                log.info("restored sysctl %s = %s", name.replace("/", "."), value)
        except OSError as exc:
            left.append(f"sysctl {name}: {exc}")
    for d in reversed(doc.get("absent") or []):
        if d in HOST_DIRS and os.path.lexists(d):
            shutil.rmtree(d, ignore_errors=True)
            if os.path.lexists(d):
                left.append(f"directory {d}")
            else:
                log.info("removed %s (absent before the first real node)", d)
    return left


def enter(node: NodeFootprint, directory: Path | None = None) -> None:
    """Register ``node`` in the ledger before it starts. The first live holder records the
    sysctls and which :data:`HOST_DIRS` are absent (after putting back what dead holders
    left: their recorded values are the host's)."""
    with _locked(directory or ledger_dir()) as path:
        doc = _load(path)
        _drop_dead(doc)
        if not doc.get("holders"):
            _restore(doc)
            doc = {"sysctls": read_sysctls(),
                   "absent": [d for d in HOST_DIRS if not os.path.lexists(d)], "holders": {}}
        doc["holders"][node.key()] = node.as_json()
        path.write_text(json.dumps(doc, indent=1))


def leave(node: NodeFootprint, directory: Path | None = None) -> list[str]:
    """Unregister ``node`` after :func:`clean_node`; the last live holder restores the
    sysctls and removes the host directories that were absent, then the ledger. Returns
    what could not be restored (one line each)."""
    with _locked(directory or ledger_dir()) as path:
        doc = _load(path)
        doc.setdefault("holders", {}).pop(node.key(), None)
        _drop_dead(doc)
        if doc["holders"]:
            path.write_text(json.dumps(doc, indent=1))
            return []
        left = _restore(doc)
        path.unlink(missing_ok=True)
        return left


def holders(directory: Path | None = None) -> list[NodeFootprint]:
    """The live nodes of the ledger (dead ones are not listed; nothing is changed)."""
    with _locked(directory or ledger_dir()) as path:
        doc = _load(path)
    out = []
    for entry in (doc.get("holders") or {}).values():
        with contextlib.suppress(KeyError, TypeError, ValueError):
            node = NodeFootprint.from_json(entry)
            if _pid_alive(node.pid):
                out.append(node)
    return out
