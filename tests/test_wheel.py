"""The product stands on its own (issue 12): a wheel of the project holds what the demo
reads at run time, and, unpacked outside the checkout, finds it there.

The wheel is built from this checkout (``pip wheel --no-deps --no-build-isolation``: no
index needed) and unpacked into a temporary directory; a fresh interpreter whose working
directory is outside the checkout imports the demo from it, with the checkout removed from
``sys.path``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CRDS = {
    "podplacement/crds/podplacementconfig.yaml": REPO / "deploy/crds/podplacementconfig.yaml",
    "podplacement/crds/imageplatforms.yaml": REPO / "deploy/crds/imageplatforms.yaml",
    "podplacement/crds/noderesourcetopology-crd.yaml":
        REPO / "deploy/optional/noderesourcetopology-crd.yaml",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = out.glob("podplacement-*.whl")
    return found


def test_the_wheel_holds_the_crds_as_files_equal_to_deploys(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for member, source in CRDS.items():
            assert member in names, sorted(n for n in names if "crds" in n)
            assert zf.read(member) == source.read_bytes()
        assert "kubeclient/__init__.py" in names
        assert not any(n.startswith("tests/") for n in names)


def test_the_demo_finds_its_crds_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = (
        "import json, sys\n"
        # the development install maps our packages to the checkout with a finder: drop it
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
        "getattr(f, '__module__', '') and 'editable' not in type(f).__module__]\n"
        f"sys.path[:] = [{str(site)!r}] + [p for p in sys.path if p and "
        f"p.rstrip('/') != {str(REPO)!r}]\n"
        "from podplacement.demo import run\n"
        "assert run.__file__.startswith(sys.path[0]), run.__file__\n"
        "print(json.dumps({'workdir': str(run.WORKDIR), "
        "'crds': [[str(p), p.is_file()] for p in run.CRD_FILES]}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, capture_output=True,
                          text=True, timeout=120, check=False, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["workdir"] == "None"  # no checkout around: the processes' cwd is kept
    for path, is_file in report["crds"]:
        assert path.startswith(str(site)) and is_file, report
