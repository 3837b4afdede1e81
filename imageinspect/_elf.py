"""What kind of program a file is, from its first bytes: an ELF header, a ``#!`` script, or
neither. Pure functions; the caller hands in at most :data:`HEAD_BYTES` bytes of the file.

Sources: the System V gABI ELF header (``e_ident``: ``EI_CLASS`` at offset 4, ``EI_DATA`` at 5;
``e_machine`` at offset 18, two bytes in the file's byte order; the ``EM_*`` values as in
glibc's and the kernel's ``elf.h``), mapped to the OCI image-spec ``architecture`` values (Go's
``GOARCH`` names); the Linux kernel's ``fs/binfmt_script.c`` ``load_script`` for the ``#!``
line (read from the first ``BINPRM_BUF_SIZE`` = 256 bytes, ``include/uapi/linux/binfmts.h``:
interpreter up to the first blank, then at most one argument, trailing blanks dropped), and
``fs/binfmt_elf.c`` ``elf_check_arch``: a kernel runs an ELF file only for its own machine (or a
compat one), otherwise ``execve`` fails with ENOEXEC, "exec format error".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Bytes of a file that decide its format: the kernel reads this many for ``#!`` lines
#: (``BINPRM_BUF_SIZE``); an ELF header needs 20 (through ``e_machine``).
HEAD_BYTES = 256

ELF_MAGIC = b"\x7fELF"
ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2

EM_386 = 3
EM_MIPS = 8
EM_PPC = 20
EM_PPC64 = 21
EM_S390 = 22
EM_ARM = 40
EM_SPARCV9 = 43
EM_X86_64 = 62
EM_AARCH64 = 183
EM_RISCV = 243
EM_LOONGARCH = 258

#: ``e_machine`` -> its name in ``elf.h`` (for messages).
MACHINE_NAMES: dict[int, str] = {
    EM_386: "EM_386", EM_MIPS: "EM_MIPS", EM_PPC: "EM_PPC", EM_PPC64: "EM_PPC64",
    EM_S390: "EM_S390", EM_ARM: "EM_ARM", EM_SPARCV9: "EM_SPARCV9", EM_X86_64: "EM_X86_64",
    EM_AARCH64: "EM_AARCH64", EM_RISCV: "EM_RISCV", EM_LOONGARCH: "EM_LOONGARCH",
}

#: (``e_machine``, ``EI_CLASS``, little-endian) -> OCI architecture. Where the class or byte
#: order does not tell architectures apart it is None in the key's match below.
_ARCHITECTURES: dict[tuple[int, int, bool | None], str] = {
    (EM_386, ELFCLASS32, None): "386",
    (EM_X86_64, ELFCLASS64, None): "amd64",
    (EM_ARM, ELFCLASS32, None): "arm",
    (EM_AARCH64, ELFCLASS64, None): "arm64",
    (EM_PPC64, ELFCLASS64, True): "ppc64le",
    (EM_PPC64, ELFCLASS64, False): "ppc64",
    (EM_PPC, ELFCLASS32, None): "ppc",
    (EM_S390, ELFCLASS64, None): "s390x",
    (EM_S390, ELFCLASS32, None): "s390",
    (EM_RISCV, ELFCLASS64, None): "riscv64",
    (EM_MIPS, ELFCLASS32, True): "mipsle",
    (EM_MIPS, ELFCLASS32, False): "mips",
    (EM_MIPS, ELFCLASS64, True): "mips64le",
    (EM_MIPS, ELFCLASS64, False): "mips64",
    (EM_LOONGARCH, ELFCLASS64, None): "loong64",
    (EM_SPARCV9, ELFCLASS64, None): "sparc64",
}


class NotElf(ValueError):
    """The bytes do not start with a usable ELF identification (magic, class, data)."""


@dataclass(frozen=True, slots=True)
class ElfHeader:
    """The part of an ELF header that says which machine runs the file.

    Attributes:
        elf_class: 32 or 64 (``EI_CLASS``).
        little_endian: ``EI_DATA`` is ``ELFDATA2LSB``.
        machine: ``e_machine`` (``EM_*``).
        architecture: the OCI architecture of that (machine, class, byte order), or None for
            one this table does not know.
    """

    elf_class: int
    little_endian: bool
    machine: int
    architecture: str | None

    @property
    def machine_name(self) -> str:
        """``EM_X86_64`` and the like, or ``e_machine <n>`` for an unknown value."""
        return MACHINE_NAMES.get(self.machine, f"e_machine {self.machine}")

    def describe(self) -> str:
        """E.g. ``ELF 64-bit LSB EM_X86_64 (amd64)``."""
        arch = self.architecture or "unknown architecture"
        order = "LSB" if self.little_endian else "MSB"
        return f"ELF {self.elf_class}-bit {order} {self.machine_name} ({arch})"


def parse_elf_header(head: bytes) -> ElfHeader:
    """Read the ELF identification and ``e_machine`` from the first bytes of a file.

    Args:
        head: at least the first 20 bytes of the file.
    Returns:
        :class:`ElfHeader`.
    Raises:
        NotElf: no ``\\x7fELF`` magic, fewer than 20 bytes, or an ``EI_CLASS``/``EI_DATA``
            other than the gABI's two values (the kernel refuses those too).
    """
    if len(head) < 20 or head[:4] != ELF_MAGIC:
        raise NotElf("not an ELF file" if head[:4] != ELF_MAGIC else "truncated ELF header")
    ei_class, ei_data = head[4], head[5]
    if ei_class not in (ELFCLASS32, ELFCLASS64):
        raise NotElf(f"ELF EI_CLASS {ei_class} is neither 32- nor 64-bit")
    if ei_data not in (ELFDATA2LSB, ELFDATA2MSB):
        raise NotElf(f"ELF EI_DATA {ei_data} is neither LSB nor MSB")
    little = ei_data == ELFDATA2LSB
    machine = int.from_bytes(head[18:20], "little" if little else "big")
    bits = 32 if ei_class == ELFCLASS32 else 64
    arch = (_ARCHITECTURES.get((machine, ei_class, little))
            or _ARCHITECTURES.get((machine, ei_class, None)))
    return ElfHeader(bits, little, machine, arch)


def is_elf(head: bytes) -> bool:
    """Whether ``head`` starts with the ELF magic."""
    return head[:4] == ELF_MAGIC


@dataclass(frozen=True, slots=True)
class Shebang:
    """A ``#!`` line as the kernel reads it (``fs/binfmt_script.c`` ``load_script``).

    Attributes:
        interpreter: the interpreter path as written (the kernel does not search PATH).
        argument: the one optional argument (the rest of the line), or None.
        truncated: the line did not end within the first 256 bytes and the interpreter name
            reached the end of them (the kernel then refuses the script with ENOEXEC).
    """

    interpreter: str
    argument: str | None
    truncated: bool = False


def parse_shebang(head: bytes) -> Shebang | None:
    """The ``#!`` line of a script, or None when ``head`` does not start with ``#!``.

    Args:
        head: the first bytes of the file (only the first :data:`HEAD_BYTES` count, as for
            the kernel).
    Returns:
        :class:`Shebang`; its ``interpreter`` is empty for ``#!`` followed by blanks only
        (the kernel refuses that with ENOEXEC).
    """
    if head[:2] != b"#!":
        return None
    buf = head[:HEAD_BYTES]
    end = buf.find(b"\n")
    line = buf[2:] if end < 0 else buf[2:end]
    line = line.rstrip(b" \t").lstrip(b" \t")
    match = re.match(rb"([^ \t\0]*)([ \t\0]?)(.*)", line, re.DOTALL)
    assert match is not None  # the pattern matches any bytes
    name, sep, rest = match.groups()
    argument = rest.lstrip(b" \t") if sep in (b" ", b"\t") else b""
    # No newline in the buffer and nothing after the name: the name may go on beyond it.
    truncated = end < 0 and len(head) >= HEAD_BYTES and not sep
    return Shebang(name.decode("utf-8", "surrogateescape"),
                   argument.decode("utf-8", "surrogateescape") or None, truncated)


def runs_on(binary_arch: str | None, platform_arch: str) -> bool:
    """Whether an ELF file of ``binary_arch`` is the architecture a platform names.

    Strict equality of OCI architecture names: a 32-bit binary on its 64-bit sibling (386 on
    amd64, arm on arm64) is reported as not matching, because whether the node's kernel and
    CPU run it (``CONFIG_COMPAT``, AArch32 support) cannot be told from the image.
    """
    return binary_arch is not None and binary_arch == platform_arch
