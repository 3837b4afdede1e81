"""The ``podplacement`` console script and the ``kubectl-podplacement`` kubectl plugin.

Each subcommand lives next to the code it drives, in a module that exposes
``register(subparsers) -> None``; that function adds its parser and sets ``func`` (a callable
taking the parsed :class:`argparse.Namespace` and returning an exit code). A module listed in
:data:`SUBCOMMAND_MODULES` that is not installed is left out rather than shown as a stub.

Exit codes shared by every subcommand: 0 success, 1 a runtime failure (a registry, the
cluster, the file system), 2 an unusable argument. Every error is one line on stderr
(``podplacement SUBCOMMAND: message``), never a traceback (``--log-level debug`` logs the
traceback of an unexpected error).

The small argparse helpers the subcommands share (:func:`~podplacement.cliargs.positive_int`,
:func:`~podplacement.cliargs.one_line`, ...) live in :mod:`podplacement.cliargs`, below both this
module and the subcommand modules, so that no subcommand module imports this one.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, cast

from podplacement.cliargs import one_line
from podplacement.logs import setup_logging
from podplacement.version import version

log = logging.getLogger(__name__)

#: Modules that provide subcommands, in help order.
SUBCOMMAND_MODULES = (
    "podplacement.webhook.cli",
    "podplacement.controller.cli",
    "podplacement.certs.cli",
    "podplacement.imageinspect.cli",
    "podplacement.controller.explain_cli",
    "podplacement.demo.cli",
    "podplacement.version",
)

LOG_LEVELS = ("debug", "info", "warning", "error")

#: Name kubectl shows for the plugin (``kubectl-podplacement`` on PATH, krew naming).
PLUGIN = "kubectl podplacement"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit status 2):
    ``PROG: error: MESSAGE (see 'PROG --help')``. Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line and exit with status 2."""
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see '{self.prog} --help')\n")


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every available subcommand registered."""
    parser = OneLineParser(
        prog="podplacement",
        description="Architecture- and NUMA-aware pod placement for Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"podplacement {version()}")
    parser.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS,
                        help="log level: %(choices)s (default: %(default)s)")
    parser.add_argument("--log-format", default="json", choices=("json", "text"),
                        help="log lines on stderr as JSON objects or as text "
                             "(default: %(default)s)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        if _module_exists(name):
            importlib.import_module(name).register(sub)
    return parser


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    """The subcommand names of ``parser``, in help order."""
    for action in parser._actions:  # argparse keeps its subparsers here only
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Set up logging and run the chosen subcommand; unexpected errors become one line."""
    if not getattr(args, "func", None):
        commands = ", ".join(_commands(parser))
        print(f"{parser.prog}: error: a command is required: {commands} "
              f"(see '{parser.prog} --help')", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # last resort: a bug or an unforeseen failure, still one line
        log.debug("unexpected error", exc_info=True)
        print(f"podplacement {args.command}: {type(exc).__name__}: {one_line(exc)}",
              file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return _dispatch(parser, args)


PLUGIN_USAGE = f"""\
usage: {PLUGIN} explain (pod/NAME | NAME | -f POD.yaml) [-n NAMESPACE] [--context CONTEXT]
                                [--kubeconfig FILE] [explain options]
       {PLUGIN} inspect IMAGE... [inspect options]

Show what the podplacement controller would do for a pod (explain: reads the pod, its pull
secrets, the Nodes and NodeResourceTopologies from the cluster of the current kubeconfig
context) or which platforms images support (inspect). The options are those of
'podplacement explain --help' and 'podplacement inspect --help'.
"""


def _plugin_error(command: str, message: str) -> int:
    print(f"{PLUGIN}{' ' + command if command else ''}: error: {message}", file=sys.stderr)
    return 2


def _plugin_explain(argv: list[str]) -> int:
    """``kubectl podplacement explain ...`` → ``podplacement explain`` reading the cluster."""
    from podplacement.controller.explain_cli import pod_reference

    pre = OneLineParser(prog=f"{PLUGIN} explain", add_help=False)
    pre.add_argument("-f", "--filename")
    known, rest = pre.parse_known_args(argv)
    parser = build_parser()
    file_args = [known.filename] if known.filename else []
    args = parser.parse_args(["--log-format", "text", "explain", *file_args, *rest])
    if not known.filename:
        target = str(args.pod)
        if target == "-":
            args.pod = target  # stdin, as "-f -" would
        elif "/" not in target:
            args.pod = f"pod/{target}"
        elif pod_reference(target) is None:
            return _plugin_error("explain", f"only pods can be explained, got {target!r} "
                                 "(use NAME, pod/NAME or -f POD.yaml)")
    return _dispatch(parser, args)


def kubectl_plugin(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-podplacement`` console script (``kubectl podplacement ...``).

    ``explain pod/NAME`` (or ``explain NAME``) with kubectl's ``-n/--namespace``,
    ``--context`` and ``--kubeconfig`` runs ``podplacement explain`` on that pod as stored
    in the cluster (``-f FILE`` explains a manifest instead); ``inspect IMAGE...`` runs
    ``podplacement inspect``. Returns the exit code.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(PLUGIN_USAGE)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"{PLUGIN} {version()}")
        return 0
    command, rest = args[0], args[1:]
    if command == "explain":
        return _plugin_explain(rest)
    if command == "inspect":
        return main(["--log-format", "text", "inspect", *rest])
    return _plugin_error("", f"unknown command {command!r} (want explain or inspect; "
                         f"see '{PLUGIN} --help')")
