"""localkube, the API double, for the demo run from a source checkout: the one module of the
product that imports it, and only when it is there.

localkube is a test-only package of the source tree (``localkube/`` at the repository root);
the wheel does not install it, so an installed demo needs the real control plane (or
``--kubeconfig``). Its entry point is imported here, inside :func:`localkube_command`, behind
:func:`localkube_available`, so the import graph ``lint-imports`` checks shows the dependency
(``.importlinter``'s contract ``wheel`` allows this module's import and no other): the command
line is built from the imported module, never from a module name written out as text.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

#: The top-level package of the API double (the one place its name is written).
PACKAGE = "localkube"


class LocalkubeMissing(RuntimeError):
    """localkube is not importable: this is an installed wheel, not a source checkout."""


def localkube_available() -> bool:
    """True when localkube can be imported (a source checkout on ``sys.path``), found
    without importing it (``importlib.util.find_spec``)."""
    return importlib.util.find_spec(PACKAGE) is not None


def localkube_command(kubeconfig: Path, crds: Iterable[Path]) -> list[str]:
    """The command line that runs localkube in the foreground with this interpreter, on a port
    it picks itself, serving ``crds`` (CRD YAML files) and writing ``kubeconfig``; it logs
    ``localkube listening on URL`` when it serves.

    Raises:
        LocalkubeMissing: localkube is not importable.
    """
    if not localkube_available():
        raise LocalkubeMissing(f"{PACKAGE} is not installed")
    # the one import of localkube in the product (the contract "wheel" of .importlinter)
    from localkube import __main__ as entry

    args = [sys.executable, "-m", entry.__name__.removesuffix(".__main__"),
            "--port", "0", "--kubeconfig", str(kubeconfig)]
    for crd in crds:
        args += ["--crd", str(crd)]
    return args
