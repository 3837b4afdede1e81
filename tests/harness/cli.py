"""Running ``podplacement`` in-process in CLI tests."""

from __future__ import annotations

import pytest

from podplacement import cli


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``podplacement ARGV`` in-process → (exit code, stdout, stderr); argparse exits too."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """The single stderr line of a refused command (no traceback, no usage dump)."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
