"""No import cycles: the checks of ``hack/importgraph.py`` on this checkout's import graph
(grimp's, as ``lint-imports`` builds it), and the same checks finding the cycles added to a
copy of that graph (so they can fail). No cluster; grimp reads the source, nothing runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]


def _importgraph() -> ModuleType:
    """hack/importgraph.py, imported from its file (hack/ is not a package)."""
    spec = importlib.util.spec_from_file_location("importgraph", REPO / "hack" / "importgraph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["importgraph"] = module
    spec.loader.exec_module(module)
    return module


importgraph = _importgraph()


@pytest.fixture
def graph() -> grimp.ImportGraph:
    """A fresh graph of podplacement and localkube (each test may change its own)."""
    return importgraph.build_graph()


def test_the_import_graph_has_no_cycle(graph: grimp.ImportGraph) -> None:
    report = importgraph.check(graph)
    assert report.ok, importgraph.render(report)
    # the graph is the product's: the linked folders are seen under podplacement.*
    layers = {c: i for i, layer in enumerate(report.layers) for c in layer}
    assert layers["podplacement.cli"] > layers["podplacement.controller"] \
        > layers["podplacement.rules"] > layers["podplacement.imageinspect"] \
        > layers["podplacement.cliargs"]
    assert layers["localkube"] > layers["podplacement.rules"]
    assert report.component_edges[("podplacement.webhook", "podplacement.rules")] > 0


def test_the_script_prints_the_layers_and_exits_0() -> None:
    run = subprocess.run([sys.executable, str(REPO / "hack" / "importgraph.py")],
                         capture_output=True, text=True, check=False, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cycles between modules: 0" in run.stdout
    assert "podplacement.webhook" in run.stdout and "-> podplacement.kubeclient: " in run.stdout


def test_a_cycle_between_modules_is_found(graph: grimp.ImportGraph) -> None:
    # the shape of the cycle podplacement/cliargs.py broke: a subcommand's helper imports the
    # console script, which imports the subcommand
    graph.add_import(importer="podplacement.cliargs", imported="podplacement.cli",
                     line_number=1, line_contents="from podplacement.cli import main")
    report = importgraph.check(graph)
    assert not report.ok
    (cycle,) = report.module_cycles
    assert {"podplacement.cli", "podplacement.cliargs"} <= set(cycle)
    assert "cycles between modules: 1" in importgraph.render(report)


def test_a_cycle_between_components_alone_is_found(graph: grimp.ImportGraph) -> None:
    # controller.queue imports nothing, so no module cycle; but the controller imports
    # kubeclient, and now kubeclient imports the controller
    graph.add_import(importer="podplacement.kubeclient.client",
                     imported="podplacement.controller.queue",
                     line_number=1, line_contents="from podplacement.controller.queue import X")
    report = importgraph.check(graph)
    assert report.module_cycles == ()
    assert report.component_cycles == (("podplacement.controller", "podplacement.kubeclient"),)
    assert report.layers == () and not report.ok


@pytest.mark.parametrize("statement", ["from localkube import _gojson",
                                       "from . import _gojson"])
def test_an_import_through_the_own_package_name_is_found(graph: grimp.ImportGraph,
                                                        statement: str) -> None:
    # localkube's __init__ imports localkube.patch (through runner and server)
    graph.add_import(importer="localkube.patch", imported="localkube._gojson",
                     line_number=21, line_contents=statement)
    report = importgraph.check(graph)
    assert report.package_name_imports == (
        f"localkube.patch:21: {statement} (localkube imports localkube.patch)",)
    assert not report.ok


def test_an_import_of_a_package_that_does_not_import_back_is_no_circle(
        graph: grimp.ImportGraph) -> None:
    # podplacement.controller's __init__ imports nothing: no circle
    graph.add_import(importer="podplacement.controller.app",
                     imported="podplacement.controller.lifecycle", line_number=1,
                     line_contents="from podplacement.controller import lifecycle as lc")
    assert importgraph.check(graph).ok
