"""ELF identification and ``#!`` lines (imageinspect._elf): pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from podplacement.imageinspect._elf import (
    EM_PPC64,
    EM_S390,
    EM_X86_64,
    NotElf,
    parse_elf_header,
    parse_shebang,
    runs_on,
)
from tests.imageinspect._images import ELF_IDENT, elf

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arch", sorted(ELF_IDENT))
def test_each_architecture_is_named_from_machine_class_and_byte_order(arch: str) -> None:
    header = parse_elf_header(elf(arch)[:64])
    assert header.architecture == arch
    assert header.machine == ELF_IDENT[arch][0]


def test_ppc64_byte_order_tells_ppc64le_from_ppc64() -> None:
    le, be = parse_elf_header(elf("ppc64le")), parse_elf_header(elf("ppc64"))
    assert le.machine == be.machine == EM_PPC64
    assert (le.architecture, le.little_endian) == ("ppc64le", True)
    assert (be.architecture, be.little_endian) == ("ppc64", False)


def test_big_endian_machine_field_is_read_in_the_files_byte_order() -> None:
    s390x = elf("s390x")
    assert s390x[18:20] == EM_S390.to_bytes(2, "big")
    assert parse_elf_header(s390x).machine == EM_S390


def test_describe_names_class_order_machine_and_architecture() -> None:
    assert parse_elf_header(elf("amd64")).describe() == "ELF 64-bit LSB EM_X86_64 (amd64)"


def test_unknown_machine_has_no_architecture() -> None:
    data = bytearray(elf("amd64"))
    data[18:20] = (0x1234).to_bytes(2, "little")
    header = parse_elf_header(bytes(data))
    assert header.architecture is None
    assert header.machine_name == "e_machine 4660"


def test_x86_64_machine_in_a_32_bit_file_is_not_amd64() -> None:
    data = bytearray(elf("amd64"))
    data[4] = 1
    header = parse_elf_header(bytes(data))
    assert header.machine == EM_X86_64 and header.architecture is None


@pytest.mark.parametrize("head", [b"", b"\x7fELF", b"MZ\x90\x00" + b"\0" * 60,
                                  b"\x7fELF\x03\x01" + b"\0" * 60,
                                  b"\x7fELF\x02\x03" + b"\0" * 60])
def test_not_elf_or_bad_identification_raises(head: bytes) -> None:
    with pytest.raises(NotElf):
        parse_elf_header(head)


def test_runs_on_is_strict_about_32_bit_siblings() -> None:
    assert runs_on("amd64", "amd64")
    assert not runs_on("386", "amd64")
    assert not runs_on("arm", "arm64")
    assert not runs_on(None, "amd64")


def test_real_busybox_binaries_when_the_demo_packages_are_here() -> None:
    debs = REPO / ".demo-cache" / "debs"
    if not list(debs.glob("busybox-static_*_s390x.deb")):
        pytest.skip("busybox-static .debs not found (hack/fetch-debs.sh fills .demo-cache/debs)")
    from podplacement.demo.images import DEBIAN_TO_OCI, _extract_busybox

    for deb_arch, (arch, _variant) in DEBIAN_TO_OCI.items():
        deb = sorted(debs.glob(f"busybox-static_*_{deb_arch}.deb"))[-1]
        assert parse_elf_header(_extract_busybox(deb)[:256]).architecture == arch


@pytest.mark.parametrize(("head", "interpreter", "argument"), [
    (b"#!/bin/sh\necho", "/bin/sh", None),
    (b"#! /usr/bin/env  python3 -u \n", "/usr/bin/env", "python3 -u"),
    (b"#!\t/bin/bash\t-e\n", "/bin/bash", "-e"),
    (b"#!/bin/sh", "/bin/sh", None),
    (b"#!/bin/sh\r\n", "/bin/sh\r", None),
])
def test_shebang_is_split_like_binfmt_script(head: bytes, interpreter: str,
                                             argument: str | None) -> None:
    shebang = parse_shebang(head)
    assert shebang is not None
    assert (shebang.interpreter, shebang.argument) == (interpreter, argument)
    assert not shebang.truncated


def test_shebang_without_interpreter_or_truncated() -> None:
    blank = parse_shebang(b"#!   \n")
    assert blank is not None and blank.interpreter == ""
    long = parse_shebang(b"#!/" + b"x" * 300)
    assert long is not None and long.truncated
    assert parse_shebang(b"\x7fELF") is None
