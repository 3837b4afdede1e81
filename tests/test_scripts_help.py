"""Every benchmark and hack script answers ``--help`` (argparse renders each option's help
text; a stray ``%`` in one is a ValueError and a traceback instead of the usage)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(
    p for folder in ("bench", "hack") for p in (ROOT / folder).glob("*.py")
    if "argparse" in p.read_text()
)


def test_scripts_found() -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_help_prints_usage(script: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:200]
    assert "Traceback" not in done.stderr
