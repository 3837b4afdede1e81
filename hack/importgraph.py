"""Print the import graph of ``podplacement`` and ``localkube`` as grimp (import-linter's
library) sees it, by component, and every import cycle in it; exit 1 when there is one.

A *component* is one row of the layout table in docs/design.md: each subpackage of
``podplacement`` (``podplacement.controller``, ``.webhook``, ``.imageinspect``, ...; the
folders linked into ``podplacement/`` are seen under ``podplacement.*``, never under their own
top-level names; ``podplacement.rules`` is the pure placement rules the controller and the
webhook share), each module of
``podplacement`` itself (``podplacement.cli``, ``podplacement.cliargs``, ...), and ``localkube``.

The graph counts every ``import`` statement grimp finds in a module: at the top, inside
functions and under ``if TYPE_CHECKING:``. An edge is one (importer module, imported module)
pair. Three checks, each expected to find nothing:

* cycles between modules: the strongly connected components of the module graph;
* cycles between components (which would leave the components without layers);
* imports of a module through the name of its own package (``from P import sub`` in a module
  of ``P``) while ``P``'s ``__init__`` imports that module back: grimp records them as imports
  of ``P.sub``, but the statement reads as a circle between ``P`` and its module.

The ``acyclic_siblings`` contract of ``.importlinter`` also forbids cycles (between the
modules and the packages of any one package); ``tests/test_import_graph.py`` runs these
checks, so ``lint-imports`` and the suite fail on a new cycle.

Usage (from the repository root)::

    python hack/importgraph.py      # prints the layers, the edges and the cycles; exit 1 on one
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]

#: The top-level packages analysed (localkube, the test-only API double, is not installed but
#: is ours).
PACKAGES = ("podplacement", "localkube")

#: Packages that are a component of their own although their parent package is one too.
SUBCOMPONENTS: tuple[str, ...] = (
    "podplacement.rules.place",
    "podplacement.rules.admit",
    "podplacement.rules.monitor",
)

_FROM = re.compile(r"\s*from\s+(\.*)([\w.]*)\s+import\b")


@dataclass(frozen=True)
class Report:
    """What :func:`check` found.

    ``layers``: components by layer, bottom (imports no other component) first; empty when
    the components have a cycle. ``component_edges``: (importer component, imported
    component) → number of module edges. ``module_cycles``, ``component_cycles``: each cycle
    as its sorted module or component names. ``package_name_imports``: one line per import
    of a module through its own package's name, ``"importer:line: statement"``.
    """

    modules: int
    module_edges: int
    layers: tuple[tuple[str, ...], ...]
    component_edges: Mapping[tuple[str, str], int]
    module_cycles: tuple[tuple[str, ...], ...]
    component_cycles: tuple[tuple[str, ...], ...]
    package_name_imports: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when no check found anything."""
        return not (self.module_cycles or self.component_cycles or self.package_name_imports)


def build_graph() -> grimp.ImportGraph:
    """grimp's graph of :data:`PACKAGES` from this checkout (no cache written).

    Raises whatever :func:`grimp.build_graph` raises on a syntax error or a missing package.
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def component_of(graph: grimp.ImportGraph, module: str) -> str:
    """The component ``module`` belongs to (see the module docstring)."""
    for sub in SUBCOMPONENTS:
        if module == sub or module.startswith(sub + "."):
            return sub
    parts = module.split(".")
    if parts[0] != "podplacement":
        return parts[0]
    if len(parts) == 1:
        return module
    child = ".".join(parts[:2])
    # a subpackage of podplacement is one component; a plain module of podplacement is its own
    return child if graph.find_children(child) or len(parts) > 2 else module


def strongly_connected(nodes: Iterable[str],
                       edges: Mapping[str, Iterable[str]]) -> list[tuple[str, ...]]:
    """The cycles of a directed graph: its strongly connected components of more than one node
    or with a self-edge, each as a sorted tuple, sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1 or node in edges.get(node, ()):
                    found.append(tuple(sorted(members)))
    return sorted(found)


def _layers(components: Iterable[str],
            edges: Mapping[str, set[str]]) -> tuple[tuple[str, ...], ...]:
    """Components by layer: a component's layer is one above the highest layer it imports."""
    level: dict[str, int] = {}

    def height(node: str) -> int:
        if node not in level:
            level[node] = 1 + max((height(dep) for dep in edges.get(node, ())), default=-1)
        return level[node]

    for node in components:
        height(node)
    top = max(level.values(), default=-1)
    return tuple(tuple(sorted(c for c, n in level.items() if n == i)) for i in range(top + 1))


def _package_name_imports(graph: grimp.ImportGraph,
                          edges: Mapping[str, set[str]]) -> list[str]:
    found: dict[tuple[str, int], str] = {}  # one line per statement
    for importer in sorted(edges):
        for imported in sorted(edges[importer]):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                match = _FROM.match(detail["line_contents"])
                if match is None:
                    continue
                dots, name = match.groups()
                if dots:  # relative: resolve against the importer's package
                    is_package = bool(graph.find_children(importer))
                    base = importer.split(".")
                    keep = len(base) - len(dots) + (1 if is_package else 0)
                    name = ".".join([*base[:keep], *([name] if name else [])])
                if (importer.startswith(name + ".") and imported != name
                        and graph.chain_exists(importer=name, imported=importer)):
                    found[importer, detail["line_number"]] = (
                        f"{importer}:{detail['line_number']}: "
                        f"{detail['line_contents'].strip()} ({name} imports {importer})")
    return [found[key] for key in sorted(found)]


def check(graph: grimp.ImportGraph) -> Report:
    """Run the three checks of the module docstring on ``graph``."""
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    component = {m: component_of(graph, m) for m in modules}
    counts: Counter[tuple[str, str]] = Counter()
    between: dict[str, set[str]] = {c: set() for c in component.values()}
    for importer, imported_modules in edges.items():
        for imported in imported_modules:
            pair = (component[importer], component[imported])
            if pair[0] != pair[1]:
                counts[pair] += 1
                between[pair[0]].add(pair[1])
    component_cycles = strongly_connected(between, between)
    return Report(
        modules=len(modules),
        module_edges=sum(len(v) for v in edges.values()),
        layers=() if component_cycles else _layers(between, between),
        component_edges=dict(sorted(counts.items())),
        module_cycles=tuple(strongly_connected(modules, edges)),
        component_cycles=tuple(component_cycles),
        package_name_imports=tuple(_package_name_imports(graph, edges)),
    )


def render(report: Report) -> str:
    """The report as text: layers (top first), module edges between components, cycles."""
    out = [f"import graph of {', '.join(PACKAGES)} as grimp {grimp.__version__} sees it: "
           f"{report.modules} modules, {report.module_edges} module edges (imports at the "
           "top of a module, in functions and under TYPE_CHECKING)", "",
           "layers (top first; a component imports only components in lower layers):"]
    for i in reversed(range(len(report.layers))):
        out.append(f"  {i:2}  {'  '.join(report.layers[i])}")
    if not report.layers:
        out.append("  none: the components have a cycle")
    out += ["", "module edges between components (importer -> imported: edges):"]
    width = max((len(a) for a, _ in report.component_edges), default=0)
    for (importer, imported), n in report.component_edges.items():
        out.append(f"  {importer:<{width}} -> {imported}: {n}")
    sections: Sequence[tuple[str, Sequence[object]]] = (
        ("cycles between modules", report.module_cycles),
        ("cycles between components", report.component_cycles),
        ("imports of a module through its own package's name", report.package_name_imports),
    )
    for title, items in sections:
        out += ["", f"{title}: {len(items)}"]
        out += [f"  {' <-> '.join(i) if isinstance(i, tuple) else i}" for i in items]
    return "\n".join(out)


def main() -> int:
    """Print the report; 0 when nothing was found, 1 otherwise."""
    report = check(build_graph())
    print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
