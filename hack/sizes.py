"""Sizes of the placement rules, from the source (an ast walk): the modules of ``rules/`` over
600 lines, the functions over 60 lines, and the parameters of the decision's entry points
(``placement_facts``, ``decide``, ``plan``, ``_decided_at_admission``).

Works on any tree of the repository (the flat ``rules/`` before the rooms too), so the same
script gives the figures before and after a restructuring.

Usage::

    python hack/sizes.py [ROOT]     # ROOT: a checkout (default: this one)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: The thresholds (lines) above which a module or a function is listed.
MODULE_LINES = 600
FUNCTION_LINES = 60
#: The decision's entry points whose parameters are counted.
ENTRY_POINTS = ("placement_facts", "decide", "plan", "_decided_at_admission")


def _parameters(fn: ast.FunctionDef) -> tuple[int, int]:
    """(all parameters, keyword-only ones) of ``fn``."""
    a = fn.args
    every = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    return every + (a.vararg is not None) + (a.kwarg is not None), len(a.kwonlyargs)


def report(root: Path) -> list[str]:
    """The lines printed for the checkout at ``root``."""
    rules = root / "rules"
    out: list[str] = []
    modules = sorted(rules.rglob("*.py"))
    total = 0
    big: list[tuple[int, str]] = []
    long_fns: list[tuple[int, str]] = []
    entries: list[str] = []
    for path in modules:
        text = path.read_text()
        lines = len(text.splitlines())
        total += lines
        rel = str(path.relative_to(root))
        if lines > MODULE_LINES:
            big.append((lines, rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_fns.append((length, f"{rel}:{node.name}"))
                if node.name in ENTRY_POINTS and isinstance(node, ast.FunctionDef) \
                        and node.col_offset == 0:
                    every, kwonly = _parameters(node)
                    entries.append(f"  {rel}:{node.name}: {every} parameters, "
                                   f"{kwonly} keyword-only")
    rooms = sorted({p.parent.relative_to(root).as_posix() for p in modules})
    out.append(f"rules/: {total} lines in {len(modules)} modules, {len(rooms)} folders "
               f"({', '.join(rooms)})")
    out.append(f"modules over {MODULE_LINES} lines: {len(big)}")
    out += [f"  {n:5d} {m}" for n, m in sorted(big, reverse=True)]
    out.append(f"functions over {FUNCTION_LINES} lines: {len(long_fns)}")
    out += [f"  {n:5d} {f}" for n, f in sorted(long_fns, reverse=True)]
    out.append("the decision's entry points:")
    out += sorted(entries)
    return out


def main(argv: list[str]) -> int:
    """Print :func:`report` for ``argv[1]`` (default: the checkout this script is in)."""
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    print("\n".join(report(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
