"""The ``podplacement`` command line: one console script whose subcommands live in the
product packages (``webhook``, ``controller``, ``certs``, ``imageinspect``) and in
``podplacement.demo``. ``podplacement.__version__`` is :func:`podplacement.version.version`."""

from typing import Any


def __getattr__(name: str) -> Any:
    # read on first use: the webhook and the controller import this package and never need it
    if name == "__version__":
        from podplacement.version import version

        return version()
    raise AttributeError(f"module 'podplacement' has no attribute {name!r}")
