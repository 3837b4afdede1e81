"""Every text the placement rules write is written once (issue #40, item 4): an Event's
reason text, a verdict or an error is one constant that every module using it imports, so
a change of wording changes every path at once.

Checked on the source: no string literal of ``rules/`` (docstrings aside) of at least
:data:`MIN_LENGTH` characters with a space appears in two places; and the texts of the
Events table of docs/reference/labels-events-metrics.md that the rules write are each
written in one module."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules"

#: The shortest literal counted: shorter pieces ("; ", " of ") are joints, not texts.
MIN_LENGTH = 24


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree``'s module, classes and functions."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out.add(id(first.value))
    return out


def _texts() -> dict[str, list[str]]:
    """Each text literal of ``rules/`` (an f-string's literal parts too) → where it is."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(RULES.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in skip and len(node.value) >= MIN_LENGTH
                    and " " in node.value):
                where[node.value].append(f"{path.relative_to(REPO)}:{node.lineno}")
    return where


def test_no_text_of_the_rules_is_written_twice() -> None:
    twice = {text: places for text, places in _texts().items() if len(places) > 1}
    assert not twice, f"written more than once (make it one constant): {twice}"


def test_the_no_supported_platform_reason_is_one_constant() -> None:
    """The reason of ``NoSupportedPlatform`` (Events table) is written in rules/place/
    placement.py only; the escape monitor's verdict imports it."""
    from podplacement.rules.monitor import escape
    from podplacement.rules.place import placement

    places = _texts()[placement.REASON_NO_SUPPORTED_PLATFORM]
    assert places == [places[0]] and places[0].startswith("rules/place/placement.py:")
    assert escape.REASON_NO_SUPPORTED_PLATFORM is placement.REASON_NO_SUPPORTED_PLATFORM
