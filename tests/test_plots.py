"""``bench/plots.py``: the benchmark plots of docs/benchmarks.md, drawn from recorded results.

Rendering runs the real command (matplotlib, the ``bench`` extra) on a small recorded-results
fixture (``tests/plots_results/``: ``bench/catalogsim.py --json`` and ``bench/nodememory.py
--json`` of small runs, and cluster/scale files in the shape their ``--save`` writes); its
``--check`` mode must find a plot whose results changed (stale) and a plot that is gone
(missing). The committed plots under docs/benchmarks/ must be fresh for the committed results
in bench/results/, and docs/benchmarks.md must show each of them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import in_ci

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "bench" / "plots.py"
FIXTURE = Path(__file__).resolve().parent / "plots_results"
#: The plots bench/plots.py draws, and the results file each is drawn from.
FIGURES = {
    "cluster-ratio": "cluster.json", "cluster-cpu": "cluster.json",
    "scale-memory": "scale.json", "scale-share": "scale.json",
    "informer-memory": "nodememory.json", "catalog-ceiling": "catalogsim.json",
}
STAMP = re.compile(r"podplacement bench/plots\.py sha256=([0-9a-f]{64})")

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None and not in_ci(),
    reason="matplotlib (the bench extra) is not installed")


def plots(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python bench/plots.py ARGS`` from the repository root."""
    return subprocess.run([sys.executable, str(PLOTS), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def expected_stamp(results: Path) -> str:
    """What a plot drawn from ``results`` by the committed bench/plots.py must carry."""
    return hashlib.sha256(PLOTS.read_bytes() + b"\0" + results.read_bytes()).hexdigest()


@pytest.fixture
def drawn(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the fixture's results and the plots drawn from it: (results, out)."""
    results, out = tmp_path / "results", tmp_path / "out"
    shutil.copytree(FIXTURE, results)
    done = plots("--results", results, "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    return results, out


@needs_matplotlib
def test_every_plot_is_drawn_from_the_recorded_results(drawn: tuple[Path, Path]) -> None:
    results, out = drawn
    assert sorted(p.stem for p in out.iterdir()) == sorted(FIGURES)
    for name, source in FIGURES.items():
        text = (out / f"{name}.svg").read_text()
        assert len(text) > 5000 and "<svg" in text and text.rstrip().endswith("</svg>"), name
        found = STAMP.search(text)
        assert found and found.group(1) == expected_stamp(results / source), name
    done = plots("--results", results, "--out", out, "--check")
    assert done.returncode == 0, done.stderr
    assert "6 plots" in done.stdout and "fresh" in done.stdout


@needs_matplotlib
def test_drawing_again_gives_the_same_bytes(drawn: tuple[Path, Path], tmp_path: Path) -> None:
    results, out = drawn
    again = tmp_path / "again"
    assert plots("--results", results, "--out", again).returncode == 0
    for name in FIGURES:
        assert (again / f"{name}.svg").read_bytes() == (out / f"{name}.svg").read_bytes(), name


@needs_matplotlib
def test_check_finds_a_stale_plot_and_a_missing_one(drawn: tuple[Path, Path]) -> None:
    results, out = drawn
    cluster = results / "cluster.json"
    cluster.write_text(cluster.read_text().replace('"bound_per_s": 180', '"bound_per_s": 181',
                                                   1))
    (out / "catalog-ceiling.svg").unlink()
    done = plots("--results", results, "--out", out, "--check")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    assert any("cluster-ratio.svg: stale" in line for line in lines), lines
    assert any("cluster-cpu.svg: stale" in line for line in lines), lines
    assert any("catalog-ceiling.svg: missing" in line for line in lines), lines
    assert "Traceback" not in done.stderr
    # a plot edited by hand (its stamp gone) is stale too
    plots("--results", results, "--out", out)
    svg = out / "scale-memory.svg"
    svg.write_text(STAMP.sub("edited", svg.read_text()))
    done = plots("--results", results, "--out", out, "--check")
    assert done.returncode == 1 and "scale-memory.svg: stale" in done.stderr, done.stderr


@needs_matplotlib
def test_malformed_results_are_one_line_each(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    (results / "cluster.json").write_text("[]")
    (results / "scale.json").write_text("{not json")
    (results / "nodememory.json").unlink()
    done = plots("--results", results, "--out", tmp_path / "out")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 5, lines
    assert sum("cluster.json: not what" in line for line in lines) == 2, lines
    assert sum("scale.json: not JSON" in line for line in lines) == 2, lines
    assert sum("nodememory.json: cannot read" in line for line in lines) == 1, lines
    assert (tmp_path / "out" / "catalog-ceiling.svg").stat().st_size > 5000


def test_the_committed_plots_are_fresh() -> None:
    """``--check`` reads stamps only: it runs without matplotlib."""
    done = plots("--check")
    assert done.returncode == 0, done.stderr


def test_the_benchmarks_page_shows_every_plot() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name in FIGURES:
        assert f"](benchmarks/{name}.svg)" in page, name
        assert (ROOT / "docs" / "benchmarks" / f"{name}.svg").stat().st_size > 5000, name
    assert "python bench/plots.py" in page


def test_without_matplotlib_one_line(tmp_path: Path) -> None:
    """Drawing without the bench extra: one line naming it, no traceback."""
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(PLOTS), "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "plots: matplotlib is not installed (the bench extra: pip install -e '.[bench]')"]
    assert not (tmp_path / "out").exists()
