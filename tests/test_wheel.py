"""The product stands on its own: a wheel of the project holds what the demo reads at run
time, carries PEP 639 license metadata, and, unpacked outside the checkout, runs its demo there
with nothing of the checkout (it downloads its busybox packages itself). The sdist holds what
its tests read (MANIFEST.in), and they run from it unpacked.

The wheel is built from this checkout (``pip wheel --no-deps --no-build-isolation``: no
index needed) and unpacked into a temporary directory; a fresh interpreter whose working
directory is outside the checkout imports the product from it, with the checkout removed from
``sys.path`` (the dependencies come from this interpreter's environment). The sdist is built
by setuptools' PEP 517 backend in this interpreter (``build_meta.build_sdist``: no isolation,
no index).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CRDS = {
    "podplacement/crds/podplacementconfig.yaml": REPO / "deploy/crds/podplacementconfig.yaml",
    "podplacement/crds/imageplatformcatalog.yaml": REPO / "deploy/crds/imageplatformcatalog.yaml",
    "podplacement/crds/podplacementpolicy.yaml": REPO / "deploy/crds/podplacementpolicy.yaml",
    "podplacement/crds/noderesourcetopology-crd.yaml":
        REPO / "deploy/optional/noderesourcetopology-crd.yaml",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools builds in the source tree's build/ (gitignored) and would pack files a
    # former build left there (a package since excluded, e.g.): start from none
    shutil.rmtree(REPO / "build", ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # PEP 639 metadata: no deprecation banner from setuptools
    assert "project.license" not in proc.stderr, proc.stderr[-3000:]
    (found,) = out.glob("podplacement-*.whl")
    return found


def test_the_wheel_carries_spdx_license_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
        assert "License-Expression: Apache-2.0" in text
        assert any(n.endswith("licenses/LICENSE") for n in zf.namelist())


def test_the_wheel_holds_the_crds_as_files_equal_to_deploys(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for member, source in CRDS.items():
            assert member in names, sorted(n for n in names if "crds" in n)
            assert zf.read(member) == source.read_bytes()
        assert "podplacement/kubeclient/__init__.py" in names
        assert not any(n.startswith("tests/") for n in names)


def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    """One import package, podplacement (its controller, webhook, rules, imageinspect, certs
    and kubeclient are subpackages, the repository's top-level folders linked into it): nothing
    with a generic top-level name that could collide with another distribution."""
    with zipfile.ZipFile(wheel) as zf:
        tops = {n.split("/")[0] for n in zf.namelist()}
        for sub in ("rules/place/placement.py", "webhook/app.py", "imageinspect/cli.py",
                    "certs/cli.py", "kubeclient/client.py"):
            assert f"podplacement/{sub}" in zf.namelist(), sub
    assert {t for t in tops if not t.endswith(".dist-info")} == {"podplacement"}, tops


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
        "from podplacement.demo import common as run\n"
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


def test_the_wheel_installs_no_test_double(wheel: Path) -> None:
    """localkube, the API double, is a test-only package of the source tree."""
    with zipfile.ZipFile(wheel) as zf:
        assert not any(n.startswith("localkube/") for n in zf.namelist())


def _unpacked(wheel: Path, tmp_path: Path, **extra: str) -> tuple[Path, dict[str, str]]:
    """The wheel unpacked into ``tmp_path/site`` and an environment that imports the product
    from there only, with a user cache of its own (nothing an earlier run cached is found)."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PODPLACEMENT_", "KUBEBUILDER_")) and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(tmp_path / "cache"), **extra)
    return elsewhere, env


def test_the_unpacked_wheel_prints_its_version_from_its_metadata(wheel: Path,
                                                                 tmp_path: Path) -> None:
    """Outside the checkout ``podplacement version`` reads the distribution's metadata
    (podplacement/version.py): the wheel's, which is pyproject.toml's version."""
    from podplacement.version import source_version

    elsewhere, env = _unpacked(wheel, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "podplacement", "version"], cwd=elsewhere,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == f"{source_version(REPO)}\n"
    assert not (Path(env["PYTHONPATH"]) / "pyproject.toml").exists()


@pytest.mark.parametrize("api_server", ["auto", "localkube"])
def test_the_wheels_demo_without_a_control_plane_says_how_to_get_one(
        wheel: Path, tmp_path: Path, api_server: str) -> None:
    """No real control plane, and no localkube in a wheel (the checkout's test-only API
    double): one error line says what to set or use instead, exit code 2, nothing started."""
    elsewhere, env = _unpacked(wheel, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "podplacement", "--log-format", "text", "demo",
                           "--no-download", "--api-server", api_server], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    (error,) = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert "demo failed: " in error
    assert "localkube, the test-only API double, is not installed" in error
    assert "set KUBEBUILDER_ASSETS to a directory holding etcd and kube-apiserver" in error
    assert "--kubeconfig FILE" in error
    assert "Traceback" not in proc.stderr and "started " not in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.realcluster
def test_the_wheel_runs_its_demo_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """``podplacement demo`` from the wheel, in a directory outside the checkout, with an
    empty user cache and the real control plane named by ``KUBEBUILDER_ASSETS`` (the envtest
    convention): it says which API server it runs on, fetches the busybox packages it lacks
    (or stands in for them) and places every workload."""
    from podplacement.sandbox.controlplane import AssetsNotFound, locate_assets

    try:
        assets = locate_assets()
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    kb = tmp_path / "assets"
    kb.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        binary = assets.binary(name)
        if binary is not None:
            (kb / name).symlink_to(binary)
    elsewhere, env = _unpacked(wheel, tmp_path, KUBEBUILDER_ASSETS=str(kb))
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "podplacement", "--log-format", "text", "demo"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240,
                          check=False)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    first = proc.stderr.splitlines()[0]
    assert "API server: the real control plane" in first, first
    # the product's modules came from the wheel, not the checkout
    assert str(REPO) not in proc.stderr.replace(str(tmp_path), ""), proc.stderr[-3000:]
    debs = cache / "podplacement" / "debs"
    assert f"with apt-get download into {debs}" in proc.stderr
    fetched = sorted(p.name for p in debs.glob("busybox-static_*.deb"))
    used = re.search(r"busybox binaries: (.*)", proc.stderr)
    assert used is not None
    if len(fetched) < 4:  # no network or no foreign dpkg architecture: stand-ins, said so
        assert "generated stand-in" in proc.stderr, proc.stderr[-3000:]
    else:
        assert "stand-in" not in used.group(1), used.group(1)
    assert "9 of 9 workloads placed as expected" in proc.stdout, proc.stdout


# --- the sdist ------------------------------------------------------------------------------

#: What the tests read beyond the package (MANIFEST.in): folders, whole, and single files.
SDIST_FOLDERS = ("tests", "localkube", "deploy", "charts", "docs", "hack", "bench")
SDIST_FILES = (".importlinter", "mkdocs.yml", "CHANGELOG.md", "releases.toml", "README.md",
               "LICENSE", "pyproject.toml")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    # setuptools adds every file the SOURCES.txt of a former build (podplacement.egg-info/,
    # gitignored) lists, whatever MANIFEST.in says now: start from none
    shutil.rmtree(REPO / "podplacement.egg-info", ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-c",
         f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = out.glob("podplacement-*.tar.gz")
    return found


def _sdist_names(sdist: Path) -> set[str]:
    """The sdist's file paths, without the leading ``podplacement-VERSION/``."""
    with tarfile.open(sdist) as tf:
        return {m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name}


def test_the_sdist_holds_what_its_tests_read(sdist: Path) -> None:
    """Every file of the tests (their harness, fixtures and reference data), of localkube and
    of the folders the tests read is in the sdist; no bytecode is."""
    names = _sdist_names(sdist)
    expected = {p.relative_to(REPO).as_posix()
                for folder in SDIST_FOLDERS for p in (REPO / folder).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    expected |= set(SDIST_FILES)
    assert {"tests/harness/kube_fixtures.py", "tests/harness/registry.py", "tests/conftest.py",
            "localkube/__main__.py"} <= expected
    assert sorted(expected - names) == []
    assert "podplacement/demo/apidouble.py" in names
    assert "podplacement/rules/place/placement.py" in names  # the linked folders, as files
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_sdists_tests_run_from_it_unpacked(sdist: Path, tmp_path: Path) -> None:
    """Unpacked outside the checkout, the sdist imports the product, localkube and the test
    harness from itself, and a test on the harness's localkube fixture passes there."""
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path, filter="data")
    (root,) = tmp_path.glob("podplacement-*")
    # CI=true would make a run without the real control plane stop (tests/conftest.py): this
    # one checks the sdist, not the machine
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI")}
    env["PYTHONPATH"] = str(root)
    where = subprocess.run(
        [sys.executable, "-c", "import podplacement, localkube, tests.harness.kube_fixtures as k; "
         "print(podplacement.__file__, localkube.__file__, k.__file__)"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr[-3000:]
    assert all(path.startswith(str(root)) for path in where.stdout.split()), where.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_demo.py::test_all_demo_objects_are_accepted_by_the_api_server"],
        cwd=root, env=env, capture_output=True, text=True, timeout=170, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout, proc.stdout[-3000:]
