"""The union of layers, path resolution, PATH search and the program check
(imageinspect._rootfs): pure, no tar involved."""

from __future__ import annotations

import pytest

from podplacement.imageinspect._elf import HEAD_BYTES
from podplacement.imageinspect._rootfs import (
    DIR,
    FILE,
    FOUND,
    HARDLINK,
    MISMATCH,
    MISSING,
    NO_PROGRAM,
    NOT_FOUND,
    OK,
    SYMLINK,
    UNKNOWN,
    Entry,
    ProgramCheck,
    RootFS,
    env_path,
    normalize,
    program_of,
)
from tests.imageinspect._images import elf

Spec = dict[str, "Entry | None"]  # path -> entry; None: a whiteout of that path


def exe(arch: str) -> Entry:
    return Entry(FILE, 0o755, None, elf(arch)[:HEAD_BYTES], 4096)


def script(text: str) -> Entry:
    return Entry(FILE, 0o755, None, text.encode()[:HEAD_BYTES], len(text))


def link(target: str) -> Entry:
    return Entry(SYMLINK, 0o777, target)


def rootfs(*layers: list[tuple[str, Entry]], complete: int | None = None) -> RootFS:
    """Layers newest first; each a list of (tar member name, entry). The first ``complete``
    layers are complete (default: all)."""
    fs = RootFS(len(layers))
    for i, members in enumerate(layers):
        layer = fs.start_layer()
        for name, entry in members:
            layer.add(name, entry)
        layer.complete = complete is None or i < complete
        if not layer.complete:
            break
    return fs


def test_normalize_tar_names() -> None:
    assert normalize("./bin/") == "/bin"
    assert normalize("usr/bin/../lib") == "/usr/lib"
    assert normalize("../../etc") == "/etc"
    assert normalize("app", "/work") == "/work/app"


def test_upper_layer_replaces_a_file() -> None:
    fs = rootfs([("bin/app", exe("arm64"))], [("bin/app", exe("amd64"))])
    found = fs.resolve("/bin/app")
    assert found.state == FOUND and found.layer == 0
    assert found.entry is not None and found.entry.head == elf("arm64")[:HEAD_BYTES]


def test_whiteout_deletes_the_lower_file() -> None:
    fs = rootfs([("bin/.wh.app", Entry(FILE, 0o644))], [("bin/app", exe("amd64"))])
    assert fs.resolve("/bin/app").state == MISSING


def test_whiteout_of_a_directory_deletes_everything_below_it() -> None:
    fs = rootfs([("opt/.wh.tool", Entry(FILE, 0o644))], [("opt/tool/bin/run", exe("amd64"))])
    assert fs.resolve("/opt/tool/bin/run").state == MISSING


def test_whiteout_does_not_apply_to_its_own_layer() -> None:
    fs = rootfs([("bin/.wh.app", Entry(FILE, 0o644)), ("bin/app", exe("arm64"))],
                [("bin/app", exe("amd64"))])
    found = fs.resolve("/bin/app")
    assert found.state == FOUND and found.layer == 0


def test_opaque_directory_hides_lower_contents_but_not_its_own() -> None:
    fs = rootfs([("app/.wh..wh..opq", Entry(FILE, 0o644)), ("app/new", exe("arm64"))],
                [("app/old", exe("amd64")), ("app/new", exe("amd64"))])
    assert fs.resolve("/app/old").state == MISSING
    assert fs.resolve("/app/new").layer == 0


def test_directories_merge_across_layers() -> None:
    fs = rootfs([("usr/bin/top", exe("arm64"))], [("usr/bin/bottom", exe("arm64"))])
    assert fs.resolve("/usr/bin/bottom").layer == 1
    assert fs.resolve("/usr/bin/top").layer == 0


def test_upper_non_directory_hides_the_lower_directory() -> None:
    fs = rootfs([("opt", Entry(FILE, 0o644))], [("opt/tool", exe("amd64"))])
    found = fs.resolve("/opt/tool")
    assert found.state == MISSING and found.reason == "not a directory"


def test_usr_merge_symlink_in_a_lower_layer_is_followed() -> None:
    fs = rootfs([("usr/bin/sh", link("dash"))],
                [("bin", link("usr/bin")), ("usr/bin/dash", exe("amd64"))])
    found = fs.resolve("/bin/sh")
    assert found.state == FOUND and found.path == "/usr/bin/dash"
    assert found.via == ("/bin", "/usr/bin/sh")


def test_absolute_symlink_restarts_at_the_containers_root() -> None:
    fs = rootfs([("usr/local/bin/app", link("/opt/app/../app/run")),
                 ("opt/app/run", exe("arm64"))])
    assert fs.resolve("/usr/local/bin/app").path == "/opt/app/run"


def test_dotdot_at_root_stays_at_root() -> None:
    fs = rootfs([("bin/sh", link("../../../../bin/busybox")), ("bin/busybox", exe("amd64"))])
    assert fs.resolve("/bin/sh").path == "/bin/busybox"


def test_symlink_loop_is_eloop() -> None:
    fs = rootfs([("a", link("b")), ("b", link("a"))])
    found = fs.resolve("/a")
    assert found.state == MISSING and "symbolic links" in found.reason


def test_hardlink_reads_its_target_in_the_same_layer() -> None:
    fs = rootfs([("bin/busybox", exe("s390x")), ("bin/sh", Entry(HARDLINK, 0o755, "bin/busybox"))])
    found = fs.resolve("/bin/sh")
    assert found.state == FOUND and found.path == "/bin/sh"
    assert found.entry is not None and found.entry.head == elf("s390x")[:HEAD_BYTES]


def test_lookup_in_a_partial_layer_waits_then_decides() -> None:
    fs = rootfs([("bin/other", exe("amd64"))], [("bin/app", exe("amd64"))], complete=0)
    assert fs.resolve("/bin/app").state == UNKNOWN
    fs.layers[0].complete = True
    assert fs.resolve("/bin/app").state == UNKNOWN  # the lower layer is not read yet
    second = fs.start_layer()
    second.add("bin/app", exe("amd64"))
    assert fs.resolve("/bin/app").state == FOUND


def test_found_in_a_partial_layer_is_final() -> None:
    fs = rootfs([("bin/app", exe("arm64"))], [], complete=0)
    assert fs.resolve("/bin/app").state == FOUND


def test_path_search_takes_the_first_executable_regular_file() -> None:
    fs = rootfs([("usr/local/bin/tool", Entry(FILE, 0o644, None, b"x", 1)),
                 ("usr/bin/tool", Entry(DIR)), ("bin/tool", exe("arm64"))])
    found = fs.find_program("tool", "/usr/local/bin:/usr/bin:/bin")
    assert found.state == FOUND and found.path == "/bin/tool"
    assert found.via[:2] == ("/usr/local/bin/tool", "/usr/bin/tool")


def test_path_search_waits_while_an_earlier_directory_is_undecided() -> None:
    fs = rootfs([("bin/tool", exe("arm64"))], [], complete=1)
    assert fs.find_program("tool", "/usr/bin:/bin").state == UNKNOWN


def test_path_search_missing_name_and_default_path() -> None:
    fs = rootfs([("sbin/init", exe("amd64"))])
    assert fs.find_program("init", None).path == "/sbin/init"
    missing = fs.find_program("nope", "/bin")
    assert missing.state == MISSING and "PATH" in missing.reason


def test_name_with_a_slash_is_relative_to_the_working_directory() -> None:
    fs = rootfs([("work/bin/app", exe("amd64"))])
    assert fs.find_program("bin/app", "/nowhere", "/work").path == "/work/bin/app"
    assert fs.find_program("./bin/app", None, "/work").state == FOUND


@pytest.mark.parametrize(("config", "command", "args", "program"), [
    ({"Entrypoint": ["/app"], "Cmd": ["--x"]}, None, None, "/app"),
    ({"Cmd": ["sh", "-c", "x"]}, None, None, "sh"),
    ({"Entrypoint": ["/app"]}, ["/other"], None, "/other"),
    ({"Cmd": ["sh"]}, None, ["/bin/date"], "/bin/date"),
    ({"Entrypoint": ["/app"]}, None, ["--flag"], "/app"),
    ({}, None, None, None),
])
def test_program_follows_kubernetes_command_and_args_rules(
        config: dict[str, list[str]], command: list[str] | None, args: list[str] | None,
        program: str | None) -> None:
    assert program_of(config, command, args) == program


def test_env_path() -> None:
    assert env_path(["A=1", "PATH=/x:/y"]) == "/x:/y"
    assert env_path(None) is None


def check(fs: RootFS, program: str | None, arch: str, path: str | None = "/bin") -> ProgramCheck:
    c = ProgramCheck(fs, program, arch, path)
    c.step()
    return c


def test_program_check_ok_and_mismatch() -> None:
    fs = rootfs([("bin/sh", link("busybox")), ("bin/busybox", exe("amd64"))])
    assert check(fs, "sh", "amd64").status == OK
    wrong = check(fs, "sh", "arm64")
    assert wrong.status == MISMATCH
    assert wrong.reason == "/bin/busybox is ELF 64-bit LSB EM_X86_64 (amd64), not arm64"


def test_script_is_reported_and_its_interpreter_checked() -> None:
    fs = rootfs([("entrypoint.sh", script("#!/bin/sh\nexec app\n")),
                 ("bin/sh", exe("amd64"))])
    c = check(fs, "/entrypoint.sh", "arm64")
    assert c.status == MISMATCH
    assert [f.kind for f in c.files] == ["script", "elf"]
    assert c.files[0].detail == "#!/bin/sh"
    assert c.files[1].path == "/bin/sh" and c.files[1].architecture == "amd64"


def test_env_shebang_checks_env_then_the_program_on_path() -> None:
    fs = rootfs([("app.py", script("#!/usr/bin/env -S python3 -u\n")),
                 ("usr/bin/env", exe("arm64")), ("bin/python3", exe("amd64"))])
    c = check(fs, "/app.py", "arm64")
    assert [f.path for f in c.files] == ["/app.py", "/usr/bin/env", "/bin/python3"]
    assert c.status == MISMATCH


def test_missing_interpreter_and_non_elf_file() -> None:
    fs = rootfs([("run", script("#!/bin/bash\n")),
                 ("data", Entry(FILE, 0o755, None, b"PK\x03\x04", 4))])
    assert check(fs, "/run", "amd64").status == NOT_FOUND
    other = check(fs, "/data", "amd64")
    assert other.status == MISMATCH and other.files[0].kind == "other"


def test_no_program() -> None:
    assert check(rootfs([]), None, "amd64").status == NO_PROGRAM


def test_check_waits_on_a_partial_layer_and_concerns_only_that_path() -> None:
    fs = RootFS(1)
    layer = fs.start_layer()
    c = ProgramCheck(fs, "/app", "amd64", None)
    assert c.step() is False and c.waiting == "/app"
    assert not c.concerns("/bin/x") and c.concerns("/app")
    layer.add("app", exe("amd64"))
    assert c.step() is True and c.status == OK
