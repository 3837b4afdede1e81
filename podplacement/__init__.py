"""The ``podplacement`` command line: one console script whose subcommands live in the
product packages (``webhook``, ``controller``, ``certs``, ``imageinspect``) and in
``podplacement.demo``."""

__version__ = "0.1.0"
