"""The CRDs of deploy/crds are compatible with those of the previous release
(tests/deploy/crdcompat.py has the rules): the previous release is the last of releases.toml,
its CRDs are vendored under tests/deploy/previous/<version>/ (so that the test needs no git
history) and checked against its commit where the clone has it. The rules themselves are
shown to catch each kind of incompatible change, the 0.1.0 -> 0.2.0 scope change of the
params CRD first."""

from __future__ import annotations

import copy
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.rules.legacy import IMAGE_PLATFORMS_0_1, RETIRED_CRDS
from tests.deploy.crdcompat import crd_changes, release_changes

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "crds"
PREVIOUS_ROOT = Path(__file__).resolve().parent / "previous"


def _previous_release() -> dict[str, Any]:
    releases: list[dict[str, Any]] = tomllib.loads(
        (REPO / "releases.toml").read_text())["release"]
    return releases[-1]


def _load(directory: Path) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in the *.yaml files of ``directory``."""
    out = []
    for path in sorted(directory.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text())
                if d and d.get("kind") == "CustomResourceDefinition"]
    return out


def _current() -> list[dict[str, Any]]:
    # what `kubectl apply -k deploy/crds` applies: the files its kustomization lists
    listed = yaml.safe_load((CRDS / "Kustomization").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in CRDS.glob("*.yaml"))
    return _load(CRDS)


def _previous() -> list[dict[str, Any]]:
    directory = PREVIOUS_ROOT / _previous_release()["version"]
    assert directory.is_dir(), f"vendor the previous release's deploy/crds into {directory}"
    return _load(directory)


def _by_name(crds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [c for c in crds if c["metadata"]["name"] == name]
    return copy.deepcopy(found)


def test_the_vendored_crds_are_the_previous_release_commits() -> None:
    """tests/deploy/previous/<version>/ holds exactly deploy/crds/*.yaml of the release's
    commit (where this clone has the history: CI's clone of main does)."""
    release = _previous_release()
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([git, "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=60, check=False)

    listing = run("ls-tree", "--name-only", f"{release['commit']}:deploy/crds")
    if listing.returncode != 0:
        pytest.skip(f"release {release['version']}'s commit is not in this clone")
    names = sorted(n for n in listing.stdout.split() if n.endswith(".yaml"))
    directory = PREVIOUS_ROOT / release["version"]
    assert names == sorted(p.name for p in directory.glob("*.yaml"))
    for name in names:
        shown = run("show", f"{release['commit']}:deploy/crds/{name}")
        assert shown.returncode == 0, shown.stderr
        assert (directory / name).read_text() == shown.stdout, name


def test_every_crd_is_compatible_with_the_previous_release() -> None:
    problems = release_changes(_previous(), _current(), RETIRED_CRDS)
    assert problems == {}, "\n".join(f"{name}: {line}" for name, lines in problems.items()
                                     for line in lines)


def test_every_retired_crd_is_gone_and_replaced() -> None:
    """What the controller retires is no longer installed, and what replaces it is."""
    names = {c["metadata"]["name"] for c in _current()}
    for retired in RETIRED_CRDS:
        assert retired.name not in names
        assert retired.replaced_by in names


# --- the rules catch each kind of change (they can fail) ----------------------------------
def test_a_scope_change_under_the_old_name_is_refused() -> None:
    """The change 0.2.0 first made: the params CRD namespaced in place, under 0.1.0's name."""
    previous = _previous()
    old = _by_name(previous, IMAGE_PLATFORMS_0_1.name)
    replayed = copy.deepcopy(old)
    replayed["spec"]["scope"] = "Namespaced"
    assert crd_changes(old, replayed) == ["spec.scope: 'Cluster' -> 'Namespaced'"]
    current = [c for c in _current() if c["metadata"]["name"] != IMAGE_PLATFORMS_0_1.replaced_by]
    problems = release_changes(previous, [*current, replayed], RETIRED_CRDS)
    assert problems[IMAGE_PLATFORMS_0_1.name] == ["spec.scope: 'Cluster' -> 'Namespaced'"]


def test_removed_and_retyped_properties_and_new_required_fields_are_refused() -> None:
    old = _by_name(_previous(), "podplacementconfigs.podplacement.io")
    new = copy.deepcopy(old)
    spec = new["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec["properties"]["fallbackArchitecture"]
    spec["properties"]["logVerbosity"]["type"] = "integer"
    spec["required"] = ["namespaceSelector"]
    assert crd_changes(old, new) == [
        "version v1beta1: .spec: newly required namespaceSelector",
        "version v1beta1: .spec.logVerbosity: type 'string' -> 'integer'",
        "version v1beta1: .spec.fallbackArchitecture: removed",
    ]


def test_versions_names_and_group_are_kept() -> None:
    old = _by_name(_previous(), "podplacementconfigs.podplacement.io")
    new = copy.deepcopy(old)
    new["spec"]["group"] = "placement.example.com"
    new["spec"]["names"]["kind"] = "PlacementConfig"
    new["spec"]["versions"][0]["name"] = "v1"
    assert crd_changes(old, new) == [
        "spec.group: 'podplacement.io' -> 'placement.example.com'",
        "spec.names.kind: 'PodPlacementConfig' -> 'PlacementConfig'",
        "version v1beta1: no longer served",
        "storage version v1beta1 of the previous release is not served (objects stored in it "
        "would become unreadable)",
    ]
    # a new version beside the old one, storage moved to it: compatible
    added = copy.deepcopy(old)
    v1 = copy.deepcopy(added["spec"]["versions"][0])
    v1["name"] = "v1"
    added["spec"]["versions"][0]["storage"] = False
    added["spec"]["versions"].append(v1)
    assert crd_changes(old, added) == []


def test_a_crd_gone_without_a_migration_or_renamed_in_disguise_is_refused() -> None:
    previous = _previous()
    current = _current()
    assert release_changes(previous, current, ()) == {
        IMAGE_PLATFORMS_0_1.name: [
            "removed without a migration (rules.legacy.RETIRED_CRDS)"]}
    disguised = _by_name(current, IMAGE_PLATFORMS_0_1.replaced_by)
    disguised["metadata"]["name"] = "platformcatalogs.podplacement.io"
    disguised["spec"]["names"]["kind"] = "ImagePlatforms"
    disguised["spec"]["names"]["plural"] = "platformcatalogs"
    assert release_changes(previous, [*current, disguised], RETIRED_CRDS) == {
        "platformcatalogs.podplacement.io": [
            f"a new name with the kind 'ImagePlatforms' of {IMAGE_PLATFORMS_0_1.name}"]}
