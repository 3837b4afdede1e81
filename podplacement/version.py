"""The product's version, and the ``podplacement version`` subcommand that prints it.

One version for everything that ships: ``[project] version`` in ``pyproject.toml`` (semver
``0.y.z`` while the API is ``v1beta1``), the image tag of ``deploy/`` and the image label
``org.opencontainers.image.version`` (``hack/image.sh``). See docs/guide/upgrade.md;
``CHANGELOG.md`` says what each release changed.

Where the version is read from: the ``pyproject.toml`` next to this package when the code
runs from podplacement's source checkout, else the installed distribution's metadata
(:mod:`importlib.metadata`). The checkout comes first because an editable install's metadata
keeps the version of the day it was installed: after a version bump in the checkout it would
print the previous one.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import tomllib
from pathlib import Path

#: The distribution name (``[project] name``).
DISTRIBUTION = "podplacement"
#: Printed when neither a source checkout nor installed metadata says (a copy of the
#: package files alone); a PEP 440 local version, never mistaken for a release.
UNKNOWN = "0+unknown"


def source_version(root: Path) -> str | None:
    """The ``[project] version`` of ``root/pyproject.toml`` when that file is podplacement's
    (its ``[project] name`` is :data:`DISTRIBUTION`); None when there is no such file, it is
    not valid TOML, or it belongs to another project."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    project = data.get("project")
    if not isinstance(project, dict) or project.get("name") != DISTRIBUTION:
        return None
    found = project.get("version")
    return found if isinstance(found, str) and found else None


def version() -> str:
    """The running product's version, e.g. ``"0.2.0"`` (see the module docstring for where
    it is read from); :data:`UNKNOWN` when nothing says."""
    checkout = source_version(Path(__file__).resolve().parent.parent)
    if checkout is not None:
        return checkout
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def _run(args: argparse.Namespace) -> int:
    print(version())
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``podplacement version``: print the version alone (e.g. ``0.2.0``), exit 0."""
    parser = subparsers.add_parser(
        "version", help="print the version (the image tag of deploy/)",
        description="Print podplacement's version alone on one line (the image tag that "
                    "deploy/ installs).")
    parser.set_defaults(func=_run)
