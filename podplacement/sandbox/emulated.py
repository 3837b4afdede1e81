"""What an emulated arm64 node needs on this amd64 machine: Debian's packages, extracted
(never installed), and the runc wrapper that puts its containers under the exec guard.

- :data:`ARM64_PACKAGES`: ``qemu-user-static`` (amd64: ``qemu-aarch64-static``, taken
  from its ``.deb`` with ``dpkg-deb -x``; the package itself is never installed, since with
  ``binfmt-support`` it would register qemu in the host's own ``binfmt_misc``),
  ``containerd`` (arm64: an arm64 containerd picks the arm64 entry of an index, as a real
  arm64 node's does), ``libc6`` and ``libseccomp2`` (arm64: containerd's libraries).
  ``hack/fetch-debs.sh`` downloads them (``apt-get download``) beside busybox-static.
- :func:`prepare_root` extracts them once into a cache directory named by the packages'
  file names (merged ``/usr``: ``lib/`` moved into ``usr/lib/``).
- :func:`runc_wrapper_script`: the program containerd's runc shim runs instead of runc. On
  ``create`` it adds to the bundle's ``config.json`` a seccomp rule sending ``execve`` and
  ``execveat`` to the node's exec guard (:mod:`podplacement.sandbox.execguard`), then runs
  the host's runc.

runc itself is the host's amd64 runc 1.1.5 (Debian's, the same version as the arm64
package): Debian's arm64 runc under qemu-user 7.2 does not start a container ("runc run
failed: unable to start container process: waiting for init preliminary setup: read
init-p: connection reset by peer"; qemu-user does not emulate ``openat2`` nor the
namespace ``clone`` of runc's ``nsexec``). The shim is the host's too. Both run inside
the node's user namespace (children of its containerd), so every container process is
in that namespace and its arm64 programs run through its ``binfmt_misc``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ARM64_PACKAGES",
    "MIN_KERNEL",
    "EmulatedRoot",
    "EmulationUnavailable",
    "find_debs",
    "kernel_supports_binfmt_namespaces",
    "prepare_root",
    "runc_wrapper_script",
]

#: ``{package: the .deb's architecture}`` of an emulated arm64 node.
ARM64_PACKAGES = {"qemu-user-static": "amd64", "containerd": "arm64", "libc6": "arm64",
                  "libseccomp2": "arm64"}
#: The first Linux whose user namespaces may each have their own ``binfmt_misc``.
MIN_KERNEL = (6, 7)
#: The seccomp architectures of the rule the wrapper adds (the host's syscalls: qemu-user
#: turns an arm64 program's calls into x86-64 ones).
SECCOMP_ARCHES = ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]


class EmulationUnavailable(Exception):
    """This machine can't run the emulated node; ``str(exc)`` is the one-line reason."""


@dataclass(frozen=True)
class EmulatedRoot:
    """The extracted packages.

    Attributes:
        root: the directory (``usr/lib/aarch64-linux-gnu``, ``usr/lib/ld-linux-aarch64.so.1``,
            ``usr/bin/containerd``, ``usr/bin/qemu-aarch64-static``...).
    """

    root: Path

    @property
    def qemu(self) -> Path:
        """qemu-user for arm64 (a static x86-64 program)."""
        return self.root / "usr" / "bin" / "qemu-aarch64-static"

    @property
    def binfmt_interpreter(self) -> Path:
        """What ``binfmt_misc`` runs arm64 programs with: Debian's
        ``usr/libexec/qemu-binfmt/aarch64-binfmt-P``, a link to :attr:`qemu` whose name tells
        qemu that the kernel keeps the program's own ``argv[0]`` (flag ``P``, as Debian's
        ``usr/share/binfmts/qemu-aarch64`` registers it: ``preserve yes``). Without it a
        program that runs itself again under another name (busybox's shell running an
        applet through ``/proc/self/exe``) gets the first program's name instead."""
        return self.root / "usr" / "libexec" / "qemu-binfmt" / "aarch64-binfmt-P"

    @property
    def containerd(self) -> Path:
        """Debian's arm64 containerd."""
        return self.root / "usr" / "bin" / "containerd"


def kernel_supports_binfmt_namespaces(release: str | None = None) -> bool:
    """Whether the kernel ``release`` (``os.uname().release`` by default, e.g.
    ``6.18.44-fc``) is :data:`MIN_KERNEL` or newer."""
    text = release if release is not None else os.uname().release
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece[:4] if c.isdigit())
        if not digits or not piece[:1].isdigit():
            return False
        parts.append(int(digits))
    return len(parts) == 2 and (parts[0], parts[1]) >= MIN_KERNEL


def find_debs(directory: Path) -> dict[str, Path]:
    """``{package: .deb}`` of :data:`ARM64_PACKAGES` in ``directory`` (the newest name of
    each when several).

    Raises:
        EmulationUnavailable: one is missing (the message says which and how to get it).
    """
    found: dict[str, Path] = {}
    missing = []
    for package, arch in ARM64_PACKAGES.items():
        candidates = sorted(directory.glob(f"{package}_*_{arch}.deb"))
        if candidates:
            found[package] = candidates[-1]
        else:
            missing.append(f"{package}:{arch}")
    if missing:
        raise EmulationUnavailable(
            f"no {', '.join(missing)} .deb in {directory}: run hack/fetch-debs.sh")
    return found


def prepare_root(debs: dict[str, Path], cache: Path, timeout: float = 120.0) -> EmulatedRoot:
    """Extract ``debs`` (:func:`find_debs`) with ``dpkg-deb -x`` into
    ``cache/arm64-root-<hash of their names>`` unless there already (a finished extraction
    is renamed into place: a half-done one is never used).

    Raises:
        EmulationUnavailable: ``dpkg-deb`` is missing or failed, or qemu or containerd is
            not where expected.
    """
    key = hashlib.sha256("\n".join(sorted(p.name for p in debs.values())).encode())
    target = cache / f"arm64-root-{key.hexdigest()[:16]}"
    done = EmulatedRoot(target)
    if done.qemu.is_file() and done.containerd.is_file():
        return done
    dpkg = shutil.which("dpkg-deb")
    if dpkg is None:
        raise EmulationUnavailable("no dpkg-deb (Debian's dpkg) to extract the arm64 packages")
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".arm64-root-", dir=cache))
    try:
        for deb in debs.values():
            r = subprocess.run([dpkg, "-x", str(deb), str(work)], capture_output=True,
                               text=True, timeout=timeout, check=False)
            if r.returncode != 0:
                raise EmulationUnavailable(f"dpkg-deb -x {deb.name}: "
                                           f"{r.stderr.strip().splitlines()[-1:]}")
        lib, usr_lib = work / "lib", work / "usr" / "lib"
        if lib.is_dir() and not lib.is_symlink():
            shutil.copytree(lib, usr_lib, symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(lib)
            lib.symlink_to("usr/lib")
        staged = EmulatedRoot(work)
        if not (staged.qemu.is_file() and staged.containerd.is_file()):
            raise EmulationUnavailable(f"the packages hold no {staged.qemu.name} or "
                                       "containerd")
        try:
            work.rename(target)
        except OSError:  # another process finished first
            if not (done.qemu.is_file() and done.containerd.is_file()):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done


def runc_wrapper_script(python: str, runc: str, listener: str) -> str:
    """The runc wrapper (module docstring) as a Python script run by ``python`` (isolated
    mode, no site): on ``create --bundle DIR``, it rewrites ``DIR/config.json`` so that
    ``linux.seccomp`` has ``listenerPath`` = ``listener`` and, first, a rule
    ``SCMP_ACT_NOTIFY`` for ``execve`` and ``execveat`` (taken out of every other rule; a
    spec without seccomp gets a profile allowing everything else); then it runs ``runc``
    with the same arguments. A config it can't read is left as is (runc then reports)."""
    return f'''#!{python} -IS
"""podplacement's runc wrapper of the emulated arm64 node (podplacement.sandbox.emulated):
every exec of a container goes to the exec guard first."""
import json
import os
import sys

RUNC = {json.dumps(runc)}
LISTENER = {json.dumps(listener)}
EXECS = ("execve", "execveat")
args = sys.argv[1:]
if "create" in args:
    rest = args[args.index("create") + 1:]
    bundle = "."
    for i, arg in enumerate(rest):
        if arg in ("--bundle", "-b") and i + 1 < len(rest):
            bundle = rest[i + 1]
        elif arg.startswith("--bundle="):
            bundle = arg.split("=", 1)[1]
    path = os.path.join(bundle, "config.json")
    try:
        with open(path) as f:
            spec = json.load(f)
        linux = spec.setdefault("linux", {{}})
        seccomp = linux.get("seccomp") or {{"defaultAction": "SCMP_ACT_ALLOW",
                                          "architectures": {json.dumps(SECCOMP_ARCHES)}}}
        rules = []
        for rule in seccomp.get("syscalls") or []:
            names = [n for n in rule.get("names") or [] if n not in EXECS]
            if names:
                rules.append(dict(rule, names=names))
        seccomp["syscalls"] = [{{"names": list(EXECS), "action": "SCMP_ACT_NOTIFY"}}] + rules
        seccomp["listenerPath"] = LISTENER
        linux["seccomp"] = seccomp
        with open(path + ".tmp", "w") as f:
            json.dump(spec, f)
        os.replace(path + ".tmp", path)
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        print(f"runc wrapper: {{path}} left as is: {{exc}}", file=sys.stderr)
os.execv(RUNC, [RUNC, *args])
'''
