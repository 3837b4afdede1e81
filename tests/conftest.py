"""Session-wide pytest configuration: the harness fixtures (real registry, localkube or a
real control plane, TLS material) are plugins under ``tests/harness``.

The real control plane (``realcluster`` tests) is found by
:func:`podplacement.sandbox.controlplane.locate_assets`, the real node (``realnode`` tests:
the kubelet, containerd, runc) by :func:`podplacement.sandbox.realnode.find_runtime`, helm
(the chart's tests) by :func:`tests.harness.helm.find_helm`. Under ``CI=true`` a run without
any of them stops at once with one line (a CI must never be green without having run against
a real API server, a real node and helm); elsewhere their tests skip, and the summary says
how many did and why.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

pytest_plugins = [
    "tests.harness.registry_fixtures",
    "tests.harness.kube_fixtures",
]

#: The marker of the tests that need the real control plane.
REALCLUSTER = "realcluster"
#: The marker of the tests that need the real node (and the real control plane).
REALNODE = "realnode"


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to ``true``/``1``/``yes``, as CI systems set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_control_plane() -> str | None:
    """Why the real control plane can't be used here (one line), or None when it can."""
    from podplacement.sandbox.controlplane import AssetsNotFound, locate_assets

    try:
        locate_assets()
    except AssetsNotFound as exc:
        return str(exc)
    return None


def missing_real_node() -> str | None:
    """Why the real node can't run here (one line), or None when it can."""
    from tests.harness.realnode import missing_real_node as missing

    return missing()


def ci_refusal() -> str | None:
    """Under CI without the real control plane, the real node or helm: the one line that
    stops the run (also used by ``hack/test.sh`` before lint and type checks); else None."""
    if not in_ci():
        return None
    why = missing_control_plane()
    if why is not None:
        return ("CI=true but kube-apiserver, kube-scheduler and kube-controller-manager v1.36 "
                f"(with etcd) were not found, so the {REALCLUSTER} tests would be skipped: "
                f"{why}")
    why = missing_real_node()
    if why is not None:
        return ("CI=true but the real node (kubelet v1.36, containerd, runc) can't run here, "
                f"so the {REALNODE} tests would be skipped: {why}")
    from tests.harness.realnode import missing_arm64_node

    why = missing_arm64_node()
    if why is not None:
        return ("CI=true but the emulated arm64 node (Linux 6.7+, the .debs of "
                f"hack/fetch-debs.sh) can't run here, so its {REALNODE} tests would be "
                f"skipped: {why}")
    from tests.harness.helm import missing_helm

    why = missing_helm()
    if why is not None:
        return f"CI=true but the Helm chart's tests would be skipped: {why}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Under CI, refuse to run without the real control plane (the controller process of
    a pytest-xdist run checks once; its workers do not)."""
    if hasattr(config, "workerinput"):
        return
    refusal = ci_refusal()
    if refusal is not None:
        raise pytest.UsageError(refusal)


#: The slowest modules, longest first (seconds of test time on 2 cores, measured with
#: ``--durations=0``: 165, 85 (the upgrade module, measured alone), 77, 50, 50, 45 (the Helm
#: chart's, measured alone), 42, 35, 33, 33, 29). ``hack/test.sh`` hands whole modules to two
#: pytest-xdist workers in collection order (``--dist loadfile``); collected last, as the
#: top-level modules are, the longest one ran alone for minutes at the end.
SLOW_MODULES_FIRST = (
    "test_faults_realcluster.py", "test_upgrade_realcluster.py",
    "test_uninstall_realcluster.py",
    "controller/test_paramswriter.py", "test_params_age_realcluster.py",
    "test_helm_realcluster.py", "test_learn_realcluster.py",
    "test_admission_paths_realcluster.py", "test_realnode_e2e.py", "test_image.py",
    "test_demo.py", "test_policies_realcluster.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Collect :data:`SLOW_MODULES_FIRST` first (the rest keep their order), so that the
    two workers finish together."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    rank = {os.path.join(tests_dir, m): i for i, m in enumerate(SLOW_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    """One line per reason for the ``realcluster`` and ``realnode`` tests that were skipped,
    with their count."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        keywords = getattr(report, "keywords", {})
        if REALCLUSTER not in keywords and REALNODE not in keywords:
            continue
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    total = sum(reasons.values())
    terminalreporter.write_sep(
        "=", f"{total} real-control-plane ({REALCLUSTER}, {REALNODE}) tests skipped",
        yellow=True)
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count} skipped: {reason}")
