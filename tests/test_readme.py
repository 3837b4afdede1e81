"""The samples of the README and the docs pages are what the commands print: the ``explain``
sample (docs/guide/cli.md) is run on the files of ``docs/examples/`` and compared line for
line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.harness.cli import run_cli

REPO = Path(__file__).resolve().parents[1]
#: The README and every page of the docs site.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def readme_samples(command: str) -> list[tuple[list[str], str]]:
    """Every fenced block of the README and the docs pages whose first line is
    ``$ podplacement COMMAND ...``: (the arguments after ``podplacement``, the output below
    that line)."""
    blocks = [block for page in PAGES for block in re.findall(
        r"^```\n(\$ podplacement .*?)^```$", page.read_text(), re.M | re.S)]
    out = []
    for block in blocks:
        first, _, rest = block.partition("\n")
        argv = shlex.split(first.removeprefix("$ podplacement "))
        if argv[0] == command:
            out.append((argv, rest))
    return out


def test_the_explain_sample_is_what_explain_prints_for_the_example_files(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    samples = readme_samples("explain")
    assert samples, "neither the README nor docs/ has a '$ podplacement explain' sample"
    monkeypatch.chdir(REPO)
    for argv, expected in samples:
        for arg in argv[1:]:
            if arg.endswith(".yaml"):
                assert (REPO / arg).is_file(), f"{arg} is not in the checkout"
        code, out, err = run_cli(argv, capsys)
        assert code == 0, err
        assert out == expected, f"the sample of podplacement {' '.join(argv)} differs"
