"""An image's root filesystem seen through its layers, and the program a container runs.

Pure: the caller reads the layers (newest first) and adds their tar entries here; this module
answers path lookups over the union, resolves paths like the kernel's path walk, searches
``PATH`` like the runtimes do, and follows a program to the file ``execve`` loads (through
``#!`` interpreters). Nothing here reads a network or a disk.

Rules and their sources:

- Layer changesets (OCI image-spec ``layer.md``, "Whiteouts"): a file ``.wh.<name>`` deletes
  ``<name>`` from the layers below; ``.wh..wh..opq`` in a directory hides everything the
  layers below hold in that directory; a whiteout never applies to entries of its own layer.
  Directories merge across layers; any other entry of an upper layer replaces what lower
  layers hold at that path, and a non-directory hides the lower layers' contents below it.
- Path walk (Linux ``fs/namei.c``): components left to right, ``..`` at ``/`` stays at ``/``
  (the container's root is its root), a symlink's absolute target restarts at ``/`` and a
  relative one at the symlink's directory, at most 40 symlinks (``MAXSYMLINKS``,
  ``include/linux/namei.h``), ELOOP after that.
- The program: a container runs ``command`` (else the image config's ``Entrypoint``) followed
  by ``args`` (else ``Cmd``); with neither ``command`` nor ``Entrypoint`` it runs ``Cmd``
  (Kubernetes ``Container.command``/``args`` reference; OCI image-spec ``config.md``). runc
  (``libcontainer/standard_init_linux.go``, ``exec.LookPath``) and crun
  (``src/libcrun/container.c``, ``libcrun_find_executable``) resolve a name without ``/``
  through ``PATH`` of the process environment, taking the first regular file with an execute
  bit; a name with ``/`` is used as it is, relative to the working directory.
- ``#!`` scripts (Linux ``fs/binfmt_script.c``): the interpreter path is opened as written,
  without a ``PATH`` search; at most 4 levels of interpreters (``fs/exec.c``
  ``search_binary_handler``, 5 in total with the program).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podplacement.imageinspect._elf import NotElf, parse_elf_header, parse_shebang, runs_on

FILE = "file"
DIR = "dir"
SYMLINK = "symlink"
HARDLINK = "hardlink"
OTHER = "other"

#: OCI image-spec layer.md whiteout prefix and the opaque-directory marker.
WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
#: Linux MAXSYMLINKS (include/linux/namei.h).
MAX_SYMLINKS = 40
#: Interpreter levels after the program (Linux fs/exec.c: 5 binfmt rounds in all).
MAX_INTERPRETERS = 4
#: containerd's and CRI-O's PATH for a process without one (containerd ``oci.DefaultPathEnv``).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

FOUND = "found"
MISSING = "missing"
UNKNOWN = "unknown"


def normalize(name: str, cwd: str = "/") -> str:
    """A tar member name or a path → an absolute, normalised path (``./bin/`` → ``/bin``;
    relative names start at ``cwd``). Lexical only: ``..`` is folded without looking at
    symlinks (what tar member names need; :meth:`RootFS.resolve` walks symlinks)."""
    joined = posixpath.join(cwd or "/", name)
    return posixpath.normpath("/" + joined.lstrip("/"))


def _ancestors(path: str) -> list[str]:
    """Proper ancestors of an absolute path, outermost first, ``/`` excluded."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass(frozen=True, slots=True)
class Entry:
    """One tar entry of a layer.

    Attributes:
        kind: :data:`FILE`, :data:`DIR`, :data:`SYMLINK`, :data:`HARDLINK` or :data:`OTHER`.
        mode: permission bits.
        link: a symlink's target as written, or a hard link's target path (normalised).
        head: the first bytes of a regular file with an execute bit (None: not kept).
        size: bytes of content.
    """

    kind: str
    mode: int = 0o755
    link: str | None = None
    head: bytes | None = None
    size: int = 0

    @property
    def executable(self) -> bool:
        """Any execute bit set."""
        return bool(self.mode & 0o111)


_IMPLIED_DIR = Entry(DIR)


class Layer:
    """One layer's entries as read so far (a layer is read whole before the next one).

    Attributes:
        complete: the layer's tar has been read to its end.
        entries: normalised path → :class:`Entry` (a later entry for a path replaces an
            earlier one, as when a tar is extracted).
        whiteouts: paths a ``.wh.`` file deletes from the layers below.
        opaque: directories whose lower contents ``.wh..wh..opq`` hides.
    """

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.implied: set[str] = set()
        self.whiteouts: set[str] = set()
        self.opaque: set[str] = set()
        self.complete = False

    def _imply(self, path: str) -> None:
        for parent in _ancestors(path):
            self.implied.add(parent)

    def add(self, name: str, entry: Entry) -> str:
        """Record one tar member: a whiteout, an opaque marker or an entry.

        Returns:
            the normalised path the member concerns (for a whiteout, the deleted path; for
            an opaque marker, its directory).
        """
        path = normalize(name)
        directory, base = posixpath.split(path)
        if base == OPAQUE_MARKER:
            self.opaque.add(directory)
            self._imply(path)
            return directory
        if base.startswith(WHITEOUT_PREFIX):
            target = posixpath.join(directory, base[len(WHITEOUT_PREFIX):])
            self.whiteouts.add(target)
            self._imply(path)
            return target
        self.entries[path] = entry
        self._imply(path)
        return path

    def lookup(self, path: str) -> tuple[str, Entry | None]:
        """This layer's word on ``path``: ``(FOUND, entry)``; ``(MISSING, None)`` when it
        hides the path from the layers below (a whiteout of the path or of an ancestor, an
        opaque ancestor, a non-directory ancestor); ``(UNKNOWN, None)`` when it says nothing
        (the layers below decide) or, while incomplete, may still say something."""
        entry = self.entries.get(path)
        if entry is not None:
            return FOUND, entry
        if path in self.implied or path == "/":
            return FOUND, _IMPLIED_DIR
        if path in self.whiteouts:
            return MISSING, None
        for parent in _ancestors(path):
            above = self.entries.get(parent)
            if above is not None and above.kind != DIR:
                return MISSING, None
            if parent in self.whiteouts or parent in self.opaque:
                return MISSING, None
        return UNKNOWN, None


@dataclass(frozen=True, slots=True)
class Resolution:
    """Where a path leads.

    Attributes:
        state: :data:`FOUND`, :data:`MISSING` (with ``reason``) or :data:`UNKNOWN` (the
            layers read so far cannot tell; ``path`` is the lookup that waits for more).
        path: the final path (found), or the path that is missing or undecided.
        entry: the entry found (for a hard link: the entry of the file it links to).
        layer: index of the layer holding it, 0 = the newest layer.
        via: the paths walked through on the way (symlinks, hard links, ``PATH`` tries).
        reason: why it is missing.
    """

    state: str
    path: str
    entry: Entry | None = None
    layer: int | None = None
    via: tuple[str, ...] = ()
    reason: str = ""


class RootFS:
    """The union of an image's layers, newest first, filled as they are read.

    Args:
        layer_count: how many layers the image has (after the last one is complete, a path
            no layer holds is missing rather than undecided).
    """

    def __init__(self, layer_count: int) -> None:
        self.layer_count = layer_count
        self.layers: list[Layer] = []

    def start_layer(self) -> Layer:
        """Begin the next (older) layer; the previous one must be complete.

        Raises:
            ValueError: the previous layer is incomplete, or every layer is read.
        """
        if self.layers and not self.layers[-1].complete:
            raise ValueError("the previous layer is not complete")
        if len(self.layers) >= self.layer_count:
            raise ValueError("every layer is read already")
        layer = Layer()
        self.layers.append(layer)
        return layer

    @property
    def exhausted(self) -> bool:
        """Every layer has been read to its end."""
        return len(self.layers) == self.layer_count and all(x.complete for x in self.layers)

    def lookup(self, path: str, start: int = 0) -> tuple[str, Entry | None, int | None]:
        """The merged view of ``path`` from layer ``start`` down: ``(state, entry,
        layer index)``."""
        if path == "/":
            return FOUND, _IMPLIED_DIR, None
        for index in range(start, len(self.layers)):
            layer = self.layers[index]
            state, entry = layer.lookup(path)
            if state == FOUND:
                return FOUND, entry, index
            if state == MISSING:
                return MISSING, None, None
            if not layer.complete:
                return UNKNOWN, None, None
        return (MISSING if self.exhausted else UNKNOWN), None, None

    def resolve(self, path: str, cwd: str = "/", follow: bool = True) -> Resolution:
        """Walk ``path`` (relative ones from ``cwd``) as the kernel does, following symlinks
        (the last component's too when ``follow``) and hard links.

        Returns:
            :class:`Resolution`; never raises.
        """
        start = path if path.startswith("/") else posixpath.join(cwd or "/", path)
        pending = [c for c in start.split("/") if c]
        current = "/"
        via: list[str] = []
        links = 0
        while pending:
            comp = pending.pop(0)
            if comp == ".":
                continue
            if comp == "..":
                current = posixpath.dirname(current) or "/"
                continue
            candidate = posixpath.join(current, comp)
            state, entry, layer = self.lookup(candidate)
            if state != FOUND or entry is None:
                return Resolution(state, candidate, via=tuple(via),
                                  reason="no such file or directory" if state == MISSING else "")
            last = not pending
            if entry.kind == SYMLINK and (follow or not last):
                links += 1
                if links > MAX_SYMLINKS:
                    return Resolution(MISSING, candidate, via=tuple(via),
                                      reason="too many levels of symbolic links")
                via.append(candidate)
                target = entry.link or ""
                pending = [c for c in target.split("/") if c] + pending
                if target.startswith("/"):
                    current = "/"
                continue
            if not last and entry.kind != DIR:
                return Resolution(MISSING, candidate, via=tuple(via), reason="not a directory")
            current = candidate
            if last:
                if entry.kind == HARDLINK:
                    return self._hardlink(candidate, entry, layer or 0, via)
                return Resolution(FOUND, candidate, entry, layer, tuple(via))
        state, entry, layer = self.lookup(current)
        return Resolution(FOUND, current, entry, layer, tuple(via))

    def _hardlink(self, path: str, entry: Entry, layer: int, via: list[str]) -> Resolution:
        """A hard link's content is its target's: a member archived earlier in the same tar,
        else (a link into a lower layer) whatever the layers from its own down hold there."""
        target = normalize(entry.link or "")
        same = self.layers[layer].entries.get(target)
        if same is not None and same.kind == FILE:
            return Resolution(FOUND, path, same, layer, (*via, path))
        state, found, index = self.lookup(target, layer)
        if state == FOUND and found is not None and found.kind == FILE:
            return Resolution(FOUND, path, found, index, (*via, path))
        return Resolution(state if state != FOUND else MISSING, target, via=(*via, path),
                          reason="hard link to something that is not a regular file")

    def find_program(self, name: str, path_env: str | None, cwd: str = "/") -> Resolution:
        """The file a runtime executes for ``argv[0] = name``: a name with ``/`` as it is
        (from ``cwd``), else the first regular file with an execute bit along ``path_env``
        (:data:`DEFAULT_PATH` when None; empty elements skipped).

        Returns:
            :class:`Resolution`: :data:`UNKNOWN` as soon as one candidate is undecided (an
            earlier ``PATH`` directory may still hold the name in a layer not read yet).
        """
        if not name:
            return Resolution(MISSING, name, reason="empty program name")
        if "/" in name:
            found = self.resolve(name, cwd)
            if found.state == FOUND and not _runnable(found.entry):
                return Resolution(MISSING, found.path, via=found.via,
                                  reason="not a regular file with an execute bit")
            return found
        tried: list[str] = []
        search = DEFAULT_PATH if path_env is None else path_env
        for directory in search.split(":"):
            if not directory:
                continue
            candidate = posixpath.join(directory, name)
            found = self.resolve(candidate, cwd)
            if found.state == UNKNOWN:
                return Resolution(UNKNOWN, found.path, via=(*tried, *found.via))
            if found.state == FOUND and _runnable(found.entry):
                return Resolution(FOUND, found.path, found.entry, found.layer,
                                  (*tried, candidate, *found.via))
            tried.append(candidate)
        return Resolution(MISSING, name, via=tuple(tried),
                          reason=f"not found in PATH {search!r}")


def _runnable(entry: Entry | None) -> bool:
    return entry is not None and entry.kind == FILE and entry.executable


def env_path(env: Sequence[str] | None) -> str | None:
    """The ``PATH`` value of an image config's ``Env`` (``["KEY=value", ...]``), or None."""
    for item in env or ():
        key, sep, value = str(item).partition("=")
        if sep and key == "PATH":
            return value
    return None


def program_of(config: Mapping[str, Any] | None, command: Sequence[str] | None = None,
               args: Sequence[str] | None = None) -> str | None:
    """``argv[0]`` of a container: ``command[0]``, else the image config's
    ``Entrypoint[0]``, else ``args[0]``, else ``Cmd[0]``.

    Args:
        config: the image config's ``config`` object (``Entrypoint``, ``Cmd``), or None.
        command, args: the pod container's ``command`` and ``args``, when known.
    Returns:
        the program name or path, or None when there is none.
    """
    config = config or {}
    entrypoint = list(config.get("Entrypoint") or [])
    cmd = list(config.get("Cmd") or [])
    if command:
        argv = list(command)
    elif entrypoint:
        argv = entrypoint
    elif args:
        argv = list(args)
    else:
        argv = cmd
    return str(argv[0]) if argv else None


@dataclass(frozen=True, slots=True)
class FileVerdict:
    """One file the check looked at: the program, then each interpreter.

    Attributes:
        name: what was looked up (``sh``, ``/bin/sh``, the ``#!`` interpreter).
        path: the path it resolved to (None: not found).
        kind: ``elf``, ``script``, ``other`` (neither: the kernel refuses it), or
            ``missing``.
        layer: index of the layer holding it (0 = newest).
        detail: e.g. ``ELF 64-bit LSB EM_X86_64 (amd64)`` or ``#!/bin/sh``.
        architecture: the ELF file's OCI architecture (None for others).
        machine: the ELF ``e_machine`` (None for others).
        via: the paths passed on the way (``PATH`` tries, symlinks, hard links).
    """

    name: str
    path: str | None
    kind: str
    layer: int | None = None
    detail: str = ""
    architecture: str | None = None
    machine: int | None = None
    via: tuple[str, ...] = ()


OK = "ok"
MISMATCH = "mismatch"
NOT_FOUND = "not-found"
NO_PROGRAM = "no-entrypoint"


@dataclass
class ProgramCheck:
    """Follows a container's program to the file the kernel loads, over a :class:`RootFS`
    filled layer by layer, and checks that file's ELF machine against the platform.

    Call :meth:`step` after each change that may matter (an entry at :attr:`waiting` or
    below it, and the end of each layer); it returns True once the outcome is known. A
    ``#!`` script leads to its interpreter; for ``#!/usr/bin/env prog`` the program ``env``
    starts is checked after ``env`` itself.

    Attributes:
        status: None while undecided; then :data:`OK`, :data:`MISMATCH` (an ELF file of
            another architecture, or a file that is neither ELF nor ``#!``),
            :data:`NOT_FOUND` or :data:`NO_PROGRAM`.
        files: the program, then each interpreter, as examined.
        waiting: the path whose lookup waits for more of the layers (None when not waiting).
        reason: one sentence on the outcome.
    """

    rootfs: RootFS
    program: str | None
    architecture: str
    path_env: str | None = None
    cwd: str = "/"
    status: str | None = None
    files: list[FileVerdict] = field(default_factory=list)
    waiting: str | None = None
    reason: str = ""
    #: what to look up next: (name, search PATH)
    _queue: list[tuple[str, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.program:
            self.status = NO_PROGRAM
            self.reason = "the image config has neither Entrypoint nor Cmd"
        else:
            self._queue = [(self.program, True)]

    def concerns(self, path: str) -> bool:
        """Whether a new entry at ``path`` may change the pending lookup."""
        waiting = self.waiting
        return waiting is not None and (path == waiting or path.startswith(waiting + "/"))

    def step(self) -> bool:
        """Advance as far as the layers read so far allow. Returns True when done."""
        while self.status is None:
            if not self._queue:
                self.status = OK
                return True
            target, search = self._queue[0]
            if search:
                found = self.rootfs.find_program(target, self.path_env, self.cwd)
            else:
                found = self.rootfs.resolve(target, self.cwd)
            if found.state == UNKNOWN:
                self.waiting = found.path
                return False
            self.waiting = None
            self._queue.pop(0)
            if found.state == MISSING or found.entry is None:
                self.files.append(FileVerdict(target, None, "missing", detail=found.reason,
                                              via=found.via))
                self.status = NOT_FOUND
                what = "program" if len(self.files) == 1 else "interpreter"
                self.reason = f"{what} {target!r} not found ({found.reason})"
                return True
            head = found.entry.head if found.entry.kind == FILE else None
            self._examine(target, found, head or b"")
        return True

    def _examine(self, target: str, found: Resolution, head: bytes) -> None:
        shebang = parse_shebang(head)
        if shebang is not None:
            line = f"#!{shebang.interpreter}" + (f" {shebang.argument}" if shebang.argument
                                                 else "")
            self.files.append(FileVerdict(target, found.path, "script", found.layer, line,
                                          via=found.via))
            if not shebang.interpreter or shebang.truncated:
                self.status = MISMATCH
                self.reason = f"{found.path}: unusable #! line: execve fails with ENOEXEC"
            elif len(self.files) > MAX_INTERPRETERS:
                self.status = MISMATCH
                self.reason = "too many levels of #! interpreters: execve fails with ELOOP"
            else:
                self._queue.insert(0, (shebang.interpreter, False))
                if posixpath.basename(shebang.interpreter) == "env" and shebang.argument:
                    names = [a for a in shebang.argument.split() if not a.startswith("-")]
                    if names:
                        self._queue.insert(1, (names[0], True))
            return
        try:
            header = parse_elf_header(head)
        except NotElf as exc:
            self.files.append(FileVerdict(target, found.path, "other", found.layer,
                                          f"neither ELF nor #! script ({exc})", via=found.via))
            self.status = MISMATCH
            self.reason = (f"{found.path} is neither an ELF file nor a #! script: execve "
                           "fails with ENOEXEC (exec format error)")
            return
        self.files.append(FileVerdict(target, found.path, "elf", found.layer,
                                      header.describe(), header.architecture, header.machine,
                                      found.via))
        if not runs_on(header.architecture, self.architecture):
            self.status = MISMATCH
            self.reason = f"{found.path} is {header.describe()}, not {self.architecture}"
        elif not self._queue:
            self.status = OK
            self.reason = f"{found.path} is {header.describe()}"
