"""The ``podplacement`` console script.

Each subcommand lives next to the code it drives, in a module that exposes
``register(subparsers) -> None``; that function adds its parser and sets ``func`` (a callable
taking the parsed :class:`argparse.Namespace` and returning an exit code). A module listed in
:data:`SUBCOMMAND_MODULES` that is not installed is left out rather than shown as a stub.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Callable, Sequence
from typing import cast

from podplacement import __version__
from podplacement.logs import setup_logging

#: Modules that provide subcommands, in help order.
SUBCOMMAND_MODULES = (
    "webhook.cli",
    "controller.cli",
    "certs.cli",
    "imageinspect.cli",
    "controller.explain_cli",
    "podplacement.demo.cli",
)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="podplacement",
        description="Architecture- and NUMA-aware pod placement for Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"podplacement {__version__}")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    parser.add_argument("--log-format", default="json", choices=("json", "text"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        if _module_exists(name):
            importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(args.log_level, args.log_format)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    return func(args)
